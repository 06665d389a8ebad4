"""Tier 2: region replay. A region — a call of a function `ms.value_and_grad`/`ms.grad`/
`ops.GradOperation` returned, an outermost `nn.Cell` call made without gradient, an `nn` optimizer
step, a function marked with `ms_dynvm.jit` — is learned from recorded calls and then runs as one
planned program (`ms_dynvm/jit/replay.py`), with no per-op dispatch and none of the user's Python.
docs/regions.md is the user-level account; this docstring is the mechanism.

Per region and input signature (per flattened argument: dtype and shape of a tensor, type and value
of a Python scalar), calls go through three states:
- learn: the call runs eagerly inside a recording (`dispatch.record`, tier 1 off for it),
  `LEARN_CALLS` times for the first signature of a family, once for a further signature of an
  established family (`_learn`, `_family`); when a family is established, the region's other
  signatures holding one recording of it are installed with it (`_install_pending`). Each recording
  is turned into a plan candidate (`_make_learned`; its plan is built only where it is installed,
  `_Learned.make_plan`); it is replayable when no block ended at a sync point (a tensor's value read by
  Python, a graph-mode call; basic indexing is recorded as ops, `Recorder.record_getitem`), no op is
  opaque or random, no input is written in place, no Python state of the cells it called changed
  across the call (`_plain_state`: plain attributes by value, containers by length; MindSpore's own
  Cell bookkeeping excluded), and two recordings of the signature agree exactly (program text, roles
  of the inputs, outputs, the values of tensors of no recorded origin). Otherwise the reason is
  counted (`regions_not_replayable`) and the signature runs eagerly from then on.
- replay: guards as data (`RegionGuard`, `check_guards`: each parameter's storage, shape and dtype,
  each cell's training flag and Python state; grad mode where a Cell call starts); a failure is
  counted by reason (`region_guard_failures`), runs the call eagerly and sends the signature back to
  learning. Then the plan runs on NumPy views of the arguments and parameters (no copy), and its
  outputs are wrapped as tensors (`Tensor.from_numpy`) in the structure the eager call returned. A
  plan that fails on its values runs the call eagerly (eager's error or result).
- eager: not replayable, retired, or not faster than eager for this signature.

Backward kernels MindSpore runs without dispatching them leave tensors of unknown origin in a
recorded gradient step: a returned gradient with no register, or an input first read in the
backward phase. `_Explainer` places a rule of ours for each (a sum over leading axes, softmax_grad,
LayerNorm's gradients, the padded gradient of indexing, a take of rows, a mask, a constant), chosen
by comparing the rule's value on the recorded registers with the tensor's recorded value; a tensor
no rule explains makes the region not replayable ("unexplained backward tensor", with its shape).
Forward-phase tensors of no recorded origin (constants MindSpore makes inside the call, tensors the
function captures) are read live at each replay; their values are part of the recording's key.

Optimizer steps (`_OptState`): MindSpore runs them as graphs no hook sees, so they are not recorded:
a supported optimizer's update rule (`jit/optim.py`) is checked against one eager step and then run
in place on its parameters' and states' memory (Adam and SGD without momentum as one fused C call,
`optim.FusedStep`, the form that is checked).

Re-verification: at a region's replay counts in `REVERIFY_AT` (then every `REVERIFY_EVERY`), over
all its signatures, the call is learned again (recorded eagerly) and compared with the plan:
another program, or outputs beyond rtol 1e-4, retires the signature (`region_retired`) and it runs
eagerly from then on.

Per batch size (with the `step_switch` option, on by default): the eager wall time of the recorded
calls (an overestimate of plain eager) is kept per signature; after `_TIME_SAMPLES` replays whose
median is not below it, the signature runs eagerly ("slower than eager").

Not handled (they run eagerly, counted where they are region calls): functions given keyword
arguments, regions called inside another region's learning or inside `ms_dynvm.record()`, item
assignment and tensor indices inside a region, bfloat16 programs, optimizers with weight decay,
loss scale, grouped or dynamic learning rates, and optimizers other than SGD, Momentum and Adam.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
import statistics
import threading
import time
from itertools import chain as _chain, repeat as _repeat
from operator import attrgetter as _attrgetter, is_ as _is, methodcaller as _methodcaller
from typing import NamedTuple

import numpy as np
from mindspore import Tensor, nn
from mindspore._c_expression import TensorPy

try:  # MindSpore 2.9+ moved it; the old path still works with a deprecation warning.
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover
    from mindspore.common.api import _pynative_executor

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.family import SizeFamily, split_numbers
from ms_dynvm.bytecode.program import Instr, Program
from ms_dynvm.bytecode.text import Reg, format_attrs, format_instr
from ms_dynvm.frontend.recorder import _array_of, _snapshot, _storage_key
from ms_dynvm.ir.verifier import VerifyError, verify_types
from ms_dynvm.jit.replay import NotReplayable, RegionPlan
from ms_dynvm.metrics import METRICS
from ms_dynvm.observe import events as _events

LEARN_CALLS = 2
# New sizes of an established family written from its members instead of recorded (`Regions._derive`);
# DYNVM_REGION_DERIVE=0 records every size (for comparisons).
DERIVE = os.environ.get("DYNVM_REGION_DERIVE", "1") != "0"
REVERIFY_AT = (16, 128, 1024)  # replays of a region (any signature) that are re-verified
REVERIFY_EVERY = 4096
_TIME_SAMPLES = 5
_GRAPH_RETRIES = 2  # learning attempts that met an optimizer step not checked yet (see Regions._learn)
_PLAIN = (int, float, str, bool, type(None))
# Opaque ops whose results depend on an RNG: not replayed (a call would draw other values than eager's
# stream at that point of the script).
_RANDOM_NAME = re.compile(r"Random|Dropout|Uniform|Normal|Bernoulli|Multinomial|Randint|Randperm|Gamma|"
                          r"Poisson|Shuffle|Rand", re.I)
_CONST_MAX = 16  # elements: a held tensor this small enters a recording's key by value, a larger by digest
_ATTR = "_ms_dynvm_region_obj"
_EXCLUDE = "_ms_dynvm_exclude"
_OPT_ATTR = "_ms_dynvm_optimizer"
_INNER = "_ms_dynvm_inner_region"
_OUTER = "_ms_dynvm_outer_region"
from mindspore.nn.optim.optimizer import Optimizer as _Optimizer  # noqa: E402
_is_contiguous = TensorPy.is_contiguous
_DATA_PTR = TensorPy._data_ptr
_F32 = np.dtype(np.float32)
# MindSpore's own per-Cell bookkeeping (set on every Cell, some of it changed by calls): not the
# script's Python state. `training` stays in (a guard of its own in the issue's terms).
_CELL_INTERNAL = frozenset(k for k in nn.Cell().__dict__ if k != "training")


class _Unsupported(Exception):
    pass


_DTYPE_STR: list = []  # [(MindSpore dtype object, its str)]: dtypes are singletons; str() costs ~2 us


def _dtype_str(dt) -> str:
    for o, name in _DTYPE_STR:
        if o is dt:
            return name
    name = str(dt)
    if len(_DTYPE_STR) < 32:
        _DTYPE_STR.append((dt, name))  # (held here: the identity stays this object's)
    return name


def _arg_spec(obj, flat: list):
    """A hashable description of an argument (tensors appended to `flat`)."""
    t = type(obj)
    if t in _PLAIN:
        if t is float and obj != obj:
            raise _Unsupported("NaN argument")
        return (t.__name__, obj)
    if t is tuple or t is list:
        return (t.__name__, tuple(_arg_spec(x, flat) for x in obj))
    if isinstance(obj, Tensor):
        flat.append(obj)
        return ("T", _dtype_str(obj.dtype), tuple(obj.shape))
    raise _Unsupported(f"argument of type {t.__name__}")


def _out_spec(obj, flat: list):
    """The structure of a result: tensors appended to `flat`, None kept."""
    t = type(obj)
    if obj is None:
        return None
    if t is tuple or t is list:
        return (t.__name__, tuple(_out_spec(x, flat) for x in obj))
    if isinstance(obj, Tensor):
        flat.append(obj)
        return "T"
    raise _Unsupported(f"result of type {t.__name__}")


def _rebuild(spec, it):
    if spec is None:
        return None
    if spec == "T":
        return next(it)
    kind, items = spec
    vals = [_rebuild(s, it) for s in items]
    return tuple(vals) if kind == "tuple" else vals


def _view(t, dt: np.dtype, shape: tuple) -> np.ndarray:
    """A NumPy view of tensor `t`'s host memory (no copy, no sync-point hook); a copy where `t` is
    not contiguous. The caller keeps `t` alive while the view is used."""
    n = dt.itemsize
    for s in shape:
        n *= s
    if n == 0:
        return np.empty(shape, dt)
    if not _is_contiguous(t):
        return np.array(TensorPy.asnumpy(t), dtype=dt, copy=True)
    buf = (ctypes.c_char * n).from_address(t._data_ptr())
    return np.frombuffer(buf, dt).reshape(shape)


_CONTAINERS = (list, set)
_UNTRACKED = object()
_IS_TENSOR: dict = {}  # type -> whether it is a Tensor class (isinstance through Tensor's ABCMeta is slow)
_BINDINGS = frozenset(("_params", "_cells", "_tensor_list", "_params_list"))  # MindSpore's name -> object maps
from collections import OrderedDict as _OrderedDict  # noqa: E402

_PLAIN_TYPES = frozenset(_PLAIN)
_MAPS = (dict, _OrderedDict)


def _summary(k: str, v):
    """What the guards keep of attribute `k` = `v` of a cell (see `_plain_state`), or _UNTRACKED."""
    if k.startswith("_ms_dynvm"):
        return _UNTRACKED
    if k in _CELL_INTERNAL:
        if k in _BINDINGS and type(v) in (dict, _OrderedDict):
            return tuple((n, id(o)) for n, o in v.items())
        return _UNTRACKED
    t = type(v)
    if t in _PLAIN:
        return v
    if t is dict:
        return ("dict", len(v), tuple(sorted((str(a), b) for a, b in v.items() if type(b) in _PLAIN)))
    if t in _CONTAINERS:
        return ("len", len(v))
    is_t = _IS_TENSOR.get(t)
    if is_t is None:
        is_t = _IS_TENSOR[t] = issubclass(t, Tensor)
    return ("id", id(v)) if is_t else _UNTRACKED


def _plain_state(cell) -> tuple:
    """A cell's Python state as the guards see it: its plain attributes (numbers, strings, bools,
    None) by value; its dicts' plain values by value and their lengths, its lists' and sets' lengths
    (a list the construct appends activations to grows: a replay would not append); and which objects
    its Parameters, sub-Cells and tensor attributes are (rebinding `net.fc = nn.Dense(...)` or
    `net.weight = Parameter(...)` changes the program; ids are safe here: the region keeps the
    recorded objects alive)."""
    out = []
    for k, v in cell.__dict__.items():
        sm = _summary(k, v)
        if sm is not _UNTRACKED:
            out.append((k, sm))
    out.sort(key=lambda kv: kv[0])
    return tuple(out)


def _state_matches(cell, expect) -> bool:
    """`_plain_state(cell) == state` for `expect = (number of attributes, state)`, reading only the
    tracked attributes (a new attribute changes the number)."""
    n, state = expect
    d = cell.__dict__
    if len(d) != n:
        return _plain_state(cell) == state  # (an untracked attribute was added or removed)
    get = d.get
    for k, v in state:
        x = get(k, _UNTRACKED)
        t = type(x)
        if t is type(v) and t in _PLAIN_TYPES:  # (a tracked plain attribute's summary is its value)
            if x != v:
                return False
        elif t in _MAPS and k in _BINDINGS and k in _CELL_INTERNAL:
            # (MindSpore's name -> object maps, as `_summary` keeps them: names and ids, in order)
            if len(x) != len(v):
                return False
            for (name, o), (name0, i0) in zip(x.items(), v):
                if name != name0 or id(o) != i0:
                    return False
        elif _summary(k, x) != v:
            return False
    return True


def _np_dtype(ty) -> np.dtype:
    return np.dtype(dtypes.to_numpy(ty.dtype))


class _Learned:
    """One recorded call, made into a plan candidate (its plan built on demand: `make_plan`)."""

    def __init__(self, key, build, roles, out_spec, cells, seconds, text="", wiring=None) -> None:
        self.key = key  # what two recordings must share
        self._build = build  # () -> RegionPlan (may raise NotReplayable)
        self.plan = None
        self.roles = roles  # per plan input: ("arg", i) | ("param", Parameter) | ("held", tensor)
        self.out_spec = out_spec
        self.cells = cells  # [(cell, plain state)]
        self.seconds = seconds
        # The program with its explained backward groups, as text (`_family_text`), and what a
        # recording's trace is compared by at re-verification: that text and the key's other parts.
        self.text = text
        self.trace = (text,) + tuple(key[2:])
        # (in_regs, out_regs, n_out, in_dts) where a program of this form can be written for another
        # size from a size family (`SizeFamily`); None where it cannot (optimizer steps inside, opaque
        # calls into MindSpore).
        self.wiring = wiring
        self.derived = False  # (written from a size family, `derive`: no member of it)

    def derive(self, text: str) -> "_Learned":
        """This recording's plan candidate at another size: `text` is this one's `text` with the
        numbers a `SizeFamily` wrote for that size. Its roles, outputs, cells and held tensors are
        this recording's (the family's members agreed on them)."""
        in_regs, out_regs, n_out, in_dts = self.wiring
        prog, extra = _parse_family_text(text)
        in_shapes = [tuple(prog.types[r].shape) for r in in_regs]
        if any(not all(type(d) is int for d in s) for s in in_shapes):
            raise NotReplayable("symbolic input shape")
        if any(role != "arg" and shape != old for (role, _), shape, old in
               zip(self.roles, in_shapes, self.plan.in_shapes)):
            raise NotReplayable("a held tensor's size changes")  # (its recorded object is read)

        try:  # (the kernels trust a program's types: a written one has them checked first)
            verify_types(prog.types, _chain(prog.instrs(), *extra))
        except VerifyError as e:
            raise NotReplayable(f"derived program: {e}") from None

        def build():
            plan = RegionPlan.build(prog, in_regs, out_regs, extra)
            plan.n_out = n_out
            plan.opt_steps = []
            plan.in_dts = in_dts
            plan.in_shapes = in_shapes
            return plan

        lr = _Learned((None, None) + tuple(self.key[2:]), build, self.roles, self.out_spec, self.cells,
                      self.seconds, text, self.wiring)
        lr.derived = True
        lr.in_shapes = in_shapes
        return lr

    def make_plan(self):
        """The recording's RegionPlan, built once (`RegionPlan.build`: the pass pipeline, dead code,
        binding); raises NotReplayable where the program cannot be planned."""
        if self.plan is None:
            t0 = time.perf_counter()
            try:
                self.plan = self._build()
            finally:
                dt = time.perf_counter() - t0
                METRICS.region_learn_seconds += dt
                METRICS.region_plan_seconds += dt
            self._build = None
        return self.plan


class _Entry:
    """A region's state for one input signature."""

    def __init__(self) -> None:
        self.state = "learn"
        self.learned: list = []
        self.plan = None
        self.key = None
        self.roles = None
        self.out_spec = None
        self.cells = None
        self.dts = None
        self.shapes = None
        self.param_views: list = []  # (index in roles, Parameter, data pointer, view)
        self.fast = None  # _FastGuards, from install
        self.fast_builds = 0
        self.template = None  # the plan's input arrays with the kept views in place, from install
        self.eager_s = float("inf")
        self.trace = None  # the installed recording's (`_Learned.trace`)
        self.sizes = None  # (the argument signature with its sizes abstracted, the sizes): `_sizes`
        self.derive_tried = False  # (a size family was asked for this signature's program once)
        self.replay_s: list = []
        self.replays = 0
        self.replay_total = 0.0  # seconds in this signature's replays
        self.skip = 0  # calls to run eagerly before learning goes on
        self.retries = 0
        self.reason = ""

    def install(self, lr: _Learned) -> None:
        self.plan, self.roles, self.out_spec, self.cells = lr.plan, lr.roles, lr.out_spec, lr.cells
        self.key = lr.key
        self.trace = lr.trace
        self.dts = [np.dtype(d) for d in lr.plan.in_dts]
        self.shapes = lr.plan.in_shapes
        self.param_views = []
        guards = []
        template = [None] * len(self.roles)
        args, held, kept = [], [], []
        for k, (role, obj) in enumerate(self.roles):
            if role == "param":
                ptr = obj._data_ptr()
                view = _view(obj, self.dts[k], self.shapes[k])
                self.param_views.append([k, obj, ptr, view])
                # (the view is valid while the storage guard holds: same data pointer, shape, dtype)
                template[k] = view
                guards.append(RegionGuard("storage", obj, (ptr, self.shapes[k], str(obj.dtype))))
            elif role == "arg":
                args.append((k, obj, self.dts[k], self.shapes[k]))
            elif role == "held":
                if _is_contiguous(obj):  # (its view, kept while its data pointer stays: `_held_views`)
                    template[k] = _view(obj, self.dts[k], self.shapes[k])
                    kept.append((k, obj))
                else:
                    held.append((k, obj, self.dts[k], self.shapes[k]))
        self.template, self.arg_slots, self.held_slots = template, tuple(args), tuple(held)
        self.kept_objs = tuple(o for _, o in kept)
        self.kept_ptrs = tuple(map(_DATA_PTR, self.kept_objs))
        self.kept = tuple(kept)
        for cell, state in self.cells:
            guards.append(RegionGuard("training", cell, dict(state).get("training")))
            guards.append(RegionGuard("state", cell, (len(cell.__dict__), state)))
        self.guards = tuple(guards)
        self.fast = _FastGuards(self.guards)
        self.fast_builds = 0
        self.state = "replay"

    def held_views(self) -> None:
        """The held tensors' views made again (a held tensor's storage moved)."""
        for k, obj in self.kept:
            self.template[k] = _view(obj, self.dts[k], self.shapes[k])
        self.kept_ptrs = tuple(map(_DATA_PTR, self.kept_objs))

    def guard(self) -> str | None:
        """None where the plan may run, else the reason (`check_guards`). The guards' fast form
        (`_FastGuards`) passes only where they all pass; where it does not, the guards run as data
        (and a pass there, an attribute rebound to an equal value, refreshes the fast form)."""
        for st, _, _ in self.plan.opt_steps:
            if st.state != "replay" or any(t._data_ptr() != ptr for t, ptr in st.ptrs):
                return "optimizer state"
        if self.fast.ok():
            return None
        why = check_guards(self.guards)
        if why is None and self.fast_builds < _FAST_BUILDS:
            self.fast_builds += 1  # (bounded: a form that keeps failing is not made again every call)
            self.fast = _FastGuards(self.guards, passed=True)
        return why


