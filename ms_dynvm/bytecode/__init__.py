"""Bytecode: the op table, the Program container, its text form and file format."""

from ms_dynvm.bytecode.opcodes import OPS, Group, OpDef, opdef
from ms_dynvm.bytecode.program import Block, Input, Instr, Program, canonical_attrs, load_program
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType, parse_type

__all__ = ["OPS", "Group", "OpDef", "opdef", "Block", "Input", "Instr", "Program", "Reg", "Sym",
           "TensorType", "canonical_attrs", "load_program", "parse_type"]
