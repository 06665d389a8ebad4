"""Normalisation: one dispatched MindSpore op -> VM instructions (the frontend's op table).

The recorder calls `normalize(name, args)` for EVERY op that `MsDispatchMode` reports, with the op's
name (`func.name`) and its positional arguments exactly as dispatched. The answer is one of:

- a `Lowering`: `instrs` is a list of `(vm_op, operands, attrs)`; an operand is a MindSpore Tensor
  taken from `args`, a `Tmp(index, out)` (result `out` of instruction `index` of this lowering), or an
  immediate Python scalar (bool/int/float/None). `attrs` is complete for the VM op (every attribute of
  `opcodes.OPS[vm_op]`, defaults filled in) and holds tuples, never lists. `outputs` has one `Tmp` per
  result of the dispatched op, in the order MindSpore returns them (a single tensor -> one entry, a
  tuple or list of n tensors -> n entries). For an op in `INPLACE`, `outputs[0]` is ALSO the new value
  of the tensor it mutates (see `mutated_tensor`).
- `META`: an op with no tensor semantics (`typeof`, `make_range`, `sequence_len`, tuple helpers ...);
  it passes through and is not recorded.
- `None`: an unknown op, or an argument form this table does not understand (an unexpected type, a
  tensor where a constant is needed, an option the VM op cannot express). The recorder then records an
  opaque `call`. Nothing is ever guessed: every handler checks the types it relies on, and any failure
  while reading the arguments means None.

`lower(name, args)` is the same answer for the recorder's hot path, without the wrapping: a lowering
of one instruction whose single result is the op's result (most ops) comes back as the bare
`(vm_op, operands, attrs)` triple, which is what the handlers build.

`PLANNABLE` names the ops whose answer depends on nothing but the arguments (the non-tensor values,
the tensors' dtypes and shapes, which tensor is where): no handler of theirs reads the legacy
primitive (`_reads_prim` marks those that do) and none is in-place. The recorder caches their
lowerings per argument signature.

Cost: one dict lookup plus one small function per op. Handlers read tensor METADATA only where the VM
op needs a static attribute (`x.shape` for split sizes, full-rank slices, `Flatten`, `gather_d_grad`;
`x.dtype` for `NewOnes`/`InplaceCopy`); they never read a tensor's VALUE (that would force a sync):
0-d tensors stay tensor operands, and a tensor where a constant is required (`OneHot` depth, `Range`)
means None.

Argument forms (measured with MindSpore 2.10 CPU, see tests/frontend/test_normalize.py):
- Legacy primitives arrive as `args = (prim, name, (x, ...))`; some keep attributes only in
  `prim.attrs` (`Stack`/`Unstack` axis, `Tril` diagonal, `Conv2D`, `MaxPool`, `PadV3` mode).
  `normalize` unwraps them and hands the handler the inner tuple plus `prim`.
- Shapes, permutations and axis lists often arrive as LISTS (`Reshape(x, [6, 4])`, `Squeeze(x, [1])`,
  `Transpose(x, [0, 2, 1])`); they become tuples. An empty axis tuple/list means "all axes" for the
  reductions (`SumExt(x, ())`, `ReduceSum(x, ())`) and for `Squeeze`.
- Python scalars are often already 0-d tensors (`x + 2` -> `AddExt(x, T0d, 1)`, `x > 0` ->
  `Greater(x, T0d)`), sometimes plain numbers (`Muls(x, 2.5)`, `ClampScalar(x, -1, 1)`); both are kept
  as they come (tensor operand / immediate).
- Axes are kept exactly as given (negative allowed), except where the VM op needs a full-rank or
  positional form (`slice` begin/end/step, `transpose` perm from `TransposeExtView(x, d0, d1)`).
  `slice` uses Python slice semantics with None for "from the start"/"to the end", so an axis that
  is not sliced is (0, None, 1) and no static size is baked in (the registry accepts it over
  symbolic dims).
- dtype arguments are MindSpore type ids (`dtypes.TYPE_ID`); None means "default".

Lowerings that are not one-to-one (value-equal, by construction or by measurement):
- `AddExt/SubExt/AddScalar/SubScalar(x, y, alpha != 1)` -> `mul(y, alpha)`, then `add/sub`.
- `GeLU` (legacy nn.GELU / ops.gelu(approximate='tanh')) is the TANH approximation (measured: 3.7e-7
  from the tanh form, 4.7e-4 from the erf form) -> `gelu{approximate='tanh'}`; its backward `GeLUGrad`
  -> `gelu_grad{approximate='tanh'}`. `GeluExt(x, 0|1)` -> 'none'|'tanh'.
- `FastGeLU(x)` = x / (1 + exp(-1.702|x|)) * exp(0.851 (x - |x|)) = x * sigmoid(1.702 x)
  -> `mul`, `sigmoid`, `mul`.
- `SeLU(x)` -> `elu{alpha=1.6732632423543772}` then `mul(., 1.0507009873554805)`.
- Legacy `LayerNorm` returns (y, mean, variance) (measured: biased, without eps), like the VM's
  `layer_norm`. `LayerNormExt` (mint; documented as (y, mean, rstd), its CPU kernel fails to build)
  -> `layer_norm`, then rstd = `rsqrt(add(var, eps))`.
- `ArgMaxWithValue/ArgMinWithValue` return (indices, values): `max_with_index`/`min_with_index`
  with the outputs swapped. `MaxDim/MinDim` return (values, indices) and map directly.
- `LogSoftmaxGrad(y, dy, axis)` -> dy - exp(y) * sum(dy, axis, keepdims), exp(NaN) taken as +inf.
- `Dense(x, w, b)` -> `matmul{transpose_b}` + `bias_add{axis=-1}`.
- `BiasAdd(x, b)` with a bias of another dtype -> `cast` of b to x's dtype + `bias_add` (what
  MindSpore computes: a float32 bias Parameter under `Cell.to_float(float16)` is rounded first).
- `StridedSlice` with shrink_axis_mask -> `slice` + `squeeze` (ellipsis/new_axis masks: None).
- `FillV2(shape, value_tensor)` -> `broadcast_to` + `contiguous`.
- `Flatten` (legacy: keep dim 0) -> `reshape{shape=(x.shape[0], -1)}`.
- `AdaptiveAvgPool2D` with output_size (1, 1) -> `mean{axis=(-2, -1), keepdims}`.
- `Conv2D`/`MaxPool` pad_mode 'same' -> explicit TF-style padding (extra on bottom/right) computed
  from the static input shape.

In-place ops (`INPLACE`): MindSpore reports some in-place Tensor methods under dedicated names
(`x.copy_` -> `InplaceCopy`, `x.zero_` -> `InplaceZero`, `x.fill_` -> `InplaceFillScalar` /
`InplaceFillTensor`, `x.masked_fill_` -> `InplaceMaskedFillScalar`), and legacy Parameter updates
(`Assign`, `AssignAdd`, `ScatterAdd`, `IndexAdd` ...) mutate their first input too. Each is lowered (when it is)
to a value computation whose `outputs[0]` is the NEW value of the mutated tensor; the recorder must
rebind that tensor to it. The in-place ops lowered here: InplaceCopy (broadcast_to/cast/contiguous of
src), InplaceZero / InplaceFillScalar (`full_like`), InplaceFillTensor, InplaceMaskedFillScalar /
InplaceMaskedFillTensor (`masked_fill`), InplaceStopGradient (`identity`), Assign (`contiguous`),
AssignAdd / AssignSub (`add`/`sub`, same dtype only); the rest of INPLACE is recorded as opaque calls
(still in INPLACE so that the mutated tensor gets a new register). NOTE: many in-place METHODS are
reported under OUT-OF-PLACE names (`x.add_(1)` -> `AddExt`, `x.mul_(y)` -> `Mul`, measured); those
cannot be told apart here (they return the written tensor itself, so the recorder's tag on the
result is the mutated tensor's). For legacy-form ops the mutated tensor is `args[2][0]`, not
`args[0]`: use `mutated_tensor(name, args)`. Any other legacy primitive that MindSpore marks
`side_effect_mem` may write any of its tensor inputs (`side_effect_inputs`): the recorder forgets
their registers after the call, so their next use reads their new value.

Deliberately None (opaque): BatchNorm (mutates running stats), random ops other than legacy Dropout
(DropoutExt, InplaceUniform/Normal, ...), data-dependent shapes (NonZero, MaskedSelect), Range (tensor
bounds), OneHot with a tensor depth, Eye, Embedding, GroupNorm, RmsNorm, ReduceStd, PReLU,
MaxPoolWithArgmaxV2, AvgPool with padding, Scatter / TensorScatterElements without 'add', backward
kernels without a VM op (ReLU6Grad, HSwishGrad, EluGradExt, ...), and any op with kwargs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mindspore._c_expression import TensorPy
from mindspore.common.tensor import Tensor

from ms_dynvm.dtypes import TYPE_ID, from_mindspore_name, is_float, is_int, promote

__all__ = ["Tmp", "Lowering", "META", "INPLACE", "OVERWRITES", "PLANNABLE", "TENSOR_ARGS_IN_ORDER", "normalize", "lower",
           "mutated_tensor", "reads_target", "side_effect_inputs", "covered_names"]


class Tmp(NamedTuple):
    """Result `out` of the lowering's instruction number `index`."""

    index: int
    out: int = 0


class Lowering(NamedTuple):
    instrs: list  # [(vm_op, operands, attrs)]
    outputs: tuple  # one Tmp per result of the dispatched op


class _Meta:
    __slots__ = ()

    def __repr__(self) -> str:
        return "META"


META = _Meta()  # sentinel: no tensor semantics, pass through and do not record


class _Unsupported(Exception):
    """An argument form this table does not understand (normalize answers None)."""


# Anything a handler raises while reading its arguments means "not understood": None.
_REJECT = (_Unsupported, TypeError, ValueError, KeyError, IndexError, AttributeError)

_NUMBER_TYPES = frozenset({bool, int, float})
_OUT1 = (Tmp(0),)
_OUT_LAST2 = (Tmp(1),)


_IN_ORDER_HANDLERS: set = set()
_PRIM_HANDLERS: set = set()


def _in_order(h):
    """Marks a handler whose one-instruction lowerings take as tensor operands exactly the op's
    top-level tensor arguments, in order, and no other tensor (see TENSOR_ARGS_IN_ORDER)."""
    _IN_ORDER_HANDLERS.add(h)
    return h


