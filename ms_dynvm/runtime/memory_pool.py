"""Memory pool: refcounted, size-bucketed buffers with delayed release at safe points.

Design
------
An `Allocator` hands out raw blocks (`alloc(nbytes) -> (ptr, owner_obj)`, `free(owner_obj)`);
`HostAllocator` backs them with 64-byte aligned NumPy memory (the owner is the uint8 ndarray that owns
it, `ptr` an aligned address inside). A device allocator (pycuda `mem_alloc`, whose `DeviceAllocation`
is the owner object and `int(owner)` the pointer) plugs in the same way: the pool only ever looks at
`ptr` and passes `owner_obj` back to `free`; only `Pool.array` needs host memory.

Requests are rounded up to the 64-byte alignment granule `g` (an aligned block takes that much
anyway) and mapped to a size class:

- `g <= 1 MiB`: the next power of two, at least 64 B (15 classes: shapes that differ a little share
  blocks, which is what a dynamic-shape VM produces);
- `g > 1 MiB`: 4 steps per power of two (1, 1.25, 1.5, 1.75 x 2^k), so the waste is at most 20%
  where the bytes matter.

If the class would waste more than 25% of it (`4 * (class - g) > class`, possible only below 1 MiB,
e.g. 640 B -> 1024 B) the request gets an exact block of `g` bytes instead (`exact_allocs`). Free
blocks sit in one LIFO stack per capacity (class or exact size), with a sorted index of the
capacities for best fit.

Where a request goes (`allocate`, `array`): its own stack (the hot path: a dict lookup and a pop);
else best fit, the smallest free block of capacity <= 2x the request, 8x above 64 KiB
(`reused_larger`); else a fresh block. Before reserving a fresh block the pool trims free blocks,
least recently freed first, until `reserved + new <= max((1 + headroom) * n, n + headroom_min_bytes)`
with `n = max(peak_live, live + new)` (headroom 0.15 and headroom_min_bytes 1 MiB by default; headroom
None keeps every free block), and never above `soft_cap`: so `peak_reserved <= 1.15 x peak_live`
holds by construction once the peak live passes ~6.7 MiB (below, `peak_live + 1 MiB`), and what the
measurement decides is whether reuse survives it. (The 1 MiB floor: a working set of a few hundred
KiB has no spare block within 15%, and random sizes then churn through fresh blocks; see
HEADROOM_MIN_BYTES.) On the seq_len 32..256 soak (profiling/bench/bench_pool_soak.py) exact-size
free lists per distinct size had reserved 256 MiB for a 14.5 MiB peak; with best fit and the target,
reuse after warm-up stays above 99.9%, because dynamic shapes converge on the blocks of the largest
shapes, which serve every smaller one. (Simulated on the soak's allocation trace: best fit without
the target kept ~1.7x the peak; the target without best fit dropped reuse to ~62%.) The 2x bound
below 64 KiB keeps a small long-lived array (a loss scalar kept in a list) from pinning a large
block; 8x covers the soak's seq_len range. Since best fit may give a request a larger block,
`live_bytes` (capacities) exceeds `requested_bytes`; the soak reports both ratios.

Lifetime. Two kinds of holders:
- Explicit (`Buffer` from `allocate`, for non-array users such as device buffers): `retain()` /
  `release()` move a count; a buffer whose count reaches zero goes to a delayed-release queue (PENDING)
  and joins its free list only at the next `safe_point()`.
- Arrays (`Pool.array`): no finalizer and no wrapper object. Every block keeps one root ndarray that
  owns (or exports) its memory; `array` returns `np.ndarray(shape, dtype, root, offset)`, whose
  `.base` is the root, and NumPy collapses the `.base` of every view, slice, reshape or `.view()` of it
  to the root as well (a `memoryview`, or `Tensor.from_numpy`, holds the array, which holds the root).
  So the root's CPython refcount is the pool's own references (measured once, when the block is made:
  `rc0`) plus one per object that can still reach the memory. Blocks handed out as arrays are
  "watched"; `safe_point()` polls `sys.getrefcount(root)` of each, and a block back at `rc0` goes
  straight to its free list (the safe point is the delay). MindSpore keeps the array referenced for as
  long as any tensor over it lives: `Tensor.from_numpy(a)` holds `a`, and views of the tensor
  (reshape, slicing, transpose, `asnumpy()`) hold it too (checked with MindSpore in
  tests/runtime/test_memory_pool.py). An object that keeps only a raw pointer (`a.ctypes.data`) is not
  seen: use the memory only while you hold the array. Without `launch_blocking` MindSpore queues
  ops, and a queued op holds its input tensors (so the array) until it has run: the refcount covers
  that too. A watched block whose arrays survived PROMOTE_AFTER (8) polls is polled every
  OLD_POLL_EVERY (16) safe points only, and at the next safe point after a fresh block was needed, so
  long-lived arrays (activations kept for backward, a list of losses) do not make every safe point
  slower; such a block is reused that much later, never earlier. `array_buffer(a).retain()` keeps a
  block past its arrays; the arrays hold one count of their own, released by the poll.
A kernel still in flight on a stream therefore never sees its inputs or outputs handed to someone else,
and no block is handed out while an array or view over it is alive.

Caps: `soft_cap` bounds `reserved_bytes` by trimming free blocks (on a miss, and at safe points); a
request that does not fit under it still gets a fresh block (only `hard_cap` refuses). Above
`hard_cap` the pool trims, and if the new block still would not fit, it falls back to a block from the
allocator that is not pooled (`fallback_allocs`; such buffers behave the same, delayed release and
polling included, but are returned to the allocator at the safe point instead of pooled).
An allocator error (out of memory) frees every free block and retries once, as CuPy does.

The C heap (`heap_trim_mb`; `default_pool()` has HEAP_TRIM_MB = 8, option `pool_heap_trim_mb`). The
pool's own blocks stay bounded (above), but the process RSS also holds what glibc's malloc keeps:
memory freed by MindSpore, NumPy and the program stays in glibc's free lists, resident, and only its
top is returned by itself. With `heap_trim_mb` set, every HEAP_CHECK_EVERY (64) safe points the pool
reads the RSS (/proc/self/statm, ~0.5 us) and, once it has grown by more than `heap_trim_mb` MiB above
the lowest reading since the last trim, calls glibc's `malloc_trim(0)` (through ctypes, outside the
pool's lock, GIL released), which gives every free page of every arena back to the OS. Automatic
trims are at least HEAP_TRIM_INTERVAL (1 s) apart, and further when they cost: the last one's own time
plus HEAP_FAULT_NS (1 us) per page that became resident since it (memory it gave back and the program
touched again, or new memory) must be at most HEAP_TRIM_SHARE (1%) of the time since it. So memory
that stays free (left over from start-up, from shapes not seen again) goes back about once a second,
while a program that keeps re-touching what was trimmed is trimmed less often.
Where malloc_trim is missing (not Linux, or not glibc) or the RSS cannot be read nothing is called;
`trim_heap()` trims on demand (None where unavailable). On the soak (profiling/bench/bench_pool_soak.py:
every seq_len once, then 2,000 random steps of ~16 ms) trimming keeps the RSS ~200 MiB lower (peak
over the last 200 steps ~760 instead of ~950-970 MiB); RSS growth between the peaks over the first
and the last 200 measured steps +0.6..+2.6% (5 runs) instead of +1.3..+4.3% (7 runs); measured from
the trough right after a full trim +4.3..+7.3%: the RSS then moves in a band 30-50 MiB above it
(what glibc reuses after a trim is faulted in again). Cost: ~30 trims of ~2 ms, and ~90 more minor
page faults per step (~0.9 us each), ~0.1 ms per step (~0.65%); the wall time per step (15.6-17.0
ms on, 15.2-16.4 ms off) does not resolve it. Not kept, as no better there (one run each, growth
between single readings, without trimming; 2.2-5.2% over 7 runs without them): mallopt settings
(M_MMAP_THRESHOLD 256 KiB: 4.4%; M_TRIM_THRESHOLD 64 KiB: 4.0%, with ~1,200 page faults per step and
~10% slower; M_ARENA_MAX 2: 5.2%), and pool blocks from anonymous mmap (3.6%: the pool's blocks are
reused; they are not what fragments the heap).

States and invariants (checked by tests/runtime/test_memory_pool.py)
--------------------------------------------------------------------
- A block is in exactly one state: LIVE (handed out: explicit count > 0, or watched and not yet seen
  unreferenced at a safe point), PENDING (explicit count 0, before the next safe point), FREE (in its
  free list), or GONE (trimmed and returned to the allocator). A fallback block goes FALLBACK -> PENDING
  -> GONE (or FALLBACK -> GONE at the safe point that finds its arrays gone).
- Only FREE blocks are handed out again or trimmed, so no two referenced buffers overlap, no block is
  handed out while an array over it lives, and nothing is reused before a safe point.
- `reserved_bytes == live_bytes + pending_bytes + free_bytes` (capacities), so `live_bytes <=
  reserved_bytes`; `requested_bytes <= live_bytes`.
- `allocs == reused + fresh_allocs + fallback_allocs`.

Thread safety: one `threading.Lock` guards all pool state. `array` creates the ndarray after the lock
is released, holding the root in a local variable meanwhile, so a `safe_point` in another thread sees
the block referenced. The pool has no finalizer or `__del__`, so nothing of it runs inside a garbage
collection.

Cost (profiling/bench/bench_pool_soak.py, medians per buffer on a noisy 2-core VM, varying by ~1.5x
from run to run): `array` + drop + `safe_point` 1.2-2.5 us, `allocate` + `release` + `safe_point`
1.1-2.2 us, a fresh `np.empty` 0.3-0.6 us. The hot paths are inlined (hence some repeated code);
what is left is the lock (~0.1-0.2 us a pair), `np.ndarray(shape, dtype, root, offset)` (~0.3 us),
the method calls and a dozen attribute updates.

Measured (`stats()`; `ms_dynvm.stats()` reports them with a `pool_` prefix)
---------------------------------------------------------------------------
live_bytes (capacities of LIVE blocks: a watched block counts until the safe point that finds it
unreferenced), requested_bytes (the bytes asked for by those blocks' holders), reserved_bytes
(capacities of all blocks the pool holds), peak_live_bytes, peak_requested_bytes,
peak_reserved_bytes, reuse_rate (allocations served from a free list / all allocations), fragmentation
(1 - largest free block / total free bytes, 0 when nothing is free), allocs, exact_allocs (requests
whose class would waste > 25%, served by an exact-size block or by best fit), fallback_allocs; also
pending_bytes, free_bytes, fallback_bytes (held outside the pool), reused, reused_larger (best fit
from a larger capacity), fresh_allocs, trimmed_bytes, watched (blocks handed out as arrays not yet
seen unreferenced), safe_points; heap_checks (RSS readings), heap_trims (malloc_trim calls, automatic
and `trim_heap()`), heap_trim_ns (their time), heap_released_bytes (the RSS drop across them).
`bench(n)` prints allocate+release and array+drop cost against a
fresh `np.empty`.
"""

