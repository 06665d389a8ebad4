"""Verifier for IR Functions and bytecode Programs. Tests run it after every transformation, and
`DYNVM_DEBUG>=1` runs it after recording.

Checked invariants:
- SSA: every register is defined once (param, input, const or one result) and before it is used;
- every op is in the op table, with the right operand and result counts;
- attributes are canonical (complete, in table order, tuples not lists);
- every result type equals what the registry's shape/dtype rule infers from the operand types
  (for ops whose rule can infer it: `call` results are taken as recorded);
- in a Program, an opaque `call` is the last instruction of its block.
"""

from __future__ import annotations

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Program, canonical_attrs
from ms_dynvm.bytecode.text import Reg


class VerifyError(ValueError):
    pass


def _check_instr(ins, defined: set, types: dict, where: str, check_types: bool) -> None:
    from ms_dynvm.ir import registry

    if ins.op not in opcodes.OPS:
        raise VerifyError(f"{where}: unknown op {ins.op!r}")
    d = opcodes.OPS[ins.op]
    if d.n_in >= 0 and len(ins.args) != d.n_in:
        raise VerifyError(f"{where}: {ins.op} takes {d.n_in} operands, got {len(ins.args)}")
    if d.n_out >= 0 and len(ins.outs) != d.n_out:
        raise VerifyError(f"{where}: {ins.op} has {d.n_out} results, got {len(ins.outs)}")
    for a in ins.args:
        if isinstance(a, Reg):
            if int(a) not in defined:
                raise VerifyError(f"{where}: %{int(a)} used before it is defined")
        elif not (a is None or isinstance(a, (bool, int, float))):
            raise VerifyError(f"{where}: bad immediate {a!r}")
    if ins.op != "call":
        try:
            canon = canonical_attrs(ins.op, ins.attrs)
        except ValueError as e:
            raise VerifyError(f"{where}: {e}") from None
        if canon != ins.attrs or list(canon) != list(ins.attrs):
            raise VerifyError(f"{where}: attributes not canonical: {ins.attrs} != {canon}")
    for r in ins.outs:
        if r in defined:
            raise VerifyError(f"{where}: %{r} defined twice")
        if r not in types:
            raise VerifyError(f"{where}: %{r} has no type")
    if check_types and ins.op not in opcodes.OPAQUE:
        arg_types = [types[int(a)] if isinstance(a, Reg) else a for a in ins.args]
        try:
            inferred = registry.infer(ins.op, arg_types, ins.attrs)
        except registry.ShapeError as e:
            raise VerifyError(f"{where}: shape rule rejects the instruction: {e}") from None
        recorded = [types[r] for r in ins.outs]
        if [(t.dtype, tuple(t.shape)) for t in inferred] != [(t.dtype, tuple(t.shape)) for t in recorded]:
            raise VerifyError(f"{where}: recorded types {recorded} but the rule infers {inferred}")
    defined.update(ins.outs)


def verify_types(types: dict, instrs) -> None:
    """Only the type rule, over `instrs` in any order: every result type of an op whose rule can
    infer it equals what the rule infers from the operand types (a program written rather than
    recorded, `bytecode/family.py`, is checked so before its kernels trust its shapes); raises
    VerifyError."""
    from ms_dynvm.ir import registry

    for ins in instrs:
        if ins.op in opcodes.OPAQUE or ins.op not in opcodes.OPS:
            if ins.op not in opcodes.OPS:
                raise VerifyError(f"unknown op {ins.op!r}")
            continue
        arg_types = [types[int(a)] if isinstance(a, Reg) else a for a in ins.args]
        try:
            inferred = registry.infer(ins.op, arg_types, ins.attrs)
        except registry.ShapeError as e:
            raise VerifyError(f"{ins.op}: shape rule rejects the instruction: {e}") from None
        if [(t.dtype, tuple(t.shape)) for t in inferred] != [(types[r].dtype, tuple(types[r].shape))
                                                             for r in ins.outs]:
            raise VerifyError(f"{ins.op}: types {[str(types[r]) for r in ins.outs]} but the rule infers "
                              f"{[str(t) for t in inferred]}")


def verify(fn, check_types: bool = True) -> None:
    """Verify an IR Function; raises VerifyError."""
    defined = set()
    for p in fn.params:
        if p in defined:
            raise VerifyError(f"@{fn.name}: param %{p} listed twice")
        if p not in fn.types:
            raise VerifyError(f"@{fn.name}: param %{p} has no type")
        defined.add(p)
    for i, ins in enumerate(fn.body):
        _check_instr(ins, defined, fn.types, f"@{fn.name}[{i}] {ins.op}", check_types)
    for r in fn.outputs:
        if r not in defined:
            raise VerifyError(f"@{fn.name}: output %{r} is not defined")


def verify_program(p: Program, check_types: bool = True) -> None:
    """Verify a whole Program; raises VerifyError."""
    defined = set()
    for inp in p.inputs:
        if inp.reg in defined:
            raise VerifyError(f"input %{inp.reg} defined twice")
        if inp.reg not in p.types:
            raise VerifyError(f"input %{inp.reg} has no type")
        defined.add(inp.reg)
    for r, arr in p.consts.items():
        if r in defined:
            raise VerifyError(f"const %{r} defined twice")
        if tuple(arr.shape) != tuple(p.types[r].shape):
            raise VerifyError(f"const %{r}: data shape {arr.shape} != type {p.types[r]}")
        defined.add(r)
    for b in p.blocks:
        for i, ins in enumerate(b.instrs):
            where = f"block {b.id}[{i}] {ins.op}"
            if ins.op == "call" and i != len(b.instrs) - 1:
                raise VerifyError(f"{where}: an opaque call must end its block")
            _check_instr(ins, defined, p.types, where, check_types)
    for r in p.outputs:
        if r not in defined:
            raise VerifyError(f"output %{r} is not defined")
