"""Fused elementwise kernels for region plans (tier 2): chains of a plan's elementwise steps run as
ONE compiled C kernel step, so their intermediates are never materialised as NumPy arrays.

Which steps: the plan's kept instructions are cut into maximal runs of ops whose fused result is
bit-identical to the unfused plan's (`FUSE_OPS`: IEEE arithmetic, selects, casts, views, and the
elementwise ops the plan already runs as kernels of the same backend, `kernels.SLOW_ELEMENTWISE`);
each run is partitioned by tier 1's fusion rule (`passes.fuse.fuse`, which asks
`passes.fuse.fusible` per op) and every 'elementwise' group of MIN_WORK (2) or more ops over tensors becomes a
candidate (its leading views of inputs stay NumPy views; a Dense layer's `bias_add` followed by the
reshape to its batch axes is taken as reshape then bias_add, `_bias_after_reshape`, so the bias
joins the group after it), and so is every 'norm' group around a
layer_norm (`NORMS`: the backend's kernel equals the reference interpreter, which runs it unfused,
bit for bit). NumPy's exp, log and tanh and its plain reductions differ from the C backend's eager
formulas in the last bits, so groups holding them are not fused: the plan stays bit-identical.
erf/erfc and softmax are left out for speed (see `FUSE_OPS`, `NORMS`).
Division by a signed zero is the one IEEE difference: the kernels follow MindSpore (x / -0 = x / +0,
`codegen.c`), NumPy's step gives the sign; eager agrees with the kernel.

How: the group's Function is generalised over its param dims (one symbol per distinct recorded size
other than 0 and 1, named in order of appearance: a plan at (8, 64) and one at (4, 32) share one
kernel; `passes.shapes.generalize`, static where a rule cannot express it), lowered and rendered by
the C backend (`codegen.spec.lower`, `codegen.c.render`: products rounded apart from later additions,
`dvm_keepf`; the outer loop on OpenMP threads above `codegen.c.OMP_THRESHOLD` elements, however many
`jit.launch.set_kernel_threads` allows: elementwise, the bits do not depend on it) and built through
the kernel cache (memory, disk, GCC).

When: at the plan's first run its groups are found, generalised, lowered and rendered in the
caller's thread (`prepare_candidate`); where every group's kernel is built already (a further size
of a family) the fused steps are swapped in at once. Otherwise only GCC (a subprocess) and the disk
cache's I/O run on the background compile thread (`jit.compile.compile_pool`); the plan runs its
unfused steps until they are ready and swaps the fused steps in at the start of a later run
(`RegionPlan.run`). Python work stays off the second thread on purpose: a thread that releases the
GIL (every ctypes call, MindSpore's eager dispatch at every op) waits up to the interpreter's
switch interval (5 ms) to get it back from a busy Python thread: `profiling/tools/gil_contention.py`
measured eager attention steps 17-25x slower beside one (and, in an instrumented run, the first
GEMM of a new plan took 4-5 ms with lowering and rendering in the background, 1-2 ms without). A compile that fails
leaves the unfused steps: no compiler is one warning per process, a group the backend does not
render is counted in the fallback table. Kernels already built are found by their canonical text
(`_BUILT`), so the plans of further sizes of a family reuse them without lowering or rendering.
This module imports no MindSpore.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.jit import kernels as _kernels

# Ops a fused kernel computes exactly as the unfused plan does (IEEE-exact arithmetic, selects,
# moves; erf via erff; the slow elementwise ops the plan already runs on the same C backend).
# Comparisons and logic: their bool results may feed a select inside a group.
COMPARE = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"))
ARITH = frozenset(("add", "sub", "mul", "div", "neg", "abs", "sqrt", "square", "maximum", "minimum", "relu",
                   "relu_grad", "bias_add", "where", "cast", "masked_fill", "fill")) | COMPARE
VIEWS = frozenset(("reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "contiguous"))
# erf/erfc (the C library's, scalar) are left out: a fused loop calling erff measured ~15% slower
# than erff over a flat array plus NumPy's passes for the rest of the erf-form GELU (the call
# dominates; the flat kernel also runs on two threads, `kernels.PARALLEL`).
# layer_norm: the C backend's kernel follows MindSpore CPU's float32 formula (eager_math) and equals
# the reference interpreter bit for bit (tests/jit/test_replay_fusion.py), which runs it unfused
# (~280 us at [8, 64, 64]; the fused kernel ~75 us). softmax is not fused: the backend's eager-formula
# kernel (bit-equal to the interpreter too) measured 1.9 ms at [8, 64, 64] against NumPy's 0.28 ms,
# 7.8 ms where a mask adds -1e4 (exp's subnormal path), on this machine's Xeon.
NORMS = frozenset(("layer_norm",))
FUSE_OPS = ARITH | VIEWS | (_kernels.SLOW_ELEMENTWISE - _kernels.LIBM) | NORMS
# Ops that do work in a kernel (a group of views only is a copy: not worth a step)
_WORK = ARITH | _kernels.SLOW_ELEMENTWISE | NORMS
_FLOATS = ("f32", "f64")
# Computing ops (on tensors, not 0-d values) an elementwise group needs to be fused: a fused kernel
# saves the passes over memory between its ops (x * (1 + e) * 0.5 over [8, 64, 256], one thread:
# 57 us fused against 97 us for NumPy's three passes); a single op gains nothing.
MIN_WORK = 2
ENABLED = os.environ.get("DYNVM_REPLAY_FUSE", "1") != "0"
_BUILT: dict = {}  # canonical text of a generalised group -> its CompiledKernel (this process)


class Candidate(NamedTuple):
    """Steps [lo, hi) of a plan as one kernel: its Function (registers of the plan), the params it
    reads and the outputs it writes (plan registers)."""

    lo: int
    hi: int
    fn: object
    params: tuple
    outs: tuple
    views: tuple = ()  # per param: None, or (plan register, shape): the param is that register reshaped


def candidates(keep: list, types: dict, out_regs) -> list:
    """The fusible groups of a plan's instruction list `keep` (see the module docstring)."""
    from ms_dynvm.ir.function import Function
    from ms_dynvm.passes.fuse import fuse

    last_use: dict = {}
    for i, ins in enumerate(keep):
        for a in ins.args:
            if isinstance(a, Reg):
                last_use[int(a)] = i
    outs_set = {int(r) for r in out_regs}
    uses: dict = {}  # register -> number of reads in the plan
    for ins in keep:
        for a in ins.args:
            if isinstance(a, Reg):
                uses[int(a)] = uses.get(int(a), 0) + 1
    found = []
    nxt = 1 + max([int(r) for r in types] + [0])  # registers the swaps below define
    i, n = 0, len(keep)
    while i < n:
        if not _ok(keep[i], types):
            i += 1
            continue
        j = i
        while j < n and _ok(keep[j], types):
            j += 1
        # run [i, j): its own Function; registers read later (or plan outputs) are its outputs
        body, rtypes, swapped = _bias_after_reshape(keep, i, j, types, outs_set, nxt, uses)
        nxt += len(swapped)
        fouts = [r for ins in body for r in ins.outs if r in outs_set or last_use.get(r, -1) >= j]
        if fouts:
            fn = Function.from_instrs("region_run", body, fouts, rtypes)
            try:
                groups = fuse(fn)
            except Exception:  # noqa: BLE001 - the rule refuses what it cannot partition: no fusion
                groups = []
            for g in groups:
                ops = [fn.body[k].op for k in g.instrs]
                # (ops on 0-d values, the sqrt of a constant, are not passes over the data)
                work = [fn.body[k].op for k in g.instrs if fn.body[k].op in _WORK and
                        any(len(rtypes[r].shape) for r in fn.body[k].outs)]
                norm = g.kind == "norm" and set(ops) & NORMS
                if g.kind != "elementwise" and not norm:
                    continue
                if not norm and len(work) < MIN_WORK:
                    continue  # (NumPy's passes are as fast: the kernels' loops measured no faster)
                lo, hi = g.instrs[0], g.instrs[-1] + 1
                # Leading views of the group's inputs stay NumPy views (steps before the kernel):
                # their attributes hold the recorded sizes (a reshape's target), which would keep
                # the kernel from serving other sizes.
                while lo < hi and fn.body[lo].op in VIEWS:
                    lo += 1
                if lo == hi:
                    continue
                gf = _sub(fn, lo, hi, g.function.outputs, rtypes)
                # A swapped pair (see _bias_after_reshape) is replaced whole or not at all: the
                # kernel may start at the moved bias_add, reading the GEMM output reshaped itself.
                plo, views, ok = lo, [], True
                for k, nr, src, shape in swapped:
                    if (lo <= k < hi) != (lo <= k + 1 < hi):
                        if k + 1 == lo and nr in gf.params:
                            plo = k
                        else:
                            ok = False
                if not ok:
                    continue
                pre = {nr: (src, shape) for _, nr, src, shape in swapped}
                views = tuple(pre.get(r) for r in gf.params)
                args = tuple(pre[r][0] if r in pre else r for r in gf.params)
                found.append(Candidate(i + plo, i + hi, gf, args, tuple(gf.outputs), views))
        i = j
    return found