from __future__ import annotations

import bisect
import math
import operator
import os
import statistics
import sys
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
SMALL_REQUEST = 64 << 10  # best fit bound: up to 2x at or below this, up to 8x above
REUSE_SMALL, REUSE_LARGE = 2, 8
HEADROOM = 0.15  # default reserve target: reserved <= 1.15 x peak live when a fresh block is needed
# ... or peak live + this, whichever is larger: with a small working set, 15% of it holds no spare
# block, and requests of random sizes then churn through fresh blocks (page-faulted as kernels first
# write them): simulated on the masked-softmax benchmark's pattern (4 results of [4B, S] floats per
# call, B and S random; a 0.6 MiB peak), 921 of 2,400 allocations were fresh with no minimum, 264
# with 0.5 MiB, 86 with 1 MiB, 52 (the warm-up's own) with 2 MiB. 1 MiB keeps the soak's target
# (1.15 x peak live) whatever its peak: 1 MiB is under 15% of any peak above 6.7 MiB, and the soak's
# is 13.4 MiB.
HEADROOM_MIN_BYTES = 1 << 20
PROMOTE_AFTER = 8  # watched blocks that survive this many polls are polled less often
OLD_POLL_EVERY = 16  # safe points between polls of those
HEAP_TRIM_MB = 8  # default_pool's heap_trim_mb: malloc_trim once RSS grew this much since the last one
HEAP_CHECK_EVERY = 64  # safe points between RSS readings while heap trimming is on (safe_point inlines
# `sp & 63`: keep the two together)
HEAP_TRIM_INTERVAL = 1.0  # seconds: at least this between automatic trims, and longer when they cost:
HEAP_TRIM_SHARE = 0.01  # the last trim's time plus the page faults since it, at most this share of the
HEAP_FAULT_NS = 1000  # time between two trims; a page fault (memory touched again) estimated at this

