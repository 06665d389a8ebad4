"""Size families: a program learned at a few sizes, written down for a new size without recording it.

A region recorded at several input sizes gives one program up to its numbers (shapes, size-dependent
attributes such as a reshape's target, size-dependent scalars such as a mean's 1/N): such recordings
form a *family* (`frontend/regions.py`, `_family`). `SizeFamily` keeps, for each recorded member, its
input dims (the shapes of its tensor arguments and its integer arguments, flattened) and the numbers
of its program text in order, and explains every number that differs between members as a function
of the input dims. Explanations tried, over the dims that differ between members ("varying" dims):

- c * M, M a product of one to three varying dims, c a rational constant (at a new size the result
  must be an integer again);
- M + k, M one varying dim, k an integer (a concatenated token: S + 1);
- for a number written as a float: c * M or c / M rounded as float64 or as float32, reproducing every
  member's number exactly (a mean's backward 1/N).

`instantiate(dims)` writes the program text for new dims, or returns None where the members do not
determine it: a number with no explanation, or with two explanations that agree on every member but
not at the new dims (the members cannot tell them apart), or new dims that differ from the members
in a dim that was the same in all of them. A number that is the same in every member stays as it is.

What this cannot see is Python control flow on sizes (`if x.shape[1] > 64:` taking another path at
the new size). The caller therefore checks an instantiated program at its first call against an eager
call before it is trusted (`Regions._instantiate`), and keeps re-verifying it by recording as any
replayed region is.

The module imports neither MindSpore nor NumPy.
"""

from __future__ import annotations

import itertools
import re
import struct
from fractions import Fraction

from ms_dynvm.bytecode.text import format_literal

# A number in program text (not part of a register name %12 or a word such as f32 or fc1).
NUMBER = re.compile(r"(?<![%\w])(-?\d+(?:\.\d*)?(?:e[-+]?\d+)?)")
_INT = re.compile(r"-?\d+$")

MAX_MEMBERS = 8
MAX_DEGREE = 3  # dims multiplied in one explanation


def split_numbers(text: str) -> tuple:
    """(the text between numbers, the numbers' texts): `text == lit[0] + num[0] + lit[1] + ...`."""
    parts = NUMBER.split(text)
    return tuple(parts[0::2]), parts[1::2]


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _round(x: float, mode: str) -> float:
    if mode == "f64":
        return x
    try:
        return _f32(x)
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


class SizeFamily:
    """The recorded members of one family (same text between the numbers, same argument structure)."""

    def __init__(self, literals: tuple) -> None:
        self.literals = literals
        self.members: list = []  # (dims tuple, numbers list)
        self._fits: dict = {}  # tuple of one number's texts over the members -> candidates
        self.broken = False  # an instantiation failed its check: the family is recorded per size again

    def add(self, dims: tuple, text: str) -> bool:
        """Add a recorded member; False where its text is not of this family."""
        lits, nums = split_numbers(text)
        if lits != self.literals:
            return False
        if any(d == dims for d, _ in self.members) or len(self.members) >= MAX_MEMBERS:
            return True
        if self.members and len(dims) != len(self.members[0][0]):
            return False
        self.members.append((tuple(dims), nums))
        self._fits.clear()
        return True

    def __len__(self) -> int:
        return len(self.members)

    # --- explanations ---------------------------------------------------------------------------------
    def _varying(self) -> list:
        d0 = self.members[0][0]
        return [j for j in range(len(d0)) if any(d[j] != d0[j] for d, _ in self.members)]

    def _candidates(self, toks: tuple, monomials: list) -> list:
        """Every explanation of one number position (`toks`: its text in each member) as
        (kind, monomial, constant, rounding)."""
        if all(_INT.match(t) for t in toks):
            vals = [int(t) for t in toks]
            out = []
            for mono, ms in monomials:
                if ms[0] != 0:
                    c = Fraction(vals[0], ms[0])
                    if all(c * m == v for m, v in zip(ms, vals)):
                        out.append(("mul", mono, c, None))
                if len(mono) == 1:
                    k = vals[0] - ms[0]
                    if all(m + k == v for m, v in zip(ms, vals)):
                        out.append(("add", mono, k, None))
            return out
        if any(_INT.match(t) for t in toks):
            return []  # (written as an integer in one member and a float in another)
        vals = [float(t) for t in toks]
        out = []
        for mono, ms in monomials:
            if any(m == 0 for m in ms):
                continue
            for mode in ("f64", "f32"):
                c = _round(vals[0] / ms[0], mode)
                if all(_round(c * m, mode) == v for m, v in zip(ms, vals)):
                    out.append(("fmul", mono, c, mode))
                c = _round(vals[0] * ms[0], mode)
                if all(_round(c / m, mode) == v for m, v in zip(ms, vals)):
                    out.append(("fdiv", mono, c, mode))
        return out

    @staticmethod
    def _value(cand, dims: tuple):
        kind, mono, c, mode = cand
        m = 1
        for j in mono:
            m *= dims[j]
        if kind == "mul":
            v = c * m
            return int(v) if v.denominator == 1 else None
        if kind == "add":
            return m + c
        if m == 0:
            return None
        return format_literal(_round(c * m if kind == "fmul" else c / m, mode))

    def instantiate(self, dims: tuple) -> str | None:
        """The family's program text at `dims`, or None where the members do not determine it."""
        if self.broken or len(self.members) < 2 or len(dims) != len(self.members[0][0]):
            return None
        dims = tuple(dims)
        if any(d == dims for d, _ in self.members):
            return None  # (a recorded size: its own recording is installed)
        varying = self._varying()
        d0 = self.members[0][0]
        if any(dims[j] != d0[j] for j in range(len(d0)) if j not in varying):
            return None
        monomials = None
        numbers = []
        cols = zip(*(nums for _, nums in self.members))
        for toks in cols:
            t0 = toks[0]
            if all(t == t0 for t in toks):
                numbers.append(t0)
                continue
            cands = self._fits.get(toks)
            if cands is None:
                if monomials is None:
                    monomials = []
                    # (bounded: with many varying sizes, products of up to two)
                    for deg in range(1, (MAX_DEGREE if len(varying) <= 12 else 2) + 1):
                        for mono in itertools.combinations_with_replacement(varying, deg):
                            ms = []
                            for d, _ in self.members:
                                m = 1
                                for j in mono:
                                    m *= d[j]
                                ms.append(m)
                            monomials.append((mono, ms))
                cands = self._fits[toks] = self._candidates(toks, monomials)
            values = {self._value(c, dims) for c in cands}
            if len(values) != 1 or None in values:
                return None
            v = values.pop()
            numbers.append(v if isinstance(v, str) else str(v))
        lits = self.literals
        out = [lits[0]]
        for n, lit in zip(numbers, lits[1:]):
            out.append(n)
            out.append(lit)
        return "".join(out)
