"""Tier 1: op-stream fusion inside dispatch (ARCHITECTURE.md, "Two execution tiers").

A *run* is a maximal sequence of consecutive dispatched ops, in one basic block, whose VM lowerings are
all fusible (elementwise, views folded into indexing, reductions, softmax/layer norm). While ops run
eagerly, the recorder's instructions for the current run are collected together with, for every tensor
argument, where it came from:

- `OutSrc` ("out", j, k): result k of step j of the run;
- `ExtSrc` ("ext", e): external input e, bound at the run's first op from its provenance: an
  argument of the first op (`ArgProv` ("arg", p)), or an argument/result of one of the last
  `HISTORY` dispatched ops (`HistProv` ("hist", d, side, i, op)), checked at bind time against the op
  name recorded at that position;
- or, for a 0-d tensor that cannot be bound that way (MindSpore turns the Python scalar of `x - 1.0`
  into a fresh 0-d tensor at every call), `ConstProv` ("const", bytes, dtype): its value, read when
  the run was recorded, is what the kernel uses, and when the op arrives the actual 0-d argument must
  hold exactly those bytes (a guard) or the run is abandoned.

A step whose external input cannot be bound at the first op (it was made between the run's ops by code
that is not dispatched, or long before) splits the run there. When a run ends, its key (steps, sources,
provenances) is counted; the cost model (`ms_dynvm.cost.model`) decides when it is hot and pays to
compile. The run's instructions become one IR Function (params: external inputs; outputs: every op
result, since every result goes back to Python), handed to the executor, `ms_dynvm.jit`: it asks
the fusibility rule (`passes.fuse.fusible`), generalises the Function over a shape family
(`ms_dynvm.runtime.signature`), runs the pass pipeline, compiles it (`ms_dynvm.codegen`) and
installs the kernel (`jit.compile`); launches, result memory and OpenMP threads are `jit.launch`'s.
This module keeps what needs the arriving ops: run tracking, binding, matching, serving.

Serving: at the first op of a compiled run the handler binds the external inputs, checks the
signature's guards, runs ONE kernel that writes every op result into NumPy buffers wrapped zero-copy as
MindSpore tensors, and returns the first op's result without running the op. As the following ops
arrive, each is checked against the recorded step (name, non-tensor arguments, identity of every tensor
argument: each must be a result this run served or a bound external input) and gets its precomputed
result. On any mismatch the run is abandoned and the op (and everything after it) runs eagerly, so
every tensor handed to Python is fully computed. MindSpore's autograd records the original ops with
the returned results, so gradients stay right; backward ops are fused by the same machinery.
Exceptions: a step whose op is a view (VIEW_OPS: transpose, expand_dims, squeeze) is run for real on
its arriving arguments, so that the script's view shares its base's memory as in eager (a later
in-place write to either shows through the other); the kernel still computes through it. And a sync
point, an undispatched write (`__setitem__`, `Tensor.assign_value`, `Parameter.set_data`) or a
`@jit` call between two ops of a served run abandons it there (frontend/sync.py): the kernel read its
inputs at the first op.

Served ops are counted (`fused_ops`) but not re-recorded; later ops see their results as fresh inputs.

Memory: kernel results are NumPy arrays (`jit.launch.run`) wrapped zero-copy with
`Tensor.from_numpy`, by default from the memory pool (`ms_dynvm.runtime.memory_pool`, option
`pool_results`): a buffer goes back to the pool when the last tensor (or array view) over it
dies, and is reused only after the next safe point (the start of the next kernel launch).
"""

from __future__ import annotations

import math
from time import perf_counter as _perf
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from mindspore import Tensor
from mindspore._c_expression import TensorPy

try:  # MindSpore 2.9+ moved it; the old path still works with a deprecation warning.
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover
    from mindspore.common.api import _pynative_executor

_asnumpy = TensorPy.asnumpy  # the unhooked method: reading a 0-d constant is not a user sync point
from ctypes import string_at as _string_at

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.cost.model import SizeSwitch  # noqa: F401 - re-export (tests patch it here)
from ms_dynvm.cost.step import StepSwitch
from ms_dynvm.frontend import recorder as _recorder
from ms_dynvm.frontend.normalize import INPLACE as _INPLACE
from ms_dynvm.frontend.normalize import vm_dtype
from ms_dynvm.ir.function import Function
from ms_dynvm.jit import launch as _jl
from ms_dynvm.jit.compile import Compiler, GroupKernels
from ms_dynvm.jit.launch import pool_for as _pool_for  # noqa: F401 - re-export (tests)
from ms_dynvm.jit.launch import set_kernel_threads as _set_kernel_threads
from ms_dynvm.metrics import METRICS
from ms_dynvm.passes.fuse import fusible_ops
from ms_dynvm.runtime.signature import InputDesc

HISTORY = 16
# A run is cut after this many ops: a stream of fusible ops with no sync point would otherwise make
# one group of thousands of ops (seen: a 27-op chain called in a loop without a sync made a run of
# ~4096 ops whose C source gcc was still compiling after 6 minutes; tests/frontend/test_tier1.py checks
# the cut).
MAX_RUN_STEPS = 64
# A group abandoned this many times in a row after the same preceding op is not launched there any
# more, except one try in CTX_RETRY_EVERY.
CTX_MAX_FAILS = 3
CTX_RETRY_EVERY = 32
# Groups kept per op sequence whose scalar arguments or constants differ (see end_run).
MAX_VARIANTS = 4
# An eager op this recent (seconds) means MindSpore's worker threads are awake (they spin ~0.25 s
# after an op, measured), so one eager probe of a group measures it fairly (see SizeSwitch).
WARM_S = 0.05
_T1KEY = _recorder._T1KEY  # tier 1's tokens (the recorder clears them on in-place writes)
_RKEY = _recorder._KEY  # the recorder's tag: (epoch, register number)
_MISS = object()
_EAGER = object()  # see Tier1.serve
_from_numpy = TensorPy.from_numpy
_TOKEN_SPAN = 1 << 24  # tokens of one launch: serial * span + offset (offsets < span)

# Ops whose attributes hold sizes (reshape/broadcast_to targets, slice bounds, fill's shape) are
# left out of runs: their dispatched arguments carry the dynamic dims as literals, so every size
# would be a new run key and a new compile (measured without this rule: 892 compiles in a 2000-step
# soak with seq_len varying).
SIZED_VIEWS = frozenset({"reshape", "broadcast_to", "slice", "select"})
SIZED_OPS = SIZED_VIEWS | {"fill"}
# The ops a run may hold: those that fuse on the C backend (`passes.fuse.fusible`, asked by op name;
# the dtype-dependent part is asked per group before it compiles, `jit.compile`), less SIZED_OPS.
FUSIBLE = fusible_ops(backend="c", eager_math=False) - SIZED_OPS
FUSIBLE_EAGER_MATH = fusible_ops(backend="c", eager_math=True) - SIZED_OPS
# Under eager_math log_softmax does not fuse (`codegen.capability.EAGER_MATH_UNFUSED`), nor does its
# backward, LogSoftmaxGrad, which the recorder lowers to dy - exp(y) * sum(dy) (ops fused
# elsewhere): MindSpore's kernel for it is not reproduced either (served, a gradient was up to 7e-6
# off eager). Dispatched op names tier 1 never fuses under eager_math.
UNFUSED_NAMES_EAGER_MATH = frozenset({"LogSoftmaxGrad"})


def _requires_grad() -> bool:
    """MindSpore is recording the ops for autograd (the forward of value_and_grad / grad).

    Why tier 1 asks: an op dispatched in the legacy (prim, name, inputs) form (it runs through
    `Primitive._run_op` / `run_op_async`: FloorMod of `%`, nn.LayerNorm's LayerNorm, BiasAdd) whose
    handler returns a result without calling the op can hang MindSpore 2.10 in
    `PyNativeExecutor::PostDispatchGrad` -> `StubNode::WaitPipeline` while it records for autograd
    (measured: `value_and_grad` of `sin(cat([x, x]) ** 3) % cat([x, x]) ** 3` under a handler that
    returns FloorMod's result computed elsewhere hangs at the first call, MindSpore alone and with
    ms_dynvm; running the op in the handler and returning another tensor instead gives wrong
    gradients). So while MindSpore records, tier 1 neither serves such a step nor records it into a
    run: a template with one is not launched (`legacy_op_under_grad`), a served run reaching one
    is abandoned there, and a run being recorded ends before it."""
    return _pynative_executor.requires_grad()


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Tensor):
        return "<T>"
    if hasattr(v, "name") and hasattr(v, "attrs"):  # a legacy primitive: its args carry the attrs
        return "<prim>"
    return v


