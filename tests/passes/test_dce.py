"""dce: dead pure instructions go, live, impure and multi-result ones stay; semantics preserved."""

from hypothesis import given

from ms_dynvm.ir.function import Function
from ms_dynvm.passes.dce import dce
from tests.passes.fxcheck import check_pass, elementwise_programs, parse


def test_removes_unused_chain():
    before = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %2 : f32[4,8] = exp(%0)
      %3 : f32[4,8] = mul(%2, 0.5)
      %4 : f32[4,8] = add(%0, %1)
      %5 : f32[4,8] = tanh(%4)
      return %4
    }""")
    expected = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %4 : f32[4,8] = add(%0, %1)
      return %4
    }""")
    text = before.as_text()
    after = dce(before)
    assert after == expected
    assert before.as_text() == text  # the input is not mutated
    assert set(after.types) == {0, 1, 4}  # types of removed registers are dropped
    check_pass(before, after)


def test_keeps_multi_result_op_whole_and_params():
    before = parse("""
    func @t(%0 : f32[2,8], %1 : f32[8], %2 : f32[8], %9 : f32[3]) {
      %3 : f32[2,8], %4 : f32[2,1], %5 : f32[2,1] = layer_norm(%0, %1, %2) {LN}
      %6 : f32[2,1] = sqrt(%5)
      return %3
    }""".replace("{LN}", "{begin_norm_axis=-1, begin_params_axis=-1, eps=1e-05}"))
    after = dce(before)
    assert [i.op for i in after.body] == ["layer_norm"]
    assert after.params == [0, 1, 2, 9]  # unused param %9 stays: the calling convention
    check_pass(before, after)


def test_never_removes_random_or_opaque():
    before = parse("""
    func @t(%0 : f32[4]) {
      %1 : f32[4], %2 : f32[4] = dropout(%0) {p=0.0}
      %3 : f32[4] = call(%0) {target="print"}
      %4 : f32[4] = exp(%0)
      return %0
    }""")
    after = dce(before)
    # dropout advances the RNG and call may have side effects; exp is dead.
    assert [i.op for i in after.body] == ["dropout", "call"]


def test_everything_dead():
    before = parse("""
    func @t(%0 : f32[4]) {
      %1 : f32[4] = exp(%0)
      return
    }""")
    assert dce(before) == Function.parse("func @t(%0 : f32[4]) {\n  return\n}")


@given(elementwise_programs())
def test_random_programs(fn):
    after = dce(fn)
    check_pass(fn, after, seeds=[0])
    users = after.users()
    for ins in after.body:  # every kept instruction has a used result
        assert any(r in after.outputs or r in users for r in ins.outs)
