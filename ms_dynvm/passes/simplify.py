"""Algebraic simplification: local rewrites that remove or merge instructions without changing any
value, bit for bit (NaN payloads aside), on every input including NaN, +-Inf and -0.0.

Why: eager code carries identities that cost a kernel launch each (`x * 1.0` from a default scale,
`cast` to the dtype a tensor already has, `reshape` chains from `view`/`flatten`, a transpose undone by
another, `-(-x)` from autograd formulas).

Safety rule: a rule that replaces a result by an existing register fires only when the two types are
identical (dtype and shape), so neither broadcasting nor dtype promotion is ever lost: `mul(%i32, 1.0)`
is f32 and stays. A rule that builds a new instruction is kept only when the registry infers exactly
the recorded result type for it. Complex dtypes are left alone: (a+bi)*(1+0i) computes b*0, which
is NaN for b = inf, so even `x * 1 -> x` is not exact there.

Constants are immediates or splat registers (`fill`/`full_like` results, see util.splat_value).

Rules (each with its algebra at its definition):
- `x * 1 -> x`, `x / 1 -> x`, `x * -1 -> neg(x)`, `x / -1 -> neg(x)`
- `x + 0 -> x` for integer/bool x; for float x only `x + (-0.0) -> x` (IEEE: -0.0 + +0.0 = +0.0, so
  `x + 0.0` is not `x` when x is -0.0)
- `x - 0 -> x` (IEEE: -0.0 - +0.0 = -0.0, so this one holds for floats; `x - (-0.0)` does not)
- `neg(neg(x)) -> x`, `logical_not(logical_not(x)) -> x`, `where(c, x, x) -> x`
- `cast(x, dtype(x)) -> x`, `identity(x) -> x`
- views: a view whose result has x's type and that keeps every element in place is x (reshape,
  expand_dims, squeeze, broadcast_to, an identity transpose, a full step-1 slice); chains of
  reshape-like views collapse: `reshape(reshape(x, a), b) -> reshape(x, b)` (also through
  expand_dims/squeeze, e.g. `squeeze(expand_dims(x, a), a) -> x`);
  `transpose(transpose(x, p), q) -> transpose(x, p[q])` and `-> x` when p[q] is the identity.
Not implemented on purpose:
- `x * 0 -> 0`: wrong for NaN and +-Inf (NaN * 0 = NaN, Inf * 0 = NaN) and for the sign of zero.
- `x - x -> 0`, `x / x -> 1`: wrong for NaN/Inf (and 0/0).
- `0 - x -> neg(x)`: 0.0 - 0.0 = +0.0 but neg(0.0) = -0.0.
- `contiguous(x) -> x`: value-identical, but it is the frontend's explicit layout change; the fuser
  treats it as a view, so it costs nothing there.

The rewrite runs forward over the body with a register substitution, so a chain collapses in one
sweep (neg(neg(neg(neg(x))))) -> x); sweeps repeat until nothing changes. An output whose
instruction was replaced by an existing register is rewritten to it, so `outputs` may repeat a
register (as after cse). Replaced instructions disappear; producers they leave unused are left for
`dce`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ms_dynvm import dtypes
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import (
    clone,
    copy_instr,
    is_number,
    make_instr,
    prune_types,
    rename_args,
    resolve,
    same_type,
    splat_value,
)

MAX_SWEEPS = 8

# A rule gets (instr, context) and returns None (no match), a register (the result is that register)
# or an Instr (replaces the instruction, same result registers).
Rule = Callable[["Instr", "_Ctx"], "int | Instr | None"]


class _Ctx:
    def __init__(self, types: dict):
        self.types = types
        self.producers: dict[int, Instr] = {}

    def ty(self, r):
        return self.types[int(r)]

    def const(self, operand):
        return splat_value(self.producers, operand)

    def producer(self, operand) -> Instr | None:
        return self.producers.get(int(operand)) if isinstance(operand, Reg) else None

    def alias(self, ins: Instr, x) -> int | None:
        """x, if it is a register of exactly the type of ins's (only) result."""
        if isinstance(x, Reg) and len(ins.outs) == 1 and same_type(self.ty(x), self.ty(ins.outs[0])):
            return int(x)
        return None

    def checked(self, new: Instr) -> Instr | None:
        """`new` if the registry infers exactly the recorded result types for it."""
        args = [self.ty(a) if isinstance(a, Reg) else a for a in new.args]
        try:
            inferred = registry.infer(new.op, args, new.attrs)
        except registry.ShapeError:
            return None
        recorded = [self.ty(r) for r in new.outs]
        ok = len(inferred) == len(recorded) and all(same_type(a, b) for a, b in zip(inferred, recorded))
        return new if ok else None