def _reads_prim(h):
    """Marks a handler that reads the legacy primitive's attributes (`prim.attrs`): its lowering is
    not a function of the op's arguments alone (see PLANNABLE)."""
    _PRIM_HANDLERS.add(h)
    return h


# --- argument readers: return the value in VM form or raise _Unsupported -----------------------------
def _t(v):
    """A tensor operand."""
    if isinstance(v, Tensor):
        return v
    raise _Unsupported


def _tn(v):
    """A tensor operand or an immediate Python scalar."""
    if type(v) in _NUMBER_TYPES or isinstance(v, Tensor):
        return v
    raise _Unsupported


def _opt_t(v):
    if v is None or isinstance(v, Tensor):
        return v
    raise _Unsupported


def _num(v):
    if type(v) in _NUMBER_TYPES:
        return v
    raise _Unsupported


def _opt_num(v):
    if v is None or type(v) in _NUMBER_TYPES:
        return v
    raise _Unsupported


def _float(v) -> float:
    if type(v) is float or type(v) is int:
        return float(v)
    raise _Unsupported


def _int(v) -> int:
    if type(v) is int:
        return v
    raise _Unsupported


def _bool(v) -> bool:
    if type(v) is bool:
        return v
    raise _Unsupported


def _ints(v) -> tuple:
    """A tuple of ints from a tuple or list of ints (shapes, perms, multiples)."""
    if type(v) is tuple or type(v) is list:
        for e in v:
            if type(e) is not int:
                raise _Unsupported
        return tuple(v)
    raise _Unsupported


def _shape(v) -> tuple:
    if type(v) is int:
        return (v,)
    return _ints(v)


def _axes(v):
    """Reduction axes: None or () -> None (all axes); an int -> (int,); a tuple/list of ints."""
    if v is None:
        return None
    if type(v) is int:
        return (v,)
    t = _ints(v)
    return t if t else None


def _dtype(v) -> str:
    if type(v) is int:
        return TYPE_ID[v]
    raise _Unsupported


def _opt_dtype(v):
    return None if v is None else _dtype(v)


def _tensors(v) -> tuple:
    if type(v) is tuple or type(v) is list:
        for e in v:
            if type(e) is not Tensor and not isinstance(e, Tensor):
                raise _Unsupported
        return tuple(v)
    raise _Unsupported


_DTYPE_BY_ID: dict[int, str] = {}


def vm_dtype(ms_dtype) -> str:
    """VM dtype of a MindSpore dtype object. They are singletons and hashing one costs about 1 us, so
    they are looked up by id (the one place the frontend maps dtypes)."""
    name = _DTYPE_BY_ID.get(id(ms_dtype))
    if name is None:
        name = _DTYPE_BY_ID[id(ms_dtype)] = from_mindspore_name(str(ms_dtype))
    return name


def _vm_dtype(t) -> str:
    return vm_dtype(t.dtype)


def _dim_index(dim: int, rank: int) -> int:
    """A dim in [-rank, rank) as a position in [0, rank)."""
    if type(dim) is not int or not -rank <= dim < rank:
        raise _Unsupported
    return dim + rank if dim < 0 else dim


def _split_lowering(x, sizes: tuple, axis: int) -> Lowering:
    if not sizes:
        raise _Unsupported
    return Lowering([("split", (x,), {"axis": axis, "sizes": sizes})],
                    tuple(Tmp(0, i) for i in range(len(sizes))))


def _chunks_of(size: int, piece: int) -> tuple:
    """torch.split(split_size) sizes: full pieces then the remainder."""
    if piece <= 0 or size <= 0:
        raise _Unsupported
    n, rem = divmod(size, piece)
    return (piece,) * n + ((rem,) if rem else ())


def _full_slice(x, dim: int, begin: int, end, step: int) -> tuple:
    """`slice` of one axis; the others are whole ((0, None, 1): no static size baked in)."""
    rank = len(x.shape)
    d = _dim_index(dim, rank)
    b, e, s = [0] * rank, [None] * rank, [1] * rank
    b[d], e[d], s[d] = begin, end, step
    return ("slice", (x,), {"begin": tuple(b), "end": tuple(e), "step": tuple(s)})


# --- handler factories --------------------------------------------------------------------------
def _unary(op: str):
    def h(a, prim):
        (x,) = a
        if not isinstance(x, Tensor):
            raise _Unsupported
        return (op, (x,), {})

    return _in_order(h)


def _f32_scalar_for_f64(t, v):
    """A Python float `v` taken by a scalar-form op (Muls, Divs, EqScalar, ClampScalar, pow...) or
    a legacy binary primitive (Sub, RealDiv, FloorMod of `%`, TruncateMod: measured)
    with the float64 tensor `t`: MindSpore 2.10 holds the scalar as a float32 (measured: f64
    `t * 0.1` multiplies by 0.10000000149011612; an int stays exact), so the VM does too. Other
    dtypes compute in float32 or narrower anyway: `v` unchanged (so tier 1's size-derived scalars,
    1/N, keep their exact values there)."""
    if type(v) is float and _vm_dtype(t) == "f64":
        with np.errstate(over="ignore"):
            return float(np.float32(v))  # (beyond float32's range: +-inf, as MindSpore's)
    return v


def _binary(op: str):
    def h(a, prim):
        x, y = a
        # Numbers are told apart by their type first: isinstance(2.5, Tensor) goes through the
        # metaclass's __instancecheck__ (Tensor's is an ABCMeta), several times the cost.
        if type(x) in _NUMBER_TYPES:
            if not isinstance(y, Tensor):
                raise _Unsupported
            if type(x) is float:
                x = _f32_scalar_for_f64(y, x)
        elif not isinstance(x, Tensor) or not (type(y) in _NUMBER_TYPES or isinstance(y, Tensor)):
            raise _Unsupported
        elif type(y) is float:
            y = _f32_scalar_for_f64(x, y)
        return (op, (x, y), {})

    return _in_order(h)


def _binary_alpha(op: str):
    """AddExt/SubExt/AddScalar/SubScalar(x, y, alpha) = x op alpha*y."""

    def h(a, prim):
        x, y, alpha = a
        if type(alpha) is not int and type(alpha) is not float:
            raise _Unsupported
        xt = type(x) not in _NUMBER_TYPES
        yt = type(y) not in _NUMBER_TYPES
        if (xt and not isinstance(x, Tensor)) or (yt and not isinstance(y, Tensor)):
            raise _Unsupported
        if alpha == 1:
            if not (xt or yt):
                raise _Unsupported
            return (op, (x, y), {})
        if not yt:  # a scalar*alpha would need folding: leave it to MindSpore
            raise _Unsupported
        return Lowering([("mul", (y, alpha), {}), (op, (x, Tmp(0)), {})], _OUT_LAST2)

    return _in_order(h)


@_in_order
def _divmod(a, prim):
    x, y, mode = a
    if mode is None:
        op = "div"
    elif type(mode) is int and mode in _ROUNDING:
        op = _ROUNDING[mode]
    else:
        raise _Unsupported
    x, y = _tn(x), _tn(y)
    if type(x) in _NUMBER_TYPES and type(y) in _NUMBER_TYPES:
        raise _Unsupported
    if op == "trunc_div":
        # An integer result: MindSpore divides in floating point, truncates and casts back with
        # x86's conversion through int32 (int64 for int64): x // 0 is INT_MIN, 0 for int8/int16/
        # uint8, which wrap it from int32 (measured). The quotient is float32(double(x) / double(y))
        # for two tensors of one dtype and for int64 with a Python int (int32 16777217 // 1 is
        # 16777216, int64 2^40 + 1 // 1 is 2^40), float32(x) / float32(y) for int32 with a Python
        # int and for mixed operands (int32 and int64, int32 and bool: in their promoted dtype)
        # (measured ad hoc bit-equal on 3000 random pairs of each kind; the test checks 64 of each).
        dts = [vm_dtype(v.dtype) for v in (x, y) if type(v) not in _NUMBER_TYPES]
        dt = _tensors_dtype(dts)
        scalars = [v for v in (x, y) if type(v) in _NUMBER_TYPES]
        if dt in _INT_MIN_WRAPPED and all(type(v) is int for v in scalars):
            wide = (len(dts) == 2 and dts[0] == dts[1]) or (len(dts) == 1 and dt == "i64")
            f = "f64" if wide else "f32"
            xs = [("cast", (v,), {"dtype": f}) for v in (x, y) if type(v) not in _NUMBER_TYPES]
            opnds, k = [], 0
            for v in (x, y):
                if type(v) in _NUMBER_TYPES:
                    opnds.append(float(v))
                else:
                    opnds.append(Tmp(k))
                    k += 1
            steps = xs + [("div", tuple(opnds), {})]
            if wide:
                steps.append(("cast", (Tmp(k),), {"dtype": "f32"}))
                k += 1
            return Lowering(steps + [("trunc", (Tmp(k),), {}), ("cast", (Tmp(k + 1),), {"dtype": dt})],
                            (Tmp(k + 2),))
        if (len(dts) == 2 and all(is_float(d) for d in dts) and dts[0] != dts[1]
                and (x.ndim == 0) != (y.ndim == 0)):
            # A 0-d float tensor against a tensor of another float type: DivMod types it like a
            # scalar (f16[n] // f32[] -> f16, as mul/div do) and truncates the quotient rounded to
            # that type (f16: trunc(f16(f32(x) / f32(y))), measured bit-equal on 20,000 values;
            # TruncateDiv instead promotes to f32): div, then trunc.
            return Lowering([("div", (x, y), {}), ("trunc", (Tmp(0),), {})], _OUT_LAST2)
    return (op, (x, y), {})


def _tensors_dtype(dts: list) -> str:
    """The dtype of a binary op's result from its tensor operands' dtypes (one or two)."""
    return dts[0] if len(dts) == 1 else promote(dts[0], dts[1])


# x86's float -> int conversion of an out-of-range value (inf, NaN) to each integer dtype: INT_MIN
# through int32 (int64 for int64), wrapped to the narrow types.
_INT_MIN_WRAPPED = {"i32": -(1 << 31), "i64": -(1 << 63), "i16": 0, "i8": 0, "u8": 0}

_ROUNDING = {1: "trunc_div", 2: "floor_div"}  # mint.div rounding_mode: 'trunc' -> 1, 'floor' -> 2

_mod = _binary("mod")