class RegionGuard(NamedTuple):
    """One check a replay makes, as data: `kind` "storage" (a Parameter's data pointer, shape and
    dtype equal `value`), "training" (a cell's training flag), "state" (a cell's plain Python
    attributes, `_plain_state`). The input signature is the key of the plan, not a guard; grad mode
    is checked where a Cell call starts (`Regions.cell_call`)."""

    kind: str
    obj: object
    value: object


_GUARD_REASON = {"storage": "parameter storage", "training": "training flag", "state": "python state"}


_SHAPE_OF, _DTYPE_OF = _attrgetter("shape"), _attrgetter("dtype")  # (what the guards read)
_FAST_BUILDS = 16  # times a signature's fast guard form is made again after the guards passed without it
_TRAINING_OF = _attrgetter("training")
_DICT_OF = _attrgetter("__dict__")
_VALUES = _methodcaller("values")


class _FastGuards:
    """The guards of one plan (`check_guards`) in a form that is quick to check, made where they all
    pass: a snapshot of the objects they read, compared by identity with a few C-level scans over
    all the plan's Parameters and cells. Passing it means every object the guards read is the one
    read when the guards passed, so they pass; failing it says nothing (the guards then run as data):
    - storage: each Parameter's data pointer, shape and dtype (dtypes are singletons: by identity);
    - training: each cell's flag;
    - state: each cell's `__dict__` (the same dict, its number of attributes), its tracked attributes'
      values (the same objects: plain values, tensors, containers), and the containers' contents:
      for dicts (MindSpore's name -> object maps, the cell's own dicts) the same length, the same keys
      in the same order and the same value under each key; for lists and sets the same length."""

    __slots__ = ("params", "ptrs", "shapes", "dtypes", "cells", "trainings", "owners", "dicts", "ns",
                 "dicts_k", "keys", "vals", "maps", "map_ns", "full", "map_of", "map_keys", "map_vals", "seqs", "seq_ns",
                 "usable")

    def __init__(self, guards: tuple, passed: bool = False) -> None:
        """`passed`: the guards were just checked and passed (else they are checked here)."""
        try:
            self.usable = passed or check_guards(guards) is None
        except Exception:  # noqa: BLE001 - a guard that cannot be read: no fast form (the guards decide)
            self.usable = False
        st = [g.obj for g in guards if g.kind == "storage"]
        self.params = tuple(st)
        self.ptrs = tuple(map(_DATA_PTR, st))
        self.shapes = tuple(map(_SHAPE_OF, st))
        self.dtypes = tuple(map(_DTYPE_OF, st))
        tr = [g.obj for g in guards if g.kind == "training"]
        self.cells = tuple(tr)
        self.trainings = tuple(map(_TRAINING_OF, tr))
        dicts, ns, dicts_k, keys, vals, maps, seqs, owners = [], [], [], [], [], [], [], []
        for g in guards:
            if g.kind != "state":
                continue
            owners.append(g.obj)
            d = g.obj.__dict__
            if len(d) != g.value[0]:
                # (the guard then compares every attribute, untracked ones included: not this form's)
                self.usable = False
            dicts.append(d)
            ns.append(len(d))
            for k, v in g.value[1]:
                x = d.get(k, _UNTRACKED)
                if x is _UNTRACKED or (type(x) is float and x != x):
                    self.usable = False  # (a NaN attribute never passes the guard)
                dicts_k.append(d)
                keys.append(k)
                vals.append(x)
                if type(x) in _MAPS:
                    maps.append(x)
                elif type(x) in _CONTAINERS:
                    seqs.append(x)
        self.owners, self.dicts, self.ns = tuple(owners), tuple(dicts), tuple(ns)
        self.dicts_k, self.keys, self.vals = tuple(dicts_k), tuple(keys), tuple(vals)
        self.maps, self.map_ns = tuple(maps), tuple(map(len, maps))
        full = [x for x in maps if x]  # (an empty one: its length says all)
        self.full = tuple(full)
        self.map_keys = tuple(_chain.from_iterable(full))  # (in the maps' order)
        self.map_of = tuple(_chain.from_iterable([x] * len(x) for x in full))  # (the map of each key)
        self.map_vals = tuple(_chain.from_iterable(map(_VALUES, full)))
        self.seqs, self.seq_ns = tuple(seqs), tuple(map(len, seqs))

    def ok(self) -> bool:
        is_ = _is
        p = self.params
        return (self.usable
                and tuple(map(_DATA_PTR, p)) == self.ptrs
                and tuple(map(_SHAPE_OF, p)) == self.shapes
                and all(map(is_, map(_DTYPE_OF, p), self.dtypes))
                and all(map(is_, map(_TRAINING_OF, self.cells), self.trainings))
                and all(map(is_, map(_DICT_OF, self.owners), self.dicts))
                and tuple(map(len, self.dicts)) == self.ns
                and all(map(is_, map(dict.get, self.dicts_k, self.keys, _repeat(_UNTRACKED)), self.vals))
                and tuple(map(len, self.maps)) == self.map_ns
                and all(map(is_, _chain.from_iterable(self.full), self.map_keys))
                and all(map(is_, map(dict.get, self.map_of, self.map_keys, _repeat(_UNTRACKED)), self.map_vals))
                and tuple(map(len, self.seqs)) == self.seq_ns)