def _bias_after_reshape(keep: list, i: int, j: int, types: dict, outs_set: set, nxt: int, uses: dict):
    """(body, types, swaps) of run keep[i:j] where each `bias_add(x [M, N]) -> reshape to [.., N]`
    (a Dense layer's bias, then its batch axes back) whose sum nothing else reads becomes
    `reshape(x) -> bias_add(.., axis=-1)`: the same additions, but the reshape of a computed value
    would end a fused group (it is not right-aligned) where a reshape of the group's input is a
    view. swaps: (body index, new register, x, shape)."""
    from ms_dynvm.bytecode import opcodes
    from ms_dynvm.bytecode.program import Instr

    body = list(keep[i:j])
    rtypes = types
    swaps = []
    for k in range(len(body) - 1):
        b, r = body[k], body[k + 1]
        if b.op != "bias_add" or r.op != "reshape" or not isinstance(b.args[0], Reg) or \
                not isinstance(r.args[0], Reg) or int(r.args[0]) != b.outs[0]:
            continue
        s = b.outs[0]
        if uses.get(s, 0) != 1 or s in outs_set:
            continue
        xt, ot = types[int(b.args[0])], types[r.outs[0]]
        if len(xt.shape) != 2 or len(ot.shape) < 2 or ot.shape[-1] != xt.shape[-1] or \
                opcodes.full_attrs("bias_add", b.attrs).get("axis", 1) % 2 != 1:
            continue
        if rtypes is types:
            rtypes = dict(types)
        nr = nxt + len(swaps)
        rtypes[nr] = ot
        body[k] = Instr("reshape", (b.args[0],), {"shape": tuple(ot.shape)}, (nr,))
        body[k + 1] = Instr("bias_add", (Reg(nr),) + tuple(b.args[1:]), {**b.attrs, "axis": len(ot.shape) - 1},
                            (r.outs[0],))
        swaps.append((k, nr, int(b.args[0]), tuple(ot.shape)))
    return body, rtypes, swaps


