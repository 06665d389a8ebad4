"""Text form shared by bytecode and IR: literals, operands and instruction lines.

One instruction line:

    %3 : f32[4,256] = matmul(%0, %2) {transpose_a=False, transpose_b=True}
    %5 : f32[4,8], %6 : i64[4,8] = max_with_index(%1) {axis=1, keepdims=False}
    %7 : f32[4,8] = mul(%3, 0.5)

Operands are registers (`%N`) or immediates; attribute values are literals: None, True/False, ints,
floats (repr, so they round-trip exactly; `inf`, `-inf`, `nan`), strings in double quotes (JSON
escapes), and tuples `(1, 2)` / `(1,)` / `()`. Attributes print in the op table's order with defaults
filled in, so the text of an instruction is canonical.
"""

from __future__ import annotations

import json
import math
import re

from ms_dynvm.bytecode.types import TensorType, parse_type


class Reg(int):
    """A register operand. A subclass of int so that it hashes/compares cheaply; `Reg(3)` prints %3.
    Immediates are plain Python scalars (bool/int/float/None); never put a bare int where a register
    is meant."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"%{int(self)}"

    __str__ = __repr__


def format_literal(v) -> str:
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, Reg):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (tuple, list)):
        inner = ", ".join(format_literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    raise TypeError(f"cannot print literal of type {type(v).__name__}: {v!r}")


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<reg>%\d+)
      | (?P<num>[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)(?![\w.]))
      | (?P<word>-?[A-Za-z_][A-Za-z_0-9]*)
      | (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<punct>[(),=\[\]{}:])
    )""",
    re.VERBOSE,
)


class _Lexer:
    def __init__(self, text: str):
        self.toks = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError(f"cannot parse {text[pos:pos + 30]!r} in {text!r}")
            kind = m.lastgroup
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.text = text

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def next(self):
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, value):
        kind, v = self.next()
        if v != value:
            raise ValueError(f"expected {value!r}, got {v!r} in {self.text!r}")

    def done(self) -> bool:
        return self.i >= len(self.toks)


_WORDS = {"None": None, "True": True, "False": False, "inf": math.inf, "-inf": -math.inf,
          "nan": math.nan}


def _literal(lx: _Lexer):
    kind, v = lx.next()
    if kind == "reg":
        return Reg(int(v[1:]))
    if kind == "num":
        return int(v) if re.fullmatch(r"[-+]?\d+", v) else float(v)
    if kind == "str":
        return json.loads(v)
    if kind == "word":
        if v in _WORDS:
            return _WORDS[v]
        raise ValueError(f"unknown word {v!r} in {lx.text!r}")
    if v == "(":
        items = []
        while lx.peek()[1] != ")":
            items.append(_literal(lx))
            if lx.peek()[1] == ",":
                lx.next()
        lx.expect(")")
        return tuple(items)
    raise ValueError(f"unexpected {v!r} in {lx.text!r}")


def parse_literal(text: str):
    lx = _Lexer(text)
    v = _literal(lx)
    if not lx.done():
        raise ValueError(f"trailing text in literal {text!r}")
    return v


def format_attrs(attrs: dict) -> str:
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={format_literal(v)}" for k, v in attrs.items()) + "}"


def format_instr(outs, types, op: str, args, attrs: dict) -> str:
    """`outs` are register numbers, `types` maps them to TensorType."""
    lhs = ", ".join(f"%{o} : {types[o]}" for o in outs)
    rhs = f"{op}({', '.join(format_literal(a) for a in args)}){format_attrs(attrs)}"
    return f"{lhs} = {rhs}" if outs else rhs


_LHS = re.compile(r"%(\d+)\s*:\s*([^,=]+?(?:\[[^\]]*\])(?:@\w+)?)\s*(?:,|$)")


def parse_instr(line: str):
    """Parse an instruction line into (outs, out_types, op, args, attrs)."""
    if "=" in line.split("(", 1)[0]:
        lhs, rhs = line.split("=", 1)
        lhs = lhs.strip()
        outs, out_types = [], []
        pos = 0
        while pos < len(lhs):
            m = _LHS.match(lhs, pos)
            if not m:
                raise ValueError(f"bad results {lhs!r}")
            outs.append(int(m.group(1)))
            out_types.append(parse_type(m.group(2)))
            pos = m.end()
            while pos < len(lhs) and lhs[pos] == " ":
                pos += 1
    else:
        rhs, outs, out_types = line, [], []
    lx = _Lexer(rhs)
    kind, op = lx.next()
    if kind != "word":
        raise ValueError(f"expected an op name in {line!r}")
    lx.expect("(")
    args = []
    while lx.peek()[1] != ")":
        args.append(_literal(lx))
        if lx.peek()[1] == ",":
            lx.next()
    lx.expect(")")
    attrs = {}
    if not lx.done():
        lx.expect("{")
        while lx.peek()[1] != "}":
            _, key = lx.next()
            lx.expect("=")
            attrs[key] = _literal(lx)
            if lx.peek()[1] == ",":
                lx.next()
        lx.expect("}")
    if not lx.done():
        raise ValueError(f"trailing text in {line!r}")
    return outs, out_types, op, tuple(args), attrs


def format_typed_regs(regs, types) -> str:
    return ", ".join(f"%{r} : {types[r]}" for r in regs)


def parse_typed_regs(text: str) -> list[tuple[int, TensorType]]:
    out = []
    text = text.strip()
    pos = 0
    while pos < len(text):
        m = _LHS.match(text, pos)
        if not m:
            raise ValueError(f"bad typed registers {text!r}")
        out.append((int(m.group(1)), parse_type(m.group(2))))
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return out
