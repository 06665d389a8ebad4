"""simplify: each rule fires where the result is bit-identical (same type, NaN/Inf/-0.0 included) and
stays put where it is not."""

import pytest
from hypothesis import given

from ms_dynvm.passes.dce import dce
from ms_dynvm.passes.simplify import simplify
from tests.passes.fxcheck import check_pass, elementwise_programs, parse

HEAD = "func @t(%0 : f32[4,8], %1 : f32[1,8], %2 : i32[4,8], %3 : bool[4,8]) {"


def _fn(lines: str, ret: str) -> str:
    return f"{HEAD}\n{lines}\n  return {ret}\n}}"


def run(before_text: str):
    before = parse(before_text)
    after = dce(simplify(before))
    check_pass(before, after)
    return after


# (name, body lines, returned register, expected body lines, expected return)
CASES = [
    ("x*1", "%4 : f32[4,8] = mul(%0, 1.0)", "%4", "", "%0"),
    ("1*x int", "%4 : i32[4,8] = mul(1, %2)", "%4", "", "%2"),
    ("x/1", "%4 : f32[4,8] = div(%0, 1)", "%4", "", "%0"),
    ("x-0", "%4 : f32[4,8] = sub(%0, 0.0)", "%4", "", "%0"),
    ("x+(-0.0)", "%4 : f32[4,8] = add(-0.0, %0)", "%4", "", "%0"),
    ("int x+0", "%4 : i32[4,8] = add(%2, 0)", "%4", "", "%2"),
    ("bool x+False", "%4 : bool[4,8] = add(%3, False)", "%4", "", "%3"),
    ("x*-1", "%4 : f32[4,8] = mul(%0, -1.0)", "%4", "%4 : f32[4,8] = neg(%0)", "%4"),
    ("x/-1", "%4 : f32[4,8] = div(%0, -1.0)", "%4", "%4 : f32[4,8] = neg(%0)", "%4"),
    ("neg neg", "%4 : f32[4,8] = neg(%0)\n%5 : f32[4,8] = neg(%4)\n%6 : f32[4,8] = neg(%5)\n"
     "%7 : f32[4,8] = neg(%6)", "%7", "", "%0"),
    ("not not", "%4 : bool[4,8] = logical_not(%3)\n%5 : bool[4,8] = logical_not(%4)", "%5", "", "%3"),
    ("cast same", "%4 : f32[4,8] = cast(%0) {dtype=\"f32\"}", "%4", "", "%0"),
    ("where same", "%4 : f32[4,8] = where(%3, %0, %0)", "%4", "", "%0"),
    ("ones splat", "%4 : f32[4,8] = full_like(%0) {value=1.0, dtype=None}\n%5 : f32[4,8] = mul(%4, %0)",
     "%5", "", "%0"),
    ("reshape reshape", "%4 : f32[32] = reshape(%0) {shape=(-1,)}\n%5 : f32[8,4] = reshape(%4) {shape=(8, 4)}",
     "%5", "%5 : f32[8,4] = reshape(%0) {shape=(8, 4)}", "%5"),
    ("reshape back", "%4 : f32[32] = reshape(%0) {shape=(-1,)}\n%5 : f32[4,8] = reshape(%4) {shape=(4, 8)}",
     "%5", "", "%0"),
    ("squeeze expand", "%4 : f32[4,1,8] = expand_dims(%0) {axis=1}\n%5 : f32[4,8] = squeeze(%4) {axis=(1,)}",
     "%5", "", "%0"),
    ("expand then reshape", "%4 : f32[1,4,8] = expand_dims(%0) {axis=0}\n"
     "%5 : f32[2,16] = reshape(%4) {shape=(2, 16)}", "%5", "%5 : f32[2,16] = reshape(%0) {shape=(2, 16)}", "%5"),
    ("transpose pair", "%4 : f32[8,4] = transpose(%0) {perm=(1, 0)}\n%5 : f32[4,8] = transpose(%4) {perm=(-1, 0)}",
     "%5", "", "%0"),
    ("broadcast_to same", "%4 : f32[4,8] = broadcast_to(%0) {shape=(4, -1)}", "%4", "", "%0"),
    ("full slice", "%4 : f32[4,8] = slice(%0) {begin=(0, 0), end=(4, 100), step=(1, 1)}", "%4", "", "%0"),
]


