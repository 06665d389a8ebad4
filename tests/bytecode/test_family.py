"""Size families (bytecode/family.py): numbers explained by the input dims, written at new dims."""

from __future__ import annotations

import numpy as np
import pytest

from ms_dynvm.bytecode.family import SizeFamily, split_numbers
from ms_dynvm.bytecode.program import Program
from ms_dynvm.ir.verifier import VerifyError, verify_types


def _text(b, s, d=64, scale="0.125", extra=""):
    return (f"input %0 : f32[{b},{s},{d}]\n"
            f"  %1 : f32[{b * s},{d}] = reshape(%0) {{shape=({b * s}, {d})}}\n"
            f"  %2 : f32[{b},{s + 1},{d}] = concat(%0, %0) {{axis=1}}\n"
            f"  %3 : f32[] = fill() {{value={scale}}}{extra}\n")


def _fam(*members):
    sf = SizeFamily(split_numbers(members[0][1])[0])
    for dims, text in members:
        assert sf.add(dims, text)
    return sf


def test_split_numbers_roundtrip_and_skips_registers_and_words():
    text = 'input %12 : f32[4,784] {name="fc1.weight"} = (1e-05, -0.5)'
    lits, nums = split_numbers(text)
    assert nums == ["4", "784", "1e-05", "-0.5"]  # (%12, f32 and fc1 are not numbers)
    out = lits[0] + "".join(n + lit for n, lit in zip(nums, lits[1:]))
    assert out == text


def test_products_and_offsets_of_dims_are_written_at_new_dims():
    sf = _fam(((8, 32, 64), _text(8, 32)), ((4, 32, 64), _text(4, 32)), ((4, 64, 64), _text(4, 64)))
    assert sf.instantiate((2, 16, 64)) == _text(2, 16)
    assert sf.instantiate((1, 1, 64)) == _text(1, 1)


def test_one_member_or_undistinguished_dims_determine_nothing():
    one = _fam(((8, 32, 64), _text(8, 32)))
    assert one.instantiate((4, 32, 64)) is None
    # b and s change together in every member: b * s and b * b (or s * s / 4 ...) explain the
    # reshape alike, and disagree at (3, 16).
    two = _fam(((4, 8, 64), _text(4, 8)), ((8, 16, 64), _text(8, 16)))
    assert two.instantiate((3, 16, 64)) is None
    # A dim that was the same in every member is not known to be free.
    sf = _fam(((8, 32, 64), _text(8, 32)), ((4, 32, 64), _text(4, 32)), ((4, 64, 64), _text(4, 64)))
    assert sf.instantiate((4, 32, 128)) is None
    assert sf.instantiate((8, 32, 64)) is None  # (a member's own size: its recording is installed)


def test_a_number_no_rule_explains_is_not_written():
    # scale = 1 / sqrt(s): no product, offset or reciprocal of dims gives it
    texts = [((8, s, 64), _text(8, s, scale=repr(float(np.float32(1 / np.sqrt(s)))))) for s in (16, 32, 64)]
    texts.append(((4, 32, 64), _text(4, 32, scale=repr(float(np.float32(1 / np.sqrt(32)))))))
    sf = _fam(*texts)
    assert sf.instantiate((2, 48, 64)) is None


@pytest.mark.parametrize("rounding", [np.float32, np.float64])
def test_a_mean_backward_scale_one_over_n_is_reproduced_exactly(rounding):
    def scale(b, s):
        return repr(float(rounding(1.0) / rounding(b * s)))

    sf = _fam(*[((b, s, 64), _text(b, s, scale=scale(b, s))) for b, s in ((8, 32), (4, 32), (4, 48))])
    assert sf.instantiate((3, 7, 64)) == _text(3, 7, scale=scale(3, 7))


def test_a_broken_family_writes_nothing_and_other_text_is_refused():
    sf = _fam(((8, 32, 64), _text(8, 32)), ((4, 32, 64), _text(4, 32)), ((4, 64, 64), _text(4, 64)))
    assert not sf.add((2, 2, 64), _text(2, 2).replace("concat", "stack"))
    sf.broken = True
    assert sf.instantiate((2, 16, 64)) is None


PROG = """program version=1
input %0 : f32[{b},3] {{kind="arg", name="x"}}
block 0 {{phase="fwd", region="", end="end"}}
  %1 : f32[{b},3] = neg(%0)
  %2 : f32[{n}] = reshape(%1) {{shape=({n},)}}
output %2
"""


def test_verify_types_refuses_a_written_program_whose_types_do_not_follow():
    good = Program.parse(PROG.format(b=4, n=12))
    verify_types(good.types, good.instrs())
    bad = Program.parse(PROG.format(b=4, n=16))  # (reshape of 12 elements to 16)
    with pytest.raises(VerifyError):
        verify_types(bad.types, bad.instrs())
