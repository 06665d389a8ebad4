"""IR Function: built from a block, printed, parsed back, verified; the verifier catches broken IR."""

import pytest

from ms_dynvm.bytecode import Program, Reg, Sym, TensorType, canonical_attrs
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.ir.function import Function
from ms_dynvm.ir.verifier import VerifyError, verify, verify_program

B = Sym.of("B")


def two_block_program():
    p = Program()
    x = p.add_input(TensorType("f32", (4, 8)), "arg", "x")
    w = p.add_input(TensorType("f32", (16, 8)), "param", "w")
    b0 = p.new_block()
    [y] = p.emit(b0, "matmul", (x, w), canonical_attrs("matmul", {"transpose_b": True}),
                 [TensorType("f32", (4, 16))])
    [z] = p.emit(b0, "relu", (y,), {}, [TensorType("f32", (4, 16))])
    [dead] = p.emit(b0, "exp", (y,), {}, [TensorType("f32", (4, 16))])
    b0.end = "sync"
    b1 = p.new_block("bwd")
    [s] = p.emit(b1, "sum", (z,), canonical_attrs("sum", {"axis": (1,)}), [TensorType("f32", (4,))])
    p.outputs = [int(s)]
    return p, (x, w, y, z, dead, s)


def test_from_block_params_and_outputs():
    p, (x, w, y, z, dead, s) = two_block_program()
    verify_program(p)
    f0 = Function.from_block(p, 0)
    assert f0.params == [int(x), int(w)]
    assert f0.outputs == [int(z)]  # only what block 1 reads
    f1 = Function.from_block(p, 1)
    assert f1.params == [int(z)] and f1.outputs == [int(s)]
    verify(f0)
    verify(f1)
    assert f0.users()[int(y)] == [1, 2]
    assert f0.producers()[int(z)] == 1


def test_text_round_trip_with_symbols():
    p, _ = two_block_program()
    f = Function.from_block(p, 0, outputs=[3, 4])
    f.types = {r: t.with_shape((B,) + tuple(t.shape[1:])) if t.shape[0] == 4 else t
               for r, t in f.types.items()}
    text = f.as_text()
    assert text.startswith("func @b0(%0 : f32[B,8], %1 : f32[16,8]) {")
    assert "  %2 : f32[B,16] = matmul(%0, %1) {transpose_a=False, transpose_b=True}" in text
    g = Function.parse(text)
    assert g == f and g.as_text() == text
    verify(g)


def _fn(body, params, types, outputs):
    return Function("t", params, body, outputs, types)


def test_verifier_rejects_broken_ir():
    t = TensorType("f32", (4,))
    types = {0: t, 1: t, 2: t}
    with pytest.raises(VerifyError, match="used before"):
        verify(_fn([Instr("neg", (Reg(5),), {}, (1,))], [0], types, [1]))
    with pytest.raises(VerifyError, match="defined twice"):
        verify(_fn([Instr("neg", (Reg(0),), {}, (1,)), Instr("neg", (Reg(0),), {}, (1,))], [0], types, [1]))
    with pytest.raises(VerifyError, match="unknown op"):
        verify(_fn([Instr("frobnicate", (Reg(0),), {}, (1,))], [0], types, [1]))
    with pytest.raises(VerifyError, match="takes 1 operands"):
        verify(_fn([Instr("neg", (Reg(0), Reg(0)), {}, (1,))], [0], types, [1]))
    with pytest.raises(VerifyError, match="not canonical|missing"):
        verify(_fn([Instr("sum", (Reg(0),), {"axis": None}, (1,))], [0], types, [1]))
    with pytest.raises(VerifyError, match="rule infers"):
        bad = {0: t, 1: TensorType("f32", (5,))}
        verify(_fn([Instr("neg", (Reg(0),), {}, (1,))], [0], bad, [1]))
    with pytest.raises(VerifyError, match="output %9"):
        verify(_fn([Instr("neg", (Reg(0),), {}, (1,))], [0], types, [9]))
    with pytest.raises(VerifyError, match="shape rule rejects"):
        bad = {0: t, 1: TensorType("f32", (3,)), 2: t}
        verify(_fn([Instr("add", (Reg(0), Reg(1)), {}, (2,))], [0, 1], bad, [2]))


def test_verify_program_call_must_end_block():
    p = Program()
    x = p.add_input(TensorType("f32", (2,)))
    b = p.new_block()
    [y] = p.emit(b, "call", (x,), {"target": "Foo"}, [TensorType("f32", (2,))])
    p.emit(b, "neg", (y,), {}, [TensorType("f32", (2,))])
    with pytest.raises(VerifyError, match="must end its block"):
        verify_program(p)