def _sub(fn, lo: int, hi: int, outs, types):
    """Instructions [lo, hi) of `fn` as a Function writing those of `outs` they define."""
    from ms_dynvm.ir.function import Function

    body = fn.body[lo:hi]
    defined = {r for ins in body for r in ins.outs}
    return Function.from_instrs("region_group", body, [r for r in outs if r in defined], types)


def _ok(ins, types) -> bool:
    if ins.op not in FUSE_OPS or (len(ins.outs) != 1 and ins.op != "layer_norm"):
        return False
    for r in list(ins.outs) + [int(a) for a in ins.args if isinstance(a, Reg)]:
        t = types[r]
        if not all(type(d) is int for d in t.shape):
            return False
        if t.dtype not in _FLOATS and t.dtype not in ("bool", "i32", "i64"):
            return False
    if ins.op in NORMS:  # (the eager formula, equal to the interpreter, is float32's)
        return types[ins.outs[0]].dtype == "f32"
    out = types[ins.outs[0]].dtype
    return out in _FLOATS or ins.op in VIEWS or (out == "bool" and ins.op in COMPARE)


def _generalized(fn):
    """`fn` over symbols: one per distinct param size other than 0 and 1 (see the docstring)."""
    from ms_dynvm.passes.shapes import generalize

    names: dict = {}
    marks = {}
    for p in fn.params:
        for axis, d in enumerate(fn.types[p].shape):
            if type(d) is int and d > 1:
                marks[(p, axis)] = names.setdefault(d, f"d{len(names)}")
    if not marks:
        return fn
    try:
        return generalize(fn, marks)
    except Exception:  # noqa: BLE001 - a rule that cannot express it: the static kernel
        return fn


