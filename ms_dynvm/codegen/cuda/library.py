"""Library routines of the GPU executor: matmul through cuBLAS, gather/index_select and
unsorted_segment_sum as kernels from `cuda_templates/index_ops.cu`.

cuBLAS binding: a small ctypes binding of the cuBLAS runtime library (`cublasGemmStridedBatchedEx`
only), located with `cuda.pathfinder` (shipped with cuda-python, which the backend needs for NVRTC
anyway) or the system loader. Why not another binding: pycuda has none, cuda-python's `cuda.bindings`
has no cuBLAS module, and CuPy/nvmath would add a large dependency for one call; the C API of one
function is stable and takes the stream handle pycuda gives. float32 runs with CUBLAS_COMPUTE_32F
(no TF32), float16 with float16 storage and float32 accumulation (the reference computes float16
matmuls in float32 and rounds once), float64 in float64.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from string import Template

from ms_dynvm.codegen.cuda import driver, nvrtc
from ms_dynvm.codegen.cuda.render import template

_CUDA_R = {"f32": 0, "f64": 1, "f16": 2}
_COMPUTE = {"f32": 68, "f64": 70, "f16": 68}  # CUBLAS_COMPUTE_32F / _64F
_NAMES = {"f32": "float", "f64": "double", "i32": "int32_t", "i64": "int64_t"}
_INDEX_DTYPES = ("f32", "f64", "i32")  # (atomicAdd exists for these)


class CublasUnavailable(RuntimeError):
    pass


class Cublas:
    def __init__(self) -> None:
        path = None
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            path = load_nvidia_dynamic_lib("cublas").abs_path
        except Exception:
            path = ctypes.util.find_library("cublas")
        if not path:
            raise CublasUnavailable("libcublas not found")
        self.lib = ctypes.CDLL(path)
        self.path = path
        self.handle = ctypes.c_void_p()
        st = self.lib.cublasCreate_v2(ctypes.byref(self.handle))
        if st != 0:
            raise CublasUnavailable(f"cublasCreate_v2: status {st}")
        self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(driver.stream().handle))
        f = self.lib.cublasGemmStridedBatchedEx
        f.restype = ctypes.c_int
        i, ll, p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        f.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]
        self._gemm = f
        self._one = {"f32": ctypes.c_float(1.0), "f64": ctypes.c_double(1.0)}
        self._zero = {"f32": ctypes.c_float(0.0), "f64": ctypes.c_double(0.0)}

    def matmul(self, dtype: str, a_ptr: int, b_ptr: int, c_ptr: int, m: int, n: int, k: int,
               ta: bool, tb: bool, batch: int, stride_a: int, stride_b: int) -> None:
        """Row-major C[batch, m, n] = op(A) @ op(B) (op = transpose when ta/tb; A stored [k, m] when
        ta else [m, k]; B stored [n, k] when tb else [k, n]), as cuBLAS's column-major
        C^T = op(B)^T op(A)^T."""
        cd = "f64" if dtype == "f64" else "f32"
        T = _CUDA_R[dtype]
        lda_b = k if tb else n  # B as the first cuBLAS operand
        lda_a = m if ta else k
        st = self._gemm(self.handle, 1 if tb else 0, 1 if ta else 0, n, m, k,
                        ctypes.byref(self._one[cd]), b_ptr, T, lda_b, stride_b,
                        a_ptr, T, lda_a, stride_a, ctypes.byref(self._zero[cd]),
                        c_ptr, T, n, m * n, batch, _COMPUTE[dtype], -1)
        if st != 0:
            raise RuntimeError(f"cublasGemmStridedBatchedEx: status {st}")


_STATE: dict = {}


def cublas() -> Cublas | None:
    """The process's cuBLAS binding, or None (why in `cublas_reason()`)."""
    if "cublas" not in _STATE:
        try:
            _STATE["cublas"] = Cublas()
            _STATE["why"] = ""
        except (CublasUnavailable, OSError, AttributeError) as e:
            _STATE["cublas"] = None
            _STATE["why"] = str(e)
    return _STATE["cublas"]


def cublas_reason() -> str:
    cublas()
    return _STATE.get("why", "")


def index_source(dtype: str, idx_dtype: str) -> str:
    """The index kernels for element type `dtype` and index type `idx_dtype`, with the prelude."""
    body = Template(template("index_ops.cu")).substitute(T=_NAMES[dtype], TN=dtype, I=_NAMES[idx_dtype],
                                                          IN=idx_dtype)
    return template("dvm_common.cuh") + "\n" + body


def index_supported(dtype: str, idx_dtype: str) -> bool:
    return dtype in _INDEX_DTYPES and idx_dtype in ("i32", "i64")


def index_module(dtype: str, idx_dtype: str, cache=None):
    """The loaded module of `index_source` (through the kernel cache, as fused kernels)."""
    from ms_dynvm import __version__
    from ms_dynvm.runtime.cache import default_cache, make_key

    key_mem = ("index", dtype, idx_dtype)
    mods = _STATE.setdefault("index", {})
    if key_mem in mods:
        return mods[key_mem]
    src = index_source(dtype, idx_dtype)
    arch = driver.arch()
    import hashlib

    key = make_key({"ms_dynvm": __version__, "backend": "cuda", "compiler": f"nvrtc {nvrtc.version()}",
                    "arch": f"sm_{arch}", "library": "index_ops",
                    "source_sha256": hashlib.sha256(src.encode()).hexdigest()})
    cache = default_cache() if cache is None else cache

    def load(payload):
        return driver.drv().module_from_buffer(nvrtc.split_artifact(payload)[1])

    mod = cache.get_or_build(key, lambda: nvrtc.compile_source(src, arch, []), load, device=f"cuda:sm_{arch}")
    take = mod.get_function(f"dvm_take_{dtype}_{idx_dtype}")
    take.prepare("PPPPqqqq")
    seg = mod.get_function(f"dvm_segsum_{dtype}_{idx_dtype}")
    seg.prepare("PPPqqq")
    mods[key_mem] = (take, seg)
    return mods[key_mem]


def grid_for(total: int, threads: int = 256) -> tuple:
    return (max(1, min((total + threads - 1) // threads, driver.sm_count() * 16)), 1)


__all__ = ["Cublas", "cublas", "cublas_reason", "grid_for", "index_module", "index_source", "index_supported"]
