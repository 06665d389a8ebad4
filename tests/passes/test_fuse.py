"""fuse: groups are consecutive runs with one iteration space; executing the groups' Functions one
after the other computes what the whole Function computes."""

import numpy as np
import pytest

from ms_dynvm.ir.verifier import verify
from ms_dynvm.passes.fuse import fuse
from tests.passes.fxcheck import assert_same, execute, parse, random_inputs

LN = "{begin_norm_axis=-1, begin_params_axis=-1, eps=1e-05}"
SUM1 = "{axis=(-1,), keepdims=False, dtype=None}"


def run_groups(fn, groups, inputs):
    """Execute the groups' Functions in order, passing values by register."""
    values = dict(zip(fn.params, inputs))
    for g in groups:
        outs = execute(g.function, [values[p] for p in g.function.params])
        values.update(zip(g.function.outputs, outs))
    return [values[r] for r in fn.outputs]


def check(fn, groups, all_results=False, sizes=None):
    """Structural invariants of a fusion, then the same results as the unfused Function."""
    assert [i for g in groups for i in g.instrs] == list(range(len(fn.body)))  # a partition, in order
    users = fn.users()
    for g in groups:
        assert g.instrs == list(range(g.instrs[0], g.instrs[-1] + 1))  # consecutive
        assert g.kind in ("elementwise", "reduction", "norm", "single")
        assert g.kind != "single" or len(g.instrs) == 1
        verify(g.function)
        defined = {r for i in g.instrs for r in fn.body[i].outs}
        for r in defined:
            used_later = any(u > g.instrs[-1] for u in users.get(r, ())) or r in fn.outputs
            assert (r in g.function.outputs) == (used_later or all_results)
        assert not set(g.function.params) & defined
    for seed in range(2):
        inputs = random_inputs(fn, np.random.default_rng(seed), sizes)
        assert_same(execute(fn, inputs), run_groups(fn, groups, inputs))


def shape_of(groups):
    return [(g.kind, g.instrs) for g in groups]


def test_elementwise_chain_is_one_group():
    # tanh(relu(exp(x*0.5-1)*m + x) - 0.25), m broadcast along rows
    fn = parse("""
    func @t(%0 : f32[4,8], %1 : f32[1,8]) {
      %2 : f32[4,8] = mul(%0, 0.5)
      %3 : f32[4,8] = sub(%2, 1.0)
      %4 : f32[4,8] = exp(%3)
      %5 : f32[4,8] = mul(%4, %1)
      %6 : f32[4,8] = add(%5, %0)
      %7 : f32[4,8] = relu(%6)
      %8 : f32[4,8] = sub(%7, 0.25)
      %9 : f32[4,8] = tanh(%8)
      return %9
    }""")
    [g] = fuse(fn)
    assert (g.kind, g.domain, g.axes) == ("elementwise", (4, 8), ())
    assert g.function.params == [0, 1] and g.function.outputs == [9]
    check(fn, [g])
    [g_all] = fuse(fn, all_results=True)  # tier 1: every op's result comes back
    assert g_all.function.outputs == list(range(2, 10))
    check(fn, [g_all], all_results=True)


MASKED_SOFTMAX_PRIMITIVE = f"""
    func @t(%0 : f32[B,8], %1 : bool[B,8], %20 : f32[8,8]) {{
      %2 : f32[B,8] = masked_fill(%0, %1, -inf)
      %3 : f32[B,1] = max(%2) {{axis=(-1,), keepdims=True}}
      %4 : f32[B,8] = sub(%2, %3)
      %5 : f32[B,8] = exp(%4)
      %6 : f32[B] = sum(%5) {SUM1}
      %7 : f32[B,1] = expand_dims(%6) {{axis=-1}}
      %8 : f32[B,8] = div(%5, %7)
      %9 : f32[B,8] = matmul(%8, %20) {{transpose_a=False, transpose_b=False}}
      return %9
    }}"""


@pytest.mark.parametrize("all_results", [False, True])
def test_masked_softmax_primitive_ops(all_results):
    fn = parse(MASKED_SOFTMAX_PRIMITIVE)
    groups = fuse(fn, all_results=all_results)
    assert shape_of(groups) == [("reduction", list(range(7))), ("single", [7])]
    g = groups[0]
    assert g.axes == (1,) and str(g.domain) == "(B, 8)"
    assert g.function.outputs == ([8] if not all_results else [2, 3, 4, 5, 6, 7, 8])
    check(fn, groups, all_results, sizes={"B": 5})


