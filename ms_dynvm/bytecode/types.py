"""Value metadata shared by bytecode and IR: `TensorType` = dtype + shape (+ layout class).

A dim is an `int` (static) or a `Sym` (symbolic: a monomial `coeff * a * b ...` over named dims, enough
for reshape with -1 over dynamic dims such as `B*S`). Text form: `f32[4,B,S*B]`, scalars `f32[]`;
a non-contiguous layout class is suffixed: `f32[4,8]@strided`, `f32[4,8]@broadcast`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ms_dynvm.dtypes import DTYPES

LAYOUTS = ("contiguous", "strided", "broadcast")


@dataclass(frozen=True, order=True)
class Sym:
    """A symbolic dim `coeff * prod(names)`; names sorted, may repeat (B*B)."""

    names: tuple[str, ...]
    coeff: int = 1

    @staticmethod
    def of(name: str) -> "Sym":
        return Sym((name,), 1)

    def __str__(self) -> str:
        parts = ([str(self.coeff)] if self.coeff != 1 else []) + list(self.names)
        return "*".join(parts)

    __repr__ = __str__


Dim = "int | Sym"


def dim_mul(a, b):
    """Product of two dims (ints or Syms); an int result when both are ints."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(a, int):
        a, b = b, a
    if isinstance(b, int):
        return Sym(a.names, a.coeff * b) if b != 0 else 0
    return Sym(tuple(sorted(a.names + b.names)), a.coeff * b.coeff)


def dim_div(a, b):
    """Exact quotient a / b, or None when it is not exact (or not expressible)."""
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        if a.coeff % b:
            return None
        c = a.coeff // b
        return Sym(a.names, c) if a.names else c
    if isinstance(a, int):
        return None
    rest = list(a.names)
    for n in b.names:
        if n not in rest:
            return None
        rest.remove(n)
    if a.coeff % b.coeff:
        return None
    c = a.coeff // b.coeff
    return Sym(tuple(rest), c) if rest else c


def eval_dim(d, env: dict) -> int:
    """The value of dim `d` with its symbols bound by `env` (KeyError for an unbound symbol)."""
    if isinstance(d, int):
        return d
    v = d.coeff
    for name in d.names:
        v *= env[name]
    return v


def numel(shape) -> "int | Sym":
    out = 1
    for d in shape:
        out = dim_mul(out, d)
    return out


def is_static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple
    layout: str = "contiguous"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self):
        return numel(self.shape)

    def static_numel(self) -> int:
        return math.prod(self.shape)

    def with_shape(self, shape) -> "TensorType":
        return TensorType(self.dtype, tuple(shape), self.layout)

    def __str__(self) -> str:
        s = f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
        return s if self.layout == "contiguous" else f"{s}@{self.layout}"

    __repr__ = __str__


def parse_dim(text: str):
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    coeff, names = 1, []
    for part in text.split("*"):
        part = part.strip()
        if part.isdigit():
            coeff *= int(part)
        elif part.isidentifier():
            names.append(part)
        else:
            raise ValueError(f"bad dim {text!r}")
    return Sym(tuple(sorted(names)), coeff) if names else coeff


def parse_type(text: str) -> TensorType:
    text = text.strip()
    layout = "contiguous"
    if "@" in text:
        text, layout = text.split("@", 1)
    if not text.endswith("]") or "[" not in text:
        raise ValueError(f"bad type {text!r}")
    dtype, dims = text[:-1].split("[", 1)
    shape = tuple(parse_dim(d) for d in dims.split(",")) if dims.strip() else ()
    return TensorType(dtype.strip(), shape, layout.strip())