def prepare_candidate(fn):
    """(kernel, None) where group `fn`'s kernel is built in this process, else (None, (build,
    finish)): `codegen.prepare_group`'s halves over the generalised group (lowered and rendered
    here, in the caller's thread; `build()` the GCC compile or the disk cache's load, for any
    thread; `finish(lib)` the kernel, kept in `_BUILT`). Raises where the backend cannot render it."""
    from ms_dynvm.codegen.kernel import canonical_text, prepare_group

    fn = _generalized(fn)
    text = canonical_text(fn)
    k = _BUILT.get(text)
    if k is not None:
        return k, None
    obtain, make = prepare_group(fn, eager_math=True)

    def finish(lib):
        k = _BUILT.get(text)
        if k is None:
            k = _BUILT[text] = make(lib)
        return k

    return None, (obtain, finish)


def compile_candidate(fn):
    """A `codegen.kernel.CompiledKernel` for group `fn` (raises where it cannot be built)."""
    k, todo = prepare_candidate(fn)
    return k if todo is None else todo[1](todo[0]())


def fused_step_fn(kernel, cand: Candidate, types: dict, holders: dict | None = None):
    """The step function `run(args, attrs)` of a compiled candidate: launches prepared once per
    input layout (element strides). Outputs: C-contiguous arrays; where the plan keeps step buffers
    (`holders`: register -> holders, see `replay._fresh`), each output goes to the buffer of the
    unfused step that computed its register (so in-place steps after it write there too), else to
    a buffer of its own."""
    from ms_dynvm.jit.replay import MAX_BUFFER_BYTES, _fresh

    out_shapes = [tuple(types[r].shape) for r in cand.outs]
    out_dts = [dtypes.to_numpy(types[r].dtype) for r in cand.outs]
    in_shapes = [tuple(types[r].shape) if v is None else v[1]
                 for r, v in zip(cand.params, cand.views or [None] * len(cand.params))]
    views = [(k, v[1]) for k, v in enumerate(cand.views) if v is not None]
    launches: dict = {}
    single = len(out_shapes) == 1
    empty = np.empty
    hold = None
    if holders is not None:
        hold = []
        for r, shp, dt in zip(cand.outs, out_shapes, out_dts):
            hs = holders.get(r)
            if hs is None and int(np.prod(shp, dtype=np.int64)) * dt.itemsize <= MAX_BUFFER_BYTES:
                hs = holders[r] = ([None],)
            hold.append(hs[-1] if hs else None)
    specs = list(zip(out_shapes, out_dts, hold or [None] * len(out_shapes)))

    def run(args, attrs):
        if views:
            args = list(args)
            for k, shape in views:
                args[k] = args[k].reshape(shape)
        key = tuple(a.strides for a in args)
        go = launches.get(key)
        if go is None:
            go = launches[key] = kernel.prepare(in_shapes, [tuple(s // a.itemsize for s in a.strides) for a in args],
                                                out_shapes)
        outs = [empty(s, dt) if h is None else _fresh(h, s, dt) for s, dt, h in specs]
        go([a.ctypes.data for a in args] + [o.ctypes.data for o in outs])
        return outs[0] if single else tuple(outs)

    run.__name__ = "fused[" + ",".join(ins.op for ins in cand.fn.body) + "]"
    return run


def warn_failed(e: Exception) -> None:
    """One warning per process for a fused kernel that could not be built."""
    from ms_dynvm.codegen import gcc
    from ms_dynvm.codegen.spec import CodegenError
    from ms_dynvm.metrics import METRICS
    from ms_dynvm.warn import warn_once

    METRICS.fallbacks[f"tier2: fused group not compiled ({type(e).__name__})"] += 1
    if isinstance(e, CodegenError) and not isinstance(e, gcc.CompilerUnavailable):
        return  # a group the backend does not render (counted): no warning
    if isinstance(e, gcc.CompilerUnavailable):
        warn_once("no-compiler", f"ms_dynvm: no C compiler ({e}): replayed regions run unfused", stacklevel=3)
    else:
        warn_once("tier2-fuse", f"ms_dynvm: compiling a fused region kernel failed, running it unfused: {e}",
                  stacklevel=3)