def _real(ctx: _Ctx, ins: Instr) -> bool:
    """Arithmetic rules only apply to real (non-complex) results."""
    return ctx.ty(ins.outs[0]).dtype not in dtypes.COMPLEX


def _operand_pairs(ins: Instr):
    """(x, c) for both operand orders of a commutative binary op."""
    a, b = ins.args
    return ((a, b), (b, a))


# --- arithmetic identities ---------------------------------------------------------------------
def _mul_one(ins, ctx):
    # x * 1 -> x   (exact in every real dtype: 1 is representable, x*1 rounds to x, NaN stays NaN)
    if ins.op != "mul" or not _real(ctx, ins):
        return None
    for x, c in _operand_pairs(ins):
        known, v = ctx.const(c)
        if known and is_number(v, 1):
            r = ctx.alias(ins, x)
            if r is not None:
                return r
    return None


def _div_one(ins, ctx):
    # x / 1 -> x   (exact; integer x / 1 is a float result, so the type check refuses it)
    if ins.op != "div" or not _real(ctx, ins):
        return None
    known, v = ctx.const(ins.args[1])
    return ctx.alias(ins, ins.args[0]) if known and is_number(v, 1) else None


def _is_neg_zero(v) -> bool:
    return isinstance(v, float) and v == 0.0 and math.copysign(1.0, v) < 0


def _add_zero(ins, ctx):
    # x + 0 -> x        for bool/integer x (bool add is `or`: x or False = x)
    # x + (-0.0) -> x   for float x; x + (+0.0) is NOT x: -0.0 + 0.0 = +0.0 (IEEE round-to-nearest)
    if ins.op != "add" or not _real(ctx, ins):
        return None
    floating = dtypes.is_float(ctx.ty(ins.outs[0]).dtype)
    for x, c in _operand_pairs(ins):
        known, v = ctx.const(c)
        if known and is_number(v, 0) and (not floating or _is_neg_zero(v)):
            r = ctx.alias(ins, x)
            if r is not None:
                return r
    return None


def _sub_zero(ins, ctx):
    # x - 0 -> x        (IEEE: -0.0 - +0.0 = -0.0, so exact for floats too)
    # x - (-0.0) is x + 0.0, which turns -0.0 into +0.0: not rewritten
    if ins.op != "sub" or not _real(ctx, ins):
        return None
    known, v = ctx.const(ins.args[1])
    if known and is_number(v, 0) and not _is_neg_zero(v):
        return ctx.alias(ins, ins.args[0])
    return None


def _mul_neg_one(ins, ctx):
    # x * -1 -> neg(x), x / -1 -> neg(x)   (exact: both flip the sign only; integers wrap alike,
    # -MIN = MIN; unsigned: x * 255 = -x mod 256 in u8). Not for bool results (neg rejects bool).
    if ins.op not in ("mul", "div") or not _real(ctx, ins) or ctx.ty(ins.outs[0]).dtype == "bool":
        return None
    pairs = _operand_pairs(ins) if ins.op == "mul" else ((ins.args[0], ins.args[1]),)
    for x, c in pairs:
        known, v = ctx.const(c)
        if known and is_number(v, -1) and ctx.alias(ins, x) is not None:
            return ctx.checked(make_instr("neg", (x,), {}, ins.outs))
    return None


# --- involutions -------------------------------------------------------------------------------
def _double(op: str):
    def rule(ins, ctx):
        # neg(neg(x)) -> x ; logical_not(logical_not(x)) -> x (x bool, so the type check passes)
        if ins.op != op:
            return None
        inner = ctx.producer(ins.args[0])
        if inner is None or inner.op != op:
            return None
        return ctx.alias(ins, inner.args[0])

    rule.__name__ = f"_{op}_{op}"
    return rule


def _where_same(ins, ctx):
    # where(c, x, x) -> x   (both branches are the same value; the type check keeps c's broadcast)
    # (Reg is an int: compare as registers only, or %0 would equal the immediate 0.0)
    if ins.op != "where":
        return None
    x, y = ins.args[1], ins.args[2]
    if not (isinstance(x, Reg) and isinstance(y, Reg)) or int(x) != int(y):
        return None
    return ctx.alias(ins, ins.args[1])


def _cast_same(ins, ctx):
    # cast(x, dtype(x)) -> x ; identity(x) -> x
    if ins.op in ("cast", "identity"):
        return ctx.alias(ins, ins.args[0])
    return None


