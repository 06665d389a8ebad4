"""Memory planning inside a group (or any Function): which buffer holds each intermediate register.

Why: a fused group executed op by op (or a kernel that materialises some intermediates, e.g. the
rows of a softmax) would otherwise allocate one buffer per intermediate; most die right after
their single use, so a few buffers can be recycled through the whole group.

Definitions:
- intermediates: registers defined by the body that are not outputs (outputs are handed back to
  the caller, so they get fresh pool allocations outside this plan; params belong to the caller);
- live range of an intermediate: from its defining instruction to its last reader (a result
  nobody reads dies at its own instruction);
- a buffer freed by a register whose last use is instruction i becomes reusable from instruction
  i + 1 on (never by the results of i itself: an op may read its inputs while it writes its
  result, and not every op is safe in place).
Assignment (greedy, in program order): a result takes the smallest free buffer at least as large
as its byte size (best fit: equal or smaller sizes reuse a dead intermediate's buffer); if none
fits, a new buffer. Only static sizes share: a symbolic size (`Sym`, known at run time) gets a
buffer of its own that is never reused, and its size is recorded as the symbolic byte count.
bf16 counts 2 bytes (its storage size), even though the interpreter computes it in f32.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ms_dynvm.bytecode.types import Sym, TensorType, dim_mul, is_static
from ms_dynvm.ir.function import Function

ITEMSIZE = {
    "bool": 1, "i8": 1, "u8": 1, "i16": 2, "f16": 2, "bf16": 2, "i32": 4, "f32": 4,
    "i64": 8, "f64": 8, "c64": 8, "c128": 16,
}


def nbytes(t: TensorType) -> "int | Sym":
    """Byte size of a value of type `t` (a Sym when the shape is symbolic)."""
    n = ITEMSIZE[t.dtype]
    for d in t.shape:
        n = dim_mul(n, d)
    return n


@dataclass
class MemoryPlan:
    assignment: dict[int, int] = field(default_factory=dict)  # intermediate reg -> buffer index
    sizes: list = field(default_factory=list)  # buffer index -> bytes (int, or Sym when symbolic)
    live: dict[int, tuple[int, int]] = field(default_factory=dict)  # reg -> (def index, last use index)

    @property
    def static_bytes(self) -> int:
        """Total bytes of the statically sized buffers."""
        return sum(s for s in self.sizes if isinstance(s, int))

    def naive_bytes(self, fn: Function) -> int:
        """What one buffer per static intermediate would take (for reuse statistics)."""
        return sum(s for r in self.assignment if isinstance(s := nbytes(fn.types[r]), int))


def liveness(fn: Function) -> dict[int, tuple[int, int]]:
    """Live range (def index, last use index) of every intermediate register of `fn`."""
    outs = set(fn.outputs)
    live: dict[int, tuple[int, int]] = {}
    for i, ins in enumerate(fn.body):
        for r in ins.regs():
            r = int(r)
            if r in live:
                live[r] = (live[r][0], i)
        for r in ins.outs:
            if r not in outs:
                live[r] = (i, i)
    return live


def plan(fn: Function) -> MemoryPlan:
    """Greedy best-fit buffer assignment for the intermediates of `fn`."""
    live = liveness(fn)
    dying: dict[int, list[int]] = {}
    for r, (_, last) in live.items():
        dying.setdefault(last, []).append(r)
    out = MemoryPlan(live=live)
    free: list[tuple[int, int]] = []  # (size, buffer) of reusable static buffers, sorted
    for i, ins in enumerate(fn.body):
        for r in ins.outs:
            if r not in live:
                continue
            size = nbytes(fn.types[r])
            if not is_static(fn.types[r].shape):
                out.assignment[r] = len(out.sizes)
                out.sizes.append(size)  # symbolic: a buffer of its own, never shared
                continue
            k = bisect.bisect_left(free, (size, -1))
            if k < len(free):
                _, buf = free.pop(k)  # smallest free buffer with room: reuse it
            else:
                buf = len(out.sizes)
                out.sizes.append(size)
            out.assignment[r] = buf
        for r in dying.get(i, ()):
            buf = out.assignment[r]
            if isinstance(out.sizes[buf], int):
                bisect.insort(free, (out.sizes[buf], buf))
    return out
