"""Common-subexpression elimination: a pure instruction equal to an earlier one is removed and its
results are replaced by the earlier results.

Why: eager code recomputes freely (`x.mean()` twice, the same mask built in two layers, the forward
value recomputed by a backward formula); in a fused kernel each recomputation costs memory traffic.

Two instructions are equal when they have the same op, the same operands after earlier replacements
(immediates compared by type and bits: `1`, `1.0`, `True` and `-0.0` differ from each other, NaN
equals NaN), the same canonical attributes and the same result types. Impure instructions (RANDOM,
`call`) are never merged: two dropouts with equal operands draw different masks.

Outputs: an output register whose instruction was removed is rewritten to the surviving register,
so `outputs` may list the same register more than once (`return %3, %3`). The executor hands the
same tensor back for both positions; that is value-correct because tensors are immutable in the IR.
"""

from __future__ import annotations

from ms_dynvm.bytecode.program import canonical_attrs
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import clone, copy_instr, freeze, is_pure, prune_types, rename_args, resolve


def _key(ins, args, types: dict):
    attrs = canonical_attrs(ins.op, ins.attrs) if ins.op != "call" else ins.attrs
    out_types = tuple((types[r].dtype, tuple(types[r].shape), types[r].layout) for r in ins.outs)
    return (ins.op, freeze(args), freeze(attrs), out_types)


def cse(fn: Function) -> Function:
    """`fn` with duplicate pure instructions removed (a new Function; `fn` is not modified)."""
    subst: dict[int, int] = {}
    seen: dict = {}
    body = []
    for ins in fn.body:
        args = rename_args(ins.args, subst)
        if is_pure(ins.op):
            key = _key(ins, args, fn.types)
            first = seen.get(key)
            if first is not None:
                # Same op, operands, attributes, types: same values (pure ops are deterministic).
                for r, keep in zip(ins.outs, first.outs):
                    subst[r] = keep
                continue
        new = copy_instr(ins, args=args)
        if is_pure(ins.op):
            seen[key] = new
        body.append(new)
    outputs = [resolve(subst, r) for r in fn.outputs]
    return prune_types(clone(fn, body=body, outputs=outputs))
