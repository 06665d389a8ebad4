"""fold: elementwise ops and views over splat constants (fill/full_like, immediates) become `fill`s
whose value the reference interpreter computed."""

import math

import numpy as np

from ms_dynvm.passes.dce import dce
from ms_dynvm.passes.fold import fold
from tests.passes.fxcheck import check_pass, parse


def test_fill_chain_folds_to_one_fill():
    before = parse("""
    func @t(%0 : f32[4,8]) {
      %1 : f32[4,8] = fill() {shape=(4, 8), dtype="f32", value=2.0}
      %2 : f32[4,8] = mul(%1, 3.0)
      %3 : f32[4,8] = sub(%2, 0.5)
      %4 : f32[4,8] = add(%0, %3)
      return %4
    }""")
    expected = parse("""
    func @t(%0 : f32[4,8]) {
      %3 : f32[4,8] = fill() {shape=(4, 8), dtype="f32", value=5.5}
      %4 : f32[4,8] = add(%0, %3)
      return %4
    }""")
    after = fold(before)
    assert dce(after) == expected
    check_pass(before, after)


def test_full_like_views_casts_and_rounding():
    # full_like's shape comes from a non-constant tensor but its value is known; 0.1 rounds to f16.
    before = parse("""
    func @t(%0 : f32[2,3]) {
      %1 : f32[2,3] = full_like(%0) {value=0.1, dtype=None}
      %2 : f32[3,2] = transpose(%1) {perm=(1, 0)}
      %3 : f16[3,2] = cast(%2) {dtype="f16"}
      %4 : f16[6] = reshape(%3) {shape=(-1,)}
      %5 : f16[6] = exp(%4)
      return %5
    }""")
    after = dce(fold(before))
    [ins] = after.body
    assert ins.op == "fill" and ins.attrs["dtype"] == "f16" and ins.attrs["shape"] == (6,)
    assert ins.attrs["value"] == float(np.float16(np.exp(np.float64(np.float16(np.float32(0.1))))))
    check_pass(before, after)


def test_special_values_and_integers():
    before = parse("""
    func @t(%0 : f32[3]) {
      %1 : f32[3] = fill() {shape=(3,), dtype="f32", value=1.0}
      %2 : f32[3] = fill() {shape=(3,), dtype="f32", value=0.0}
      %3 : f32[3] = div(%1, %2)
      %4 : f32[3] = sub(%3, %3)
      %5 : i32[3] = fill() {shape=(3,), dtype="i32", value=7}
      %6 : i32[3] = floor_div(%5, -2)
      %7 : bool[3] = isnan(%4)
      %8 : f32[] = fill() {shape=(), dtype="f32", value=-0.0}
      %9 : f32[3] = mul(%8, %1)
      return %3, %4, %6, %7, %9
    }""")
    after = dce(fold(before))
    values = [i.attrs["value"] for i in after.body]
    assert values[0] == math.inf and math.isnan(values[1]) and values[2] == -4 and values[3] is True
    assert math.copysign(1.0, values[4]) == -1.0
    check_pass(before, after)


def test_not_folded():
    # A non-constant operand, a reduction (sum of a splat rounds differently from n*a), a symbolic
    # result shape (fill needs a static shape) and an RNG op stay as they are.
    before = parse("""
    func @t(%0 : f32[B,4]) {
      %1 : f32[B,4] = full_like(%0) {value=1.0, dtype=None}
      %2 : f32[B,4] = mul(%1, 2.0)
      %3 : f32[4] = fill() {shape=(4,), dtype="f32", value=0.1}
      %4 : f32[] = sum(%3) {axis=None, keepdims=False, dtype=None}
      %5 : f32[4] = add(%3, %4)
      %6 : f32[4], %7 : f32[4] = dropout(%3) {p=0.5}
      return %2, %5, %6
    }""")
    assert fold(before) == before


def test_input_not_mutated():
    before = parse("""
    func @t() {
      %1 : f32[2] = fill() {shape=(2,), dtype="f32", value=2.0}
      %2 : f32[2] = square(%1)
      return %2
    }""")
    text = before.as_text()
    after = fold(before)
    assert before.as_text() == text
    assert after.body[1].op == "fill" and after.body[1].attrs["value"] == 4.0
    check_pass(before, after)
