"""Memory pool, heap trimming (`Pool.heap_trim_mb`, `Pool.trim_heap`): with a fake malloc_trim and a
fake RSS, that the check runs every HEAP_CHECK_EVERY safe points, trims only past the threshold and
the interval, counts what it does, and does nothing where malloc_trim is unavailable or the RSS is
unknown; with the real glibc (where present), that a trim runs, is counted and gives memory back;
and the `pool_heap_trim_mb` option."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from ms_dynvm.runtime import memory_pool as mp
from ms_dynvm.runtime.memory_pool import Pool

MiB = 1 << 20


class FakeHeap:
    """A fake RSS (`rss`, bytes) and malloc_trim, which drops the RSS to `floor`."""

    def __init__(self, rss: int = 100 * MiB, floor: int | None = None) -> None:
        self.rss = rss
        self.floor = floor
        self.trims = 0
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return self.rss

    def trim(self, pad: int) -> int:
        assert pad == 0
        self.trims += 1
        if self.floor is not None:
            self.rss = min(self.rss, self.floor)
        return 1


@pytest.fixture
def fake(monkeypatch) -> FakeHeap:
    heap = FakeHeap()
    monkeypatch.setattr(mp, "_malloc_trim_fn", heap.trim)
    monkeypatch.setattr(mp, "rss_bytes", heap.read)
    monkeypatch.setattr(mp, "HEAP_TRIM_INTERVAL", 0.0)
    monkeypatch.setattr(mp, "HEAP_TRIM_SHARE", 1e9)  # no spacing by cost (test_costly_trims_are_spaced)
    return heap


def check(pool: Pool) -> None:
    """HEAP_CHECK_EVERY safe points: one RSS reading (with heap trimming on)."""
    for _ in range(mp.HEAP_CHECK_EVERY):
        pool.safe_point()


def test_trim_past_threshold_counted(fake):
    pool = Pool(heap_trim_mb=4)
    check(pool)  # first reading: the base
    assert fake.reads == 1 and fake.trims == 0
    fake.rss += 3 * MiB
    check(pool)
    assert fake.trims == 0  # grew 3 MiB: under the threshold
    fake.rss += 2 * MiB
    fake.floor = 90 * MiB
    check(pool)  # 5 MiB over the base: trim, RSS 105 -> 90 MiB
    assert fake.trims == 1
    s = pool.stats()
    assert s["heap_checks"] == 3 and s["heap_trims"] == 1
    assert s["heap_released_bytes"] == 15 * MiB
    assert s["heap_trim_ns"] >= 0
    # The base is now the RSS after the trim (90 MiB): 4 MiB more is not enough, 5 is.
    fake.floor = None
    fake.rss += 4 * MiB
    check(pool)
    assert fake.trims == 1
    fake.rss += 1 * MiB
    check(pool)
    assert fake.trims == 2
    assert pool.stats()["heap_released_bytes"] == 15 * MiB  # the fake trim released nothing this time


def test_base_follows_the_rss_down(fake):
    pool = Pool(heap_trim_mb=4)
    check(pool)
    fake.rss -= 50 * MiB  # the process gave memory back on its own
    check(pool)
    fake.rss += 5 * MiB  # 5 MiB above the lowest reading
    check(pool)
    assert fake.trims == 1


def test_check_every_n_safe_points(fake):
    pool = Pool(heap_trim_mb=1)
    for _ in range(5 * mp.HEAP_CHECK_EVERY + mp.HEAP_CHECK_EVERY - 1):
        pool.safe_point()
    assert fake.reads == 5 and pool.stats()["heap_checks"] == 5
    assert pool.stats()["safe_points"] == 6 * mp.HEAP_CHECK_EVERY - 1


def test_interval_bounds_automatic_trims(fake, monkeypatch):
    monkeypatch.setattr(mp, "HEAP_TRIM_INTERVAL", 3600.0)
    pool = Pool(heap_trim_mb=0)
    for _ in range(20):
        check(pool)
        fake.rss += 10 * MiB
    assert fake.trims == 1  # the first trim, then none within the interval
    assert pool.trim_heap() == 0  # an explicit trim is not bounded by the interval
    assert fake.trims == 2 and pool.stats()["heap_trims"] == 2


def test_off_by_default_and_when_set_to_none(fake):
    pool = Pool()
    assert pool.heap_trim_mb is None
    for _ in range(10):
        check(pool)
        fake.rss += 100 * MiB
    assert fake.reads == 0 and fake.trims == 0
    pool.heap_trim_mb = 1
    check(pool)
    pool.heap_trim_mb = None
    for _ in range(10):
        check(pool)
    assert fake.reads == 1 and pool.stats()["heap_checks"] == 1


def test_skipped_where_malloc_trim_is_unavailable(fake, monkeypatch):
    monkeypatch.setattr(mp, "_malloc_trim_fn", None)
    pool = Pool(heap_trim_mb=1)
    assert pool.heap_trim_mb == 1  # kept, but inert
    for _ in range(10):
        check(pool)
        fake.rss += 100 * MiB
    assert fake.reads == 0 and fake.trims == 0
    assert pool.trim_heap() is None
    s = pool.stats()
    assert s["heap_checks"] == 0 and s["heap_trims"] == 0


def test_skipped_when_rss_is_unknown(fake, monkeypatch):
    monkeypatch.setattr(mp, "rss_bytes", lambda: None)
    pool = Pool(heap_trim_mb=0)
    for _ in range(10):
        check(pool)
    assert fake.trims == 0 and pool.stats()["heap_checks"] == 0
    assert pool.trim_heap() == 0 and fake.trims == 1  # explicit: trims, release unknown (0)


def test_loader_without_malloc_trim(monkeypatch):
    monkeypatch.setattr(mp, "_malloc_trim_fn", mp._UNSET)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert mp.malloc_trim_fn() is None
    assert Pool(heap_trim_mb=1).trim_heap() is None


def test_invalid_threshold():
    with pytest.raises(ValueError):
        Pool(heap_trim_mb=-1)
    with pytest.raises(ValueError):
        Pool().heap_trim_mb = float("nan")


def test_concurrent_check_skips(fake):
    pool = Pool(heap_trim_mb=0)
    with pool._heap_lock:  # another thread is checking or trimming
        check(pool)
    assert fake.reads == 0
    check(pool)
    assert fake.reads == 1


def test_buffers_unaffected_by_trims(fake):
    """Trims run at safe points between allocations: blocks and arrays keep working and the pool's
    accounting is unchanged."""
    pool = Pool(heap_trim_mb=0)
    kept = pool.array((256, 256), np.float32)
    kept[:] = 3.0
    for i in range(50):
        a = pool.array((64, 100 + i), np.float32)
        a[:] = i
        del a
        fake.rss += MiB
        check(pool)
    assert fake.trims > 0
    assert float(kept.sum()) == 3.0 * 256 * 256
    s = pool.stats()
    assert s["reserved_bytes"] == s["live_bytes"] + s["pending_bytes"] + s["free_bytes"]


def test_default_pool_trims_the_heap():
    assert mp.HEAP_TRIM_MB is not None
    assert mp.default_pool().heap_trim_mb == mp.HEAP_TRIM_MB


# -- the real thing ------------------------------------------------------------------------------
def test_rss_bytes_matches_statm():
    if not os.path.exists("/proc/self/statm"):
        assert mp.rss_bytes() is None
        return
    with open("/proc/self/statm") as f:
        expect = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    got = mp.rss_bytes()
    assert abs(got - expect) < 16 * MiB


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_rss_bytes_after_fork():
    mp.rss_bytes()  # opened in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: its own statm, not the parent's
        try:
            ok = mp._statm[0] != os.getpid() and mp.rss_bytes() is not None and mp._statm[0] == os.getpid()
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)
    assert mp._statm[0] == os.getpid()


@pytest.mark.skipif(mp.malloc_trim_fn() is None, reason="glibc malloc_trim not available")
def test_real_trim_gives_memory_back():
    pool = Pool()
    arrays = [pool.array((100, 1000 + i), np.float32) for i in range(8)]
    for i, a in enumerate(arrays):
        a[:] = i
    dropped = [pool.array((100, 1000), np.float32) for _ in range(8)]
    del dropped
    pool.safe_point()  # free blocks in the pool: not the C heap's, untouched by the trim
    # Fragment the C heap: many 64 KiB blocks (under the mmap threshold), every other one kept, so
    # the freed ones cannot be returned at the heap's top and stay in glibc's free lists.
    blocks = [bytearray(64 << 10) for _ in range(1024)]
    for b in blocks:
        b[::4096] = b"\x01" * len(b[::4096])  # resident
    keep = blocks[::2]
    del blocks
    released = pool.trim_heap()
    assert released is not None and released >= 0
    s = pool.stats()
    assert s["heap_trims"] == 1 and s["heap_trim_ns"] > 0
    assert s["heap_released_bytes"] == released
    assert len(keep) == 512 and all(b[0] == 1 for b in keep)  # live memory untouched
    assert all((a == i).all() for i, a in enumerate(arrays))
    again = pool.array((100, 1000), np.float32)  # a pooled block, reused after the trim
    again[:] = 7.0
    assert float(again.sum()) == 7.0 * 100 * 1000
    assert pool.stats()["fresh_allocs"] == 16


@pytest.mark.skipif(mp.malloc_trim_fn() is None, reason="glibc malloc_trim not available")
def test_real_automatic_trim(monkeypatch):
    monkeypatch.setattr(mp, "HEAP_TRIM_INTERVAL", 0.0)
    monkeypatch.setattr(mp, "HEAP_TRIM_SHARE", 1e9)
    pool = Pool(heap_trim_mb=0)
    check(pool)  # the base
    grow = [bytearray(1 << 20) for _ in range(8)]  # RSS grows (calloc'd pages touched below)
    for b in grow:
        b[::4096] = b"\x01" * len(b[::4096])
    check(pool)
    assert pool.stats()["heap_trims"] == 1
    del grow


# -- the option ----------------------------------------------------------------------------------
def test_option_default_and_env(monkeypatch):
    from ms_dynvm.frontend.options import Options

    monkeypatch.delenv("DYNVM_POOL_HEAP_TRIM_MB", raising=False)
    assert Options.make().pool_heap_trim_mb == mp.HEAP_TRIM_MB
    assert Options.make(pool_heap_trim_mb=0).pool_heap_trim_mb == 0
    monkeypatch.setenv("DYNVM_POOL_HEAP_TRIM_MB", "32")
    assert Options.make().pool_heap_trim_mb == 32
    with pytest.raises(ValueError):
        Options.make(pool_heap_trim_mb=-1)
    import ms_dynvm.frontend.options as options_mod

    assert "pool_heap_trim_mb" in options_mod.__doc__


def test_costly_trims_are_spaced(fake, monkeypatch):
    """The last trim's time plus a page fault per page that became resident since it is at most
    HEAP_TRIM_SHARE of the time until the next automatic trim: a program that touches again what was
    trimmed is trimmed less often; memory that stays free goes back at the interval."""
    monkeypatch.setattr(mp, "HEAP_TRIM_SHARE", 0.01)
    pool = Pool(heap_trim_mb=0)
    check(pool)
    fake.rss += 2048 * MiB
    fake.floor = 100 * MiB
    check(pool)  # the first trim: gives back 2 GiB
    assert fake.trims == 1
    fake.floor = None
    fake.rss += 1 * MiB  # little of it comes back (256 pages, ~0.26 ms): trimmed again a second later
    pool._heap_last -= 1.0
    check(pool)
    assert fake.trims == 2
    fake.rss += 2048 * MiB  # 2 GiB touched since: >= 0.52 s of faults, so >= 52 s to the next trim
    for _ in range(10):
        pool._heap_last -= 4.0
        check(pool)
        fake.rss += 1 * MiB
    assert fake.trims == 2
    pool._heap_last -= 3600  # an hour later
    check(pool)
    assert fake.trims == 3


def test_option_reaches_the_default_pool():
    from ms_dynvm.frontend.options import Options
    from ms_dynvm.frontend.tier1 import _pool_for

    pool = mp.default_pool()
    before = pool.heap_trim_mb, pool.soft_cap
    try:
        assert _pool_for(Options.make(pool_heap_trim_mb=0)) is pool
        assert pool.heap_trim_mb is None
        assert _pool_for(Options.make(pool_heap_trim_mb=32)).heap_trim_mb == 32
    finally:
        pool.heap_trim_mb, pool.soft_cap = before
