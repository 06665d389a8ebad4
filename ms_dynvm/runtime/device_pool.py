"""Device memory behind the existing pool (`runtime/memory_pool.Pool` takes an allocator).

`DeviceAllocator` hands out pycuda `mem_alloc` blocks (the `DeviceAllocation` is the owner object,
`int(owner)` the device pointer, 256-byte aligned by the driver); on out-of-memory the pool returns
its free blocks and retries once (as CuPy's pool does). `DevicePool` is a `Pool` over it whose
safe point is a stream synchronisation: a buffer released while a kernel may still read it returns to
its free list only after `safe_point()` has synchronised the stream, so no kernel in flight ever sees
its memory reused. Size classes, best fit, caps and statistics are the host pool's.
"""

from __future__ import annotations

from ms_dynvm.runtime.memory_pool import Allocator, Pool


class DeviceAllocator(Allocator):
    alignment = 256
    host = False

    def __init__(self, drv=None) -> None:
        if drv is None:
            import pycuda.driver as drv
        self._drv = drv
        self.allocated = 0
        self.freed = 0

    def alloc(self, nbytes: int):
        n = max(int(nbytes), 1)
        try:
            owner = self._drv.mem_alloc(n)
        except self._drv.MemoryError:
            # The pool catches this, returns its free blocks to us and asks once more.
            raise MemoryError(f"device: cannot allocate {n} bytes") from None
        self.allocated += 1
        return int(owner), owner

    def free(self, owner: object) -> None:
        self.freed += 1
        owner.free()


class DevicePool(Pool):
    """A `Pool` of device memory; `safe_point()` synchronises `stream` first."""

    def __init__(self, stream=None, drv=None, **kwargs) -> None:
        alloc = DeviceAllocator(drv)
        super().__init__(alloc, **kwargs)
        self.stream = stream

    def safe_point(self) -> int:
        if self.stream is not None:
            self.stream.synchronize()
        return super().safe_point()


_DEFAULT: list = []


def default_device_pool() -> DevicePool:
    """The process's device pool, on the ms_dynvm stream (needs pycuda and a device)."""
    if not _DEFAULT:
        from ms_dynvm.codegen.cuda import driver

        _DEFAULT.append(DevicePool(stream=driver.stream(), drv=driver.drv(), headroom=None))
    return _DEFAULT[0]


__all__ = ["DeviceAllocator", "DevicePool", "default_device_pool"]