# Buffer states.
LIVE, PENDING, FREE, GONE, FALLBACK = "live", "pending", "free", "gone", "fallback"

_getrefcount = sys.getrefcount
_prod = math.prod
_ndarray = np.ndarray


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


# -- the C heap: glibc's malloc_trim, and the process RSS that decides when to call it ------------
_UNSET = object()
_malloc_trim_fn = _UNSET  # glibc's malloc_trim, None where unavailable; loaded on first use
_statm = (-1, -1)  # (pid, fd of /proc/<pid>/statm): reopened after a fork


def malloc_trim_fn():
    """glibc's `malloc_trim` through ctypes (it releases the GIL while it runs), or None where it is
    not available (not Linux, or a C library without it, such as musl)."""
    global _malloc_trim_fn
    if _malloc_trim_fn is _UNSET:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _malloc_trim_fn = fn
    return _malloc_trim_fn


def rss_bytes() -> int | None:
    """Resident set size of this process (from /proc/self/statm, about 0.5 us), None where unknown."""
    global _statm
    pid, fd = _statm
    try:
        if pid != os.getpid():
            if fd >= 0:
                os.close(fd)
            _statm = (-1, -1)
            fd = os.open(f"/proc/{os.getpid()}/statm", os.O_RDONLY)
            _statm = (os.getpid(), fd)
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096


class Allocator:
    """Raw block source. `alloc` returns `(ptr, owner_obj)`; the block stays valid while `owner_obj`
    is referenced and until `free(owner_obj)`. Raise MemoryError when out of memory. `host` is True
    when the owner is a NumPy array whose memory holds `ptr` (then `Pool.array` works)."""

    alignment: int = ALIGN
    host: bool = False

    def alloc(self, nbytes: int) -> tuple[int, object]:
        raise NotImplementedError

    def free(self, owner: object) -> None:
        raise NotImplementedError


class HostAllocator(Allocator):
    """64-byte aligned host blocks: an aligned address inside a slightly larger `np.empty`, which is
    the owner.

    `free` only drops the pool's reference; the memory goes back to the C heap when the last
    reference (the pool's, or an array still built on it) is gone."""

    host = True

    def __init__(self) -> None:
        self.allocated = 0
        self.freed = 0

    def alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        base = raw.__array_interface__["data"][0]
        self.allocated += 1
        return base + (-base) % ALIGN, raw

    def free(self, owner: object) -> None:
        self.freed += 1


# id(root) -> Buffer for host blocks not GONE: `array_buffer`'s lookup. The Buffer holds the root
# until it is GONE, so an id here is never a recycled one; weak, so a dropped pool's blocks go.
_BY_ROOT: weakref.WeakValueDictionary[int, "Buffer"] = weakref.WeakValueDictionary()


