"""Helpers shared by the passes: copying a Function, renaming registers, purity, splat constants.

Every pass is a pure function `Function -> Function`: it starts from `clone(fn)` (fresh lists, dicts
and `Instr` objects, so nothing the caller holds is mutated) and builds a new body. Types are
immutable (`TensorType` is frozen), so they are shared, not copied.
"""

from __future__ import annotations

import math

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Instr, canonical_attrs
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.ir.function import Function

# Ops whose result is not a function of their operands: an RNG (dropout) or an op the VM does not
# model (`call`, run eagerly by the frontend, may have side effects). They are never removed, merged
# or evaluated at compile time.
IMPURE = opcodes.RANDOM | opcodes.OPAQUE


def is_pure(op: str) -> bool:
    return op not in IMPURE


def copy_instr(ins: Instr, args=None, attrs=None) -> Instr:
    """A fresh Instr (own attrs dict) with optionally replaced operands/attributes."""
    return Instr(ins.op, tuple(ins.args if args is None else args), dict(ins.attrs if attrs is None else attrs),
                 tuple(ins.outs))


def clone(fn: Function, body=None, outputs=None, name=None) -> Function:
    """A copy of `fn` that shares no mutable container with it."""
    return Function(
        fn.name if name is None else name,
        list(fn.params),
        [copy_instr(i) for i in (fn.body if body is None else body)],
        list(fn.outputs if outputs is None else outputs),
        dict(fn.types),
    )


def resolve(subst: dict[int, int], r: int) -> int:
    """Follow a chain of register replacements to its end."""
    while r in subst:
        r = subst[r]
    return r


def rename_args(args, subst: dict[int, int]) -> tuple:
    """Operands with replaced registers (immediates untouched)."""
    return tuple(Reg(resolve(subst, int(a))) if isinstance(a, Reg) else a for a in args)


def prune_types(fn: Function) -> Function:
    """Drop type entries of registers that no longer appear (params, results, operands, outputs)."""
    used = set(fn.params) | set(fn.outputs)
    for ins in fn.body:
        used.update(ins.outs)
        used.update(int(r) for r in ins.regs())
    fn.types = {r: t for r, t in fn.types.items() if r in used}
    return fn


def make_instr(op: str, args, attrs: dict, outs) -> Instr:
    """A new instruction with canonical attributes (what the verifier expects)."""
    return Instr(op, tuple(args), canonical_attrs(op, attrs), tuple(outs))


def same_type(a, b) -> bool:
    """Equal dtype and shape (the layout class is a property of the run-time buffer, not the value)."""
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)


def splat_value(producers: dict[int, Instr], operand):
    """The scalar every element of `operand` equals, when that is known at compile time: an
    immediate, or a register made by `fill` / `full_like` (whose value is an attribute).
    Returns (True, value) or (False, None)."""
    if not isinstance(operand, Reg):
        return (operand is not None, operand)
    ins = producers.get(int(operand))
    if ins is not None and ins.op in ("fill", "full_like"):
        return True, ins.attrs["value"]
    return False, None


def is_number(v, target) -> bool:
    """`v` (a Python scalar) equals `target`, bools counting as 0/1 (as NumPy casts them)."""
    return isinstance(v, (bool, int, float)) and not (isinstance(v, float) and math.isnan(v)) and v == target


def freeze(v):
    """A hashable key of an immediate or attribute value that tells 1, 1.0, True and -0.0 apart
    (Python's == does not) and makes NaN equal to itself."""
    if isinstance(v, Reg):
        return ("r", int(v))
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, (tuple, list)):
        return ("t", tuple(freeze(x) for x in v))
    if isinstance(v, dict):
        return ("d", tuple((k, freeze(x)) for k, x in v.items()))
    return ("o", type(v).__name__, repr(v))
