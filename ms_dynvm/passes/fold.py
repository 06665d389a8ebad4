"""Constant folding of splat constants: an instruction whose every operand is a known splat (a tensor
all of whose elements are one scalar) becomes a `fill` of the computed scalar.

Why: a Function has no constant table, so the only compile-time values are immediates and the
results of `fill` (zeros/ones/full) and `full_like` (zeros_like/ones_like): an eager script builds
masks and scale factors out of them (`ones * 0.5`, `zeros_like(x) - 1e9`, `cast(full(..., 1), f16)`).
Folding those chains leaves one `fill` per value; `dce` then removes the producers.

What folds (an instruction `ins` with result type T):
- every register operand is a splat (`fill`, `full_like`, or a `fill` made by this pass), immediates
  count as splats, the op is pure and elementwise (opcodes.ELEMENTWISE, `full_like` included), T's
  shape is static (`fill` has a static `shape` attribute) and T's dtype is not complex (immediates
  are real) -> `fill(shape=T.shape, dtype=T.dtype, value=op(splats))`;
  # op(splat(a), splat(b)) -> splat(op(a, b)): an elementwise op computes each element from the
  # elements at the same (broadcast) index, and every index holds the same values.
- views of a splat (reshape, transpose, broadcast_to, expand_dims, squeeze, slice, select,
  contiguous) with a static result shape -> `fill` of the same value;
  # view(splat(a)) -> splat(a): a view only moves elements.
The scalar is computed by the reference interpreter (`IMPLS`, the single source of semantics) on
arrays of shape (1,)*rank of each operand, so rank-dependent promotion (0-d tensors act like
scalars in mul/div) is the same as at full size; the result is then cast to T's dtype exactly as
`run_instr` does. Reductions are not folded: sum/mean of a splat round differently from n*a.
"""

from __future__ import annotations

import math

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import is_static
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import clone, copy_instr, is_pure, make_instr, prune_types
# _to_declared is the cast run_instr applies to every result: folding must round the same way.
from ms_dynvm.runtime.interpreter import IMPLS, InterpreterError, _to_declared

_SPLAT_VIEWS = opcodes.VIEW | {"contiguous"}


def _scalar(arr: np.ndarray, dtype: str):
    """The Python scalar that `fill(dtype=dtype, value=...)` turns back into exactly `arr`'s value."""
    v = arr.reshape(-1)[0]
    if dtype == "bool":
        return bool(v)
    if dtypes.is_int(dtype):
        return int(v)
    return float(v)  # f16/bf16/f32 values are exact in a Python float


def _evaluate(ins: Instr, args: list, types: dict):
    """op(args) on one-element arrays; None when the interpreter rejects it."""
    attrs = opcodes.full_attrs(ins.op, ins.attrs)
    try:
        res = IMPLS[ins.op](args, attrs)
    except (InterpreterError, ValueError, TypeError, ArithmeticError):
        return None
    return _to_declared(res, types[ins.outs[0]])



def fold(fn: Function) -> Function:
    """`fn` with splat-constant instructions replaced by `fill` (a new Function)."""
    splat: dict[int, tuple] = {}  # reg -> (python scalar, dtype)
    body = []
    for ins in fn.body:
        if ins.op in ("fill", "full_like") and len(ins.outs) == 1:
            t = fn.types[ins.outs[0]]
            if t.dtype not in dtypes.COMPLEX and isinstance(ins.attrs["value"], (bool, int, float)):
                # The stored value is what the interpreter casts the attribute to.
                arr = _to_declared(np.asarray(ins.attrs["value"]), t)
                splat[ins.outs[0]] = (_scalar(arr, t.dtype), t.dtype)
            body.append(copy_instr(ins))
            continue
        new = _fold_one(ins, fn.types, splat)
        body.append(new if new is not None else copy_instr(ins))
        if new is not None:
            out = ins.outs[0]
            splat[out] = (new.attrs["value"], fn.types[out].dtype)
    return prune_types(clone(fn, body=body))


def _fold_one(ins, types: dict, splat: dict):
    if len(ins.outs) != 1 or not is_pure(ins.op):
        return None
    out_t = types[ins.outs[0]]
    if not is_static(out_t.shape) or out_t.dtype in dtypes.COMPLEX:
        return None
    regs = ins.regs()
    if not regs or any(int(r) not in splat for r in regs):
        return None
    if ins.op in _SPLAT_VIEWS:
        value = splat[int(regs[0])][0]  # view(splat(a)) -> splat(a)
    elif ins.op in opcodes.ELEMENTWISE:
        args = []
        for a in ins.args:
            if isinstance(a, Reg):
                v, dt = splat[int(a)]
                rank = types[int(a)].rank
                args.append(np.full((1,) * rank, v, dtype=dtypes.to_numpy(dt)))
            else:
                args.append(a)
        res = _evaluate(ins, args, types)  # op(splat(a), ...) -> splat(op(a, ...))
        if res is None:
            return None
        value = _scalar(res, out_t.dtype)
    else:
        return None
    if isinstance(value, float) and math.isnan(value):
        value = math.nan  # one canonical NaN for the printer
    attrs = {"shape": tuple(out_t.shape), "dtype": out_t.dtype, "value": value}
    return make_instr("fill", (), attrs, ins.outs)
