"""Bytecode: text form round trip, file format round trip, literal edge cases, bad input."""

import math
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ms_dynvm.bytecode import Program, Reg, Sym, TensorType, canonical_attrs, load_program, parse_type
from ms_dynvm.bytecode.text import format_literal, parse_instr, parse_literal


def small_program():
    p = Program()
    x = p.add_input(TensorType("f32", (4, 784)), "arg", "x")
    w = p.add_input(TensorType("f32", (256, 784)), "param", "fc1.weight")
    m = p.add_input(TensorType("bool", (4, 256), "strided"), "tensor", "")
    c = p.add_const(np.array([0.5, np.nan, -np.inf], np.float32))
    b = p.new_block("fwd", "MLP")
    [y] = p.emit(b, "matmul", (x, w), canonical_attrs("matmul", {"transpose_b": True}),
                 [TensorType("f32", (4, 256))])
    [z] = p.emit(b, "masked_fill", (y, m, -1e4), {}, [TensorType("f32", (4, 256))])
    b.end = "sync"
    b2 = p.new_block("bwd", "")
    [v, i] = p.emit(b2, "max_with_index", (z,), canonical_attrs("max_with_index", {"axis": 1}),
                    [TensorType("f32", (4,)), TensorType("i64", (4,))])
    b2.end = "end"
    p.outputs = [int(z), int(v), int(i)]
    return p, c


def test_text_round_trip():
    p, _ = small_program()
    text = p.as_text()
    assert "%4 : f32[4,256] = matmul(%0, %1) {transpose_a=False, transpose_b=True}" in text
    assert 'input %2 : bool[4,256]@strided {kind="tensor", name=""}' in text
    q = Program.parse(text)
    assert q == p
    assert q.as_text() == text


def test_file_round_trip(tmp_path):
    p, c = small_program()
    path = tmp_path / "p.dvm"
    p.save(path)
    q = load_program(path)
    assert q == p
    assert np.isnan(q.consts[int(c)][1]) and q.consts[int(c)][2] == -np.inf
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_file_rejects_other_documents(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "something", "version": 1}')
    with pytest.raises(ValueError, match="not an ms_dynvm program"):
        load_program(path)
    path.write_text('{"format": "ms_dynvm.program", "version": 99}')
    with pytest.raises(ValueError, match="version"):
        load_program(path)


@pytest.mark.parametrize("dtype,values", [
    ("bool", [True, False]), ("i64", [-(2**62), 3]), ("i8", [-128, 127]), ("u8", [0, 255]),
    ("f16", [0.1, 65504.0]), ("f64", [1e-300, -0.0]), ("f32", [np.float32(1e-45), np.inf]),
])
def test_consts_all_dtypes_round_trip(tmp_path, dtype, values):
    from ms_dynvm import dtypes

    p = Program()
    r = p.add_const(np.array(values, dtype=dtypes.to_numpy(dtype)), dtype)
    p.outputs = [int(r)]
    assert Program.parse(p.as_text()) == p
    p.save(tmp_path / "c.dvm")
    q = load_program(tmp_path / "c.dvm")
    assert q == p
    assert q.consts[int(r)].tobytes() == p.consts[int(r)].tobytes()


def test_literals():
    for v in [None, True, False, 0, -7, 1.5, -0.0, 1e-45, 3.4028234663852886e38, "a\"b\\n", (),
              (1,), (1, (2, 3), None), math.inf, -math.inf]:
        back = parse_literal(format_literal(v))
        assert back == v and type(back) is type(v), (v, back)
    assert math.isnan(parse_literal(format_literal(math.nan)))
    assert parse_literal("%12") == Reg(12) and isinstance(parse_literal("%12"), Reg)


@given(st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=10))
def test_literal_round_trip_property(v):
    back = parse_literal(format_literal(v))
    assert back == v


def test_types_and_symbols():
    t = parse_type("f32[2*B*S,3]@strided")
    assert t.shape == (Sym(("B", "S"), 2), 3) and t.layout == "strided"
    assert str(t) == "f32[2*B*S,3]@strided"
    assert parse_type("i64[]").shape == ()
    with pytest.raises(ValueError):
        parse_type("q32[3]")
    with pytest.raises(ValueError):
        parse_type("f32[3")