# --- views -------------------------------------------------------------------------------------
_RESHAPE_LIKE = frozenset({"reshape", "expand_dims", "squeeze"})


def _view_noop(ins, ctx):
    # reshape/expand_dims/squeeze/broadcast_to to x's own shape -> x (row-major order unchanged,
    # nothing broadcast); transpose(x, identity) -> x; slice(x, 0:n:1 on every dim) -> x
    # (a step-1 slice with the full length must start at 0)
    if ins.op in _RESHAPE_LIKE or ins.op == "broadcast_to":
        return ctx.alias(ins, ins.args[0])
    if ins.op == "transpose":
        rank = ctx.ty(ins.args[0]).rank
        if rank == 0 or [p % rank for p in ins.attrs["perm"]] == list(range(rank)):
            return ctx.alias(ins, ins.args[0])
    if ins.op == "slice" and all(s == 1 for s in ins.attrs["step"]):
        return ctx.alias(ins, ins.args[0])
    return None


def _reshape_chain(ins, ctx):
    # reshape(reshape(x, a), b) -> reshape(x, b)   (reshapes only reinterpret row-major order, so
    # the intermediate shape does not matter; expand_dims/squeeze are reshapes too)
    # squeeze(expand_dims(x, a), a) -> x            (the chain ends in x's own shape)
    if ins.op not in _RESHAPE_LIKE:
        return None
    inner = ctx.producer(ins.args[0])
    if inner is None or inner.op not in _RESHAPE_LIKE:
        return None
    x = inner.args[0]
    r = ctx.alias(ins, x)
    if r is not None:
        return r
    if ins.op == "reshape":
        return ctx.checked(make_instr("reshape", (x,), ins.attrs, ins.outs))
    shape = ctx.ty(ins.outs[0]).shape
    if all(isinstance(d, int) for d in shape):
        return ctx.checked(make_instr("reshape", (x,), {"shape": tuple(shape)}, ins.outs))
    return None


def _transpose_chain(ins, ctx):
    # transpose(transpose(x, p), q) -> transpose(x, r) with r[j] = p[q[j]]
    #   (y = x.T(p): y.shape[i] = x.shape[p[i]]; z = y.T(q): z.shape[j] = y.shape[q[j]] = x.shape[p[q[j]]])
    # and -> x when r is the identity
    if ins.op != "transpose":
        return None
    inner = ctx.producer(ins.args[0])
    if inner is None or inner.op != "transpose":
        return None
    x = inner.args[0]
    rank = ctx.ty(x).rank
    if rank == 0:
        return ctx.alias(ins, x)
    p = [a % rank for a in inner.attrs["perm"]]
    q = [a % rank for a in ins.attrs["perm"]]
    r = tuple(p[j] for j in q)
    if r == tuple(range(rank)):
        return ctx.alias(ins, x)
    return ctx.checked(make_instr("transpose", (x,), {"perm": r}, ins.outs))


RULES: list[tuple[str, Rule]] = [
    ("mul_one", _mul_one),
    ("div_one", _div_one),
    ("add_zero", _add_zero),
    ("sub_zero", _sub_zero),
    ("mul_neg_one", _mul_neg_one),
    ("neg_neg", _double("neg")),
    ("not_not", _double("logical_not")),
    ("where_same", _where_same),
    ("cast_same", _cast_same),
    ("view_noop", _view_noop),
    ("reshape_chain", _reshape_chain),
    ("transpose_chain", _transpose_chain),
]


def _sweep(fn: Function) -> tuple[Function, int]:
    ctx = _Ctx(fn.types)
    subst: dict[int, int] = {}
    body = []
    fired = 0
    for ins in fn.body:
        cur = copy_instr(ins, args=rename_args(ins.args, subst))
        for _name, rule in RULES:
            res = rule(cur, ctx)
            if res is None:
                continue
            fired += 1
            if isinstance(res, Instr):
                cur = res
                continue  # later rules may simplify the rewritten instruction further
            subst[cur.outs[0]] = res
            cur = None
            break
        if cur is not None:
            body.append(cur)
            for r in cur.outs:
                ctx.producers[r] = cur
    outputs = [resolve(subst, r) for r in fn.outputs]
    return prune_types(clone(fn, body=body, outputs=outputs)), fired


def simplify(fn: Function) -> Function:
    """`fn` with the algebraic identities above applied to a fixpoint (a new Function)."""
    out, fired = _sweep(fn)
    for _ in range(MAX_SWEEPS - 1):
        if not fired:
            break
        out, fired = _sweep(out)
    return out
