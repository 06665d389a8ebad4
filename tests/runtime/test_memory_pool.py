"""Memory pool: a hypothesis state machine over allocate / retain / release / safe point / array
create-and-drop checks that no two referenced buffers overlap, that nothing is reused before a safe
point, that arrays keep their contents, and that the stats add up; then size classes, caps, arrays
that outlive many pool cycles, threads, and the benchmark helper."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from ms_dynvm.runtime import memory_pool as mp
from ms_dynvm.runtime.memory_pool import (
    ALIGN,
    Allocator,
    Buffer,
    HostAllocator,
    Pool,
    array_buffer,
    block_size,
    size_class,
)

MiB = 1 << 20
# Mostly repeated sizes (as a VM replays shapes, so blocks get reused), some arbitrary ones.
SIZES = st.one_of(st.sampled_from([0, 100, 640, 1000, 4096, 9000, 30000]), st.integers(0, 40000))
MONOTONE = ("peak_live_bytes", "peak_reserved_bytes", "allocs", "reused", "fresh_allocs",
            "exact_allocs", "fallback_allocs", "trimmed_bytes", "safe_points")


def check_stats(pool: Pool, prev: dict | None = None) -> dict:
    s = pool.stats()
    assert 0 <= s["live_bytes"] <= s["reserved_bytes"]
    assert s["reserved_bytes"] == s["live_bytes"] + s["pending_bytes"] + s["free_bytes"]
    assert s["live_bytes"] <= s["peak_live_bytes"]
    assert s["reserved_bytes"] <= s["peak_reserved_bytes"]
    assert s["allocs"] == s["reused"] + s["fresh_allocs"] + s["fallback_allocs"]
    assert s["exact_allocs"] <= s["allocs"]
    assert s["reuse_rate"] == (s["reused"] / s["allocs"] if s["allocs"] else 0.0)
    assert 0.0 <= s["fragmentation"] < 1.0
    if prev is not None:
        for k in MONOTONE:
            assert s[k] >= prev[k], k
    return s


class PoolMachine(RuleBasedStateMachine):
    """Each entry of the `refs` bundle is one reference we hold; arrays are held in a list. The
    model records each buffer's expected count and whether its count reached zero before or after
    the last safe point."""

    refs = Bundle("refs")

    def __init__(self) -> None:
        super().__init__()
        # Caps small enough that reuse of larger blocks, trimming and fallback all happen.
        self.pool = Pool(soft_cap=96 * 1024, hard_cap=160 * 1024)
        self.count: dict[int, int] = {}  # id(buf) -> expected refcount
        self.objs: dict[int, Buffer] = {}  # strong references: ids stay unique
        self.pending: set[int] = set()  # count reached 0 since the last safe point
        self.reusable: set[int] = set()  # count reached 0 before some safe point
        self.arrays: list[tuple[np.ndarray, np.ndarray, int]] = []  # (kept, expected, id(buf))
        self.prev: dict | None = None

    def _track_new(self, buf: Buffer, nbytes: int) -> None:
        key = id(buf)
        assert buf.refcount == 1 and buf.nbytes == nbytes and buf.capacity >= nbytes
        assert buf.ptr % ALIGN == 0
        if key in self.objs:  # a reused block
            assert key in self.reusable, "reused while referenced or before a safe point"
            self.reusable.discard(key)
        self.objs[key] = buf
        self.count[key] = 1

    @rule(target=refs, nbytes=SIZES)
    def allocate(self, nbytes):
        buf = self.pool.allocate(nbytes)
        self._track_new(buf, nbytes)
        buf.host_view()[:] = 0xAB
        return buf

    @rule(target=refs, buf=refs)
    def retain(self, buf):
        assert buf.retain() is buf
        self.count[id(buf)] += 1
        return buf

    @rule(buf=consumes(refs))
    def release(self, buf):
        buf.release()
        self.count[id(buf)] -= 1
        if self.count[id(buf)] == 0:
            self.pending.add(id(buf))

    @rule(nbytes=SIZES, seed=st.integers(0, 2**16), dtype=st.sampled_from(["f4", "f8", "i2", "u1"]),
          keep_view=st.booleans())
    def make_array(self, nbytes, seed, dtype, keep_view):
        dt = np.dtype(dtype)
        n = nbytes // dt.itemsize
        arr = self.pool.array((n,), dt)
        assert arr.shape == (n,) and arr.dtype == dt and arr.flags.c_contiguous
        arr[:] = np.random.default_rng(seed).integers(0, 100, n).astype(dt)
        buf = array_buffer(arr)
        self._track_new(buf, n * dt.itemsize)
        # Keep the array itself or only a view of it: the view alone must keep the block.
        kept = arr[1:] if keep_view else arr
        self.arrays.append((kept, kept.copy(), id(buf)))

    @rule(data=st.data())
    def drop_array(self, data):
        if not self.arrays:
            return
        i = data.draw(st.integers(0, len(self.arrays) - 1))
        _, _, key = self.arrays.pop(i)
        # CPython frees the array and its owner right here; the finalizer queues the release.
        self.count[key] = 0
        self.pending.add(key)

    @rule()
    def safe_point(self):
        self.pool.safe_point()
        self.reusable |= self.pending
        self.pending.clear()

    @invariant()
    def referenced_ranges_do_not_overlap(self):
        held = sorted((self.objs[k].ptr, self.objs[k].capacity) for k, c in self.count.items()
                      if c > 0 or k in self.pending)
        for (p0, n0), (p1, _) in zip(held, held[1:]):
            assert p0 + n0 <= p1, "two referenced buffers overlap"

    @invariant()
    def states_match_model(self):
        for key, c in self.count.items():
            buf = self.objs[key]
            if c > 0:
                assert buf.state in (mp.LIVE, mp.FALLBACK) and buf.refcount == c
            elif key in self.pending:  # never on a free list before the safe point
                # LIVE/FALLBACK: an array's finalizer not drained yet.
                assert buf.state in (mp.LIVE, mp.FALLBACK, mp.PENDING)
                assert buf.owner is not None  # memory not given back either
            else:
                assert buf.state in (mp.FREE, mp.GONE)

    @invariant()
    def arrays_keep_their_contents(self):
        for kept, expected, _ in self.arrays:
            np.testing.assert_array_equal(kept, expected)

    @invariant()
    def stats_consistent(self):
        self.prev = check_stats(self.pool, self.prev)
        live = sum(self.objs[k].capacity for k, c in self.count.items()
                   if c > 0 and self.objs[k].state == mp.LIVE)
        assert self.prev["live_bytes"] == live


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


# -- size classes -------------------------------------------------------------------------------
def test_size_classes_small_are_powers_of_two():
    assert [size_class(n) for n in (0, 1, 64, 65, 128, 129, 1000, MiB)] == \
        [64, 64, 64, 128, 128, 256, 1024, MiB]


def test_size_classes_above_1mib_have_four_steps_per_power_of_two():
    assert size_class(MiB + 1) == MiB + MiB // 4
    assert size_class(int(1.3 * MiB)) == MiB + MiB // 2
    assert size_class(2 * MiB + 1) == 2 * MiB + MiB // 2
    assert size_class(7 * MiB + 1) == 8 * MiB
    for n in range(MiB + 1, 64 * MiB, 77_777):  # waste bounded by 20%: never exact
        cap, exact = block_size(n)
        assert not exact and n <= cap and (cap - n) <= 0.2 * cap + ALIGN


@pytest.mark.parametrize("nbytes,cap,exact", [
    (1, 64, False),       # the 64-byte granule is not waste: an aligned block takes it anyway
    (192, 256, False),    # exactly 25%: class
    (193, 256, False),
    (320, 320, True),     # class 512 would waste 37.5%
    (640, 640, True),
    (700, 704, True),     # exact blocks are whole granules
    (768, 1024, False),
    (1025, 1088, True),
])
def test_waste_over_25_percent_gets_exact_block(nbytes, cap, exact):
    assert block_size(nbytes) == (cap, exact)
    pool = Pool()
    buf = pool.allocate(nbytes)
    assert buf.capacity == cap and buf.exact == exact
    assert pool.stats()["exact_allocs"] == int(exact)


def test_exact_blocks_are_reused_for_the_same_size_only():
    pool = Pool()
    a = pool.allocate(640)
    a.release()
    pool.safe_point()
    assert pool.allocate(700) is not a  # 704-byte exact block: another free list
    b = pool.allocate(640)
    assert b is a
    s = check_stats(pool)
    assert s["exact_allocs"] == 3 and s["reused"] == 1


# -- delayed release ----------------------------------------------------------------------------
def test_nothing_reused_before_safe_point():
    pool = Pool()
    a = pool.allocate(1000)
    a.release()
    b = pool.allocate(1000)
    assert b is not a and b.ptr != a.ptr
    assert pool.stats()["pending_bytes"] == a.capacity
    pool.safe_point()
    assert pool.allocate(1000) is a


def test_refcount_errors():
    pool = Pool()
    a = pool.allocate(10)
    a.retain()
    a.release()
    a.release()
    with pytest.raises(RuntimeError):
        a.release()
    with pytest.raises(RuntimeError):
        a.retain()
    with pytest.raises(ValueError):
        pool.allocate(-1)


# -- arrays -------------------------------------------------------------------------------------
def test_array_views_keep_the_buffer():
    pool = Pool()
    a = pool.array((4, 8), np.float32)
    buf = array_buffer(a)
    assert a.__array_interface__["data"][0] == buf.ptr and buf.ptr % ALIGN == 0
    a[:] = np.arange(32, dtype=np.float32).reshape(4, 8)
    v = a.T[1:, ::2]
    mv = memoryview(a[2])
    del a
    pool.safe_point()
    assert buf.state == mp.LIVE and array_buffer(v) is buf
    np.testing.assert_array_equal(v, np.arange(32, dtype=np.float32).reshape(4, 8).T[1:, ::2])
    del v
    pool.safe_point()
    assert buf.state == mp.LIVE  # the memoryview still holds it
    assert list(np.frombuffer(mv, np.float32)) == list(range(16, 24))
    del mv
    assert buf.state == mp.LIVE  # released, but not reusable until a safe point
    pool.safe_point()
    assert buf.state == mp.FREE


def test_retained_array_buffer_outlives_the_array():
    pool = Pool()
    a = pool.array(100, np.float64)
    buf = array_buffer(a).retain()
    del a
    pool.safe_point()
    assert buf.state == mp.LIVE
    buf.release()
    pool.safe_point()
    assert buf.state == mp.FREE


def test_array_handed_out_stays_valid_while_pool_is_reused():
    # Like a fused-kernel output given to MindSpore with Tensor.from_numpy: the tensor holds the
    # array; the pool goes through many steps meanwhile.
    pool = Pool(soft_cap=1 << 16)
    handed = pool.array((16, 33), np.float32)
    handed[:] = np.arange(16 * 33, dtype=np.float32).reshape(16, 33)
    expected = handed.copy()
    holder = [handed[::2]]  # what the tensor keeps could be a view
    del handed
    rng = np.random.default_rng(0)
    for step in range(300):
        tmp = [pool.array((int(rng.integers(1, 40)), 33), np.float32) for _ in range(4)]
        for t in tmp:
            t.fill(-step)
        bufs = [pool.allocate(16 * 33 * 4) for _ in range(2)]
        for b in bufs:
            b.host_view()[:] = 0xFF
            b.release()
        del tmp
        pool.safe_point()
    np.testing.assert_array_equal(holder[0], expected[::2])
    s = check_stats(pool)
    assert s["reuse_rate"] > 0.9


def test_array_shapes_and_dtypes():
    pool = Pool()
    assert pool.array((), np.int64).shape == ()
    z = pool.array((0, 3), np.float32)
    assert z.shape == (0, 3) and z.size == 0
    rec = pool.array(5, np.dtype([("x", "<f4"), ("y", "<i8")]))
    rec["y"] = 7
    assert rec.dtype.names == ("x", "y") and list(rec["y"]) == [7] * 5
    assert pool.array([2, 3], "f2").dtype == np.float16
    with pytest.raises(ValueError):
        pool.array((-1, 2))


# -- caps ---------------------------------------------------------------------------------------
def test_hard_cap_falls_back_outside_the_pool():
    pool = Pool(hard_cap=4096)
    held = [pool.allocate(1024) for _ in range(4)]
    assert pool.stats()["reserved_bytes"] == 4096
    extra = pool.allocate(1024)
    s = check_stats(pool)
    assert extra.state == mp.FALLBACK and s["fallback_allocs"] == 1
    assert s["reserved_bytes"] == 4096 and s["fallback_bytes"] >= 1024
    extra.host_view()[:] = 1  # usable memory all the same
    extra.release()
    assert extra.state == mp.PENDING and pool.stats()["fallback_bytes"] >= 1024
    pool.safe_point()  # fallback buffers are released at safe points too, then dropped
    assert extra.state == mp.GONE and pool.stats()["fallback_bytes"] == 0
    a = pool.array(300, np.float32)  # arrays fall back too
    assert array_buffer(a).state == mp.FALLBACK
    del a
    for b in held:
        b.release()
    pool.safe_point()
    assert pool.allocate(1024) in held


def test_hard_cap_trims_free_lists_before_falling_back():
    pool = Pool(hard_cap=8192)
    for b in [pool.allocate(2048) for _ in range(4)]:
        b.release()
    pool.safe_point()
    assert pool.stats()["free_bytes"] == 8192
    big = pool.allocate(6000)  # exact 6016 B: trim free 2 KiB blocks to make room
    s = check_stats(pool)
    assert big.state == mp.LIVE and s["fallback_allocs"] == 0
    assert s["reserved_bytes"] <= 8192 and s["trimmed_bytes"] == 3 * 2048


def test_pending_blocks_are_never_trimmed():
    pool = Pool(hard_cap=4096)
    a = pool.allocate(4096)
    a.release()  # pending: may still be used by a kernel in flight
    b = pool.allocate(4096)
    assert b.state == mp.FALLBACK and a.state == mp.PENDING
    assert pool.stats()["trimmed_bytes"] == 0


def test_soft_cap_prefers_reuse_of_a_larger_block():
    pool = Pool(soft_cap=2560)
    big = pool.allocate(2048)
    big.release()
    pool.safe_point()
    small = pool.allocate(1024)  # free 2048 block <= 2x: reused instead of growing
    assert small is big and small.nbytes == 1024
    assert pool.stats()["reserved_bytes"] == 2048 and pool.stats()["reused"] == 1
    tiny = pool.allocate(64)  # no free block <= 2x: grows past the soft cap (only a hard cap refuses)
    assert tiny.capacity == 64 and pool.stats()["reserved_bytes"] == 2112


def test_soft_cap_trims_on_miss_and_at_safe_point():
    pool = Pool(soft_cap=8192)
    bufs = [pool.allocate(4096) for _ in range(4)]  # 16 KiB live: above the soft cap is allowed
    assert pool.stats()["reserved_bytes"] == 16384
    for b in bufs:
        b.release()
    pool.safe_point()  # trims back to the soft cap
    s = check_stats(pool)
    assert s["reserved_bytes"] == 8192 and s["trimmed_bytes"] == 8192
    # A miss above the cap trims other classes first.
    c = pool.allocate(8192)
    s = check_stats(pool)
    assert c.state == mp.LIVE and s["reserved_bytes"] == 8192 and s["fallback_allocs"] == 0


def test_out_of_memory_frees_everything_and_retries():
    class Flaky(HostAllocator):
        def __init__(self):
            super().__init__()
            self.fail = False

        def alloc(self, nbytes):
            if self.fail:
                self.fail = False
                raise MemoryError
            return super().alloc(nbytes)

    alloc = Flaky()
    pool = Pool(alloc)
    pool.allocate(128).release()
    pool.safe_point()
    alloc.fail = True
    b = pool.allocate(256)
    s = check_stats(pool)
    assert b.state == mp.LIVE and s["trimmed_bytes"] == 128 and alloc.freed == 1


def test_generic_allocator_interface():
    # A device allocator only needs alloc/free: the pool never touches the memory.
    class Fake(Allocator):
        def __init__(self):
            self.next, self.live = 0x1000, set()

        def alloc(self, nbytes):
            ptr, self.next = self.next, self.next + nbytes
            self.live.add(ptr)
            return ptr, ptr

        def free(self, owner):
            self.live.remove(owner)

    fake = Fake()
    pool = Pool(fake)
    a = pool.allocate(100)
    assert a.ptr == 0x1000 and a.owner == 0x1000
    a.release()
    pool.safe_point()
    assert pool.trim() == 128 and fake.live == set()


# -- stats, threads, benchmark -------------------------------------------------------------------
def test_stats_names_and_fragmentation():
    pool = Pool()
    assert set(pool.stats()) >= {"live_bytes", "reserved_bytes", "peak_live_bytes",
                                  "peak_reserved_bytes", "reuse_rate", "fragmentation", "allocs",
                                  "exact_allocs", "fallback_allocs"}
    for b in [pool.allocate(n) for n in (64, 64, 128, 256)]:
        b.release()
    pool.safe_point()
    s = check_stats(pool)
    assert s["free_bytes"] == 512 and s["fragmentation"] == pytest.approx(1 - 256 / 512)
    assert s["live_bytes"] == 0 and s["peak_live_bytes"] == 512


def test_threads_smoke():
    pool = Pool(soft_cap=1 << 20, hard_cap=4 << 20)
    errors = []
    barrier = threading.Barrier(6)

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            barrier.wait()
            for i in range(300):
                bufs = [pool.allocate(int(rng.integers(1, 20000))) for _ in range(3)]
                for b in bufs:
                    b.host_view()[:] = seed
                arr = pool.array(int(rng.integers(1, 2000)), np.int32)
                arr[:] = seed
                for b in bufs:
                    assert (b.host_view() == seed).all()  # nobody else got this block
                    b.release()
                assert (arr == seed).all()
                del arr
                if i % 7 == 0:
                    pool.safe_point()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool.safe_point()
    s = check_stats(pool)
    assert s["live_bytes"] == 0 and s["pending_bytes"] == 0
    assert s["allocs"] == 6 * 300 * 4 and s["reuse_rate"] > 0.5


def test_bench_runs(capsys):
    res = mp.bench(256, sizes=(256, 1 << 16), repeat=1)
    assert set(res) == {256, 1 << 16}
    assert "np.empty" in capsys.readouterr().out