def test_masked_softmax_op_and_boundaries():
    fn = parse("""
    func @t(%0 : f32[4,8], %1 : bool[4,8], %2 : i64[3], %3 : f32[8,8]) {
      %4 : f32[4,8] = masked_fill(%0, %1, -1000000000.0)
      %5 : f32[4,8] = softmax(%4) {axis=-1}
      %6 : f32[4,8] = mul(%5, 2.0)
      %7 : f32[3,8] = gather(%6, %2) {axis=0, batch_dims=0}
      %8 : f32[3,8] = exp(%7)
      %9 : f32[7,8] = concat(%8, %6) {axis=0}
      %10 : f32[7,8] = matmul(%9, %3) {transpose_a=False, transpose_b=False}
      %11 : f32[7,8] = relu(%10)
      return %11, %5
    }""")
    groups = fuse(fn)
    assert shape_of(groups) == [("norm", [0, 1, 2]), ("single", [3]), ("elementwise", [4]),
                                ("single", [5]), ("single", [6]), ("elementwise", [7])]
    assert groups[0].function.outputs == [5, 6]  # %5 is an output of fn, %6 is read by gather/concat
    check(fn, groups)


def test_layer_norm_gelu():
    fn = parse(f"""
    func @t(%0 : f32[2,6,16], %1 : f32[16], %2 : f32[16]) {{
      %3 : f32[2,6,16], %4 : f32[2,6,1], %5 : f32[2,6,1] = layer_norm(%0, %1, %2) {LN}
      %6 : f32[2,6,16] = gelu(%3) {{approximate="tanh"}}
      %7 : f32[2,6,16] = add(%6, %0)
      return %7, %4
    }}""")
    [g] = fuse(fn)
    assert (g.kind, g.axes, g.function.outputs) == ("norm", (2,), [4, 7])
    check(fn, [g])