def _remainder(a, prim):
    """MindSpore's Remainder* ops (`ops.remainder`) compute x - floor_div(x, y) * y with an exact
    (double) quotient and the product and difference in the operands' float dtype (measured
    bit-equal on float32), unlike FloorMod (`x % y`, `ops.floor_mod`), computed wholly in double:
    VM `mod`. Integer operands: `mod`."""
    low = _mod(a, None)
    x, y = low[1]
    if not any(type(v) is float or (type(v) not in _NUMBER_TYPES and is_float(vm_dtype(v.dtype)))
               for v in (x, y)):
        return low
    return Lowering([("floor_div", (x, y), {}), ("mul", (Tmp(0), y), {}), ("sub", (x, Tmp(1)), {})],
                    (Tmp(2),))


@_in_order
def _where(a, prim):
    c, x, y = a
    return ("where", (_t(c), _tn(x), _tn(y)), {})


@_in_order
def _masked_fill(a, prim):
    x, mask, value = a
    x = _t(x)
    if (type(value) not in _NUMBER_TYPES and vm_dtype(x.dtype) == "f64"
            and vm_dtype(_t(value).dtype) == "f32"):
        # MaskedFill of a float64 tensor with a float32 value (what `ops.masked_fill` makes of a Python
        # float) computes in float32 in MindSpore 2.10: the unmasked values come back rounded to
        # float32 (measured: 1e300 becomes inf).
        return Lowering([("cast", (x,), {"dtype": "f32"}), ("masked_fill", (Tmp(0), _t(mask), value), {}),
                         ("cast", (Tmp(1),), {"dtype": "f64"})], (Tmp(2),))
    return ("masked_fill", (x, _t(mask), _tn(value)), {})


@_in_order
def _clamp_scalar(a, prim):
    x, lo, hi = a
    x = _t(x)
    return ("clamp", (x, _f32_scalar_for_f64(x, _opt_num(lo)), _f32_scalar_for_f64(x, _opt_num(hi))), {})


@_in_order
def _clamp_tensor(a, prim):
    x, lo, hi = a
    return ("clamp", (_t(x), _opt_t(lo), _opt_t(hi)), {})


@_in_order
def _lerp(a, prim):
    x, y, w = a
    return ("lerp", (_t(x), _t(y), _tn(w)), {})


@_in_order
def _addcmul_ext(a, prim):
    x, t1, t2, value = a
    return ("addcmul", (_t(x), _t(t1), _t(t2)), {"value": _float(value)})


def _addcmul_legacy(a, prim):
    # Addcmul(x, t1, t2, value_tensor) = x + value * t1 * t2, value first cast to x's dtype
    # (measured: int32 x with value 1.7 multiplies by 1, with 0.5 by 0).
    x, t1, t2, value = a
    if isinstance(value, Tensor):
        return Lowering([("mul", (_t(t1), _t(t2)), {}),
                         ("cast", (value,), {"dtype": vm_dtype(_t(x).dtype)}),
                         ("mul", (Tmp(0), Tmp(1)), {}),
                         ("add", (_t(x), Tmp(2)), {})], (Tmp(3),))
    return Lowering([("mul", (_t(t1), _t(t2)), {}),
                     ("mul", (Tmp(0), _tn(value)), {}),
                     ("add", (_t(x), Tmp(1)), {})], (Tmp(2),))


@_in_order
def _cast(a, prim):
    x, dt = a
    return ("cast", (_t(x),), {"dtype": _dtype(dt)})


@_in_order
def _round(a, prim):
    x, decimals = a
    if decimals != 0 or type(decimals) is not int:
        raise _Unsupported
    return ("round", (_t(x),), {})


# --- activations --------------------------------------------------------------------------------
@_in_order
def _gelu_tanh(a, prim):
    (x,) = a
    return ("gelu", (_t(x),), {"approximate": "tanh"})


_GELU_MODE = {0: "none", 1: "tanh"}  # GeluExt(x, approximate): 'none' -> 0, 'tanh' -> 1


@_in_order
def _gelu_ext(a, prim):
    x, mode = a
    if type(mode) is not int:
        raise _Unsupported
    return ("gelu", (_t(x),), {"approximate": _GELU_MODE[mode]})


def _fast_gelu(a, prim):
    # FastGeLU(x) = x / (1 + exp(-1.702|x|)) * exp(0.851(x - |x|)) = x * sigmoid(1.702 x)
    (x,) = a
    _t(x)
    return Lowering([("mul", (x, 1.702), {}), ("sigmoid", (Tmp(0),), {}), ("mul", (x, Tmp(1)), {})],
                    (Tmp(2),))


@_in_order
def _elu(a, prim):
    x, alpha = a
    return ("elu", (_t(x),), {"alpha": _float(alpha)})


def _selu(a, prim):
    # selu(x) = scale * elu(x, alpha); MindSpore's integer SeLU is not that (int32 [-3, -1] gives
    # [0, 0], the float formula truncated gives [-1, -1]): opaque
    (x,) = a
    if not is_float(_vm_dtype(_t(x))):
        raise _Unsupported
    return Lowering([("elu", (_t(x),), {"alpha": 1.6732632423543772}),
                     ("mul", (Tmp(0), 1.0507009873554805), {})], _OUT_LAST2)


@_in_order
def _softplus_legacy(a, prim):
    (x,) = a
    return ("softplus", (_t(x),), {"beta": 1.0, "threshold": 20.0})


@_in_order
def _softplus_ext(a, prim):
    x, beta, threshold = a
    return ("softplus", (_t(x),), {"beta": _float(beta), "threshold": _float(threshold)})


@_in_order
def _leaky_relu_ext(a, prim):
    x, slope = a
    return ("leaky_relu", (_t(x),), {"alpha": _float(slope)})


def _softmax(op: str):
    def h(a, prim):
        x, axis = a
        if type(axis) is tuple or type(axis) is list:
            if len(axis) != 1:
                raise _Unsupported
            axis = axis[0]
        return (op, (_t(x),), {"axis": _int(axis)})

    return _in_order(h)


@_in_order
def _log_softmax_ext(a, prim):
    x, dim, dt = a
    if dt is not None:
        raise _Unsupported
    return ("log_softmax", (_t(x),), {"axis": _int(dim)})


def _log_softmax_grad(a, prim):
    # d/dx log_softmax: dx = dy - exp(y) * sum(dy, axis, keepdims), where MindSpore's kernel (oneDNN)
    # on AVX-512 processors takes exp(NaN) as +inf (measured: y = [nan, -1] gives -inf, +inf or NaN
    # at the NaN for a positive, negative or zero sum of dy); on AVX2 ones oneDNN's exp gives NaN
    # there. The VM follows the AVX-512 rule on every processor (docs/numerics.md).
    y, dy, axis = a
    _t(y)
    _t(dy)
    return Lowering([("isnan", (y,), {}),
                     ("where", (Tmp(0), float("inf"), y), {}),
                     ("exp", (Tmp(1),), {}),
                     ("sum", (dy,), {"axis": (_int(axis),), "keepdims": True, "dtype": None}),
                     ("mul", (Tmp(2), Tmp(3)), {}),
                     ("sub", (dy, Tmp(4)), {})], (Tmp(5),))


def _softmax_backward(a, prim):
    dout, out, dim = a
    return ("softmax_grad", (_t(out), _t(dout)), {"axis": _int(dim)})


# --- reductions ---------------------------------------------------------------------------------
def _reduce_dtype(op: str):
    """SumExt/MeanExt/ProdExt(x, axis, keepdims, dtype)."""

    def h(a, prim):
        x, axis, keep, dt = a
        return (op, (_t(x),), {"axis": _axes(axis), "keepdims": _bool(keep),
                                   "dtype": _opt_dtype(dt)})

    return _in_order(h)


def _legacy_sum_dtype(x):
    """The `dtype` attribute of a legacy ReduceSum/ReduceProd: it keeps a bool or integer input's
    dtype (measured: int8 ... int64, uint8, bool), where the VM's sum/prod default to i64."""
    dt = _vm_dtype(_t(x))
    return dt if dt == "bool" or is_int(dt) else None


@_in_order
def _reduce_sum_legacy(a, prim):
    x, axis, keep, skip_mode = a
    if skip_mode is not False:
        raise _Unsupported
    return ("sum", (_t(x),), {"axis": _axes(axis), "keepdims": _bool(keep), "dtype": _legacy_sum_dtype(x)})


def _reduce_legacy_dtype(op: str):
    """ReduceMean/ReduceProd(x, axis, keepdims)."""

    def h(a, prim):
        x, axis, keep = a
        return (op, (_t(x),), {"axis": _axes(axis), "keepdims": _bool(keep),
                               "dtype": _legacy_sum_dtype(x) if op == "prod" else None})

    return _in_order(h)


def _reduce_plain(op: str):
    """ReduceMax/ReduceMin/ReduceAll/ReduceAny/AnyExt(x, axis, keepdims)."""

    def h(a, prim):
        x, axis, keep = a
        return (op, (_t(x),), {"axis": _axes(axis), "keepdims": _bool(keep)})

    return _in_order(h)


def _reduce_all_axes(op: str):
    """Max(x) / Min(x) / Any(x): reduce everything."""

    def h(a, prim):
        (x,) = a
        return (op, (_t(x),), {"axis": None, "keepdims": False})

    return _in_order(h)


def _with_index(op: str, indices_first: bool):
    outs = (Tmp(0, 1), Tmp(0, 0)) if indices_first else (Tmp(0, 0), Tmp(0, 1))

    def h(a, prim):
        x, axis, keep = a
        return Lowering([(op, (_t(x),), {"axis": _int(axis), "keepdims": _bool(keep)})], outs)

    return h


def _arg_legacy(op: str):
    """Argmax/Argmin(x, axis, output_type_id)."""

    def h(a, prim):
        x, axis, dt = a
        return (op, (_t(x),), {"axis": _int(axis), "keepdims": False, "dtype": _dtype(dt)})

    return _in_order(h)


def _arg_ext(op: str):
    """ArgMaxExt/ArgMinExt(x, dim | None, keepdim) -> int64 indices."""

    def h(a, prim):
        x, dim, keep = a
        if dim is not None:
            _int(dim)
        return (op, (_t(x),), {"axis": dim, "keepdims": _bool(keep), "dtype": "i64"})

    return _in_order(h)


@_in_order
def _var(a, prim):
    x, dim, correction, keep = a
    return ("var", (_t(x),), {"axis": _axes(dim), "keepdims": _bool(keep),
                                  "correction": _int(correction)})


