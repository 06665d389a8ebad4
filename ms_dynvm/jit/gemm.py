"""Single-precision GEMM for replayed programs: oneDNN's `dnnl_sgemm` where it can be found, NumPy
otherwise.

Chosen by measurement (`profiling/bench/bench_gemm.py --reps 30 --rounds 5`, Intel Xeon, 2 cores,
2026-12-07 18:20, load average 1.0): NumPy 1.26's OpenBLAS took 0.81 ms for [8,784]x[512,784]^T and 2.1 ms for
[64,784]x[512,784]^T, oneDNN's `dnnl_sgemm` 0.19 ms and 0.49 ms (one row: 0.12 against 0.063 ms);
MindSpore's own MatMul call, dispatch included, 0.21-4.1 ms. The library is found next to the installed `mindspore`
package without importing it (`importlib.util.find_spec`), so this module, like the rest of the core,
imports without MindSpore; where it is missing every product goes to `np.matmul`.

`dnnl_sgemm` is row-major: C[M,N] = op(A) @ op(B) with leading dimensions in elements.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from weakref import ref as _weakref

import numpy as np

F32 = np.dtype(np.float32)


def _load():
    if os.environ.get("DYNVM_GEMM", "") == "numpy":
        return None
    try:
        spec = importlib.util.find_spec("mindspore")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        for path in sorted(glob.glob(os.path.join(d, "lib", "libdnnl.so*"))):
            try:
                lib = ctypes.CDLL(path)
                fn = lib.dnnl_sgemm
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.c_char, ctypes.c_char, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = ctypes.c_int
            return fn
    return None


_SGEMM = _load()
_SGEMM_PTR = ctypes.cast(_SGEMM, ctypes.c_void_p).value if _SGEMM is not None else None
BACKEND = "onednn" if _SGEMM is not None else "numpy"


def _operand(x: np.ndarray, trans: bool):
    """(trans flag, leading dimension, array) for a 2-D float32 operand: a transposed C-contiguous
    array is passed as the original with the flag flipped; other layouts are copied."""
    if x.flags.c_contiguous:
        return (b"T" if trans else b"N"), x.shape[1], x
    if x.flags.f_contiguous:  # x = y.T for a C-contiguous y
        return (b"N" if trans else b"T"), x.shape[0], x
    x = np.ascontiguousarray(x)
    return (b"T" if trans else b"N"), x.shape[1], x


def matmul(a: np.ndarray, b: np.ndarray, ta: bool = False, tb: bool = False, out=None) -> np.ndarray:
    """op(a) @ op(b) for float32 arrays (op: transpose of the last two axes where asked); leading
    (batch) axes broadcast as in np.matmul. `out`: a C-contiguous float32 array of the result's
    shape to write into (a region plan's buffer; used where oneDNN runs the product), or None."""
    if _SGEMM is None or a.dtype != F32 or b.dtype != F32 or a.ndim < 2 or b.ndim < 2:
        return np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    if a.ndim > 2 or b.ndim > 2:
        return _batched(a, b, ta, tb, out)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k != k2:
        raise ValueError(f"matmul: inner dimensions {k} and {k2} differ")
    c = out if out is not None and out.shape == (m, n) and out.dtype == F32 and out.flags.c_contiguous \
        else np.empty((m, n), F32)
    if m == 0 or n == 0:
        return c
    if k == 0:
        c.fill(0.0)
        return c
    fa, lda, a = _operand(a, ta)
    fb, ldb, b = _operand(b, tb)
    _SGEMM(fa, fb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0, c.ctypes.data, n)
    return c


def prepare2d(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool):
    """The `dnnl_sgemm` arguments other than the pointers for op(a) @ op(b) on 2-D float32 operands
    of these shapes and strides, or None where `matmul` must decide (no oneDNN, other dtypes or
    ranks, a layout it copies, an empty product). A region plan computes this once per operand
    layout (`run2d`), since its shapes are static."""
    if _SGEMM is None or a.dtype != F32 or b.dtype != F32 or a.ndim != 2 or b.ndim != 2:
        return None
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k != k2 or not (m and n and k):
        return None
    if not ((a.flags.c_contiguous or a.flags.f_contiguous) and (b.flags.c_contiguous or b.flags.f_contiguous)):
        return None
    fa, lda, _ = _operand(a, ta)
    fb, ldb, _ = _operand(b, tb)
    return fa, fb, m, n, k, lda, ldb


def run2d(p, a: np.ndarray, b: np.ndarray, c: np.ndarray, ptrs: list | None = None) -> np.ndarray:
    """`matmul` with the arguments `prepare2d` gave for these operands' layout, into C-contiguous `c`.
    `ptrs`: a list of six (`new_ptrs()`) the caller keeps from call to call, where the data pointers
    of a, b and c are remembered per array object (by weak reference: an array's data pointer is fixed
    for its life, and a live weak reference's referent is that very object), so a step whose operands
    are the same arrays each run (a parameter's view, a kept buffer) skips NumPy's `.ctypes.data`
    (~2.5 us an array)."""
    fa, fb, m, n, k, lda, ldb = p
    if ptrs is None:
        _SGEMM(fa, fb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0, c.ctypes.data, n)
        return c
    r = ptrs[0]
    if r is None or r() is not a:
        ptrs[0], ptrs[1] = _weakref(a), a.ctypes.data
    r = ptrs[2]
    if r is None or r() is not b:
        ptrs[2], ptrs[3] = _weakref(b), b.ctypes.data
    r = ptrs[4]
    if r is None or r() is not c:
        ptrs[4], ptrs[5] = _weakref(c), c.ctypes.data
    _SGEMM(fa, fb, m, n, k, 1.0, ptrs[1], lda, ptrs[3], ldb, 0.0, ptrs[5], n)
    return c


def new_ptrs() -> list:
    """An empty pointer cache for `run2d`."""
    return [None, 0, None, 0, None, 0]


def _layout3(x: np.ndarray, trans: bool):
    """(trans flag, leading dimension, batch stride, array) of a 3-D float32 operand whose 2-D
    slices are all row- or all column-major with one batch stride (in elements); else a copy."""
    st = x.strides
    if st[2] == 4 and st[1] >= 4 * max(x.shape[2], 1) and st[1] % 4 == 0 and st[0] % 4 == 0:
        return (b"T" if trans else b"N"), st[1] // 4, st[0] // 4, x
    if st[1] == 4 and st[2] >= 4 * max(x.shape[1], 1) and st[2] % 4 == 0 and st[0] % 4 == 0:
        return (b"N" if trans else b"T"), st[2] // 4, st[0] // 4, x
    x = np.ascontiguousarray(x)
    return (b"T" if trans else b"N"), x.shape[2], x.shape[1] * x.shape[2], x


def _batched(a: np.ndarray, b: np.ndarray, ta: bool, tb: bool, out=None) -> np.ndarray:
    """A batched product as one GEMM where `b` has no batch axes (x @ W), else one GEMM per batch
    (run by one C loop, `builtins.batched_sgemm`, where a compiler is found)."""
    if b.ndim == 2 and not ta and a.flags.c_contiguous:
        m = a.shape[-2]
        n = b.shape[0] if tb else b.shape[1]
        o = out.reshape(-1, n) if out is not None and out.shape == a.shape[:-2] + (m, n) and \
            out.dtype == F32 and out.flags.c_contiguous else None
        c = matmul(a.reshape(-1, a.shape[-1]), b, False, tb, o)
        return out if o is not None and c is o else c.reshape(a.shape[:-2] + (m, c.shape[-1]))
    if a.shape[:-2] == b.shape[:-2]:  # (no broadcasting: NumPy's broadcast helpers cost ~20 us)
        lead = a.shape[:-2]
        nb = 1
        for d in lead:
            nb *= d
        a3 = a if a.ndim == 3 else a.reshape((nb,) + a.shape[-2:])
        b3 = b if b.ndim == 3 else b.reshape((nb,) + b.shape[-2:])
    else:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        nb = int(np.prod(lead, dtype=np.int64))
        a3 = np.broadcast_to(a, lead + a.shape[-2:]).reshape((nb,) + a.shape[-2:])
        b3 = np.broadcast_to(b, lead + b.shape[-2:]).reshape((nb,) + b.shape[-2:])
    m = a.shape[-1] if ta else a.shape[-2]
    n = b.shape[-2] if tb else b.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    if k != (b.shape[-1] if tb else b.shape[-2]):
        raise ValueError(f"matmul: inner dimensions {k} and {b.shape[-1] if tb else b.shape[-2]} differ")
    if out is not None and out.shape == lead + (m, n) and out.dtype == F32 and out.flags.c_contiguous:
        c = out.reshape((nb, m, n))
    else:
        c, out = np.empty((nb, m, n), F32), None
    loop = _batch_loop()
    if loop is not None and m and n and k and a3.shape[0]:
        fa, lda, sa, a3 = _layout3(a3, ta)
        fb, ldb, sb, b3 = _layout3(b3, tb)
        loop(_SGEMM_PTR, fa, fb, a3.shape[0], m, n, k, a3.ctypes.data, lda, sa, b3.ctypes.data, ldb, sb,
             c.ctypes.data, n, m * n)
    else:
        for i in range(a3.shape[0]):
            c[i] = matmul(a3[i], b3[i], ta, tb)
    return out if out is not None else c.reshape(lead + (m, n))


_LOOP: list = []
_LOADING: list = []


def _batch_loop():
    """The C batch loop once it is built, else None (the Python loop). It is built on the background
    compile thread (`jit.compile.compile_pool`): a first GCC run in the caller would cost a cold
    process ~0.3 s at its first batched product."""
    if _LOOP:
        return _LOOP[0]
    if os.environ.get("DYNVM_GEMM_BATCH", "c") != "c":
        _LOOP.append(None)
        return None
    from ms_dynvm.jit import builtins

    if builtins.loaded():
        _LOOP.append(builtins.batched_sgemm())
        return _LOOP[0]
    if not _LOADING:
        from ms_dynvm.jit.compile import compile_pool

        _LOADING.append(compile_pool().submit(builtins.available))
    elif _LOADING[0].done():
        _LOOP.append(builtins.batched_sgemm())
        return _LOOP[0]
    return None