def test_layer_norm_from_primitives_then_independent_op():
    # mean, centre, var, normalise: two reductions over the same axes in one row group; the
    # unrelated `exp(%1)` after the reductions starts a new group (rule 6).
    fn = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %2 : f32[4,1] = mean(%0) {axis=(1,), keepdims=True, dtype=None}
      %3 : f32[4,8] = sub(%0, %2)
      %4 : f32[4,8] = square(%3)
      %5 : f32[4,1] = mean(%4) {axis=(1,), keepdims=True, dtype=None}
      %6 : f32[4,1] = add(%5, 1e-05)
      %7 : f32[4,1] = rsqrt(%6)
      %8 : f32[4,8] = mul(%3, %7)
      %9 : f32[4,8] = exp(%1)
      return %8, %9
    }""")
    groups = fuse(fn)
    assert shape_of(groups) == [("reduction", list(range(7))), ("elementwise", [7])]
    check(fn, groups)


def test_backward_chain_relu_grad():
    # y = relu(x @ w + b) backward: dz = relu_grad(dy, y); db = sum(dz, 0); dx = dz @ w^T; the
    # column sum's row value [16] broadcasts back right-aligned (axis 0 is a prefix).
    fn = parse("""
    func @t(%0 : f32[4,16], %1 : f32[4,16], %2 : f32[8,16]) {
      %3 : f32[4,16] = relu_grad(%0, %1)
      %4 : f32[4,16] = mul(%3, 0.5)
      %5 : f32[16] = sum(%4) {axis=(0,), keepdims=False, dtype=None}
      %6 : f32[4,16] = sub(%4, %5)
      %7 : f32[4,8] = matmul(%4, %2) {transpose_a=False, transpose_b=True}
      %8 : f32[4,8] = tanh(%7)
      %9 : f32[4,8] = tanh_grad(%8, %7)
      %10 : f32[8] = sum(%9) {axis=(0,), keepdims=False, dtype=None}
      return %6, %9, %10
    }""")
    groups = fuse(fn)
    assert shape_of(groups) == [("reduction", [0, 1, 2, 3]), ("single", [4]), ("reduction", [5, 6, 7])]
    assert groups[0].axes == (0,)
    check(fn, groups)


def test_splits():
    fn = parse(f"""
    func @t(%0 : f32[4,8], %1 : f32[8]) {{
      %2 : f32[4] = sum(%0) {SUM1}
      %3 : f32[4] = mul(%2, 2.0)
      %4 : f32[4,8] = add(%0, %1)
      %5 : f32[8] = max(%4) {{axis=(0,), keepdims=False}}
      %6 : f32[8,4] = transpose(%4) {{perm=(1, 0)}}
      %7 : f32[8,4] = exp(%6)
      %8 : f32[4,8] = exp(%4)
      %9 : f32[32] = reshape(%8) {{shape=(-1,)}}
      return %3, %5, %7, %9
    }}""")
    groups = fuse(fn)
    # [sum, its row epilogue]; add does not read the group after its reduction (rule 6) and opens
    # a group whose prologue feeds a column max; the transpose of a computed value is not an index
    # expression of that loop, so it opens a group in which its operand is an input (a load);
    # exp(%4) has a [4,8] result that does not fit that group's [8,4] loop; the reshape of a
    # computed value that changes the row-major index opens the last group.
    assert shape_of(groups) == [("reduction", [0, 1]), ("reduction", [2, 3]), ("elementwise", [4, 5]),
                                ("elementwise", [6]), ("elementwise", [7])]
    assert groups[1].axes == (0,) and groups[2].domain == (8, 4)
    check(fn, groups)


def test_views_of_inputs_are_loads():
    fn = parse("""
    func @t(%0 : f32[8,4], %1 : f32[2,2,8]) {
      %2 : f32[4,8] = transpose(%0) {perm=(1, 0)}
      %3 : f32[4,8] = reshape(%1) {shape=(4, 8)}
      %4 : f32[32] = reshape(%2) {shape=(-1,)}
      %5 : f32[1,4,8] = reshape(%4) {shape=(1, 4, 8)}
      %6 : f32[4,8] = add(%2, %3)
      %7 : f32[1,4,8] = add(%5, %6)
      return %7
    }""")
    [g] = fuse(fn)
    assert (g.kind, g.domain) == ("elementwise", (1, 4, 8))
    check(fn, [g])
    # tier 1 must write %4, which does not fit the loop over D: the group ends before its view.
    groups = fuse(fn, all_results=True)
    assert shape_of(groups) == [("elementwise", [0, 1]), ("elementwise", [2]), ("elementwise", [3, 4, 5])]
    assert groups[1].domain == (32,)
    check(fn, groups, all_results=True)


def test_empty_function():
    fn = parse("func @t(%0 : f32[4]) {\n  return %0\n}")
    assert fuse(fn) == []


# --- the fusibility rule ------------------------------------------------------------------------
def _one_op(text):
    fn = parse(text)
    return fn.body[0], fn.types


def test_fusible_by_op_name():
    from ms_dynvm.passes.fuse import fusible, fusible_ops

    assert fusible("exp") and fusible("softmax") and fusible("reshape")
    assert not fusible("matmul") and not fusible("dropout")  # a library call; an RNG draw
    assert not fusible("softmax_grad")  # a loop could, the C backend does not: the backend decides
    assert fusible("softmax_grad", backend=None)
    # MindSpore's LogSoftmax (oneDNN's) is not reproduced: fused only without eager_math
    assert not fusible("log_softmax") and fusible("log_softmax", eager_math=False)
    assert "log_softmax" not in fusible_ops() and "log_softmax" in fusible_ops(eager_math=False)
    assert fusible("matmul").reason


def test_fusible_by_instruction_and_types():
    from ms_dynvm.passes.fuse import fusible

    ins, types = _one_op("""
    func @g(%0 : f32[4,8]) {
      %1 : f32[4,8] = exp(%0)
      return %1
    }""")
    assert fusible(ins, types)
    ins, types = _one_op("""
    func @g(%0 : f64[4,8]) {
      %1 : f64[4,8] = exp(%0)
      return %1
    }""")
    v = fusible(ins, types)
    assert not v and "f64" in v.reason  # no vectorised f64 math in the C backend
    assert fusible(ins, types, backend=None)
    ins, types = _one_op("""
    func @g(%0 : f16[4,8]) {
      %1 : f16[4,8] = exp(%0)
      return %1
    }""")
    assert fusible(ins, types)  # eager_math: the kernels follow MindSpore's float16 exp
    assert not fusible(ins, types, eager_math=False)  # float32 rounded once: not eager's bits
    ins, types = _one_op("""
    func @g(%0 : bf16[4,8]) {
      %1 : bf16[4,8] = neg(%0)
      return %1
    }""")
    assert fusible(ins, types).reason == "bfloat16 tensors"


def test_the_fuse_pass_asks_the_rule():
    fn = parse("""
    func @g(%0 : f64[4,8]) {
      %1 : f64[4,8] = mul(%0, 2.0)
      %2 : f64[4,8] = exp(%1)
      %3 : f64[4,8] = add(%2, 1.0)
      return %3
    }""")
    kinds = [(g.kind, g.instrs) for g in fuse(fn)]
    # f64 exp is not computed by the C backend: a group of its own, between the other two
    assert kinds == [("elementwise", [0]), ("single", [1]), ("elementwise", [2])], kinds
    assert [(g.kind, g.instrs) for g in fuse(fn, backend=None)] == [("elementwise", [0, 1, 2])]
