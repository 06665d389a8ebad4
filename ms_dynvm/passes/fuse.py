"""Fusion: partition a Function's body into groups of consecutive instructions, each of which one
loop nest can execute (one kernel).

`fuse(fn, all_results=False) -> list[Group]` returns groups that cover the body in order: every
instruction is in exactly one group, and a group's `instrs` are consecutive indices. Consecutive
runs are what tier 1 needs (it serves a group while the ops arrive one by one) and they make the
rule "a group whose input is produced between its ops by a non-group op is split there" hold by
construction: nothing outside a group runs between its first and last op.

Each Group has
- `instrs`: indices into `fn.body` (consecutive, in program order);
- `function`: the group as a Function: params = registers its ops read that it does not define
  (first-use order), outputs = registers it defines that a later instruction reads or that are
  outputs of `fn` (definition order) -- or every result when `all_results=True` (tier 1 hands every
  op's result back to Python);
- `kind`: 'elementwise', 'reduction' (primitive reductions sum/mean/max/min/prod inside),
  'norm' (softmax/log_softmax/layer_norm/softmax_grad/softmax_cross_entropy inside) or 'single'
  (one unfusible instruction, run as a library call or eagerly);
- `domain`: the iteration space D (a shape; None for 'single');
- `axes`: the reduced axes A of D (empty for 'elementwise' and 'single').

Which instructions may fuse at all is ONE rule, `fusible(ins, types, backend=..., eager_math=...)`:
the loop structure below (what one nest can execute) and the backend's per-op capability, stated as
data (`codegen.capability` for the C backend: result dtypes per op, float16/bfloat16 eager-equality
facts). Tier 1 asks the same rule before it compiles a group (`jit.compile`, `refusal`) and, by op
name alone, while it records runs (`fusible_ops`).

Grouping rules (greedy, left to right; an instruction that cannot join the open group closes it
and opens the next one):
1. Boundaries (and every instruction `fusible` refuses on the backend): COPY ops other than
   `contiguous` (concat, gather, scatter, ...), matmul, conv/pool, RANDOM, `call`, `arange`,
   argmax-style and other reductions are 'single' groups.
2. Every value a group computes lives in one of two spaces: 'full' (its shape broadcasts to D:
   right-aligned, each dim equal or 1) or 'row' (the shape D without the axes A: a reduction
   result without keepdims, and elementwise ops on such values). A keepdims reduction result is
   'full' (its reduced dims are 1).
3. Elementwise ops (opcodes.ELEMENTWISE: cast, where, masked_fill, clamp, full_like, the
   elementwise grad ops ...; and `fill`) join when their result fits the space of their operands:
   before the group's first reduction D grows by broadcasting (D' = broadcast(D, shape)); after it
   D is fixed. Operands from both spaces cannot mix, unless the row dims are the trailing dims of D
   (A is a prefix of D's axes, e.g. a sum over the batch axis, or a full reduction to a scalar):
   then right-aligned broadcasting indexes the row value correctly. `bias_add` broadcasts along
   `axis`, not right-aligned, so its bias must come from outside the group.
4. Views: a view of a group input (or of such a view) is a 'load' folded into the input's index
   expression; any view qualifies (reshape, transpose, slice, select, broadcast_to, expand_dims,
   squeeze, contiguous). A view of a computed 'full' value joins only when it keeps the
   right-aligned index (reshape/expand_dims/squeeze that only add or drop leading 1s,
   contiguous/identity, broadcast_to); of a 'row' value only reshape/expand_dims to the keepdims
   shape (which makes it 'full'). A load that the group must write out (an output) must fit D; if
   it does not, the group ends before that view.
5. Reductions sum/mean/max/min/prod and the NORM ops join when their input is a load or a 'full'
   value of shape exactly D (the first one sets D to its input shape, which must dominate the
   prologue's shapes) over the group's axes A (the first one sets A; later ones must match:
   softmax = max, sub, exp, sum, div is one group with two reductions over the same A). Norm axes:
   softmax/log_softmax/softmax_grad `axis`, layer_norm [begin_norm_axis, rank), softmax_cross_entropy
   the last axis.
6. After a reduction, an op joins only when it reads a value computed in the group (the epilogue
   uses the reduced value, possibly broadcast back over D) or is a load; an independent
   computation starts a new group.
7. A group of loads only (e.g. one transpose of an input) is a copy kernel whose domain is the
   shape of its first output.
So a group is either an elementwise loop over D, or a "row" group: a loop over the rows D\\A whose
body makes passes over the reduced axes for the prologue, the reductions and the epilogue.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import NamedTuple

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import copy_instr

KINDS = ("elementwise", "reduction", "norm", "single")

# What one loop nest can execute, whatever the backend (rules 3-5 below).
FUSIBLE_ELEMENTWISE = opcodes.ELEMENTWISE | {"fill"}
FUSIBLE_VIEWS = (opcodes.VIEW | {"contiguous"})
FUSIBLE_REDUCE = frozenset({"sum", "mean", "max", "min", "prod"})
FUSIBLE_NORM = frozenset({"softmax", "log_softmax", "layer_norm", "softmax_grad", "softmax_cross_entropy"})
FUSIBLE = FUSIBLE_ELEMENTWISE | FUSIBLE_VIEWS | FUSIBLE_REDUCE | FUSIBLE_NORM


# --- the fusibility rule -----------------------------------------------------------------------
class Fusible(NamedTuple):
    """`fusible`'s answer: true when the op fuses; else `reason` says why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Fusible(True)