def _op_args(args) -> tuple:
    """The op's own arguments (a legacy `(prim, name, inputs)` form unwrapped)."""
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple:
        return args[2]
    return args


def _tensors(args) -> list:
    """Tensor arguments in order (legacy `(prim, name, inputs)` forms included)."""
    return [a for a in _op_args(args) if isinstance(a, Tensor)]


def _has_tensor_sequence(args) -> bool:
    for a in _op_args(args):
        ta = type(a)
        if ta is tuple or ta is list:
            for e in a:
                # Plain numbers first: isinstance(3, Tensor) goes through Tensor's ABCMeta.
                if type(e) not in _ATOMS and isinstance(e, Tensor):
                    return True
    return False


_ATOMS = (int, float, bool, str, type(None))
_CONSTS = ("const", "sized")  # provenances of external inputs that are constants (0-d arrays)


# Where a step's tensor argument comes from (`Step.srcs`), and where an external input is bound
# from (its provenance, `RunTemplate.ext`). Tuples whose first field names the kind, so that they
# compare, hash and key runs as plain tuples do; the names are for reading them.
class OutSrc(NamedTuple):
    kind: str  # "out"
    step: int  # result `k` of step `step` of the run
    k: int


class ExtSrc(NamedTuple):
    kind: str  # "ext"
    e: int  # external input e


class ArgProv(NamedTuple):
    kind: str  # "arg"
    pos: int  # argument `pos` of the run's first op


class HistProv(NamedTuple):
    kind: str  # "hist"
    d: int  # the d-th newest op before the run's first op
    side: str  # "arg" | "out"
    i: int  # its argument / result i
    op: object  # its op name (checked at bind time)


class ConstProv(NamedTuple):
    kind: str  # "const": a 0-d tensor's value, guarded when the op arrives
    data: bytes
    dtype: str


class SizedProv(NamedTuple):
    kind: str  # "sized": a 0-d tensor holding sized scalar `scalar` (see Tier1._lift)
    scalar: int
    dtype: str
SIZED = "<sized scalar>"  # in a step key: a float argument that is a function of the sizes (see _lift)


def step_key(name: str, args) -> tuple:
    # The common case without recursion: tensors and plain scalars only.
    out = []
    for a in args:
        t = type(a)
        if t is Tensor:
            out.append("<T>")
        elif t in _ATOMS:
            out.append(a)
        else:
            return (name, _freeze(args))
    return (name, tuple(out))


def _args_match(frozen: tuple, args) -> bool:
    """`_freeze(args) == frozen`, without building the frozen tuple (the serving hot path)."""
    if len(frozen) != len(args):
        return False
    for f, a in zip(frozen, args):
        if type(a) is Tensor or isinstance(a, Tensor):
            if f != "<T>":
                return False
        elif isinstance(a, (list, tuple)):
            if not isinstance(f, tuple) or not _args_match(f, a):
                return False
        elif not _strict_eq(_freeze(a), f):
            return False
    return True


def _strict_eq(a, f) -> bool:
    """`a == f` for frozen arguments (`_freeze`), and of the same type at every level, and, for float
    zeros, of the same sign: `x * 2` and `x * 2.0` (or `np.float64(2.0)`) give different result dtypes
    and `x * 0.0` and `x * -0.0` different signs, though the values compare (and hash) equal. NaN never
    equals (conservative: such an op is not served)."""
    if type(a) is not type(f):
        return False
    if type(a) is tuple:
        return len(a) == len(f) and all(_strict_eq(x, y) for x, y in zip(a, f))
    if isinstance(a, float):
        return a == f and math.copysign(1.0, a) == math.copysign(1.0, f)
    return a == f


@dataclass(slots=True)
class Step:
    key: tuple
    srcs: tuple  # per tensor argument: OutSrc | ExtSrc
    n_out: int
    view: bool = False  # the op is a view (VIEW_OPS): served by running it (see RunTemplate.view_steps)


# Fusible ops whose result is a view of their input in MindSpore (it shares the input's memory: a
# later in-place write to either shows through the other). A kernel's result would be a copy, so
# a served group runs these ops themselves on the tensors it handed back (`Tier1.serve`); the
# kernel still computes through them (index expressions).
VIEW_OPS = opcodes.VIEW & FUSIBLE


class _StepPlan:
    """How a served step recognises its op: name, and either positional argument checks (`flat`:
    arity, the non-tensor arguments by position, the tensor positions) or the generic frozen-args
    comparison when tensors are nested (lists) or the op uses the legacy (prim, name, args) form."""

    __slots__ = ("name", "frozen", "flat", "nargs", "consts", "tpos", "checks", "n_out")

    def __init__(self, step: Step, checks: tuple) -> None:
        self.name, self.frozen = step.key
        self.checks = checks
        self.n_out = step.n_out
        frozen = self.frozen
        legacy = len(frozen) == 3 and frozen[0] == "<prim>" and type(frozen[1]) is str
        nested = any(isinstance(f, tuple) and "<T>" in _flatten(f) for f in frozen)
        self.flat = not (legacy or nested)
        self.nargs = len(frozen)
        self.consts = tuple((i, f) for i, f in enumerate(frozen) if f != "<T>")
        self.tpos = tuple(i for i, f in enumerate(frozen) if f == "<T>")


# Why a generated matcher rejected an op (it returns one of these ints instead of the tensors).
_FAIL_REASONS = {1: "op_mismatch", 2: "arity_mismatch", 3: "input_mismatch", 4: "constant_mismatch"}


def _slow_const_ne(a, f) -> bool:
    return isinstance(a, Tensor) or not _strict_eq(_freeze(a), f)


def _make_matcher(plan: "_StepPlan", check_tokens: bool, n_ext: int = 0):
    """A Python function `m(args, base, toks)` specialised to one step (generated source, compiled
    once per group): the step's tensor arguments if `args` match it, else a failure code
    (`_FAIL_REASONS`). It checks the step's name-independent arguments and, with `check_tokens`, each
    tensor's identity: a result of the launch carries `base` + its offset, external input e (e <
    `n_ext`) the token `toks[e]` it carried when bound (see `Tier1._ext_tokens`), a constant its
    bytes. Straight-line code: this runs for every served op."""
    ns = {"_T": Tensor, "_K": _T1KEY, "_R": _RKEY, "_sa": _string_at, "_vd": _vm_dtype, "_am": _args_match,
          "_tensors": _tensors, "_ne": _slow_const_ne}
    lines = ["def m(args, base, toks=None, svals=None):"]
    if plan.flat:
        lines.append(f"    if len(args) != {plan.nargs}: return 1")
        for n, (i, f) in enumerate(plan.consts):
            if f is SIZED:  # a sized scalar: any float here; its value is checked apart
                lines.append(f"    if type(args[{i}]) is not float: return 1")
                continue
            ns[f"c{n}"] = f
            ns[f"k{n}"] = type(f)
            lines.append(f"    a = args[{i}]")
            if isinstance(f, float) and (f == 0 or f != f):  # the sign of a zero; NaN (see _strict_eq)
                lines.append(f"    if _ne(a, c{n}): return 1")
            else:  # (the same type and value: a fast yes; anything else decided by _strict_eq)
                lines.append(f"    if not (type(a) is k{n} and a == c{n}) and _ne(a, c{n}): return 1")
        names = [f"t{k}" for k in range(len(plan.tpos))]
        for name, i in zip(names, plan.tpos):
            lines.append(f"    {name} = args[{i}]")
            lines.append(f"    if type({name}) is not _T and not isinstance({name}, _T): return 1")
    else:
        ns["frozen"] = plan.frozen
        lines.append("    if not _am(frozen, args): return 1")
        lines.append("    ts = _tensors(args)")
        lines.append(f"    if len(ts) != {len(plan.checks)}: return 2")
        names = [f"ts[{k}]" for k in range(len(plan.checks))]
    if check_tokens:
        if len(names) != len(plan.checks):
            lines.append("    return 2")
        for k, (name, want) in enumerate(zip(names, plan.checks)):
            if type(want) is int and want < n_ext:
                # A token, or a recorder tag (a tuple: see `_ext_tokens`).
                lines.append(f"    v = toks[{want}]")
                lines.append(f"    if {name}._get_user_data(_R if type(v) is tuple else _K) != v: return 3")
            elif type(want) is int:
                lines.append(f"    if {name}._get_user_data(_K) != base + {want}: return 3")
            elif want[0] == "sized":  # a 0-d tensor holding this launch's sized scalar want[1]
                ns[f"d{k}"] = _ms_dtype(want[2])
                lines.append(f"    if {name}.shape != () or {name}._dtype is not d{k} "
                             f"or {name}._item() != svals[{want[1]}]: return 4")
            else:  # a constant: a 0-d tensor of the recorded dtype holding the recorded value
                value = np.frombuffer(want[0], dtype=dtypes.to_numpy(want[1])).reshape(()).item()
                ms_dtype = _ms_dtype(want[1])
                if ms_dtype is None or value != value:  # no dtype object / NaN: compare the bytes
                    ns[f"b{k}"] = want[0]
                    lines.append(f"    if ({name}.shape != () or _vd({name}) != {want[1]!r} "
                                 f"or _sa({name}._data_ptr(), {name}._itemsize) != b{k}): return 4")
                    continue
                # `_item()` (`item()` without ms_dynvm's sync hook) is exact for every dtype (a
                # Python float holds any float16/32/64 value, an int any integer), so equal items
                # of one dtype are equal bits, except for the sign of a zero, checked apart.
                ns[f"d{k}"], ns[f"v{k}"] = ms_dtype, value
                cond = f"{name}._dtype is not d{k} or {name}._item() != v{k}"
                if value == 0 and isinstance(value, float):
                    ns["_cs"] = math.copysign
                    cond += f" or _cs(1.0, {name}._item()) != {math.copysign(1.0, value)!r}"
                lines.append(f"    if {name}.shape != () or {cond}: return 4")
    lines.append("    return ts" if not plan.flat else f"    return [{', '.join(names)}]")
    exec(compile("\n".join(lines), f"<ms_dynvm step matcher {plan.name}>", "exec"), ns)
    return ns["m"]


