"""Compiled elementwise kernels for replayed programs, one per (op, attributes, dtypes), any size.

NumPy has no erf, gelu or mish: the reference interpreter computes them element by element in
Python where no ufunc exists (erf: about 130 ms for 130,000 elements). A region plan runs such an
op through a kernel of the C backend instead (`codegen.kernel.compile_group`, the same code and
numerics tier 1 fuses with: tested against the interpreter): a one-instruction IR function over
operands flattened to one symbolic dim `f32[N]`, so one kernel serves every shape whose tensor
operands all have the shape of the result. Kernels are cached in memory and on disk (the kernel
cache); a compile failure (no gcc, an op the backend does not render) is remembered and the op stays
with the interpreter.
"""

from __future__ import annotations

import threading

import numpy as np

from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType

# Elementwise ops whose interpreter implementation is slow (no NumPy ufunc).
SLOW_ELEMENTWISE = frozenset(("erf", "erfc", "gelu", "gelu_grad", "mish", "softplus", "silu", "silu_grad",
                              "sigmoid", "sigmoid_grad", "tanh_grad", "elu", "elu_grad", "log1p", "expm1",
                              "hardswish", "hardsigmoid"))
# Ops MindSpore computes with the C library (float32 erf is glibc's erff): their kernels are
# compiled with strict_ieee (scalar libm), bit-equal to eager. A vectorised erf 1 ulp off would
# show in the erf-form GELU, x * (1 + erf(x / sqrt 2)) / 2, where 1 + erf cancels for x < -5.
LIBM = frozenset(("erf", "erfc"))
_N = Sym.of("N")
_kernels: dict = {}
_lock = threading.Lock()
compiles = 0  # kernels built (or loaded from the disk cache) in this process


def _attr_key(attrs: dict):
    return tuple(sorted((k, repr(v)) for k, v in attrs.items()))


def flat_kernel(op: str, attrs: dict, in_dtypes: tuple, out_dtype: str, imms: tuple = ()):
    """A callable `f(arrays) -> array` computing `op` on equally shaped operands, or None.
    `imms`: (position, value) of immediate operands, baked into the kernel."""
    key = (op, _attr_key(attrs), in_dtypes, out_dtype, imms)
    k = _kernels.get(key, False)
    if k is not False:
        return k
    with _lock:
        k = _kernels.get(key, False)
        if k is False:
            k = _kernels[key] = _build(op, attrs, in_dtypes, out_dtype, imms)
    return k


def _build(op, attrs, in_dtypes, out_dtype, imms):
    global compiles
    from ms_dynvm.codegen.kernel import compile_group
    from ms_dynvm.ir.function import Function

    n_in = len(in_dtypes)
    args, it = [], iter(range(n_in))
    imm = dict(imms)
    for pos in range(n_in + len(imms)):
        args.append(imm[pos] if pos in imm else Reg(next(it)))
    types = {i: TensorType(dt, (_N,)) for i, dt in enumerate(in_dtypes)}
    types[n_in] = TensorType(out_dtype, (_N,))
    fn = Function("flat", list(range(n_in)), [Instr(op, tuple(args), dict(attrs), (n_in,))], [n_in], types)
    try:
        kern = compile_group(fn, strict_ieee=op in LIBM)
    except Exception:  # noqa: BLE001 - any failure: the op stays with the interpreter
        return None
    compiles += 1

    def run(arrays):
        shape = arrays[0].shape
        flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        n = flat[0].shape[0]
        if n < 2:  # (a symbol never stands for 0 or 1: pad to two elements)
            flat = [np.concatenate([f, np.zeros(2 - n, f.dtype)]) for f in flat]
            return kern(flat)[0][:n].reshape(shape)
        return kern(flat)[0].reshape(shape)

    return run