# Each backend states what it computes as data in a capability module with two answers: by op name
# (`op_refusal(op, eager_math)`) and by instruction (`refusal(ins, types, eager_math)`), each a
# reason or None. Adding a backend adds its module here.
BACKENDS = {"c": "ms_dynvm.codegen.capability"}


@functools.cache
def _capability(backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    return importlib.import_module(BACKENDS[backend])


def fusible(ins: "Instr | str", types: dict | None = None, *, backend: str | None = "c",
            eager_math: bool = True) -> Fusible:
    """THE rule for "does this fuse, on this backend": whether instruction `ins` (register types
    `types`) can be computed inside a fused kernel of `backend` with eager's results (`eager_math`:
    the kernels follow MindSpore CPU's formulas, and ops whose kernel they do not reproduce are
    refused). Given an op name alone (`types` None), whether the op can fuse for some dtypes: what
    a frontend can ask before the types are known. `backend=None` asks the loop structure only.
    Tier 1 (through `jit.compile`) and the fuse pass both ask this."""
    op = ins if isinstance(ins, str) else ins.op
    if op not in FUSIBLE:
        return Fusible(False, f"op {op} is not fusible")
    if backend is None:
        return YES
    cap = _capability(backend)
    why = cap.op_refusal(op, eager_math) if types is None else cap.refusal(ins, types, eager_math)
    return YES if why is None else Fusible(False, why)


def fusible_ops(backend: str | None = "c", eager_math: bool = True) -> frozenset:
    """The op names that fuse for some dtypes (`fusible(op)`)."""
    return frozenset(op for op in FUSIBLE if fusible(op, backend=backend, eager_math=eager_math))


def refusal(fn: Function, *, backend: str | None = "c", eager_math: bool = True) -> str | None:
    """Why group `fn` cannot run as one fused kernel of `backend` with eager's results (the first
    instruction `fusible` refuses), or None."""
    if backend == "c" and any(t.dtype == "bf16" for t in fn.types.values()):
        return "bfloat16 tensors"  # (see codegen.capability: checked first, whatever the ops)
    for ins in fn.body:
        v = fusible(ins, fn.types, backend=backend, eager_math=eager_math)
        if not v:
            return v.reason
    return None


FULL, ROW, LOAD = "full", "row", "load"


@dataclass
class Group:
    instrs: list[int]
    function: Function
    kind: str
    domain: tuple | None = None
    axes: tuple[int, ...] = ()

    @property
    def params(self) -> list[int]:
        return self.function.params

    @property
    def outputs(self) -> list[int]:
        return self.function.outputs


# --- shape helpers -----------------------------------------------------------------------------
def fits(shape, domain) -> bool:
    """`shape` broadcasts to `domain` (right-aligned, each dim equal or 1)."""
    if len(shape) > len(domain):
        return False
    return all(s == d or s == 1 for s, d in zip(reversed(tuple(shape)), reversed(tuple(domain))))


def row_shape(domain, axes) -> tuple:
    return tuple(d for i, d in enumerate(domain) if i not in axes)


def keepdims_shape(domain, axes) -> tuple:
    return tuple(1 if i in axes else d for i, d in enumerate(domain))


def _strip_ones(shape) -> tuple:
    shape = tuple(shape)
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


# --- the open group ----------------------------------------------------------------------------
@dataclass
class _Open:
    start: int
    end: int = 0  # exclusive
    domain: tuple | None = None
    axes: tuple | None = None  # set by the first reduction
    space: dict = field(default_factory=dict)  # reg -> FULL | ROW | LOAD
    has_reduce: bool = False
    has_norm: bool = False

    def kind(self) -> str:
        return "norm" if self.has_norm else "reduction" if self.has_reduce else "elementwise"

    def grow(self, shape):
        """The domain after admitting a 'full' value of `shape`, or None if it does not fit."""
        shape = tuple(shape)
        if self.domain is None:
            return shape
        if self.axes is not None:
            return self.domain if fits(shape, self.domain) else None
        try:
            return registry.broadcast_shapes(self.domain, shape)
        except registry.ShapeError:
            return None

    def rows_are_trailing(self) -> bool:
        return self.axes is not None and tuple(sorted(self.axes)) == tuple(range(len(self.axes)))


def _admit(g: _Open, ins: Instr, types: dict, backend: str | None, eager_math: bool) -> dict | None:
    """The changes to `g` if `ins` joins it (a dict of new field values), else None."""
    op = ins.op
    if not fusible(ins, types, backend=backend, eager_math=eager_math):
        return None
    regs = [int(r) for r in ins.regs()]
    inner = [r for r in regs if r in g.space]
    if g.has_reduce and not inner and op not in FUSIBLE_VIEWS:
        return None  # rule 6
    out_shapes = [tuple(types[r].shape) for r in ins.outs]

    if op in FUSIBLE_VIEWS:
        x = int(ins.args[0])
        src = g.space.get(x, LOAD)
        if src == LOAD:
            return {"space": {ins.outs[0]: LOAD}}
        if src == FULL:
            in_shape = tuple(types[x].shape)
            ok = (op in ("reshape", "expand_dims", "squeeze", "contiguous")
                  and _strip_ones(in_shape) == _strip_ones(out_shapes[0])) or op == "broadcast_to"
            dom = g.grow(out_shapes[0]) if ok else None
            return None if dom is None else {"domain": dom, "space": {ins.outs[0]: FULL}}
        # ROW: back to the keepdims shape
        if op in ("reshape", "expand_dims") and out_shapes[0] == keepdims_shape(g.domain, g.axes):
            return {"space": {ins.outs[0]: FULL}}
        if op == "contiguous":
            return {"space": {ins.outs[0]: ROW}}
        return None

    if op in FUSIBLE_ELEMENTWISE:
        if op == "bias_add" and isinstance(ins.args[1], Reg) and int(ins.args[1]) in g.space:
            return None
        spaces = {g.space[r] for r in inner}
        if ROW in spaces and (spaces - {ROW}):
            if not g.rows_are_trailing():
                return None
            spaces = {FULL}
        if spaces == {ROW}:
            if fits(out_shapes[0], row_shape(g.domain, g.axes)):
                return {"space": {ins.outs[0]: ROW}}
            if not g.rows_are_trailing():  # an outside operand broadcasts the row value over D
                return None
        dom = g.grow(out_shapes[0])
        return None if dom is None else {"domain": dom, "space": {ins.outs[0]: FULL}}

    # reductions and norms
    x = int(ins.args[0])
    if g.space.get(x, LOAD) == ROW:
        return None
    in_shape = tuple(types[x].shape)
    rank = len(in_shape)
    try:
        if op in FUSIBLE_REDUCE:
            axes = registry.norm_axes(op, ins.attrs["axis"], rank)
        elif op in ("softmax", "log_softmax", "softmax_grad"):
            a = ins.attrs["axis"]
            a = a[0] if isinstance(a, (tuple, list)) else a
            axes = (registry.norm_axis(op, a, rank),) if rank else ()
        elif op == "layer_norm":
            axes = tuple(range(registry.norm_axis(op, ins.attrs["begin_norm_axis"], rank), rank))
        else:  # softmax_cross_entropy
            axes = (rank - 1,)
    except registry.ShapeError:
        return None
    axes = tuple(sorted(axes))
    if not axes:
        return None
    other = [int(a) for a in ins.args[1:] if isinstance(a, Reg)]
    if op == "softmax_grad" and tuple(types[other[0]].shape) != in_shape:
        return None
    if op in ("softmax_grad", "softmax_cross_entropy", "layer_norm"):
        if any(g.space.get(r, LOAD) == ROW for r in other):
            return None
    if g.axes is None:
        if g.domain is not None:
            try:
                if registry.broadcast_shapes(g.domain, in_shape) != in_shape:
                    return None
            except registry.ShapeError:
                return None
    elif in_shape != g.domain or axes != g.axes:
        return None
    space = {}
    for r, s in zip(ins.outs, out_shapes):
        if s == in_shape or (len(s) == rank and fits(s, in_shape)):
            space[r] = FULL
        elif s == row_shape(in_shape, axes):
            space[r] = ROW
        else:
            return None
    changes = {"domain": in_shape, "axes": axes, "space": space, "has_reduce": True}
    if op in FUSIBLE_NORM:
        changes["has_norm"] = True
    return changes


def _commit(g: _Open, changes: dict) -> None:
    for k, v in changes.items():
        if k == "space":
            g.space.update(v)
        else:
            setattr(g, k, v)


def _scan(fn: Function, start: int, limit: int, backend: str | None, eager_math: bool) -> _Open:
    g = _Open(start, start)
    for i in range(start, limit):
        changes = _admit(g, fn.body[i], fn.types, backend, eager_math)
        if changes is None:
            break
        _commit(g, changes)
        g.end = i + 1
    return g


def _outputs(fn: Function, lo: int, hi: int, later_uses: dict, all_results: bool) -> list[int]:
    fn_outs = set(fn.outputs)
    outs = []
    for i in range(lo, hi):
        for r in fn.body[i].outs:
            if all_results or r in fn_outs or later_uses.get(r, -1) >= hi:
                outs.append(r)
    return outs


def _sub_function(fn: Function, lo: int, hi: int, outputs: list[int], k: int) -> Function:
    defined, params = set(), []
    body = []
    for i in range(lo, hi):
        ins = fn.body[i]
        for r in ins.regs():
            r = int(r)
            if r not in defined and r not in params:
                params.append(r)
        defined.update(ins.outs)
        body.append(copy_instr(ins))
    regs = set(params) | defined
    types = {r: t for r, t in fn.types.items() if r in regs}
    return Function(f"{fn.name}_g{k}", params, body, list(outputs), types)


def fuse(fn: Function, all_results: bool = False, *, backend: str | None = "c",
         eager_math: bool = True) -> list[Group]:
    """Partition `fn.body` into fusion groups (see the module docstring for the rules); an
    instruction joins a group only where `fusible` says it fuses on `backend`."""
    last_use: dict[int, int] = {}
    for i, ins in enumerate(fn.body):
        for r in ins.regs():
            last_use[int(r)] = i
    groups: list[Group] = []
    i, n = 0, len(fn.body)
    while i < n:
        limit = n
        while True:
            g = _scan(fn, i, limit, backend, eager_math)
            if g.end == i:  # not fusible: a group of its own
                break
            bad = _unfit_load(fn, g, last_use, all_results)
            if bad is None:
                break
            limit = max(bad, i + 1)  # rule 4: end the group before the view
        if g.end == i:
            hi, kind, dom, axes = i + 1, "single", None, ()
        else:
            hi, kind, dom, axes = g.end, g.kind(), g.domain, g.axes or ()
            if dom is None:  # only loads: the domain is what the group writes
                outs = _outputs(fn, i, hi, last_use, all_results)
                dom = tuple(fn.types[outs[0]].shape) if outs else ()
        outs = _outputs(fn, i, hi, last_use, all_results)
        groups.append(Group(list(range(i, hi)), _sub_function(fn, i, hi, outs, len(groups)), kind, dom, axes))
        i = hi
    return groups


def _unfit_load(fn: Function, g: _Open, last_use: dict, all_results: bool) -> int | None:
    """Index of the first view whose load result the group must write but that does not fit D."""
    dom = g.domain
    for r in _outputs(fn, g.start, g.end, last_use, all_results):
        if g.space.get(r) != LOAD:
            continue
        shape = tuple(fn.types[r].shape)
        if dom is None:
            dom = shape
            continue
        if not fits(shape, dom):
            return next(i for i in range(g.start, g.end) if r in fn.body[i].outs)
    return None