_MS_DTYPES: dict | None = None


def _ms_dtype(vm: str):
    """The MindSpore dtype object (a singleton, compared with `is`) of a VM dtype, or None."""
    global _MS_DTYPES
    if _MS_DTYPES is None:
        import mindspore.common.dtype as msd

        found = {}
        for v in vars(msd).values():
            if isinstance(v, msd.Type):
                try:
                    found.setdefault(vm_dtype(v), v)
                except (ValueError, KeyError, TypeError):
                    pass
        _MS_DTYPES = found
    return _MS_DTYPES.get(vm)


def _flatten(v):
    if isinstance(v, tuple):
        for x in v:
            yield from _flatten(x)
    else:
        yield v


class Profile(NamedTuple):
    """What `Tier1._lift` compares between two runs of one op sequence."""

    ops: tuple  # the body's op names
    imms: dict  # (instruction, operand) -> float immediate
    dts: dict  # instruction -> its result dtype (instructions with a float immediate)
    keys: tuple  # the steps' keys
    ninstr: tuple  # instructions per step
    shapes: list  # the tensor inputs' shapes (template order)
    consts: list  # the constants' (dtype, value)
    descs: list  # the inputs' InputDescs
    run_key: tuple


class SizedScalar(NamedTuple):
    """A kernel input computed from the sizes at each launch (see `Tier1._lift`): the element count
    n of `axes` of tensor input `input` (kind "n") or 1/n (kind "1/n"), written into `array` (a 0-d
    kernel input at a fixed address); `rounded`: held by a 0-d tensor, so rounded to its dtype."""

    input: int
    axes: tuple
    kind: str
    array: np.ndarray
    rounded: bool


@dataclass
class RunTemplate(GroupKernels):
    """A recorded run's group: how its ops are recognised and bound (the frontend's part), and,
    from `GroupKernels`, its kernels, launches and statistics (the executor's part, `ms_dynvm.jit`)."""

    key: tuple
    steps: list
    ext: list  # provenance per external input
    # Launches abandoned in a row, per context (the op dispatched just before the first op): a
    # group whose first op also starts other op sequences is not launched where it never completes.
    ctx_fails: dict = field(default_factory=dict)
    ctx_skips: int = 0
    # Sized scalars (see Tier1._lift): per scalar a SizedScalar; per step, the (argument position,
    # scalar index) its arriving op must hold; and where each sits in the run's instructions:
    # (instruction, operand, dtype).
    sized: list = field(default_factory=list)
    sized_checks: dict = field(default_factory=dict)
    sized_operands: list = field(default_factory=list)

    def __post_init__(self) -> None:
        # External inputs are bound tensors first, then constants; `ext` is reordered to match, and
        # the steps' ("ext", e) sources renumbered, so that kernel parameter e is bound input e.
        order = ([e for e, p in enumerate(self.ext) if p.kind not in _CONSTS]
                 + [e for e, p in enumerate(self.ext) if p.kind in _CONSTS])
        if order != list(range(len(self.ext))):
            new_index = {old: new for new, old in enumerate(order)}
            self.ext = [self.ext[e] for e in order]
            self.steps = [Step(s.key, tuple(ExtSrc("ext", new_index[src.e]) if src.kind == "ext" else src
                                            for src in s.srcs), s.n_out, s.view) for s in self.steps]
            self.ext_order = order
        else:
            self.ext_order = None
        self.n_tensor_ext = sum(1 for p in self.ext if p.kind not in _CONSTS)
        self.ext_tensors = self.ext[:self.n_tensor_ext]
        # ("sized", k, dtype): a constant whose value is sized scalar k (see Tier1._lift), written
        # at each launch.
        self.const_arrays = [np.frombuffer(p.data, dtype=dtypes.to_numpy(p.dtype)).reshape(()).copy()
                             if p.kind == "const" else np.zeros((), dtypes.to_numpy(p.dtype))
                             for p in self.ext[self.n_tensor_ext:]]
        self.first_alias = [(i, self.ext[src.e].pos) for i, src in enumerate(self.steps[0].srcs)
                            if src.kind == "ext" and self.ext[src.e].kind == "arg"
                            and self.ext[src.e].pos != i]
        # Serving plan per step: how to match the arriving op's arguments, and the token (an int
        # offset from the launch's base token, see `_launch`) or constant each tensor argument must
        # carry. Tokens: external input e -> e; result k of step j -> n_ext + (its index among all
        # results).
        n_ext = len(self.ext)
        first_out, i = [], n_ext
        for st in self.steps:
            first_out.append(i)
            i += st.n_out
        self.plans = []
        for st in self.steps:
            checks = []
            for src in st.srcs:
                if src.kind == "out":
                    checks.append(first_out[src.step] + src.k)
                    continue
                prov = self.ext[src.e]
                if prov.kind == "const":
                    checks.append((prov.data, prov.dtype))
                elif prov.kind == "sized":
                    checks.append(prov)
                else:
                    checks.append(src.e)
            self.plans.append(_StepPlan(st, tuple(checks)))
        # Only external inputs that a later step checks need a token (step 0's arguments are
        # bound, not checked).
        used = {c for plan in self.plans[1:] for c in plan.checks if type(c) is int}
        self.tag_ext = [e for e in range(self.n_tensor_ext) if e in used]
        # The serving hot path: per step its op name, its generated matcher (step 0's binds and
        # checks no tokens), where its results sit among all results, and (for a run served
        # eagerly, see Tier1.eager_done) which of its results to tag.
        self.names = [plan.name for plan in self.plans]
        self.matchers = [_make_matcher(plan, j > 0, n_ext) for j, plan in enumerate(self.plans)]
        # Steps dispatched in the legacy (prim, name, inputs) form: never served while MindSpore
        # records a graph for autograd (see `_requires_grad`).
        self.legacy_steps = frozenset(j for j, plan in enumerate(self.plans) if not plan.flat
                                      and len(plan.frozen) == 3 and plan.frozen[0] == "<prim>"
                                      and type(plan.frozen[1]) is str)
        self.out_pos = [(first_out[j] - n_ext, st.n_out) for j, st in enumerate(self.steps)]
        # Steps whose op is a view (VIEW_OPS): served by running the op on the arriving arguments
        # (the tensors the group handed back, or the script's own), as an eagerly run group's steps
        # are (`Tier1.eager_done`), so that the script's view shares its base's memory as in eager.
        self.view_steps = frozenset(j for j, st in enumerate(self.steps) if st.view)
        # Per result (all steps' results in order): its index among the kernel's outputs, or None
        # for a view step's (never served from the kernel, so not written: the kernel computes
        # through the view and keeps its copy out of memory).
        self.kernel_out, n = [], 0
        for st in self.steps:
            if st.view:
                self.kernel_out += [None] * st.n_out
            else:
                self.kernel_out += range(n, n + st.n_out)
                n += st.n_out
        # Every result carries its token when it is handed back (the tensor the user gets is a
        # copy of the handler's, made with its user data at that moment, so a tag put on the
        # handler's tensor later would not reach it): a later run finds it by that token
        # (`Tier1._provenance`) and binds it.
        self.n_ext = n_ext
        self.step_tags = [[(k, n_ext + f + k) for k in range(n)] for f, n in self.out_pos]


