"""The optimisation pipeline: a flat, named list of `Function -> Function` passes run in order.

    PIPELINE = dce, cse, simplify, fold, dce   (repeated by `optimize` until a fixpoint)

dce first so the later passes see less; cse before simplify so equal subexpressions simplify once;
fold after simplify (simplify leaves splat producers in place, fold turns splat chains into single
`fill`s); a final dce removes what cse/simplify/fold made dead. Shape generalisation (`shapes`),
fusion (`fuse`) and memory planning (`memplan`) are not `Function -> Function` rewrites and run
apart, in the executor.

The product runs it: tier 1 sends every group through PIPELINE after generalising it, before it
compiles (`jit.compile.optimize`). Every pass keeps each value bit for bit (NaN payloads aside),
keeps the params, and keeps the outputs' positions (an output may become another register holding
the same value), which is all a kernel's calling convention needs.

Debugging (`DYNVM_DEBUG`): >= 1 runs the verifier after every pass (as `verify_each=True` does), and
names the pass that broke the IR; >= 3 logs the IR after every pass on the `ms_dynvm.passes` logger.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ms_dynvm.ir.function import Function
from ms_dynvm.ir.verifier import VerifyError, verify
from ms_dynvm.passes.cse import cse
from ms_dynvm.passes.dce import dce
from ms_dynvm.passes.fold import fold
from ms_dynvm.passes.simplify import simplify

log = logging.getLogger("ms_dynvm.passes")


class Pass(NamedTuple):
    name: str
    run: Callable[[Function], Function]


PIPELINE: list[Pass] = [
    Pass("dce", dce),
    Pass("cse", cse),
    Pass("simplify", simplify),
    Pass("fold", fold),
    Pass("dce", dce),
]


def debug_level() -> int:
    try:
        return int(os.environ.get("DYNVM_DEBUG", "0") or 0)
    except ValueError:
        return 0


def run_pipeline(fn: Function, passes: Sequence[Pass] = PIPELINE, *, verify_each: bool = False) -> Function:
    """Run `passes` in order on `fn` (which is not modified) and return the result."""
    level = debug_level()
    check = verify_each or level >= 1
    if level >= 3:
        log.info("IR before passes:\n%s", fn.as_text())
    for p in passes:
        fn = p.run(fn)
        if check:
            try:
                verify(fn)
            except VerifyError as e:
                raise VerifyError(f"after pass {p.name!r}: {e}\n{fn.as_text()}") from None
        if level >= 3:
            log.info("IR after %s:\n%s", p.name, fn.as_text())
    return fn


MAX_ROUNDS = 4


def optimize(fn: Function, verify_each: bool = False) -> Function:
    """`fn` through PIPELINE, repeated until nothing changes (at most MAX_ROUNDS times): a rewrite
    of one pass can enable another that already ran (simplify removing a no-op cast makes two
    expressions equal for cse), so one round is not always a fixpoint."""
    for _ in range(MAX_ROUNDS):
        out = run_pipeline(fn, PIPELINE, verify_each=verify_each)
        if out == fn:
            return out
        fn = out
    return fn
