"""Bytecode: a Program is a list of basic blocks of tensor-semantic instructions over numbered registers.

Registers are program-wide and each is written exactly once (recording gives SSA for free: every
dispatched op makes new tensors). A register is defined by a program input (`input`, a tensor that
entered from outside: an argument, a Parameter, or any tensor not made by a recorded op), a constant
(`const`, data stored in the program), or one instruction. Types are recorded per register.

Basic blocks end at a sync point (`asnumpy`, `item`, printing, indexing ...), a forward/backward phase
change, an nn.Cell call boundary, or an opaque `call` (which sits alone at the end of its block).
The end reason is kept in `Block.end`.

Text form (parses back: `Program.parse(p.as_text()) == p`):

    program version=1
    input %0 : f32[4,784] {kind="arg", name="x"}
    input %1 : f32[256,784] {kind="param", name="fc1.weight"}
    const %2 : f32[] = (0.5,)
    block 0 {phase="fwd", region="MLP", end="cell"}
      %3 : f32[4,256] = matmul(%0, %1) {transpose_a=False, transpose_b=True}
    output %3

File format (`save`/`load`, no pickle): a JSON document {"format": "ms_dynvm.program", "version": 1,
"text": as_text(), "consts": {reg: {"dtype", "shape", "data": base64 of little-endian raw bytes}}}.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.text import (
    Reg,
    format_attrs,
    format_instr,
    format_literal,
    parse_instr,
    parse_literal,
    parse_typed_regs,
)
from ms_dynvm.bytecode.types import TensorType, parse_type

FORMAT = "ms_dynvm.program"
VERSION = 1

INPUT_KINDS = ("arg", "param", "tensor", "const")
PHASES = ("fwd", "bwd")
END_REASONS = ("open", "sync", "phase", "cell", "call", "limit", "error", "end")


@dataclass(slots=True)
class Instr:
    op: str
    args: tuple  # Reg or immediate (bool/int/float/None)
    attrs: dict
    outs: tuple  # register numbers

    def regs(self):
        """Register operands, in order."""
        return [a for a in self.args if isinstance(a, Reg)]


@dataclass(slots=True)
class Input:
    reg: int
    kind: str = "tensor"  # arg | param | tensor (made outside the program) | const
    name: str = ""


def raw_instr(op: str, args, outs: tuple) -> tuple:
    """The compact form of an instruction's `op, args, outs` that `Block.append_raw` takes:
    `(op, args, outs, mask)` where registers in `args` are plain ints and bit i of `mask` says that
    args[i] is a register (see `Block`)."""
    mask = 0
    plain = []
    for i, a in enumerate(args):
        if isinstance(a, Reg):
            mask |= 1 << i
            a = int(a)
        plain.append(a)
    return (op, tuple(plain), outs, mask)


def _materialize(raw, attrs) -> Instr:
    op, args, outs, mask = raw
    if mask:
        args = tuple(Reg(a) if mask >> i & 1 else a for i, a in enumerate(args))
    return Instr(op, args, attrs, outs)


class Block:
    """A basic block. `instrs` is a plain list of `Instr`.

    Storage: the recorder appends instructions in a compact form (`append_raw`, see `raw_instr`):
    exact tuples of atomic values (their attrs dicts kept beside them), which the garbage collector
    stops tracking at its first pass. An `Instr` (a GC-tracked object, like the `Reg`s in its
    arguments, or a tuple holding a dict) would stay tracked in the oldest generation for as long as
    the block lives, and every such object brings the next full collection (a walk over every object
    of the process) closer. Compact instructions become `Instr`s the first time `instrs` is read;
    `num_instrs`, `op_names` and `instrs_between` read them without that."""

    __slots__ = ("id", "phase", "region", "end", "_instrs", "_pending", "_pattrs")

    def __init__(self, id: int, phase: str = "fwd", region: str = "", end: str = "open",
                 instrs: list | None = None) -> None:
        self.id = id
        self.phase = phase
        self.region = region
        self.end = end
        self._instrs = [] if instrs is None else instrs
        self._pending: list = []  # compact instructions appended after `_instrs`
        self._pattrs: list = []  # their attrs

    @property
    def instrs(self) -> list:
        pending = self._pending
        if pending:
            self._instrs.extend(map(_materialize, pending, self._pattrs))
            pending.clear()  # in place: the recorder holds on to these lists
            self._pattrs.clear()
        return self._instrs

    @instrs.setter
    def instrs(self, value: list) -> None:
        self._instrs = value
        self._pending.clear()
        self._pattrs.clear()

    def append_raw(self, raw: tuple, attrs: dict) -> None:
        """Append an instruction in compact form (`raw_instr`) with its attrs."""
        self._pending.append(raw)
        self._pattrs.append(attrs)

    def num_instrs(self) -> int:
        return len(self._instrs) + len(self._pending)

    def op_names(self, start: int = 0, end: int | None = None) -> list:
        """`[i.op for i in self.instrs[start:end]]` (0 <= start <= end), without making Instrs."""
        n = len(self._instrs)
        if end is None:
            end = n + len(self._pending)
        if end <= n:
            return [i.op for i in self._instrs[start:end]]
        out = [i.op for i in self._instrs[start:n]] if start < n else []
        out.extend(r[0] for r in self._pending[max(start - n, 0):end - n])
        return out

    def op_at(self, i: int) -> str:
        """`self.instrs[i].op`, without making an Instr for a pending instruction."""
        n = len(self._instrs)
        return self._pending[i - n][0] if i >= n else self._instrs[i].op

    def instrs_between(self, start: int, end: int) -> list:
        """`self.instrs[start:end]` (0 <= start <= end); pending instructions stay compact (the
        Instrs returned for them are new objects)."""
        n = len(self._instrs)
        if end <= n:
            return self._instrs[start:end]
        out = self._instrs[start:n] if start < n else []
        lo, hi = max(start - n, 0), end - n
        out.extend(map(_materialize, self._pending[lo:hi], self._pattrs[lo:hi]))
        return out

    def __eq__(self, other) -> bool:
        if not isinstance(other, Block):
            return NotImplemented
        return ((self.id, self.phase, self.region, self.end, self.instrs)
                == (other.id, other.phase, other.region, other.end, other.instrs))

    __hash__ = None

    def __repr__(self) -> str:
        return (f"Block(id={self.id!r}, phase={self.phase!r}, region={self.region!r}, "
                f"end={self.end!r}, instrs={self.instrs!r})")


@dataclass
class Program:
    inputs: list = field(default_factory=list)
    types: dict = field(default_factory=dict)  # reg -> TensorType
    consts: dict = field(default_factory=dict)  # reg -> np.ndarray
    blocks: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # Next free register number (registers are allocated densely by every builder).
    _n: int = field(default=0, compare=False, repr=False)
    # Runs this program's `call` instructions where `interpret` is given no call_handler: set by
    # `ms_dynvm.record()` on the program it made (it re-runs each opaque op through MindSpore, in the
    # recording process only). Not saved, not compared.
    call_handler: object = field(default=None, compare=False, repr=False)

    # --- construction helpers -------------------------------------------------------------------
    def next_reg(self) -> int:
        r = max(self._n, len(self.types))
        while r in self.types:
            r += 1
        return r

    def add_input(self, ty: TensorType, kind: str = "tensor", name: str = "") -> Reg:
        r = self.next_reg()
        self._n = r + 1
        self.types[r] = ty
        self.inputs.append(Input(r, kind, name))
        return Reg(r)

    def add_const(self, value: np.ndarray, dtype: str | None = None) -> Reg:
        arr = np.asarray(value)
        dt = dtype or dtypes.from_numpy(arr.dtype)
        r = self.next_reg()
        self._n = r + 1
        self.types[r] = TensorType(dt, tuple(arr.shape))
        # a C-ordered copy (np.ascontiguousarray would make a 0-d array 1-d)
        self.consts[r] = np.array(arr, dtype=dtypes.to_numpy(dt), order="C")
        return Reg(r)

    def new_block(self, phase: str = "fwd", region: str = "") -> Block:
        b = Block(len(self.blocks), phase, region)
        self.blocks.append(b)
        return b

    def emit(self, block: Block, op: str, args, attrs: dict, out_types) -> list[Reg]:
        """Append an instruction; the Instr owns `attrs` from now on (nobody mutates attrs)."""
        r0 = self.next_reg()
        n = len(out_types)
        self._n = r0 + n
        types = self.types
        outs = tuple(range(r0, r0 + n))
        for r, t in zip(outs, out_types):
            types[r] = t
        block.append_raw(raw_instr(op, args, outs), attrs)
        return [Reg(r) for r in outs]

    # --- queries --------------------------------------------------------------------------------
    def instrs(self):
        for b in self.blocks:
            yield from b.instrs

    def num_instrs(self) -> int:
        return sum(b.num_instrs() for b in self.blocks)

    def input_types(self) -> list[TensorType]:
        return [self.types[i.reg] for i in self.inputs]

    # --- text -----------------------------------------------------------------------------------
    def as_text(self) -> str:
        lines = [f"program version={VERSION}"]
        for inp in self.inputs:
            meta = {"kind": inp.kind, "name": inp.name}
            lines.append(f"input %{inp.reg} : {self.types[inp.reg]}{format_attrs(meta)}")
        for r, arr in self.consts.items():
            flat = tuple(arr.reshape(-1).tolist())
            lines.append(f"const %{r} : {self.types[r]} = {format_literal(flat)}")
        for b in self.blocks:
            meta = {"phase": b.phase, "region": b.region, "end": b.end}
            lines.append(f"block {b.id}{format_attrs(meta)}")
            for ins in b.instrs:
                lines.append("  " + format_instr(ins.outs, self.types, ins.op, ins.args, ins.attrs))
        lines.append("output " + ", ".join(f"%{r}" for r in self.outputs))
        return "\n".join(lines) + "\n"

    __str__ = as_text

    @staticmethod
    def parse(text: str) -> "Program":
        p = Program()
        block = None
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                head = line.split(None, 1)[0]
                if head == "program":
                    if line != f"program version={VERSION}":
                        raise ValueError(f"unsupported header {line!r}")
                elif head == "input":
                    body = line[len("input"):]
                    typed, _, meta = body.partition("{")
                    [(r, ty)] = parse_typed_regs(typed)
                    attrs = _parse_meta("{" + meta) if meta else {}
                    p.types[r] = ty
                    p.inputs.append(Input(r, attrs.get("kind", "tensor"), attrs.get("name", "")))
                elif head == "const":
                    lhs, _, data = line[len("const"):].partition("=")
                    [(r, ty)] = parse_typed_regs(lhs)
                    flat = parse_literal(data)
                    arr = np.array(flat, dtype=dtypes.to_numpy(ty.dtype)).reshape(ty.shape)
                    p.types[r] = ty
                    p.consts[r] = arr
                elif head == "block":
                    rest = line[len("block"):].strip()
                    num, _, meta = rest.partition("{")
                    attrs = _parse_meta("{" + meta) if meta else {}
                    block = Block(int(num), attrs.get("phase", "fwd"), attrs.get("region", ""),
                                  attrs.get("end", "open"))
                    if block.id != len(p.blocks):
                        raise ValueError("blocks must be numbered in order from 0")
                    p.blocks.append(block)
                elif head == "output":
                    rest = line[len("output"):].strip()
                    p.outputs = [int(t.strip()[1:]) for t in rest.split(",")] if rest else []
                else:
                    if block is None:
                        raise ValueError("instruction outside a block")
                    outs, out_types, op, args, attrs = parse_instr(line)
                    for r, t in zip(outs, out_types):
                        p.types[r] = t
                    block.instrs.append(Instr(op, args, attrs, tuple(outs)))
            except (ValueError, KeyError) as e:
                raise ValueError(f"line {lineno}: {e}: {raw!r}") from None
        return p

    # --- comparison -----------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        if self.as_text() != other.as_text():
            return False
        return all(
            self.consts[r].dtype == other.consts[r].dtype
            and np.array_equal(self.consts[r], other.consts[r], equal_nan=_is_float(self.consts[r]))
            for r in self.consts
        )

    # --- files ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        consts = {}
        for r, arr in self.consts.items():
            le = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
            consts[str(r)] = {
                "dtype": self.types[r].dtype,
                "shape": list(arr.shape),
                "data": base64.b64encode(le.tobytes()).decode("ascii"),
            }
        return {"format": FORMAT, "version": VERSION, "text": self.as_text(), "consts": consts}

    @staticmethod
    def from_json(doc: dict) -> "Program":
        """The Program of a `to_json` document. Anything else (another JSON document, a damaged
        file, constants that disagree with the types the text declares) is a ValueError."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError("not an ms_dynvm program file")
        if doc.get("version") != VERSION:
            raise ValueError(f"unsupported program file version {doc.get('version')}")
        text, consts = doc.get("text"), doc.get("consts", {})
        if not isinstance(text, str) or not isinstance(consts, dict):
            raise ValueError("damaged ms_dynvm program file: 'text' must be a string, 'consts' an object")
        p = Program.parse(text)
        for key, c in consts.items():
            try:
                r = int(key)
                ty = p.types[r] if r in p.consts else None
                if ty is None:
                    raise ValueError(f"%{key} is not a constant of the program")
                if c["dtype"] != ty.dtype or tuple(c["shape"]) != tuple(ty.shape):
                    raise ValueError(f"%{key} is {c['dtype']}{list(c['shape'])}, declared {ty}")
                npdt = dtypes.to_numpy(c["dtype"]).newbyteorder("<")
                raw = base64.b64decode(c["data"], validate=True)
                arr = np.frombuffer(raw, dtype=npdt).reshape(ty.shape).astype(npdt.newbyteorder("="))
            except (KeyError, TypeError, ValueError, binascii.Error) as e:
                raise ValueError(f"damaged ms_dynvm program file: constant {key}: {e}") from e
            p.consts[r] = arr
        return p

    def save(self, path) -> None:
        """Write atomically (temp file in the same directory + os.replace)."""
        path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".dvm-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def load_program(path) -> Program:
    with open(path) as f:
        return Program.from_json(json.load(f))


def _is_float(arr) -> bool:
    return arr.dtype.kind in "fc"


def _parse_meta(text: str) -> dict:
    from ms_dynvm.bytecode.text import _Lexer, _literal

    lx = _Lexer(text)
    lx.expect("{")
    out = {}
    while lx.peek()[1] != "}":
        _, key = lx.next()
        lx.expect("=")
        out[key] = _literal(lx)
        if lx.peek()[1] == ",":
            lx.next()
    lx.expect("}")
    return out


def canonical_attrs(op: str, attrs: dict) -> dict:
    """Attributes with defaults filled in, normalised to tuples (what the printer writes)."""
    full = opcodes.full_attrs(op, attrs) if op in opcodes.OPS else dict(attrs)
    return {k: _tuplify(v) for k, v in full.items()}


def _tuplify(v):
    if isinstance(v, list):
        return tuple(_tuplify(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_tuplify(x) for x in v)
    return v


__all__ = ["Program", "Block", "Instr", "Input", "Reg", "TensorType", "load_program",
           "canonical_attrs", "parse_type", "raw_instr"]
