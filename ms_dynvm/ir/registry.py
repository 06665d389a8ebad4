"""Shape and dtype rules of every VM op (except the opaque `call`): `infer(op, args, attrs)`.

`args` holds one entry per operand, in order: a `TensorType` for a register, the raw Python value
(bool/int/float/None) for an immediate. `attrs` are the op's attributes (defaults are filled in with
`opcodes.full_attrs`). The result is one `TensorType` per result (contiguous layout); split/unstack
get their result count from the attributes/shape. Invalid shapes, axes, attributes or dtypes raise
`ShapeError` with a message naming the op.

Symbolic dims (`Sym`, a monomial `coeff * names`) are handled wherever the result stays a monomial:
- broadcasting: equal dims stay, 1 broadcasts against anything; a Sym against a different dim (an int
  other than 1, or another Sym) is an error. Shape signatures specialise sizes 0 and 1, so a Sym is
  never 1 (and `squeeze(axis=None)` never drops one).
- reshape with -1 divides `numel` exactly (`dim_div`), e.g. `[B,S,4] -> (-1, 4)` gives `[B*S,4]`.
- concat sums the dims along the axis: Syms with the same names add their coefficients (`B + 2*B =
  3*B`); a sum that is not a monomial (`B + 3`, `B + S`) raises `ShapeError('... not expressible')`.
  The same holds for slicing, padding and windows (conv/pool) over a symbolic dim: only the cases
  whose result is the dim itself (or a static size) are accepted.

Dtype rules follow MindSpore 2.10 (measured on CPU, see tests/runtime/test_interpreter.py):
- binary arithmetic promotes with `dtypes.promote` (tensor, tensor) and `dtypes.promote_scalar`
  (tensor, immediate); `div` and `atan2` of integers/bools give f32; comparisons, logical ops and
  isnan/isinf/isfinite give bool; bitwise ops need bool/integer operands.
  Exception (measured): mul and div treat a 0-d tensor operand against a tensor of rank >= 1 like a
  scalar (it only matters when its kind is higher: f16[4] * f32[] -> f16, i32[4] * f32[] -> f32),
  add/sub/maximum/pow/fmod/... promote 0-d tensors fully (fmod is TruncateMod's semantics; legacy
  TruncateMod turns a 0-d argument into a float64/int64 one before dispatch, which the VM records).
- float-valued unary ops (exp, log, sqrt, sigmoid, gelu, ...) map bool/integer inputs to f32 (as
  MindSpore's sqrt/reciprocal do; its other CPU kernels reject integers); neg/abs/square/relu/round/
  floor/sign/hardswish/... keep the dtype (`neg` rejects bool).
- sum/prod of bool or integers give i64, others keep the dtype, unless `dtype` is set; mean keeps
  the dtype (integer mean truncates; mean of bool is rejected, as in MindSpore); cumsum keeps
  integer dtypes (MindSpore CumSum), bool -> i64; all/any give bool except `any` of u8 gives u8;
  argmax/argmin give `dtype` (with axis=None a scalar even when keepdims, as MindSpore's argmax);
  var/logsumexp/softmax/log_softmax follow the float-valued rule.
- where/clamp/addcmul promote all tensor/immediate value operands (lerp: start and end only, the
  weight's dtype does not count); masked_fill keeps x's dtype;
  one_hot takes the dtype of on_value/off_value; dropout's mask has x's dtype (legacy Dropout).
- Reduction `axis` and squeeze `axis`: None or () means all axes (MindSpore's ReduceSum/SumExt and
  Squeeze treat () that way).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.types import Sym, TensorType, dim_div, dim_mul, is_static, numel


class ShapeError(ValueError):
    """An op applied to operands/attributes whose shapes, dtypes or attributes it does not accept."""


Rule = Callable[[str, list, dict], list]
RULES: dict[str, Rule] = {}

_BIG = 2**62  # an `end` at least this large means "to the end of the dim" (slices over Syms)


def infer(op: str, args: list, attrs: dict) -> list[TensorType]:
    """Result types of `op` applied to `args` (TensorType or immediate) with `attrs`."""
    if op not in RULES:
        raise ShapeError(f"no shape rule for op {op!r}")
    try:
        attrs = opcodes.full_attrs(op, attrs)
    except ValueError as e:
        raise ShapeError(str(e)) from None
    n_in = opcodes.OPS[op].n_in
    if n_in >= 0 and len(args) != n_in:
        raise ShapeError(f"{op}: expected {n_in} operands, got {len(args)}")
    try:
        return RULES[op](op, list(args), attrs)
    except (TypeError, IndexError, KeyError, AttributeError) as e:  # malformed attributes/operands
        raise ShapeError(f"{op}: bad operands or attributes: {type(e).__name__}: {e}") from None


def _rule(*names: str):
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return register


# --- helpers -----------------------------------------------------------------------------------
def _is_tensor(a) -> bool:
    return isinstance(a, TensorType)


def _tensor(op: str, a, what: str = "operand") -> TensorType:
    if not _is_tensor(a):
        raise ShapeError(f"{op}: {what} must be a tensor, got immediate {a!r}")
    return a


def _shape(a) -> tuple:
    return a.shape if _is_tensor(a) else ()


def _int_dtype(op: str, t: TensorType, what: str) -> None:
    if not dtypes.is_int(t.dtype):
        raise ShapeError(f"{op}: {what} must have an integer dtype, got {t.dtype}")


def broadcast_dim(a, b, op: str = "broadcast"):
    """One broadcast dim: equal dims stay, 1 takes the other dim; anything else is an error."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    raise ShapeError(f"{op}: cannot broadcast dims {a} and {b}")


