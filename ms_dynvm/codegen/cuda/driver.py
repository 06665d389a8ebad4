"""The CUDA device through pycuda: availability (one warning when it is missing), the context
(`pycuda.autoprimaryctx`: the device's primary context, shared with PyTorch/CuPy in the same
process), the ms_dynvm stream, device properties, and `DeviceArray` (a typed view of device memory
from the device pool, `runtime/device_pool.py`).

Nothing here raises for a missing GPU: `available()` is False, with `unavailable_reason()`, and the
callers fall back (the executor runs the program on the host with the NumPy interpreter).
"""

from __future__ import annotations

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.warn import warn_once

_STATE: dict = {}


def _init():
    if "drv" in _STATE:
        return _STATE["drv"]
    try:
        import pycuda.autoprimaryctx  # noqa: F401  (makes the primary context current)
        import pycuda.driver as drv

        dev = drv.Context.get_device()
        _STATE.update(
            drv=drv,
            device=dev,
            name=dev.name(),
            cc=dev.compute_capability(),
            sms=dev.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT),
            stream=drv.Stream(),
            why="",
        )
    except Exception as e:  # ImportError (no pycuda), or no device/driver
        _STATE.update(drv=None, why=f"{type(e).__name__}: {e}".splitlines()[0])
    return _STATE["drv"]


def available() -> bool:
    return _init() is not None


def unavailable_reason() -> str:
    _init()
    return _STATE.get("why", "")


def require(what: str = "the CUDA backend") -> bool:
    """True if the GPU is usable; otherwise one warning per process and False."""
    if available():
        return True
    warn_once("cuda-unavailable", f"ms_dynvm: {what} needs pycuda and a CUDA device ({unavailable_reason()}); "
              "running on the host instead", stacklevel=3)
    return False


def drv():
    return _init()


def stream():
    _init()
    return _STATE["stream"]


def arch() -> int:
    """Compute capability as an int (90 for sm_90)."""
    _init()
    major, minor = _STATE["cc"]
    return 10 * major + minor


def device_name() -> str:
    _init()
    return _STATE["name"]


def sm_count() -> int:
    _init()
    return _STATE["sms"]


class DeviceArray:
    """`shape`/`strides` (elements)/`dtype` (VM dtype) over device memory at `ptr`, kept alive by
    `buf` (a pool Buffer, released with `release()`, or any owner object)."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "buf")

    def __init__(self, ptr: int, shape, dtype: str, strides=None, buf=None):
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        if strides is None:
            acc, st = 1, []
            for d in reversed(self.shape):
                st.append(acc)
                acc *= d
            strides = tuple(reversed(st))
        self.strides = tuple(int(s) for s in strides)
        self.buf = buf

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * storage_itemsize(self.dtype)

    def is_contiguous(self) -> bool:
        acc = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != acc:
                return False
            acc *= d
        return True

    def get(self, stream=None) -> np.ndarray:
        """A host copy (synchronises the stream). float16 comes back as float16, bf16 as float32."""
        if not self.is_contiguous():
            raise ValueError("get() of a strided device view: make it contiguous on the device first")
        out = np.empty(self.shape, storage_numpy(self.dtype))
        if out.nbytes:
            s = stream or _STATE["stream"]
            _STATE["drv"].memcpy_dtoh_async(out, self.ptr, s)
            s.synchronize()
        return out

    def release(self) -> None:
        if self.buf is not None and hasattr(self.buf, "release"):
            self.buf.release()
        self.buf = None

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}{list(self.shape)}, strides={self.strides}, ptr=0x{self.ptr:x})"


def storage_numpy(dtype: str) -> np.dtype:
    """The NumPy dtype of the device storage of VM dtype `dtype` (bf16 is held in float32)."""
    return np.dtype(np.float32) if dtype == "bf16" else dtypes.to_numpy(dtype)


def storage_itemsize(dtype: str) -> int:
    return storage_numpy(dtype).itemsize


__all__ = ["DeviceArray", "arch", "available", "device_name", "drv", "require", "sm_count", "storage_itemsize",
           "storage_numpy", "stream", "unavailable_reason"]
