"""Tensors of other frameworks as kernel operands, without copies: any object that exposes the CUDA
Array Interface (`__cuda_array_interface__`, versions 2-3: PyTorch, CuPy, Numba, ...) becomes a
`DeviceArray` over the same device memory.

This is the thin adapter the MindSpore-on-GPU path would use: where MindSpore runs on a CUDA device
and its tensors expose their device pointer this way, they can feed the generated kernels directly.
That path is untested here (the GPU machine has no MindSpore, and MindSpore's CPU tensors have no
device pointer); `is_cuda_tensor` is the capability check, and everything else is tested with PyTorch
tensors on the GPU machine (tests/gpu).
"""

from __future__ import annotations

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.codegen.cuda.driver import DeviceArray


def is_cuda_tensor(obj) -> bool:
    """Whether `obj` exposes device memory through the CUDA Array Interface."""
    try:
        iface = obj.__cuda_array_interface__
    except Exception:  # (MindSpore CPU tensors, NumPy arrays: no such attribute)
        return False
    return isinstance(iface, dict) and "data" in iface and "shape" in iface


def as_device_array(obj, dtype: str | None = None) -> DeviceArray:
    """A DeviceArray over `obj`'s memory (the caller keeps `obj` alive while it is used). `dtype`:
    the VM dtype when it is not the storage's own (bf16 held as float32)."""
    iface = obj.__cuda_array_interface__
    npdt = np.dtype(iface["typestr"])
    vm = dtype or dtypes.from_numpy(npdt)
    shape = tuple(iface["shape"])
    st = iface.get("strides")
    strides = None if st is None else tuple(s // npdt.itemsize for s in st)
    ptr = iface["data"][0] or 0
    return DeviceArray(ptr, shape, vm, strides=strides, buf=obj)


def run_kernel(kernel, tensors: list, pool=None) -> list:
    """Run a `CudaKernel` on CUDA-Array-Interface tensors; returns DeviceArrays from the device
    pool (their memory is released with `.release()`)."""
    from ms_dynvm.runtime.device_pool import default_device_pool

    pool = pool or default_device_pool()
    arrs = [as_device_array(t, ty.dtype) for t, (_, ty) in zip(tensors, kernel.params)]
    return kernel.run_device(arrs, pool)


__all__ = ["as_device_array", "is_cuda_tensor", "run_kernel"]
