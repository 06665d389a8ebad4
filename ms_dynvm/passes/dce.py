"""Dead-code elimination: drop instructions none of whose results is read or returned.

Why: recording keeps every op the script dispatched, including values it never uses again (a
`shape`-only temporary, the unused `mean`/`var` results of layer_norm, results that later passes
made redundant). Removing them saves work in every tier.

Rules:
- one backward sweep: a result is live when it is an output or an operand of a live instruction;
- an instruction is kept when any of its results is live (multi-result ops are kept whole);
- impure instructions are always kept: RANDOM ops (dropout) advance MindSpore's RNG, so dropping one
  would change every later random draw, and opaque `call`s run arbitrary code (they may print,
  update state or raise) that the VM does not model;
- params are never removed: they are the Function's calling convention (the executor binds them by
  position), even when no instruction reads them any more.
"""

from __future__ import annotations

from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import clone, is_pure, prune_types


def dce(fn: Function) -> Function:
    """`fn` without dead instructions (a new Function; `fn` is not modified)."""
    live = set(fn.outputs)
    keep = []
    for ins in reversed(fn.body):
        if not is_pure(ins.op) or any(r in live for r in ins.outs):
            keep.append(ins)
            live.update(int(r) for r in ins.regs())
    keep.reverse()
    return prune_types(clone(fn, body=keep))