class _OpenRun:
    """The run being recorded (eager)."""

    def __init__(self, block, start: int, hist_snapshot: list, epoch):
        self.block = block
        self.start = start
        self.end = start
        # A run may go on across a block end at an nn.Cell boundary (not a sync point) into the
        # next block of the same Program (`Tier1.block_closed`): the earlier (block, start, end).
        self.segments: list = []
        self.epoch = epoch
        self.across = False
        self.steps: list[Step] = []
        self.step_instrs: list = []  # instructions per step (where a step's operands sit in the body)
        self.ext: list = []
        self.ext_tags: list = []
        self.ext_regs: list = []
        self.out_tags: dict = {}  # recorder tag -> (j, k)
        self.result_regs: list = []
        # History before the run, newest first: (name, arg tensors, out tensors, arg tags, out tags).
        self.hist = hist_snapshot
        self.first_arg_tags: list = []
        self.seconds = 0.0


class _Pending:
    """A compiled run being served, or (`eager`) run eagerly without recording (see `Tier1.serve`)."""

    __slots__ = ("template", "base", "outs", "rets", "step", "n", "names", "matchers", "t_first",
                 "size_class", "ctx", "eager", "args", "sized", "svals", "toks", "legacy", "views")

    def __init__(self, template, base, outs, rets, t_first, size_class, ctx, eager=False, svals=None,
                 toks=None):
        self.template = template
        self.base = base  # the launch's base token (see RunTemplate.plans)
        self.outs = outs  # per step: tuple of Tensors (None when eager)
        self.rets = rets  # per step: what the op returns (a Tensor or a tuple of them)
        self.step = 1
        self.n = len(template.steps)
        self.names = template.names
        self.matchers = template.matchers
        self.t_first = t_first  # perf_counter at the first op's handler entry
        self.size_class = size_class
        self.ctx = ctx  # the op before the first one (see RunTemplate.ctx_fails)
        self.eager = eager
        self.args = None  # eager: the current step's tensor arguments, between serve and eager_done
        self.sized = template.sized_checks or None  # step -> [(argument, scalar)] (see Tier1._lift)
        self.svals = svals  # this call's sized scalars
        self.toks = toks  # the bound external inputs' tokens (see Tier1._ext_tokens)
        self.legacy = template.legacy_steps  # steps not served while MindSpore records (_requires_grad)
        self.views = template.view_steps  # steps run for real even when served (VIEW_OPS)