class Buffer:
    """A pooled block. `nbytes` is the request, `capacity` the block size. Hold it with
    `retain()`/`release()`; the block is reused only after the count reaches zero AND a safe point
    has passed. Do not touch the memory after your last `release()`."""

    __slots__ = ("pool", "ptr", "owner", "root", "off", "rc0", "capacity", "nbytes", "exact",
                 "refcount", "state", "watched", "age", "freed_at", "__weakref__")

    def __init__(self, pool: Pool, ptr: int, owner: object, capacity: int, exact: bool) -> None:
        self.pool = pool
        self.ptr = ptr
        self.owner = owner
        self.capacity = capacity
        self.nbytes = 0
        self.exact = exact
        self.refcount = 0
        self.state = GONE
        self.watched = False
        self.age = 0
        self.freed_at = 0
        self.rc0 = 0
        if isinstance(owner, np.ndarray):
            probe = owner[:0]  # NumPy collapses a view's base to the array that owns the memory
            self.root = probe.base if probe.base is not None else owner
            self.off = ptr - self.root.__array_interface__["data"][0]
            del probe
            _BY_ROOT[id(self.root)] = self
        else:
            self.root = None
            self.off = 0

    def retain(self) -> Buffer:
        with self.pool._lock:
            if self.refcount <= 0:
                raise RuntimeError(f"retain() on a released buffer ({self.state})")
            self.refcount += 1
        return self

    def release(self) -> None:
        pool = self.pool
        lock = pool._lock
        with lock:  # (not acquire() + try: an interrupt between them left the lock held)
            if self.refcount == 1 and self.state is LIVE and not self.watched:  # the common case
                live = pool._live
                if live > pool._peak_live:  # Pool._update_peaks_locked, inlined
                    pool._peak_live = live
                if pool._req > pool._peak_req:
                    pool._peak_req = pool._req
                self.refcount = 0
                self.state = PENDING
                pool._live = live - self.capacity
                pool._req -= self.nbytes
                pool._pending_bytes += self.capacity
                pool._pending.append(self)
            else:
                pool._release_locked(self)

    def host_view(self) -> np.ndarray:
        """The block's first `nbytes` as uint8 (host allocators only). Valid until release (an
        explicit buffer's views do not keep it; use `Pool.array` for that)."""
        return self.root[self.off:self.off + self.nbytes]

    def __repr__(self) -> str:
        return (f"Buffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, capacity={self.capacity}, "
                f"refcount={self.refcount}, state={self.state}, watched={self.watched})")


def _calibrate(buf: Buffer) -> None:
    # The pool's own references to the root, plus getrefcount's argument: `safe_point` evaluates the
    # same expression, so a block is back at `rc0` exactly when nothing else refers to its root. Called
    # where no local variable refers to the root.
    buf.rc0 = _getrefcount(buf.root)


def array_buffer(arr) -> Buffer | None:
    """The pooled `Buffer` under an array made by `Pool.array` (or a view, or a memoryview, of one),
    else None. Retain it to keep the block out of the free lists independently of the arrays."""
    obj = arr
    while obj is not None:
        buf = _BY_ROOT.get(id(obj))
        if buf is not None and buf.root is obj:
            return buf
        if isinstance(obj, np.ndarray):
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return None
    return None


# dtype argument -> (np.dtype, {shape tuple: (nbytes, capacity, exact)}): `Pool.array`'s hot path is
# two dict lookups instead of np.dtype(), math.prod and block_size.
_DTYPES: dict = {}
_CACHE_LIMIT = 8192  # shapes per dtype; past it, lookups are computed (correct, only slower)


def _lookup(dtype, shape) -> tuple:
    """(shape tuple, np.dtype, nbytes, capacity, exact) for `Pool.array`; fills the caches."""
    try:
        entry = _DTYPES.get(dtype)
    except TypeError:  # an unhashable dtype spec (a list of fields)
        entry = None
    if entry is None:
        dt = np.dtype(dtype)
        entry = (dt, {})
        try:
            if len(_DTYPES) < 256:
                _DTYPES[dtype] = entry
        except TypeError:
            pass
    dt, shapes = entry
    key = None
    if isinstance(shape, (int, np.integer)):
        key = shape = operator.index(shape)  # cached as an int too: `array(n)` stays on the hot path
        dims = (shape,)
    elif type(shape) is not tuple or not all(type(d) is int for d in shape):
        shape = dims = tuple(map(operator.index, shape))  # TypeError for 2.0, as np.empty
    else:
        dims = shape
    hit = shapes.get(dims)
    if hit is None:
        if any(d < 0 for d in dims):
            raise ValueError(f"negative dimensions in {dims}")
        nbytes = dt.itemsize * math.prod(dims)
        hit = (nbytes, *block_size(nbytes))
        if len(shapes) < _CACHE_LIMIT:
            shapes[dims] = hit
    if key is not None and len(shapes) < _CACHE_LIMIT:
        shapes[key] = hit
    return (shape, dt, *hit)


