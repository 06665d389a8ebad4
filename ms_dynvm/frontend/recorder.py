"""The recorder: turns the stream of dispatched ops into bytecode blocks.

It runs inside the dispatch handler for every op, right after MindSpore ran it, when MindSpore's worker
threads are still spinning on the machine's cores and its kernels have evicted the caches: every
Python operation and every call into MindSpore's C++ (`_get_user_data`, `_set_user_data`, `_dtype`,
`_shape` ...) costs several times what it costs in a tight loop (the first call of each kind after an
op 1-3 us; `isinstance(2.5, Tensor)` goes through Tensor's ABCMeta and costs as much, so non-tensors
are told apart by their type first). So `on_op` is inlined and does as little as it can:

- The plan cache (`_PLANS`): for a name in `normalize.PLANNABLE` (a handler that reads neither the
  legacy primitive nor anything of a tensor but its dtype and shape, not in-place) the lowering is a
  function of the key: per argument, the id of its register's type (a plan keeps the types of its key
  alive, so no other type takes their ids; types read off tensors are interned, `_TYPES`, so equal
  ones share an id) or its Python type and value (a float zero or NaN, a tensor subclass other than Parameter, a sequence
  of anything but ints: no key). And so is
  MindSpore's result type (shape functions of the same inputs), which the plan keeps: a repeated op
  costs one user-data read per tensor argument, one dict lookup and one user-data write, without the
  handler, `_dtype` or `_shape` (a view's layout is read: `is_contiguous`). The first op of a key
  takes the path below and makes the plan. A lowering of several instructions or results is cached
  the same way (`_run_multi`: its inputs are made, and its registers numbered, in the order of the
  full path), except where an argument could be linked to a view (below: the registry types the
  temporaries from the register's type, which is then the view's). The plans are bounded in number
  (`_MAX_PLANS`), and while shapes change from call to call (more than 3/4 of the ops making a plan)
  the recorder goes without them for a while (`_PLANS_OFF` ops): a first op costs more than one
  without a plan cache.
- Otherwise the common case (one instruction whose one result is the op's result) is still inlined:
  the handler called directly (`normalize.lower`'s bare `(op, operands, attrs)` triple), one
  user-data read per tensor operand, the result type read off the tensor MindSpore returned
  (authoritative, cached per (dtype, shape, layout)), one user-data write. Lowerings of several
  instructions type their temporaries with the registry's shape rules (`_infer`, cached per operand
  types, immediates and attributes).
- Op counts are batched (`Metrics.flush_ops`). In plain mode the programs' `Input` records are shared
  (`_TENSOR_INPUTS`, `_PARAM_INPUTS`): nothing mutates them, and making one costs more than looking
  it up.

Garbage: the instructions are stored as exact tuples of atomic values (`Block.append_raw`), which the
collector stops tracking at its first passes, and tags are `(epoch, int)` tuples: an `Instr` or a `Reg`
per instruction would stay tracked in the oldest generation and bring on full collections (tens of ms
each, a walk over every object of the process) every few thousand ops of a long block.

Tensor identity: MindSpore hands the handler a fresh Python wrapper for every tensor argument and
gives the user yet another wrapper for the result, so Python object identity (`is`, `id`, weakrefs)
says nothing. What survives is per-C++-tensor user data (`Tensor._set_user_data`): each result is
tagged `(epoch, register number)`, where the epoch names the Program being recorded. A tensor without
a tag of the current epoch (an argument, a Parameter, a tensor made by indexing or construction, which
MindSpore does not dispatch) becomes a program input. A tensor written through `__setitem__` or an in-place op gets a
new register, so later uses read the new value.

Views: MindSpore CPU hands a non-view op a fresh contiguous copy of a view argument (made before the
handler runs, with no tag). The recorder keeps the last few view results of the block and links such an
untagged argument (only an untagged one: a tensor with a tag of an earlier program is no such copy) to
a view result of the same dtype and shape whose elements are bit-identical (read in place through the
view's strides, spans of at most `_VIEW_LINK_MAX_BYTES`); equal bits mean the register holds exactly
the argument's value, so the link is exact, never a guess. An argument that matches none becomes an
input, which is always correct. (A dict of the candidates' (dtype, shape) turns most arguments away
without a look at them; compared with memcmp where both are row-major, else element 0 first, then the
view's elements gathered in order (`tobytes`) against the copy's bytes; a view's layout is computed
once.) In plain mode (below) only arguments of ops tier 1 may fuse are linked (`_link_for`): there
the Program is dropped at the block's end, and elsewhere a link would save one register for the
price of comparing the whole tensor.

Two modes:
- plain (`enable()`): basic blocks are recorded into small Programs, dropped when a block closes
  (only counters survive; at an nn.Cell boundary or a forward/backward phase change the Program is
  kept while it stays under `max_block_ops` registers), so memory stays bounded however long the script runs; values from
  the blocks of earlier Programs enter as inputs.
- recording (`with ms_dynvm.record() as rec:`): one Program for the whole scope, blocks kept, values
  flow between blocks; the input tensors are kept alive so `rec.inputs` can hand them back.
"""

from __future__ import annotations

import ctypes
import os
import sys
from weakref import ref as _weakref
from collections import deque

import numpy as np
from mindspore import Parameter, Tensor
from mindspore import dtype as _mstype
from mindspore._c_expression import TensorPy

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Input, Program
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.dtypes import is_float
from ms_dynvm.frontend import normalize as _norm
from ms_dynvm.metrics import METRICS

_META = _norm.META
_TMP = _norm.Tmp
_INPLACE = _norm.INPLACE
_IN_ORDER = _norm.TENSOR_ARGS_IN_ORDER
_mutated = _norm.mutated_tensor
_side_effect_inputs = _norm.side_effect_inputs
_TABLE = _norm._TABLE
_REJECT = _norm._REJECT
_Lowering = _norm.Lowering
_Tmp = _norm.Tmp
_OUT1 = (_norm.Tmp(0),)
_OPS = opcodes.OPS
_VIEW = opcodes.VIEW
_KEY = "ms_dynvm"  # user-data key on MindSpore tensors: (epoch, register number)
_PKEY = "ms_dynvm.param"  # user-data key: a Parameter's name
_T1KEY = "ms_dynvm.t1"  # user-data key of tier 1's tokens (frontend/tier1.py)
_is_contiguous = TensorPy.is_contiguous  # what Tensor.is_contiguous calls, without the wrapper
_data_ptr = TensorPy._data_ptr  # what Tensor._data_ptr calls, without the wrapper
_FLUSH_NAMES = 4096  # pending op counts folded into METRICS from this many (checked at block ends, meta ops)
_PLANNABLE = _norm.PLANNABLE
_IMMEDIATE = frozenset((bool, int, float, type(None)))  # the operands of a lowering that are not tensors


_hit = None  # `_crecord.hit` while the C hot path is on (set_c_hot_path), else None
# The classes of the Parameters seen (MindSpore makes a class per Parameter data type, named
# Parameter, in module abc): a legacy primitive gets Parameters as they are, and they key plans as
# tensors do. Filled as on_op meets them (`_param_type`); read by the C hot path too.
_PTYPES: set = set()


def _param_type(ta) -> None:
    """on_op met an argument of class `ta` that keys no plan: if it is a Parameter class, it will."""
    if isinstance(ta, type) and issubclass(ta, Parameter) and len(_PTYPES) < 64:
        _PTYPES.add(ta)


def set_c_hot_path(on: bool) -> bool:
    """Record plan-cache hits in C (frontend/fastpath.py) or not; whether it is on now."""
    global _hit
    _hit = None
    if on:
        from ms_dynvm.frontend import fastpath

        mod = fastpath.load()
        if mod is not None:
            mod.setup(Tensor, _KEY, _MULTI, _is_contiguous, _PTYPES, _TYPES, _PKEY, _TENSOR_INPUTS,
                      _PARAM_INPUTS, _tensor_input, _param_input, METRICS)
            _hit = mod.hit
    return _hit is not None


def _snapshot(t) -> np.ndarray:
    """A NumPy copy of tensor `t`'s value (without the sync-point hook on `Tensor.asnumpy`)."""
    if getattr(t, "has_init", False):
        t.init_data()
    return np.array(TensorPy.asnumpy(t), copy=True)


def tag_parameters(cell) -> None:
    """Tag the Parameters of `cell` (once per cell) so that recorded inputs can name them."""
    if cell.__dict__.get("_ms_dynvm_tagged"):
        return
    for name, p in cell.parameters_and_names():
        p._set_user_data(_PKEY, name)
    cell.__dict__["_ms_dynvm_tagged"] = True


