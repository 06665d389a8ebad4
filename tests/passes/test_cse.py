"""cse: equal pure instructions merge, outputs follow the survivor, impure ops never merge."""

from hypothesis import given

from ms_dynvm.passes.cse import cse
from tests.passes.fxcheck import check_pass, elementwise_programs, parse


def test_merges_and_rewrites_outputs():
    before = parse("""
    func @t(%0 : f32[4,8], %1 : f32[1,8]) {
      %2 : f32[4,8] = mul(%0, %1)
      %3 : f32[4,8] = mul(%0, %1)
      %4 : f32[4,8] = exp(%2)
      %5 : f32[4,8] = exp(%3)
      %6 : f32[4,8] = add(%4, %5)
      return %6, %3, %5
    }""")
    expected = parse("""
    func @t(%0 : f32[4,8], %1 : f32[1,8]) {
      %2 : f32[4,8] = mul(%0, %1)
      %4 : f32[4,8] = exp(%2)
      %6 : f32[4,8] = add(%4, %4)
      return %6, %2, %4
    }""")
    after = cse(before)
    assert after == expected
    check_pass(before, after)


def test_outputs_may_repeat():
    before = parse("""
    func @t(%0 : f32[4]) {
      %1 : f32[4] = neg(%0)
      %2 : f32[4] = neg(%0)
      return %1, %2
    }""")
    after = cse(before)
    assert after.outputs == [1, 1] and len(after.body) == 1
    check_pass(before, after)


def test_immediates_compared_by_type_and_bits():
    # x + 0.0 and x + (-0.0) differ for x = -0.0; mul by 1 and by 1.0 are kept apart as well.
    before = parse("""
    func @t(%0 : f32[8]) {
      %1 : f32[8] = add(%0, 0.0)
      %2 : f32[8] = add(%0, -0.0)
      %3 : f32[8] = mul(%0, 1)
      %4 : f32[8] = mul(%0, 1.0)
      %5 : f32[8] = add(%0, nan)
      %6 : f32[8] = add(%0, nan)
      return %1, %2, %3, %4, %5, %6
    }""")
    after = cse(before)
    assert [i.outs[0] for i in after.body] == [1, 2, 3, 4, 5]  # NaN immediates are equal
    assert after.outputs == [1, 2, 3, 4, 5, 5]
    check_pass(before, after)


def test_attributes_matter_and_impure_ops_do_not_merge():
    before = parse("""
    func @t(%0 : f32[4,8]) {
      %1 : f32[4] = sum(%0) {axis=(1,), keepdims=False, dtype=None}
      %2 : f32[8] = sum(%0) {axis=(0,), keepdims=False, dtype=None}
      %3 : f32[4,8], %4 : f32[4,8] = dropout(%0) {p=0.5}
      %5 : f32[4,8], %6 : f32[4,8] = dropout(%0) {p=0.5}
      return %1, %2, %3, %5
    }""")
    after = cse(before)
    assert after == before


@given(elementwise_programs())
def test_random_programs(fn):
    after = cse(fn)
    check_pass(fn, after, seeds=[0])
    keys = [(i.op, i.args, tuple(i.attrs.items())) for i in after.body]
    assert len(keys) == len(set(map(repr, keys)))  # no duplicate left