class Tier1:
    """Tier 1 of one option set: tracks runs as ops arrive, serves compiled ones; compiling,
    installing and launching kernels is `ms_dynvm.jit`'s (`self.jit`, `jit.launch`)."""

    def __init__(self, recorder, opts) -> None:
        _set_kernel_threads(opts.kernel_threads)
        self.recorder = recorder
        self.opts = opts
        self.pool = _jl.pool_for(opts)
        self.jit = Compiler(opts, self._installed)
        self.templates: dict = {}  # key -> RunTemplate
        self.variants: dict = {}  # key without scalar arguments -> templates made (MAX_VARIANTS)
        self.profiles: dict = {}  # key without scalar arguments -> its first run's scalars (_lift)
        self.lifted: dict = {}  # key without scalar arguments -> its template with sized scalars
        # (names of the steps before, op name, tensor argument): 0-d arguments there changed value
        # from run to run, and not with the sizes (a loss value): not constants (_mark_data_consts).
        self.data_consts: set = set()
        self.starts: dict = {}  # first op name -> [RunTemplate with kernels]
        self.hist: deque = deque(maxlen=HISTORY)  # see _push_hist; newest last
        self.run: _OpenRun | None = None
        self.pending: _Pending | None = None
        self._serial = 0
        self.last_eager = 0.0  # perf_counter when an op last ran eagerly
        self.probes = 0  # groups run eagerly to measure them (the step switch drops such VM steps)
        self.steps = StepSwitch()  # each step under the VM or bare (cost/step.py, dispatch.StepGate)
        self._attach(recorder, opts)

    @property
    def generation(self) -> int:
        """Kernels installed so far (the step switch's measurements age with it)."""
        return self.jit.generation

    @property
    def exiting(self) -> bool:
        """Set at interpreter exit: no compile is started."""
        return self.jit.exiting

    @exiting.setter
    def exiting(self, value: bool) -> None:
        self.jit.exiting = value

    def _installed(self, t: "RunTemplate") -> None:
        """A kernel of `t` is installed: its first op starts a served run from now on."""
        lst = self.starts.setdefault(t.steps[0].key[0], [])
        if t not in lst:
            lst.append(t)

    def _attach(self, recorder, opts) -> None:
        """What tier 1 fuses under `opts`, and what it asks of `recorder`."""
        self.fusible = FUSIBLE_EAGER_MATH if opts.eager_math else FUSIBLE
        # Dispatched op names that end a run: in-place ops (serving a fresh result would lose the
        # write) and, under eager_math, UNFUSED_NAMES_EAGER_MATH (one set: after_op's one lookup).
        self.run_enders = (_INPLACE | UNFUSED_NAMES_EAGER_MATH) if opts.eager_math else _INPLACE
        recorder.want_tags = True  # after_op reads the tags the recorder just read/set
        recorder.link_ops = self.fusible  # view copies that runs may take in are linked (Recorder._link_for)

    def reset(self, recorder, opts) -> None:
        """Re-attach to a new recorder (a new enable()); drop transient state, keep what was learned."""
        _set_kernel_threads(opts.kernel_threads)
        self.pool = _jl.pool_for(opts)
        self.recorder = recorder
        self.opts = opts
        self._attach(recorder, opts)
        self.jit.reset(opts)
        self.hist.clear()
        self.run = None
        self.pending = None

    # --- serving ----------------------------------------------------------------------------------
    def serve(self, name: str, args):
        """Next op of the run being served: its precomputed result; `_EAGER` when the run is being
        run eagerly (the caller runs the op, then calls `eager_done`); or _MISS (run abandoned)."""
        p = self.pending
        j = p.step
        if name != p.names[j]:
            return self._abandon("op_mismatch")
        if j in p.legacy and _requires_grad():
            return self._abandon("legacy_op_under_grad")  # a run launched before a grad's forward
        r = p.matchers[j](args, p.base, p.toks, p.svals)
        if type(r) is int:
            return self._abandon(_FAIL_REASONS[r])
        if p.sized is not None and j in p.sized:
            svals = p.svals
            for i, k in p.sized[j]:
                if args[i] != svals[k]:
                    return self._abandon("sized_scalar_mismatch")
        if p.eager or j in p.views:
            p.args = r
            return _EAGER
        outs = p.outs[j]
        self.hist.append((name, r, outs, (), ()))
        j += 1
        p.step = j
        if j == p.n:
            self._finish(p)
        return p.rets[j - 1]

    def eager_done(self, name: str, out) -> None:
        """The op the eagerly run group is at has run (`out`): tag the results later steps check,
        remember it, move on."""
        p = self.pending
        j = p.step
        self.last_eager = _perf()
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, Tensor)]
        base = p.base
        for k, off in p.template.step_tags[j]:
            if k < len(outs):
                outs[k]._set_user_data(_T1KEY, base + off)
        self.hist.append((name, p.args, outs, (), ()))
        p.args = None
        j += 1
        p.step = j
        if j == p.n:
            self._finish(p)

    def _finish(self, p: "_Pending") -> None:
        self.pending = None
        t = p.template
        # Wall time from the first op's handler entry to now: it includes what runs between the ops
        # (the same user code as in an eager call, plus MindSpore's per-op work outside the handler),
        # served or eager alike.
        t.switch.record(p.size_class, _perf() - p.t_first, not p.eager)
        self._count(p, p.n)
        if p.eager:
            t.stats.eager_calls += 1
        else:
            t.stats.served += 1
        if p.ctx in t.ctx_fails:
            del t.ctx_fails[p.ctx]

    @staticmethod
    def _count(p: "_Pending", n: int) -> None:
        # Op counts go to the recorder's batch (METRICS.op_names; see Metrics.flush_ops), since the
        # recorder does not see these ops.
        names = METRICS.op_names
        names.extend(p.names[:n])
        if len(names) > 4096:
            METRICS.flush_ops()
        if not p.eager:
            METRICS.fused_ops += n

    def _abandon(self, reason: str):
        METRICS.fallbacks[f"tier1: {reason}"] += 1
        p = self.pending
        self.pending = None
        self._count(p, p.step)
        fails = p.template.ctx_fails
        fails[p.ctx] = fails.get(p.ctx, 0) + 1
        return _MISS

    def try_start(self, name: str, args):
        """If a compiled run starts with this op and its inputs bind and its guards hold: run the
        kernel and return the first op's result, or, where the size switch says so, return `_EAGER`
        (the group runs eagerly, unrecorded, see `serve`); else _MISS."""
        cands = self.starts.get(name)
        if not cands:
            return _MISS
        t0 = _perf()
        hist = self.hist
        ctx = hist[-1][0] if hist else None
        grad = None
        for t in cands:
            if t.legacy_steps:
                if grad is None:
                    grad = _requires_grad()
                if grad:
                    METRICS.guard_failures["legacy_op_under_grad"] += 1
                    continue
            fails = t.ctx_fails
            if fails and fails.get(ctx, 0) >= CTX_MAX_FAILS:
                # Abandoned or unbindable here several times in a row: skipped before any check,
                # except one try in CTX_RETRY_EVERY.
                t.ctx_skips += 1
                if t.ctx_skips % CTX_RETRY_EVERY:
                    METRICS.guard_failures["abandoned_here_before"] += 1
                    continue
            tensors = t.matchers[0](args, 0)
            if type(tensors) is int:
                continue
            bound, rtags = self._bind(t, tensors)
            if bound is None:
                METRICS.guard_failures["unbindable_input"] += 1
                fails[ctx] = fails.get(ctx, 0) + 1
                continue
            # The launch depends only on the inputs' dtypes, shapes and strides: look it up by them
            # (cheap), and run the signature and guard machinery only for a new layout.
            lkey = tuple([(vm_dtype(x.dtype), x.shape, tuple(x.stride())) for x in bound[:t.n_tensor_ext]])
            launch = t.launches.get(lkey)
            if launch is None:
                # A new input layout: find the family (kernel) it belongs to; the launch itself is
                # only made when the size switch says serve.
                descs = [InputDesc(k[0], k[1], "contiguous" if x.is_contiguous() else "strided")
                         for k, x in zip(lkey, bound)]
                descs += [_desc(x) for x in bound[t.n_tensor_ext:]]
                found = _jl.find_family(t, descs, lkey, t.const_arrays)
                if found is None:
                    continue
                size_class = _jl.size_class([k[1] for k in lkey])
            else:
                size_class = launch.size_class
            svals = None
            if t.sized:
                svals = _sized_values(t, lkey)
                if None in svals or any(args[i] != svals[k] for i, k in t.sized_checks.get(0, ())):
                    METRICS.guard_failures["sized_scalar_mismatch"] += 1
                    continue
            self.end_run()  # the eager run before this one is complete
            self._serial += 1
            base = self._serial * _TOKEN_SPAN
            if not t.switch.should_serve(size_class, t0 - self.last_eager < WARM_S):
                # The group's ops run eagerly, checked as served ones are but not recorded: what
                # the switch measures is then MindSpore's own time for them (plus the handler's).
                on = t.switch.is_on(size_class)
                METRICS.fallbacks["tier1: eager probe" if on else "tier1: eager (faster for this size)"] += 1
                self.probes += on
                p = self.pending = _Pending(t, base, None, None, t0, size_class, ctx, eager=True,
                                            svals=svals, toks=_ext_tokens(t, bound, base, rtags))
                p.step = 0
                p.args = tensors
                return _EAGER
            if launch is None:
                launch = _jl.prepared(t, lkey, found, size_class)
            METRICS.cache_hits += 1
            return self._launch(t, launch, bound, rtags, tensors, t0, ctx, base, svals)
        return _MISS

    def _bind(self, t: RunTemplate, first_args: list):
        """(The external inputs for a call starting with `first_args`: tensors first (in `t.ext`
        order of the non-constant provenances), then the constants (0-d NumPy arrays, the same
        objects every call); for inputs that are results of recorded ops, input -> the recorder tag
        the script's copy carries (see `_ext_tokens`), or None). (None, None) when one cannot be
        bound."""
        # The first op's own arguments must have the recorded identities: Mul(h, h) and Mul(a, b)
        # have the same key. Two arguments recorded as one tensor must alias exactly (same address,
        # shape and strides), which implies equal values.
        for i, p in t.first_alias:
            if not _aliases(first_args[i], first_args[p]):
                return None, None
        out = []
        hist = self.hist
        n_args = len(first_args)
        rtags = None
        for prov in t.ext_tensors:
            if prov.kind == "arg":
                if prov.pos >= n_args:
                    return None, None
                out.append(first_args[prov.pos])
            else:
                _, d, kind, i, okey = prov  # (a HistProv)
                if d > len(hist):
                    return None, None
                h = hist[-d]
                if h[0] != okey:
                    return None, None
                seq = h[1] if kind == "arg" else h[2]
                if i >= len(seq):
                    return None, None
                out.append(seq[i])
                if kind == "out" and h[4] and h[4][i] is not None:
                    # A recorded op's result: the script's copy of it carries this recorder tag.
                    if rtags is None:
                        rtags = {}
                    rtags[len(out) - 1] = h[4][i]
        out.extend(t.const_arrays)
        return out, rtags

    def _launch(self, t: RunTemplate, launch: "_jl.Launch", bound: list, rtags, first_args: list, t0: float,
                ctx, base: int, svals=None):
        arrays = _jl.run(launch, [x._data_ptr() for x in bound[:t.n_tensor_ext]], self.pool, t.sized, svals)
        outs = [_from_numpy(a) for a in arrays]  # C-contiguous: Tensor.from_numpy minus its checks
        toks = _ext_tokens(t, bound, base, rtags)
        off = base + t.n_ext
        if t.view_steps:  # all results in order, None for the views' (see RunTemplate.kernel_out)
            outs = [None if k is None else outs[k] for k in t.kernel_out]
        for k, o in enumerate(outs):
            if o is not None:
                o._set_user_data(_T1KEY, off + k)
        grouped = [tuple(outs[i:i + n]) for i, n in t.out_pos]
        rets = [outs[i] if n == 1 else g for (i, n), g in zip(t.out_pos, grouped)]
        # A group has at least two steps (end_run drops shorter runs): the rest are served.
        p = self.pending = _Pending(t, base, grouped, rets, t0, launch.size_class, ctx, svals=svals, toks=toks)
        if 0 in p.views:  # the first op is a view: the caller runs it (see RunTemplate.view_steps)
            p.step = 0
            p.args = first_args
            return _EAGER
        self.hist.append((t.names[0], first_args, grouped[0], (), ()))
        return rets[0]

    # --- recording ---------------------------------------------------------------------------------
    def _push_hist(self, name, arg_tensors, out_tensors, arg_tags=(), out_tags=()) -> None:
        """History entry: (op name, arg tensors, out tensors, arg recorder tags, out recorder tags).
        Served ops are not recorded, so their entries carry no tags; `_provenance` reads the tags
        their tensors got since, when it needs them."""
        self.hist.append((name, arg_tensors, out_tensors, arg_tags, out_tags))

    def after_op(self, name: str, args, out, t0: float, seconds: float) -> None:
        """An op ran eagerly (its handler entered at perf_counter `t0`; the op itself took `seconds`)
        and the recorder has recorded it (`recorder.last_op`)."""
        self.last_eager = t0
        tensors = _tensors(args)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, Tensor)]
        tags = self.recorder.last_tags
        if tags is not None:
            arg_tags, out_tags = tags
        else:
            arg_tags = [a._get_user_data(_RKEY) for a in tensors]
            out_tags = [o._get_user_data(_RKEY) for o in outs]
        last = self.recorder.last_op
        # In-place ops write their argument: serving a fresh result would lose the write.
        # Tensors inside a sequence argument (AddN's list) are not bound or checked by the serving
        # machinery (`_tensors` sees top-level tensors only): such an op ends the run.
        fusible = view = False
        if (last is not None and name not in self.run_enders
                and not (len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple
                         and _requires_grad())):
            blk, s0, s1 = last[0], last[1], last[2]
            if s1 - s0 == 1:  # one instruction (the common case): its op name, without a list
                op = blk.op_at(s0)
                fusible = op in self.fusible
                view = op in VIEW_OPS
            else:
                ops = blk.op_names(s0, s1)
                fusible = all(op in self.fusible for op in ops)
                view = any(op in VIEW_OPS for op in ops)
            fusible = fusible and not _has_tensor_sequence(args)
        if not fusible:
            self.end_run()
        else:
            self._extend_run(step_key(name, args), tensors, outs, last, seconds, arg_tags, out_tags, view)
        self._push_hist(name, tensors, outs, arg_tags, out_tags)

    def _extend_run(self, key, tensors, outs, last, seconds, arg_tags, out_tags, view=False) -> None:
        block, start, end, out_regs = last
        run = self.run
        if run is not None:
            if len(run.steps) >= MAX_RUN_STEPS:
                self.end_run()
                run = None
            elif run.block is block and run.end == start:
                pass
            elif run.across and start == 0 and run.epoch == self.recorder.epoch:
                # The first op of the block after a Cell boundary: the run goes on (values flow
                # between the blocks of one Program as registers, so its tags stay valid).
                run.segments.append((run.block, run.start, run.end))
                run.block, run.start, run.end = block, start, start
                run.across = False
            else:
                self.end_run()
                run = None
        if run is None:
            # The history as of the run's first op is taken when a later step first needs it
            # (`_provenance`): most runs end after one op.
            run = self.run = _OpenRun(block, start, None, self.recorder.epoch)
        srcs = []
        for tensor, tag in zip(tensors, arg_tags):
            if tag in run.out_tags:
                j, k = run.out_tags[tag]
                srcs.append(OutSrc("out", j, k))
                continue
            if tag in run.ext_tags:
                srcs.append(ExtSrc("ext", run.ext_tags.index(tag)))
                continue
            prov = self._provenance(run, tag, arg_tags if not run.steps else None, tensor)
            if (prov is None and tensor.shape == () and tag is not None and _vm_dtype(tensor) != "bf16"
                    and not (self.data_consts
                             and (tuple(s.key[0] for s in run.steps), key[0], len(srcs)) in self.data_consts)):
                prov = ConstProv("const", _asnumpy(tensor).tobytes(), _vm_dtype(tensor))
            if prov is None:
                # Not bindable at the first op: split the run here and start again at this op.
                self.end_run()
                self._extend_run(key, tensors, outs, last, seconds, arg_tags, out_tags, view)
                return
            run.ext.append(prov)
            run.ext_tags.append(tag)
            run.ext_regs.append(tag[1] if tag is not None else None)
            srcs.append(ExtSrc("ext", len(run.ext) - 1))
        j = len(run.steps)
        for k, tag in enumerate(out_tags):
            run.out_tags[tag] = (j, k)
        run.steps.append(Step(key, tuple(srcs), len(outs), view))
        run.step_instrs.append(end - start)
        run.result_regs.extend(out_regs)
        run.end = end
        run.seconds += seconds
        if not run.first_arg_tags and j == 0:
            run.first_arg_tags = arg_tags

    def _provenance(self, run: _OpenRun, tag, first_args, tensor=None):
        if tag is None:
            return None
        if first_args is not None:  # this is the first op: its own arguments
            return ArgProv("arg", first_args.index(tag))
        if tag in run.first_arg_tags:
            return ArgProv("arg", run.first_arg_tags.index(tag))
        hist = run.hist
        if hist is None:
            # Taken now, at step 1 or later: the newest entries are the run's own steps (each op
            # pushes one entry, served ones included), which come before the run's start.
            hist = run.hist = list(reversed(self.hist))[len(run.steps):]
        tok = _MISS
        for d in range(1, len(hist) + 1):
            k, a, o, arg_tags, out_tags = hist[d - 1]
            if (a or o) and ((not arg_tags and not out_tags) or None in arg_tags):
                # An op served or run eagerly by tier 1 (not recorded, so no tags when it ran).
                # Its arguments are the user's tensors, which carry the tags the recorder gave them
                # since (as inputs of later eager ops): read them now, so that a run after a served
                # one binds as the same run did after the eager one (one still untagged is read
                # again at the next look). Its results are the handler's tensors, of which the
                # user got copies (with the tier-1 token each carried then, see
                # RunTemplate.step_tags): they are found by that token.
                arg_tags = [x._get_user_data(_RKEY) for x in a]
                if not out_tags and o:
                    if tok is _MISS:
                        tok = tensor._get_user_data(_T1KEY) if tensor is not None else None
                    if tok is not None:
                        for i, x in enumerate(o):
                            if x._get_user_data(_T1KEY) == tok:
                                return HistProv("hist", d, "out", i, k)
                hist[d - 1] = (k, a, o, arg_tags, out_tags)
            # Only the op's name is kept, not its arguments: those may hold dynamic sizes (a reshape
            # target), which would make a new run key per size. Binding a wrong tensor is harmless:
            # the identity check when the step arrives abandons the run.
            if tag in out_tags:
                return HistProv("hist", d, "out", out_tags.index(tag), k)
            if tag in arg_tags:
                return HistProv("hist", d, "arg", arg_tags.index(tag), k)
        return None

    def block_closed(self, reason: str) -> None:
        """The recorder is closing its block (`Recorder.on_close`). A Cell boundary is not a sync
        point: the run may go on in the next block (see `_extend_run`); any other end ends it.
        Called from the sync-point and Cell hooks, outside the dispatch handler's guard: a failure
        here drops the run and is counted, never raised into the script."""
        try:
            if reason == "cell" and self.run is not None:
                self.run.across = True
            else:
                self.end_run()
            if reason != "cell" and self.pending is not None and not self.pending.eager:
                # A sync point (or phase change) inside a served run: the recorded run had none
                # there (runs end at block ends), and the script may now write a tensor the kernel
                # already read (`v[v > 0] = 0`, a write through asnumpy()): the rest runs eagerly.
                self._abandon("sync point inside a served run")
        except Exception as e:  # noqa: BLE001 - ms_dynvm's bookkeeping never breaks the script
            self.run = None
            METRICS.fallbacks[f"tier1: error ({type(e).__name__})"] += 1

    def end_run(self) -> None:
        run, self.run = self.run, None
        if run is None or len(run.steps) < 2 or all(s.view for s in run.steps):
            return  # (views alone: every step would run for real, see RunTemplate.view_steps)
        key = _run_key(run)
        if any(r is None for r in run.ext_regs):
            return
        if len(run.ext) + sum(s.n_out for s in run.steps) >= _TOKEN_SPAN:
            return  # more values than one launch's token range (only with a huge max_block_ops)
        t = self.templates.get(key)
        if t is None:
            # Runs that differ only in scalar arguments (or constants) are variants of one group: a
            # scalar that depends on the sizes (mean's backward divides by the element count) would
            # otherwise make a new group, and a new compile, per size. Such scalars are lifted into
            # kernel inputs computed from the sizes where they can be (`_lift`); other variants
            # get a group each, up to MAX_VARIANTS.
            vkey = (tuple(s.key[0] for s in run.steps), tuple(s.srcs for s in run.steps),
                    tuple(p[:1] if p.kind == "const" else p for p in run.ext))
            types = self.recorder.program.types
            # The same op sequence over inputs of other ranks or dtypes (another model) is
            # another family of sized scalars.
            lkey = (vkey, tuple((types[r].dtype, len(types[r].shape)) if r is not None else None
                                for r in run.ext_regs))
            t = self._lifted_for(lkey, run)
            n = self.variants.get(vkey, 0)
            if t is None:
                last = self.profiles.get(lkey)
                if last is not False:  # False: given up on this sequence (below)
                    prof = self._profile(run)
                    if last is not None:
                        t = self._lift(lkey, last, prof, run)
                        if t is None and prof is not None:
                            self._mark_data_consts(run, last, prof)
                    if t is None:
                        # The next run is compared with this one, until the variants run out.
                        self.profiles[lkey] = prof if n < MAX_VARIANTS and prof is not None else False
            if t is not None:
                # This key (scalars and constants included) is the sized group's from now on; its
                # values are checked at every launch anyway.
                self.templates[key] = t
            else:
                if n >= MAX_VARIANTS:
                    METRICS.fallbacks["tier1: too many variants (scalar arguments change)"] += 1
                    return
                self.variants[vkey] = n + 1
                t = self.templates[key] = RunTemplate(key, run.steps, run.ext)
        st = t.stats
        st.calls += 1
        st.eager_calls += 1
        st.eager_seconds += run.seconds
        types = self.recorder.program.types  # on_close runs before the block's program is dropped
        if t.ext_order is not None:  # the template binds tensors first, then constants
            run.ext_regs = [run.ext_regs[e] for e in t.ext_order]
        descs = [InputDesc(types[r].dtype, tuple(types[r].shape), types[r].layout) for r in run.ext_regs]
        descs += [InputDesc(dt, (), "contiguous") for _, _, dt in t.sized_operands]
        sig = t.family.observe(descs)
        self.jit.consider(t, sig, len(t.steps), lambda: self._function(run, t.sized_operands, t.kernel_out))

    @staticmethod
    def _body(run: _OpenRun) -> list:
        body = []
        for block, start, end in run.segments + [(run.block, run.start, run.end)]:
            body.extend(block.instrs_between(start, end))
        return body

    def _function(self, run: _OpenRun, sized_operands=(), kernel_out=None) -> Function:
        """The run as one IR Function; `sized_operands` (instruction, operand, dtype): immediates that
        become 0-d params, after the external inputs (see `_lift`); `kernel_out`: per result, None
        where it is not an output (a view step's, see RunTemplate.kernel_out)."""
        types = self.recorder.program.types
        body = self._body(run)
        regs = set(run.ext_regs)
        for ins in body:
            regs.update(int(a) for a in ins.args if isinstance(a, Reg))
            regs.update(ins.outs)
        typed = {r: types[r] for r in regs}
        instrs = [Instr(i.op, i.args, i.attrs, i.outs) for i in body]
        params = [int(r) for r in run.ext_regs]
        nxt = max(regs, default=-1) + 1
        for ii, ai, dt in sized_operands:
            args = list(instrs[ii].args)
            args[ai] = Reg(nxt)
            instrs[ii].args = tuple(args)
            typed[nxt] = TensorType(dt, (), "contiguous")
            params.append(nxt)
            nxt += 1
        results = [int(r) for r in run.result_regs]
        if kernel_out is not None:
            if len(kernel_out) != len(results):  # (never seen: results and steps' n_out agree)
                raise ValueError(f"{len(results)} results for {len(kernel_out)} step results")
            results = [r for r, k in zip(results, kernel_out) if k is not None]
        return Function("t1", params, instrs, results, typed)

    # --- sized scalars ----------------------------------------------------------------------------
    # A float argument that changes with the sizes (mean's backward: Divs(dout, n); 1/n factors)
    # would make a new group per size. When two runs of one op sequence differ only in such
    # scalars, and each is, in both runs, the element count n of some axes of one tensor input, or
    # 1/n, the group gets it as a 0-d kernel input: one group (and one kernel per shape family) for
    # every size. At each launch the values are computed from the bound inputs' shapes, and each op
    # that carries one must carry exactly that value (else the run is abandoned, counted).
    # Only immediates of f32/f64 instructions are lifted (there the instruction computes with the
    # scalar rounded to its own dtype, which is what a 0-d input of that dtype holds).

    def _profile(self, run: _OpenRun) -> "Profile | None":
        """What `_lift` compares (`Profile`)."""
        if len(run.step_instrs) != len(run.steps):
            return None
        types = self.recorder.program.types
        body = self._body(run)
        if len(body) != sum(run.step_instrs):
            return None
        imms = {}
        dts = {}
        for ii, ins in enumerate(body):
            for ai, a in enumerate(ins.args):
                if type(a) is float:
                    imms[(ii, ai)] = a
                    dts[ii] = types[ins.outs[0]].dtype if ins.outs else None
        order = [e for e, p in enumerate(run.ext) if p.kind not in _CONSTS]
        shapes = [tuple(types[run.ext_regs[e]].shape) if run.ext_regs[e] is not None else None
                  for e in order]
        consts = [(p.dtype, np.frombuffer(p.data, dtype=dtypes.to_numpy(p.dtype)).reshape(()).item())
                  for p in run.ext if p.kind == "const"]
        descs = [InputDesc(types[r].dtype, tuple(types[r].shape), types[r].layout)
                 for r in run.ext_regs if r is not None]
        return Profile(tuple(i.op for i in body), imms, dts, tuple(s.key for s in run.steps),
                       tuple(run.step_instrs), shapes, consts, descs, _run_key(run))

    def _lift(self, vkey, first, prof, run: _OpenRun):
        """The template with sized scalars for the runs of profiles `first` and `prof` (that of
        `run`), or None."""
        if (prof is None or first.ops != prof.ops or first.imms.keys() != prof.imms.keys()
                or first.ninstr != prof.ninstr or len(first.consts) != len(prof.consts)):
            return None
        imms1, dts, keys1, ninstr, shapes1, consts1, descs1 = (
            first.imms, first.dts, first.keys, first.ninstr, first.shapes, first.consts, first.descs)
        imms2, keys2, shapes2, consts2 = prof.imms, prof.keys, prof.shapes, prof.consts
        if None in shapes1 or None in shapes2 or len(shapes1) != len(shapes2):
            return None
        step_of = []
        for j, n in enumerate(ninstr):
            step_of.extend([j] * n)
        lifted = []  # immediates: (step, argument, instruction, operand, dtype, input, axes, kind)
        for pos, v1 in imms1.items():
            v2 = imms2[pos]
            if v1 == v2 or (v1 != v1 and v2 != v2):
                continue
            ii, ai = pos
            dt = dts.get(ii)
            if dt not in ("f32", "f64"):
                return None
            j = step_of[ii]
            a1, a2 = keys1[j][1], keys2[j][1]
            if (len(a1) == 3 and type(a1[1]) is str and type(a1[2]) is tuple) or len(a1) != len(a2):
                return None  # legacy (prim, name, args) form: not lifted
            arg = next((i for i in range(len(a1)) if type(a1[i]) is float and type(a2[i]) is float
                        and a1[i] == v1 and a2[i] == v2), None)
            expr = _size_expr(v1, v2, shapes1, shapes2)
            if arg is None or expr is None:
                return None
            lifted.append((j, arg, ii, ai, dt) + expr)
        sized_consts = []  # (constant index, dtype, input, axes, kind)
        for c, ((dt, v1), (dt2, v2)) in enumerate(zip(consts1, consts2)):
            if dt != dt2:
                return None
            if v1 == v2 or (v1 != v1 and v2 != v2):
                continue
            if dt not in ("f16", "f32", "f64"):
                return None
            npdt = np.dtype(dtypes.to_numpy(dt)).type
            expr = _size_expr(v1, v2, shapes1, shapes2, lambda v, npdt=npdt: float(npdt(v)))
            if expr is None:
                return None
            sized_consts.append((c, dt) + expr)
        if not lifted and not sized_consts:
            return None
        lifted_args = {(x[0], x[1]) for x in lifted}
        # Every other argument must be equal: the steps' keys with the sized ones marked.
        def marked(keys):
            return tuple((k[0], tuple(SIZED if (j, i) in lifted_args else a for i, a in enumerate(k[1])))
                         for j, k in enumerate(keys))
        if marked(keys1) != marked(keys2):
            return None
        steps = [Step(k, st.srcs, st.n_out) for k, st in zip(marked(keys2), run.steps)]
        # Sized constants: their provenance says which sized scalar they hold (after the immediates).
        ext = list(run.ext)
        const_pos = [e for e, p in enumerate(ext) if p.kind == "const"]
        for k, (c, dt, _, _, _) in enumerate(sized_consts):
            ext[const_pos[c]] = SizedProv("sized", len(lifted) + k, dt)
        t = RunTemplate(("sized",) + marked(keys2), steps, ext)
        sized = [SizedScalar(e, axes, kind, np.zeros((), dtypes.to_numpy(dt)), False)
                 for _, _, _, _, dt, e, axes, kind in lifted]
        t.const_arrays = t.const_arrays + [x.array for x in sized]
        # The constants' arrays, in the template's constant order (constants keep their order).
        const_arrays = t.const_arrays
        for c, dt, e, axes, kind in sized_consts:
            sized.append(SizedScalar(e, axes, kind, const_arrays[c], True))
        t.sized = sized
        checks: dict = {}
        for k, x in enumerate(lifted):
            checks.setdefault(x[0], []).append((x[1], k))
        t.sized_checks = checks
        t.sized_operands = [(ii, ai, dt) for _, _, ii, ai, dt, _, _, _ in lifted]
        t.profile = prof
        # Both runs seen so far teach the family which dims change.
        extra = [InputDesc(dt, (), "contiguous") for _, _, dt in t.sized_operands]
        if t.ext_order is not None:
            descs1 = [descs1[e] for e in t.ext_order]
        t.family.observe(descs1 + extra)
        old = self.templates.get(first.run_key)
        if old is not None:  # the first run's counts carry over
            t.stats.calls, t.stats.eager_calls, t.stats.eager_seconds = (
                old.stats.calls, old.stats.eager_calls, old.stats.eager_seconds)
        self.lifted[vkey] = t
        METRICS.sized_groups += 1
        return t

    def _mark_data_consts(self, run: _OpenRun, last, prof) -> None:
        """Constants whose values differ between two runs of one op sequence and are not sized:
        data (a loss value made long before, which MindSpore hands the backward as a 0-d tensor),
        not a Python scalar. Guarding their values would make a new group per value; from now on
        such an argument is not taken as a constant, so the run splits there and the later part
        binds it as an argument."""
        const_e = [e for e, p in enumerate(run.ext) if p.kind == "const"]
        if len(const_e) != len(last.consts) or len(const_e) != len(prof.consts):
            return
        names = [st.key[0] for st in run.steps]
        for c, ((_, v1), (_, v2)) in enumerate(zip(last.consts, prof.consts)):
            if v1 == v2 or (v1 != v1 and v2 != v2):
                continue
            src = ExtSrc("ext", const_e[c])
            for j, st in enumerate(run.steps):
                if src in st.srcs:
                    self.data_consts.add((tuple(names[:j]), names[j], st.srcs.index(src)))
                    break

    def _lifted_for(self, vkey, run: _OpenRun):
        """The sized-scalar template of this op sequence, if the run fits it."""
        t = self.lifted.get(vkey)
        if t is None:
            return None
        prof = self._profile(run)
        if (prof is None or prof.ops != t.profile.ops or prof.imms.keys() != t.profile.imms.keys()
                or len(prof.consts) != len(t.profile.consts)):
            return None
        shapes = prof.shapes
        if None in shapes:
            return None
        vals = _sized_values(t, [(None, s) for s in shapes])
        for (ii, ai, _), v in zip(t.sized_operands, vals):
            if prof.imms[(ii, ai)] != v:
                return None
        n_imm = len(t.sized_operands)
        sized_at = {}
        for e, p in enumerate(t.ext[t.n_tensor_ext:]):
            if p.kind == "sized":
                sized_at[e] = p.scalar
        for c, ((dt, v), (tdt, tv)) in enumerate(zip(prof.consts, t.profile.consts)):
            k = sized_at.get(c)
            if dt != tdt or (k is None and v != tv and not (v != v and tv != tv)):
                return None
            if k is not None and (k < n_imm or v != vals[k]):
                return None
        want = [st.key for st in t.steps]
        if len(want) != len(prof.keys) or any(len(k[1]) != len(w[1]) for k, w in zip(prof.keys, want)):
            return None
        marked = [(k[0], tuple(SIZED if w[1][i] is SIZED else a for i, a in enumerate(k[1])))
                  for k, w in zip(prof.keys, want)]
        if marked != want:
            return None
        for j, pairs in t.sized_checks.items():
            for i, k in pairs:
                if prof.keys[j][1][i] != vals[k]:
                    return None
        return t

