"""The C backend's capability table (`codegen.capability`) agrees with lowering and rendering.

For every op of `C_OPS`, every dtype of its inputs and every supported form, a one-instruction group
is built; the table's verdict (`computes`: the eager-equality rules of `eager_refusal` are about
eager's numerics, not about what the backend can compile) must be what `spec.lower` + `c.render` do.
"""

from __future__ import annotations

import pytest

from ms_dynvm.bytecode import opcodes
from ms_dynvm.codegen import c as c_backend
from ms_dynvm.codegen import capability
from ms_dynvm.codegen.spec import CodegenError, lower
from ms_dynvm.ir import registry
from tests.codegen.groups import G

DTYPES = sorted(capability.ANY - {"bf16"})  # (bfloat16 is refused as a whole: see capability)

# Attributes for ops whose own ones have no default; every group is [4, 8].
ATTRS = {
    "broadcast_to": {"shape": (2, 4, 8)}, "expand_dims": {"axis": 0}, "reshape": {"shape": (8, 4)},
    "select": {"axis": 0, "index": 1}, "slice": {"begin": (0, 0), "end": (2, 8), "step": (1, 2)},
    "transpose": {"perm": (1, 0)}, "full_like": {"value": 2},
    "bias_add": {"axis": 1}, "sum": {"axis": (1,)}, "mean": {"axis": (1,)}, "prod": {"axis": (1,)},
    "max": {"axis": (1,)}, "min": {"axis": (1,)},
}


def _group(op: str, dt: str):
    """A one-instruction group of `op` on [4, 8] tensors of dtype `dt` (None: the registry refuses)."""
    g = G()
    shape = (4, 8)
    n_in = opcodes.OPS[op].n_in
    attrs = dict(ATTRS.get(op, {}))
    if op == "cast":
        return [(_one(h, op, [h.param(dt, shape)], {"dtype": to}), to) for to in DTYPES for h in [G()]]
    if op == "fill":
        return [(_one(g, op, [], {"shape": shape, "dtype": dt, "value": 1}), None)]
    if op == "bias_add":
        args = [g.param(dt, shape), g.param(dt, (8,))]
    elif op == "layer_norm":
        args = [g.param(dt, shape), g.param(dt, (8,)), g.param(dt, (8,))]
    elif op in ("where", "masked_fill"):
        c = g.param("bool", shape)
        args = [c, g.param(dt, shape), g.param(dt, shape)] if op == "where" else \
            [g.param(dt, shape), c, g.param(dt, ())]
    else:
        args = [g.param(dt, shape) for _ in range(n_in)]
    return [(_one(g, op, args, attrs), None)]


def _one(g: G, op: str, args, attrs):
    try:
        g.op(op, *args, **attrs)
    except (registry.ShapeError, TypeError, ValueError, KeyError):
        return None
    return g.fn()


def _compiles(fn) -> str | None:
    try:
        c_backend.render(lower(fn))
    except CodegenError as e:
        return str(e)
    except ValueError as e:
        return f"C rendering: {e}"
    return None


def _table_says(fn) -> str | None:
    return capability.computes(fn.body[0], fn.types)


@pytest.mark.parametrize("op", sorted(capability.C_OPS))
def test_table_agrees_with_lowering(op):
    checked = 0
    for dt in DTYPES:
        for fn, _ in _group(op, dt):
            if fn is None:
                continue
            table, real = _table_says(fn), _compiles(fn)
            assert (table is None) == (real is None), (op, dt, fn.as_text(), table, real)
            checked += 1
    assert checked, op


def test_ops_outside_the_table_do_not_lower():
    for op in ("matmul", "gather", "dropout", "concat", "argmax", "softmax_grad", "var"):
        assert op not in capability.C_OPS


@pytest.mark.parametrize("op", sorted(op for op in capability.C_OPS if opcodes.OPS[op].n_in in (2, 3)
                                      and op not in ("bias_add", "layer_norm")))
def test_table_agrees_with_lowering_on_mixed_dtypes(op):
    """Operands of two dtypes (a 0-d second operand: the scalar of `x * 0.5` made a tensor)."""
    for dt in DTYPES:
        for dt2 in DTYPES:
            g = G()
            args = [g.param(dt, (4, 8)), g.param(dt2, ())]
            if opcodes.OPS[op].n_in == 3:
                args.append(g.param(dt, (4, 8)))
            fn = _one(g, op, args, dict(ATTRS.get(op, {})))
            if fn is None:
                continue
            table, real = _table_says(fn), _compiles(fn)
            assert (table is None) == (real is None), (op, dt, dt2, fn.as_text(), table, real)
