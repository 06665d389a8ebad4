"""Helpers of the pass tests (FX style): parse IR text, run a Function with the reference
interpreter, compare a Function before/after a pass on random inputs with NaN/Inf, and generate
random elementwise programs with hypothesis."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ms_dynvm import dtypes
from ms_dynvm.bytecode.program import Instr, canonical_attrs
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType, eval_dim
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.ir.verifier import verify
from ms_dynvm.runtime.interpreter import run_instr

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0])


def parse(text: str) -> Function:
    fn = Function.parse(text)
    verify(fn)
    return fn


def execute(fn: Function, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `fn` on arrays for its params with the reference interpreter; returns its outputs."""
    values = dict(zip(fn.params, inputs))
    env: dict = {}
    for ins in fn.body:
        run_instr(ins, values, fn.types, env=env)
    return [values[r] for r in fn.outputs]


def random_inputs(fn: Function, rng: np.random.Generator, sizes: dict | None = None,
                  special: bool = True) -> list[np.ndarray]:
    """Arrays for the params of `fn` (symbols take `sizes`), floats salted with NaN/Inf/+-0."""
    out = []
    for p in fn.params:
        t = fn.types[p]
        shape = tuple(eval_dim(d, sizes or {}) for d in t.shape)
        npdt = dtypes.to_numpy(t.dtype)
        if t.dtype == "bool":
            a = rng.random(shape) < 0.5
        elif dtypes.is_int(t.dtype):
            a = rng.integers(-3 if t.dtype != "u8" else 0, 4, size=shape).astype(npdt)  # valid indices too
        else:
            a = rng.standard_normal(shape).astype(npdt)
            if special and a.size:
                k = max(1, a.size // 2)
                idx = rng.integers(0, a.size, size=k)
                a.reshape(-1)[idx] = rng.choice(SPECIAL, size=k).astype(npdt)
        out.append(np.asarray(a, dtype=npdt))
    return out


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, x.shape, y.dtype, y.shape)
        np.testing.assert_array_equal(x, y)  # NaN positions must match too
        if x.dtype.kind == "f":  # and the sign of every non-NaN value, zeros included
            keep = ~np.isnan(x)
            assert np.array_equal(np.signbit(x[keep]), np.signbit(y[keep])), "signs of zeros differ"


def check_pass(before: Function, after: Function, seeds=range(3), sizes: dict | None = None) -> None:
    """`after` verifies and computes what `before` computes, on random inputs with NaN/Inf."""
    verify(after)
    assert after.params == before.params
    assert [after.types[r].dtype for r in after.outputs] == [before.types[r].dtype for r in before.outputs]
    for seed in seeds:
        rng = np.random.default_rng(seed)
        inputs = random_inputs(before, rng, sizes)
        assert_same(execute(before, inputs), execute(after, inputs))


# --- random elementwise programs ---------------------------------------------------------------
_UNARY = ["neg", "exp", "tanh", "relu", "abs", "sigmoid", "square", "identity", "logical_not_cmp"]
_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]
# Immediates that make rules fire (0, 1, -1, -0.0) and some that do not.
_IMMS = [0.0, -0.0, 1.0, -1.0, 0, 0.5]


@st.composite
def elementwise_programs(draw, max_ops: int = 10) -> Function:
    """A random well-typed Function over f32[3,4] and f32[1,4] params using unary, binary (with
    identity immediates), cast, where, neg chains, reshapes and transposes; some results unused,
    some computed twice (for dce/cse/simplify)."""
    types: dict[int, TensorType] = {0: TensorType("f32", (3, 4)), 1: TensorType("f32", (1, 4))}
    regs = [0, 1]
    body: list[Instr] = []
    nxt = 2

    def emit(op, args, attrs=None):
        nonlocal nxt
        attrs = canonical_attrs(op, attrs or {})
        argt = [types[int(a)] if isinstance(a, Reg) else a for a in args]
        outs = registry.infer(op, argt, attrs)
        rs = list(range(nxt, nxt + len(outs)))
        nxt += len(outs)
        for r, t in zip(rs, outs):
            types[r] = t
        body.append(Instr(op, tuple(args), attrs, tuple(rs)))
        return rs

    n = draw(st.integers(1, max_ops))
    for _ in range(n):
        kind = draw(st.sampled_from(["unary", "binary", "imm", "imm", "dup", "cast", "where", "view"]))
        x = Reg(draw(st.sampled_from(regs)))
        if kind == "unary":
            op = draw(st.sampled_from(_UNARY))
            if op == "logical_not_cmp":
                (c,) = emit("gt", (x, 0.0))
                (c2,) = emit("logical_not", (Reg(c),))
                (r,) = emit("logical_not", (Reg(c2),))
                (r,) = emit("where", (Reg(r), x, -0.0))
            else:
                (r,) = emit(op, (x,))
        elif kind == "binary":
            y = Reg(draw(st.sampled_from(regs)))
            (r,) = emit(draw(st.sampled_from(_BINARY)), (x, y))
        elif kind == "imm":
            x = Reg(draw(st.sampled_from([0, regs[-1]])))  # params hold the special values
            op = draw(st.sampled_from(["add", "sub", "mul", "div"]))
            v = draw(st.sampled_from(_IMMS))
            args = (x, v) if draw(st.booleans()) or op in ("sub", "div") else (v, x)
            (r,) = emit(op, args)
        elif kind == "dup" and body:
            ins = draw(st.sampled_from(body))
            (r, *_) = emit(ins.op, ins.args, ins.attrs)
        elif kind == "dup":
            (r,) = emit("exp", (x,))
        elif kind == "cast":
            (r,) = emit("cast", (x,), {"dtype": draw(st.sampled_from(["f32", "f16", "f32"]))})
            if types[r].dtype != "f32":
                (r,) = emit("cast", (Reg(r),), {"dtype": "f32"})
        elif kind == "where":
            (c,) = emit("lt", (x, 0.5))
            y = Reg(draw(st.sampled_from(regs)))
            (r,) = emit("where", (Reg(c), x, y if draw(st.booleans()) else x))
        else:
            rank = types[int(x)].rank
            if draw(st.booleans()) and rank == 2:
                (r,) = emit("transpose", (x,), {"perm": (1, 0)})
                (r,) = emit("transpose", (Reg(r),), {"perm": (1, 0)})
            else:
                (r,) = emit("reshape", (x,), {"shape": (-1,)})
                (r,) = emit("reshape", (Reg(r),), {"shape": tuple(types[int(x)].shape)})
        if types[r].dtype == "f32" and tuple(types[r].shape) in ((3, 4), (1, 4)):
            regs.append(r)  # keep every operand pool well-typed for the next op
    n_out = draw(st.integers(1, min(3, len(regs) - 2)))
    outputs = [regs[-1]] + draw(st.lists(st.sampled_from(regs[2:]), min_size=n_out - 1, max_size=n_out - 1))
    fn = Function("h", [0, 1], body, outputs, types)
    verify(fn)
    return fn


__all__ = ["Sym", "assert_same", "check_pass", "elementwise_programs", "execute", "parse", "random_inputs"]