def _aliases(a, b) -> bool:
    return (a._data_ptr() == b._data_ptr() and tuple(a.shape) == tuple(b.shape)
            and tuple(a.stride()) == tuple(b.stride()) and a.dtype == b.dtype)


def _ext_tokens(t: "RunTemplate", bound: list, base: int, rtags):
    """What later steps check on the bound external inputs (None when no step checks one). The
    tensors a script holds are copies of the handler's results, made with the user data those had
    when they were handed back; so for a result of a recorded op (`rtags`: input -> the recorder
    tag it got then) its recorder tag; for a tensor with a token (a result of a launch or of a
    group run eagerly, tagged before it was handed back) that token; else (an argument: the
    script's own tensor) a new token, `base` + e, put on it now."""
    if not t.tag_ext:
        return None
    toks = [0] * t.n_tensor_ext
    for e in t.tag_ext:
        if rtags is not None and e in rtags:
            toks[e] = rtags[e]
            continue
        x = bound[e]
        tok = x._get_user_data(_T1KEY)
        if tok is None:
            tok = base + e
            x._set_user_data(_T1KEY, tok)
        toks[e] = tok
    return toks


def _run_key(run: _OpenRun) -> tuple:
    return (tuple(s.key for s in run.steps), tuple(s.srcs for s in run.steps), tuple(run.ext))