@_in_order
def _logsumexp(a, prim):
    x, dim, keep = a
    axis = _axes(dim)
    if axis is None:
        raise _Unsupported
    return ("logsumexp", (_t(x),), {"axis": axis, "keepdims": _bool(keep)})


# --- normalisation ------------------------------------------------------------------------------
def _layer_norm_legacy(a, prim):
    # LayerNorm(x, gamma, beta, begin_norm_axis, begin_params_axis, eps) -> (y, mean, variance):
    # the VM's layer_norm has the same three results.
    x, gamma, beta, bna, bpa, eps = a
    return Lowering([("layer_norm", (_t(x), _t(gamma), _t(beta)),
                      {"begin_norm_axis": _int(bna), "begin_params_axis": _int(bpa), "eps": _float(eps)})],
                    (Tmp(0, 0), Tmp(0, 1), Tmp(0, 2)))


def _layer_norm_ext(a, prim):
    # LayerNormExt(x, normalized_shape, weight, bias, eps) -> (y, mean, rstd); rstd = rsqrt(var + eps)
    x, normalized_shape, gamma, beta, eps = a
    n = len(_shape(normalized_shape))
    if n == 0:
        raise _Unsupported
    eps = _float(eps)
    return Lowering([("layer_norm", (_t(x), _t(gamma), _t(beta)),
                      {"begin_norm_axis": -n, "begin_params_axis": -n, "eps": eps}),
                     ("add", (Tmp(0, 2), eps), {}),
                     ("rsqrt", (Tmp(1),), {})],
                    (Tmp(0, 0), Tmp(0, 1), Tmp(2)))


def _softmax_ce(a, prim):
    logits, labels = a
    return Lowering([("softmax_cross_entropy", (_t(logits), _t(labels)), {})], (Tmp(0, 0), Tmp(0, 1)))


# --- views and layout ---------------------------------------------------------------------------
@_in_order
def _reshape(a, prim):
    x, shape = a
    return ("reshape", (_t(x),), {"shape": _shape(shape)})


@_in_order
def _flatten_legacy(a, prim):
    (x,) = a
    shape = _t(x).shape
    if len(shape) == 0:
        raise _Unsupported
    if 0 in shape:  # -1 is ambiguous for an empty tensor: MindSpore keeps the other dims' product
        rest = 1
        for d in shape[1:]:
            rest *= d
        return ("reshape", (x,), {"shape": (shape[0], rest)})
    return ("reshape", (x,), {"shape": (shape[0], -1)})


@_in_order
def _transpose(a, prim):
    x, perm = a
    return ("transpose", (_t(x),), {"perm": _ints(perm)})


@_in_order
def _transpose_ext(a, prim):
    x, d0, d1 = a
    rank = len(_t(x).shape)
    i, j = _dim_index(d0, rank), _dim_index(d1, rank)
    perm = list(range(rank))
    perm[i], perm[j] = perm[j], perm[i]
    return ("transpose", (x,), {"perm": tuple(perm)})


@_in_order
def _expand_dims(a, prim):
    x, axis = a
    return ("expand_dims", (_t(x),), {"axis": _int(axis)})


@_in_order
def _squeeze(a, prim):
    x, axis = a
    axes = _axes(axis)
    if axes is not None:
        # MindSpore leaves a named dim that is not 1 in place (`mint.squeeze(x, 1)` on [3, 2] is
        # [3, 2]): only the dims of size 1 are squeezed.
        shape = tuple(_t(x).shape)
        rank = len(shape)
        if rank and all(-rank <= ax < rank for ax in axes):
            kept = tuple(ax for ax in axes if shape[ax % rank] == 1)
            if not kept:
                return ("reshape", (_t(x),), {"shape": shape})
            axes = kept
    return ("squeeze", (_t(x),), {"axis": axes})


@_in_order
def _broadcast_to(a, prim):
    x, shape = a
    return ("broadcast_to", (_t(x),), {"shape": _shape(shape)})


def _strided_slice(a, prim):
    # StridedSlice(x, begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask,
    # shrink_axis_mask), all masks ints. A masked begin/end is None (Python slice default); axes past
    # len(begin) are whole; a shrunk axis is sliced to one element and squeezed.
    x, begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_mask = a
    begin, end, strides = _ints(begin), _ints(end), _ints(strides)
    begin_mask, end_mask, shrink_mask = _int(begin_mask), _int(end_mask), _int(shrink_mask)
    if _int(ellipsis_mask) or _int(new_axis_mask):
        raise _Unsupported
    shape = tuple(_t(x).shape)
    n = len(begin)
    if len(end) != n or len(strides) != n or n > len(shape):
        raise _Unsupported
    b, e, s = [0] * len(shape), [None] * len(shape), [1] * len(shape)
    shrunk = []
    for i in range(n):
        step = strides[i]
        if step == 0:
            raise _Unsupported
        if shrink_mask >> i & 1:
            if begin_mask >> i & 1:  # MindSpore then takes index 0 whatever begin says: not modelled
                raise _Unsupported
            dim = shape[i]
            k = begin[i] + dim if begin[i] < 0 else begin[i]
            if not 0 <= k < dim:
                raise _Unsupported
            b[i], e[i] = k, k + 1
            shrunk.append(i)
            continue
        s[i] = step
        b[i] = None if begin_mask >> i & 1 else begin[i]
        e[i] = None if end_mask >> i & 1 else end[i]
        if step < 0 and (b[i] is None or e[i] is None or not -shape[i] <= b[i] < shape[i]
                         or not -shape[i] <= e[i] < shape[i]):
            # Negative strides: MindSpore's CPU kernel neither clamps out-of-range bounds (it reads
            # past the axis) nor treats masked bounds as Python does (measured); only in-range
            # bounds match a Python slice.
            raise _Unsupported
    instrs = [("slice", (x,), {"begin": tuple(b), "end": tuple(e), "step": tuple(s)})]
    if shrunk:
        instrs.append(("squeeze", (Tmp(0),), {"axis": tuple(shrunk)}))
    return Lowering(instrs, (Tmp(len(instrs) - 1),))


@_in_order
def _slice_legacy(a, prim):
    # Slice(x, begin, size): size -1 = to the end
    x, begin, size = a
    begin, size = _ints(begin), _ints(size)
    rank = len(_t(x).shape)
    if len(begin) != rank or len(size) != rank:
        raise _Unsupported
    end = []
    for bi, si in zip(begin, size):
        if bi < 0 or si < -1:
            raise _Unsupported
        end.append(None if si == -1 else bi + si)
    return ("slice", (x,), {"begin": begin, "end": tuple(end), "step": (1,) * rank})


@_in_order
def _narrow(a, prim):
    x, dim, start, length = a
    shape = tuple(_t(x).shape)
    d = _dim_index(dim, len(shape))
    start, length = _int(start), _int(length)
    if start < 0:
        start += shape[d]
    if start < 0 or length < 0:
        raise _Unsupported
    return _full_slice(x, dim, start, start + length, 1)


@_in_order
def _slice_ext(a, prim):
    x, dim, start, end, step = a
    if _int(step) <= 0:
        raise _Unsupported
    return _full_slice(_t(x), dim, _int(start), _int(end), step)


@_in_order
def _select_ext(a, prim):
    x, dim, index = a
    shape = tuple(_t(x).shape)
    d = _dim_index(dim, len(shape))
    index = _int(index)
    if not -shape[d] <= index < shape[d]:
        raise _Unsupported
    return ("select", (x,), {"axis": dim, "index": index + shape[d] if index < 0 else index})