@pytest.mark.parametrize("name,body,ret,exp_body,exp_ret", CASES, ids=[c[0] for c in CASES])
def test_rule(name, body, ret, exp_body, exp_ret):
    after = run(_fn(body, ret))
    assert after == parse(_fn(exp_body, exp_ret))


def test_transpose_composition():
    # y = x.T(p), z = y.T(q) -> x.T(r) with r[j] = p[q[j]]
    text = """
    func @t(%0 : f32[2,3,4]) {
      %1 : f32[3,4,2] = transpose(%0) {perm=(1, 2, 0)}
      %2 : f32[4,3,2] = transpose(%1) {perm=(1, 0, 2)}
      return %2
    }"""
    after = run(text)
    assert after == parse("""
    func @t(%0 : f32[2,3,4]) {
      %2 : f32[4,3,2] = transpose(%0) {perm=(2, 1, 0)}
      return %2
    }""")


NOT_SIMPLIFIED = [
    # x + 0.0 is not x for x = -0.0 (-0.0 + 0.0 = +0.0); x - (-0.0) likewise
    ("x+0.0 float", "%4 : f32[4,8] = add(%0, 0.0)"),
    ("x-(-0.0) float", "%4 : f32[4,8] = sub(%0, -0.0)"),
    ("int 0 is +0.0", "%4 : f32[4,8] = add(%0, 0)"),
    # x * 0 -> 0 is wrong for NaN/Inf
    ("x*0", "%4 : f32[4,8] = mul(%0, 0.0)"),
    ("x-x", "%4 : f32[4,8] = sub(%0, %0)"),
    # the dtype or the shape would change
    ("i32 * 1.0 is f32", "%4 : f32[4,8] = mul(%2, 1.0)"),
    ("broadcast by ones", "%4 : f32[4,8] = full_like(%0) {value=1.0, dtype=None}\n%5 : f32[4,8] = mul(%1, %4)"),
    ("i32 / 1 is f32", "%4 : f32[4,8] = div(%2, 1)"),
    ("cast changes dtype", "%4 : f16[4,8] = cast(%0) {dtype=\"f16\"}"),
    ("bool * -1 is not neg", "%4 : i64[4,8] = mul(%3, -1)"),
    ("reversing slice", "%4 : f32[4,8] = slice(%0) {begin=(0, 7), end=(4, -100), step=(1, -1)}"),
    ("transpose", "%4 : f32[8,4] = transpose(%0) {perm=(1, 0)}"),
    ("where other", "%4 : f32[4,8] = where(%3, %0, %1)"),
    ("where x vs immediate 0", "%4 : f32[4,8] = where(%3, %0, 0.0)"),  # Reg(0) == 0.0 in Python
]


@pytest.mark.parametrize("name,body", NOT_SIMPLIFIED, ids=[c[0] for c in NOT_SIMPLIFIED])
def test_not_simplified(name, body):
    last = body.split("\n")[-1].split(" :")[0]
    before = parse(_fn(body, last))
    after = simplify(before)
    assert after == before
    check_pass(before, after)


def test_complex_left_alone():
    before = parse("""
    func @t(%0 : c64[4]) {
      %1 : c64[4] = mul(%0, 1.0)
      return %1
    }""")
    assert simplify(before) == before


def test_input_not_mutated():
    before = parse(_fn("%4 : f32[4,8] = neg(%0)\n%5 : f32[4,8] = neg(%4)", "%5, %4"))
    text = before.as_text()
    after = simplify(before)
    assert before.as_text() == text and after.outputs == [0, 4]


@given(elementwise_programs())
def test_random_programs(fn):
    after = simplify(fn)
    check_pass(fn, after, seeds=[0, 1])
    assert len(dce(after).body) <= len(dce(fn).body)