def check_guards(guards: tuple) -> str | None:
    """The reason of the first failing guard (counted by the caller), or None."""
    for g in guards:
        k, o = g.kind, g.obj
        if k == "storage":
            ptr, shape, dt = g.value
            ok = o._data_ptr() == ptr and tuple(o.shape) == shape and _dtype_str(o.dtype) == dt
        elif k == "training":
            ok = o.training == g.value
        else:
            ok = _state_matches(o, g.value)
        if not ok:
            return _GUARD_REASON[k]
    return None


class _OptState:
    """A supported optimizer's replay state: its parameters' and states' memory as NumPy views, the
    rule, and what its construct returns (a constant: the graph returns True or a tuple of them).

    learn: at its second call (the first warms MindSpore up) the rule runs on copies of every
    tensor while the eager step runs; the rule is kept only where every parameter and state tensor
    equals the eager result (rtol 1e-5, atol 1e-7)."""

    def __init__(self, opt) -> None:
        self.opt = opt
        self.kind = type(opt).__name__
        self.state = "learn"
        self.reason = ""
        self.replays = 0
        self.replay_total = 0.0
        self.eager_s = float("inf")
        self.consts = ()
        self.calls = 0
        self.ret = None
        self.ptrs = None
        self.views = None
        self.fused = None  # optim.FusedStep over `views`, where the rule has one

    def why_not(self) -> str | None:
        from mindspore import nn, float32

        opt = self.opt
        t = type(opt)
        if t not in (nn.SGD, nn.Momentum, nn.Adam):
            return f"optimizer {t.__name__}"
        if opt.dynamic_lr or opt.is_group or opt.is_group_lr or opt.exec_weight_decay or opt.need_scale \
                or opt.grad_centralization or opt.dynamic_weight_decay:
            return "optimizer options"
        if t is nn.Adam and (opt.use_amsgrad or opt.use_lazy or opt.use_offload):
            return "optimizer options"
        if t is nn.Momentum and opt.use_nesterov:  # (its kernel's rounding is not reproduced)
            return "optimizer options"
        if any(p.dtype != float32 for p in opt._parameters):
            return "optimizer dtype"
        return None

    def _tensors(self) -> dict:
        """name -> list of the optimizer's tensors (Parameters) the rule reads or writes."""
        from mindspore import nn

        opt = self.opt
        d = {"params": list(opt._parameters), "lr": [opt.learning_rate], "step": [opt.global_step]}
        t = type(opt)
        if t is nn.SGD:
            d.update(accum=list(opt.accum), stat=list(opt.stat), momentum=[opt.momentum])
        elif t is nn.Momentum:
            d.update(moments=list(opt.moments), momentum=[opt.momentum])
        else:
            d.update(m1=list(opt.moment1), m2=list(opt.moment2), b1p=[opt.beta1_power], b2p=[opt.beta2_power])
        return d

    def _make_views(self) -> None:
        from mindspore import nn

        opt = self.opt
        if type(opt) is nn.Adam:  # (constant tensors of the optimizer, read once: not parameters)
            self.consts = tuple(float(_snapshot(t)) for t in (opt.beta1, opt.beta2, opt.eps))
        d = self._tensors()
        self.views, self.ptrs = {}, []
        for k, ts in d.items():
            arrs = []
            for t in ts:
                dt = np.dtype(np.int32) if k == "step" else np.dtype(np.float32)
                arrs.append(_view(t, dt, tuple(t.shape)))
                self.ptrs.append((t, t._data_ptr()))
            self.views[k] = arrs
        self.shapes = [tuple(p.shape) for p in d["params"]]

    def guard(self, grads, learning: bool = False) -> str | None:
        if grads is None or len(grads) != len(self.opt._parameters):
            return "optimizer arguments"
        for g, p in zip(grads, self.opt._parameters):
            if not isinstance(g, Tensor) or tuple(g.shape) != tuple(p.shape) or \
                    _dtype_str(g.dtype) != _dtype_str(p.dtype):
                return "optimizer arguments"
        if not learning:
            for t, ptr in self.ptrs:
                if t._data_ptr() != ptr:
                    return "parameter storage"
        return None

    def _fused(self, v: dict):
        """`optim.FusedStep` over the arrays of `v` (Adam; SGD, used at steps without momentum), or
        None (another rule, no compiler, arrays it cannot take)."""
        from mindspore import nn

        from ms_dynvm.jit import optim

        t = type(self.opt)
        try:
            if t is nn.Adam:
                return optim.FusedStep("adam", v["params"], v["m1"], v["m2"])
            if t is nn.SGD and not self.opt.nesterov:
                return optim.FusedStep("sgd", v["params"])
        except (RuntimeError, ValueError):
            pass
        return None

    def _rule(self, v: dict, grads: list, fused=None, gptrs=None) -> None:
        """One step of the rule on the arrays of `v`; through `fused` (made by `_fused` for `v`) where
        given, on the gradients at addresses `gptrs` (float32, C-contiguous, the parameters' sizes)."""
        from mindspore import nn

        from ms_dynvm.jit import optim

        opt = self.opt
        t = type(opt)
        lr = float(v["lr"][0])
        if fused is not None and gptrs is None:
            gptrs = [a.ctypes.data for a in grads()]
        if t is nn.SGD:
            mom = float(v["momentum"][0])
            if fused is not None and not mom > 0.0:  # (the rule's own branch: the step is the gradient)
                fused(gptrs, lr)
            else:
                optim.sgd(v["params"], grads(), v["accum"], v["stat"], lr, mom, opt.dampening, opt.nesterov)
        elif t is nn.Momentum:
            optim.momentum(v["params"], grads(), v["moments"], lr, float(v["momentum"][0]), opt.use_nesterov)
        else:
            b1, b2, eps = self.consts
            v["b1p"][0][...] = v["b1p"][0] * np.float32(b1)
            v["b2p"][0][...] = v["b2p"][0] * np.float32(b2)
            if fused is not None:
                fused(gptrs, lr, b1, b2, eps, float(v["b1p"][0]), float(v["b2p"][0]), opt.use_nesterov)
            else:
                optim.adam(v["params"], grads(), v["m1"], v["m2"], lr, b1, b2, eps,
                           float(v["b1p"][0]), float(v["b2p"][0]), opt.use_nesterov)
        v["step"][0] += 1

    def step(self, grads) -> None:
        """The step on the gradient tensors `grads` (checked by `guard`)."""
        shapes = self.shapes
        if self.fused is not None and all(_is_contiguous(g) for g in grads):
            # (the gradients' memory by address: no NumPy view made)
            self._rule(self.views, lambda: [_view(g, _F32, s) for g, s in zip(grads, shapes)], self.fused,
                       [g._data_ptr() or 0 for g in grads])
            return
        arrs = [_view(g, _F32, s) for g, s in zip(grads, shapes)]
        self._rule(self.views, lambda: arrs, self.fused, None)

    def step_arrays(self, grads: list) -> None:
        """The step on gradients that are NumPy arrays already (a replayed train-step region)."""
        arrs = [g if g.dtype == _F32 and g.flags.c_contiguous else np.ascontiguousarray(g, _F32) for g in grads]
        self._rule(self.views, lambda: arrs, self.fused, None)
        self.replays += 1

    def learn(self, grads, run):
        self._make_views()
        before = {k: [a.copy() for a in arrs] for k, arrs in self.views.items()}
        g = [np.array(_view(t, np.dtype(np.float32), s)) for t, s in zip(grads, self.shapes)]
        t0 = time.perf_counter()
        out = run()
        self.eager_s = time.perf_counter() - t0
        try:
            # The rule is checked as it will run: fused where replays will be (`_fused`).
            self.fused = self._fused(self.views)
            self._rule(before, lambda: g, self._fused(before) if self.fused is not None else None, None)
            ok = all(np.allclose(b, a, rtol=1e-5, atol=1e-7)
                     for k in self.views for b, a in zip(before[k], self.views[k]))
            if type(out) not in (bool, tuple) or (type(out) is tuple and any(type(x) is not bool for x in out)):
                why = "optimizer result"
            else:
                why = None if ok else "optimizer rule differs from eager"
        except Exception as e:  # noqa: BLE001 - ms_dynvm's own failure: eager, counted
            why = f"error ({type(e).__name__})"
        if why is None:
            self.ret = out
            self.state = "replay"
            METRICS.region_compiles += 1
        else:
            self.state = "eager"
            self.reason = why
            METRICS.regions_not_replayable[why] += 1
        return out


