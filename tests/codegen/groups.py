"""Hand-built fusion groups (IR Functions) shared by the codegen tests, and the reference runner.

`G` builds a Function instruction by instruction: result types come from `ir.registry.infer`, so
every group is well typed by construction; `reference(fn, inputs)` runs the body through the NumPy
reference interpreter (`run_instr`), binding symbolic dims from the inputs.
"""

from __future__ import annotations

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.program import Instr, canonical_attrs
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.runtime.interpreter import _round_bf16, run_instr

B, S, N = Sym.of("B"), Sym.of("S"), Sym.of("N")


class G:
    """Builder: `x = g.param('f32', (B, 8))`, `y = g.op('exp', x)`, `g.fn()` (every result an output
    unless `outputs` is given: tier 1 returns each op's result)."""

    def __init__(self):
        self.params, self.body, self.types = [], [], {}
        self.n = 0

    def param(self, dtype: str, shape) -> Reg:
        r = self.n
        self.n += 1
        self.types[r] = TensorType(dtype, tuple(shape))
        self.params.append(r)
        return Reg(r)

    def op(self, name: str, *args, **attrs):
        attrs = canonical_attrs(name, attrs)
        argt = [self.types[int(a)] if isinstance(a, Reg) else a for a in args]
        outs = registry.infer(name, argt, attrs)
        regs = tuple(range(self.n, self.n + len(outs)))
        self.n += len(outs)
        for r, t in zip(regs, outs):
            self.types[r] = t
        self.body.append(Instr(name, tuple(args), attrs, regs))
        return Reg(regs[0]) if len(regs) == 1 else tuple(Reg(r) for r in regs)

    def fn(self, outputs=None) -> Function:
        if outputs is None:
            outputs = [r for ins in self.body for r in ins.outs]
        return Function("g", list(self.params), list(self.body), [int(r) for r in outputs], dict(self.types))


def reference(fn: Function, inputs: list) -> list[np.ndarray]:
    """The interpreter's results for `fn`'s outputs."""
    values, env = {}, {}
    for r, a in zip(fn.params, inputs):
        values[r] = _round_bf16(a) if fn.types[r].dtype == "bf16" else a
    for ins in fn.body:
        run_instr(ins, values, fn.types, env=env)
    return [values[r] for r in fn.outputs]


def np_dtype(dtype: str):
    return dtypes.to_numpy(dtype)


# --- the fused patterns of the issue ---------------------------------------------------------------
def chain(dtype="f32", shape=(B, 784)) -> Function:
    """tanh(relu(exp(x*0.5-1)*m + x) - 0.25)"""
    g = G()
    x, m = g.param(dtype, shape), g.param(dtype, shape)
    a = g.op("sub", g.op("mul", x, 0.5), 1.0)
    b = g.op("add", g.op("mul", g.op("exp", a), m), x)
    g.op("tanh", g.op("sub", g.op("relu", b), 0.25))
    return g.fn()


def masked_softmax(shape=(B, S), mask_shape=None) -> Function:
    """softmax(x + (1 - m) * -1e4, -1)"""
    g = G()
    x = g.param("f32", shape)
    m = g.param("f32", mask_shape or shape)
    bias = g.op("mul", g.op("sub", 1.0, m), -1e4)
    g.op("softmax", g.op("add", x, bias), axis=-1)
    return g.fn()


def layer_norm_gelu(shape=(B, 64), approximate="none") -> Function:
    g = G()
    x = g.param("f32", shape)
    gamma, beta = g.param("f32", shape[-1:]), g.param("f32", shape[-1:])
    y, _, _ = g.op("layer_norm", x, gamma, beta, begin_norm_axis=-1, begin_params_axis=-1, eps=1e-5)
    g.op("gelu", y, approximate=approximate)
    return g.fn()


def reductions(shape=(B, 6, 10)) -> Function:
    """add + relu + sum along the last axis, max over axis 0, mean keepdims, min over all, prod."""
    g = G()
    x, y = g.param("f32", shape), g.param("f32", shape[-1:])
    r = g.op("relu", g.op("add", x, y))
    g.op("sum", r, axis=(-1,))
    g.op("max", x, axis=(0,))
    g.op("mean", r, axis=(1, 2), keepdims=True)
    g.op("min", x, axis=None)
    g.op("prod", g.op("tanh", x), axis=(1,))
    return g.fn()


def backward_chain(shape=(B, 32)) -> Function:
    """relu_grad / gelu_grad / sigmoid_grad / tanh_grad / silu_grad chained, then summed over rows."""
    g = G()
    dy, x = g.param("f32", shape), g.param("f32", shape)
    y = g.op("gelu", x)
    d1 = g.op("gelu_grad", dy, x, y)
    s = g.op("sigmoid", x)
    d2 = g.op("sigmoid_grad", s, d1)
    t = g.op("tanh", x)
    d3 = g.op("tanh_grad", t, d2)
    d4 = g.op("relu_grad", d3, x)
    d5 = g.op("silu_grad", d4, x)
    g.op("sum", d5, axis=(0,))
    return g.fn()
