"""Signatures, automatic dynamic dims and guards."""

from hypothesis import given
from hypothesis import strategies as st

from ms_dynvm.runtime.signature import GuardFailure, InputDesc, ShapeFamily, check


def d(*shape, dtype="f32", layout="contiguous"):
    return InputDesc(dtype, tuple(shape), layout)


def test_static_until_a_dim_changes():
    fam = ShapeFamily()
    s1 = fam.observe([d(8, 784), d(8, 784)])
    assert str(s1) == "(f32[8,784], f32[8,784])" and s1.symbols() == []
    s2 = fam.observe([d(16, 784), d(16, 784)])
    assert str(s2) == "(f32[s0,784], f32[s0,784])"  # equal dims share one symbol
    s3 = fam.observe([d(5, 784), d(5, 784)])
    assert s3 == s2  # one family: same signature, so one kernel


def test_sizes_0_and_1_are_specialised():
    fam = ShapeFamily()
    fam.observe([d(8, 4)])
    fam.observe([d(9, 4)])
    assert str(fam.observe([d(1, 4)])) == "(f32[1,4])"
    assert str(fam.observe([d(0, 4)])) == "(f32[0,4])"
    assert str(fam.observe([d(30, 4)])) == "(f32[s0,4])"


def test_guards_accept_the_family_and_reject_others():
    fam = ShapeFamily()
    fam.observe([d(8, 32), d(8, 32)])
    sig = fam.observe([d(4, 64), d(4, 64)])
    guards = sig.guards()
    assert check(guards, [d(7, 100), d(7, 100)]) == {"s0": 7, "s1": 100}
    fails = {
        "dtype": [d(7, 100, dtype="f16"), d(7, 100)],
        "rank": [d(7, 100, 1), d(7, 100)],
        "layout": [d(7, 100, layout="strided"), d(7, 100)],
        "size_0_or_1": [d(1, 100), d(1, 100)],
        "symbol_mismatch": [d(7, 100), d(8, 100)],
    }
    for reason, inputs in fails.items():
        r = check(guards, inputs)
        assert isinstance(r, GuardFailure) and r.reason == reason, (reason, r)
    static = ShapeFamily().observe([d(3, 5)]).guards()
    assert check(static, [d(3, 6)]).reason == "static_dim"


def test_coincidentally_equal_dims_split_later():
    fam = ShapeFamily()
    fam.observe([d(8, 8)])
    s = fam.observe([d(16, 16)])
    assert str(s) == "(f32[s0,s0])"
    s2 = fam.observe([d(16, 32)])
    assert len(set(s2.symbols())) == 2
    assert not isinstance(check(s2.guards(), [d(5, 7)]), GuardFailure)


def test_frozen_and_marked():
    fam = ShapeFamily(frozen=True)
    fam.observe([d(8, 3)])
    assert str(fam.observe([d(9, 3)])) == "(f32[9,3])"
    fam = ShapeFamily()
    fam.mark_dynamic(0, 1)
    assert str(fam.observe([d(2, 128)])) == "(f32[2,s0])"


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=12))
def test_every_call_passes_its_own_signature_guards(shapes):
    fam = ShapeFamily()
    for a, b in shapes:
        inputs = [d(a, b), d(a, 7)]
        sig = fam.observe(inputs)
        env = check(sig.guards(), inputs)
        assert not isinstance(env, GuardFailure), (sig, inputs, env)
        for sym, val in env.items():
            assert val >= 2 and sym in sig.symbols()


def test_a_position_seen_with_another_rank():
    """A group whose ops broadcast may get another rank at an input position: the family neither
    fails nor binds a dim the call does not have; the signature has the call's rank."""
    fam = ShapeFamily()
    fam.observe([InputDesc("f32", (4, 8), "contiguous")])
    fam.observe([InputDesc("f32", (6, 8), "contiguous")])
    fam.observe([InputDesc("f32", (6, 5), "contiguous")])
    assert set(fam.dynamic) == {(0, 0), (0, 1)}
    sig = fam.observe([InputDesc("f32", (7,), "contiguous")])
    assert len(sig.inputs[0][2]) == 1
    sig = fam.observe([InputDesc("f32", (), "contiguous")])
    assert sig.inputs[0][2] == ()
    assert check(sig.guards(), [InputDesc("f32", (), "contiguous")]) == {}