def _sval(n: int, kind: str):
    if kind == "n":
        return float(n)
    return 1.0 / n if n else None


_AXES_BY_RANK: dict = {}


def _axes_subsets(rank: int) -> list:
    """Non-empty subsets of the axes, the larger first (the whole tensor's element count first)."""
    out = _AXES_BY_RANK.get(rank)
    if out is None:
        masks = sorted(range(1, 1 << rank), key=lambda m: (-bin(m).count("1"), m))
        out = _AXES_BY_RANK[rank] = [tuple(a for a in range(rank) if m >> a & 1) for m in masks]
    return out


def _size_expr(v1: float, v2: float, shapes1: list, shapes2: list, rnd=None):
    """(tensor input, axes, kind) such that the element count n of those axes (kind "n") or 1/n
    (kind "1/n"), rounded by `rnd` if given, is v1 in the run of input shapes `shapes1` and v2 in
    that of `shapes2`; or None."""
    for e, (s1, s2) in enumerate(zip(shapes1, shapes2)):
        if len(s1) != len(s2) or len(s1) > 6:
            continue
        for axes in _axes_subsets(len(s1)):
            n1 = n2 = 1
            for a in axes:
                n1 *= s1[a]
                n2 *= s2[a]
            if n1 == n2:
                continue
            for kind in ("n", "1/n"):
                w1, w2 = _sval(n1, kind), _sval(n2, kind)
                if rnd is not None and w1 is not None and w2 is not None:
                    w1, w2 = rnd(w1), rnd(w2)
                if w1 == v1 and w2 == v2:
                    return (e, axes, kind)
    return None


def _sized_values(t: "RunTemplate", lkey) -> list:
    """The sized scalars of a call whose tensor inputs are `lkey` ((dtype, shape, ...) each); those
    that a 0-d tensor carries (`rounded`) as that tensor's dtype holds them."""
    out = []
    for e, axes, kind, arr, rounded in t.sized:
        n = 1
        shape = lkey[e][1]
        for a in axes:
            n *= shape[a]
        v = _sval(n, kind)
        if rounded and v is not None:
            v = float(arr.dtype.type(v))
        out.append(v)
    return out


def _desc(x) -> InputDesc:
    if isinstance(x, np.ndarray):
        return InputDesc(dtypes.from_numpy(x.dtype), x.shape, "contiguous")
    return InputDesc(_vm_dtype(x), tuple(x.shape), "contiguous" if x.is_contiguous() else "strided")



def _vm_dtype(t) -> str:
    return vm_dtype(t.dtype)