_KEEP_PROGRAM = frozenset(("cell", "phase"))  # block ends that keep a plain-mode Program (close_block)
_VIEW_LINK_MAX_BYTES = 1 << 22
_VIEW_CANDIDATES = 8
# Results of these ops may be views of their input in MindSpore (split/unstack give views too).
_VIEW_LIKE = _VIEW | {"split", "unstack"}
_epochs = iter(range(1, 1 << 62))

_vm_dtype = _norm.vm_dtype

# MindSpore dtypes the VM holds but never computes on (dtypes.STORAGE_ONLY), by id (singletons).
_STORAGE_ONLY_IDS = frozenset(id(d) for d in (_mstype.uint16, _mstype.uint32, _mstype.uint64))


def _storage_only(args: tuple, out) -> bool:
    """The op has a tensor operand or result of a dtype in dtypes.STORAGE_ONLY: it is recorded as an
    opaque call (only ops with no plan come here; such an op never gets one)."""
    src = args[2] if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple else args
    for a in src:
        if isinstance(a, Tensor) and id(a._dtype) in _STORAGE_ONLY_IDS:
            return True
        if type(a) is tuple or type(a) is list:
            for e in a:
                if isinstance(e, Tensor) and id(e._dtype) in _STORAGE_ONLY_IDS:
                    return True
    for o in (out if type(out) is tuple or type(out) is list else (out,)):
        if isinstance(o, Tensor) and id(o._dtype) in _STORAGE_ONLY_IDS:
            return True
    return False

# (id(MindSpore dtype), shape, contiguous) -> TensorType: types repeat, and building a frozen,
# validated TensorType costs more than the lookup.
_TYPES: dict = {}


def _new_type(dt, shape, contiguous: bool) -> TensorType:
    ty = TensorType(_vm_dtype(dt), tuple(shape), "contiguous" if contiguous else "strided")
    if len(_TYPES) > 65536:
        _TYPES.clear()
    _TYPES[(id(dt), shape, contiguous)] = ty
    return ty


def tensor_type(t, contiguous: bool | None = None) -> TensorType:
    """TensorType of a MindSpore tensor (dtype, shape, layout class). Pass `contiguous=True` for the
    result of a non-view kernel (MindSpore kernels write contiguous results) to skip the query.
    (`_dtype`/`_shape` are what the `dtype`/`shape` properties return, without the wrapper.)"""
    dt = t._dtype
    shape = t._shape
    if contiguous is None:
        contiguous = _is_contiguous(t)
    ty = _TYPES.get((id(dt), shape, contiguous))
    if ty is None:
        ty = _new_type(dt, shape, contiguous)
    return ty


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _element_bytes(t, shape):
    """The elements of host tensor `t` (any strides) as unsigned integers of the same width, read in
    place through its data pointer, so that equal arrays mean bit-identical values (NaNs included).
    None when `t` is too large to compare cheaply or of an unusual element width."""
    itemsize = t._itemsize
    uint = _UINT.get(itemsize)
    if uint is None:
        return None
    if 0 in shape:
        return np.empty(shape, uint)
    strides = t.stride()
    span = sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    if span * itemsize > _VIEW_LINK_MAX_BYTES or min(strides, default=0) < 0:
        return None
    buf = (ctypes.c_char * (span * itemsize)).from_address(t._data_ptr())
    base = np.frombuffer(buf, dtype=uint)
    return np.lib.stride_tricks.as_strided(base, shape=shape,
                                           strides=[s * itemsize for s in strides])


try:
    _memcmp = ctypes.CDLL(None).memcmp
    _memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    _memcmp.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - no libc symbols in the process
    _memcmp = None

_EMPTY = object()  # `_layout` of a tensor with no elements


_C_STRIDES: dict = {}  # shape -> row-major strides (in elements), as Tensor.stride() gives them


def _c_strides(shape) -> list:
    out = _C_STRIDES.get(shape)
    if out is None:
        out, acc = [], 1
        for d in reversed(shape):
            out.append(acc)
            acc *= d
        out.reverse()
        if len(_C_STRIDES) > 4096:
            _C_STRIDES.clear()
        _C_STRIDES[shape] = out
    return out


_NOT_COMPARABLE = object()