class Pool:
    """Size-bucketed, refcounted pool over one `Allocator` (host by default).

    `soft_cap` / `hard_cap` bound `reserved_bytes` (None = unbounded); `headroom` sets the reserve
    target `max((1 + headroom) x peak live, peak live + headroom_min_bytes)` kept when fresh blocks
    are needed (headroom None = keep every free block). See the module docstring."""

    def __init__(self, allocator: Allocator | None = None, soft_cap: int | None = None,
                 hard_cap: int | None = None, headroom: float | None = HEADROOM,
                 headroom_min_bytes: int = HEADROOM_MIN_BYTES,
                 heap_trim_mb: float | None = None) -> None:
        if soft_cap is not None and hard_cap is not None and soft_cap > hard_cap:
            raise ValueError("soft_cap must not exceed hard_cap")
        if headroom is not None and headroom < 0:
            raise ValueError("headroom must be >= 0")
        self.allocator = allocator if allocator is not None else HostAllocator()
        self.soft_cap = soft_cap
        self.hard_cap = hard_cap
        self.headroom = headroom
        if headroom_min_bytes < 0:
            raise ValueError("headroom_min_bytes must be >= 0")
        self.headroom_min_bytes = headroom_min_bytes
        self._host = bool(getattr(self.allocator, "host", False))
        self._lock = threading.Lock()
        self._free: dict[int, list[Buffer]] = {}  # capacity -> LIFO stack (warm blocks first)
        # Sorted keys of _free. A stack that runs empty stays (no index upkeep on the hot path);
        # best fit drops the empty ones it walks past, trimming rebuilds both.
        self._caps: list[int] = []
        self._pending: list[Buffer] = []
        self._pending_fallback: list[Buffer] = []  # returned to the allocator at the next safe point
        self._young: list[Buffer] = []  # watched blocks, polled at every safe point
        self._old: list[Buffer] = []  # watched blocks that survived PROMOTE_AFTER polls
        self._poll_old = False  # a fresh block was needed: poll the old ones at the next safe point
        # Bytes: reserved = live + pending + free (free is derived).
        self._reserved = self._live = self._req = self._pending_bytes = self._fallback_bytes = 0
        self._peak_live = self._peak_req = self._peak_reserved = 0
        self._reused = self._larger = self._fresh = self._exact = self._fallback = 0
        self._trimmed = self._safe_points = 0
        # Heap trimming (see heap_trim_mb): its own lock, taken without waiting, outside self._lock.
        self._heap_lock = threading.Lock()
        self._heap_on = False  # heap_trim_mb set and malloc_trim available
        self._heap_mb: float | None = None
        self._heap_base: int | None = None  # lowest RSS seen since the last trim
        self._heap_last = -math.inf  # time.monotonic() of the last automatic trim
        self._heap_last_ns = 0  # how long the last trim took
        self._heap_checks = self._heap_trims = self._heap_trim_ns = self._heap_released = 0
        self.heap_trim_mb = heap_trim_mb

    @property
    def heap_trim_mb(self) -> float | None:
        """Trim the C heap (glibc `malloc_trim(0)`) at a safe point once the process RSS has grown by
        more than this many MiB above its lowest reading since the last trim (RSS read every
        HEAP_CHECK_EVERY safe points; trims spaced by HEAP_TRIM_INTERVAL and HEAP_TRIM_SHARE, see the
        module docstring); None: never. Where malloc_trim is unavailable, nothing is read or called."""
        return self._heap_mb

    @heap_trim_mb.setter
    def heap_trim_mb(self, mb: float | None) -> None:
        if mb is not None and not mb >= 0:
            raise ValueError("heap_trim_mb must be >= 0 or None")
        self._heap_mb = mb
        self._heap_on = mb is not None and malloc_trim_fn() is not None

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Buffer:
        """A buffer of at least `nbytes` bytes with refcount 1 (an explicit holder: `release()` it)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        cap, exact = _BLOCK_CACHE.get(nbytes) or block_size(nbytes)
        lock = self._lock
        with lock:  # (not acquire() + try: an interrupt between them left the lock held)
            stack = self._free.get(cap)
            if stack:  # the hot path of _take_locked, inlined
                buf = stack.pop()
                if buf.state is not FREE:
                    raise RuntimeError(f"memory pool corrupted: free list holds {buf!r}")
                buf.state = LIVE
                self._live += cap
                self._req += nbytes
                self._reused += 1
                if exact:
                    self._exact += 1
            else:
                buf = self._take_locked(cap, exact, nbytes)
            buf.refcount = 1
            buf.nbytes = nbytes
        return buf

    def _take_locked(self, cap: int, exact: bool, nbytes: int) -> Buffer:
        """A block for `nbytes`, LIVE (or FALLBACK) and counted, its holder fields not yet set.
        (`allocate` and `array` inline the first branch.)"""
        stack = self._free.get(cap)
        if stack:  # hit: the hot path
            buf = stack.pop()
            self._reused += 1
        else:
            buf = self._miss_locked(cap, exact, nbytes)  # may raise: nothing counted yet
        if exact:
            self._exact += 1
        if buf.state is FALLBACK:
            return buf
        if buf.state is not FREE:  # cheap guard: a broken invariant must not hand out memory
            raise RuntimeError(f"memory pool corrupted: free list holds {buf!r}")
        buf.state = LIVE
        self._live += buf.capacity
        self._req += nbytes
        return buf

    def _miss_locked(self, cap: int, exact: bool, nbytes: int) -> Buffer:
        """No block in the request's own stack: best fit, else a fresh block (FREE, uncounted as
        live yet), else a FALLBACK block."""
        g = max(round_up(nbytes), MIN_CLASS)
        bound = g * (REUSE_SMALL if g <= SMALL_REQUEST else REUSE_LARGE)
        caps, free = self._caps, self._free
        i = bisect.bisect_left(caps, g)
        while i < len(caps) and caps[i] <= bound:
            stack = free[caps[i]]
            if stack:
                self._reused += 1
                self._larger += 1
                return stack.pop()
            del free[caps[i]]  # an empty stack walked past: drop it from the index
            del caps[i]
        # A fresh block: first trim free blocks down to the reserve target.
        self._update_peaks_locked()
        self._poll_old = True
        target = None
        if self.headroom is not None:
            need = max(self._peak_live, self._live + cap)
            target = max((1.0 + self.headroom) * need, need + self.headroom_min_bytes)
        if self.soft_cap is not None:
            target = self.soft_cap if target is None else min(target, self.soft_cap)
        if target is not None and self._reserved + cap > target:
            self._trim_locked(target - cap)
        if self.hard_cap is not None and self._reserved + cap > self.hard_cap:
            self._trim_locked(self.hard_cap - cap)
            if self._reserved + cap > self.hard_cap:
                return self._fallback_locked(nbytes)
        buf = self._new_block_locked(cap, exact)
        if buf.root is not None:
            _calibrate(buf)
        self._fresh += 1
        buf.state = FREE  # until _take_locked makes it LIVE
        self._reserved += cap
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved
        return buf

    def _new_block_locked(self, cap: int, exact: bool) -> Buffer:
        try:
            ptr, owner = self.allocator.alloc(cap)
        except MemoryError:
            self._trim_locked(0)
            ptr, owner = self.allocator.alloc(cap)
        return Buffer(self, ptr, owner, cap, exact)

    def _fallback_locked(self, nbytes: int) -> Buffer:
        self._fallback += 1
        buf = self._new_block_locked(max(round_up(nbytes), MIN_CLASS), False)
        if buf.root is not None:
            _calibrate(buf)
        buf.state = FALLBACK
        self._fallback_bytes += buf.capacity
        return buf

    def _update_peaks_locked(self) -> None:
        # Live and requested bytes only grow between the points that call this (a release, a safe
        # point, a fresh block, stats), so their peaks are exact without a check per allocation.
        if self._live > self._peak_live:
            self._peak_live = self._live
        if self._req > self._peak_req:
            self._peak_req = self._req

    def _release_locked(self, buf: Buffer) -> None:
        if buf.refcount <= 0:
            raise RuntimeError(f"release() on a buffer with refcount {buf.refcount} ({buf.state})")
        if buf.refcount == 1 and buf.watched:
            raise RuntimeError("release() of the count held by arrays: retain() first, or drop the arrays")
        buf.refcount -= 1
        if buf.refcount:
            return
        if buf.state is FALLBACK:  # delayed too: a kernel in flight may still use it
            buf.state = PENDING
            self._pending_fallback.append(buf)
            return
        self._update_peaks_locked()
        buf.state = PENDING
        self._live -= buf.capacity
        self._req -= buf.nbytes
        self._pending_bytes += buf.capacity
        self._pending.append(buf)

    def _push_free_locked(self, buf: Buffer) -> None:
        buf.state = FREE
        buf.freed_at = self._safe_points
        cap = buf.capacity
        stack = self._free.get(cap)
        if stack is None:
            self._free[cap] = [buf]
            bisect.insort(self._caps, cap)
        else:
            stack.append(buf)

    def _gone_locked(self, buf: Buffer) -> None:
        buf.state = GONE
        if buf.root is not None:
            _BY_ROOT.pop(id(buf.root), None)
        owner = buf.owner
        buf.owner = buf.root = None
        self.allocator.free(owner)

    # -- NumPy arrays -------------------------------------------------------------------------
    def array(self, shape: int | Sequence[int], dtype: np.dtype | type | str = np.float32) -> np.ndarray:
        """An uninitialised C-contiguous array over a pooled block, reusable once no array, view or
        MindSpore tensor over it is left (seen at a safe point; see the module docstring).

        The array's `.base` is the block's root ndarray. Copies (`np.array(a)`, `a.copy()`) are
        independent of the pool, as usual. Host allocators only."""
        return self.array_ptr(shape, dtype)[0]

    def array_ptr(self, shape: int | Sequence[int], dtype: np.dtype | type | str = np.float32) -> tuple:
        """`(array(shape, dtype), its data address)`: the kernel launcher's entry, which needs the
        address and should not pay for `a.ctypes` to get it."""
        try:
            dt, shapes = _DTYPES[dtype]
            nbytes, cap, exact = shapes[shape]
        except (KeyError, TypeError):
            shape, dt, nbytes, cap, exact = _lookup(dtype, shape)
        lock = self._lock
        with lock:  # (not acquire() + try: an interrupt between them left the lock held)
            stack = self._free.get(cap)
            if stack:  # the hot path of _take_locked, inlined
                buf = stack.pop()
                if buf.state is not FREE:
                    raise RuntimeError(f"memory pool corrupted: free list holds {buf!r}")
                buf.state = LIVE
                self._live += cap
                self._req += nbytes
                self._reused += 1
                if exact:
                    self._exact += 1
            else:
                buf = self._take_locked(cap, exact, nbytes)
            buf.refcount = 1  # the arrays' count, released by the poll
            buf.nbytes = nbytes
            buf.watched = True
            buf.age = 0
            self._young.append(buf)
            # Held until the array exists: a safe point in another thread sees the root referenced.
            root = buf.root
        if root is not None:
            return _ndarray(shape, dt, root, buf.off), buf.ptr
        with lock:  # not host memory: the block was never exported
            self._unwatch_locked(buf)
            buf.refcount = 1
            self._release_locked(buf)
        raise TypeError("Pool.array needs a host allocator")

    def _unwatch_locked(self, buf: Buffer) -> None:
        buf.watched = False
        for lst in (self._young, self._old):
            for i in range(len(lst) - 1, -1, -1):
                if lst[i] is buf:
                    del lst[i]
                    return

    # -- safe points, trimming ----------------------------------------------------------------
    def safe_point(self) -> int:
        """Nothing issued before this point still uses memory: queued releases, and watched blocks
        no longer referenced, become reusable. Returns the number of blocks moved to free lists.
        Trims down to `soft_cap` if above it."""
        lock = self._lock
        with lock:  # (not acquire() + try: an interrupt between them left the lock held)
            sp = self._safe_points = self._safe_points + 1
            live, req = self._live, self._req
            if live > self._peak_live:  # _update_peaks_locked, inlined
                self._peak_live = live
            if req > self._peak_req:
                self._peak_req = req
            moved = 0
            young = self._young
            if young:  # polled inline: this loop is part of every array's cost
                keep: list[Buffer] = []
                free = self._free
                for buf in young:
                    if _getrefcount(buf.root) > buf.rc0:  # an array, view or tensor refers to it
                        age = buf.age = buf.age + 1
                        if age >= PROMOTE_AFTER:
                            self._old.append(buf)
                        else:
                            keep.append(buf)
                        continue
                    if buf.refcount > 1 or buf.state is FALLBACK:
                        self._live, self._req = live, req
                        moved += self._unwatched_locked(buf)
                        live, req = self._live, self._req
                        continue
                    buf.watched = False
                    buf.refcount = 0
                    cap = buf.capacity
                    live -= cap
                    req -= buf.nbytes
                    buf.state = FREE
                    buf.freed_at = sp
                    stack = free.get(cap)
                    if stack is not None:
                        stack.append(buf)
                    else:
                        self._push_free_locked(buf)  # a new capacity: the index changes
                    moved += 1
                self._young = keep
                self._live, self._req = live, req
            if self._old and (self._poll_old or sp % OLD_POLL_EVERY == 0):
                self._poll_old = False
                moved += self._poll_old_locked()
            if self._pending:
                pending, self._pending = self._pending, []
                free = self._free
                for buf in pending:  # _push_free_locked, inlined
                    buf.state = FREE
                    buf.freed_at = sp
                    stack = free.get(buf.capacity)
                    if stack is not None:
                        stack.append(buf)
                    else:
                        self._push_free_locked(buf)
                self._pending_bytes = 0
                moved += len(pending)
            if self._pending_fallback:
                for buf in self._pending_fallback:
                    self._fallback_bytes -= buf.capacity
                    self._gone_locked(buf)
                self._pending_fallback.clear()
            if self.soft_cap is not None and self._reserved > self.soft_cap:
                self._trim_locked(self.soft_cap)
            if sp & 63:  # HEAP_CHECK_EVERY - 1: the common case ends here
                return moved
        if self._heap_on:
            self._heap_check()
        return moved

    # -- the C heap ---------------------------------------------------------------------------
    def _heap_check(self) -> None:
        """Every HEAP_CHECK_EVERY-th safe point, with heap trimming on: read the RSS; trim if it grew
        by more than heap_trim_mb above the lowest reading since the last trim, and the last automatic
        trim is old enough (HEAP_TRIM_INTERVAL, HEAP_TRIM_SHARE). Runs outside the pool's lock;
        concurrent checks skip."""
        lock = self._heap_lock
        if lock.locked():  # another thread is checking
            return
        with lock:  # (not acquire() + try: an interrupt between them would leave it held)
            mb = self._heap_mb
            rss = rss_bytes()
            if mb is None or rss is None:
                return
            self._heap_checks += 1
            base = self._heap_base
            if base is None or rss < base:
                self._heap_base = rss
                return
            if rss - base <= mb * (1 << 20):
                return
            # What the last trim cost: its own time, and the pages that became resident since it
            # (memory it gave back and the program touched again, or new memory: an upper bound).
            cost_s = (self._heap_last_ns + (rss - base) // _PAGE * HEAP_FAULT_NS) / 1e9
            now = time.monotonic()
            if now - self._heap_last < max(HEAP_TRIM_INTERVAL, cost_s / HEAP_TRIM_SHARE):
                return
            self._heap_last = now
            t0 = self._heap_trim_ns
            self._trim_heap_locked(rss)
            self._heap_last_ns = self._heap_trim_ns - t0

    def trim_heap(self) -> int | None:
        """Call glibc's `malloc_trim(0)` now: free memory of every malloc arena, inside the heap as
        well as at its top, goes back to the OS. Returns the RSS drop in bytes (0 if none), None where
        malloc_trim is unavailable. Counted in stats (heap_trims, heap_trim_ns, heap_released_bytes)."""
        if malloc_trim_fn() is None:
            return None
        with self._heap_lock:
            return self._trim_heap_locked(rss_bytes())

    def _trim_heap_locked(self, rss: int | None) -> int:
        fn = malloc_trim_fn()
        t0 = time.perf_counter_ns()
        fn(0)
        self._heap_trim_ns += time.perf_counter_ns() - t0
        self._heap_trims += 1
        after = rss_bytes()
        released = max(0, rss - after) if rss is not None and after is not None else 0
        self._heap_released += released
        self._heap_base = after
        return released

    def _unwatched_locked(self, buf: Buffer) -> int:
        """At a safe point, no array over watched `buf` is left: drop the arrays' count. Returns 1
        if the block went to its free list."""
        buf.watched = False
        buf.refcount -= 1
        if buf.refcount:  # retained explicitly: an ordinary explicit buffer from now on
            return 0
        if buf.state is FALLBACK:
            self._fallback_bytes -= buf.capacity
            self._gone_locked(buf)
            return 0
        self._live -= buf.capacity
        self._req -= buf.nbytes
        self._push_free_locked(buf)
        return 1

    def _poll_old_locked(self) -> int:
        keep: list[Buffer] = []
        moved = 0
        for buf in self._old:
            if _getrefcount(buf.root) > buf.rc0:
                keep.append(buf)
            else:
                moved += self._unwatched_locked(buf)
        self._old = keep
        return moved

    def trim(self, target_reserved: int = 0) -> int:
        """Return free blocks to the allocator until reserved <= target (or nothing is free).
        Returns the bytes released. Live and pending blocks are never touched."""
        with self._lock:
            return self._trim_locked(target_reserved)

    def _trim_locked(self, target: float) -> int:
        # Least recently freed first: the blocks the recent shapes did not need.
        if self._reserved <= target or self._reserved == self._live + self._pending_bytes:
            return 0
        released = 0
        order = sorted((b for s in self._free.values() for b in s), key=lambda b: b.freed_at)
        for buf in order:
            if self._reserved <= target:
                break
            self._free[buf.capacity].remove(buf)
            self._reserved -= buf.capacity
            released += buf.capacity
            self._gone_locked(buf)
        for c in [c for c, s in self._free.items() if not s]:
            del self._free[c]
        self._caps = sorted(self._free)
        self._trimmed += released
        return released

    # -- stats --------------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            self._update_peaks_locked()
            reserved = self._reserved
            free = reserved - self._live - self._pending_bytes
            largest = next((c for c in reversed(self._caps) if self._free[c]), 0)
            allocs = self._reused + self._fresh + self._fallback
            return {
                "live_bytes": self._live,
                "reserved_bytes": reserved,
                "peak_live_bytes": self._peak_live,
                "peak_reserved_bytes": self._peak_reserved,
                "reuse_rate": self._reused / allocs if allocs else 0.0,
                "fragmentation": 1.0 - largest / free if free else 0.0,
                "allocs": allocs,
                "exact_allocs": self._exact,
                "fallback_allocs": self._fallback,
                "requested_bytes": self._req,
                "peak_requested_bytes": self._peak_req,
                "pending_bytes": self._pending_bytes,
                "free_bytes": free,
                "fallback_bytes": self._fallback_bytes,
                "reused": self._reused,
                "reused_larger": self._larger,
                "fresh_allocs": self._fresh,
                "trimmed_bytes": self._trimmed,
                "watched": len(self._young) + len(self._old),
                "safe_points": self._safe_points,
                "heap_checks": self._heap_checks,
                "heap_trims": self._heap_trims,
                "heap_trim_ns": self._heap_trim_ns,
                "heap_released_bytes": self._heap_released,
            }


_default: Pool | None = None
_default_lock = threading.Lock()


def default_pool() -> Pool:
    """The process-wide host pool (created on first use; no caps, the default headroom, heap trimming
    at HEAP_TRIM_MB)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Pool(heap_trim_mb=HEAP_TRIM_MB)
    return _default


def bench(n: int = 20000, sizes: Sequence[int] = (256, 4096, 65536, 1 << 20), repeat: int = 7,
          batch: int = 64) -> dict:
    """Median ns per buffer over `repeat` rounds of `n` buffers: pooled allocate+release and pooled
    `array` + drop, `batch` buffers per safe point, against a fresh `np.empty` of the same size (a
    float32 vector of size/4). Prints and returns {size: {...}}. A measurement, not an assertion."""
    results = {}
    rounds = max(1, n // batch)
    for size in sizes:
        pool = Pool()
        count = size // 4
        for _ in range(2):  # warm the free lists
            bufs = [pool.allocate(size) for _ in range(batch)]
            for b in bufs:
                b.release()
            pool.safe_point()
            arrs = [pool.array(count, np.float32) for _ in range(batch)]
            del arrs
            pool.safe_point()
        alloc_rel, arr_drop, fresh = [], [], []
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