class Region:
    """A region owner: a differentiated function's wrapper, a Cell, or a `jit`-marked function."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        self.entries: dict = {}
        self.calls = 0
        self.cell = None  # the Cell, for a Cell region
        self.families: dict = {}  # _family(key) -> True: established (see Regions._learn)
        self.replays = 0  # over all signatures: re-verification is per region (REVERIFY_AT)
        self.explained: dict = {}  # the backward rules that explained its recordings (_Explainer.explain)
        self.excluded = False
        # Abstract argument signature (`_sizes`) -> {family (`_family`): [SizeFamily, a recorded member]}
        self.size_families: dict = {}


def _region_of_cell(cell) -> Region:
    d = cell.__dict__
    r = d.get(_ATTR)
    if r is None or r[0] != id(cell):
        r = d[_ATTR] = (id(cell), Region("cell", type(cell).__name__))
    return r[1]


class Regions:
    """The tier-2 manager of one `enable()`: learning, guards, replay, counters."""

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.depth = 0  # region calls being run eagerly (nested owners are not regions)
        self.cells: list | None = None  # cells met during a learning recording
        self.opt_steps: list | None = None  # optimizer steps run by their rule during it
        self.active = True

    # --- hooks -------------------------------------------------------------------------------------
    def note_cell(self, cell) -> None:
        """The Cell hook: a Cell is being called (inside a learning recording: remembered, with its
        plain state before the call)."""
        cells = self.cells
        if cells is not None and all(c is not cell for c, _ in cells):
            cells.append((cell, _plain_state(cell)))

    @staticmethod
    def is_optimizer(cell) -> bool:
        """Optimizer steps are regions wherever they are called (a train-step Cell calls them)."""
        return isinstance(cell, _Optimizer)

    def cell_call(self, cell, args, run):
        """An outermost Cell call (`run()` makes it eagerly, with ms_dynvm's other hooks)."""
        if not self._usable() or cell.__dict__.get(_EXCLUDE):
            return run()
        if isinstance(cell, _Optimizer):
            return self._optimizer_call(cell, args, run)
        region = _region_of_cell(cell)
        if _grad_enabled():  # (a Cell called under a gradient that is no region of ours)
            if any(e.state == "replay" for e in region.entries.values()):
                METRICS.region_guard_failures["grad mode"] += 1
            return self._eager(run)
        region.cell = cell
        return self.call(region, run, args)

    def _usable(self) -> bool:
        if not self.active or self.depth or threading.get_ident() != self.thread:
            return False
        s = _dispatch_state()
        return s.mode is not None and s.recorder.recording is None and s.options.regions

    # --- calls ------------------------------------------------------------------------------------
    def call(self, region: Region, run, args):
        """Run one call of `region`: `run()` is the eager call."""
        if region.excluded:
            self.depth += 1  # (nor anything it calls)
            try:
                return run()
            finally:
                self.depth -= 1
        METRICS.region_calls += 1
        region.calls += 1
        flat: list = []
        try:
            key = _arg_spec(args, flat)
        except _Unsupported as e:
            METRICS.regions_not_replayable[str(e)] += 1
            METRICS.region_fallbacks[str(e)] += 1
            return self._eager(run)
        entry = region.entries.get(key)
        if entry is None:
            entry = region.entries[key] = _Entry()
            entry.sizes = _sizes(key)
            METRICS.regions_seen += 1
            if len(region.entries) == 1:
                _seen(region)
        if entry.state == "replay":
            t0 = time.perf_counter()
            try:
                why = entry.guard()
            except Exception as e:  # noqa: BLE001 - a guard that cannot be read fails: eager, counted
                why = f"guard error ({type(e).__name__})"
            if why is None:
                entry.replays += 1
                region.replays += 1
                n = region.replays
                if n in REVERIFY_AT or n % REVERIFY_EVERY == 0:
                    return self._reverify(region, entry, run, flat)
                return self._replay(entry, flat, t0, run)
            METRICS.region_guard_failures[why] += 1
            METRICS.region_fallbacks[f"guard: {why}"] += 1
            if _events.ON:
                _events.instant("region guard failure", "guard", reason=why, region=region.name)
            self._reset(entry)
            return self._eager(run)
        if entry.state == "learn" and entry.skip:
            entry.skip -= 1  # (a call that lets an optimizer inside learn its rule first: _learn)
            return self._eager(run)
        if entry.state == "learn" and region.calls > 1:  # (the region's first call warms MindSpore up)
            if DERIVE and not entry.derive_tried and not entry.learned and region.size_families:
                entry.derive_tried = True
                out = self._derive(region, entry, run, flat)
                if out is not _NOT_DERIVED:
                    return out
            return self._learn(region, entry, run, flat)
        if entry.state == "eager":
            METRICS.region_fallbacks[entry.reason] += 1
        elif region.calls == 1:
            return self._warm_up(run)
        return self._eager(run)

    # --- optimizers ---------------------------------------------------------------------------------
    def _optimizer_call(self, opt, args, run):
        """An `nn` optimizer's step: replayed by its update rule (`jit/optim.py`) once the rule has
        matched an eager step; see `_OptState`."""
        METRICS.region_calls += 1
        st = opt.__dict__.get(_OPT_ATTR)
        if st is None or st[0] != id(opt):
            st = opt.__dict__[_OPT_ATTR] = (id(opt), _OptState(opt))
            METRICS.regions_seen += 1
            _seen(st[1])
        st = st[1]
        st.calls += 1
        grads = args[0] if len(args) == 1 and type(args[0]) in (tuple, list) else None
        if st.state == "replay":
            try:
                why = st.guard(grads)
            except Exception as e:  # noqa: BLE001 - as for regions: eager, counted
                why = f"guard error ({type(e).__name__})"
            if why is None:
                t0 = time.perf_counter()
                st.step(grads)
                dt = time.perf_counter() - t0
                METRICS.regions_replayed += 1
                METRICS.region_replay_seconds += dt
                st.replays += 1
                st.replay_total += dt
                return st.ret
            METRICS.region_guard_failures[why] += 1
            METRICS.region_fallbacks[f"guard: {why}"] += 1
            st.state = "learn"
            return self._eager(run)
        if st.state == "learn" and st.calls > 1:
            why = st.why_not() or (None if grads is not None and st.guard(grads, learning=True) is None
                                   else "optimizer arguments")
            if why is None:
                return self._eager(lambda: st.learn(grads, run))
            st.state = "eager"
            st.reason = why
            METRICS.regions_not_replayable[why] += 1
        elif st.state == "eager":
            METRICS.region_fallbacks[st.reason] += 1
        return self._eager(run)

    def optimizer_in_recording(self, opt, args, run):
        """An optimizer step inside a region being learned (a train-step Cell's `self.optimizer(grads)`).
        Where its rule has been checked (the optimizer replays on its own), the step runs by the rule
        here and the recording notes it (`opt_steps`): the plan runs it after the program, on the
        gradients' values. Otherwise it runs as MindSpore's graph: a graph-mode call, so this
        recording is not replayable."""
        st = opt.__dict__.get(_OPT_ATTR)
        st = st[1] if st is not None and st[0] == id(opt) else None
        grads = args[0] if len(args) == 1 and type(args[0]) in (tuple, list) else None
        try:
            usable = st is not None and st.state == "replay" and self.opt_steps is not None \
                and st.guard(grads) is None
        except Exception:  # noqa: BLE001 - then MindSpore's graph runs it (the recording is not replayable)
            usable = False
        if not usable:
            return run()
        st.step(grads)
        self.opt_steps.append((st, list(grads), _dispatch_state().recorder.program.num_instrs()))
        return st.ret

    @staticmethod
    def _eager(run):
        """The call runs eagerly; regions inside it (a gradient function or an optimizer called by a
        train-step Cell that is not replayable itself) are regions of their own."""
        return run()

    @staticmethod
    def _warm_up(run):
        """A region's first call: eager, without tier 1 (as its recordings run: `_no_tier1`).
        Nested regions stay regions."""
        with _no_tier1():
            return run()

    @staticmethod
    def _reset(entry: _Entry) -> None:
        entry.state = "learn"
        entry.learned = []
        entry.plan = None
        entry.fast = None  # (its snapshot holds the objects it read)
        entry.template = None

    def _replay(self, entry: _Entry, flat: list, t0: float, run=None):
        try:
            arrays = self._arrays(entry, flat)
            t1 = time.perf_counter()
            outs = entry.plan.run(arrays)
            t2 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - bad values (an index out of range): eager's error or result
            METRICS.region_guard_failures[f"replay error ({type(e).__name__})"] += 1
            self._reset(entry)
            return run()
        plan = entry.plan
        if plan.opt_steps:
            for st, k, n in plan.opt_steps:
                st.step_arrays(outs[k:k + n])
            outs = outs[:plan.n_out]
        from_numpy = Tensor.from_numpy
        res = _rebuild(entry.out_spec, iter([from_numpy(a) for a in outs]))
        t3 = time.perf_counter()
        dt = t3 - t0
        if _events.ON:
            _events.emit("region replay", "region", _events.now_us() - int(dt * 1e6), int(dt * 1e6),
                         steps=len(entry.plan.steps), host_us=int((dt - (t2 - t1)) * 1e6))
        METRICS.regions_replayed += 1
        METRICS.region_replay_seconds += dt
        METRICS.region_host_seconds += dt - (t2 - t1)
        entry.replay_total += dt
        if len(entry.replay_s) < _TIME_SAMPLES and _dispatch_state().options.step_switch:
            entry.replay_s.append(dt)
            if len(entry.replay_s) == _TIME_SAMPLES and statistics.median(entry.replay_s) >= entry.eager_s:
                entry.state = "eager"
                entry.reason = "slower than eager"
                METRICS.regions_not_replayable["slower than eager"] += 1
        return res

    @staticmethod
    def _arrays(entry: _Entry, flat: list) -> list:
        if entry.kept and tuple(map(_DATA_PTR, entry.kept_objs)) != entry.kept_ptrs:
            entry.held_views()
        arrays = entry.template.copy()  # (the parameters' and held tensors' views: see _Entry.install)
        for k, i, dt, shape in entry.arg_slots:
            arrays[k] = _view(flat[i], dt, shape)
        for k, obj, dt, shape in entry.held_slots:
            arrays[k] = _view(obj, dt, shape)
        return arrays

    def _learn(self, region: Region, entry: _Entry, run, flat: list):
        """A learning call. A signature is installed once LEARN_CALLS recordings of it agree exactly
        (program, roles, outputs, the values of tensors of no recorded origin); that establishes its
        family (`_family`: the program with its sizes abstracted), and a further signature of an
        established family is installed after one recording."""
        out, lr, why = self._record(region, run, flat)
        if why is None:
            entry.eager_s = min(entry.eager_s, lr.seconds)
            if any(x.key != lr.key for x in entry.learned):
                why = "recordings differ"
        if why is None:
            fam = _family(lr.key)
            if lr.suspect and any(x.data == lr.data for x in entry.learned):
                # The same argument values as an earlier recording: it shows nothing about which
                # values depend on the data (constants of the program), so it does not count.
                return out
            entry.learned.append(lr)
            if fam in region.families or len(entry.learned) >= LEARN_CALLS:
                why = self._install(entry, lr, region)
                if why is None and fam not in region.families:
                    region.families[fam] = True
                    self._install_pending(region, fam)
        if why == "graph-mode call inside" and entry.retries < _GRAPH_RETRIES:
            # An optimizer step inside whose rule is not checked yet ran as MindSpore's graph: the
            # next call runs eagerly (the optimizer learns its rule there), then learning resumes.
            entry.retries += 1
            entry.skip = 1
            entry.learned = []
            return out
        if why is not None:
            entry.state = "eager"
            entry.reason = why
            METRICS.regions_not_replayable[why] += 1
        return out

    @staticmethod
    def _install(entry: _Entry, lr: _Learned, region: Region | None = None) -> str | None:
        """Plan `lr` and install it for `entry`; the reason where it cannot be planned. A recording
        installed for an established family becomes a member of its size family (`_add_member`)."""
        try:
            lr.make_plan()
        except NotReplayable as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - ms_dynvm's own failure: eager, counted
            METRICS.record_errors[f"region: {type(e).__name__}: {e}"] += 1
            return f"error ({type(e).__name__})"
        entry.install(lr)
        entry.learned = []
        METRICS.region_compiles += 1
        if region is not None:
            _add_member(region, entry, lr)
        return None

    def _derive(self, region: Region, entry: _Entry, run, flat: list):
        """A first call at a new size of a region whose size family determines its program
        (`SizeFamily.instantiate`): the program is written for this size and planned instead of
        recorded, run, and checked against this call run eagerly (whose result is returned); where
        they agree the plan is installed and the next call replays. A program that fails the check
        breaks its family (sizes are recorded again from then on), counted in
        `region_derive_failures`. `_NOT_DERIVED` where no family determines one."""
        fams = region.size_families.get(entry.sizes[0])
        if not fams:
            return _NOT_DERIVED
        for sf, member in fams.values():
            text = sf.instantiate(entry.sizes[1])
            if text is None:
                continue
            t0 = time.perf_counter()
            try:
                lr = member.derive(text)
                if any(role == "arg" and tuple(flat[i].shape) != shape for (role, i), shape in
                       zip(lr.roles, lr.in_shapes)):
                    raise NotReplayable("derived argument shapes differ")  # (never expected: a guard)
                lr.make_plan()
                entry.install(lr)
                want = [np.array(a) for a in entry.plan.run(self._arrays(entry, flat))[:entry.plan.n_out]]
            except Exception as e:  # noqa: BLE001 - not plannable or not runnable here: recorded instead
                sf.broken = True
                METRICS.region_derive_failures[f"{type(e).__name__}"] += 1
                self._reset(entry)
                return _NOT_DERIVED
            finally:
                METRICS.region_learn_seconds += time.perf_counter() - t0
            out = self._checked_call(entry, run)
            try:
                why = _compare_outputs(want, out, entry.out_spec) or next(
                    ("python state changed" for cell, state in lr.cells if _plain_state(cell) != state), None)
            except Exception as e:  # noqa: BLE001 - ms_dynvm's own failure: the eager result stands
                why = f"error ({type(e).__name__})"
            if why is not None:
                sf.broken = True
                METRICS.region_derive_failures[why] += 1
                self._reset(entry)
                return out
            METRICS.region_compiles += 1
            METRICS.region_sizes_derived += 1
            return out
        return _NOT_DERIVED

    def _install_pending(self, region: Region, fam) -> None:
        """A family just established: the region's other signatures that hold one recording of it
        (made while the family was not established yet) are installed now, as a further size of an
        established family is after its one recording; their next call replays instead of being
        recorded again."""
        for e in region.entries.values():
            if e.state != "learn" or e.skip or not e.learned or _family(e.learned[-1].key) != fam:
                continue
            why = self._install(e, e.learned[-1], region)
            if why is not None:
                e.learned = []
                e.state = "eager"
                e.reason = why
                METRICS.regions_not_replayable[why] += 1

    def _checked_call(self, entry: _Entry, run):
        """The eager call that a derived plan is checked against, run as a recorded call is (nested
        Cells are no regions, tier 1 neither tracks nor compiles its ops) but not recorded, and
        timed for the step switch. (Not bare, the mode off MindSpore's stack: that measured slower.)"""
        self.depth += 1
        t0 = time.perf_counter()
        try:
            with _no_tier1():
                out = run()
        except BaseException:
            self._reset(entry)
            raise
        finally:
            self.depth -= 1
        entry.eager_s = time.perf_counter() - t0
        return out

    def _reverify(self, region: Region, entry: _Entry, run, flat: list):
        METRICS.region_reverifications += 1
        want = entry.plan.run(self._arrays(entry, flat))[:entry.plan.n_out]
        out, lr, why = self._record(region, run, flat)
        if why is None and lr.trace != entry.trace:
            why = "trace changed"
        if why is None:
            why = _compare_outputs(want, out, entry.out_spec)
        if why is not None:
            entry.state = "eager"
            entry.reason = why
            METRICS.region_retired[why] += 1
        return out

    def _record(self, region: Region, run, flat: list):
        """Run the call eagerly inside a recording: (its result, a _Learned or None, why not)."""
        from ms_dynvm.frontend import dispatch

        self.cells = [] if region.cell is None else [(region.cell, _plain_state(region.cell))]
        self.opt_steps = []
        self.depth += 1
        t0 = time.perf_counter()
        try:
            with _no_tier1(), dispatch.record() as rec:
                out = run()
        finally:
            self.depth -= 1
            cells, self.cells = self.cells, None
            opt_steps, self.opt_steps = self.opt_steps, None
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        try:
            lr = _make_learned(rec, out, flat, cells, seconds, region.explained, opt_steps)
        except (NotReplayable, _Unsupported) as e:
            return out, None, str(e)
        except Exception as e:  # noqa: BLE001 - ms_dynvm's own failure: eager, counted
            METRICS.record_errors[f"region: {type(e).__name__}: {e}"] += 1
            return out, None, f"error ({type(e).__name__})"
        finally:
            METRICS.region_learn_seconds += time.perf_counter() - t0
            METRICS.region_plan_seconds += time.perf_counter() - t1
        return out, lr, None


_NUMBER = re.compile(r"(?<![%\w])-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")


def _family(key) -> tuple:
    """A learned key with every number in the program's text abstracted (shapes, size-dependent
    attributes and scalars), so recordings at other sizes of one signature family compare equal;
    registers (%n), op names, roles and structure still have to match."""
    text, extra, roles, out_regs, out_spec, consts, opt = key
    return (_NUMBER.sub("#", text), tuple(_NUMBER.sub("#", e) for e in extra), roles, out_regs, out_spec,
            len(consts), opt)


@contextlib.contextmanager
def _no_tier1():
    """Tier 1 neither tracks nor compiles the ops of a region call run eagerly to be learned or
    checked (a warm-up, a recording, a derived size's check): the region will be replayed, and its
    groups' compiles would be paid for nothing (their Python work also slowed the calls after)."""
    from ms_dynvm.frontend import dispatch

    mode = dispatch._S.mode
    t1, mode.tier1 = mode.tier1, None
    try:
        yield
    finally:
        mode.tier1 = t1


_NOT_DERIVED = object()
_EXTRA = "__explained__"  # the region name of the blocks that hold explained backward groups in a family text


def _sizes(key) -> tuple:
    """(an argument signature with its sizes abstracted, the sizes): the sizes are the tensors'
    dims and the integer arguments, in order (what a `SizeFamily` explains numbers by)."""
    dims: list = []

    def walk(spec):
        tag = spec[0]
        if tag == "T":
            dims.extend(spec[2])
            return ("T", spec[1], len(spec[2]))
        if tag == "int":
            dims.append(spec[1])
            return ("int",)
        if tag == "tuple" or tag == "list":
            return (tag, tuple(map(walk, spec[1])))
        return spec

    return walk(key), tuple(dims)


def _family_text(ptext: str, prog, extra: list) -> str:
    """A recording's program text (`ptext`, its `as_text()`) with its explained backward groups
    appended as blocks of their own (`_EXTRA`): one text that `Program.parse` reads back and a
    `SizeFamily` can write at another size."""
    if not extra:
        return ptext
    lines = [ptext.rstrip("\n")]
    n = len(prog.blocks)
    for k, group in enumerate(extra):
        lines.append(f"block {n + k}" + format_attrs({"phase": "bwd", "region": _EXTRA, "end": "open"}))
        lines.extend("  " + format_instr(i.outs, prog.types, i.op, i.args, i.attrs) for i in group)
    return "\n".join(lines) + "\n"


def _parse_family_text(text: str) -> tuple:
    """(the program, its explained groups) from a `_family_text`."""
    prog = Program.parse(text)
    extra = [b.instrs for b in prog.blocks if b.region == _EXTRA]
    if extra:
        prog.blocks = [b for b in prog.blocks if b.region != _EXTRA]
    return prog, extra


def _add_member(region: Region, entry: _Entry, lr: _Learned) -> None:
    """An installed recording joins its family's `SizeFamily` (made at the family's first install),
    from which `Regions._derive` writes programs for sizes not recorded."""
    if lr.wiring is None or entry.sizes is None or lr.derived:
        return
    abstract, dims = entry.sizes
    fams = region.size_families.setdefault(abstract, {})
    fam = _family(lr.key)
    got = fams.get(fam)
    if got is None:
        got = fams[fam] = [SizeFamily(split_numbers(lr.text)[0]), lr]
    sf, member = got
    # Arguments in the same places, the same Parameters, held tensors of the same values (the key's
    # `consts`; a derived plan reads the latest member's held tensors).
    same = len(member.roles) == len(lr.roles) and member.key[5] == lr.key[5] and all(
        a[0] == b[0] and (a[1] == b[1] if a[0] == "arg" else a[0] == "held" or a[1] is b[1])
        for a, b in zip(member.roles, lr.roles))
    if not same or not sf.add(dims, lr.text):
        sf.broken = True  # (held tensors or parameters that differ by size: each size is recorded)
        return
    got[1] = lr  # (the latest member: its cells' recorded state is the current one)


def _compare_outputs(want: list, out, out_spec) -> str | None:
    """None where a call's result `out` has the structure `out_spec` and the values `want` (a plan's
    outputs) within the re-verification tolerance, else why not."""
    got: list = []
    try:
        spec = _out_spec(out, got)
    except _Unsupported:
        return "outputs differ"
    if spec != out_spec or len(got) != len(want):
        return "outputs differ"
    for w, g in zip(want, got):
        if tuple(g.shape) != w.shape:
            return "outputs differ"
        g = _array_of(g)
        if g.dtype != w.dtype:
            return "outputs differ"
        if not np.allclose(w, g, rtol=1e-4, atol=1e-5 * (1.0 + float(np.max(np.abs(g), initial=0.0))),
                           equal_nan=True):
            return "values differ"
    return None


def _dispatch_state():
    from ms_dynvm.frontend import dispatch

    return dispatch._S


def _grad_enabled() -> bool:
    return bool(_pynative_executor.requires_grad())


def _make_learned(rec, out, flat: list, cells: list, seconds: float, cache: dict | None = None,
                  opt_steps: list = ()) -> _Learned:
    prog = rec.program
    for b in prog.blocks:
        if b.end == "sync":
            raise NotReplayable("sync point inside")
        if b.end == "error":
            raise NotReplayable("recording error")
    if rec.errors:
        raise NotReplayable("recording error")
    for ins in prog.instrs():  # (before explaining unknown tensors: a random op's backward is one)
        if ins.op == "call" and (rec.call_handler is None or _RANDOM_NAME.search(ins.attrs.get("target") or "")):
            raise NotReplayable(f"opaque op {ins.attrs.get('target')}")
        if opcodes.opdef(ins.op).group == opcodes.Group.RANDOM:
            raise NotReplayable(f"random op {ins.op}")
    if any("written in place" in w or "graph-mode" in w for w in rec.warnings):
        raise NotReplayable("writes an input in place" if any("written" in w for w in rec.warnings)
                            else "graph-mode call inside")
    for cell, state in cells:
        if _plain_state(cell) != state:
            raise NotReplayable("python state changed")
    types = prog.types
    if any(ty.dtype == "bf16" for ty in types.values()):
        raise NotReplayable("bfloat16")
    for ins in prog.instrs():  # (the interpreter's float16 GEMM rounds as MindSpore's does only for some shapes)
        if ins.op in ("matmul", "bmm", "conv2d") and any(
                isinstance(a, Reg) and types[int(a)].dtype == "f16" for a in ins.args):
            raise NotReplayable("float16 matmul")
    # Where each register was defined or first read: its phase.
    phase_def: dict = {}
    first_use: dict = {}
    first_idx: dict = {}  # register -> index (in prog.instrs() order) of its first reader
    n = 0
    for b in prog.blocks:
        for ins in b.instrs:
            for a in ins.args:
                if isinstance(a, Reg):
                    first_use.setdefault(int(a), b.phase)
                    first_idx.setdefault(int(a), n)
            n += 1
            for r in ins.outs:
                phase_def[r] = b.phase
    values = {int(r): t for r, t in zip(prog.outputs, rec.outputs)}
    base = prog.next_reg()  # (registers from here on are the backward rules' temporaries)
    explainer = _Explainer(prog, values, phase_def)
    if cache is not None:
        explainer.cache = cache
    for k, inp in enumerate(prog.inputs):  # (the inputs' values as the program read them)
        explainer._arrays[inp.reg] = rec._snaps[k]
    explainer.inputs = [inp.reg for inp in prog.inputs if first_use.get(inp.reg) == "fwd"]
    # Inputs: arguments, parameters, held tensors; backward-phase unknowns explained.
    arg_of = {}
    for i, t in enumerate(flat):
        key = _storage_key(t)
        if key is not None:
            arg_of.setdefault(key, i)
    params = {}  # storage -> the live Parameter (names may change when a Cell is wrapped)
    for cell, _ in cells:
        for p in cell.get_parameters() if hasattr(cell, "get_parameters") else ():
            key = _storage_key(p)
            if key is not None:
                params.setdefault(key, p)
    in_regs, roles, extra, consts = [], [], [], []
    for inp, t in zip(prog.inputs, rec.inputs):
        r = inp.reg
        if r not in first_use:
            continue
        i = arg_of.get(_storage_key(t))
        if i is not None:
            in_regs.append(r)
            roles.append(("arg", i))
        elif inp.kind == "param":
            p = params.get(_storage_key(t))
            if p is None:
                raise NotReplayable("parameter not found")
            in_regs.append(r)
            roles.append(("param", p))
        else:
            value = _array_of(t)
            if first_use[r] == "bwd":
                # Made by an undispatched backward kernel: a rule of ours computes it (a constant
                # included, `fill`: its value is in the program text, so recordings with other data
                # must agree on it), or the region is not replayable. Never held: the recorded
                # tensor holds that recording's gradient.
                group = explainer.explain(value, r, first_idx[r], ("in", r))
                extra.append(group)
                # Explained, it is a backward register like any other for the explanations after
                # it (a Dense layer's bias gradient summed from a softmax gradient that MindSpore
                # also computed without dispatch), defined where the plan places its group: after
                # the last instruction it reads (`RegionPlan.build`).
                phase_def[r] = "bwd"
                own = {o for e in group for o in e.outs}
                explainer.def_idx[r] = max((explainer.def_idx.get(int(a), -1) for e in group for a in e.args
                                            if isinstance(a, Reg) and int(a) not in own), default=-1)
                continue
            # A tensor of no recorded origin: read live at each replay.
            in_regs.append(r)
            roles.append(("held", t))
            # Its value is part of the key: a tensor the function makes anew with other values at
            # every call (random noise from NumPy) makes two recordings disagree, where reading the
            # recorded tensor again would replay stale values.
            consts.append((r, value.tobytes() if value.size <= _CONST_MAX
                           else hashlib.sha1(value.tobytes()).hexdigest()))
    outs: list = []
    out_spec = _out_spec(out, outs)
    out_regs = []
    for k, t in enumerate(outs):
        r = rec.reg_of(t)
        if r is None:
            instrs = explainer.explain(_array_of(t), None, None, ("out", k))
            extra.append(instrs)
            r = instrs[-1].outs[0]
        out_regs.append(int(r))
    # Optimizer steps run by their rules inside the call: their gradients are extra outputs of the
    # program, and the steps run after it (`_Entry.opt_steps`). Nothing recorded after a step may
    # read a parameter it updated (the program would read the value from before the step).
    n_out = len(out_regs)
    steps = []
    for st, grads, at in opt_steps:
        regs = []
        for k, g in enumerate(grads):
            r = rec.reg_of(g)
            if r is None:
                instrs = explainer.explain(_array_of(g), None, None, ("opt", id(st), k))
                extra.append(instrs)
                r = instrs[-1].outs[0]
            regs.append(int(r))
        updated = {_storage_key(p) for p in st.opt._parameters}
        pregs = {inp.reg for inp, t in zip(prog.inputs, rec.inputs) if _storage_key(t) in updated}
        for ins in list(prog.instrs())[at:]:
            if any(isinstance(a, Reg) and int(a) in pregs for a in ins.args):
                raise NotReplayable("a parameter is read after the optimizer step")
        steps.append((st, len(out_regs), len(regs)))
        out_regs.extend(regs)
    extra, out_regs = _renumber(prog, extra, out_regs, base)
    # Opaque ops (BatchNorm, LSTM, TopK, ...) stay in the plan as calls into MindSpore with the
    # recorded op and attributes (`Recording.call_handler`), one dispatch each; the handler keeps
    # only the recording's call templates, not its tensors.
    handler = None
    if rec._calls:
        from ms_dynvm.frontend.recorder import Recording

        keep = Recording()
        keep._calls = rec._calls
        handler = keep.call_handler
    in_dts = [str(_np_dtype(types[r])) for r in in_regs]
    in_shapes = [tuple(types[r].shape) for r in in_regs]
    if any(not all(type(d) is int for d in s) for s in in_shapes):
        raise NotReplayable("symbolic input shape")
    ptext = prog.as_text()
    key = (ptext, tuple(repr(e) for g in extra for e in g), tuple(
        (role, obj if role == "arg" else id(obj) if role == "param" else None) for role, obj in roles),
        tuple(out_regs), repr(out_spec), tuple(consts), tuple((id(st), k, n) for st, k, n in steps))

    def build():
        plan = RegionPlan.build(prog, in_regs, out_regs, extra, call_handler=handler)
        plan.n_out = n_out
        plan.opt_steps = steps
        plan.in_dts = in_dts
        plan.in_shapes = in_shapes
        return plan

    # The plan is built only where the recording is installed (`_Learned.make_plan`): a recording
    # that only has to agree with another one (a first size's first recording, a re-verification)
    # needs its key alone. (The key is made before any plan: building one adds the pipeline's
    # registers to `prog.types`.)
    wiring = None if steps or handler is not None else (in_regs, out_regs, n_out, in_dts)
    lr = _Learned(key, build, roles, out_spec, cells, seconds, _family_text(ptext, prog, extra), wiring)
    # Constants a recording cannot tell from data: the backward rules' `fill`s (a gradient that
    # happened to be constant in this recording, or a constant MindSpore's backward made). Two
    # recordings with the same argument values agree on them whatever they are (see
    # `Regions._learn`). (Forward tensors of no recorded origin cannot depend on the data: a value
    # read from a tensor is a sync point.)
    lr.suspect = any(e.op == "fill" for g in extra for e in g)
    lr.data = hashlib.sha1(b"".join(_view(t, _np_dtype(types[r]), tuple(types[r].shape)).tobytes()
                                    for (role, i), r in zip(roles, in_regs) if role == "arg"
                                    for t in (flat[i],))).hexdigest()
    return lr


def _renumber(prog, extra: list, out_regs: list, base: int):
    """The backward rules' temporaries renumbered from `base` in order of definition: how many
    candidates each rule tried (and so which register numbers they took) must not make two
    recordings differ."""
    ren, types = {}, {}
    for group in extra:
        for ins in group:
            for r in ins.outs:
                if r >= base and r not in ren:
                    ren[r] = base + len(ren)
                    types[ren[r]] = prog.types[r]
    for r in list(prog.types):
        if r >= base:
            del prog.types[r]
    prog.types.update(types)

    def m(a):
        return Reg(ren.get(int(a), int(a))) if isinstance(a, Reg) else a

    extra = [[Instr(i.op, tuple(m(a) for a in i.args), i.attrs, tuple(ren.get(r, r) for r in i.outs))
              for i in group] for group in extra]
    return extra, [ren.get(r, r) for r in out_regs]


class _Explainer:
    """Finds the backward rule that gives a tensor of unknown origin (see the module doc).

    Rules, tried in order; each is accepted only where its value on the recorded registers equals
    the tensor's recorded value (rtol 1e-4; exactly for integers and bools):
    - a constant (every element equal: zeros or ones MindSpore makes): `fill`;
    - sum over leading axes of a backward register (BiasAdd's and LayerNorm's beta gradient);
    - softmax_grad(y, dy) of a forward softmax;
    - LayerNorm's gamma gradient sum(dy * xhat) and input gradient
      rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, of a forward layer_norm;
    - take of a backward register's rows by an integer register (UnsortedSegmentSum's backward);
    - an integer register >= 0 (the same backward's mask).
    The instructions of an accepted rule get new registers (the explained tensor keeps its own
    where it is a program input)."""

    def __init__(self, prog, values: dict, phase_def: dict) -> None:
        self.prog = prog
        self.values = values  # register -> tensor holding its recorded value
        self.phase_def = phase_def
        self._arrays: dict = {}
        self.limit = None
        self.only = None  # a hint's registers (see `explain`)
        self.cache: dict = {}
        self.def_idx = {r: i for i, ins in enumerate(prog.instrs()) for r in ins.outs}
        self.inputs: list = []  # the program's inputs first read in the forward phase (`_ge0`)
        self.filled: dict = {}  # register -> the constant an accepted `fill` rule gives it
        self._defs = None

    def _value(self, r: int):
        a = self._arrays.get(r)
        if a is None:
            t = self.values.get(r)
            if t is None:
                return None
            a = self._arrays[r] = _array_of(t)
        return a

    def _defined(self) -> dict:
        """register -> phase, of the registers an explanation may read (see `explain`)."""
        d = self.phase_def
        if self.limit is not None:
            d = {r: ph for r, ph in d.items() if self.def_idx.get(r, -1) < self.limit}
        if self.only is not None:
            d = {r: ph for r, ph in d.items() if r in self.only}
        return d

    def _regs(self, shape, dtype, phase="bwd"):
        types = self.prog.types
        return [r for r, ph in self._defined().items()
                if (phase is None or ph == phase) and tuple(types[r].shape) == tuple(shape)
                and types[r].dtype == dtype]

    def explain(self, value: np.ndarray, reg, limit: int | None = None, key=None) -> list:
        """Instructions computing `value` (into `reg`, or a new register), or NotReplayable. Only
        registers defined before instruction `limit` (the first reader of `reg`) are used. `key`
        names the tensor's place in the recording; the rule and registers that explained it in an
        earlier recording of the region (`cache`: recordings of one family number their registers
        alike) are tried first, alone."""
        self.limit = limit
        hint = self.cache.get(key) if key is not None else None
        if hint is not None:
            self.only = hint[1]
            try:
                found = getattr(self, hint[0])(value)
            finally:
                self.only = None
            if found is not None:
                return self._note(self._finish(found, reg))
        for rule in (self._leading_sum, self._softmax, self._layer_norm, self._getitem, self._scatter_rows,
                     self._rows, self._ge0, self._constant):
            found = rule(value)
            if found is not None:
                if key is not None:
                    self.cache[key] = (rule.__name__, self._reads(found))
                return self._note(self._finish(found, reg))
        raise NotReplayable(f"unexplained backward tensor {list(value.shape)}")

    def _const(self, r: int):
        """The value of register `r` where it is a constant: a `fill` of the program or an input a
        `fill` rule explained; else None."""
        c = self.filled.get(r)
        if c is None:
            d = self._def_ins().get(r)
            c = d.attrs.get("value") if d is not None and d.op == "fill" else None
        return c if type(c) in (int, float, bool) else None

    def _nonneg(self, r: int) -> bool:
        """Register `r` is >= 0 whatever the data: a constant >= 0, or `maximum(x, c)` of a constant
        c >= 0 (an immediate or a constant register)."""
        c = self._const(r)
        if c is not None:
            return c >= 0
        ins = self._def_ins().get(r)
        if ins is None or ins.op != "maximum":
            return False
        for a in ins.args:
            c = self._const(int(a)) if isinstance(a, Reg) else a if type(a) in (int, float) else None
            if c is not None and c >= 0:
                return True
        return False

    def _def_ins(self) -> dict:
        if self._defs is None:
            self._defs = {r: ins for ins in self.prog.instrs() for r in ins.outs}
        return self._defs

    @staticmethod
    def _finish(instrs: list, reg) -> list:
        if reg is not None:  # the last instruction writes the input's own register
            last = instrs[-1]
            instrs[-1] = Instr(last.op, last.args, last.attrs, (reg,))
        return instrs

    def _note(self, instrs: list) -> list:
        """Remember the registers an explanation fills with a constant (`_nonneg` reads them)."""
        if len(instrs) == 1 and instrs[0].op == "fill":
            self.filled[instrs[0].outs[0]] = instrs[0].attrs.get("value")
        return instrs

    def _reads(self, instrs: list) -> frozenset:
        """The recorded registers `instrs` read, with every result of the instructions defining
        them (a rule asks for a forward op's first result: softmax's y, layer_norm's y)."""
        made = {r for ins in instrs for r in ins.outs}
        regs = {int(a) for ins in instrs for a in ins.args if isinstance(a, Reg) and int(a) not in made}
        for ins in self.prog.instrs():
            if regs.intersection(ins.outs):
                regs.update(ins.outs)
        return frozenset(regs)

    # --- helpers -----------------------------------------------------------------------------------
    def _new(self, dtype: str, shape) -> int:
        from ms_dynvm.bytecode.types import TensorType

        r = self.prog.next_reg()
        self.prog.types[r] = TensorType(dtype, tuple(shape))
        return r

    def _close(self, got, value) -> bool:
        return self._err(got, value) <= 1.0

    @staticmethod
    def _err(got, value) -> float:
        """0 for equal, <= 1 within tolerance (rtol 1e-4, atol 1e-6 of the largest magnitude; exact
        for integers and bools), inf for another shape."""
        if got is None or got.shape != value.shape:
            return float("inf")
        if value.dtype.kind in "biu":
            return 0.0 if np.array_equal(got, value) else float("inf")
        if got.dtype == value.dtype and np.array_equal(got, value):  # (one pass; NaNs take the full path)
            return 0.0
        with np.errstate(all="ignore"):
            g, v = got.astype(np.float64), value.astype(np.float64)
            same = (g == v) | (np.isnan(g) & np.isnan(v))
            tol = 1e-6 * (1.0 + float(np.max(np.abs(v), initial=0.0))) + 1e-4 * np.abs(v)
            r = np.where(same, 0.0, np.abs(g - v) / tol)
        return float(np.max(r, initial=0.0)) if not np.isnan(r).any() else float("inf")

    def _dtype(self, value) -> str:
        return dtypes.from_numpy(value.dtype)

    def _run(self, instrs: list, value) -> float:
        """How far the value `instrs` compute (over recorded registers) is from `value` (`_err`)."""
        from ms_dynvm.runtime.interpreter import run_instr

        vals = {}
        made = {r for ins in instrs for r in ins.outs}
        for ins in instrs:
            for a in ins.args:
                if isinstance(a, Reg) and int(a) not in vals and int(a) not in made:
                    v = self._value(int(a))
                    if v is None:
                        return float("inf")
                    vals[int(a)] = v
        try:
            for ins in instrs:
                run_instr(ins, vals, self.prog.types)
        except Exception:  # noqa: BLE001 - the rule does not apply
            return float("inf")
        return self._err(vals[instrs[-1].outs[0]], value)

    def _better(self, best, cand: list, value):
        """The closer of `best` ((error, instrs) or None) and candidate `cand`."""
        e = self._run(cand, value)
        if e <= 1.0 and (best is None or e < best[0]):
            return (e, cand)
        return best

    @staticmethod
    def _accept(best):
        return None if best is None else best[1]

    # --- rules ---------------------------------------------------------------------------------------
    def _constant(self, value):
        flat = value.reshape(-1)
        if flat.size == 0 or not (flat == flat[0]).all() or (value.dtype.kind == "f" and np.isnan(flat[0])):
            return None
        dt = self._dtype(value)
        v = flat[0].item()
        out = self._new(dt, value.shape)
        return [Instr("fill", (), {"shape": tuple(value.shape), "dtype": dt, "value": v}, (out,))]

    def _leading_sum(self, value):
        if value.dtype.kind != "f" or value.ndim == 0:
            return None
        types, k = self.prog.types, value.ndim
        dt = self._dtype(value)
        defined = self._defined()
        best = None
        for r in sorted(defined, reverse=True):
            ty = types[r]
            if defined[r] != "bwd" or ty.dtype != dt or len(ty.shape) <= k or \
                    tuple(ty.shape[len(ty.shape) - k:]) != tuple(value.shape):
                continue
            v = self._value(r)
            axes = tuple(range(len(ty.shape) - k))
            if v is None:
                continue
            e = self._err(v.sum(axis=axes, dtype=np.float64).astype(value.dtype), value)
            if e <= 1.0 and (best is None or e < best[0]):
                best = (e, r, axes)
        if best is None:  # (the summed gradient itself undispatched: a softmax's, see _softmax_dys)
            cands = []
            for ins in self.prog.instrs():
                if ins.op == "layer_norm" and defined.get(ins.outs[0]) == "fwd":
                    yty = types[ins.outs[0]]
                    if len(yty.shape) > k and tuple(yty.shape[len(yty.shape) - k:]) == tuple(value.shape):
                        cands += [(pre, r, tuple(range(len(yty.shape) - k))) for pre, r in self._softmax_dys(ins.outs[0])]
            found = None
            for pre, r, axes in cands:
                o = self._new(dt, value.shape)
                seq = pre + [Instr("sum", (Reg(r),), {"axis": axes, "keepdims": False, "dtype": None}, (o,))]
                found = self._better(found, seq, value)
            return self._accept(found)
        out = self._new(dt, value.shape)
        return [Instr("sum", (Reg(best[1]),), {"axis": best[2], "keepdims": False, "dtype": None}, (out,))]

    def _softmax(self, value):
        types = self.prog.types
        best = None
        for ins in self.prog.instrs():
            if ins.op != "softmax" or self._defined().get(ins.outs[0]) != "fwd":
                continue
            yty = types[ins.outs[0]]
            if tuple(yty.shape) != value.shape:
                continue
            axis = ins.attrs.get("axis", -1)
            axis = axis[0] if isinstance(axis, (tuple, list)) else axis
            for r in reversed(self._regs(value.shape, yty.dtype)):
                out = self._new(yty.dtype, value.shape)
                cand = [Instr("softmax_grad", (Reg(ins.outs[0]), Reg(r)), {"axis": axis}, (out,))]
                best = self._better(best, cand, value)
        return self._accept(best)

    def _layer_norm(self, value):
        types = self.prog.types
        best = None
        for ins in self.prog.instrs():
            if ins.op != "layer_norm" or self._defined().get(ins.outs[0]) != "fwd":
                continue
            x, gamma = int(ins.args[0]), ins.args[1]
            y, mean, var = ins.outs
            xty = types[x]
            rank = len(xty.shape)
            bna = ins.attrs.get("begin_norm_axis", -1) % rank
            bpa = ins.attrs.get("begin_params_axis", -1) % rank
            eps = float(ins.attrs.get("eps", 1e-5))
            if xty.dtype != "f32" or bna != bpa or not isinstance(gamma, Reg):
                continue
            norm_axes = tuple(range(bna, rank))
            lead = tuple(range(bna))
            for dy in reversed(self._regs(xty.shape, "f32")):
                seq = self._ln_rule(x, int(gamma), mean, var, dy, eps, norm_axes, lead, xty, value)
                if seq is not None:
                    best = self._better(best, seq, value)
            if best is None:  # (dy itself undispatched: the gradient of a softmax of y)
                for pre, dy in self._softmax_dys(y):
                    seq = self._ln_rule(x, int(gamma), mean, var, dy, eps, norm_axes, lead, xty, value)
                    if seq is not None:
                        best = self._better(best, pre + seq, value)
        return self._accept(best)

    def _softmax_dys(self, y: int) -> list:
        """[(instructions, register)]: `softmax_grad(s, d)` for each forward softmax s of register
        `y` and each backward register d of its shape: a gradient MindSpore computed without
        dispatch and handed only to another undispatched kernel (LayerNorm's), so that it is in no
        recording and is explained inside the rule that reads it."""
        out = []
        defined = self._defined()
        for ins in self.prog.instrs():
            if ins.op != "softmax" or not isinstance(ins.args[0], Reg) or int(ins.args[0]) != y or \
                    defined.get(ins.outs[0]) != "fwd":
                continue
            sty = self.prog.types[ins.outs[0]]
            axis = ins.attrs.get("axis", -1)
            axis = axis[0] if isinstance(axis, (tuple, list)) else axis
            for d in reversed(self._regs(tuple(sty.shape), sty.dtype)):
                r = self._new(sty.dtype, tuple(sty.shape))
                out.append(([Instr("softmax_grad", (Reg(ins.outs[0]), Reg(d)), {"axis": axis}, (r,))], r))
        return out

    def _ln_rule(self, x, gamma, mean, var, dy, eps, norm_axes, lead, xty, value):
        types = self.prog.types
        shape, pshape = tuple(xty.shape), tuple(types[gamma].shape)
        stat = tuple(types[mean].shape)
        instrs = []

        def emit(op, args, attrs, sh, dt="f32"):
            out = self._new(dt, sh)
            instrs.append(Instr(op, tuple(args), attrs, (out,)))
            return Reg(out)

        xc = emit("sub", (Reg(x), Reg(mean)), {}, shape)
        ve = emit("add", (Reg(var), eps), {}, stat)
        rstd = emit("rsqrt", (ve,), {}, stat)
        xhat = emit("mul", (xc, rstd), {}, shape)
        if value.shape == pshape:  # gamma's gradient
            prod = emit("mul", (Reg(dy), xhat), {}, shape)
            emit("sum", (prod,), {"axis": lead, "keepdims": False, "dtype": None}, pshape)
            return instrs
        if value.shape != shape:
            return None
        g = emit("mul", (Reg(dy), Reg(gamma)), {}, shape)
        mg = emit("mean", (g,), {"axis": norm_axes, "keepdims": True, "dtype": None}, stat)
        gx = emit("mul", (g, xhat), {}, shape)
        mgx = emit("mean", (gx,), {"axis": norm_axes, "keepdims": True, "dtype": None}, stat)
        t1 = emit("sub", (g, mg), {}, shape)
        t2 = emit("mul", (xhat, mgx), {}, shape)
        t3 = emit("sub", (t1, t2), {}, shape)
        emit("mul", (t3, rstd), {}, shape)
        return instrs

    def _getitem(self, value):
        """The backward of basic indexing (recorded as slice / squeeze / expand_dims by
        `Recorder.record_getitem`): the incoming gradient with the chain undone, zero-padded back to
        the indexed tensor's shape (slices with step 1)."""
        if value.dtype.kind != "f":
            return None
        types = self.prog.types
        instrs = list(self.prog.instrs())
        users: dict = {}
        for ins in instrs:
            for a in ins.args:
                if isinstance(a, Reg):
                    users.setdefault(int(a), []).append(ins)
        best = None
        chain_ops = ("slice", "squeeze", "expand_dims")
        for ins in instrs:
            if ins.op not in chain_ops or self.phase_def.get(ins.outs[0]) != "fwd":
                continue
            x = int(ins.args[0])
            if tuple(types[x].shape) != value.shape or types[x].dtype != self._dtype(value):
                continue
            chain = [ins]
            while True:
                nxt = users.get(chain[-1].outs[0], [])
                if len(nxt) != 1 or nxt[0].op not in ("squeeze", "expand_dims") or \
                        self.phase_def.get(nxt[0].outs[0]) != "fwd":
                    break
                chain.append(nxt[0])
            for end in range(len(chain), 0, -1):  # (the chain's last op may be an op of its own)
                out_ty = types[chain[end - 1].outs[0]]
                for dy in reversed(self._regs(tuple(out_ty.shape), out_ty.dtype)):
                    cand = self._undo(chain[:end], dy, x, out_ty.dtype)
                    if cand is not None:
                        best = self._better(best, cand, value)
        return self._accept(best)

    def _undo(self, chain: list, dy: int, x: int, dt: str):
        types = self.prog.types
        instrs, cur = [], Reg(dy)
        shape = tuple(types[dy].shape)
        for ins in reversed(chain):
            src = tuple(types[int(ins.args[0])].shape)
            if ins.op == "expand_dims":
                shape = src
                op, attrs = "squeeze", {"axis": (ins.attrs["axis"] % (len(src) + 1),)}
            elif ins.op == "squeeze":
                shape = src
                op, attrs = "reshape", {"shape": src}
            else:
                if any(st != 1 for st in ins.attrs["step"]):
                    return None
                pads = tuple((b, n - e) for b, e, n in zip(ins.attrs["begin"], ins.attrs["end"], src))
                shape = src
                out = self._new(dt, shape)
                instrs.append(Instr("pad", (cur, 0.0), {"pads": pads}, (out,)))
                cur = Reg(out)
                continue
            out = self._new(dt, shape)
            instrs.append(Instr(op, (cur,), attrs, (out,)))
            cur = Reg(out)
        return instrs if shape == tuple(types[x].shape) else None

    def _scatter_rows(self, value):
        """The backward of a gather of rows (nn.Embedding, ops.gather on axis 0): the incoming
        gradient's rows summed into the rows they were taken from, `unsorted_segment_sum` by the
        (flattened) indices."""
        if value.dtype.kind != "f" or value.ndim < 1:
            return None
        types = self.prog.types
        dt = self._dtype(value)
        rest = tuple(value.shape[1:])
        defined = self._defined()
        best = None
        for ins in self.prog.instrs():
            if ins.op != "gather" or self.phase_def.get(ins.outs[0]) != "fwd" or ins.attrs.get("axis", 0) != 0:
                continue
            src, idx = (int(a) for a in ins.args[:2])
            if tuple(types[src].shape) != value.shape or types[idx].dtype not in ("i32", "i64"):
                continue
            ishape = tuple(types[idx].shape)
            want = ishape + rest
            for r in reversed([q for q, ph in defined.items() if ph == "bwd" and types[q].dtype == dt
                               and tuple(types[q].shape) == want]):
                n = 1
                for d in ishape:
                    n *= d
                instrs, cur, ids = [], Reg(r), Reg(idx)
                if len(ishape) != 1:
                    out = self._new(dt, (n,) + rest)
                    instrs.append(Instr("reshape", (cur,), {"shape": (n,) + rest}, (out,)))
                    cur = Reg(out)
                    out = self._new(types[idx].dtype, (n,))
                    instrs.append(Instr("reshape", (ids,), {"shape": (n,)}, (out,)))
                    ids = Reg(out)
                out = self._new(dt, value.shape)
                instrs.append(Instr("unsorted_segment_sum", (cur, ids), {"num_segments": value.shape[0]}, (out,)))
                best = self._better(best, instrs, value)
        return self._accept(best)

    def _rows(self, value):
        if value.ndim < 1 or value.dtype.kind != "f":
            return None
        types = self.prog.types
        dt = self._dtype(value)
        defined = self._defined()
        idx_regs = [r for r in defined if tuple(types[r].shape) == (value.shape[0],)
                    and types[r].dtype in ("i32", "i64")]
        rows = [q for q, ph in defined.items() if ph == "bwd" and types[q].dtype == dt
                and len(types[q].shape) == value.ndim and tuple(types[q].shape[1:]) == tuple(value.shape[1:])]
        scale = None
        for r in reversed(rows):
            for i in reversed(idx_regs):
                # (a candidate whose first row already differs is dropped before it is run: the same
                # criterion as `_err`, on one row, so only candidates `_run` would reject are)
                rv, iv = self._value(r), self._value(i)
                if rv is not None and iv is not None and iv.size and rv.ndim == value.ndim:
                    j = int(iv.reshape(-1)[0])
                    if 0 <= j < rv.shape[0]:
                        if scale is None:
                            with np.errstate(all="ignore"):
                                scale = 1e-6 * (1.0 + float(np.max(np.abs(value.astype(np.float64)), initial=0.0)))
                        if not self._row_close(rv[j], value[0], scale):
                            continue
                out = self._new(dt, value.shape)
                cand = [Instr("gather", (Reg(r), Reg(i)), {"axis": 0, "batch_dims": 0}, (out,))]
                if self._run(cand, value) <= 1.0:
                    return cand
        return None

    @staticmethod
    def _row_close(got, want, scale: float) -> bool:
        """`_err(got, want) <= 1` for one row of a tensor whose largest magnitude gave `scale`."""
        with np.errstate(all="ignore"):
            g, v = np.asarray(got, np.float64), np.asarray(want, np.float64)
            same = (g == v) | (np.isnan(g) & np.isnan(v))
            return bool((same | (np.abs(g - v) <= scale + 1e-4 * np.abs(v))).all())

    def _ge0(self, value):
        """`ids >= 0` (UnsortedSegmentSum's backward masks the rows of negative ids) over an integer
        register or a forward input of the program. Recorded masks are mostly all True (no negative
        id), which any non-negative register of the shape reproduces, so the ids themselves are tried
        first: the segment ids of a forward `unsorted_segment_sum`, and what the backward clamps with
        `maximum(ids, 0)`. A register that is >= 0 whatever the data (`_nonneg`: that clamp) is passed
        over: its mask is constant, equal to the recorded one only while no id was negative."""
        if value.dtype != np.bool_:
            return None
        types = self.prog.types
        fwd_in = [r for r in self.inputs if self.only is None or r in self.only]
        rest = sorted(self._defined(), reverse=True) + sorted(fwd_in, reverse=True)
        allowed = set(rest)
        ids = []
        for ins in self.prog.instrs():
            srcs = ()
            if ins.op == "unsorted_segment_sum" and len(ins.args) > 1:
                srcs = ins.args[1:2]
            elif ins.op == "maximum" and self._nonneg(ins.outs[0]):
                srcs = ins.args  # (the clamp's constant is no candidate: not an allowed register)
            for a in srcs:
                if isinstance(a, Reg) and int(a) in allowed and int(a) not in ids:
                    ids.append(int(a))
        for r in ids + [r for r in rest if r not in ids]:
            if tuple(types[r].shape) == value.shape and types[r].dtype in ("i32", "i64"):
                if self._nonneg(r):
                    continue
                out = self._new("bool", value.shape)
                cand = [Instr("ge", (Reg(r), 0), {}, (out,))]
                if self._run(cand, value) <= 1.0:
                    return cand
        return None


# --- what tier 2 did (the report's "Tier 2" section) ------------------------------------------------
_SEEN: list = []  # weak references to the Regions and optimizer states met since import, in order


def _seen(obj) -> None:
    """Remember `obj` for `summary` without keeping it (and its plans and recordings) alive: a
    script that builds model after model would otherwise keep every old model's plans."""
    import weakref

    if len(_SEEN) >= 64:
        _SEEN[:] = [r for r in _SEEN if r() is not None]
    _SEEN.append(weakref.ref(obj))


def summary(limit: int = 200) -> list:
    """Per region and signature (optimizer steps: per optimizer): what tier 2 did, as plain data."""
    rows = []
    for reg in [r for r in map(lambda w: w(), _SEEN) if r is not None][:limit]:
        if isinstance(reg, _OptState):
            rows.append({"region": reg.kind, "kind": "optimizer", "signature": "", "state": reg.state,
                         "reason": reg.reason, "replays": reg.replays,
                         "eager_ms": None if reg.eager_s == float("inf") else 1e3 * reg.eager_s,
                         "replay_ms": 1e3 * reg.replay_total / reg.replays if reg.replays else None})
            continue
        for key, e in reg.entries.items():
            shapes = [s for s in _tensor_shapes(key)]
            rows.append({"region": reg.name, "kind": reg.kind, "signature": " ".join(shapes)[:80],
                         "state": e.state, "reason": e.reason, "replays": e.replays,
                         "eager_ms": None if e.eager_s == float("inf") else 1e3 * e.eager_s,
                         "replay_ms": 1e3 * e.replay_total / e.replays if e.replays else None})
    return rows


def _tensor_shapes(spec) -> list:
    if type(spec) is tuple and len(spec) == 3 and spec[0] == "T":
        return [f"{spec[1]}{list(spec[2])}"]
    if type(spec) is tuple and len(spec) == 2 and type(spec[1]) is tuple:
        return [s for x in spec[1] for s in _tensor_shapes(x)]
    return []


# --- installation -----------------------------------------------------------------------------------
_ACTIVE: list = [None]  # the Regions of the current enable(), or None


def _region_function(f, region: Region):
    """`f` wrapped so that its calls (positional arguments only) go through `region`."""

    @functools.wraps(f)
    def region_call(*args, **kwargs):
        mgr = _ACTIVE[0]
        if mgr is None or kwargs or not mgr._usable():
            return f(*args, **kwargs)
        return mgr.call(region, lambda: f(*args), args)

    region_call._ms_dynvm_region = region
    return region_call


def grad_region(f, fn, region=None):
    """Wrap `f`, a function `ms.value_and_grad`/`ms.grad` returned for `fn`, as a region."""
    if getattr(fn, "__dict__", {}).get(_EXCLUDE):
        return f
    return _region_function(f, region or Region("grad", getattr(fn, "__qualname__", type(fn).__name__)))


def jit(fn):
    """`ms_dynvm.jit(fn)`: calls of `fn` are a region (learned, then replayed as one program)."""
    return _region_function(fn, Region("fn", getattr(fn, "__qualname__", type(fn).__name__)))


def exclude(obj):
    """`ms_dynvm.exclude(obj)`: never a region: a Cell (its calls), a function (the gradient
    functions made of it later), or a region function itself (a grad function, a `jit` one)."""
    region = getattr(obj, "_ms_dynvm_region", None)
    if isinstance(region, Region):
        region.excluded = True
    else:
        obj.__dict__[_EXCLUDE] = True
    return obj


def install(hooks) -> None:
    """Called by `Hooks.install`: patch `_Grad.__call__` so the functions it returns are regions."""
    from mindspore.ops.composite import base as _cbase

    me = hooks.thread

    def make(orig):
        def grad_call(self, fn, weights=None, *rest):
            f = orig(self, fn, weights, *rest)
            if threading.get_ident() != me or _ACTIVE[0] is None:
                return f
            if getattr(self, "pynative_", False):
                # The inner _Grad call that every call of a grad function makes (the function
                # `value_and_grad` returned calls `grad_(fn, weights)(*args)`): a region too, one per
                # (inner _Grad, fn, weights), so grad functions made before enable() are regions.
                # Inside a wrapped outer call it runs plainly (nested).
                ent = self.__dict__.get(_INNER)
                if ent is None or ent[0] is not fn or ent[1] is not weights:
                    ent = self.__dict__[_INNER] = (fn, weights, Region(
                        "grad", getattr(fn, "__qualname__", type(fn).__name__)))
                return grad_region(f, fn, ent[2])
            # One region per (grad operation, fn, weights): a train-step Cell asks for its gradient
            # function anew at every step (`self.grad(self.network, self.weights)(...)`).
            ent = self.__dict__.get(_OUTER)
            if ent is None or ent[0] is not fn or ent[1] is not weights:
                ent = self.__dict__[_OUTER] = (fn, weights, Region(
                    "grad", getattr(fn, "__qualname__", type(fn).__name__)))
            return grad_region(f, fn, ent[2])
        return grad_call

    hooks._patch(_cbase._Grad, "__call__", make)  # ms.value_and_grad, ms.grad
    hooks._patch(_cbase.GradOperation, "__call__", make)  # ops.GradOperation (nn.TrainOneStepCell)
    hooks.regions = _ACTIVE[0] = Regions(me)


def uninstall() -> None:
    mgr = _ACTIVE[0]
    if mgr is not None:
        mgr.active = False
    _ACTIVE[0] = None
