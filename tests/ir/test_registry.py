"""Shape/dtype rules of `ms_dynvm.ir.registry`: broadcasting, dtype promotion (as measured on
MindSpore 2.10), reductions, views with -1, symbolic dims and the errors of invalid instructions.
(tests/runtime/test_interpreter.py checks every rule against the interpreter's results.)"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.types import Sym, TensorType
from ms_dynvm.ir.registry import RULES, ShapeError, broadcast_shapes, infer

B, S = Sym.of("B"), Sym.of("S")


def T(dtype: str, *shape) -> TensorType:
    return TensorType(dtype, tuple(shape))


def one(op, args, **attrs) -> TensorType:
    (t,) = infer(op, args, attrs)
    return t


def test_every_op_except_call_has_a_rule():
    assert set(RULES) == set(opcodes.OPS) - {"call"}


def test_infer_fills_defaults_and_checks_the_instruction():
    assert one("sum", [T("f32", 2, 3)]) == T("f32")  # axis=None, keepdims=False by default
    with pytest.raises(ShapeError, match="unknown attribute"):
        infer("sum", [T("f32", 2)], {"axes": (0,)})
    with pytest.raises(ShapeError, match="missing attribute 'shape'"):
        infer("reshape", [T("f32", 2)], {})
    with pytest.raises(ShapeError, match="expected 2 operands, got 1"):
        infer("add", [T("f32", 2)], {})
    with pytest.raises(ShapeError, match="no shape rule"):
        infer("call", [T("f32", 2)], {"target": "x"})
    with pytest.raises(ShapeError, match="must be a tensor"):
        infer("exp", [1.0], {})
    with pytest.raises(ShapeError, match="bad operands or attributes"):
        infer("split", [T("f32", 4)], {"sizes": 4})
    assert one("sum", [T("f32", 2, 3)], axis=(np.int64(1),)) == T("f32", 2)


# --- broadcasting ------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b, out", [
    ((2, 1, 4), (3, 1), (2, 3, 4)),
    ((), (5,), (5,)),
    ((0, 1), (1, 3), (0, 3)),
    ((B, 1), (1, 4), (B, 4)),
    ((B, S), (B, 1), (B, S)),
    ((1,), (B,), (B,)),
    ((Sym(("B", "S"), 2), 1), (Sym(("B", "S"), 2), 3), (Sym(("B", "S"), 2), 3)),
])
def test_broadcast(a, b, out):
    assert broadcast_shapes(a, b) == out
    assert one("add", [T("f32", *a), T("f32", *b)]).shape == out


@pytest.mark.parametrize("a, b", [((2,), (3,)), ((0,), (2,)), ((B,), (3,)), ((B,), (S,)), ((B, 2), (2, B))])
def test_broadcast_mismatch(a, b):
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer("mul", [T("f32", *a), T("f32", *b)], {})


@settings(max_examples=60, deadline=None)
@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4, min_side=0, max_side=3))
def test_broadcast_agrees_with_numpy(shapes):
    assert broadcast_shapes(*shapes.input_shapes) == shapes.result_shape
    types = [T("f32", *s) for s in shapes.input_shapes]
    assert one("where", [T("bool", *shapes.input_shapes[0])] + types[1:]).shape == shapes.result_shape


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.lists(st.integers(2, 4), min_size=1, max_size=3))
def test_incompatible_static_shapes_are_rejected(a, b):
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast_shapes(tuple(a), tuple(b))
    else:
        assert broadcast_shapes(tuple(a), tuple(b)) == np.broadcast_shapes(tuple(a), tuple(b))


# --- dtypes (MindSpore 2.10 CPU, measured) -----------------------------------------------------
@pytest.mark.parametrize("op, a, b, dtype", [
    ("add", T("i32", 3), T("i64", 3), "i64"),
    ("add", T("u8", 3), T("i8", 3), "i16"),
    ("add", T("f16", 3), T("f32", 3), "f32"),
    ("add", T("bool", 3), True, "bool"),
    ("add", T("bool", 3), 2, "i64"),
    ("add", T("i32", 3), 2, "i32"),
    ("add", T("i32", 3), 2.0, "f32"),
    ("add", T("f16", 3), 2.0, "f16"),
    ("sub", 2.0, T("i64", 3), "f32"),
    ("add", T("f16", 3), T("f32"), "f32"),  # add promotes a 0-d tensor fully
    ("mul", T("f16", 3), T("f32"), "f16"),  # ... mul/div treat it like a scalar
    ("mul", T("i32"), T("f32", 3), "f32"),
    ("mul", T("i32", 3), T("f32"), "f32"),
    ("mul", T("i64"), T("i32", 3), "i32"),
    ("div", T("f16", 3), T("f32"), "f16"),
    ("fmod", T("i32", 3), T("i64"), "i64"),  # fmod (TruncateMod) promotes 0-d tensors fully
    ("fmod", T("f16", 3), T("f32"), "f32"),
    ("div", T("i32", 3), T("i32", 3), "f32"),
    ("div", T("bool", 3), T("bool", 3), "f32"),
    ("div", T("f16", 3), 2, "f16"),
    ("atan2", T("i32", 3), T("i32", 3), "f32"),
    ("floor_div", T("i32", 3), T("i32", 3), "i32"),
    ("pow", T("i32", 3), 2.0, "f32"),
    ("eq", T("f32", 3), T("i64", 3), "bool"),
    ("logical_and", T("f32", 3), T("i32", 3), "bool"),
    ("bitwise_xor", T("i32", 3), T("i64", 3), "i64"),
    ("bitwise_and", T("bool", 3), T("bool", 3), "bool"),
])
def test_binary_dtype(op, a, b, dtype):
    assert one(op, [a, b]).dtype == dtype


def test_bitwise_rejects_floats_and_binary_needs_a_tensor():
    with pytest.raises(ShapeError, match="bool or integer"):
        infer("bitwise_or", [T("f32", 2), T("i32", 2)], {})
    with pytest.raises(ShapeError, match="at least one operand must be a tensor"):
        infer("add", [1, 2.0], {})


@pytest.mark.parametrize("op, src, dtype", [
    ("exp", "i32", "f32"), ("sqrt", "bool", "f32"), ("exp", "f16", "f16"), ("gelu", "f64", "f64"),
    ("neg", "i8", "i8"), ("abs", "u8", "u8"), ("round", "i32", "i32"), ("hardswish", "i64", "i64"),
    ("isnan", "i32", "bool"), ("logical_not", "f32", "bool"), ("relu", "bf16", "bf16"),
])
def test_unary_dtype(op, src, dtype):
    assert one(op, [T(src, 2, B)]) == T(dtype, 2, B)


def test_unary_errors_and_dtype_attrs():
    with pytest.raises(ShapeError, match="bool tensors cannot be negated"):
        infer("neg", [T("bool", 2)], {})
    with pytest.raises(ShapeError, match="approximate"):
        infer("gelu", [T("f32", 2)], {"approximate": "fast"})
    assert one("cast", [T("f32", 2)], dtype="bf16") == T("bf16", 2)
    with pytest.raises(ShapeError, match="unknown dtype"):
        infer("cast", [T("f32", 2)], {"dtype": "f8"})
    assert one("full_like", [T("i32", 2)], value=1.5) == T("i32", 2)
    assert one("full_like", [T("i32", 2)], value=1.5, dtype="f16") == T("f16", 2)


def test_ternary_dtypes():
    assert one("where", [T("bool", 2), T("i32", 2), T("f16", 2)]) == T("f16", 2)
    assert one("where", [T("bool", 2), T("i32", 2), 0.5]) == T("f32", 2)
    assert one("masked_fill", [T("f16", 2, 3), T("bool", 1, 3), T("f32")]) == T("f16", 2, 3)
    assert one("clamp", [T("i32", 4), 0.5, None]) == T("f32", 4)
    assert one("clamp", [T("i32", 4), T("i64", 4), None]) == T("i64", 4)
    assert one("addcmul", [T("i32", 2), T("i32", 2), T("i32", 2)], value=0.5) == T("f32", 2)
    with pytest.raises(ShapeError, match="mask must be bool"):
        infer("masked_fill", [T("f32", 2), T("i32", 2), 0.0], {})
    with pytest.raises(ShapeError, match="at least one of lo and hi"):
        infer("clamp", [T("f32", 2), None, None], {})


# --- reductions --------------------------------------------------------------------------------
@pytest.mark.parametrize("op, src, attrs, out", [
    ("sum", T("bool", 2, 3), {}, T("i64")),
    ("sum", T("i8", 2, 3), {"axis": (1,)}, T("i64", 2)),
    ("sum", T("f16", 2, 3), {"axis": (-1,), "keepdims": True}, T("f16", 2, 1)),
    ("sum", T("i32", 2, 3), {"dtype": "f32"}, T("f32")),
    ("sum", T("f32", 2, 3, 4), {"axis": (0, 2)}, T("f32", 3)),
    ("sum", T("f32", 2, 3), {"axis": ()}, T("f32")),  # () = all axes, as MindSpore
    ("mean", T("i32", B, 3), {"axis": (1,)}, T("i32", B)),
    ("mean", T("bool", 4), {"dtype": "f32"}, T("f32")),
    ("prod", T("i32", 4), {}, T("i64")),
    ("max", T("f32", B, 3), {"axis": (0,), "keepdims": True}, T("f32", 1, 3)),
    ("all", T("u8", 4), {}, T("bool")),
    ("any", T("u8", 4), {}, T("u8")),
    ("any", T("f32", 4), {}, T("bool")),
    ("var", T("i32", 4, 2), {"axis": (0,)}, T("f32", 2)),
    ("logsumexp", T("f16", 4, 2), {"axis": (1,)}, T("f16", 4)),
    ("argmax", T("f32", 4, 2), {"axis": -1}, T("i64", 4)),
    ("argmin", T("f32", 4, 2), {"axis": 0, "keepdims": True, "dtype": "i32"}, T("i32", 1, 2)),
    ("argmax", T("f32", 4, 2), {"keepdims": True}, T("i64")),  # flattened: a scalar, as MindSpore
])
def test_reductions(op, src, attrs, out):
    assert one(op, [src], **attrs) == out


def test_reduction_errors():
    with pytest.raises(ShapeError, match="axis 2 out of range for rank 2"):
        infer("sum", [T("f32", 2, 3)], {"axis": (2,)})
    with pytest.raises(ShapeError, match="repeated axis"):
        infer("sum", [T("f32", 2, 3)], {"axis": (1, -1)})
    with pytest.raises(ShapeError, match="bool tensors need a dtype"):
        infer("mean", [T("bool", 2)], {})
    with pytest.raises(ShapeError, match="empty dim"):
        infer("max", [T("f32", 0, 3)], {"axis": (0,)})
    with pytest.raises(ShapeError, match="dtype must be i32 or i64"):
        infer("argmax", [T("f32", 2)], {"dtype": "f32"})
    with pytest.raises(ShapeError, match="one int"):
        infer("max_with_index", [T("f32", 2, 3)], {"axis": (0, 1)})


def test_with_index_and_norms():
    assert infer("max_with_index", [T("f16", B, 5)], {"axis": 1}) == [T("f16", B), T("i64", B)]
    assert infer("layer_norm", [T("f32", B, S, 8), T("f32", 8), T("f32", 8)], {}) == [
        T("f32", B, S, 8), T("f32", B, S, 1), T("f32", B, S, 1)]
    assert infer("layer_norm", [T("f32", 2, 3, 4), T("f32", 3, 4), T("f32", 3, 4)],
                 {"begin_norm_axis": 1, "begin_params_axis": 1})[1] == T("f32", 2, 1, 1)
    with pytest.raises(ShapeError, match="gamma"):
        infer("layer_norm", [T("f32", 2, 3), T("f32", 2), T("f32", 3)], {})
    assert infer("softmax_cross_entropy", [T("f32", B, 10), T("f32", B, 10)], {}) == [T("f32", B), T("f32", B, 10)]
    assert one("softmax", [T("i32", 2, 3)], axis=(0,)) == T("f32", 2, 3)
    with pytest.raises(ShapeError, match="axis 2 out of range"):
        infer("log_softmax", [T("f32", 2, 3)], {"axis": 2})


# --- views and symbolic dims -------------------------------------------------------------------
@pytest.mark.parametrize("src, target, out", [
    ((2, 3, 4), (-1, 4), (6, 4)),
    ((2, 3, 4), (4, -1), (4, 6)),
    ((0, 3), (3, 0), (3, 0)),
    ((B, S, 4), (-1, 4), (Sym(("B", "S")), 4)),
    ((B, S, 4), (B, -1), (B, Sym(("S",), 4))),
    ((Sym(("B", "S")), 4), (B, S, 2, 2), (B, S, 2, 2)),
    ((B, 6), (-1, 3), (Sym(("B",), 2), 3)),
])
def test_reshape(src, target, out):
    assert one("reshape", [T("f32", *src)], shape=target).shape == out


@pytest.mark.parametrize("src, target, match", [
    ((2, 3), (4, 2), "has 6 elements"),
    ((2, 3), (-1, -1), "more than one -1"),
    ((2, 3), (-1, 4), "cannot be viewed"),
    ((0, 3), (-1, 0), "ambiguous"),
    ((B, 3), (-1, 2), "cannot be viewed"),
    ((B, 3), (S, 3), "elements"),
])
def test_reshape_errors(src, target, match):
    with pytest.raises(ShapeError, match=match):
        infer("reshape", [T("f32", *src)], {"shape": target})


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_reshape_agrees_with_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    perm = data.draw(st.permutations(range(len(shape))))
    target = [shape[p] for p in perm]
    if target:
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    expected = np.empty(shape).reshape(target).shape
    assert one("reshape", [T("f32", *shape)], shape=tuple(target)).shape == expected


def test_transpose_expand_squeeze_broadcast_to():
    assert one("transpose", [T("f32", B, 3, S)], perm=(2, 0, 1)).shape == (S, B, 3)
    assert one("transpose", [T("f32", 2, 3)], perm=(-1, 0)).shape == (3, 2)
    with pytest.raises(ShapeError, match="not a permutation"):
        infer("transpose", [T("f32", 2, 3)], {"perm": (0, 0)})
    assert one("expand_dims", [T("f32", B, 3)], axis=-1).shape == (B, 3, 1)
    assert one("expand_dims", [T("f32", B, 3)], axis=(0, 2)).shape == (1, B, 1, 3)
    with pytest.raises(ShapeError, match="out of range"):
        infer("expand_dims", [T("f32", 2)], {"axis": 3})
    assert one("squeeze", [T("f32", 1, B, 1, 3)]).shape == (B, 3)  # a Sym is never 1
    assert one("squeeze", [T("f32", 1, B, 1, 3)], axis=(2,)).shape == (1, B, 3)
    with pytest.raises(ShapeError, match="is not 1"):
        infer("squeeze", [T("f32", 1, B)], {"axis": (1,)})
    assert one("broadcast_to", [T("f32", B, 1)], shape=(2, -1, 4)).shape == (2, B, 4)
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer("broadcast_to", [T("f32", 3)], {"shape": (4,)})
    with pytest.raises(ShapeError, match="new leading dim"):
        infer("broadcast_to", [T("f32", 3)], {"shape": (-1, 3)})


def test_slice_and_select():
    attrs = {"begin": (0, -3, 5), "end": (None, 10, -8), "step": (1, 2, -2)}
    assert one("slice", [T("f32", B, 7, 6)], **attrs).shape == (B, 2, 3)
    assert np.empty((4, 7, 6))[:, -3:10:2, 5:-8:-2].shape[1:] == (2, 3)
    with pytest.raises(ShapeError, match="not expressible"):
        infer("slice", [T("f32", B)], {"begin": (1,), "end": (None,), "step": (1,)})
    with pytest.raises(ShapeError, match="step must not be 0"):
        infer("slice", [T("f32", 4)], {"begin": (0,), "end": (4,), "step": (0,)})
    assert one("select", [T("f32", B, 4, 5)], axis=1, index=-1).shape == (B, 5)
    with pytest.raises(ShapeError, match="index 4 out of range"):
        infer("select", [T("f32", 4)], {"axis": 0, "index": 4})


# --- data movement -----------------------------------------------------------------------------
def test_concat_sums_dims():
    assert one("concat", [T("f32", 2, 3), T("i32", 4, 3)]) == T("f32", 6, 3)
    assert one("concat", [T("f32", B, 3), T("f32", B, 3), T("f32", Sym(("B",), 2), 3)]).shape == (
        Sym(("B",), 4), 3)
    assert one("concat", [T("f32", B, 3), T("f32", 0, 3)]).shape == (B, 3)
    assert one("concat", [T("f32", B, 3), T("f32", B, 5)], axis=-1).shape == (B, 8)
    with pytest.raises(ShapeError, match="not expressible"):
        infer("concat", [T("f32", B, 3), T("f32", 2, 3)], {})
    with pytest.raises(ShapeError, match="not expressible"):
        infer("concat", [T("f32", B), T("f32", S)], {})
    with pytest.raises(ShapeError, match="differ off axis"):
        infer("concat", [T("f32", 2, 3), T("f32", 2, 4)], {})


def test_stack_split_unstack_tile():
    assert one("stack", [T("f32", B, 3), T("f32", B, 3)], axis=-1).shape == (B, 3, 2)
    with pytest.raises(ShapeError, match="differ"):
        infer("stack", [T("f32", 2), T("f32", 3)], {})
    outs = infer("split", [T("f32", B, 7)], {"axis": 1, "sizes": (2, 0, 5)})
    assert [t.shape for t in outs] == [(B, 2), (B, 0), (B, 5)]
    with pytest.raises(ShapeError, match="do not add up"):
        infer("split", [T("f32", 7)], {"sizes": (2, 4)})
    with pytest.raises(ShapeError, match="not expressible"):
        infer("split", [T("f32", B)], {"sizes": (1, 1)})
    assert [t.shape for t in infer("unstack", [T("f32", B, 3)], {"axis": 1})] == [(B,)] * 3
    with pytest.raises(ShapeError, match="must be static"):
        infer("unstack", [T("f32", B, 3)], {})
    assert one("tile", [T("f32", B, 3)], multiples=(2, 1, 3)).shape == (2, B, 9)
    assert one("tile", [T("f32", B, 3)], multiples=(2,)).shape == (B, 6)  # np.tile semantics
    assert one("tile", [T("f32", B, 3)], multiples=(2, 1)).shape == (Sym(("B",), 2), 3)


def test_gather_family():
    assert one("gather", [T("f32", 5, 7), T("i32", B, 2)], axis=1).shape == (5, B, 2)
    assert one("gather", [T("f32", 3, 7, 2), T("i64", 3, 4)], axis=1, batch_dims=1).shape == (3, 4, 2)
    with pytest.raises(ShapeError, match="integer dtype"):
        infer("gather", [T("f32", 5), T("f32", 2)], {})
    with pytest.raises(ShapeError, match="batch dims"):
        infer("gather", [T("f32", 3, 7), T("i32", 2, 4)], {"axis": 1, "batch_dims": 1})
    assert one("gather_d", [T("f32", 3, 7), T("i32", 3, 9)], dim=1).shape == (3, 9)
    with pytest.raises(ShapeError, match="larger than x"):
        infer("gather_d", [T("f32", 3, 7), T("i32", 4, 2)], {"dim": 1})
    assert one("gather_nd", [T("f32", 3, 7, 2), T("i32", B, 2)]).shape == (B, 2)
    with pytest.raises(ShapeError, match="static k"):
        infer("gather_nd", [T("f32", 3), T("i32", 2, 2)], {})
    assert one("index_select", [T("f32", 3, 7), T("i32", 4)], axis=-1).shape == (3, 4)
    assert one("scatter_add", [T("f32", 3, 7), T("i64", 2, 9), T("f32", 2, 9)], dim=1).shape == (3, 7)
    assert one("tensor_scatter_add", [T("f32", 3, 7), T("i32", 5, 1), T("f32", 5, 7)]).shape == (3, 7)
    with pytest.raises(ShapeError, match="updates"):
        infer("tensor_scatter_update", [T("f32", 3, 7), T("i32", 5, 2), T("f32", 5, 7)], {})
    assert one("unsorted_segment_sum", [T("f32", B, 4), T("i32", B)], num_segments=6).shape == (6, 4)
    assert one("gather_d_grad", [T("i64", 2, 3), T("f16", 2, 3)], dim=0, shape=(5, 3)) == T("f16", 5, 3)


def test_one_hot_pad_cumsum_tril():
    assert one("one_hot", [T("i32", B, 3), 1.0, 0.0], depth=4) == T("f32", B, 3, 4)
    assert one("one_hot", [T("i32", B, 3), T("i64"), T("i64")], depth=4, axis=0) == T("i64", 4, B, 3)
    with pytest.raises(ShapeError, match="scalars"):
        infer("one_hot", [T("i32", 3), T("f32", 2), 0.0], {"depth": 2})
    assert one("pad", [T("f32", B, 3), 0.0], pads=((0, 0), (-1, 2))).shape == (B, 4)
    with pytest.raises(ShapeError, match="not expressible"):
        infer("pad", [T("f32", B), 0.0], {"pads": ((1, 0),)})
    with pytest.raises(ShapeError, match="crop more"):
        infer("pad", [T("f32", 1), 0.0], {"pads": ((-1, -1),)})
    assert one("cumsum", [T("bool", 3)], axis=0) == T("i64", 3)
    assert one("cumsum", [T("i32", 3)], axis=0) == T("i32", 3)  # MindSpore's CumSum keeps ints
    assert one("cumsum", [T("i32", 3)], axis=0, dtype="f32") == T("f32", 3)
    with pytest.raises(ShapeError, match="rank >= 2"):
        infer("tril", [T("f32", 3)], {})


def test_cumprod_and_nan_to_num():
    assert one("cumprod", [T("i8", B, 3)], axis=-1) == T("i8", B, 3)  # in the dtype, as MindSpore's CumProd
    assert one("cumprod", [T("f16", 4)], axis=0, exclusive=True, reverse=True) == T("f16", 4)
    for bad, match in (([T("f32")], "rank >= 1"), ([T("bool", 3)], "bool"), ([T("bf16", 3)], "bf16")):
        with pytest.raises(ShapeError, match=match):
            infer("cumprod", bad, {"axis": 0, "exclusive": False, "reverse": False})
    with pytest.raises(ShapeError):
        infer("cumprod", [T("f32", 3)], {"axis": 1, "exclusive": False, "reverse": False})
    assert one("nan_to_num", [T("f16", B, 2)], posinf=1e5) == T("f16", B, 2)
    for dt in ("f64", "i32", "bool", "bf16"):  # MindSpore CPU: float16 and float32 only
        with pytest.raises(ShapeError, match="not supported"):
            infer("nan_to_num", [T(dt, 3)], {"nan": 0.0, "posinf": None, "neginf": None})
    with pytest.raises(ShapeError, match="number or None"):
        infer("nan_to_num", [T("f32", 3)], {"nan": 0.0, "posinf": "x", "neginf": None})


# --- creation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("start, end, step", [(0, 5, 1), (0, 5, 2), (5, 0, -2), (3, 3, 1), (3, 0, 1),
                                              (0.0, 1.0, 0.1), (0.5, 2.2, 0.5), (-1.25, -2.0, -0.25)])
def test_arange_length_matches_numpy(start, end, step):
    assert one("arange", [], start=start, end=end, step=step, dtype="f32").shape == (len(np.arange(start, end, step)),)


def test_creation():
    assert one("fill", [], shape=(2, B), dtype="bf16", value=1.0) == T("bf16", 2, B)
    assert one("arange", [], end=4) == T("i64", 4)
    with pytest.raises(ShapeError, match="step must not be 0"):
        infer("arange", [], {"end": 4, "step": 0})
    with pytest.raises(ShapeError, match="negative dim"):
        infer("fill", [], {"shape": (-1,), "dtype": "f32", "value": 0})


# --- matmul, convolution, pooling, dropout -----------------------------------------------------
@pytest.mark.parametrize("a, b, ta, tb, out", [
    ((2, 3), (3, 4), False, False, (2, 4)),
    ((3, 2), (3, 4), True, False, (2, 4)),
    ((2, 3), (4, 3), False, True, (2, 4)),
    ((3,), (3, 4), False, False, (4,)),
    ((2, 3), (3,), False, False, (2,)),
    ((3,), (3,), True, True, ()),
    ((B, 1, 2, 3), (5, 3, 4), False, False, (B, 5, 2, 4)),
    ((B, S, 8), (16, 8), False, True, (B, S, 16)),
])
def test_matmul(a, b, ta, tb, out):
    assert one("matmul", [T("f32", *a), T("f32", *b)], transpose_a=ta, transpose_b=tb).shape == out


def test_matmul_errors_and_dtype():
    with pytest.raises(ShapeError, match="contracted dims differ"):
        infer("matmul", [T("f32", 2, 3), T("f32", 4, 5)], {})
    with pytest.raises(ShapeError, match="cannot broadcast"):
        infer("matmul", [T("f32", 2, 2, 3), T("f32", 3, 3, 4)], {})
    assert one("matmul", [T("f16", 2, 3), T("f32", 3, 4)]).dtype == "f32"


def test_conv_and_pool_shapes():
    x = T("f32", B, 4, 9, 8)
    attrs = {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2), "groups": 2}
    # H: (9 + 1 + 0 - 3) // 2 + 1 = 4; W: (8 + 2 + 1 - (2*2 + 1)) // 1 + 1 = 7
    assert one("conv2d", [x, T("f32", 6, 2, 3, 3)], **attrs).shape == (B, 6, 4, 7)
    with pytest.raises(ShapeError, match="groups=2"):
        infer("conv2d", [x, T("f32", 6, 4, 3, 3)], {"groups": 2})
    with pytest.raises(ShapeError, match="not expressible"):
        infer("conv2d", [T("f32", 1, 4, B, 8), T("f32", 6, 4, 3, 3)], {})
    assert one("conv2d", [T("f32", 1, 4, B, 8), T("f32", 6, 4, 1, 1)]).shape == (1, 6, B, 8)
    assert one("max_pool2d", [x], kernel=3, stride=2, padding=(1, 1, 0, 1)).shape == (B, 4, 5, 4)
    assert one("avg_pool2d", [T("f32", 4, 4, 4)], kernel=(2, 2), stride=2).shape == (4, 2, 2)
    with pytest.raises(ShapeError, match="half the kernel"):
        infer("max_pool2d", [x], {"kernel": 2, "stride": 1, "padding": 2})
    with pytest.raises(ShapeError, match="larger than padded input"):
        infer("avg_pool2d", [T("f32", 1, 1, 2, 2)], {"kernel": 3, "stride": 1})


def test_bias_add_and_dropout():
    assert one("bias_add", [T("f16", B, 3, 5), T("f16", 3)]) == T("f16", B, 3, 5)
    assert one("bias_add", [T("f32", B, 5), T("f32", 5)], axis=-1) == T("f32", B, 5)
    with pytest.raises(ShapeError, match="does not match"):
        infer("bias_add", [T("f32", 2, 5), T("f32", 2)], {"axis": -1})
    assert infer("dropout", [T("f16", B, 3)], {"p": 0.1}) == [T("f16", B, 3)] * 2
    with pytest.raises(ShapeError, match="p must be in"):
        infer("dropout", [T("f32", 2)], {"p": 1.5})