# Bytes per element of the VM dtypes (what `Tensor._itemsize` says, without asking MindSpore).
_ITEMSIZE = {"bool": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "f16": 2, "bf16": 2, "i32": 4, "u32": 4,
             "f32": 4, "i64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def _layout(t, shape, c_strides, contiguous: bool = False, itemsize=None):
    """How `_element_bytes(t, shape)` would see `t`, without reading its data: `_NOT_COMPARABLE`
    (it would be None), `_EMPTY`, or `(span in bytes, itemsize, strides)`, strides None when they
    are exactly the row-major `c_strides` (the elements are then the span's bytes, in order). A
    tensor's itemsize and strides do not change, so a view's layout is computed once; its data
    pointer is read at each comparison. `contiguous`: `t` is known to be contiguous (its elements
    are the span's bytes, in order, whatever the strides of its dims of size 1). `itemsize`: its
    bytes per element, when known."""
    if itemsize is None:
        itemsize = t._itemsize
    if itemsize not in _UINT:
        return _NOT_COMPARABLE
    if 0 in shape:
        return _EMPTY
    strides = c_strides if contiguous else t.stride()
    if strides == c_strides:
        nbytes = (shape[0] * c_strides[0] if shape else 1) * itemsize
        if nbytes > _VIEW_LINK_MAX_BYTES:
            return _NOT_COMPARABLE
        return (nbytes, itemsize, None)
    span = sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    if span * itemsize > _VIEW_LINK_MAX_BYTES or min(strides, default=0) < 0:
        return _NOT_COMPARABLE
    return (span * itemsize, itemsize, strides)


def _strided_array(ptr: int, layout, shape):
    """The elements as unsigned ints, read in place (= `_element_bytes`)."""
    nbytes, itemsize, strides = layout
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    return np.ndarray(shape, _UINT[itemsize], buf, 0,
                      None if strides is None else [s * itemsize for s in strides])


def _same_elements(a, pa: int, b, pb: int, shape, entry=None) -> bool:
    """`np.array_equal(_element_bytes(ta, shape), _element_bytes(tb, shape))` (bit-identical
    elements) for tensors of layouts `a`, `b` (`_layout`, comparable) and data pointers `pa`, `pb`:
    the same memory in the same layout; two row-major tensors: one memcmp; else element 0 (at the
    data pointer of both) first, then, for a row-major `a` (a view's contiguous copy), one memcmp
    with the other's elements gathered in order (`tobytes`), else NumPy. `entry`: `b`'s view
    candidate (`Recorder._add_view`), where its array is kept while its data pointer stays."""
    if a is _EMPTY or b is _EMPTY:
        return a is b
    if pa == pb and a == b:
        return True
    if _memcmp is not None:
        if a[2] is None and b[2] is None:
            return a[0] == b[0] and _memcmp(pa, pb, a[0]) == 0
        if _memcmp(pa, pb, a[1]) != 0:
            return False
        if a[2] is None:
            if entry is None:
                arr = _strided_array(pb, b, shape)
            else:
                cached = entry[5]
                if cached is not None and cached[0] == pb:
                    arr = cached[1]
                else:
                    arr = _strided_array(pb, b, shape)
                    entry[5] = (pb, arr)
            return _memcmp(pa, arr.tobytes(), a[0]) == 0
    return bool((_strided_array(pa, a, shape) == _strided_array(pb, b, shape)).all())


# The plan cache: op name (PLANNABLE) -> {key (see `Recorder.on_op`) -> plan}. A plan of one
# instruction (`_new_plan`): (vm op, operand filler or None, mask, attrs, result type (for a view op:
# (strided, contiguous)), is_view, the order in which its tensor arguments become inputs (None: in
# argument order, all read), the types whose ids the key holds); of several instructions or results
# (`_record_lowering`, `_run_multi`): (_MULTI, steps, outputs, number of instructions, the types). A
# plan keeps the types of its key alive, so that no other type takes their ids while the key exists.
_PLANS: dict = {name: {} for name in _PLANNABLE}
_NO_PLANS: dict = {}  # `Recorder._plans` while plans are off (count-only mode, shapes that change)
_MAX_PLANS = 4096  # plans in all: past it, all are dropped (memory stays bounded)
_plans_made = 0  # plans in _PLANS
# Shapes that change from call to call make every op the first of its key: the plans only cost then.
# When more than 3/4 of the ops of a stretch made a plan (checked every _PLANS_CHECK plans made), the
# recorder goes without plans for the next _PLANS_OFF ops. (The first call of a model makes a plan
# per distinct key, and its layers share keys.)
_PLANS_CHECK = 1024
_PLANS_OFF = 8192


def _store_plan(plans: dict, key, plan) -> None:
    global _plans_made
    if _plans_made >= _MAX_PLANS:
        for p in _PLANS.values():
            p.clear()
        _plans_made = 0
    plans[key] = plan
    _plans_made += 1


_LEGACY = ("legacy",)  # key part: arguments of a legacy primitive (prim, name, inputs)
# The same inside a Cell with a mixed-precision type (`Recorder.mix_event`): MindSpore casts a legacy
# primitive's float tensor inputs to that type after dispatch (the cast is not dispatched), so its
# lowering differs (`_mix_casts`) and so must its plan.
_LEGACY_MIX = {dt: ("legacy", dt) for dt in ("f16", "f32", "bf16", "?")}  # "?": another thread's
_MIX_TYPES = {"FP16": "f16", "FP32": "f32", "BF16": "bf16"}  # MixedPrecisionType names; NOTSET: none


def _mix_casts(low, mix: str, name: str, args: tuple):
    """The lowering `low` of legacy primitive `name` run under mixed-precision type `mix`, with what
    MindSpore does after dispatch: each float tensor input of another float type is cast to `mix`
    first (a `cast` instruction per distinct tensor, its uses read the cast). `low` unchanged where
    nothing is cast; None (an opaque call) where the casts cannot be written exactly: an in-place or
    side-effect primitive (MindSpore leaves the Parameters it writes uncast), a tensor inside a
    sequence operand, or a lowering with casts of its own to another type (chosen from the dtypes
    before MindSpore's cast)."""
    if mix == "?":  # a type another thread pushed (`Recorder.mix_event`): not known here
        return None
    instrs = [low] if type(low) is tuple else list(low.instrs)
    outputs = _OUT1 if type(low) is tuple else low.outputs
    casts = {}  # id(tensor) -> (tensor, its index among the casts)
    for _, operands, _ in instrs:
        for a in operands:
            if isinstance(a, Tensor):
                dt = _vm_dtype(a.dtype)
                if id(a) not in casts and is_float(dt) and dt != mix:
                    casts[id(a)] = (a, len(casts))
            elif type(a) in (tuple, list) and any(isinstance(e, Tensor) for e in a):
                return None
    if not casts:
        return low
    if name in _INPLACE or _side_effect_inputs(name, args) or any(
            op == "cast" and attrs.get("dtype") != mix for op, _, attrs in instrs):
        # (a `cast` of the lowering itself to another type than `mix` was chosen from the dtypes
        # before MindSpore's cast, as BiasAdd's of a bias to x's dtype: after it they agree; one to
        # `mix` is exact after the casts)
        return None
    k = len(casts)

    def shift(a):
        if type(a) is _Tmp:
            return _Tmp(a.index + k, a.out)
        if isinstance(a, Tensor) and id(a) in casts:
            return _Tmp(casts[id(a)][1])
        return a

    new = [("cast", (t,), {"dtype": mix}) for t, _ in casts.values()]
    new += [(op, tuple(shift(a) for a in operands), attrs) for op, operands, attrs in instrs]
    return _Lowering(new, tuple(shift(t) for t in outputs))
_MULTI = ("multi",)  # first item of a plan of several instructions or results (`_run_multi`)


# Plain mode: the Inputs of the programs, shared by them (a program there is internal and dropped at
# its block's end; nothing mutates an Input): making a dataclass instance per input costs more.
_TENSOR_INPUTS: list = []  # Input(r, "tensor", "") at index r
_PARAM_INPUTS: dict = {}  # (r, name) -> Input(r, "param", name)


def _tensor_input(r: int) -> Input:
    _TENSOR_INPUTS.extend(Input(i, "tensor", "") for i in range(len(_TENSOR_INPUTS), r + 1))
    return _TENSOR_INPUTS[r]


def _param_input(r: int, name: str) -> Input:
    if len(_PARAM_INPUTS) > 65536:
        _PARAM_INPUTS.clear()
    inp = _PARAM_INPUTS[(r, name)] = Input(r, "param", name)
    return inp


def _type_of(dt, shape, contiguous: bool) -> TensorType:
    ty = _TYPES.get((id(dt), shape, contiguous))
    return _new_type(dt, shape, contiguous) if ty is None else ty


def _retype(ty: TensorType, layout: str) -> TensorType:
    return ty if ty.layout == layout else TensorType(ty.dtype, ty.shape, layout)


def _filler(operands: tuple, slots: list, argidx: list):
    """The function that makes the operands of a plan's instruction from the registers of its tensor
    arguments: `operands` with, at `slots[j]`, the register of tensor argument `argidx[j]`."""
    tmpl = [None if k in slots else a for k, a in enumerate(operands)]  # no tensor kept alive
    if slots == [0] and argidx == [0] and len(tmpl) == 2:
        c = tmpl[1]
        return lambda regs: (regs[0], c)
    pairs = tuple(zip(slots, argidx))

    def fill(regs):
        out = tmpl.copy()
        for s, k in pairs:
            out[s] = regs[k]
        return tuple(out)

    return fill


def _new_plan(plans, key, src, low, mask, dt, shape, ty, is_view, kept, fresh) -> None:
    """Cache the lowering `low` (one instruction whose result, of type `ty`, is the op's result) under
    `key` in `plans` (the op name's); `kept`, `fresh`: the types the key names (see
    `Recorder.on_op`)."""
    op, operands, attrs = low
    slots = [k for k in range(len(operands)) if mask >> k & 1]
    # Each tensor operand is a top-level tensor argument: which one, by identity (one object twice
    # would make that ambiguous).
    tensors = [a for a in src if type(a) is Tensor or type(a) in _PTYPES]
    pos = {id(a): k for k, a in enumerate(tensors)}
    if len(pos) != len(tensors):
        return
    argidx = [pos.get(id(operands[k])) for k in slots]
    if None in argidx:
        return
    in_order = argidx == list(range(len(pos)))
    # Inputs are made in operand order, for the arguments the instruction reads.
    order = None if in_order else tuple(dict.fromkeys(argidx))
    if fresh:
        kept.extend(f[2] for f in fresh)
    fill = None if in_order and len(slots) == len(operands) else _filler(operands, slots, argidx)
    rty = (_type_of(dt, shape, False), _type_of(dt, shape, True)) if is_view else ty
    _store_plan(plans, key, (op, fill, mask, attrs, rty, is_view, order, tuple(kept)))


# Types that are never tensors: `isinstance(x, Tensor)` on them goes through the metaclass's
# __instancecheck__ (an ABCMeta), several times the cost of a type test.
_NOT_TENSORS = frozenset((bool, int, float, type(None), str, tuple, list, dict, _TMP))


def _is_tensor(x) -> bool:
    t = type(x)
    return t is Tensor or (t not in _NOT_TENSORS and isinstance(x, Tensor))


def _registry():
    global _REGISTRY
    if _REGISTRY is None:
        from ms_dynvm.ir import registry as _REGISTRY
    return _REGISTRY


_REGISTRY = None
# registry.infer results: (op, per operand: the id of its type or its Python type and value, attrs
# items) -> (result types, the operand types, kept alive so that their ids stay theirs).
_INFERRED: dict = {}
_EXACT_ATTR = frozenset((bool, int, str, type(None)))


def _attr_value_ok(v) -> bool:
    """`v` compares equal only to values of the same meaning: no float zero (-0.0 == 0.0), no NaN."""
    t = type(v)
    if t in _EXACT_ATTR:
        return True
    if t is float:
        return v != 0.0 and v == v
    if t is tuple:
        for e in v:
            if not _attr_value_ok(e):
                return False
        return True
    return False


def _infer(op: str, arg_types: list, attrs: dict):
    """`registry.infer(op, arg_types, attrs)`, cached: the rules are functions of the operand types
    and immediates and of the attributes."""
    parts = [op]
    for a in arg_types:
        ta = type(a)
        if ta is TensorType:
            parts.append(id(a))
        elif _attr_value_ok(a):
            parts.append(ta)
            parts.append(a)
        else:
            return _registry().infer(op, arg_types, attrs)
    for k, v in attrs.items():
        if not _attr_value_ok(v):
            return _registry().infer(op, arg_types, attrs)
        parts.append(k)
        parts.append(type(v))
        parts.append(v)
    key = tuple(parts)
    hit = _INFERRED.get(key)
    if hit is not None:
        return hit[0]
    tys = tuple(_registry().infer(op, arg_types, attrs))
    if len(_INFERRED) >= 16384:
        _INFERRED.clear()
    _INFERRED[key] = (tys, tuple(a for a in arg_types if type(a) is TensorType))
    return tys


def _flat_tensors(obj, out: list) -> list:
    t = type(obj)
    if t is tuple or t is list or (t not in _NOT_TENSORS and isinstance(obj, (tuple, list))):
        for x in obj:
            _flat_tensors(x, out)
    elif _is_tensor(obj):
        out.append(obj)
    return out


class _Slot:
    """Where a tensor argument goes in a recorded opaque call's arguments (Recording._add_call)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _array_of(t) -> np.ndarray:
    """A tensor's value as the interpreter holds it (bfloat16 as float32), read without the sync-point
    hook (`_snapshot`)."""
    if t.dtype == _mstype.bfloat16:
        t = t.astype(_mstype.float32)
    return _snapshot(t)


def _read_tags(args, out) -> tuple:
    """(tags of the top-level tensor arguments, tags of the tensor results), read off the tensors:
    what `Recorder.last_tags` holds (the legacy `(prim, name, inputs)` form is unwrapped)."""
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple:
        args = args[2]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return ([a._get_user_data(_KEY) for a in args if _is_tensor(a)],
            [o._get_user_data(_KEY) for o in outs if _is_tensor(o)])


def _storage_key(t):
    """(data pointer, shape, dtype, strides) of tensor `t`, or None (no elements, or unreadable)."""
    try:
        ptr = t._data_ptr()
        return None if not ptr else (ptr, tuple(t.shape), str(t.dtype), tuple(t.stride()))
    except Exception:  # noqa: BLE001 - a tensor without host storage: no match
        return None


class Recording:
    """What `ms_dynvm.record()` yields. After the `with` block: `program` (a bytecode Program),
    `inputs` (the MindSpore tensors entering it, Parameters included, in program input order) and
    `outputs` (every tensor the program's instructions made, in register order, matching
    `program.outputs`; they hold their values as of the end of the recording).

    `inputs` are the tensors themselves, not copies: an input written in place inside the scope
    (setitem, `assign_value`, `set_data`, an in-place op, a graph-mode call such as an `nn`
    optimizer's step or an `@ms.jit` function, which may write any input) holds its new value
    afterwards. The recorder copies each input's value when the program first reads it (and after
    a write, later uses of the tensor are new inputs): `input_arrays()` gives every input's value as
    the program read it, which `[t.asnumpy() for t in inputs]` does not then. Writes to inputs are
    noted in `warnings`."""

    def __init__(self) -> None:
        self.program: Program | None = None
        self.inputs: list = []
        self.outputs: list = []
        self.errors: list = []  # recorder failures inside the scope ("name: error")
        self.warnings: list = []  # writes to inputs inside the scope (see the class doc)
        self._snaps: dict = {}  # input index -> its value (NumPy copy) when the program first read it
        self._epoch = None
        # Per opaque call, by its result registers: (name, the dispatched op, its arguments with each
        # tensor a _Slot, the tensors' MindSpore dtypes); see call_handler.
        self._calls: dict = {}

    def _add_call(self, name: str, func, args, outs: tuple) -> None:
        dts: list = []

        def template(obj):
            t = type(obj)
            if t is tuple or t is list or (t not in _NOT_TENSORS and isinstance(obj, (tuple, list))):
                items = [template(x) for x in obj]  # (the order of _flat_tensors)
                return items if isinstance(obj, list) else tuple(items)
            if _is_tensor(obj):
                dts.append(obj.dtype)
                return _Slot(len(dts) - 1)
            return obj

        self._calls[tuple(int(r) for r in outs)] = (name, func, template(args), tuple(dts))

    def call_handler(self, instr, operands) -> tuple:
        """Runs a `call` instruction of `program` (an op the VM does not model) by running the
        recorded MindSpore op again on `operands` (NumPy arrays, made MindSpore tensors of the
        recorded dtypes), with the op's other arguments as recorded: what `interpret(program, ...)`
        uses by default in this process. A random op draws new values."""
        found = self._calls.get(tuple(int(r) for r in instr.outs))
        if found is None:
            raise RuntimeError(f"call {instr.attrs.get('target')!r} is not one this recording made")
        name, func, template, dts = found
        if name != instr.attrs.get("target") or len(operands) != len(dts):
            raise RuntimeError(f"call {instr.attrs.get('target')!r} does not match the recorded {name!r}")
        def fill(obj):
            t = type(obj)
            if t is _Slot:
                v = Tensor(np.array(operands[obj.i], order="C"))  # (ascontiguousarray makes 0-d 1-d)
                return v if v.dtype == dts[obj.i] else v.astype(dts[obj.i])
            if t is tuple:
                return tuple(fill(x) for x in obj)
            if t is list:
                return [fill(x) for x in obj]
            return obj

        args = fill(template)
        if func is not None:
            out = func(*args)
        elif len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple:
            out = args[0](*args[2])  # a legacy primitive
        else:
            raise RuntimeError(f"call {name!r}: the op was not kept (pass call_handler= to interpret)")
        return tuple(_array_of(t) for t in _flat_tensors(out, []))

    def input_arrays(self) -> list:
        """The inputs' values as the program read them (NumPy arrays, for `interpret`): the copies
        taken when the program first read each input (`Recorder._input_tag`), new arrays at each
        call (the script may write into them)."""
        return [self._snaps[k].copy() for k in range(len(self.inputs))]

    def _warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def reg_of(self, tensor):
        """The register holding `tensor`'s value at the end of the recording, or None. Found by its
        tag; where ms_dynvm has tagged the tensor again since (used by an op after the scope with
        ms_dynvm on, it became an input of another program), by storage: the output of the same
        data pointer, shape, dtype and strides."""
        tag = tensor._get_user_data(_KEY)
        if tag is not None and tag[0] == self._epoch:
            return Reg(tag[1])
        if tag is not None and self.program is not None:
            key = _storage_key(tensor)
            if key is not None:
                for r, t in zip(reversed(self.program.outputs), reversed(self.outputs)):
                    if _storage_key(t) == key:
                        return Reg(r)
        return None

    def output_index(self, tensor) -> int:
        """Index of `tensor`'s value in `outputs` (and in `interpret(program, ...)`'s result)."""
        r = self.reg_of(tensor)
        if r is None or int(r) not in self.program.outputs:
            raise ValueError("tensor is not an output of this recording")
        return self.program.outputs.index(int(r))


class Recorder:
    """Per op, `on_op` leaves for tier 1:
    - `last_op`: (block, first instruction index, end index, result register numbers) of what was
      recorded, or None when nothing was (meta op, opaque call, count-only mode);
    - `last_tags`, only while `want_tags` is true (tier 1 sets it), and only when `last_op` is not
      None: (arg_tags, out_tags), two lists: the recorder tag `(epoch, register number)` (or None) of
      every top-level tensor argument (legacy `(prim, name, inputs)` form: of `inputs`) and of every
      tensor result, as they stand after the op was recorded; exactly
      `[t._get_user_data("ms_dynvm") for t in ...]`, without reading them again. Else None.

    Block instructions are appended in the compact form (`Block.append_raw`); `Block.op_names`
    reads their op names without making Instr objects."""

    @property
    def opts(self):
        return self._opts

    @opts.setter
    def opts(self, opts) -> None:
        self._opts = opts
        self._update_links()
        self._max_block_ops = opts.max_block_ops
        self._last_index = opts.max_block_ops - 1  # an instruction at this index closes the block
        self._record = opts.record
        self._plans = _PLANS if opts.record else _NO_PLANS
        self._made = 0  # plans made since the last check (see _made_plan)
        self._made_at = self._ops()
        self._plans_back = 0  # while plans are off: the op count at which they come back

    @property
    def link_ops(self) -> frozenset:
        return self._link_ops

    @link_ops.setter
    def link_ops(self, ops: frozenset) -> None:
        self._link_ops = ops
        self._update_links()

    def _update_links(self) -> None:
        """`_link_all`: every op's arguments may be linked to views (`_link_for`); `_views_on`: some
        op's may, so view results are kept as link candidates (`_add_view`; elsewhere a candidate is
        work for nothing, and it keeps the view alive). Both read by the C hot path too."""
        self._link_all = self.recording is not None or bool(self._opts.debug) or bool(self._opts.dump_dir)
        self._views_on = self._link_all or bool(self._link_ops)

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        # Ops are counted per phase in batches (METRICS.op_names): the new phase's batch.
        METRICS.set_op_phase(phase)
        self._names = METRICS.op_names
        self._phase = phase

    def __init__(self, opts) -> None:
        self.recording: Recording | None = None
        self.cur_func = None  # the op being dispatched, inside record() (see Recording.call_handler)
        # VM ops whose view-copy arguments are linked to the view's register in plain mode (see
        # `_link_for`): tier 1 sets its fusible ops.
        self._link_ops: frozenset = frozenset()
        self.opts = opts
        self.last_op = None
        self.last_tags = None
        self.want_tags = False
        self.on_close = None  # callback(reason) before a block closes (tier 1 ends its run there)
        # Counted in batches (see Metrics.flush_ops): every op seen (`_names`, the phase's list: set
        # by the phase setter), and the ops recorded as one instruction by on_op's common case.
        self.phase = "fwd"
        self.region = ""
        self._block_count = 0
        self._one_instr = METRICS.one_instr_ops
        # Mixed precision (`mix_event`): MindSpore's stack of Cell mixed-precision types, the one in
        # force (None, or a VM float dtype), and the plan-key part of legacy primitives under it.
        self._mix_stack: list = []
        self._mix_foreign = 0  # pushes by other threads not popped yet
        self._mix = None
        self._legacy_key = _LEGACY
        self._new_program()

    # --- program and block management -----------------------------------------------------------
    def _new_program(self) -> None:
        self.program = Program()
        self._types = self.program.types
        self.block = None
        self.epoch = next(_epochs)
        self._views: deque = deque(maxlen=_VIEW_CANDIDATES)  # see _add_view
        self._view_keys: dict = {}
        self._results: list = []  # record mode: every result tensor, kept alive for rec.outputs

    def _open_block(self):
        b = self.block
        if b is None:
            b = self.block = self.program.new_block(self._phase, self.region)
        return b

    def close_block(self, reason: str) -> None:
        # Plain mode drops the Program at a block end, except at an nn.Cell boundary (not a sync
        # point: values still flow into the next block, and tier 1 fuses across it) and at a
        # forward/backward phase change (the backward ops read the forward's values: kept, they are
        # registers, not new inputs), while the Program stays under max_block_ops registers (its
        # register count is O(1); summing the blocks' instructions here cost O(blocks) per block
        # end, most of the recorder's time in a training loop without a sync point). Also when no
        # block is open (a sync point right after a Cell call), or the Program would grow over every
        # later step.
        drop = self.recording is None and (reason not in _KEEP_PROGRAM
                                           or self.program._n > self._max_block_ops)
        if self.on_close is not None:
            # A run cannot go on into another Program: tier 1 hears "program" then, not "cell".
            self.on_close(reason if not drop or reason not in _KEEP_PROGRAM else "program")
        if len(self._names) >= _FLUSH_NAMES:
            METRICS.flush_ops()
        if self._plans is _NO_PLANS and self._record and not 0 <= self._plans_back - self._ops() < _PLANS_OFF:
            self._plans = _PLANS  # (the op counts restart at reset_stats)
            self._made = 0
            self._made_at = self._ops()
        b = self.block
        if b is not None:
            self.block = None
            b.end = reason
            if b.num_instrs():
                METRICS.blocks += 1
                METRICS.block_ends[reason] += 1
                self._block_count += 1
                if self.opts.debug or self.opts.dump_dir:
                    self._debug_block(b)
        if drop and (b is not None or self.program._n):
            self._new_program()

    def _debug_block(self, b) -> None:
        from ms_dynvm.ir.verifier import verify_program

        prog = self.program
        if self.recording is not None:
            # A block-local view: the full program is verified when the recording ends.
            return
        if self.opts.debug >= 1:
            verify_program(prog)
        if self.opts.debug >= 2:
            print(f"[ms_dynvm] block {self._block_count} ({b.phase}, end={b.end})\n{prog.as_text()}",
                  file=sys.stderr)
        if self.opts.debug >= 3:
            from ms_dynvm.ir.function import Function

            print(Function.from_block(prog, b.id, outputs=[r for i in b.instrs for r in i.outs]),
                  file=sys.stderr)
        if self.opts.dump_dir:
            os.makedirs(self.opts.dump_dir, exist_ok=True)
            prog.save(os.path.join(self.opts.dump_dir, f"block_{self._block_count}.dvm"))

    def set_phase(self, phase: str) -> None:
        if phase != self._phase:
            self.close_block("phase")
            self.phase = phase

    def mix_event(self, mixed_precision_type, push: bool, foreign: bool = False) -> None:
        """MindSpore's `_PyNativeExecutor.set_mixed_precision_type(type, push)` ran (an nn.Cell with
        a mixed-precision type, `to_float` or amp O2/O3, entered or left): its stack, mirrored. The
        type on top (NOTSET: none) is the one MindSpore casts legacy primitives' inputs to.
        MindSpore's stack is one per process: `foreign`, a push or pop by another thread. While
        another thread has pushed a type, the type in force here is not known ("?": legacy
        primitives are opaque calls, tier 1 stays off); only this thread's events end blocks."""
        if foreign:
            self._mix_foreign = max(0, self._mix_foreign + (1 if push else -1))
        elif push:
            self._mix_stack.append(_MIX_TYPES.get(getattr(mixed_precision_type, "name", None)))
        elif self._mix_stack:
            self._mix_stack.pop()
        mix = "?" if self._mix_foreign else (self._mix_stack[-1] if self._mix_stack else None)
        if mix != self._mix and not foreign:
            # Tier 1 neither tracks nor serves ops under a mixed-precision type (its run templates
            # are not keyed by it: a run learned inside a to_float Cell was served outside it, in
            # float16): the run in progress ends here.
            self.close_block("mix")
        self._mix = mix
        self._legacy_key = _LEGACY if mix is None else _LEGACY_MIX[mix]

    def enter_region(self, name: str) -> None:
        self.close_block("cell")
        self.region = name

    def exit_region(self) -> None:
        self.close_block("cell")
        self.region = ""

    def sync(self, reason: str) -> None:
        METRICS.sync_points[reason] += 1
        self.close_block("sync")

    def before_graph_call(self) -> None:
        """In a recording, a graph-mode call (an `nn` optimizer's step, an `@ms.jit` function) is
        about to run: it may write any input in place. Every input's value as read is copied
        already (`_input_tag`); after the call (`after_graph_call`) later uses of them become new
        inputs."""
        rec = self.recording
        if rec is None or not rec.inputs:
            return
        rec._warn("a graph-mode call (an nn optimizer's step or an @ms.jit function) ran inside the "
                  "scope: inputs read before it are in input_arrays() as they were")

    def after_graph_call(self) -> None:
        rec = self.recording
        if rec is None:
            return
        for t in rec.inputs:
            tag = t._get_user_data(_KEY)
            if tag is not None and tag[0] == self.epoch:
                t._set_user_data(_KEY, None)

    def before_write(self, tensor, reads: bool = True) -> None:
        """In a recording: `tensor` is about to be written in place; if it is a program input, its
        value is copied first (`Recording.input_arrays`). `reads`: the op reads the tensor's old
        value (an in-place add, not a fill): where this is the tensor's first use in the program,
        it becomes an input now, with its value before the write (made by the op's recording, after
        the write, it would read the new value: the add applied twice)."""
        rec = self.recording
        if rec is None:
            return
        tag = tensor._get_user_data(_KEY)
        if tag is None or tag[0] != self.epoch:
            if not reads:
                return
            tag = self._input_tag(tensor, tag)
        for k, inp in enumerate(self.program.inputs):
            if inp.reg == tag[1]:  # (its value as read is in rec._snaps: `_input_tag` copied it)
                rec._warn("an input tensor was written in place inside the scope: rec.inputs holds "
                          "its new value, input_arrays() the one the program read")
                return

    def forget(self, tensor) -> None:
        """`tensor` was written in place by code the hook does not see: its value is new (and it is
        no longer the tensor tier 1 gave a token: MindSpore may have given it new storage)."""
        tensor._set_user_data(_KEY, None)
        tensor._set_user_data(_T1KEY, None)

    def _rebind_target(self, target, reg: int) -> None:
        """An in-place op wrote `target`: it holds register `reg` now, and no tier-1 token."""
        self._bind(target, reg)
        target._set_user_data(_T1KEY, None)

    # --- recording ------------------------------------------------------------------------------
    def _reg_of(self, t) -> int:
        tag = t._get_user_data(_KEY)
        if tag is None or tag[0] != self.epoch:
            tag = self._input_tag(t, tag)
        return tag[1]

    def _link_for(self, op: str) -> bool:
        """Whether an argument of VM op `op` is worth linking to a view (see the module doc). Always
        in `record()` and with debug or dump_dir (the Program is the product there); in plain mode only
        where tier 1 may fuse the op: the Program is dropped when its block closes, and a link only
        saves a register there, at the price of a compare of the whole tensor (a matmul's transposed
        operand in attention's backward: most of the link calls of the attention workloads)."""
        return op in self._link_ops or self._link_all

    def _input_tag(self, t, old, ty=None, link: bool = True) -> tuple:
        """`t`, whose tag is `old` (None or of an earlier program), holds no register of this program:
        link it to a view result (only an untagged tensor, and only with `link`: see the module doc
        and `_link_for`) or make it an input. Returns its new tag. (`ty`: `tensor_type(t)`, when the
        caller has it.)"""
        if ty is None:
            ty = tensor_type(t)
        if link and old is None and self._view_keys and (ty.dtype, ty.shape) in self._view_keys:
            tag = self._link_view(t, ty)
            if tag is not None:
                return tag
        # The handler sees Parameters as plain Tensors: their names come from the tag that
        # `tag_parameters` put on the C++ tensor.
        pname = t._get_user_data(_PKEY)
        if pname is not None:
            kind, name = "param", pname
        elif type(t) is not Tensor and isinstance(t, Parameter):
            kind, name = "param", t.name
        else:
            kind, name = "tensor", ""
        prog = self.program
        r = prog._n  # = prog.next_reg(): the recorder allocates every register of its programs
        prog._n = r + 1
        prog.types[r] = ty
        if self.recording is not None:
            inp = Input(r, kind, name)
        elif kind == "tensor":  # plain mode: the programs' Inputs are shared (see _TENSOR_INPUTS)
            inp = _TENSOR_INPUTS[r] if r < len(_TENSOR_INPUTS) else _tensor_input(r)
        else:
            inp = _PARAM_INPUTS.get((r, name)) or _param_input(r, name)
        prog.inputs.append(inp)
        tag = (self.epoch, r)
        t._set_user_data(_KEY, tag)
        if self.recording is not None:
            # Its value as the program reads it, copied now: the script may write the tensor later,
            # inside the scope or after it, in ways the recorder does not see (through NumPy memory).
            self.recording._snaps[len(self.recording.inputs)] = _snapshot(t)
            self.recording.inputs.append(t)
        return tag

    def _link_view(self, t, ty):
        """Tag of a recent view result holding exactly `t`'s values (now also `t`'s tag), or None
        (see module doc)."""
        shape = ty.shape
        dtype = ty.dtype
        arg = None
        for entry in reversed(self._views):
            ref, reg, vdtype, vshape, vlayout, _, vcontiguous = entry
            if vdtype != dtype or vshape != shape:
                continue
            view = ref()
            if view is None:  # (the script let it go: no longer a candidate)
                continue
            if arg is None:
                c_strides = _c_strides(shape)
                itemsize = _ITEMSIZE.get(dtype)
                arg = _layout(t, shape, c_strides, ty.layout == "contiguous", itemsize)
                if arg is _NOT_COMPARABLE:
                    return None
                pa = 0 if arg is _EMPTY else _data_ptr(t)
            if vlayout is None:
                vlayout = entry[4] = _layout(view, shape, c_strides, vcontiguous, itemsize)
            if vlayout is _NOT_COMPARABLE:
                continue
            pv = 0 if vlayout is _EMPTY else _data_ptr(view)
            if _same_elements(arg, pa, vlayout, pv, shape, entry):
                tag = (self.epoch, reg)
                t._set_user_data(_KEY, tag)
                return tag
        return None

    @staticmethod
    def _ops() -> int:
        return METRICS.ops_seen + METRICS.pending_ops()

    def _made_plan(self) -> None:
        """A plan was made: every _PLANS_CHECK of them, turn plans off for a while if more than 3/4
        of the ops since the last check made one."""
        self._made += 1
        if self._made >= _PLANS_CHECK:
            n = self._ops()
            if 0 <= n - self._made_at < _PLANS_CHECK * 4 // 3:
                self._plans = _NO_PLANS
                self._plans_back = n + _PLANS_OFF
            self._made = 0
            self._made_at = n

    def _add_view(self, t, reg: int, ty, read: bool = False) -> None:
        """`t` (register `reg`, type `ty`) is a view result: a candidate for `_link_view`. `read`:
        the layout of `ty` was read off `t` (a type from the registry's rules may say contiguous for a
        view that is not: then `_link_view` reads the strides)."""
        if not self._views_on:
            return
        views = self._views
        keys = self._view_keys  # (dtype, shape) -> number of candidates of it
        if len(views) == _VIEW_CANDIDATES:
            old = views[0]
            k = (old[2], old[3])
            n = keys[k] - 1
            if n:
                keys[k] = n
            else:
                del keys[k]
        k = (ty.dtype, ty.shape)
        keys[k] = keys.get(k, 0) + 1
        # [weak reference to the tensor, reg, dtype, shape, layout (`_layout`, once compared), (data
        # pointer, its elements), contiguous]. Weak: keeping the view alive would change when
        # MindSpore frees and reuses its memory, which can change what eager computes where
        # MindSpore reads memory it should not (an LSTM's gradient under amp O2 differed from eager's
        # with the candidates held).
        views.append([_weakref(t), reg, k[0], k[1], None, None, read and ty.layout == "contiguous"])

    def _bind(self, t, reg: int) -> None:
        t._set_user_data(_KEY, (self.epoch, reg))
        if self.recording is not None:
            self._results.append(t)

    def on_op(self, name: str, args: tuple, out) -> None:
        """Called after the op ran eagerly with `out` as its result; sets `last_op` and `last_tags`
        (see the class doc)."""
        if _hit is not None and _hit(self, name, args, out):
            return  # recorded by the C hot path (frontend/fastpath.py): the plan-cache branch below
        # Every return path sets last_op and last_tags (after an exception, dispatch calls on_error,
        # which clears them).
        self._names.append(name)
        key = None
        plans = self._plans.get(name)
        if plans is not None:
            # The plan cache (see the module doc), inline: the key is, per argument, the id of its
            # register's (interned) type, or its Python type and value.
            epoch = self.epoch
            types = self._types
            parts = []
            src = args
            if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple and args[1] == name:
                src = args[2]  # legacy primitive: (prim, name, inputs)
                parts.append(self._legacy_key)
            pregs = []  # register of each tensor argument; -1 for one that holds none yet (`fresh`)
            fresh = None
            for a in src:
                ta = type(a)
                if ta is Tensor or ta in _PTYPES:
                    tag = a._get_user_data(_KEY)
                    if tag is not None and tag[0] == epoch:
                        r = tag[1]
                        pregs.append(r)
                        parts.append(id(types[r]))
                    else:
                        ty = tensor_type(a)
                        if fresh is None:
                            fresh = []
                        fresh.append((len(pregs), a, ty, tag))
                        pregs.append(-1)
                        parts.append(id(ty))
                elif ta is float:
                    if a == 0.0 or a != a:  # -0.0 == 0.0, nan != nan: no key
                        break
                    parts.append(float)
                    parts.append(a)
                elif ta is int or ta is bool or ta is str:
                    parts.append(ta)
                    parts.append(a)
                elif a is None:
                    parts.append(None)
                elif ta is tuple or ta is list:
                    for e in a:
                        if type(e) is not int:
                            break
                    else:
                        parts.append(ta)
                        parts.append(tuple(a))
                        continue
                    break
                else:
                    _param_type(ta)
                    break
            else:
                key = tuple(parts)
                plan = plans.get(key)
                if plan is None:
                    pass
                elif plan[0] is _MULTI:
                    if self._run_multi(plan, name, args, out, pregs, fresh):
                        return
                elif type(out) is Tensor:
                    op, fill, mask, attrs, rty, is_view, order, _ = plan
                    if fresh is not None:
                        # In argument order (which is operand order) unless the plan says otherwise.
                        if order is not None:
                            byarg = {f[0]: f for f in fresh}
                            fresh = [byarg[k] for k in order if k in byarg]
                        self._make_inputs(fresh, pregs, False, self._link_for(op))
                    block = self.block
                    if block is None:
                        block = self._open_block()
                    prog = self.program
                    r = prog._n
                    ty = rty[_is_contiguous(out)] if is_view else rty
                    types[r] = ty
                    prog._n = r + 1
                    pending = block._pending
                    start = len(block._instrs) + len(pending)
                    outs = (r,)
                    pending.append((op, tuple(pregs) if fill is None else fill(pregs), outs, mask))
                    block._pattrs.append(attrs)
                    otag = (epoch, r)
                    out._set_user_data(_KEY, otag)
                    if self.recording is not None:
                        self._results.append(out)
                    if is_view and self._views_on:
                        self._add_view(out, r, ty, True)
                    self.last_op = (block, start, start + 1, outs)
                    if self.want_tags:
                        self.last_tags = ([(epoch, x) for x in pregs] if order is None
                                          else _read_tags(args, out)[0], [otag])
                    else:
                        self.last_tags = None
                    self._one_instr.append(None)
                    if start >= self._last_index:
                        self.close_block("limit")
                    return
        # normalize.lower(name, args), inline
        low = _TABLE.get(name)
        if low is not None and low is not _META:
            if _storage_only(args, out):
                low = None  # (an opaque call: see dtypes.STORAGE_ONLY)
            else:
                try:
                    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple and args[1] == name:
                        low = low(args[2], args[0])  # legacy primitive: (prim, name, inputs)
                        if self._mix is not None and low is not None:
                            low = _mix_casts(low, self._mix, name, args)
                    else:
                        low = low(args, None)
                except _REJECT:
                    low = None
        if type(low) is not tuple:
            if (type(low) is _Lowering and len(low.instrs) == 1 and len(low.outputs) == 1
                    and type(out) is Tensor):
                low = low.instrs[0]
            else:
                self._other(name, args, out, low,
                            None if key is None else (plans, key, src, pregs, fresh))
                return
        if type(out) is Tensor and self._record:
            # The common case, inline: one VM instruction whose one result is `out`. Counted in
            # METRICS through `_one_instr` (see Metrics.flush_ops).
            op, operands, attrs = low
            epoch = self.epoch
            regs = []
            mask = 0
            i = 0
            link = None
            for a in operands:
                if type(a) is Tensor or (type(a) not in _IMMEDIATE and isinstance(a, Tensor)):
                    tag = a._get_user_data(_KEY)
                    if tag is None or tag[0] != epoch:
                        if link is None:
                            link = self._link_for(op)
                        tag = self._input_tag(a, tag, None, link)
                    regs.append(tag[1])
                    mask |= 1 << i
                else:
                    regs.append(a)
                i += 1
            block = self.block
            if block is None:
                block = self._open_block()
            prog = self.program
            r = prog._n
            is_view = op in _VIEW
            # tensor_type(out, ...), inline; MindSpore kernels write contiguous results.
            dt = out._dtype
            shape = out._shape
            contiguous = _is_contiguous(out) if is_view else True
            ty = _TYPES.get((id(dt), shape, contiguous))
            if ty is None:
                ty = _new_type(dt, shape, contiguous)
            if key is not None:
                _new_plan(plans, key, src, low, mask, dt, shape, ty, is_view,
                          [self._types[x] for x in pregs if x >= 0], fresh)
                self._made_plan()
            prog.types[r] = ty
            prog._n = r + 1
            pending = block._pending
            start = len(block._instrs) + len(pending)
            outs = (r,)
            pending.append((op, tuple(regs), outs, mask))
            block._pattrs.append(attrs)
            otag = (epoch, r)
            out._set_user_data(_KEY, otag)
            if self.recording is not None:
                self._results.append(out)
            if is_view and self._views_on:
                self._add_view(out, r, ty, True)
            self.last_op = (block, start, start + 1, outs)
            if name in _INPLACE:
                target = _mutated(name, args)
                if target is not None:
                    self._rebind_target(target, r)
                self.last_tags = _read_tags(args, out) if self.want_tags else None
            elif self.want_tags:
                if name in _IN_ORDER:
                    tags = [(epoch, x) for k, x in enumerate(regs) if mask >> k & 1]
                else:
                    tags = _read_tags(args, out)[0]
                self.last_tags = (tags, [otag])
            else:
                self.last_tags = None
            self._one_instr.append(None)
            if start >= self._last_index:
                self.close_block("limit")
            return
        self._other(name, args, out, _Lowering([low], _OUT1),
                    None if key is None else (plans, key, src, pregs, fresh))

    def _other(self, name: str, args: tuple, out, low, pk=None) -> None:
        """on_op for everything but the common case: META, count-only mode, opaque calls, lowerings
        of several instructions or results (`pk`: what `_record_lowering` needs to cache them)."""
        self.last_op = self.last_tags = None
        names = self._names
        if low is _META:
            METRICS.ops_meta[name] += 1
            if len(names) > _FLUSH_NAMES:
                METRICS.flush_ops()
            return
        if not self._record:
            if low is None:
                METRICS.ops_opaque[name] += 1
            if len(names) > _FLUSH_NAMES:
                METRICS.flush_ops()
            return
        if low is None:
            self._record_call(name, args, out)
            return
        self._record_lowering(name, args, out, low, pk)

    def _make_inputs(self, fresh, pregs: list, again: bool, link: bool = True) -> bool:
        """Plan hit: the tensor arguments that held no register (`fresh` entries: position, tensor,
        type, old tag) become inputs (or links), in that order, unless one already did. `again`: an
        input was made before in this op (the same C++ tensor may come twice: its tag is read
        again). Returns the new `again`."""
        epoch = self.epoch
        for k, a, ty, tag in fresh:
            if pregs[k] >= 0:
                continue
            if again:
                tag = a._get_user_data(_KEY)
                if tag is not None and tag[0] == epoch:
                    pregs[k] = tag[1]
                    continue
            pregs[k] = self._input_tag(a, tag, ty, link)[1]
            again = True
        return again

    def _run_multi(self, plan, name: str, args: tuple, out, pregs: list, fresh) -> bool:
        """Record the op from its cached lowering of several instructions or results (see
        `_record_lowering`); False (nothing done) where the plan does not apply: a result structure
        other than the plan's, or a tensor argument that a view may be linked to (the types the
        registry gives the temporaries follow the register's type)."""
        _, steps, louts, n_instrs, _ = plan
        outs_t = out if type(out) is tuple or type(out) is list else (out,)
        if len(outs_t) != len(louts):
            return False
        byarg = None
        if fresh is not None:
            keys = self._view_keys
            byarg = {}
            for f in fresh:
                if f[3] is None and keys and (f[2].dtype, f[2].shape) in keys:
                    return False
                byarg[f[0]] = f
        again = False
        block = self._open_block()
        prog = self.program
        types = prog.types
        pending = block._pending
        pattrs = block._pattrs
        start = len(block._instrs) + len(pending)
        results = []
        for op, ospec, mask, attrs, tys, views, first in steps:
            if byarg is not None and first:
                # The arguments this instruction reads first become inputs now, as in
                # _record_lowering (register numbers in the same order).
                again = self._make_inputs([byarg[k] for k in first if k in byarg], pregs, again)
            r = prog._n
            regs = []
            for kind, x, y in ospec:
                regs.append(pregs[x] if kind == 0 else results[x][y] if kind == 1 else x)
            outs = tuple(range(r, r + len(tys)))
            for rr, t in zip(outs, tys):
                types[rr] = t
            for j, k, pair in views:
                types[r + j] = pair[_is_contiguous(outs_t[k])]
            prog._n = r + len(tys)
            pending.append((op, tuple(regs), outs, mask))
            pattrs.append(attrs)
            results.append(outs)
        for k, (i, j, view) in enumerate(louts):
            t = outs_t[k]
            if type(t) is Tensor or _is_tensor(t):
                reg = results[i][j]
                self._bind(t, reg)
                if view:
                    self._add_view(t, reg, types[reg])
        end = start + n_instrs
        self.last_op = (block, start, end, tuple(results[i][j] for i, j, _ in louts))
        self.last_tags = _read_tags(args, out) if self.want_tags else None
        m = METRICS
        m.ops_recorded += 1
        m.instrs += n_instrs
        if end >= self._max_block_ops:
            self.close_block("limit")
        return True

    def _emit(self, block, op: str, regs: list, mask: int, attrs: dict, types) -> tuple:
        """Append one instruction (registers in `regs` are the ints flagged by `mask`); returns its
        result register numbers."""
        prog = self.program
        r0 = prog._n  # = prog.next_reg(): the recorder allocates every register of its programs
        outs = tuple(range(r0, r0 + len(types)))
        prog._n = r0 + len(outs)
        ptypes = prog.types
        for r, t in zip(outs, types):
            ptypes[r] = t
        block.append_raw((op, tuple(regs), outs, mask), attrs)
        return outs

    def _record_lowering(self, name: str, args: tuple, out, low, pk=None) -> None:
        """A lowering of several instructions (or results): temporaries typed by the registry. With
        `pk` (plans, key, the tensor arguments' source, their registers, `fresh`: see `on_op`) the
        lowering is cached as a plan for `_run_multi`."""
        instrs, louts = low
        outs = out if isinstance(out, (tuple, list)) else (out,)
        final = {}
        for k, tmp in enumerate(louts):
            final[(tmp.index, tmp.out)] = outs[k]
        block = self._open_block()
        prog = self.program
        types = prog.types
        start = block.num_instrs()
        results = []
        if pk is not None:  # plan bookkeeping: tensor arguments by identity, in order
            tensors = [a for a in pk[2] if type(a) is Tensor or type(a) in _PTYPES]
            argpos = {id(a): k for k, a in enumerate(tensors)}
            if len(argpos) != len(tensors):
                pk = None  # the same tensor object twice: which argument an operand is is ambiguous
            seen, steps = set(), []
        for i, (op, operands, attrs) in enumerate(instrs):
            regs = []
            mask = 0
            ospec = [] if pk is not None else None
            first = []
            for j, a in enumerate(operands):
                ta = type(a)
                if ta is _TMP:
                    regs.append(results[a.index][a.out])
                    mask |= 1 << j
                    if pk is not None:
                        ospec.append((1, a.index, a.out))
                elif ta is Tensor or (ta not in _IMMEDIATE and isinstance(a, Tensor)):
                    regs.append(self._reg_of(a))
                    mask |= 1 << j
                    if pk is not None:
                        k = argpos.get(id(a))
                        if k is None:
                            pk = None  # not a top-level argument
                        else:
                            ospec.append((0, k, 0))
                            if k not in seen:
                                seen.add(k)
                                first.append(k)
                else:
                    regs.append(a)
                    if pk is not None:
                        ospec.append((2, a, 0))
            n_out = _OPS[op].n_out
            tys = None
            views = ()
            if n_out >= 0:
                tys = []
                for j in range(n_out):
                    t = final.get((i, j))
                    if t is None:
                        tys = None
                        break
                    tys.append(tensor_type(t))
            if tys is None:
                tys = _infer(op, [types[r] if mask >> j & 1 else r for j, r in enumerate(regs)], attrs)
            elif pk is not None and op in _VIEW_LIKE:  # the results' layouts are read at each use
                views = tuple((j, louts.index(_TMP(i, j)), (_retype(ty, "strided"), _retype(ty, "contiguous")))
                              for j, ty in enumerate(tys))
            results.append(self._emit(block, op, regs, mask, attrs, tys))
            if pk is not None:
                steps.append((op, tuple(ospec), mask, attrs, tuple(tys), views, tuple(first)))
        for k, tmp in enumerate(louts):
            t = outs[k]
            if _is_tensor(t):
                reg = results[tmp.index][tmp.out]
                self._bind(t, reg)
                if instrs[tmp.index][0] in _VIEW_LIKE:
                    self._add_view(t, reg, types[reg])
        end = block.num_instrs()
        self.last_op = (block, start, end, tuple(results[t.index][t.out] for t in louts))
        if name in _INPLACE and louts:
            target = _mutated(name, args)
            if target is not None:
                first = louts[0]
                self._rebind_target(target, results[first.index][first.out])
        self.last_tags = _read_tags(args, out) if self.want_tags else None
        m = METRICS
        m.ops_recorded += 1
        m.instrs += len(instrs)
        if pk is not None and name not in _INPLACE and len(outs) == len(louts):
            plans, key, _, pregs, fresh = pk
            kept = [types[x] for x in pregs if x >= 0]
            linked = False
            for f in fresh or ():
                # The key has the argument's own type: not the plan of an argument linked to a view
                # of another type (see _run_multi).
                tag = f[1]._get_user_data(_KEY)
                linked |= tag is not None and tag[0] == self.epoch and types[tag[1]] != f[2]
                kept.append(f[2])
            if not linked:
                _store_plan(plans, key, (_MULTI, tuple(steps),
                                         tuple((t.index, t.out, instrs[t.index][0] in _VIEW_LIKE)
                                               for t in louts),
                                         len(instrs), tuple(kept)))
                self._made_plan()
        if end >= self._max_block_ops:
            self.close_block("limit")

    def _record_call(self, name: str, args: tuple, out) -> None:
        """An op the VM does not model: one opaque `call` over its tensor arguments, ending the block."""
        METRICS.ops_opaque[name] += 1
        block = self._open_block()
        regs = [self._reg_of(t) for t in _flat_tensors(args, [])]
        res = _flat_tensors(out, [])
        types = [tensor_type(t) for t in res]
        outs = self._emit(block, "call", regs, (1 << len(regs)) - 1, {"target": name}, types)
        if self.recording is not None:  # (after the instruction exists: keyed by its results)
            self.recording._add_call(name, self.cur_func, args, outs)
        # A legacy primitive with side effects wrote some of its tensor inputs (which ones MindSpore
        # does not say): their registers are stale, their next use reads the tensor again (before the
        # results are bound: a result may be one of them).
        for t in _side_effect_inputs(name, args):
            self.forget(t)
        for t, r in zip(res, outs):
            self._bind(t, r)
        if name in _INPLACE and outs:
            target = _mutated(name, args)
            if target is not None:
                self._rebind_target(target, outs[0])
        METRICS.ops_recorded += 1
        METRICS.instrs += 1
        self.close_block("call")

    def on_error(self, name: str, exc: BaseException) -> None:
        """The recorder failed on an op that ran fine: count it and start a new block, so that the
        recorded program never contains a half-recorded op's consumers with a missing producer."""
        self.last_op = self.last_tags = None
        METRICS.record_errors[f"{name}: {type(exc).__name__}"] += 1
        if self.block is not None and self.recording is None:
            self.close_block("error")
        elif self.recording is not None:
            self.recording.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            self.close_block("error")

    def record_getitem(self, t, index, out) -> bool:
        """Basic indexing with a Python index (ints, slices with a positive step, None, Ellipsis)
        inside a record() scope, recorded as VM ops: one full-rank `slice`, a `squeeze` of the
        integer-indexed axes, `expand_dims` for each None; `out` (MindSpore's result) is bound to the
        last register. False for any other index: the caller treats it as a sync point. Used by tier
        2's learning recordings (frontend/regions.py), where indexing is an op of the program."""
        if self.recording is None:
            return False
        items = index if type(index) is tuple else (index,)
        shape = tuple(t.shape)
        n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
        if sum(1 for i in items if i is Ellipsis) > 1 or n_real > len(shape):
            return False
        full = []
        for i in items:
            if i is Ellipsis:
                full.extend([slice(None)] * (len(shape) - n_real))
            else:
                full.append(i)
        if Ellipsis not in items:
            full.extend([slice(None)] * (len(shape) - n_real))
        begin, end, step, drop, nones = [], [], [], [], []
        axis = pos = 0
        for i in full:
            if i is None:
                nones.append(pos)
                pos += 1
                continue
            n = shape[axis]
            if type(i) is int:
                k = i + n if i < 0 else i
                if not 0 <= k < n:
                    return False  # (eager raises: let it, as a sync point)
                begin.append(k), end.append(k + 1), step.append(1), drop.append(axis)
            elif type(i) is slice and all(type(v) in (int, type(None)) for v in (i.start, i.stop, i.step)):
                b, e, st = i.indices(n)
                if st <= 0:
                    return False
                begin.append(b), end.append(max(e, b)), step.append(st)
                pos += 1
            else:
                return False
            axis += 1
        dt = t._dtype
        cur = self._reg_of(t)
        block = self._open_block()
        cur_shape = shape
        if any((b, e, st) != (0, n, 1) for b, e, st, n in zip(begin, end, step, shape)):
            cur_shape = tuple(len(range(b, e, st)) for b, e, st in zip(begin, end, step))
            cur = self._emit(block, "slice", [cur], 1, {"begin": tuple(begin), "end": tuple(end),
                                                         "step": tuple(step)},
                             (_new_type(dt, cur_shape, True),))[0]
        if drop:
            cur_shape = tuple(d for a, d in enumerate(cur_shape) if a not in drop)
            cur = self._emit(block, "squeeze", [cur], 1, {"axis": tuple(drop)},
                             (_new_type(dt, cur_shape, True),))[0]
        for p in nones:
            cur_shape = cur_shape[:p] + (1,) + cur_shape[p:]
            cur = self._emit(block, "expand_dims", [cur], 1, {"axis": p}, (_new_type(dt, cur_shape, True),))[0]
        if cur_shape != tuple(out.shape):
            return False
        if cur == self._reg_of(t) and cur_shape == shape:  # x[...], x[:]: a copy of the whole tensor
            cur = self._emit(block, "reshape", [cur], 1, {"shape": cur_shape}, (_new_type(dt, cur_shape, True),))[0]
        self._bind(out, cur)
        # MindSpore's result is a view: an op reading it gets a contiguous copy with no tag, which
        # `_link_view` links back to this register.
        self._add_view(out, cur, tensor_type(out), read=True)
        return True

    # --- record() scopes --------------------------------------------------------------------------
    def begin_recording(self, rec: Recording) -> None:
        if self.recording is not None:
            raise RuntimeError("ms_dynvm.record() scopes do not nest")
        self.close_block("end")
        self._new_program()
        self.recording = rec
        self._update_links()
        METRICS.recordings += 1

    def end_recording(self) -> Recording:
        rec = self.recording
        self.close_block("end")
        prog = self.program
        # The latest tag of each result tensor says which register it holds now (a tensor written in
        # place holds a newer value than its first register).
        by_reg = {}
        for t in self._results:
            tag = t._get_user_data(_KEY)
            if tag is not None and tag[0] == self.epoch:
                by_reg.setdefault(int(tag[1]), t)
        prog.outputs = sorted(by_reg)
        rec.program = prog
        if rec._calls:
            prog.call_handler = rec.call_handler
        rec.outputs = [by_reg[r] for r in prog.outputs]
        rec._epoch = self.epoch
        self.recording = None
        self._update_links()
        self._new_program()
        return rec

