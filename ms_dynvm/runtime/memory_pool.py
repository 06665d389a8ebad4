"""Memory pool: refcounted, size-bucketed buffers with delayed release at safe points.

Design
------
An `Allocator` hands out raw blocks (`alloc(nbytes) -> (ptr, owner_obj)`, `free(owner_obj)`);
`HostAllocator` backs them with 64-byte aligned NumPy uint8 arrays. A device allocator (pycuda
`mem_alloc`, whose `DeviceAllocation` is the owner object and `int(owner)` the pointer) plugs in the
same way: the pool only ever looks at `ptr` and passes `owner_obj` back to `free`.

`Pool.allocate(nbytes)` returns a `Buffer` with refcount 1. Requests are rounded up to the 64-byte
alignment granule `g` (an aligned block takes that much anyway) and mapped to a size class:

- `g <= 1 MiB`: the next power of two, at least 64 B (15 classes: shapes that differ a little share
  blocks, which is what a dynamic-shape VM produces);
- `g > 1 MiB`: 4 steps per power of two (1, 1.25, 1.5, 1.75 x 2^k), so the waste is at most 20%
  where the bytes matter.

If the class would waste more than 25% of it (`4 * (class - g) > class`, possible only below 1 MiB,
e.g. 640 B -> 1024 B) the request gets an exact block of `g` bytes instead (`exact_allocs`). Exact
blocks are still pooled, in a free list keyed by their exact size: a VM replays the same shapes, so
the same odd size comes back. An exact size is never a class size (a class size wastes nothing), so
one dict keyed by block capacity holds every free list.

Lifetime: `retain()`/`release()` move the count; a buffer whose count reaches zero goes to a
delayed-release queue and only joins its free list at the next `safe_point()` (end of a group or
region execution; a stream sync on GPU). A kernel still in flight on a stream therefore never sees
its inputs or outputs handed to someone else.

`Pool.array(shape, dtype)` wraps a buffer as a NumPy array for zero-copy hand-off
(`Tensor.from_numpy` keeps the array alive); see `Pool.array` for why its lifetime is exact.

Caps: above `soft_cap` (reserved bytes) a miss first reuses a free block of up to twice the needed
size, else trims free lists before reserving a new block, and `safe_point` trims back to the soft
cap. Above `hard_cap` it trims, and if the new block still would not fit, it falls back to a plain
`np.empty` outside the pool (`fallback_allocs`; such buffers behave the same, delayed release
included, but are dropped at the safe point instead of pooled).
An allocator error (out of memory) frees every free block and retries once, as CuPy does.

Invariants (checked by tests/runtime/test_memory_pool.py)
---------------------------------------------------------
- A block is in exactly one state: LIVE (count > 0), PENDING (count 0, before the next safe point),
  FREE (in its free list), or GONE (trimmed and returned to the allocator). A fallback buffer goes
  FALLBACK (count > 0) -> PENDING -> GONE.
- Only FREE blocks are handed out again or trimmed, so no two referenced buffers overlap and nothing
  is reused before a safe point.
- `reserved_bytes == live + pending + free` block capacities, so `live_bytes <= reserved_bytes`.
- `allocs == reused + fresh_allocs + fallback_allocs`.

Thread safety: one `threading.Lock` guards all pool state; the hit path under it is a dict lookup,
a list pop and a few integer updates. The array finalizer does not take the lock (it can run inside
a garbage collection triggered while this thread holds it): it appends to a deque, which is drained
under the lock by `safe_point()` and `stats()`.

Measured (`stats()`; `ms_dynvm.stats()` reports them with a `pool_` prefix)
---------------------------------------------------------------------------
live_bytes / reserved_bytes (capacities of referenced blocks / of all blocks the pool holds),
peak_live_bytes, peak_reserved_bytes, reuse_rate (allocations served from a free list / all
allocations), fragmentation (1 - largest free block / total free bytes, 0 when nothing is free),
allocs, exact_allocs (requests routed to an exact-size block, fresh or reused), fallback_allocs;
also pending_bytes, free_bytes, fallback_bytes (held outside the pool), reused, fresh_allocs, trimmed_bytes,
safe_points. `bench(n)` prints allocate+release cost against a fresh `np.empty`.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
import weakref
from collections.abc import Sequence

import numpy as np

ALIGN = 64  # bytes: cache line, and enough for any SIMD load the C kernels emit
MIN_CLASS = 64
FINE_ABOVE = 1 << 20  # classes above 1 MiB use 4 steps per power of two
FINE_STEPS_LOG2 = 2  # 4 steps
MAX_WASTE = 0.25

# Buffer states.
LIVE, PENDING, FREE, GONE, FALLBACK = "live", "pending", "free", "gone", "fallback"


def round_up(nbytes: int, align: int = ALIGN) -> int:
    return -(-nbytes // align) * align


def size_class(nbytes: int) -> int:
    """The class capacity for a request of `nbytes` (before the 25% waste check)."""
    g = max(round_up(nbytes), MIN_CLASS)
    if g <= FINE_ABOVE:
        return 1 << (g - 1).bit_length()
    step = 1 << ((g - 1).bit_length() - 1 - FINE_STEPS_LOG2)  # 2^k / 4 where 2^k < g <= 2^(k+1)
    return -(-g // step) * step


def block_size(nbytes: int) -> tuple[int, bool]:
    """(capacity, exact): the block a request gets; exact when its class would waste > 25%."""
    hit = _BLOCK_CACHE.get(nbytes)
    if hit is not None:
        return hit
    g = max(round_up(nbytes), MIN_CLASS)
    c = size_class(g)
    hit = (g, True) if (c - g) > MAX_WASTE * c else (c, False)
    if len(_BLOCK_CACHE) < 4096:  # a VM sees few distinct sizes; bounded all the same
        _BLOCK_CACHE[nbytes] = hit
    return hit


_BLOCK_CACHE: dict[int, tuple[int, bool]] = {}


class Allocator:
    """Raw block source. `alloc` returns `(ptr, owner_obj)`; the block stays valid while `owner_obj`
    is referenced and until `free(owner_obj)`. Raise MemoryError when out of memory."""

    alignment: int = ALIGN

    def alloc(self, nbytes: int) -> tuple[int, object]:
        raise NotImplementedError

    def free(self, owner: object) -> None:
        raise NotImplementedError


class HostAllocator(Allocator):
    """64-byte aligned host blocks: a uint8 view, aligned, into a slightly larger `np.empty`.

    `free` only drops the pool's reference; the memory goes back to the C heap when the last
    reference (the pool's, or an array still built on it) is gone."""

    def __init__(self) -> None:
        self.allocated = 0
        self.freed = 0

    def alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        base = raw.__array_interface__["data"][0]
        off = (-base) % ALIGN
        view = raw[off:off + nbytes]
        self.allocated += 1
        return base + off, view

    def free(self, owner: object) -> None:
        self.freed += 1


class Buffer:
    """A pooled block. `nbytes` is the request, `capacity` the block size. Hold it with
    `retain()`/`release()`; the block is reused only after the count reaches zero AND a safe point
    has passed. Do not touch the memory after your last `release()`."""

    __slots__ = ("pool", "ptr", "owner", "capacity", "nbytes", "exact", "refcount", "state")

    def __init__(self, pool: Pool, ptr: int, owner: object, capacity: int, exact: bool) -> None:
        self.pool = pool
        self.ptr = ptr
        self.owner = owner
        self.capacity = capacity
        self.nbytes = 0
        self.exact = exact
        self.refcount = 0
        self.state = GONE

    def retain(self) -> Buffer:
        with self.pool._lock:
            if self.refcount <= 0:
                raise RuntimeError(f"retain() on a released buffer ({self.state})")
            self.refcount += 1
        return self

    def release(self) -> None:
        with self.pool._lock:
            self.pool._release_locked(self)

    def host_view(self) -> np.ndarray:
        """The block's first `nbytes` as uint8 (host allocators only). Valid until release."""
        return self.owner[:self.nbytes]

    def __repr__(self) -> str:
        return (f"Buffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, capacity={self.capacity}, "
                f"refcount={self.refcount}, state={self.state})")


_TYPESTR: dict[np.dtype, str] = {}


class _ArrayOwner:
    """Exports a pooled buffer to NumPy through `__array_interface__`: the array's `.base` is this
    object, and it keeps the storage referenced so the memory is valid for as long as it lives."""

    __slots__ = ("__array_interface__", "storage", "buffer", "__weakref__")


def array_buffer(arr: np.ndarray) -> Buffer | None:
    """The pooled `Buffer` under an array made by `Pool.array` (or a view of one), else None.
    Retain it to keep the block out of the free lists independently of the array."""
    obj = arr
    while isinstance(obj, np.ndarray):
        obj = obj.base
    return obj.buffer if isinstance(obj, _ArrayOwner) else None


class Pool:
    """Size-bucketed, refcounted pool over one `Allocator` (host by default).

    `soft_cap` / `hard_cap` bound `reserved_bytes` (None = unbounded); see the module docstring."""

    def __init__(self, allocator: Allocator | None = None, soft_cap: int | None = None,
                 hard_cap: int | None = None) -> None:
        if soft_cap is not None and hard_cap is not None and soft_cap > hard_cap:
            raise ValueError("soft_cap must not exceed hard_cap")
        self.allocator = allocator if allocator is not None else HostAllocator()
        self.soft_cap = soft_cap
        self.hard_cap = hard_cap
        self._lock = threading.Lock()
        self._free: dict[int, list[Buffer]] = {}  # capacity -> LIFO stack (warm blocks first)
        self._pending: list[Buffer] = []
        self._pending_fallback: list[Buffer] = []  # dropped (not pooled) at the next safe point
        self._dropped: collections.deque[Buffer] = collections.deque()  # array finalizer releases
        self._live = self._pending_bytes = self._free_bytes = self._fallback_bytes = 0
        self._peak_live = self._peak_reserved = 0
        self._allocs = self._reused = self._fresh = self._exact = self._fallback = 0
        self._trimmed = self._safe_points = 0

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Buffer:
        """A buffer of at least `nbytes` bytes with refcount 1."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        cap, exact = block_size(nbytes)
        with self._lock:
            self._allocs += 1
            if exact:
                self._exact += 1
            stack = self._free.get(cap)
            if stack:  # hit: the hot path
                buf = stack.pop()
                if buf.state is not FREE:  # cheap guard: a broken invariant must not hand out memory
                    raise RuntimeError(f"memory pool corrupted: free list holds {buf!r}")
                self._free_bytes -= cap
                self._reused += 1
            else:
                try:
                    buf = self._miss_locked(cap, exact, nbytes)
                except BaseException:
                    self._allocs -= 1  # keep allocs == reused + fresh + fallback
                    self._exact -= exact
                    raise
                if buf.state == FALLBACK:
                    return buf
            buf.state = LIVE
            buf.refcount = 1
            buf.nbytes = nbytes
            self._live += buf.capacity
            if self._live > self._peak_live:
                self._peak_live = self._live
        return buf

    def _miss_locked(self, cap: int, exact: bool, nbytes: int) -> Buffer:
        limit = self.soft_cap if self.soft_cap is not None else self.hard_cap
        if limit is not None and self._reserved() + cap > limit:
            buf = self._take_larger_locked(cap)  # prefer reuse to growing
            if buf is not None:
                self._reused += 1
                return buf
            self._trim_locked(limit - cap, keep=cap)
        if self.hard_cap is not None and self._reserved() + cap > self.hard_cap:
            return self._fallback_locked(nbytes)
        try:
            ptr, owner = self.allocator.alloc(cap)
        except MemoryError:
            self._trim_locked(0)
            ptr, owner = self.allocator.alloc(cap)
        self._fresh += 1
        buf = Buffer(self, ptr, owner, cap, exact)
        reserved = self._reserved() + cap
        if reserved > self._peak_reserved:
            self._peak_reserved = reserved
        return buf

    def _take_larger_locked(self, cap: int) -> Buffer | None:
        best = None
        for c, stack in self._free.items():
            if stack and cap < c <= 2 * cap and (best is None or c < best):
                best = c
        if best is None:
            return None
        self._free_bytes -= best
        buf = self._free[best].pop()
        if buf.state is not FREE:
            raise RuntimeError(f"memory pool corrupted: free list holds {buf!r}")
        return buf

    def _fallback_locked(self, nbytes: int) -> Buffer:
        self._fallback += 1
        raw = np.empty(max(nbytes, 1) + ALIGN, dtype=np.uint8)
        base = raw.__array_interface__["data"][0]
        off = (-base) % ALIGN
        buf = Buffer(self, base + off, raw[off:off + max(nbytes, 1)], max(nbytes, 1), False)
        buf.state = FALLBACK
        buf.refcount = 1
        buf.nbytes = nbytes
        self._fallback_bytes += buf.capacity
        return buf

    def _release_locked(self, buf: Buffer) -> None:
        if buf.refcount <= 0:
            raise RuntimeError(f"release() on a buffer with refcount {buf.refcount} ({buf.state})")
        buf.refcount -= 1
        if buf.refcount:
            return
        if buf.state == FALLBACK:  # delayed too: a kernel in flight may still use it
            buf.state = PENDING
            self._pending_fallback.append(buf)
            return
        buf.state = PENDING
        self._live -= buf.capacity
        self._pending_bytes += buf.capacity
        self._pending.append(buf)

    def _drain_dropped_locked(self) -> None:
        dropped = self._dropped
        while dropped:
            self._release_locked(dropped.popleft())

    # -- NumPy arrays -------------------------------------------------------------------------
    def array(self, shape: int | Sequence[int], dtype: np.dtype | type | str = np.float32) -> np.ndarray:
        """An uninitialised C-contiguous array over a pooled buffer, released when the array dies.

        The array is made from a small `_ArrayOwner` through `__array_interface__`, so
        `array.base is owner`. NumPy collapses a view's `.base` only through ndarrays, never past a
        non-ndarray exporter, so every view, slice, reshape or `memoryview` of the array (or of its
        views) references either the array or the owner: the owner lives exactly as long as some
        array over the memory. `weakref.finalize(owner, ...)` therefore fires only when the last
        of them is gone; it queues the release, and the block becomes reusable at the next safe
        point after that. MindSpore's `Tensor.from_numpy` holds the array, so a tensor handed out
        keeps its memory. The owner also references the storage, so even a trimmed or dropped
        pool cannot free memory under a live array. Copies (`np.array(a)`, `a.copy()`) are
        independent of the pool, as usual."""
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
        nbytes = dt.itemsize * math.prod(shape)
        if nbytes < 0:
            raise ValueError(f"negative dimensions in {shape}")
        buf = self.allocate(nbytes)
        owner = _ArrayOwner()
        owner.storage = buf.owner
        owner.buffer = buf
        typestr = _TYPESTR.get(dt)
        if typestr is None:  # dt.str costs ~0.5 us per call: cache it
            typestr = _TYPESTR[dt] = dt.str
        iface = {"shape": shape, "typestr": typestr, "data": (buf.ptr, False), "version": 3}
        if dt.fields is not None:
            iface["descr"] = dt.descr
        owner.__array_interface__ = iface
        arr = np.asarray(owner)
        weakref.finalize(owner, self._dropped.append, buf).atexit = False
        return arr

    # -- safe points, trimming ----------------------------------------------------------------
    def safe_point(self) -> int:
        """Nothing issued before this point still uses memory: queued releases become reusable.
        Returns the number of blocks moved to free lists. Trims down to `soft_cap` if above it."""
        with self._lock:
            self._drain_dropped_locked()
            pending, self._pending = self._pending, []
            free = self._free
            for buf in pending:
                buf.state = FREE
                stack = free.get(buf.capacity)
                if stack is None:
                    free[buf.capacity] = [buf]
                else:
                    stack.append(buf)
            self._free_bytes += self._pending_bytes
            self._pending_bytes = 0
            for buf in self._pending_fallback:
                buf.state = GONE
                buf.owner = None
                self._fallback_bytes -= buf.capacity
            self._pending_fallback.clear()
            self._safe_points += 1
            if self.soft_cap is not None and self._reserved() > self.soft_cap:
                self._trim_locked(self.soft_cap)
            return len(pending)

    def trim(self, target_reserved: int = 0) -> int:
        """Return free blocks to the allocator until reserved <= target (or nothing is free).
        Returns the bytes released. Live and pending blocks are never touched."""
        with self._lock:
            return self._trim_locked(target_reserved)

    def _trim_locked(self, target: int, keep: int = -1) -> int:
        # Exact blocks first (least likely to match again), then the largest classes (most bytes
        # per allocator call); the oldest block of a stack goes first. `keep` (the class being
        # requested) is trimmed last.
        released = 0
        if self._reserved() <= target or not self._free_bytes:
            return 0
        order = sorted((c for c, s in self._free.items() if s),
                       key=lambda c: (c == keep, not self._free[c][0].exact, -c))
        for c in order:
            stack = self._free[c]
            while stack and self._reserved() > target:
                buf = stack.pop(0)
                self._free_bytes -= c
                released += c
                buf.state = GONE
                self.allocator.free(buf.owner)
                buf.owner = None
            if not stack:
                del self._free[c]
            if self._reserved() <= target:
                break
        self._trimmed += released
        return released

    # -- stats --------------------------------------------------------------------------------
    def _reserved(self) -> int:
        return self._live + self._pending_bytes + self._free_bytes

    def stats(self) -> dict:
        with self._lock:
            self._drain_dropped_locked()
            largest = max((c for c, s in self._free.items() if s), default=0)
            free = self._free_bytes
            return {
                "live_bytes": self._live,
                "reserved_bytes": self._reserved(),
                "peak_live_bytes": self._peak_live,
                "peak_reserved_bytes": self._peak_reserved,
                "reuse_rate": self._reused / self._allocs if self._allocs else 0.0,
                "fragmentation": 1.0 - largest / free if free else 0.0,
                "allocs": self._allocs,
                "exact_allocs": self._exact,
                "fallback_allocs": self._fallback,
                "pending_bytes": self._pending_bytes,
                "free_bytes": free,
                "fallback_bytes": self._fallback_bytes,
                "reused": self._reused,
                "fresh_allocs": self._fresh,
                "trimmed_bytes": self._trimmed,
                "safe_points": self._safe_points,
            }


_default: Pool | None = None
_default_lock = threading.Lock()


def default_pool() -> Pool:
    """The process-wide host pool (created on first use, no caps)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Pool()
    return _default


def bench(n: int = 20000, sizes: Sequence[int] = (256, 4096, 65536, 1 << 20), repeat: int = 7) -> dict:
    """Median ns per buffer: pooled allocate+release (a safe point every 64 buffers, amortised)
    and pooled `array` + drop, against a fresh `np.empty` of the same size. Prints and returns
    {size: {...}}. A measurement, not an assertion."""
    results = {}
    batch = 64
    rounds = max(1, n // batch)
    for size in sizes:
        pool = Pool()
        for _ in range(2):  # warm the free lists
            bufs = [pool.allocate(size) for _ in range(batch)]
            for b in bufs:
                b.release()
            pool.safe_point()
        alloc_rel, arr_drop, fresh = [], [], []
        count = size // 4
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            for _ in range(rounds):
                bufs = [pool.allocate(size) for _ in range(batch)]
                for b in bufs:
                    b.release()
                pool.safe_point()
            alloc_rel.append((time.perf_counter_ns() - t0) / (rounds * batch))
            t0 = time.perf_counter_ns()
            for _ in range(rounds):
                arrs = [pool.array(count, np.float32) for _ in range(batch)]
                del arrs
                pool.safe_point()
            arr_drop.append((time.perf_counter_ns() - t0) / (rounds * batch))
            t0 = time.perf_counter_ns()
            for _ in range(rounds):
                arrs = [np.empty(count, np.float32) for _ in range(batch)]
                del arrs
            fresh.append((time.perf_counter_ns() - t0) / (rounds * batch))
        r = {"pool_alloc_release_ns": statistics.median(alloc_rel),
             "pool_array_drop_ns": statistics.median(arr_drop),
             "np_empty_ns": statistics.median(fresh),
             "reuse_rate": pool.stats()["reuse_rate"]}
        results[size] = r
        print(f"{size:>9} B: pool allocate+release {r['pool_alloc_release_ns']:8.0f} ns, "
              f"pool.array+drop {r['pool_array_drop_ns']:8.0f} ns, "
              f"np.empty {r['np_empty_ns']:8.0f} ns, reuse {r['reuse_rate']:.3f}")
    return results


if __name__ == "__main__":
    bench()
