"""shapes: generalize marked param dims to symbols and re-infer; bind symbols from concrete shapes."""

import numpy as np
import pytest

from ms_dynvm.ir.verifier import verify
from ms_dynvm.passes.shapes import BindError, GeneralizeError, bind, generalize, symbols
from tests.passes.fxcheck import assert_same, execute, parse, random_inputs



def mlp(b: int) -> str:
    return f"""
func @t(%0 : f32[{b},6,8], %1 : f32[{b},6], %2 : f32[16,8]) {{
  %3 : f32[{6 * b},8] = reshape(%0) {{shape=(-1, 8)}}
  %4 : f32[{6 * b},16] = matmul(%3, %2) {{transpose_a=False, transpose_b=True}}
  %5 : f32[{b},6,16] = reshape(%4) {{shape=(-1, 6, 16)}}
  %6 : f32[{b},6,1] = expand_dims(%1) {{axis=-1}}
  %7 : f32[{b},6,16] = mul(%5, %6)
  %8 : f32[{b},16] = sum(%7) {{axis=(1,), keepdims=False, dtype=None}}
  %9 : f32[{b},16] = softmax(%8) {{axis=-1}}
  return %9
}}"""


def test_generalize_named_symbols():
    fn = parse(mlp(4))
    g = generalize(fn, {(0, 0): "B", (1, 0): "B"})
    verify(g)
    assert str(g.types[0]) == "f32[B,6,8]" and str(g.types[1]) == "f32[B,6]"
    assert str(g.types[3]) == "f32[6*B,8]" and str(g.types[9]) == "f32[B,16]"
    assert symbols(g) == ["B"]
    assert bind(g, [(3, 6, 8), (3, 6), (16, 8)]) == {"B": 3}
    # one generalized Function computes, at another size, what the recorded ops compute there
    small = parse(mlp(3))
    inputs = random_inputs(small, np.random.default_rng(0))
    assert_same(execute(small, inputs), execute(g, inputs))
    assert fn.types[0].shape == (4, 6, 8)  # input not mutated


def test_generalize_auto_names_and_independent_symbols():
    fn = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %2 : f32[4,8] = exp(%0)
      %3 : f32[4] = sum(%2) {axis=(1,), keepdims=False, dtype=None}
      return %3, %1
    }""")
    g = generalize(fn, {0: {0, 1}, 1: {0}})
    assert [str(g.types[r]) for r in (0, 1, 3)] == ["f32[s0,s1]", "f32[s2,8]", "f32[s0]"]
    with pytest.raises(GeneralizeError, match="broadcast"):
        generalize(parse("""
        func @t(%0 : f32[4,8], %1 : f32[4,8]) {
          %2 : f32[4,8] = add(%0, %1)
          return %2
        }"""), {0: {0}, 1: {0}})  # s0 and s1 are different symbols: not provably equal


@pytest.mark.parametrize("body,dynamic,match", [
    ("%1 : f32[4,8] = reshape(%0) {shape=(4, 8)}", {(0, 0): "B"}, "elements"),
    ("%1 : f32[2,8] = slice(%0) {begin=(0, 0), end=(2, 8), step=(1, 1)}", {(0, 0): "B"}, "not expressible"),
    ('%1 : f32[4,8] = fill() {shape=(4, 8), dtype="f32", value=0.0}', {(0, 0): "B"}, "recorded size"),
    ("%1 : f32[4,8] = exp(%0)", {(0, 0): "B", (0, 1): "B"}, "sizes 4 and 8"),
    ("%1 : f32[4,8] = exp(%0)", {(0, 2): "B"}, "no axis"),
    ('%1 : f32[4,8] = call(%0) {target="f"}', {(0, 0): "B"}, "opaque"),
])
def test_generalize_refuses(body, dynamic, match):
    fn = parse(f"func @t(%0 : f32[4,8]) {{\n  {body}\n  return %1\n}}")
    with pytest.raises(GeneralizeError, match=match):
        generalize(fn, dynamic)


def test_size_one_is_never_symbolic():
    fn = parse("func @t(%0 : f32[1,8]) {\n  %1 : f32[1,8] = exp(%0)\n  return %1\n}")
    with pytest.raises(GeneralizeError, match="specialised"):
        generalize(fn, {(0, 0): "B"})


def test_bind():
    fn = parse("func @t(%0 : f32[B,S], %1 : f32[B*S,4], %2 : f32[2*S]) {\n  return %0\n}")
    assert bind(fn, [(2, 5), (10, 4), (10,)]) == {"B": 2, "S": 5}
    assert bind(fn, {0: (3, 7), 1: (21, 4), 2: (14,)}) == {"B": 3, "S": 7}
    with pytest.raises(BindError, match="axis 0 .* size 12, but B\\*S = 10"):
        bind(fn, [(2, 5), (12, 4), (10,)])
    with pytest.raises(BindError, match="size 5, expected 4"):
        bind(fn, [(2, 5), (10, 5), (10,)])
    with pytest.raises(BindError, match="rank"):
        bind(fn, [(2, 5, 1), (10, 4), (10,)])
    with pytest.raises(BindError, match="specialised"):
        bind(fn, [(1, 5), (5, 4), (10,)])
    odd = parse("func @t(%0 : f32[2*S]) {\n  return %0\n}")
    with pytest.raises(BindError, match="not a multiple"):
        bind(odd, [(7,)])
    square = parse("func @t(%0 : f32[B*B]) {\n  return %0\n}")
    with pytest.raises(BindError, match="cannot solve"):
        bind(square, [(9,)])
