"""Groups the CUDA tests compile: the codegen tests' fused patterns (tests/codegen/groups.py) in
several dtypes and layouts, plus a few of this backend's own (float16, integer, broadcasting)."""

from __future__ import annotations

from tests.codegen import groups
from tests.codegen.groups import B, G, S


def int_mix():
    g = G()
    a, b = g.param("i32", (B, 16)), g.param("i32", (16,))
    s = g.op("add", g.op("mul", a, b), 3)
    g.op("maximum", s, g.op("neg", a))
    g.op("cast", s, dtype="f32")
    return g.fn()


def f16_chain():
    return groups.chain(dtype="f16", shape=(B, 96))


def bf16_chain():
    return groups.chain(dtype="bf16", shape=(B, 96))


def bcast_where():
    g = G()
    x, y = g.param("f32", (B, 1, 8)), g.param("f32", (5, 8))
    c = g.op("gt", x, y)
    g.op("where", c, g.op("exp", x), g.op("log", g.op("abs", y)))
    return g.fn()


def log_softmax():
    g = G()
    x = g.param("f32", (B, S))
    g.op("log_softmax", x, axis=-1)
    return g.fn()


def named_groups():
    return [
        ("chain", groups.chain()),
        ("chain_1d", groups.chain(shape=(B,))),
        ("masked_softmax", groups.masked_softmax()),
        ("masked_softmax_bcast", groups.masked_softmax(shape=(B, 4, S), mask_shape=(B, 1, S))),
        ("layer_norm_gelu", groups.layer_norm_gelu()),
        ("layer_norm_gelu_tanh", groups.layer_norm_gelu(approximate="tanh")),
        ("reductions", groups.reductions()),
        ("backward_chain", groups.backward_chain()),
        ("int_mix", int_mix()),
        ("f16_chain", f16_chain()),
        ("bf16_chain", bf16_chain()),
        ("bcast_where", bcast_where()),
        ("log_softmax", log_softmax()),
    ]
