"""SSA IR: one `Function` per basic block.

A Function has typed parameters (the registers the block reads but does not define: program inputs,
constants, results of earlier blocks), a body of `Instr` in topological order, each register defined
once, and outputs (the registers the rest of the program, or Python, needs). It reuses the bytecode's
`Instr` and register numbers, so a block and its Function print the same instruction lines; what the IR
adds is symbolic dims in types, use lists, a verifier, and a parser for its own text:

    func @b0(%0 : f32[B,784], %1 : f32[256,784]) {
      %2 : f32[B,256] = matmul(%0, %1) {transpose_a=False, transpose_b=True}
      %3 : f32[B,256] = relu(%2)
      return %3
    }

Passes are pure functions Function -> Function (`ms_dynvm.passes`); tests run `verify` after each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ms_dynvm.bytecode.program import Instr, Program
from ms_dynvm.bytecode.text import Reg, format_instr, format_typed_regs, parse_instr, parse_typed_regs
from ms_dynvm.bytecode.types import TensorType


@dataclass
class Function:
    name: str
    params: list  # register numbers
    body: list  # Instr
    outputs: list  # register numbers
    types: dict = field(default_factory=dict)  # reg -> TensorType, for params and every result

    # --- construction ---------------------------------------------------------------------------
    @staticmethod
    def from_block(program: Program, block_index: int, outputs=None) -> "Function":
        """The Function of one block. Params are the registers the block reads that it does not
        define, in first-use order. Outputs default to every result used by a later block or listed
        as a program output; pass `outputs` to choose (tier 1 returns every op's result)."""
        block = program.blocks[block_index]
        if outputs is None:
            later = set(program.outputs)
            for b in program.blocks[block_index + 1:]:
                for ins in b.instrs:
                    later.update(int(r) for r in ins.regs())
            outputs = [r for ins in block.instrs for r in ins.outs if r in later]
        body = [Instr(i.op, i.args, dict(i.attrs), i.outs) for i in block.instrs]
        return Function.from_instrs(f"b{block.id}", body, outputs, program.types)

    @staticmethod
    def from_instrs(name: str, body: list, outputs, types: dict) -> "Function":
        """The Function of instructions `body` (SSA, in order): params are the registers read before
        any instruction of `body` defines them, in first-use order; `types` may hold more registers
        than the function uses (it keeps those it does)."""
        defined, params, seen = set(), [], set()
        for ins in body:
            for r in ins.regs():
                r = int(r)
                if r not in defined and r not in seen:
                    seen.add(r)
                    params.append(r)
            defined.update(ins.outs)
        used = seen | defined
        return Function(name, params, list(body), list(outputs), {r: types[r] for r in used})

    # --- queries --------------------------------------------------------------------------------
    def users(self) -> dict[int, list[int]]:
        """reg -> indices of the body instructions that read it (outputs not included)."""
        out: dict[int, list[int]] = {}
        for i, ins in enumerate(self.body):
            for r in ins.regs():
                out.setdefault(int(r), []).append(i)
        return out

    def producers(self) -> dict[int, int]:
        return {r: i for i, ins in enumerate(self.body) for r in ins.outs}

    # --- text -----------------------------------------------------------------------------------
    def as_text(self) -> str:
        lines = [f"func @{self.name}({format_typed_regs(self.params, self.types)}) {{"]
        for ins in self.body:
            lines.append("  " + format_instr(ins.outs, self.types, ins.op, ins.args, ins.attrs))
        lines.append("  return " + ", ".join(f"%{r}" for r in self.outputs))
        lines.append("}")
        return "\n".join(lines) + "\n"

    __str__ = as_text

    def __eq__(self, other) -> bool:
        if not isinstance(other, Function):
            return NotImplemented
        return self.as_text() == other.as_text()

    @staticmethod
    def parse(text: str) -> "Function":
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        m = re.fullmatch(r"func @(\w+)\((.*)\) \{", lines[0])
        if not m or lines[-1] != "}":
            raise ValueError("expected 'func @name(...) {' ... '}'")
        types: dict = {}
        params = []
        for r, t in parse_typed_regs(m.group(2)):
            params.append(r)
            types[r] = t
        body, outputs = [], []
        for line in lines[1:-1]:
            if line.startswith("return"):
                rest = line[len("return"):].strip()
                outputs = [int(t.strip()[1:]) for t in rest.split(",")] if rest else []
                continue
            outs, out_types, op, args, attrs = parse_instr(line)
            for r, t in zip(outs, out_types):
                types[r] = t
            body.append(Instr(op, args, attrs, tuple(outs)))
        return Function(m.group(1), params, body, outputs, types)


__all__ = ["Function", "Reg", "TensorType"]
