"""Builtins of replayed programs that NumPy does slowly: small C loops, built with the project's GCC
driver (`codegen.gcc`) and kept in the kernel cache like generated kernels.

- `batched_sgemm`: a loop of oneDNN `dnnl_sgemm` calls over a batch (the function pointer is an
  argument: `jit/gemm.py` found the library), one ctypes call for a batched matmul instead of one
  per batch (the same GEMM per batch: the same bits);
- `segment_sum(x, ids, n)`: unsorted_segment_sum of float32 rows; `np.add.at`, the interpreter's
  way, costs about 50 ns per element. Rows whose id lies outside [0, n) are dropped (MindSpore's
  semantics, as the interpreter's); the sums run in row order.

Without a compiler `available()` is False and the callers keep the interpreter's implementation.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ms_dynvm.jit.native import NativeLibrary

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define SEGSUM(NAME, IT) \
void NAME(const float *x, const IT *ids, int64_t rows, int64_t cols, int64_t n, float *out) { \
    memset(out, 0, sizeof(float) * (size_t)(n * cols)); \
    for (int64_t r = 0; r < rows; r++) { \
        int64_t s = (int64_t)ids[r]; \
        if (s < 0 || s >= n) continue; \
        float *o = out + s * cols; const float *xi = x + r * cols; \
        for (int64_t c = 0; c < cols; c++) o[c] += xi[c]; \
    } \
}
SEGSUM(dvm_segsum_i32, int32_t)
SEGSUM(dvm_segsum_i64, int64_t)
typedef int (*dvm_sgemm_t)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
void dvm_batched_sgemm(void *fp, char ta, char tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                       const float *a, int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb,
                       float *c, int64_t ldc, int64_t sc) {
    dvm_sgemm_t f = (dvm_sgemm_t)fp;
    for (int64_t i = 0; i < batch; i++)
        f(ta, tb, m, n, k, 1.0f, a + i * sa, lda, b + i * sb, ldb, 0.0f, c + i * sc, ldc);
}
"""

def _setup(lib) -> None:
    i64, vp, ch = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char
    for name in ("dvm_segsum_i32", "dvm_segsum_i64"):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [vp, vp, i64, i64, i64, vp]
    fn = lib.dvm_batched_sgemm
    fn.restype = None
    fn.argtypes = [vp, ch, ch, i64, i64, i64, i64, vp, i64, i64, vp, i64, i64, vp, i64, i64]


_LIB = NativeLibrary("builtins", _SOURCE, _setup)
_load = _LIB.get


def available() -> bool:
    return _load() is not None


def loaded() -> bool:
    """Whether the library has been built or found already (no compile here)."""
    return _LIB.tried


def segment_sum(x: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    lib = _load()
    x = np.ascontiguousarray(x, np.float32)
    ids = np.ascontiguousarray(ids)
    rows = ids.shape[0]
    cols = int(np.prod(x.shape[1:], dtype=np.int64))
    out = np.empty((n,) + x.shape[1:], np.float32)
    fn = lib.dvm_segsum_i32 if ids.dtype == np.int32 else lib.dvm_segsum_i64
    if ids.dtype not in (np.int32, np.int64):
        ids = ids.astype(np.int64)
        fn = lib.dvm_segsum_i64
    fn(x.ctypes.data, ids.ctypes.data, rows, cols, n, out.ctypes.data)
    return out


def batched_sgemm():
    """The C batch loop over `dnnl_sgemm` (see the module docstring), or None without a compiler."""
    lib = _load()
    return None if lib is None else lib.dvm_batched_sgemm