def test_parse_errors_name_the_line():
    bad = "program version=1\ninput %0 : f32[2] {kind=\"arg\", name=\"x\"}\nblock 0\n  %1 : f32[2] = neg(%0\n"
    with pytest.raises(ValueError, match="line 4"):
        Program.parse(bad)
    with pytest.raises(ValueError, match="outside a block"):
        Program.parse("program version=1\n%1 : f32[2] = neg(%0)\n")
    with pytest.raises(ValueError, match="unsupported header"):
        Program.parse("program version=7\n")


def test_parse_instr_multi_result():
    outs, types, op, args, attrs = parse_instr(
        "%5 : f32[4,8], %6 : i64[4,8] = max_with_index(%1) {axis=1, keepdims=False}")
    assert outs == [5, 6] and [str(t) for t in types] == ["f32[4,8]", "i64[4,8]"]
    assert op == "max_with_index" and args == (Reg(1),) and attrs == {"axis": 1, "keepdims": False}


def test_canonical_attrs_rejects_unknown_and_missing():
    with pytest.raises(ValueError, match="unknown attribute"):
        canonical_attrs("add", {"alpha": 2})
    with pytest.raises(ValueError, match="missing attribute"):
        canonical_attrs("reshape", {})
    assert canonical_attrs("sum", {"axis": [1, 2]}) == {"axis": (1, 2), "keepdims": False, "dtype": None}


def test_zero_d_const_keeps_its_shape(tmp_path):
    """A 0-d constant is stored 0-d (np.ascontiguousarray made it shape (1,) under type i32[]):
    interpreted, saved and loaded, and parsed back from text as a 0-d value."""
    from ms_dynvm.runtime.interpreter import interpret

    p = Program()
    c = p.add_const(np.array(7, np.int32))
    p.outputs = [int(c)]
    assert p.consts[int(c)].shape == () and interpret(p, [])[0].shape == ()
    assert Program.parse(p.as_text()) == p
    path = str(tmp_path / "c.dvm")
    p.save(path)
    q = load_program(path)
    assert q == p and interpret(q, [])[0].shape == () and int(interpret(q, [])[0]) == 7


def test_load_program_rejects_foreign_and_damaged_files(tmp_path):
    """Another JSON document, a damaged text or consts section, or constants that disagree with the
    declared types: ValueError naming the problem (AttributeError/KeyError escaped, and mismatched
    constants loaded silently)."""
    import base64
    import json

    p = Program()
    x = p.add_input(parse_type("f32[2,3]"))
    c = p.add_const(np.array([1.0, 2.0, 3.0], np.float32))
    [y] = p.emit(p.new_block(), "add", (x, c), {}, [parse_type("f32[2,3]")])
    p.outputs = [int(y)]
    good = str(tmp_path / "good.dvm")
    p.save(good)
    doc = json.load(open(good))
    i64 = base64.b64encode(np.array([5, 6], np.int64).tobytes()).decode()
    bad = {"list": [1, 2], "null": None, "text_is_int": {**doc, "text": 5},
           "no_text": {"format": doc["format"], "version": doc["version"]}, "consts_list": {**doc, "consts": [1]},
           "const_dtype": {**doc, "consts": {"1": {"dtype": "i64", "shape": [2], "data": i64}}},
           "const_reg": {**doc, "consts": {"9": doc["consts"]["1"]}},
           "const_bytes": {**doc, "consts": {"1": {**doc["consts"]["1"], "data": "AAAA"}}}}
    for name, obj in bad.items():
        f = str(tmp_path / f"{name}.dvm")
        json.dump(obj, open(f, "w"))
        with pytest.raises(ValueError):
            load_program(f)
    open(str(tmp_path / "trunc.dvm"), "w").write(open(good).read()[:40])
    with pytest.raises(ValueError):
        load_program(str(tmp_path / "trunc.dvm"))
    assert load_program(good) == p