def _split(a, prim):
    # Split(x, axis, output_num): equal pieces
    x, axis, n = a
    shape = tuple(_t(x).shape)
    size = shape[_dim_index(axis, len(shape))]
    n = _int(n)
    if n <= 0 or size % n:
        raise _Unsupported
    return _split_lowering(x, (size // n,) * n, axis)


def _split_tensor(a, prim):
    # SplitTensor(x, split_size, dim)
    x, piece, dim = a
    shape = tuple(_t(x).shape)
    return _split_lowering(x, _chunks_of(shape[_dim_index(dim, len(shape))], _int(piece)), dim)


def _split_with_size(a, prim):
    x, sizes, dim = a
    shape = tuple(_t(x).shape)
    sizes = _ints(sizes)
    if sum(sizes) != shape[_dim_index(dim, len(shape))] or min(sizes, default=-1) < 0:
        raise _Unsupported
    return _split_lowering(x, sizes, dim)


def _chunk(a, prim):
    # Chunk(x, chunks, dim): pieces of ceil(size / chunks), as torch.chunk
    x, chunks, dim = a
    shape = tuple(_t(x).shape)
    size = shape[_dim_index(dim, len(shape))]
    chunks = _int(chunks)
    if chunks <= 0:
        raise _Unsupported
    return _split_lowering(x, _chunks_of(size, -(-size // chunks)), dim)


def _unstack_n(x, axis) -> Lowering:
    shape = tuple(_t(x).shape)
    n = shape[_dim_index(axis, len(shape))]
    if n == 0:
        raise _Unsupported
    return Lowering([("unstack", (x,), {"axis": axis})], tuple(Tmp(0, i) for i in range(n)))


@_reads_prim
def _unstack_legacy(a, prim):
    (x,) = a
    return _unstack_n(x, _int(prim.attrs["axis"]))


def _unstack_ext(a, prim):
    x, dim = a
    return _unstack_n(x, _int(dim))


def _addn(a, prim):
    """AddN((t0, t1, ...)): MindSpore adds left to right in the tensors' dtype (measured: bit-equal to
    ((t0 + t1) + t2) + ...), so it lowers to that chain of adds. One tensor: opaque (rare)."""
    (ts,) = a
    ts = _tensors(ts)
    if len(ts) < 2:
        raise _Unsupported
    instrs = [("add", (ts[0], ts[1]), {})]
    for k, t in enumerate(ts[2:]):
        instrs.append(("add", (Tmp(k), t), {}))
    return Lowering(instrs, (Tmp(len(instrs) - 1),))


@_reads_prim
def _stack_legacy(a, prim):
    (ts,) = a
    return ("stack", _tensors(ts), {"axis": _int(prim.attrs["axis"])})


def _stack_ext(a, prim):
    ts, dim = a
    return ("stack", _tensors(ts), {"axis": _int(dim)})


def _concat(a, prim):
    ts, axis = a
    return ("concat", _tensors(ts), {"axis": _int(axis)})


@_in_order
def _tile(a, prim):
    x, multiples = a
    return ("tile", (_t(x),), {"multiples": _shape(multiples)})


def _tril_triu(op: str):
    @_reads_prim
    def h(a, prim):
        if prim is not None and len(a) == 1:  # legacy Tril(x), diagonal in prim.attrs
            (x,) = a
            diagonal = prim.attrs["diagonal"]
        else:
            x, diagonal = a
        return (op, (_t(x),), {"diagonal": _int(diagonal)})

    return _in_order(h)


@_in_order
def _cumsum_legacy(a, prim):
    x, axis, exclusive, reverse = a
    if exclusive is not False or reverse is not False:
        raise _Unsupported
    return ("cumsum", (_t(x),), {"axis": _int(axis), "dtype": None})


@_in_order
def _cumprod_legacy(a, prim):
    x, axis, exclusive, reverse = a
    return ("cumprod", (_t(x),), {"axis": _int(axis), "exclusive": _bool(exclusive), "reverse": _bool(reverse)})


@_in_order
def _nan_to_num(a, prim):
    """NanToNum(x, nan, posinf, neginf): a None nan is 0 (MindSpore's default), None infinities
    the dtype's largest / lowest finite value (resolved by the VM op)."""
    x, nan, posinf, neginf = a
    nan, posinf, neginf = (None if v is None else float(v) for v in map(_opt_num, (nan, posinf, neginf)))
    return ("nan_to_num", (_t(x),), {"nan": 0.0 if nan is None else nan, "posinf": posinf, "neginf": neginf})


@_in_order
def _cumsum_ext(a, prim):
    x, dim, dt = a
    return ("cumsum", (_t(x),), {"axis": _int(dim), "dtype": _opt_dtype(dt)})


@_in_order
def _reverse(a, prim):
    x, axis = a
    axes = _axes(axis)
    if axes is None:
        raise _Unsupported
    return ("flip", (_t(x),), {"axis": axes})


def _torch_pads(pads: tuple, rank: int) -> tuple:
    """torch-style flat pads (last dim first, (before, after) pairs) -> ((before, after), ...) per dim."""
    if len(pads) % 2 or len(pads) // 2 > rank or min(pads, default=0) < 0:
        raise _Unsupported
    out = [(0, 0)] * rank
    for k in range(len(pads) // 2):
        out[rank - 1 - k] = (pads[2 * k], pads[2 * k + 1])
    return tuple(out)


@_reads_prim
@_in_order
def _pad_v3(a, prim):
    x, paddings, value = a
    attrs = prim.attrs
    if attrs.get("mode") != "constant" or attrs.get("paddings_contiguous") is not True:
        raise _Unsupported
    if value is None:
        raise _Unsupported
    return ("pad", (_t(x), _tn(value)), {"pads": _torch_pads(_ints(paddings), len(x.shape))})


@_in_order
def _constant_pad_nd(a, prim):
    x, pads, value = a
    return ("pad", (_t(x), _num(value)), {"pads": _torch_pads(_ints(pads), len(x.shape))})


# --- gather / scatter ---------------------------------------------------------------------------
@_in_order
def _gather(a, prim):
    x, idx, axis, batch_dims = a
    return ("gather", (_t(x), _t(idx)), {"axis": _int(axis), "batch_dims": _int(batch_dims)})


@_in_order
def _gather_d(a, prim):
    x, dim, idx = a
    return ("gather_d", (_t(x), _t(idx)), {"dim": _int(dim)})


@_in_order
def _gather_nd(a, prim):
    x, idx = a
    return ("gather_nd", (_t(x), _t(idx)), {})


@_in_order
def _index_select(a, prim):
    x, dim, idx = a
    return ("index_select", (_t(x), _t(idx)), {"axis": _int(dim)})


def _scatter_nd(op: str):
    def h(a, prim):
        x, idx, upd = a
        return (op, (_t(x), _t(idx), _t(upd)), {})

    return _in_order(h)


@_in_order
def _scatter_nd_into_zeros(a, prim):
    """ScatterNd(indices, updates, shape) = tensor_scatter_add(zeros(shape), indices, updates): the
    duplicates add, as MindSpore's. Bool updates (MindSpore ors the duplicates) and float16/bfloat16
    ones (MindSpore adds the duplicates in float32 and rounds once; tensor_scatter_add rounds every
    add, as MindSpore's own TensorScatterAdd) stay opaque."""
    idx, upd, shape = a
    dt = _vm_dtype(_t(upd))
    if dt in ("bool", "f16", "bf16"):
        raise _Unsupported
    return Lowering([("fill", (), {"shape": _shape(shape), "dtype": dt, "value": 0}),
                     ("tensor_scatter_add", (Tmp(0), _t(idx), upd), {})], _OUT_LAST2)


# Losses: MindSpore's Reduction enum as dispatched (0 sum, 1 mean, 2 none).
_LOSS_REDUCTION = {0: "sum", 1: "mean", 2: "none"}


def _loss_reduced(instrs: list, reduction) -> Lowering:
    """`instrs` (the elementwise loss last) followed by the dispatched reduction."""
    r = _LOSS_REDUCTION.get(reduction) if type(reduction) is int else None
    if r is None:
        raise _Unsupported
    if r != "none":
        instrs.append((r, (Tmp(len(instrs) - 1),), {"axis": None, "keepdims": False, "dtype": None}))
    return Lowering(instrs, (Tmp(len(instrs) - 1),))


def _f32_only(*tensors) -> None:
    """The loss lowerings below follow MindSpore's float32 kernels; other dtypes stay opaque calls."""
    for v in tensors:
        if v is not None and _vm_dtype(_t(v)) != "f32":
            raise _Unsupported


@_in_order
def _reduce_std(a, prim):
    """ReduceStd(x, axis, unbiased, keep_dims) -> (std, mean): sqrt of var (correction 1 if unbiased)
    and the mean (ops.std, ops.std_mean, Tensor.std)."""
    x, axis, unbiased, keep = a
    attrs = {"axis": _axes(axis), "keepdims": _bool(keep)}
    return Lowering([("mean", (_t(x),), {**attrs, "dtype": None}),
                     ("var", (x,), {**attrs, "correction": 1 if _bool(unbiased) else 0}),
                     ("sqrt", (Tmp(1),), {})], (Tmp(2), Tmp(0)))


@_in_order
def _bce_with_logits(a, prim):
    """BCEWithLogitsLoss(x, y, weight, pos_weight, reduction): w * ((1 - y) * x + (1 + (pw - 1) * y) *
    softplus(-x)), then the reduction (MindSpore's formula, whose log1p(exp(-|x|)) + max(-x, 0) is
    softplus(-x); float32 only). Not built on the VM's exp and log1p: those follow MindSpore's own Exp
    and Log1p ops, up to 1e-6 off on these values, where its BCE kernel is accurate (built on them, the
    loss was 18 ulp off, measured)."""
    x, y, w, pw, reduction = a
    _f32_only(x, y, w, pw)
    ins = [("neg", (x,), {}), ("softplus", (Tmp(0),), {"beta": 1.0, "threshold": 20.0})]
    sp = Tmp(1)
    if pw is not None:
        ins += [("sub", (pw, 1), {}), ("mul", (Tmp(2), y), {}), ("add", (Tmp(3), 1), {}), ("mul", (Tmp(4), sp), {})]
        sp = Tmp(5)
    n = len(ins)
    ins += [("sub", (1, y), {}), ("mul", (Tmp(n), x), {}), ("add", (Tmp(n + 1), sp), {})]
    if w is not None:
        ins.append(("mul", (w, Tmp(n + 2)), {}))
    return _loss_reduced(ins, reduction)


@_in_order
def _smooth_l1_loss(a, prim):
    """SmoothL1Loss(p, t, beta, reduction): d = |p - t|; 0.5 * d * d / beta where d < beta, else
    d - 0.5 * beta (bit-equal to MindSpore's float32 kernel, measured); then the reduction."""
    p, t, beta, reduction = a
    _f32_only(p, t)
    if type(beta) is not float or not beta > 0:
        raise _Unsupported
    ins = [("sub", (p, t), {}), ("abs", (Tmp(0),), {}), ("lt", (Tmp(1), beta), {}), ("mul", (0.5, Tmp(1)), {}),
           ("mul", (Tmp(3), Tmp(1)), {}), ("div", (Tmp(4), beta), {}), ("sub", (Tmp(1), 0.5 * beta), {}),
           ("where", (Tmp(2), Tmp(5), Tmp(6)), {})]
    return _loss_reduced(ins, reduction)


@_in_order
def _smooth_l1_loss_grad(a, prim):
    """SmoothL1LossGrad(p, t, dout, beta, reduction) for reductions none and sum: with x = p - t,
    -dout where x < -beta, dout where x > beta, else x / beta * dout (bit-equal to MindSpore's
    float32 kernel, NaN included). (mean divides by the element count: an opaque call.)"""
    p, t, dout, beta, reduction = a
    _f32_only(p, t, dout)
    if type(beta) is not float or not beta > 0 or type(reduction) is not int or reduction not in (0, 2):
        raise _Unsupported
    ins = [("sub", (p, t), {}), ("div", (Tmp(0), beta), {}), ("mul", (Tmp(1), dout), {}),
           ("gt", (Tmp(0), beta), {}), ("where", (Tmp(3), dout, Tmp(2)), {}), ("lt", (Tmp(0), -beta), {}),
           ("neg", (dout,), {}), ("where", (Tmp(5), Tmp(6), Tmp(4)), {})]
    return Lowering(ins, (Tmp(7),))


@_in_order
def _scatter_add_ext(a, prim):
    x, dim, idx, src = a
    return ("scatter_add", (_t(x), _t(idx), _t(src)), {"dim": _int(dim)})


@_in_order
def _tensor_scatter_elements(a, prim):
    x, idx, upd, axis, reduction = a
    if reduction != 1 or type(reduction) is not int:  # 'add' -> 1; 'none' is a plain scatter
        raise _Unsupported
    return ("scatter_add", (_t(x), _t(idx), _t(upd)), {"dim": _int(axis)})


def _unsorted_segment(op: str):
    @_in_order
    def handler(a, prim):
        x, ids, num = a
        return (op, (_t(x), _t(ids)), {"num_segments": _int(num)})
    return handler


_unsorted_segment_sum = _unsorted_segment("unsorted_segment_sum")


@_in_order
def _one_hot(a, prim):
    idx, depth, on, off, axis = a
    return ("one_hot", (_t(idx), _tn(on), _tn(off)), {"depth": _int(depth), "axis": _int(axis)})


# --- linear algebra, convolution ----------------------------------------------------------------
@_in_order
def _matmul_flags(a, prim):
    x, y, ta, tb = a
    return ("matmul", (_t(x), _t(y)), {"transpose_a": _bool(ta), "transpose_b": _bool(tb)})


@_in_order
def _matmul_plain(a, prim):
    x, y = a
    return ("matmul", (_t(x), _t(y)), {"transpose_a": False, "transpose_b": False})


@_in_order
def _dense(a, prim):
    x, w, b = a
    mm = ("matmul", (_t(x), _t(w)), {"transpose_a": False, "transpose_b": True})
    if b is None:
        return Lowering([mm], _OUT1)
    return Lowering([mm, ("bias_add", (Tmp(0), _t(b)), {"axis": -1})], _OUT_LAST2)


_BIAS_AXIS = {0: 1, 1: -1}  # BiasAdd data_format: NCHW -> 0 (channels at 1), NHWC -> 1 (last)


@_in_order
def _bias_add(a, prim):
    x, b, fmt = a
    if type(fmt) is not int:
        raise _Unsupported
    axis = _BIAS_AXIS[fmt]
    xd = _vm_dtype(_t(x))
    if _vm_dtype(_t(b)) != xd:
        # MindSpore rounds the bias to x's dtype first (a float32 Parameter under Cell.to_float(float16)
        # or amp O2: that Cast is not dispatched), then adds in x's dtype.
        return Lowering([("cast", (b,), {"dtype": xd}), ("bias_add", (x, Tmp(0)), {"axis": axis})], _OUT_LAST2)
    return ("bias_add", (x, b), {"axis": axis})


def _hw(v) -> tuple:
    """(h, w) from an NCHW attribute of length 4 (1, 1, h, w) or length 2."""
    v = _shape(v)
    if len(v) == 4:
        v = v[2:]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        raise _Unsupported
    return v


def _same_pads(in_hw, k_hw, s_hw, d_hw) -> tuple:
    """TF 'SAME' padding (extra on bottom/right): (top, bottom, left, right)."""
    out = []
    for size, k, s, d in zip(in_hw, k_hw, s_hw, d_hw):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        out += [total // 2, total - total // 2]
    return tuple(out)


@_reads_prim
@_in_order
def _conv2d(a, prim):
    x, w = a
    at = prim.attrs
    if at.get("data_format", "NCHW") != "NCHW" or at.get("mode", 1) != 1:
        raise _Unsupported
    stride, dilation = _hw(at["stride"]), _hw(at["dilation"])
    groups = _int(at.get("group", at.get("groups", 1)))
    mode = str(at["pad_mode"]).lower()
    xs, ws = tuple(_t(x).shape), tuple(_t(w).shape)
    if len(xs) != 4 or len(ws) != 4:
        raise _Unsupported
    if mode == "valid":
        padding = (0, 0, 0, 0)
    elif mode == "pad":
        padding = _ints(at["pad"])
        if len(padding) != 4:
            raise _Unsupported
    elif mode == "same":
        padding = _same_pads(xs[2:], ws[2:], stride, dilation)
    else:
        raise _Unsupported
    return ("conv2d", (x, w), {"stride": stride, "padding": padding, "dilation": dilation,
                                   "groups": groups})


@_reads_prim
@_in_order
def _max_pool(a, prim):
    (x,) = a
    at = prim.attrs
    if at.get("data_format", "NCHW") != "NCHW":
        raise _Unsupported
    kernel, stride = _hw(at["kernel_size"]), _hw(at["strides"])
    mode = str(at["pad_mode"]).upper()
    xs = tuple(_t(x).shape)
    if len(xs) != 4:
        raise _Unsupported
    if mode == "VALID":
        padding = (0, 0, 0, 0)
    elif mode == "SAME":
        padding = _same_pads(xs[2:], kernel, stride, (1, 1))
    else:
        raise _Unsupported
    return ("max_pool2d", (x,), {"kernel": kernel, "stride": stride, "padding": padding})


@_in_order
def _avg_pool(a, prim):
    # AvgPool(x, kernel, strides, pad_mode, data_format): pad_mode VALID -> 2, NCHW -> 0
    x, kernel, strides, pad_mode, fmt = a
    if pad_mode != 2 or fmt != 0 or len(_t(x).shape) != 4:
        raise _Unsupported
    return ("avg_pool2d", (x,), {"kernel": _hw(kernel), "stride": _hw(strides),
                                     "padding": (0, 0, 0, 0)})


@_reads_prim
@_in_order
def _adaptive_avg_pool2d(a, prim):
    (x,) = a
    if tuple(prim.attrs.get("output_size", ())) != (1, 1) or len(_t(x).shape) < 3:
        raise _Unsupported
    return ("mean", (x,), {"axis": (-2, -1), "keepdims": True, "dtype": None})


def _dropout(a, prim):
    x, keep_prob, seed0, seed1 = a
    _int(seed0)
    _int(seed1)
    keep = _float(keep_prob)
    if not 0.0 <= keep <= 1.0:
        raise _Unsupported
    return Lowering([("dropout", (_t(x),), {"p": 1.0 - keep})], (Tmp(0, 0), Tmp(0, 1)))


# --- creation -----------------------------------------------------------------------------------
def _fill_value(dtype: str, v: int):
    """1/0 in the dtype's kind: True/False, 1/0 or 1.0/0.0."""
    if dtype == "bool":
        return bool(v)
    if dtype in ("i8", "i16", "i32", "i64", "u8"):
        return v
    return float(v)


def _ones_zeros(value: int):
    def h(a, prim):
        shape, dt = a
        dtype = "f32" if dt is None else _dtype(dt)  # measured: Ones((2, 3), None) -> float32
        return Lowering([("fill", (), {"shape": _shape(shape), "dtype": dtype,
                                       "value": _fill_value(dtype, value)})], _OUT1)

    return _in_order(h)


def _like_legacy(value: int):
    def h(a, prim):
        (x,) = a
        return ("full_like", (_t(x),), {"value": value, "dtype": None})

    return _in_order(h)


def _like_ext(value: int):
    def h(a, prim):
        x, dt = a
        return ("full_like", (_t(x),), {"value": value, "dtype": _opt_dtype(dt)})

    return _in_order(h)


@_in_order
def _full_like(a, prim):
    x, value, dt = a
    return ("full_like", (_t(x),), {"value": _num(value), "dtype": _opt_dtype(dt)})


@_in_order
def _fill_scalar(a, prim):
    shape, value, dt = a
    if dt is None:  # the default dtype follows the value's kind: not modelled
        raise _Unsupported
    return Lowering([("fill", (), {"shape": _shape(shape), "dtype": _dtype(dt), "value": _num(value)})],
                    _OUT1)


def _fill_v2(a, prim):
    # FillV2(shape, value_tensor): the value's dtype, materialised
    shape, value = a
    return Lowering([("broadcast_to", (_t(value),), {"shape": _shape(shape)}),
                     ("contiguous", (Tmp(0),), {})], _OUT_LAST2)


def _fill_tensor(a, prim):
    shape, value, dt = a
    last = ("contiguous", (Tmp(0),), {}) if dt is None else ("cast", (Tmp(0),), {"dtype": _dtype(dt)})
    return Lowering([("broadcast_to", (_t(value),), {"shape": _shape(shape)}), last], _OUT_LAST2)


def _new_fill(value: int):
    def h(a, prim):
        x, shape, dt = a
        dtype = _vm_dtype(_t(x)) if dt is None else _dtype(dt)
        return Lowering([("fill", (), {"shape": _shape(shape), "dtype": dtype,
                                       "value": _fill_value(dtype, value)})], _OUT1)

    return h


def _new_full(a, prim):
    x, shape, value, dt = a
    dtype = _vm_dtype(_t(x)) if dt is None else _dtype(dt)
    return Lowering([("fill", (), {"shape": _shape(shape), "dtype": dtype, "value": _num(value)})],
                    _OUT1)


@_in_order
def _arange(a, prim):
    start, end, step, dt = a
    if dt is None:
        raise _Unsupported
    return Lowering([("arange", (), {"start": _num(start), "end": _num(end), "step": _num(step),
                                     "dtype": _dtype(dt)})], _OUT1)


# --- backward kernels ---------------------------------------------------------------------------
def _grad2(op: str, **attrs):
    def h(a, prim):
        u, v = a
        return (op, (_t(u), _t(v)), dict(attrs))

    return _in_order(h)


@_in_order
def _gelu_grad(a, prim):
    dy, x, y = a
    return ("gelu_grad", (_t(dy), _t(x), _t(y)), {"approximate": "tanh"})


def _gather_d_grad_v2(a, prim):
    x, dim, idx, grad = a
    return ("gather_d_grad", (_t(idx), _t(grad)), {"dim": _int(dim), "shape": tuple(_t(x).shape)})


# --- in-place ops -------------------------------------------------------------------------------
def _copy_into(x, src) -> Lowering:
    """New value of `x` after x[...] = src: src broadcast to x's shape, in x's dtype, materialised."""
    shape = tuple(x.shape)
    instrs = []
    cur = src
    if tuple(src.shape) != shape:
        instrs.append(("broadcast_to", (src,), {"shape": shape}))
        cur = Tmp(0)
    xd = _vm_dtype(x)
    if _vm_dtype(src) != xd:
        instrs.append(("cast", (cur,), {"dtype": xd}))
    else:
        instrs.append(("contiguous", (cur,), {}))
    return Lowering(instrs, (Tmp(len(instrs) - 1),))


def _inplace_copy(a, prim):
    x, src, non_blocking = a
    _bool(non_blocking)
    return _copy_into(_t(x), _t(src))


def _inplace_fill_tensor(a, prim):
    x, value = a
    return _copy_into(_t(x), _t(value))


def _inplace_fill_scalar(a, prim):
    x, value = a
    return ("full_like", (_t(x),), {"value": _num(value), "dtype": None})


def _inplace_zero(a, prim):
    (x,) = a
    return ("full_like", (_t(x),), {"value": 0, "dtype": None})


def _assign(a, prim):
    x, value = a
    if tuple(_t(x).shape) != tuple(_t(value).shape) or _vm_dtype(x) != _vm_dtype(value):
        raise _Unsupported
    return ("contiguous", (value,), {})


def _assign_arith(op: str):
    def h(a, prim):
        x, value = a
        if _vm_dtype(_t(x)) != _vm_dtype(_t(value)):
            raise _Unsupported
        return (op, (x, value), {})

    return h


# --- the table ----------------------------------------------------------------------------------
_TABLE: dict = {}


def _reg(names: str, handler) -> None:
    for n in names.split():
        _TABLE[n] = handler


for _ms, _vm in {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Expm1": "expm1", "Log": "log", "Log1p": "log1p",
    "Log2": "log2", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Reciprocal": "reciprocal", "Square": "square",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Tanh": "tanh", "Sigmoid": "sigmoid", "ReLU": "relu",
    "ReLU6": "relu6", "SiLU": "silu", "Mish": "mish", "MishExt": "mish", "Erf": "erf", "Erfc": "erfc",
    "Floor": "floor", "Ceil": "ceil", "Trunc": "trunc", "Sign": "sign", "LogicalNot": "logical_not",
    "IsNan": "isnan", "IsInf": "isinf", "IsFinite": "isfinite", "HSwish": "hardswish",
    "HSigmoid": "hardsigmoid", "Contiguous": "contiguous", "Copy": "contiguous", "Clone": "contiguous",
    "StopGradient": "identity", "Identity": "identity",
}.items():
    _TABLE[_ms] = _unary(_vm)

for _ms, _vm in {
    # tensor (or 0-d tensor) operands
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Maximum": "maximum",
    "Minimum": "minimum", "Atan2": "atan2", "Pow": "pow", "FloorDiv": "floor_div", "FloorMod": "mod",
    "TruncateDiv": "trunc_div", "TruncateMod": "fmod",
    "Equal": "eq", "NotEqual": "ne", "Less": "lt", "LessEqual": "le", "Greater": "gt",
    "GreaterEqual": "ge", "LogicalAnd": "logical_and", "LogicalOr": "logical_or",
    "LogicalXor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
    # Python-scalar forms (the scalar becomes an immediate)
    "Muls": "mul", "Divs": "div", "PowTensorScalar": "pow", "PowScalarTensor": "pow",
    "EqScalar": "eq", "GreaterEqualScalar": "ge", "LessScalar": "lt", "FmodScalar": "fmod",
    "FloorDivScalar": "floor_div",
    "BitwiseAndScalar": "bitwise_and", "BitwiseOrScalar": "bitwise_or",
    "BitwiseXorScalar": "bitwise_xor",
}.items():
    _TABLE[_ms] = _binary(_vm)

_reg("AddExt AddScalar", _binary_alpha("add"))
_reg("SubExt SubScalar", _binary_alpha("sub"))
_reg("DivMod DivMods", _divmod)
_reg("RemainderTensorTensor RemainderTensorScalar RemainderScalarTensor", _remainder)


def _floor_mod(a, prim):
    """FloorMod (`x % y`): an integer x % 0 is what MindSpore's double computation converts back with
    x86's conversion: INT_MIN for int32/int64, 0 for int8/int16/uint8 (wrapped from int32), whatever
    x (measured; `ops.remainder` and `fmod` give x there: VM `mod`, `fmod`)."""
    low = _mod(a, None)
    x, y = low[1]
    if type(y) in _NUMBER_TYPES:
        return low
    dt = _tensors_dtype([vm_dtype(v.dtype) for v in (x, y) if type(v) not in _NUMBER_TYPES])
    if type(x) is float or dt not in _INT_MIN_WRAPPED:
        return low
    return Lowering([low, ("eq", (y, 0), {}), ("where", (Tmp(1), _INT_MIN_WRAPPED[dt], Tmp(0)), {})], (Tmp(2),))


_reg("FloorMod", _floor_mod)


_div = _binary("div")
_trunc_div = _binary("trunc_div")


def _int_or_bool(v):
    """"int" / "bool" for a Python int / bool or an integer / bool tensor, else None."""
    if type(v) in _NUMBER_TYPES:
        return "bool" if type(v) is bool else "int" if type(v) is int else None
    if not isinstance(v, Tensor):
        return None
    dt = vm_dtype(v.dtype)
    return "bool" if dt == "bool" else "int" if is_int(dt) else None


@_in_order
def _real_div(a, prim):
    """Legacy RealDiv of integers (tensors, or a tensor and a Python int; an integer with a bool,
    either side, too; bool with bool is refused) stays integer in MindSpore 2.10: the quotient
    truncated, by zero the dtype's max for x > 0, min for x < 0 and 0 for 0 (measured for
    int8/32/64 and uint8): the VM's trunc_div. Else `div`."""
    kinds = [_int_or_bool(v) for v in a]
    if None not in kinds and "int" in kinds:
        return _trunc_div(a, None)
    return _div(a, None)


_reg("RealDiv", _real_div)
_reg("Select SelectV2", _where)
_reg("MaskedFill MaskedFillScalar", _masked_fill)
_reg("ClampScalar", _clamp_scalar)
_reg("ClampTensor", _clamp_tensor)
_reg("Lerp LerpScalar", _lerp)
_reg("AddcmulExt", _addcmul_ext)
_reg("Addcmul", _addcmul_legacy)
_reg("Cast", _cast)
_reg("Round", _round)

_reg("GeLU", _gelu_tanh)
_reg("GeluExt", _gelu_ext)
_reg("FastGeLU", _fast_gelu)
_reg("Elu EluExt", _elu)
_reg("SeLU", _selu)
_reg("Softplus", _softplus_legacy)
_reg("SoftplusExt", _softplus_ext)
_reg("LeakyReLUExt", _leaky_relu_ext)
_reg("Softmax", _softmax("softmax"))
_reg("LogSoftmax", _softmax("log_softmax"))
_reg("LogSoftmaxExt", _log_softmax_ext)
_reg("LogSoftmaxGrad", _log_softmax_grad)
_reg("SoftmaxBackward", _softmax_backward)

_reg("SumExt", _reduce_dtype("sum"))
_reg("MeanExt", _reduce_dtype("mean"))
_reg("ProdExt", _reduce_dtype("prod"))
_reg("ReduceSum", _reduce_sum_legacy)
_reg("ReduceMean", _reduce_legacy_dtype("mean"))
_reg("ReduceProd", _reduce_legacy_dtype("prod"))
_reg("ReduceMax", _reduce_plain("max"))
_reg("ReduceMin", _reduce_plain("min"))
_reg("ReduceAll", _reduce_plain("all"))
_reg("ReduceAny AnyExt", _reduce_plain("any"))
_reg("Any", _reduce_all_axes("any"))
_reg("Max", _reduce_all_axes("max"))
_reg("Min", _reduce_all_axes("min"))
_reg("MaxDim", _with_index("max_with_index", indices_first=False))
_reg("MinDim", _with_index("min_with_index", indices_first=False))
_reg("ArgMaxWithValue", _with_index("max_with_index", indices_first=True))
_reg("ArgMinWithValue", _with_index("min_with_index", indices_first=True))
_reg("Argmax", _arg_legacy("argmax"))
_reg("Argmin", _arg_legacy("argmin"))
_reg("ArgMaxExt", _arg_ext("argmax"))
_reg("ArgMinExt", _arg_ext("argmin"))
_reg("Var", _var)
_reg("LogSumExp", _logsumexp)

_reg("LayerNorm", _layer_norm_legacy)
_reg("LayerNormExt", _layer_norm_ext)
_reg("SoftmaxCrossEntropyWithLogits", _softmax_ce)

_reg("Reshape View", _reshape)
_reg("Flatten", _flatten_legacy)
_reg("Transpose TransposeView", _transpose)
_reg("TransposeExtView", _transpose_ext)
_reg("ExpandDims ExpandDimsView", _expand_dims)
_reg("Squeeze", _squeeze)
_reg("BroadcastTo BroadcastToView", _broadcast_to)
_reg("StridedSlice", _strided_slice)
_reg("Slice", _slice_legacy)
_reg("Narrow NarrowView", _narrow)
_reg("SliceExt SliceExtView", _slice_ext)
_reg("SelectExtView", _select_ext)
_reg("Split", _split)
_reg("SplitTensor SplitTensorView", _split_tensor)
_reg("SplitWithSize SplitWithSizeView", _split_with_size)
_reg("Chunk ChunkView", _chunk)
_reg("Unstack", _unstack_legacy)
_reg("UnstackExtView", _unstack_ext)
_reg("AddN", _addn)
_reg("Stack", _stack_legacy)
_reg("StackExt", _stack_ext)
_reg("Concat", _concat)
_reg("Tile", _tile)
_reg("Tril TrilExt", _tril_triu("tril"))
_reg("Triu", _tril_triu("triu"))
_reg("CumSum", _cumsum_legacy)
_reg("CumProd", _cumprod_legacy)
_reg("NanToNum", _nan_to_num)
_reg("CumsumExt", _cumsum_ext)
_reg("ReverseV2", _reverse)
_reg("PadV3", _pad_v3)
_reg("ConstantPadND", _constant_pad_nd)

_reg("Gather", _gather)
_reg("GatherD", _gather_d)
_reg("GatherNd GatherNdExt", _gather_nd)
_reg("IndexSelect", _index_select)
_reg("TensorScatterAdd", _scatter_nd("tensor_scatter_add"))
_reg("ScatterNd", _scatter_nd_into_zeros)
_reg("BCEWithLogitsLoss", _bce_with_logits)
_reg("ReduceStd", _reduce_std)
_reg("SmoothL1Loss", _smooth_l1_loss)
_reg("SmoothL1LossGrad", _smooth_l1_loss_grad)
_reg("TensorScatterUpdate", _scatter_nd("tensor_scatter_update"))
_reg("ScatterAddExt", _scatter_add_ext)
_reg("TensorScatterElements", _tensor_scatter_elements)
_reg("UnsortedSegmentSum", _unsorted_segment_sum)
_reg("UnsortedSegmentMax", _unsorted_segment("unsorted_segment_max"))
_reg("UnsortedSegmentMin", _unsorted_segment("unsorted_segment_min"))
_reg("UnsortedSegmentProd", _unsorted_segment("unsorted_segment_prod"))
_reg("OneHot OneHotExt", _one_hot)

_reg("MatMul BatchMatMul", _matmul_flags)
_reg("MatMulExt BatchMatMulExt Mm", _matmul_plain)
_reg("Dense", _dense)
_reg("BiasAdd", _bias_add)
_reg("Conv2D", _conv2d)
_reg("MaxPool", _max_pool)
_reg("AvgPool", _avg_pool)
_reg("AdaptiveAvgPool2D", _adaptive_avg_pool2d)
_reg("Dropout", _dropout)

_reg("Ones", _ones_zeros(1))
_reg("Zeros", _ones_zeros(0))
_reg("OnesLike", _like_legacy(1))
_reg("ZerosLike", _like_legacy(0))
_reg("OnesLikeExt", _like_ext(1))
_reg("ZerosLikeExt", _like_ext(0))
_reg("FullLike", _full_like)
_reg("FillScalar", _fill_scalar)
_reg("FillV2", _fill_v2)
_reg("FillTensor", _fill_tensor)
_reg("NewOnes", _new_fill(1))
_reg("NewZeros", _new_fill(0))
_reg("NewFull", _new_full)
_reg("Arange", _arange)

_reg("ReluGrad", _grad2("relu_grad"))  # (dy, x or y): the same mask
_reg("SigmoidGrad", _grad2("sigmoid_grad"))  # (y, dy)
_reg("TanhGrad", _grad2("tanh_grad"))  # (y, dy)
_reg("SiLUGrad", _grad2("silu_grad"))  # (dy, x)
_reg("GeLUGrad", _gelu_grad)  # (dy, x, y), tanh form like GeLU
_reg("GatherDGradV2", _gather_d_grad_v2)

_reg("InplaceCopy", _inplace_copy)
_reg("InplaceFillTensor", _inplace_fill_tensor)
_reg("InplaceFillScalar", _inplace_fill_scalar)
_reg("InplaceZero", _inplace_zero)
_reg("InplaceMaskedFillScalar InplaceMaskedFillTensor", _masked_fill)
_reg("InplaceStopGradient", _unary("identity"))
_reg("Assign", _assign)
_reg("AssignAdd", _assign_arith("add"))
_reg("AssignSub", _assign_arith("sub"))

# Ops with no tensor semantics (scalars, tuples, types); MindSpore's functional.py names them.
for _n in (
    "typeof hastype sequence_len make_range TupleGetItem tuple_getitem list_getitem tuple_setitem "
    "list_setitem dict_getitem dict_setitem MakeTuple make_list make_dict make_slice tuple_reversed "
    "tuple_div tuple_equal list_equal tuple_greater_than tuple_greater_equal list_greater_than "
    "list_greater_equal tuple_lt list_lt tuple_le list_le scalar_ne string_eq string_concat BoolNot "
    "bool_not bool_or bool_and bool_eq bit_and bit_or is_ is_not in_dict not_in_dict reduced_shape "
    "shape_mul BroadcastGradientArgs ScalarCast ListAppend ListInsert SequenceSlice InSequence "
    "SequenceAdd SequenceCount SequenceIndex SequenceMul SequenceMax SequenceMin Shape Rank "
    "IsShapeUnKnown IsDimUnKnown IsElementUnknown"
).split():
    _TABLE[_n] = META

# Dispatched names whose one-instruction lowerings (`lower`'s bare triple, or a Lowering of one
# instruction and one output) take as tensor operands exactly the top-level tensor arguments of the
# op, in the order given (for a legacy `(prim, name, inputs)` form: those of `inputs`), and nothing
# else: tags the recorder reads off its operands are then the tags of the op's tensor arguments.
# (Tested on every captured dispatch form, tests/frontend/test_normalize.py.)
TENSOR_ARGS_IN_ORDER: frozenset = frozenset(n for n, h in _TABLE.items() if h in _IN_ORDER_HANDLERS)

# Dispatched names that write their first tensor input (for legacy-form ops: args[2][0]). Lowered
# ones give the new value as outputs[0]; the others are opaque calls. In-place matmul-accumulate ops
# (InplaceMatmulAdd, InplaceGroupedMatmulAdd) write their LAST input and are not listed.
INPLACE: frozenset = frozenset((
    "InplaceCopy InplaceZero InplaceFillScalar InplaceFillTensor InplaceMaskedFillScalar "
    "InplaceMaskedFillTensor InplaceStopGradient InplaceAddExt InplaceAddsExt InplaceSubExt "
    "InplaceSubScalar InplaceMul InplaceMuls InplaceDiv InplaceDivs InplaceDivMod InplaceDivMods "
    "InplaceFloorDivide InplaceFloorDivides InplaceRemainderTensorTensor InplaceRemainderTensorScalar "
    "InplaceReLU InplaceSigmoid InplaceTanh InplaceSiLU InplaceExp InplaceLog InplaceFloor InplaceSign "
    "InplaceElu InplaceHardtanh InplaceThreshold InplaceErfinv InplaceClampScalar InplaceClampTensor "
    "InplaceUniform InplaceNormal InplaceRandom InplaceExponential InplaceBernoulliScalar "
    "InplaceBernoulliTensor InplaceFillDiagonal InplaceIndexAddExt InplaceIndexCopy "
    "InplaceIndexFillScalar InplaceIndexFillTensor InplaceIndexPut InplacePut InplaceMaskedScatter "
    "InplaceScatterAdd InplaceScatterSrc InplaceScatterSrcReduce InplaceScatterValue "
    "InplaceScatterValueReduce InplaceAddmm InplaceAddr "
    "Assign AssignAdd AssignSub ScatterAdd ScatterSub ScatterUpdate ScatterMul ScatterDiv ScatterMax "
    "ScatterMin ScatterNdAdd ScatterNdSub ScatterNdUpdate IndexAdd"
).split())

# In-place ops that do not read the value they overwrite (fills and copies).
OVERWRITES: frozenset = frozenset((
    "InplaceCopy InplaceZero InplaceFillScalar InplaceFillTensor Assign InplaceUniform InplaceNormal "
    "InplaceRandom InplaceExponential InplaceBernoulliScalar InplaceBernoulliTensor"
).split())

# Dispatched names whose handler is a function of the op's arguments alone (it reads no primitive
# attributes, and of a tensor only its dtype and shape), not in INPLACE: for these, equal non-tensor
# arguments and tensors of equal dtypes and shapes give equal lowerings, so the recorder caches them.
PLANNABLE: frozenset = frozenset(n for n, h in _TABLE.items()
                                 if h is not META and h not in _PRIM_HANDLERS) - INPLACE


def lower(name: str, args: tuple):
    """`normalize` without the wrapping, for the recorder's hot path: the common case of ONE VM
    instruction whose single result is the op's result comes back as the bare `(vm_op, operands,
    attrs)` triple (a plain tuple); anything else as `normalize` gives it (a Lowering, META or None).
    Positional arguments only (the recorder never sees kwargs here)."""
    h = _TABLE.get(name)
    if h is None or h is META:
        return h
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple and args[1] == name:
        try:
            return h(args[2], args[0])  # legacy primitive: (prim, name, inputs)
        except _REJECT:
            return None
    try:
        return h(args, None)
    except _REJECT:
        return None


def normalize(name: str, args: tuple, kwargs=None):
    """Lowering of the dispatched op `name(*args)`, META, or None (see the module docstring).
    Keyword arguments are never understood: a non-empty `kwargs` gives None (META ops excepted)."""
    if kwargs and _TABLE.get(name) is not META:
        return None
    low = lower(name, args)
    if type(low) is tuple:
        return Lowering([low], _OUT1)
    return low


def _inputs(name: str, args: tuple) -> tuple:
    """The op's inputs: a legacy primitive's `(prim, name, inputs)` unwrapped. (The per-op hot paths,
    `lower`, the recorder and tier 1, test the same form inline.)"""
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple and args[1] == name:
        return args[2]
    return args


def mutated_tensor(name: str, args: tuple):
    """The tensor that the in-place op `name` writes (None if `name` is not in INPLACE): the first
    input, which for a legacy-form op is `args[2][0]`."""
    if name not in INPLACE or not args:
        return None
    args = _inputs(name, args)
    first = args[0] if args else None
    return first if isinstance(first, Tensor) else None


def side_effect_inputs(name: str, args: tuple) -> list:
    """Tensor arguments that a legacy primitive NOT in INPLACE may write, if it is marked
    `side_effect_mem` (MindSpore's own flag for ops that update an input in place: optimizer
    applies, BatchNorm in training, ...): the inputs `_SIDE_EFFECT_WRITES` lists for it (checked by
    watching which inputs change), else every tensor input (its signature's `sig_rw.RW_WRITE`
    marks are not exposed to Python in MindSpore 2.10). [] for anything else (pyboost ops carry no
    primitive; their in-place forms are the Inplace* names of INPLACE)."""
    inputs = _inputs(name, args)
    if name in INPLACE or inputs is args:
        return []
    attrs = getattr(args[0], "attrs", None)
    if not isinstance(attrs, dict) or not attrs.get("side_effect_mem"):
        return []
    which = _SIDE_EFFECT_WRITES.get(name)
    return [a for i, a in enumerate(inputs) if isinstance(a, Tensor) and (which is None or i in which)]


# Inputs that a side-effect primitive writes, where known (else all of them count): BatchNorm in
# training updates its moving mean and variance, not x, scale or bias (copying x, an activation
# batch, at every call of a record() scope and making it a new input after would be waste).
_SIDE_EFFECT_WRITES = {
    "BatchNorm": (3, 4),         # x, scale, bias, moving mean, moving variance
    "ApplyMomentum": (0, 1),     # variable, accumulation, lr, gradient, momentum
    "ApplyAdagrad": (0, 1),      # var, accum, lr, grad
    "Adam": (0, 1, 2),           # var, m, v, beta1_power, beta2_power, lr, beta1, beta2, eps, grad
    "SGD": (0, 3, 5),            # parameters, gradient, learning_rate, accum, momentum, stat
}


def reads_target(name: str, args: tuple, target) -> bool:
    """Whether the in-place op `name` reads the old value of `target` (its mutated tensor): every
    INPLACE op but the fills and copies of OVERWRITES, and those too where another tensor argument
    is the target itself or its storage (`x.copy_(x)`, `assign(x, x)`: pyboost ops get a fresh
    wrapper per argument, so storage is compared too)."""
    if name not in OVERWRITES:
        return True
    ptr = None
    for a in _inputs(name, args)[1:]:  # (the target is the first input: mutated_tensor)
        if a is target:
            return True
        if isinstance(a, Tensor):
            if ptr is None:
                ptr = TensorPy._data_ptr(target)
            if TensorPy._data_ptr(a) == ptr:
                return True
    return False


def covered_names() -> frozenset:
    """Dispatched names with a lowering (META names excluded)."""
    return frozenset(n for n, h in _TABLE.items() if h is not META)
