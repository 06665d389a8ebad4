"""Memory pool: a hypothesis state machine over allocate / retain / release / array create, view and
drop / safe point / pool trim / C heap trim (malloc_trim) checks that no block is handed out while a holder (explicit count, array, view,
memoryview) still refers to it, that nothing is reused before a safe point, that arrays keep their
contents, and that the stats add up; then size classes, best fit and the reserve target, caps,
arrays that outlive many pool cycles (with MindSpore tensors over them too), threads, and the
benchmark helper."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule

from ms_dynvm.runtime import memory_pool as mp
from ms_dynvm.runtime.memory_pool import (
    ALIGN,
    Allocator,
    Buffer,
    HEADROOM_MIN_BYTES,
    HostAllocator,
    Pool,
    array_buffer,
    block_size,
    size_class,
)

MiB = 1 << 20
# Mostly repeated sizes (as a VM replays shapes, so blocks get reused), some arbitrary ones.
SIZES = st.one_of(st.sampled_from([0, 100, 640, 1000, 4096, 9000, 30000]), st.integers(0, 40000))
MONOTONE = ("peak_live_bytes", "peak_requested_bytes", "peak_reserved_bytes", "allocs", "reused",
            "reused_larger", "fresh_allocs", "exact_allocs", "fallback_allocs", "trimmed_bytes",
            "safe_points", "heap_checks", "heap_trims", "heap_trim_ns", "heap_released_bytes")
# How a test keeps an array alive: the array, a view of it, a view of a view, a memoryview, or the
# array inside a container. Each must keep the block out of the free lists.
HOLDS = ("array", "slice", "view_of_view", "memoryview", "container")


def check_stats(pool: Pool, prev: dict | None = None) -> dict:
    s = pool.stats()
    assert 0 <= s["requested_bytes"] <= s["live_bytes"] <= s["reserved_bytes"]
    assert s["reserved_bytes"] == s["live_bytes"] + s["pending_bytes"] + s["free_bytes"]
    assert s["live_bytes"] <= s["peak_live_bytes"]
    assert s["requested_bytes"] <= s["peak_requested_bytes"] <= s["peak_live_bytes"]
    assert s["reserved_bytes"] <= s["peak_reserved_bytes"]
    assert s["allocs"] == s["reused"] + s["fresh_allocs"] + s["fallback_allocs"]
    assert s["reused_larger"] <= s["reused"] and s["exact_allocs"] <= s["allocs"]
    assert s["reuse_rate"] == (s["reused"] / s["allocs"] if s["allocs"] else 0.0)
    assert 0.0 <= s["fragmentation"] < 1.0
    if prev is not None:
        for k in MONOTONE:
            assert s[k] >= prev[k], k
    return s


def _hold(arr: np.ndarray, how: str):
    if how == "array":
        return arr
    if how == "slice":
        return arr[1:]
    if how == "view_of_view":
        return arr.reshape(-1).view(np.uint8)[::3][1:]
    if how == "memoryview":
        return memoryview(arr.reshape(-1))
    return {"x": [arr]}


def _contents(held) -> bytes:
    if isinstance(held, dict):
        held = held["x"][0]
    return bytes(np.asarray(held).tobytes()) if not isinstance(held, memoryview) else held.tobytes()


class PoolMachine(RuleBasedStateMachine):
    """Each entry of the `refs` bundle is one explicit count we hold; arrays are held in a list.
    The model keeps, per block, its explicit count, how many of our array holders refer to it, and
    whether both have been zero across a safe point (only then may the block be handed out again)."""

    refs = Bundle("refs")

    def __init__(self) -> None:
        super().__init__()
        # Caps small enough that best fit, trimming, the reserve target and fallback all happen; heap
        # trimming (glibc malloc_trim, where available) at any RSS growth.
        self.pool = Pool(soft_cap=96 * 1024, hard_cap=160 * 1024, heap_trim_mb=0)
        self.count: dict[int, int] = {}  # id(buf) -> explicit count we hold
        self.arrays: dict[int, int] = {}  # id(buf) -> array holders we keep
        self.objs: dict[int, Buffer] = {}  # strong references: ids stay unique
        self.unheld: set[int] = set()  # nothing held any more, but no safe point since
        self.reusable: set[int] = set()  # nothing held, and a safe point has passed since
        self.held: list[tuple[object, bytes, int]] = []  # (holder, expected bytes, id(buf))
        self.allocs = self.exact = 0
        self.prev: dict | None = None

    def _track_new(self, buf: Buffer, nbytes: int) -> None:
        key = id(buf)
        self.allocs += 1
        self.exact += block_size(nbytes)[1]
        assert buf.nbytes == nbytes and buf.capacity >= nbytes and buf.refcount == 1
        assert buf.ptr % ALIGN == 0
        if key in self.objs:  # a block handed out again
            assert key in self.reusable, "handed out while referenced, or before a safe point"
            self.reusable.discard(key)
        self.objs[key] = buf
        self.count[key] = 0
        self.arrays[key] = 0

    def _maybe_unheld(self, key: int) -> None:
        if self.count[key] == 0 and self.arrays[key] == 0:
            self.unheld.add(key)

    @rule(target=refs, nbytes=SIZES)
    def allocate(self, nbytes):
        buf = self.pool.allocate(nbytes)
        self._track_new(buf, nbytes)
        self.count[id(buf)] = 1
        buf.host_view()[:] = 0xAB
        return buf

    @rule(target=refs, buf=refs)
    def retain(self, buf):
        assert buf.retain() is buf
        self.count[id(buf)] += 1
        return buf

    @rule(buf=consumes(refs))
    def release(self, buf):
        key = id(buf)
        buf.release()
        self.count[key] -= 1
        self._maybe_unheld(key)

    @rule(nbytes=SIZES, seed=st.integers(0, 2**16), dtype=st.sampled_from(["f4", "f8", "i2", "u1"]),
          how=st.sampled_from(HOLDS), ndim=st.integers(1, 3))
    def make_array(self, nbytes, seed, dtype, how, ndim):
        dt = np.dtype(dtype)
        n = max(nbytes // dt.itemsize, 4)
        shape = {1: (n,), 2: (2, n // 2), 3: (2, 2, n // 4)}[ndim]
        arr = self.pool.array(shape, dt)
        assert arr.shape == shape and arr.dtype == dt and arr.flags.c_contiguous
        assert arr.flags.writeable and arr.ctypes.data % ALIGN == 0
        arr[...] = np.random.default_rng(seed).integers(0, 100, shape).astype(dt)
        buf = array_buffer(arr)
        assert buf is not None and buf.watched
        self._track_new(buf, arr.nbytes)
        held = _hold(arr, how)
        del arr  # from here on only `held` keeps the block
        self.arrays[id(buf)] += 1
        self.held.append((held, _contents(held), id(buf)))

    @rule(data=st.data())
    def view_array(self, data):
        # A second holder over the same block (a view of a kept array).
        if not self.held:
            return
        i = data.draw(st.integers(0, len(self.held) - 1))
        held, _, key = self.held[i]
        if isinstance(held, dict):
            held = held["x"][0]
        view = np.asarray(held)[::-1]
        self.arrays[key] += 1
        self.held.append((view, _contents(view), key))

    @rule(data=st.data())
    def drop_array(self, data):
        if not self.held:
            return
        i = data.draw(st.integers(0, len(self.held) - 1))
        _, _, key = self.held.pop(i)  # CPython frees the holder right here
        self.arrays[key] -= 1
        self._maybe_unheld(key)

    @rule(target=refs, data=st.data())
    def retain_array_buffer(self, data):
        # An explicit count on a block that arrays also hold: it must outlive them.
        if not self.held:
            return multiple()
        i = data.draw(st.integers(0, len(self.held) - 1))
        held, _, key = self.held[i]
        buf = self.objs[key]
        assert array_buffer(np.asarray(held["x"][0] if isinstance(held, dict) else held)) is buf
        assert buf.retain() is buf
        self.count[key] += 1
        return buf

    @rule()
    def safe_point(self):
        self.pool.safe_point()
        self.reusable |= self.unheld
        self.unheld.clear()

    @rule(fraction=st.floats(0, 1))
    def trim(self, fraction):
        s = self.pool.stats()
        self.pool.trim(int(fraction * s["reserved_bytes"]))  # free blocks only

    @rule()
    def trim_heap(self):
        # glibc gives free heap pages back to the OS: live blocks and arrays must not notice.
        self.pool.trim_heap()

    @rule()
    def collect_old(self):
        # Watched blocks that survive PROMOTE_AFTER polls are polled only every OLD_POLL_EVERY safe
        # points: run that many, so the model's "reusable" holds for them too.
        for _ in range(mp.OLD_POLL_EVERY):
            self.pool.safe_point()
        self.reusable |= self.unheld
        self.unheld.clear()

    @invariant()
    def referenced_ranges_do_not_overlap(self):
        held = sorted((self.objs[k].ptr, self.objs[k].capacity) for k in self.objs
                      if self.count[k] or self.arrays[k] or k in self.unheld)
        for (p0, n0), (p1, _) in zip(held, held[1:]):
            assert p0 + n0 <= p1, "two referenced blocks overlap"

    @invariant()
    def states_match_model(self):
        for key, buf in self.objs.items():
            if self.count[key] or self.arrays[key]:
                assert buf.state in (mp.LIVE, mp.FALLBACK) and buf.owner is not None
                assert buf.refcount == self.count[key] + bool(buf.watched)
                if self.arrays[key]:
                    assert buf.watched
            elif key in self.unheld:  # never on a free list before the safe point
                assert buf.state in (mp.LIVE, mp.FALLBACK, mp.PENDING) and buf.owner is not None
            elif key in self.reusable:
                # A watched block that survived PROMOTE_AFTER polls waits for the next old poll.
                assert buf.state in (mp.FREE, mp.GONE) or (buf.watched and buf.age >= mp.PROMOTE_AFTER)

    @invariant()
    def arrays_keep_their_contents(self):
        for held, expected, _ in self.held:
            assert _contents(held) == expected

    @invariant()
    def stats_consistent(self):
        self.prev = check_stats(self.pool, self.prev)
        live = [b for b in self.objs.values() if b.state == mp.LIVE]
        assert self.prev["live_bytes"] == sum(b.capacity for b in live)
        assert self.prev["requested_bytes"] == sum(b.nbytes for b in live)
        assert self.prev["allocs"] == self.allocs and self.prev["exact_allocs"] == self.exact
        assert self.prev["watched"] == sum(b.watched for b in self.objs.values())
        assert self.prev["reserved_bytes"] <= 160 * 1024  # the hard cap


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


def test_exact_allocs_counts_every_path():
    pool = Pool(headroom=None)
    a = pool.array(160, np.float32)  # 640 B: exact, fresh
    b = pool.allocate(640)  # exact, fresh
    del a
    b.release()
    pool.safe_point()
    a = pool.array(160, np.float32)  # exact, its own stack (array's hot path)
    b = pool.allocate(640)  # exact, its own stack (allocate's hot path)
    c = pool.allocate(600)  # exact 640 would do, but both are taken: fresh 640 exact block
    d = pool.allocate(1000)  # class 1024: not exact
    s = check_stats(pool)
    assert s["exact_allocs"] == 5 and s["allocs"] == 6 and s["reused"] == 2
    del a, b, c, d


# -- best fit and the reserve target ------------------------------------------------------------
def test_exact_size_first_then_best_fit_within_bound():
    pool = Pool(headroom=None)
    blocks = [pool.allocate(n) for n in (640, 704, 1024, 8192)]  # exact 640, exact 704, 1K, 8K
    for b in blocks:
        b.release()
    pool.safe_point()
    assert pool.allocate(640) is blocks[0]  # its own stack
    assert pool.allocate(600) is blocks[1]  # exact 640 is gone: smallest that fits is 704
    assert pool.allocate(576) is blocks[2]  # then 1024 (< 2 x 576)
    fresh = pool.allocate(4000)  # 8192 > 2 x 4032: too wasteful below 64 KiB, a fresh block
    assert fresh not in blocks and fresh.capacity == 4096
    s = check_stats(pool)
    assert s["reused"] == 3 and s["reused_larger"] == 2 and s["fresh_allocs"] == 5


def test_large_requests_reuse_blocks_up_to_8x():
    pool = Pool(headroom=None)
    big = pool.allocate(MiB)
    big.release()
    pool.safe_point()
    assert pool.allocate(MiB // 8) is big  # 128 KiB in a 1 MiB block: within 8x
    assert pool.allocate(MiB // 8).capacity == MiB // 8


def _random_steps(pool: Pool, steps: int = 300) -> None:
    # Every step needs other sizes (1..60 KiB: best fit takes at most 2x there), so exact and class
    # blocks of every size seen pile up in the free lists unless something trims them.
    rng = np.random.default_rng(0)
    for _ in range(steps):
        arrs = [pool.array(int(rng.integers(256, 15000)), np.float32) for _ in range(4)]
        pool.safe_point()
        del arrs
        pool.safe_point()


def test_fresh_block_trims_free_blocks_to_the_reserve_target():
    pool = Pool(headroom_min_bytes=0)  # the ratio alone (this working set is far below 2 MiB)
    _random_steps(pool)
    s = check_stats(pool)
    assert s["peak_reserved_bytes"] <= 1.15 * s["peak_live_bytes"]
    assert s["reserved_bytes"] <= 1.15 * s["peak_live_bytes"] and s["trimmed_bytes"] > 0
    unbounded = Pool(headroom=None)  # the same workload without the target keeps much more
    _random_steps(unbounded)
    u = check_stats(unbounded)
    assert u["peak_reserved_bytes"] > 1.5 * u["peak_live_bytes"] and u["trimmed_bytes"] == 0
    assert u["reuse_rate"] > s["reuse_rate"]  # the price: more fresh blocks


def test_small_working_set_keeps_a_floor_of_spare_blocks():
    # A working set of a few hundred KiB with random sizes (the masked-softmax benchmark's: 4 results
    # of [4B, S] floats per call): 15% of it holds no spare block, so at headroom_min_bytes=0 a large
    # share of requests gets a fresh block; the default floor (peak live + 1 MiB) keeps enough spare
    # blocks for reuse, and reserved stays within it.
    def run(pool):
        rng = np.random.default_rng(0)
        keep = []
        for _ in range(600):
            b, s = int(rng.integers(4, 33)), int(rng.integers(32, 257))
            arrs = []
            for _ in range(2):  # two launches of two results each
                pool.safe_point()
                arrs += [pool.array((4 * b, s), np.float32) for _ in range(2)]
            keep = arrs[-1:]  # the script keeps the last result until the next call
            del arrs
        del keep
        return check_stats(pool)

    bare, floor = run(Pool(headroom_min_bytes=0)), run(Pool())
    assert bare["fresh_allocs"] > 0.2 * bare["allocs"]
    assert floor["fresh_allocs"] < 0.05 * floor["allocs"]
    assert floor["peak_reserved_bytes"] <= floor["peak_live_bytes"] + HEADROOM_MIN_BYTES
    assert floor["peak_reserved_bytes"] > 1.15 * floor["peak_live_bytes"]  # the floor is what holds
    with pytest.raises(ValueError):
        Pool(headroom_min_bytes=-1)


def test_dynamic_shapes_converge_on_the_largest_blocks():
    # Sizes proportional to a random seq_len (as in profiling/bench/bench_pool_soak.py): best fit lets the
    # largest shape's blocks serve every smaller one, so reuse stays high at the reserve target.
    pool = Pool()
    rng = np.random.default_rng(0)
    for step in range(300):
        s = int(rng.integers(32, 257))
        arrs = [pool.array((4, s, c), np.float32) for c in (64, 256, 64)]
        pool.safe_point()
        del arrs
        pool.safe_point()
        if step == 99:
            warm = pool.stats()
    end = check_stats(pool)
    assert end["peak_reserved_bytes"] <= 1.15 * end["peak_live_bytes"]
    assert end["reused"] - warm["reused"] >= 0.99 * (end["allocs"] - warm["allocs"])
    assert end["reused_larger"] > 0


def test_trim_is_least_recently_freed_first():
    pool = Pool(headroom=None)
    a, b, c = (pool.allocate(n) for n in (4096, 8192, 16384))
    b.release()
    pool.safe_point()
    a.release()
    c.release()
    pool.safe_point()
    assert pool.trim(pool.stats()["reserved_bytes"] - 1) == 8192 and b.state == mp.GONE
    assert a.state == c.state == mp.FREE


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
    arr = pool.array(10)
    with pytest.raises(RuntimeError):  # the arrays' own count is released by the poll only
        array_buffer(arr).release()


# -- arrays -------------------------------------------------------------------------------------
def test_array_is_released_only_at_a_safe_point_after_its_last_view():
    pool = Pool()
    a = pool.array((4, 8), np.float32)
    buf = array_buffer(a)
    assert a.base is buf.root and a.ctypes.data == buf.ptr and buf.ptr % ALIGN == 0
    count = sys.getrefcount(buf.root)  # (not inside assert: pytest's rewriting holds the operand)
    assert count == buf.rc0 + 1
    a[:] = np.arange(32, dtype=np.float32).reshape(4, 8)
    v = a.T[1:, ::2]
    mv = memoryview(a[2])
    del a
    pool.safe_point()
    assert buf.state == mp.LIVE and array_buffer(v) is buf and array_buffer(mv) is buf
    np.testing.assert_array_equal(v, np.arange(32, dtype=np.float32).reshape(4, 8).T[1:, ::2])
    del v
    pool.safe_point()
    assert buf.state == mp.LIVE  # the memoryview still holds it
    assert list(np.frombuffer(mv, np.float32)) == list(range(16, 24))
    del mv
    assert buf.state == mp.LIVE and buf.watched  # unreferenced, but not seen before a safe point
    other = pool.array((4, 8), np.float32)
    assert other.ctypes.data != buf.ptr
    pool.safe_point()
    assert buf.state == mp.FREE and not buf.watched
    count = sys.getrefcount(buf.root)
    assert count == buf.rc0
    assert pool.array((4, 8), np.float32).ctypes.data == buf.ptr


def test_retained_array_buffer_outlives_the_array():
    pool = Pool()
    a = pool.array(100, np.float64)
    buf = array_buffer(a).retain()
    assert buf.refcount == 2
    del a
    pool.safe_point()
    assert buf.state == mp.LIVE and not buf.watched and buf.refcount == 1
    buf.release()
    assert buf.state == mp.PENDING
    pool.safe_point()
    assert buf.state == mp.FREE


def test_array_handed_out_stays_valid_while_pool_is_reused():
    pool = Pool(soft_cap=1 << 16)
    handed = pool.array((16, 33), np.float32)
    handed[:] = np.arange(16 * 33, dtype=np.float32).reshape(16, 33)
    expected = handed.copy()
    holder = [handed[::2]]  # what a tensor keeps could be a view
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


def test_long_lived_arrays_are_polled_less_often_but_still_freed():
    pool = Pool()
    kept = pool.array(1000, np.float32)
    buf = array_buffer(kept)
    for _ in range(mp.PROMOTE_AFTER):
        pool.safe_point()
    assert buf in pool._old and buf not in pool._young
    del kept
    sp = pool.stats()["safe_points"]
    pool.safe_point()
    assert buf.state == mp.LIVE  # old blocks wait for their poll
    while (sp := sp + 1) % mp.OLD_POLL_EVERY:
        pool.safe_point()
    assert buf.state == mp.FREE


def test_a_fresh_block_triggers_a_poll_of_old_blocks():
    pool = Pool()
    kept = pool.array(1000, np.float32)
    buf = array_buffer(kept)
    for _ in range(mp.PROMOTE_AFTER):
        pool.safe_point()
    del kept
    pool.array(5000, np.float32)  # needs a fresh block: the next safe point polls old blocks too
    pool.safe_point()
    assert buf.state == mp.FREE


def test_array_shapes_and_dtypes():
    pool = Pool()
    assert pool.array((), np.int64).shape == ()
    z = pool.array((0, 3), np.float32)
    assert z.shape == (0, 3) and z.size == 0
    rec = pool.array(5, np.dtype([("x", "<f4"), ("y", "<i8")]))
    rec["y"] = 7
    assert rec.dtype.names == ("x", "y") and list(rec["y"]) == [7] * 5
    assert pool.array([2, 3], "f2").dtype == np.float16
    assert pool.array((np.int64(2), 3), np.float32).shape == (2, 3)
    assert pool.array(np.int32(7), np.uint8).shape == (7,)
    with pytest.raises(ValueError):
        pool.array((-1, 2))
    with pytest.raises(ValueError):
        pool.array((-1, -2))


def test_a_failed_array_call_returns_its_block():
    pool = Pool()
    with pytest.raises(TypeError):
        pool.array((2.0, 3), np.float32)  # refused before any block is taken
    pool.array((2, 3), np.float32)
    with pytest.raises(TypeError):
        pool.array((2.0, 3), np.float32)  # the cache key matches (2, 3); np.ndarray() refuses
    pool.safe_point()
    s = check_stats(pool)
    assert s["live_bytes"] == 0 and s["watched"] == 0


def test_array_needs_host_memory():
    class Fake(Allocator):
        def alloc(self, nbytes):
            return 0x1000, object()

        def free(self, owner):
            pass

    pool = Pool(Fake())
    with pytest.raises(TypeError):
        pool.array(10)
    pool.safe_point()
    assert check_stats(pool)["live_bytes"] == 0


def test_dropped_pool_frees_its_blocks():
    gc.collect()
    before = len(mp._BY_ROOT)
    pool = Pool()
    kept = pool.array(100, np.float32)
    kept[:] = 3
    pool.array(100, np.float32)
    pool.allocate(1000).release()
    pool.safe_point()
    assert len(mp._BY_ROOT) == before + 3
    del pool
    gc.collect()
    assert len(mp._BY_ROOT) == before  # no registry keeps a dropped pool's blocks
    assert (kept == 3).all()  # the array still holds its memory


# -- MindSpore tensors over pooled arrays --------------------------------------------------------
def test_mindspore_tensors_keep_pooled_arrays_referenced():
    ms = pytest.importorskip("mindspore")
    pool = Pool()
    a = pool.array((6, 8), np.float32)
    buf = array_buffer(a)
    a[:] = np.arange(48, dtype=np.float32).reshape(6, 8)
    expected = a.copy()
    t = ms.Tensor.from_numpy(a)
    del a
    views = [t.reshape(8, 6), t[1:4], t.transpose(), ms.ops.expand_dims(t, 0)]
    as_np = t.asnumpy()
    del t
    for _ in range(3):
        pool.safe_point()
        assert buf.state == mp.LIVE
    rng = np.random.default_rng(0)
    for step in range(200):  # many pool cycles; the block under the tensors is never handed out
        tmp = [pool.array((int(rng.integers(1, 12)), 8), np.float32) for _ in range(3)]
        for x in tmp:
            assert x.ctypes.data != buf.ptr
            x.fill(step)
        del tmp
        pool.safe_point()
    np.testing.assert_array_equal(views[0].asnumpy(), expected.reshape(8, 6))
    np.testing.assert_array_equal(views[1].asnumpy(), expected[1:4])
    np.testing.assert_array_equal(views[2].asnumpy(), expected.T)
    np.testing.assert_array_equal(views[3].asnumpy(), expected[None])
    np.testing.assert_array_equal(as_np, expected)
    del as_np
    while views:
        views.pop()
        gc.collect()
        for _ in range(mp.OLD_POLL_EVERY):  # the block is an old one by now: polled less often
            pool.safe_point()
        assert (buf.state == mp.LIVE) == bool(views)  # each MindSpore view alone keeps it
    assert buf.state == mp.FREE


def test_mindspore_op_results_over_pooled_inputs_stay_valid():
    # Without launch_blocking MindSpore queues ops: a queued op holds its input tensors, and so the
    # array, until it runs (seen as a refcount, so the block waits); asnumpy() below syncs.
    ms = pytest.importorskip("mindspore")
    pool = Pool()
    outs = []
    for step in range(50):
        a = pool.array((4, 16), np.float32)
        a[:] = step
        t = ms.Tensor.from_numpy(a)
        del a
        y = t * 2 + 1
        outs.append((y, t if step % 2 == 0 else None, step))  # some tensors dropped: reused
        y.asnumpy()
        del t, y
        pool.safe_point()
    for y, t, step in outs:
        np.testing.assert_array_equal(y.asnumpy(), np.full((4, 16), 2 * step + 1, np.float32))
        if t is not None:
            np.testing.assert_array_equal(t.asnumpy(), np.full((4, 16), step, np.float32))
    assert pool.stats()["reused"] > 0


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
    a = pool.array(300, np.float32)  # arrays fall back too, and are polled like pooled ones
    fb = array_buffer(a)
    assert fb.state == mp.FALLBACK and pool.stats()["fallback_bytes"] >= 1200
    a[:] = 2
    pool.safe_point()
    assert fb.state == mp.FALLBACK and (a == 2).all()
    del a
    pool.safe_point()
    assert fb.state == mp.GONE and pool.stats()["fallback_bytes"] == 0
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


def test_soft_cap_trims_on_miss_and_at_safe_point():
    pool = Pool(soft_cap=8192, headroom=None)
    bufs = [pool.allocate(4096) for _ in range(4)]  # 16 KiB live: above the soft cap is allowed
    assert pool.stats()["reserved_bytes"] == 16384
    for b in bufs:
        b.release()
    pool.safe_point()  # trims back to the soft cap
    s = check_stats(pool)
    assert s["reserved_bytes"] == 8192 and s["trimmed_bytes"] == 8192
    # A miss above the cap trims other sizes first.
    c = pool.allocate(16384)
    s = check_stats(pool)
    assert c.state == mp.LIVE and s["reserved_bytes"] == 16384 and s["fallback_allocs"] == 0
    assert s["trimmed_bytes"] == 16384


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
    pool = Pool(alloc, headroom=None)
    pool.allocate(128).release()
    pool.safe_point()
    alloc.fail = True
    b = pool.allocate(512)
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
    assert s["requested_bytes"] == 0 and s["peak_requested_bytes"] == 64 + 64 + 128 + 256


def test_threads_smoke():
    pool = Pool(soft_cap=1 << 20, hard_cap=4 << 20)
    errors = []
    barrier = threading.Barrier(6)

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            barrier.wait()
            kept = []
            for i in range(300):
                bufs = [pool.allocate(int(rng.integers(1, 20000))) for _ in range(3)]
                for b in bufs:
                    b.host_view()[:] = seed
                arr = pool.array(int(rng.integers(1, 2000)), np.int32)
                arr[:] = seed
                view = arr[::2]
                del arr
                for b in bufs:
                    assert (b.host_view() == seed).all()  # nobody else got this block
                    b.release()
                assert (view == seed).all()
                if i % 5 == 0:
                    kept.append(view)  # some live on across other threads' safe points
                del view
                if i % 7 == 0:
                    pool.safe_point()
                    for k in kept:
                        assert (k == seed).all()
                if len(kept) > 4:
                    kept.pop(0)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for _ in range(mp.OLD_POLL_EVERY):
        pool.safe_point()
    s = check_stats(pool)
    assert s["live_bytes"] == 0 and s["pending_bytes"] == 0 and s["watched"] == 0
    assert s["allocs"] == 6 * 300 * 4 and s["reused"] > 0


def test_safe_point_between_lock_release_and_array_creation():
    # Another thread's safe point can run after `array` releases the lock and before the ndarray
    # exists: the block must still look referenced then. Run one exactly there.
    pool = Pool()
    pool.array(100, np.float32)
    pool.safe_point()  # a warm free list: the hot path
    real = pool._lock
    armed = []

    class Lock:
        def acquire(self):
            real.acquire()

        def release(self):
            real.release()
            if armed:
                armed.pop()
                pool.safe_point()

        def __enter__(self):
            real.acquire()

        def __exit__(self, *exc):
            self.release()

    pool._lock = Lock()
    armed.append(True)
    a = pool.array(100, np.float32)
    assert not armed  # the safe point ran inside array()
    buf = array_buffer(a)
    assert buf.state == mp.LIVE and buf.watched
    assert pool.array(100, np.float32).ctypes.data != a.ctypes.data


def test_bench_runs(capsys):
    res = mp.bench(256, sizes=(256, 1 << 16), repeat=1)
    assert set(res) == {256, 1 << 16}
    assert res[256]["reuse_rate"] > 0.9
    assert "np.empty" in capsys.readouterr().out
