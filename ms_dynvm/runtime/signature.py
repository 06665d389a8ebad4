"""Shape signatures and guards: when may a compiled kernel serve a call?

A *signature* describes the external inputs of a group (or region) for one call:
per input (dtype, layout class, dims), where each dim is an int (static) or a symbol name (dynamic).
Kernels are compiled per signature, so one kernel serves every size of a *shape family*: all calls whose
static dims match and whose symbolic dims take any values >= 2 (consistently: dims sharing a symbol are
equal). Sizes 0 and 1 are always specialised (they change broadcasting and loop structure), so a
dynamic dim that is 0 or 1 in a call appears as that int in the call's signature.

Automatic dynamic (`ShapeFamily`): a dim becomes symbolic when the same (input, axis) of the same group
has been seen with two different values (both >= 2). The first time that happens, the dims of that call
that have equal values get the same symbol (x[B,784] and m[B,784] share B); guards then check at every
call that dims sharing a symbol really are equal. Users can mark dims dynamic up front
(`mark_dynamic`); ops marked FROZEN never get symbols (`ShapeFamily(frozen=True)`).

Guards are data: a tuple of `Guard(kind, input, axis, value)` checks, evaluated by `check`, which
returns the symbol bindings or the first failing guard's reason (counted by the caller). A signature
never contains tensor addresses or object ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class InputDesc(NamedTuple):
    """What is known of one input of one call (cheap to build from a tensor)."""

    dtype: str
    shape: tuple
    layout: str = "contiguous"


class Guard(NamedTuple):
    kind: str  # dtype | rank | layout | dim | sym | min2
    input: int
    axis: int
    value: object

    def __str__(self) -> str:
        where = f"in{self.input}" + (f".d{self.axis}" if self.axis >= 0 else "")
        return f"{self.kind}({where}, {self.value!r})"


@dataclass(frozen=True)
class Signature:
    inputs: tuple  # of (dtype, layout, dims) with dims ints or symbol names

    def __str__(self) -> str:
        parts = []
        for dtype, layout, dims in self.inputs:
            s = f"{dtype}[{','.join(str(d) for d in dims)}]"
            parts.append(s if layout == "contiguous" else f"{s}@{layout}")
        return "(" + ", ".join(parts) + ")"

    def symbols(self) -> list[str]:
        seen = []
        for _, _, dims in self.inputs:
            for d in dims:
                if isinstance(d, str) and d not in seen:
                    seen.append(d)
        return seen

    def guards(self) -> tuple:
        """The checks a call must pass to be served by a kernel compiled for this signature."""
        out = []
        for i, (dtype, layout, dims) in enumerate(self.inputs):
            out.append(Guard("dtype", i, -1, dtype))
            out.append(Guard("rank", i, -1, len(dims)))
            out.append(Guard("layout", i, -1, layout))
            for a, d in enumerate(dims):
                if isinstance(d, str):
                    out.append(Guard("min2", i, a, 2))
                    out.append(Guard("sym", i, a, d))
                else:
                    out.append(Guard("dim", i, a, d))
        return tuple(out)


class GuardFailure(NamedTuple):
    guard: Guard
    reason: str  # short, stable: used as a counter key


def check(guards: tuple, inputs: list) -> "dict[str, int] | GuardFailure":
    """Evaluate `guards` on `inputs` (InputDesc per input). Returns the symbol bindings, or the first
    failure."""
    env: dict[str, int] = {}
    for g in guards:
        if g.input >= len(inputs):
            return GuardFailure(g, "arity")
        inp = inputs[g.input]
        k = g.kind
        if k == "dtype":
            if inp.dtype != g.value:
                return GuardFailure(g, "dtype")
        elif k == "rank":
            if len(inp.shape) != g.value:
                return GuardFailure(g, "rank")
        elif k == "layout":
            if inp.layout != g.value:
                return GuardFailure(g, "layout")
        elif k == "dim":
            if inp.shape[g.axis] != g.value:
                return GuardFailure(g, "static_dim")
        elif k == "min2":
            if inp.shape[g.axis] < 2:
                return GuardFailure(g, "size_0_or_1")
        elif k == "sym":
            n = inp.shape[g.axis]
            bound = env.setdefault(g.value, n)
            if bound != n:
                return GuardFailure(g, "symbol_mismatch")
        else:  # pragma: no cover - guards are built by Signature.guards
            raise ValueError(f"unknown guard kind {k!r}")
    return env


@dataclass
class ShapeFamily:
    """Tracks the shapes one group has been called with and decides which dims are dynamic."""

    frozen: bool = False
    # (input, axis) -> symbol name, once dynamic
    dynamic: dict = field(default_factory=dict)
    # (input, axis) -> first value seen
    _first: dict = field(default_factory=dict)
    _marked: set = field(default_factory=set)
    _next_sym: int = 0

    def mark_dynamic(self, input_index: int, axis: int) -> None:
        """The user says this dim varies: make it symbolic from the first call on."""
        if not self.frozen:
            self._marked.add((input_index, axis))

    def _new_symbol(self) -> str:
        name = f"s{self._next_sym}"
        self._next_sym += 1
        return name

    def observe(self, inputs: list) -> Signature:
        """Record one call and return its signature (making dims dynamic where they changed)."""
        newly = []
        for i, inp in enumerate(inputs):
            for a, n in enumerate(inp.shape):
                key = (i, a)
                if key in self.dynamic or self.frozen:
                    continue
                first = self._first.setdefault(key, n)
                if key in self._marked or (first != n and first >= 2 and n >= 2):
                    newly.append(key)
        if newly:
            # Dims made dynamic together get one symbol per distinct value in this call.
            by_value: dict[int, str] = {}
            for key in newly:
                n = inputs[key[0]].shape[key[1]]
                self.dynamic[key] = by_value.setdefault(n, self._new_symbol())
        self._split_symbols(inputs)
        return self.signature(inputs)

    def _split_symbols(self, inputs: list) -> None:
        """Dims that shared a symbol but differ in this call (both >= 2) were equal by coincidence:
        give each distinct value its own symbol (the family only ever gets more general)."""
        groups: dict[str, dict[int, list]] = {}
        for key, sym in self.dynamic.items():
            # The same group may be called with another rank at a position (its ops broadcast):
            # a dim this call does not have binds nothing.
            i, a = key
            n = inputs[i].shape[a] if i < len(inputs) and a < len(inputs[i].shape) else None
            if n is not None and n >= 2:
                groups.setdefault(sym, {}).setdefault(n, []).append(key)
        for sym, by_value in groups.items():
            if len(by_value) > 1:
                for keys in list(by_value.values())[1:]:
                    new = self._new_symbol()
                    for key in keys:
                        self.dynamic[key] = new

    def signature(self, inputs: list) -> Signature:
        sig = []
        for i, inp in enumerate(inputs):
            dims = []
            for a, n in enumerate(inp.shape):
                sym = self.dynamic.get((i, a))
                dims.append(sym if sym is not None and n >= 2 else n)
            sig.append((inp.dtype, inp.layout, tuple(dims)))
        return Signature(tuple(sig))