def broadcast_shapes(*shapes, op: str = "broadcast") -> tuple:
    """NumPy broadcasting of shapes whose dims are ints or Syms."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            try:
                out[i] = broadcast_dim(out[i], d, op)
            except ShapeError:
                raise ShapeError(f"{op}: cannot broadcast shapes {', '.join(map(_fmt, shapes))}") from None
    return tuple(out)


def _fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def norm_axis(op: str, axis, rank: int) -> int:
    """`axis` in [-rank, rank) normalised to [0, rank)."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise ShapeError(f"{op}: axis must be an int, got {axis!r}")
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank


def norm_axes(op: str, axis, rank: int) -> tuple[int, ...]:
    """Reduction axes: None or () -> all; an int or a tuple of ints, normalised, without repeats."""
    if axis is None or axis == ():
        return tuple(range(rank))
    if isinstance(axis, numbers.Integral) and not isinstance(axis, bool):
        axis = (axis,)
    if rank == 0:
        # MindSpore accepts axis 0 / -1 on a scalar.
        if all(a in (0, -1) for a in axis):
            return ()
        raise ShapeError(f"{op}: axis {axis} out of range for a scalar")
    out = tuple(norm_axis(op, a, rank) for a in axis)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis}")
    return out


def _reduced_shape(shape, axes, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _scalar_dtype(v) -> str:
    """Dtype of a tensor made from an immediate alone (as MindSpore's Python scalars)."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "i64"
    if isinstance(v, float):
        return "f32"
    raise ShapeError(f"unsupported immediate {v!r}")


def promote_values(op: str, values) -> str:
    """Result dtype of operands that mix tensors and immediates: tensors promote among themselves,
    then each immediate may raise the kind (`promote_scalar`); None entries are skipped."""
    tensors = [v for v in values if _is_tensor(v)]
    scalars = [v for v in values if not _is_tensor(v) and v is not None]
    if tensors:
        dt = tensors[0].dtype
        for t in tensors[1:]:
            dt = dtypes.promote(dt, t.dtype)
    elif scalars:
        dt = _scalar_dtype(scalars[0])
        for s in scalars[1:]:
            dt = dtypes.promote(dt, _scalar_dtype(s))
        return dt
    else:
        raise ShapeError(f"{op}: needs at least one tensor or scalar operand")
    for s in scalars:
        if not isinstance(s, (bool, int, float)):
            raise ShapeError(f"{op}: unsupported immediate {s!r}")
        dt = dtypes.promote_scalar(dt, s)
    return dt


_ZERO_DIM_AS_SCALAR = {"mul": (0, 1), "div": (0, 1)}  # op -> operand positions


def promote_binary(op: str, a, b) -> str:
    """Result dtype of a binary op: `promote_values`, except that for mul/div (either operand) a
    0-d tensor against a tensor of rank >= 1 acts like a scalar of its kind (MindSpore's Mul/Div):
    it wins only with a higher kind, then with its own dtype. (fmod, TruncateMod's semantics,
    promotes plainly.)"""
    pair = (a, b)
    for i in _ZERO_DIM_AS_SCALAR.get(op, ()):
        z, other = pair[i], pair[1 - i]
        if _is_tensor(z) and _is_tensor(other) and z.rank == 0 and other.rank > 0:
            return z.dtype if dtypes.kind(z.dtype) > dtypes.kind(other.dtype) else other.dtype
    return promote_values(op, [a, b])


def float_of(dt: str) -> str:
    """Dtype of a float-valued result computed from `dt`: bool/integers -> f32."""
    return dt if dtypes.kind(dt) >= 2 else "f32"


def _tt(dtype: str, shape) -> TensorType:
    return TensorType(dtype, tuple(shape))


def _dim_sum(op: str, dims):
    """Sum of dims as one dim; ints add, Syms add when they share their names (0s are dropped)."""
    dims = [d for d in dims if d != 0]
    if all(isinstance(d, int) for d in dims):
        return sum(dims)
    names = {d.names for d in dims if isinstance(d, Sym)}
    if len(names) != 1 or any(isinstance(d, int) for d in dims):
        raise ShapeError(f"{op}: sum of dims {' + '.join(map(str, dims))} is not expressible")
    coeff = sum(d.coeff for d in dims)
    return Sym(names.pop(), coeff)


def _pair(op: str, v, what: str) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (int(v[0]), int(v[1]))
    raise ShapeError(f"{op}: {what} must be an int or a pair, got {v!r}")


def _quad(op: str, v) -> tuple[int, int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v, v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (v[0], v[0], v[1], v[1])
    if isinstance(v, (tuple, list)) and len(v) == 4:
        return tuple(int(x) for x in v)
    raise ShapeError(f"{op}: padding must be an int, (h, w) or (top, bottom, left, right), got {v!r}")


def window_dim(op: str, d, k: int, s: int, p0: int, p1: int, dil: int = 1):
    """Output size of a sliding window: floor((d + p0 + p1 - dil*(k-1) - 1) / s) + 1."""
    if k < 1 or s < 1 or dil < 1 or p0 < 0 or p1 < 0:
        raise ShapeError(f"{op}: bad window (kernel {k}, stride {s}, dilation {dil}, pad {p0},{p1})")
    span = dil * (k - 1) + 1
    if isinstance(d, Sym):
        if span == 1 and s == 1 and p0 == p1 == 0:
            return d
        raise ShapeError(f"{op}: a window over symbolic dim {d} is not expressible")
    if d + p0 + p1 < span:
        raise ShapeError(f"{op}: window {span} larger than padded input {d + p0 + p1}")
    return (d + p0 + p1 - span) // s + 1


# --- elementwise -------------------------------------------------------------------------------
_KEEP_UNARY = frozenset({
    "neg", "abs", "square", "relu", "relu6", "floor", "ceil", "round", "trunc", "sign", "identity",
    "hardswish", "hardsigmoid",
})
_BOOL_UNARY = frozenset({"logical_not", "isnan", "isinf", "isfinite"})
_FLOAT_UNARY = frozenset({
    "exp", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "silu", "mish", "erf", "erfc", "gelu", "elu", "leaky_relu", "softplus",
})


@_rule(*_KEEP_UNARY, *_BOOL_UNARY, *_FLOAT_UNARY)
def _unary(op, args, attrs):
    x = _tensor(op, args[0])
    if op in _BOOL_UNARY:
        dt = "bool"
    elif op in _FLOAT_UNARY:
        dt = float_of(x.dtype)
    else:
        if op == "neg" and x.dtype == "bool":
            raise ShapeError("neg: bool tensors cannot be negated")
        dt = x.dtype
    if op == "gelu" and attrs["approximate"] not in ("none", "tanh"):
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {attrs['approximate']!r}")
    return [_tt(dt, x.shape)]


@_rule("cast")
def _cast(op, args, attrs):
    x = _tensor(op, args[0])
    if attrs["dtype"] not in dtypes.DTYPES:
        raise ShapeError(f"cast: unknown dtype {attrs['dtype']!r}")
    return [_tt(attrs["dtype"], x.shape)]


@_rule("full_like")
def _full_like(op, args, attrs):
    x = _tensor(op, args[0])
    dt = attrs["dtype"] or x.dtype
    if dt not in dtypes.DTYPES:
        raise ShapeError(f"full_like: unknown dtype {dt!r}")
    return [_tt(dt, x.shape)]


_ARITH = frozenset({"add", "sub", "mul", "floor_div", "trunc_div", "mod", "fmod", "pow", "maximum", "minimum"})
_BITWISE = frozenset({"bitwise_and", "bitwise_or", "bitwise_xor"})
_COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})


@_rule(*_ARITH, *_BITWISE, *_COMPARE, *_LOGICAL, "div", "atan2")
def _binary(op, args, attrs):
    a, b = args
    if not (_is_tensor(a) or _is_tensor(b)):
        raise ShapeError(f"{op}: at least one operand must be a tensor")
    shape = broadcast_shapes(_shape(a), _shape(b), op=op)
    if op in _COMPARE or op in _LOGICAL:
        return [_tt("bool", shape)]
    dt = promote_binary(op, a, b)
    if op in ("div", "atan2"):
        dt = float_of(dt)
    elif op in _BITWISE and dtypes.kind(dt) > 1:
        raise ShapeError(f"{op}: needs bool or integer operands, got {dt}")
    return [_tt(dt, shape)]


@_rule("bias_add")
def _bias_add(op, args, attrs):
    x, b = _tensor(op, args[0]), _tensor(op, args[1], "bias")
    if x.rank < 2:
        raise ShapeError(f"bias_add: x must have rank >= 2, got {_fmt(x.shape)}")
    axis = norm_axis(op, attrs["axis"], x.rank)
    if b.rank != 1 or b.shape[0] != x.shape[axis]:
        raise ShapeError(f"bias_add: bias {_fmt(b.shape)} does not match dim {axis} of {_fmt(x.shape)}")
    return [_tt(dtypes.promote(x.dtype, b.dtype), x.shape)]


@_rule("where")
def _where(op, args, attrs):
    cond, x, y = args
    _tensor(op, cond, "condition")
    shape = broadcast_shapes(_shape(cond), _shape(x), _shape(y), op=op)
    return [_tt(promote_values(op, [x, y]), shape)]


@_rule("masked_fill")
def _masked_fill(op, args, attrs):
    x, mask, value = args
    x = _tensor(op, x)
    if _tensor(op, mask, "mask").dtype != "bool":
        raise ShapeError(f"masked_fill: mask must be bool, got {mask.dtype}")
    if value is None:
        raise ShapeError("masked_fill: value must not be None")
    return [_tt(x.dtype, broadcast_shapes(x.shape, mask.shape, _shape(value), op=op))]


@_rule("clamp")
def _clamp(op, args, attrs):
    _tensor(op, args[0])
    if args[1] is None and args[2] is None:
        raise ShapeError("clamp: at least one of lo and hi must be given")
    shape = broadcast_shapes(*(_shape(a) for a in args), op=op)
    return [_tt(promote_values(op, args), shape)]


@_rule("nan_to_num")
def _nan_to_num(op, args, attrs):
    x = _tensor(op, args[0])
    if x.dtype not in ("f16", "f32"):
        raise ShapeError(f"nan_to_num: {x.dtype} x is not supported (MindSpore CPU: float16 and float32 only)")
    for k in ("nan", "posinf", "neginf"):
        v = attrs[k]
        if v is not None and type(v) not in (int, float):
            raise ShapeError(f"nan_to_num: {k} must be a number or None, got {v!r}")
    return [_tt(x.dtype, x.shape)]


@_rule("lerp", "addcmul")
def _lerp_addcmul(op, args, attrs):
    _tensor(op, args[0])
    shape = broadcast_shapes(*(_shape(a) for a in args), op=op)
    if op == "addcmul":
        dt = dtypes.promote_scalar(promote_values(op, args), attrs["value"])
    else:
        # MindSpore's Lerp: the result has start's (and end's) dtype whatever the weight's (a float32
        # weight with float16 start and end gives float16, measured)
        dt = float_of(promote_values(op, args[:2]))
    return [_tt(dt, shape)]


# --- backward kernels --------------------------------------------------------------------------
@_rule("relu_grad", "gelu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "elu_grad")
def _eltwise_grad(op, args, attrs):
    ts = [_tensor(op, a) for a in args]
    if op == "gelu_grad":
        ts = ts[:2]  # y (the forward output) is not read: MindSpore's GeLUGrad ignores it
        if attrs["approximate"] not in ("none", "tanh"):
            raise ShapeError(f"gelu_grad: bad approximate {attrs['approximate']!r}")
    dt = promote_values(op, ts)
    if op != "relu_grad":
        dt = float_of(dt)
    return [_tt(dt, broadcast_shapes(*(t.shape for t in ts), op=op))]


@_rule("softmax_grad")
def _softmax_grad(op, args, attrs):
    y, dy = (_tensor(op, a) for a in args)
    shape = broadcast_shapes(y.shape, dy.shape, op=op)
    _softmax_axis(op, attrs["axis"], len(shape))
    return [_tt(float_of(dtypes.promote(y.dtype, dy.dtype)), shape)]


@_rule("gather_d_grad")
def _gather_d_grad(op, args, attrs):
    index, grad = _tensor(op, args[0], "index"), _tensor(op, args[1], "grad")
    _int_dtype(op, index, "index")
    shape = tuple(attrs["shape"])
    if not (index.rank == grad.rank == len(shape)):
        raise ShapeError(f"gather_d_grad: ranks of index, grad and shape {_fmt(shape)} differ")
    if index.shape != grad.shape:
        raise ShapeError(f"gather_d_grad: index {_fmt(index.shape)} and grad {_fmt(grad.shape)} differ")
    norm_axis(op, attrs["dim"], len(shape))
    return [_tt(grad.dtype, shape)]


# --- reductions --------------------------------------------------------------------------------
def _check_dtype_attr(op: str, dt) -> None:
    if dt is not None and dt not in dtypes.DTYPES:
        raise ShapeError(f"{op}: unknown dtype {dt!r}")


@_rule("sum", "mean", "prod", "max", "min", "all", "any", "var", "logsumexp")
def _reduce(op, args, attrs):
    x = _tensor(op, args[0])
    axes = norm_axes(op, attrs["axis"], x.rank)
    shape = _reduced_shape(x.shape, axes, attrs["keepdims"])
    dt = x.dtype
    if op in ("sum", "prod", "mean"):
        _check_dtype_attr(op, attrs["dtype"])
    if op in ("sum", "prod"):
        dt = attrs["dtype"] or ("i64" if dtypes.kind(dt) <= 1 else dt)
    elif op == "mean":
        if attrs["dtype"] is None and dt == "bool":
            raise ShapeError("mean: bool tensors need a dtype")
        dt = attrs["dtype"] or dt
    elif op in ("all", "any"):
        dt = "u8" if (op == "any" and dt == "u8") else "bool"
    elif op in ("var", "logsumexp"):
        dt = float_of(dt)
    elif op in ("max", "min"):
        _nonempty(op, x.shape, axes)
    return [_tt(dt, shape)]


def _nonempty(op: str, shape, axes) -> None:
    if any(shape[a] == 0 for a in axes):
        raise ShapeError(f"{op}: reduction over an empty dim of {_fmt(shape)}")


@_rule("argmax", "argmin")
def _arg_reduce(op, args, attrs):
    x = _tensor(op, args[0])
    dt = attrs["dtype"]
    if dt not in ("i32", "i64"):
        raise ShapeError(f"{op}: dtype must be i32 or i64, got {dt!r}")
    if attrs["axis"] is None:  # flattened: a scalar even with keepdims (MindSpore's argmax)
        _nonempty(op, x.shape, range(x.rank))
        return [_tt(dt, ())]
    axes = norm_axes(op, attrs["axis"], x.rank)
    _nonempty(op, x.shape, axes)
    return [_tt(dt, _reduced_shape(x.shape, axes, attrs["keepdims"]))]


@_rule("max_with_index", "min_with_index")
def _with_index(op, args, attrs):
    x = _tensor(op, args[0])
    axes = norm_axes(op, attrs["axis"], x.rank)
    if x.rank and len(axes) != 1:
        raise ShapeError(f"{op}: axis must be one int, got {attrs['axis']!r}")
    _nonempty(op, x.shape, axes)
    shape = _reduced_shape(x.shape, axes, attrs["keepdims"])
    return [_tt(x.dtype, shape), _tt("i64", shape)]


# --- normalisations ----------------------------------------------------------------------------
def _softmax_axis(op: str, axis, rank: int) -> int:
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise ShapeError(f"{op}: axis must be one int, got {axis!r}")
        axis = axis[0]
    return norm_axis(op, axis, max(rank, 1))


@_rule("softmax", "log_softmax")
def _softmax(op, args, attrs):
    x = _tensor(op, args[0])
    _softmax_axis(op, attrs["axis"], x.rank)
    return [_tt(float_of(x.dtype), x.shape)]


@_rule("layer_norm")
def _layer_norm(op, args, attrs):
    x, gamma, beta = (_tensor(op, a) for a in args)
    if x.rank == 0:
        raise ShapeError("layer_norm: x must have rank >= 1")
    bna = norm_axis(op, attrs["begin_norm_axis"], x.rank)
    bpa = norm_axis(op, attrs["begin_params_axis"], x.rank)
    pshape = x.shape[bpa:]
    for name, t in (("gamma", gamma), ("beta", beta)):
        if t.shape != pshape:
            raise ShapeError(f"layer_norm: {name} {_fmt(t.shape)} must be {_fmt(pshape)}")
    dt = float_of(x.dtype)
    stat = x.shape[:bna] + (1,) * (x.rank - bna)
    # MindSpore returns the mean and variance as float32 whatever x's float type (measured for
    # float16 and float64).
    return [_tt(dt, x.shape), _tt("f32", stat), _tt("f32", stat)]


@_rule("softmax_cross_entropy")
def _softmax_cross_entropy(op, args, attrs):
    logits, labels = (_tensor(op, a) for a in args)
    if logits.rank < 1 or logits.shape != labels.shape:
        raise ShapeError(
            f"softmax_cross_entropy: logits {_fmt(logits.shape)} and labels {_fmt(labels.shape)} "
            "must have the same shape of rank >= 1"
        )
    dt = float_of(dtypes.promote(logits.dtype, labels.dtype))
    return [_tt(dt, logits.shape[:-1]), _tt(dt, logits.shape)]


# --- views -------------------------------------------------------------------------------------
@_rule("reshape")
def _reshape(op, args, attrs):
    x = _tensor(op, args[0])
    return [_tt(x.dtype, reshape_shape(x.shape, attrs["shape"]))]


def reshape_shape(src, target) -> tuple:
    """`target` with its -1 resolved so that numel matches `src` (ints or Syms)."""
    target = tuple(target)
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {target}")
    if any(isinstance(d, int) and d < -1 for d in target):
        raise ShapeError(f"reshape: negative dim in {target}")
    total = numel(src)
    if -1 in target:
        known = numel([d for d in target if d != -1])
        if known == 0:
            raise ShapeError(f"reshape: -1 is ambiguous in {target} (a zero dim)")
        rest = dim_div(total, known)
        if rest is None:
            raise ShapeError(f"reshape: {_fmt(src)} cannot be viewed as {target}")
        target = tuple(rest if d == -1 else d for d in target)
    if numel(target) != total:
        raise ShapeError(f"reshape: {_fmt(src)} has {total} elements, {_fmt(target)} has {numel(target)}")
    return target


@_rule("transpose")
def _transpose(op, args, attrs):
    x = _tensor(op, args[0])
    perm = tuple(norm_axis(op, p, x.rank) for p in attrs["perm"]) if x.rank else tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: {attrs['perm']} is not a permutation of rank {x.rank}")
    return [_tt(x.dtype, tuple(x.shape[p] for p in perm))]


@_rule("expand_dims")
def _expand_dims(op, args, attrs):
    x = _tensor(op, args[0])
    axis = attrs["axis"]
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    rank = x.rank + len(axes)
    axes = sorted(norm_axis(op, a, rank) for a in axes)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"expand_dims: repeated axis in {axis}")
    dims = iter(x.shape)
    return [_tt(x.dtype, tuple(1 if i in axes else next(dims) for i in range(rank)))]


@_rule("squeeze")
def _squeeze(op, args, attrs):
    x = _tensor(op, args[0])
    if attrs["axis"] is None or attrs["axis"] == ():
        return [_tt(x.dtype, tuple(d for d in x.shape if d != 1))]
    axes = norm_axes(op, attrs["axis"], x.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: dim {a} of {_fmt(x.shape)} is not 1")
    return [_tt(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@_rule("broadcast_to")
def _broadcast_to(op, args, attrs):
    x = _tensor(op, args[0])
    return [_tt(x.dtype, broadcast_to_shape(x.shape, attrs["shape"]))]


def broadcast_to_shape(src, target) -> tuple:
    """`target` with -1 entries replaced by the aligned dims of `src`; checks broadcastability."""
    target = tuple(target)
    lead = len(target) - len(src)
    if lead < 0:
        raise ShapeError(f"broadcast_to: cannot broadcast {_fmt(src)} to lower rank {target}")
    out = []
    for i, t in enumerate(target):
        s = src[i - lead] if i >= lead else None
        if t == -1:
            if s is None:
                raise ShapeError(f"broadcast_to: -1 in a new leading dim of {target}")
            t = s
        if s is not None and s != t and s != 1:
            raise ShapeError(f"broadcast_to: cannot broadcast {_fmt(src)} to {target}")
        out.append(t)
    return tuple(out)


def _slice_len(op: str, d, b, e, s):
    if s == 0:
        raise ShapeError(f"{op}: step must not be 0")
    if isinstance(d, int):
        return len(range(*slice(b, e, s).indices(d)))
    if s == 1 and b in (0, None) and (e is None or e >= _BIG):
        return d
    raise ShapeError(f"{op}: slice {b}:{e}:{s} of symbolic dim {d} is not expressible")


@_rule("slice")
def _slice(op, args, attrs):
    x = _tensor(op, args[0])
    begin, end, step = (tuple(attrs[k]) for k in ("begin", "end", "step"))
    if not len(begin) == len(end) == len(step) == x.rank:
        raise ShapeError(f"slice: begin/end/step must have {x.rank} entries")
    return [_tt(x.dtype, tuple(_slice_len(op, *t) for t in zip(x.shape, begin, end, step)))]


@_rule("select")
def _select(op, args, attrs):
    x = _tensor(op, args[0])
    if x.rank == 0:
        raise ShapeError("select: x must have rank >= 1")
    axis = norm_axis(op, attrs["axis"], x.rank)
    d, index = x.shape[axis], attrs["index"]
    if isinstance(d, int) and not -d <= index < d:
        raise ShapeError(f"select: index {index} out of range for dim {d}")
    return [_tt(x.dtype, x.shape[:axis] + x.shape[axis + 1:])]


# --- data movement -----------------------------------------------------------------------------
@_rule("contiguous", "flip", "tril", "triu")
def _same(op, args, attrs):
    x = _tensor(op, args[0])
    if op == "flip":
        norm_axes(op, attrs["axis"], x.rank)
    if op in ("tril", "triu") and x.rank < 2:
        raise ShapeError(f"{op}: x must have rank >= 2, got {_fmt(x.shape)}")
    return [_tt(x.dtype, x.shape)]


@_rule("concat")
def _concat(op, args, attrs):
    ts = [_tensor(op, a) for a in args]
    if not ts or ts[0].rank == 0:
        raise ShapeError("concat: needs at least one tensor of rank >= 1")
    axis = norm_axis(op, attrs["axis"], ts[0].rank)
    for t in ts[1:]:
        same = t.rank == ts[0].rank and all(
            a == b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != axis
        )
        if not same:
            raise ShapeError(f"concat: shapes {', '.join(_fmt(t.shape) for t in ts)} differ off axis {axis}")
    shape = list(ts[0].shape)
    shape[axis] = _dim_sum(op, [t.shape[axis] for t in ts])
    return [_tt(promote_values(op, ts), shape)]


@_rule("stack")
def _stack(op, args, attrs):
    ts = [_tensor(op, a) for a in args]
    if not ts:
        raise ShapeError("stack: needs at least one tensor")
    if any(t.shape != ts[0].shape for t in ts):
        raise ShapeError(f"stack: shapes {', '.join(_fmt(t.shape) for t in ts)} differ")
    axis = norm_axis(op, attrs["axis"], ts[0].rank + 1)
    shape = ts[0].shape[:axis] + (len(ts),) + ts[0].shape[axis:]
    return [_tt(promote_values(op, ts), shape)]


@_rule("split")
def _split(op, args, attrs):
    x = _tensor(op, args[0])
    if x.rank == 0:
        raise ShapeError("split: x must have rank >= 1")
    axis = norm_axis(op, attrs["axis"], x.rank)
    sizes = tuple(attrs["sizes"])
    if any(s < 0 for s in sizes) or not sizes:
        raise ShapeError(f"split: sizes {sizes} must be non-negative and non-empty")
    if isinstance(x.shape[axis], Sym):
        raise ShapeError(f"split: splitting symbolic dim {x.shape[axis]} is not expressible")
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split: sizes {sizes} do not add up to dim {x.shape[axis]}")
    return [_tt(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]


@_rule("unstack")
def _unstack(op, args, attrs):
    x = _tensor(op, args[0])
    if x.rank == 0:
        raise ShapeError("unstack: x must have rank >= 1")
    axis = norm_axis(op, attrs["axis"], x.rank)
    n = x.shape[axis]
    if not isinstance(n, int):
        raise ShapeError(f"unstack: the number of results (dim {n}) must be static")
    return [_tt(x.dtype, x.shape[:axis] + x.shape[axis + 1:]) for _ in range(n)]


@_rule("tile")
def _tile(op, args, attrs):
    x = _tensor(op, args[0])
    mult = tuple(attrs["multiples"])
    if any(m < 0 for m in mult):
        raise ShapeError(f"tile: negative multiple in {mult}")
    rank = max(len(mult), x.rank)
    mult = (1,) * (rank - len(mult)) + mult
    shape = (1,) * (rank - x.rank) + tuple(x.shape)
    return [_tt(x.dtype, tuple(dim_mul(d, m) for d, m in zip(shape, mult)))]


@_rule("gather")
def _gather(op, args, attrs):
    x, idx = _tensor(op, args[0]), _tensor(op, args[1], "indices")
    _int_dtype(op, idx, "indices")
    bd = attrs["batch_dims"]
    if bd < 0:
        bd += idx.rank
    axis = norm_axis(op, attrs["axis"], x.rank) if x.rank else 0
    if not 0 <= bd <= min(axis, idx.rank) or x.rank == 0:
        raise ShapeError(f"gather: bad batch_dims {attrs['batch_dims']} for axis {axis}")
    if x.shape[:bd] != idx.shape[:bd]:
        raise ShapeError(f"gather: batch dims of {_fmt(x.shape)} and {_fmt(idx.shape)} differ")
    return [_tt(x.dtype, x.shape[:axis] + idx.shape[bd:] + x.shape[axis + 1:])]


@_rule("gather_d")
def _gather_d(op, args, attrs):
    x, idx = _tensor(op, args[0]), _tensor(op, args[1], "index")
    _int_dtype(op, idx, "index")
    if x.rank != idx.rank:
        raise ShapeError(f"gather_d: x {_fmt(x.shape)} and index {_fmt(idx.shape)} ranks differ")
    dim = norm_axis(op, attrs["dim"], max(x.rank, 1))
    for i, (a, b) in enumerate(zip(idx.shape, x.shape)):
        if i != dim and isinstance(a, int) and isinstance(b, int) and a > b:
            raise ShapeError(f"gather_d: index {_fmt(idx.shape)} larger than x {_fmt(x.shape)}")
    return [_tt(x.dtype, idx.shape)]


def _nd_index(op: str, x: TensorType, idx: TensorType) -> int:
    _int_dtype(op, idx, "indices")
    if idx.rank == 0 or not isinstance(idx.shape[-1], int) or idx.shape[-1] > x.rank:
        raise ShapeError(f"{op}: indices {_fmt(idx.shape)} must end in a static k <= rank {x.rank}")
    return idx.shape[-1]


@_rule("gather_nd")
def _gather_nd(op, args, attrs):
    x, idx = _tensor(op, args[0]), _tensor(op, args[1], "indices")
    k = _nd_index(op, x, idx)
    return [_tt(x.dtype, idx.shape[:-1] + x.shape[k:])]


@_rule("index_select")
def _index_select(op, args, attrs):
    x, idx = _tensor(op, args[0]), _tensor(op, args[1], "index")
    _int_dtype(op, idx, "index")
    if idx.rank != 1 or x.rank == 0:
        raise ShapeError(f"index_select: index must be 1-D and x of rank >= 1, got {_fmt(idx.shape)}")
    axis = norm_axis(op, attrs["axis"], x.rank)
    return [_tt(x.dtype, x.shape[:axis] + idx.shape + x.shape[axis + 1:])]


@_rule("scatter_add")
def _scatter_add(op, args, attrs):
    x, idx, src = _tensor(op, args[0]), _tensor(op, args[1], "index"), _tensor(op, args[2], "src")
    _int_dtype(op, idx, "index")
    if not x.rank == idx.rank == src.rank:
        raise ShapeError("scatter_add: x, index and src must have the same rank")
    dim = norm_axis(op, attrs["dim"], max(x.rank, 1))
    for i, (n, s, d) in enumerate(zip(idx.shape, src.shape, x.shape)):
        if is_static((n, s, d)) and (n > s or (i != dim and n > d)):
            raise ShapeError(f"scatter_add: index {_fmt(idx.shape)} larger than src or x")
    return [_tt(x.dtype, x.shape)]


@_rule("tensor_scatter_add", "tensor_scatter_update")
def _tensor_scatter(op, args, attrs):
    x, idx, upd = _tensor(op, args[0]), _tensor(op, args[1], "indices"), _tensor(op, args[2], "updates")
    k = _nd_index(op, x, idx)
    want = idx.shape[:-1] + x.shape[k:]
    if upd.shape != want:
        raise ShapeError(f"{op}: updates {_fmt(upd.shape)} must be {_fmt(want)}")
    return [_tt(x.dtype, x.shape)]


@_rule("unsorted_segment_sum", "unsorted_segment_max", "unsorted_segment_min", "unsorted_segment_prod")
def _unsorted_segment(op, args, attrs):
    x, ids = _tensor(op, args[0]), _tensor(op, args[1], "segment_ids")
    _int_dtype(op, ids, "segment_ids")
    if ids.rank > x.rank or x.shape[:ids.rank] != ids.shape:
        raise ShapeError(f"{op}: ids {_fmt(ids.shape)} must prefix x {_fmt(x.shape)}")
    if op != "unsorted_segment_sum" and x.dtype in ("bool", "bf16"):
        raise ShapeError(f"{op}: {x.dtype} x is not supported (nor by MindSpore CPU)")
    n = attrs["num_segments"]
    if n < 0:
        raise ShapeError(f"{op}: negative num_segments {n}")
    return [_tt(x.dtype, (n,) + x.shape[ids.rank:])]


@_rule("one_hot")
def _one_hot(op, args, attrs):
    idx, on, off = args
    idx = _tensor(op, idx, "indices")
    _int_dtype(op, idx, "indices")
    for v in (on, off):
        if v is None or (_is_tensor(v) and v.rank != 0):
            raise ShapeError("one_hot: on_value and off_value must be scalars")
    depth = attrs["depth"]
    if depth < 0:
        raise ShapeError(f"one_hot: negative depth {depth}")
    axis = attrs["axis"]
    axis = idx.rank if axis == -1 else norm_axis(op, axis, idx.rank + 1)
    return [_tt(promote_values(op, [on, off]), idx.shape[:axis] + (depth,) + idx.shape[axis:])]


@_rule("pad")
def _pad(op, args, attrs):
    x = _tensor(op, args[0])
    pads = tuple(tuple(p) for p in attrs["pads"])
    if len(pads) != x.rank or any(len(p) != 2 for p in pads):
        raise ShapeError(f"pad: pads must hold one (before, after) pair per dim of {_fmt(x.shape)}")
    if args[1] is None or (_is_tensor(args[1]) and args[1].rank != 0):
        raise ShapeError("pad: value must be a scalar")
    shape = []
    for d, (b, a) in zip(x.shape, pads):
        if isinstance(d, Sym):
            if b or a:
                raise ShapeError(f"pad: padding symbolic dim {d} is not expressible")
            shape.append(d)
        elif d + b + a < 0:
            raise ShapeError(f"pad: pads {pads} crop more than dim {d}")
        else:
            shape.append(d + b + a)
    return [_tt(x.dtype, shape)]


@_rule("cumsum")
def _cumsum(op, args, attrs):
    x = _tensor(op, args[0])
    _check_dtype_attr(op, attrs["dtype"])
    norm_axis(op, attrs["axis"], max(x.rank, 1))
    dt = attrs["dtype"] or ("i64" if x.dtype == "bool" else x.dtype)
    return [_tt(dt, x.shape)]


@_rule("cumprod")
def _cumprod(op, args, attrs):
    x = _tensor(op, args[0])
    if x.rank == 0:
        raise ShapeError("cumprod: x must have rank >= 1 (MindSpore's CumProd)")
    if x.dtype in ("bool", "bf16"):
        raise ShapeError(f"cumprod: {x.dtype} x is not supported (nor by MindSpore CPU)")
    norm_axis(op, attrs["axis"], x.rank)
    return [_tt(x.dtype, x.shape)]


# --- creation ----------------------------------------------------------------------------------
@_rule("fill")
def _fill(op, args, attrs):
    shape = tuple(attrs["shape"])
    _check_dtype_attr(op, attrs["dtype"])
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise ShapeError(f"fill: negative dim in {shape}")
    return [_tt(attrs["dtype"], shape)]


def arange_len(start, end, step) -> int:
    """Number of elements of arange(start, end, step): ceil((end - start) / step), at least 0."""
    if step == 0:
        raise ShapeError("arange: step must not be 0")
    if all(isinstance(v, int) for v in (start, end, step)):
        return max(0, -((start - end) // step))
    return max(0, math.ceil((end - start) / step))


@_rule("arange")
def _arange(op, args, attrs):
    _check_dtype_attr(op, attrs["dtype"])
    return [_tt(attrs["dtype"], (arange_len(attrs["start"], attrs["end"], attrs["step"]),))]


# --- matmul, convolution, pooling --------------------------------------------------------------
@_rule("matmul")
def _matmul(op, args, attrs):
    a, b = _tensor(op, args[0]), _tensor(op, args[1])
    if a.rank == 0 or b.rank == 0:
        raise ShapeError("matmul: operands must have rank >= 1")
    sa, sb = list(a.shape), list(b.shape)
    if attrs["transpose_a"] and a.rank >= 2:
        sa[-2], sa[-1] = sa[-1], sa[-2]
    if attrs["transpose_b"] and b.rank >= 2:
        sb[-2], sb[-1] = sb[-1], sb[-2]
    ka = sa[-1]
    kb = sb[0] if b.rank == 1 else sb[-2]
    if ka != kb:
        raise ShapeError(f"matmul: contracted dims differ: {_fmt(sa)} @ {_fmt(sb)}")
    batch = broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]), op=op)
    rows = (sa[-2],) if a.rank >= 2 else ()
    cols = (sb[-1],) if b.rank >= 2 else ()
    return [_tt(dtypes.promote(a.dtype, b.dtype), batch + rows + cols)]


@_rule("conv2d")
def _conv2d(op, args, attrs):
    x, w = _tensor(op, args[0]), _tensor(op, args[1], "weight")
    if x.rank != 4 or w.rank != 4:
        raise ShapeError(f"conv2d: x {_fmt(x.shape)} and w {_fmt(w.shape)} must be 4-D (NCHW, OIHW)")
    g = attrs["groups"]
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    if not is_static((c, o, ci, kh, kw)):
        raise ShapeError("conv2d: channels and kernel sizes must be static")
    if g < 1 or c != ci * g or o % g:
        raise ShapeError(f"conv2d: x {_fmt(x.shape)} / w {_fmt(w.shape)} do not match groups={g}")
    sh, sw = _pair(op, attrs["stride"], "stride")
    dh, dw = _pair(op, attrs["dilation"], "dilation")
    pt, pb, pl, pr = _quad(op, attrs["padding"])
    oh = window_dim(op, h, kh, sh, pt, pb, dh)
    ow = window_dim(op, wd, kw, sw, pl, pr, dw)
    return [_tt(dtypes.promote(x.dtype, w.dtype), (n, o, oh, ow))]


@_rule("max_pool2d", "avg_pool2d")
def _pool2d(op, args, attrs):
    x = _tensor(op, args[0])
    if x.rank not in (3, 4):
        raise ShapeError(f"{op}: x must be 3-D or 4-D ((N,)C,H,W), got {_fmt(x.shape)}")
    kh, kw = _pair(op, attrs["kernel"], "kernel")
    sh, sw = _pair(op, attrs["stride"], "stride")
    pt, pb, pl, pr = _quad(op, attrs["padding"])
    if max(pt, pb) > kh // 2 or max(pl, pr) > kw // 2:
        raise ShapeError(f"{op}: padding {attrs['padding']} must be at most half the kernel")
    oh = window_dim(op, x.shape[-2], kh, sh, pt, pb)
    ow = window_dim(op, x.shape[-1], kw, sw, pl, pr)
    return [_tt(x.dtype, x.shape[:-2] + (oh, ow))]


# --- random ------------------------------------------------------------------------------------
@_rule("dropout")
def _dropout(op, args, attrs):
    x = _tensor(op, args[0])
    if not 0 <= attrs["p"] <= 1:
        raise ShapeError(f"dropout: p must be in [0, 1], got {attrs['p']}")
    return [_tt(x.dtype, x.shape), _tt(x.dtype, x.shape)]


__all__ = [
    "RULES", "ShapeError", "arange_len", "broadcast_dim", "broadcast_shapes", "broadcast_to_shape", "float_of",
    "infer", "norm_axes", "norm_axis", "promote_binary", "promote_values", "reshape_shape", "window_dim",
]
