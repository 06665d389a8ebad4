"""The VM's op set: one table of tensor-semantic ops with named attributes, plus group sets.

Every op a frontend records is one of these (the frontend's normalisation table maps MindSpore's
dispatched names onto them); anything else is recorded as `call` (opaque: always run eagerly, never
guessed). Shape/dtype rules live in `ms_dynvm.ir.registry`, NumPy semantics in
`ms_dynvm.runtime.interpreter`; both are keyed by the names defined here, and a test checks that the
three tables cover the same ops.

Operands are positional: a register (a tensor value) or an immediate (a Python bool/int/float or None,
e.g. the scalar of `mul(%1, 0.5)`). Attributes are named, non-tensor parameters with the defaults
below; `REQUIRED` marks attributes that have no default.

Groups (tested with `op in ELEMENTWISE` etc., tinygrad style):
- VIEW: metadata only (the result may alias its input: reshape, transpose, expand_dims, squeeze,
  broadcast_to, slice, select). A backend may implement a view as an index expression.
- COPY: moves data without arithmetic (contiguous, concat, stack, tile, gather family, scatter family,
  split). A fusion boundary for the first fuser.
- ELEMENTWISE (UNARY | BINARY | TERNARY): pointwise with NumPy broadcasting.
- REDUCE: reductions along `axis`; NORM: softmax / log_softmax / layer_norm (reduction + epilogue).
- CREATE: no tensor inputs (fill); RANDOM: results depend on an RNG (never replayed by the interpreter).
- MATMUL, CONV: builtins that later backends call as library routines.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


class Group(enum.Enum):
    UNARY = "unary"
    BINARY = "binary"
    TERNARY = "ternary"
    REDUCE = "reduce"
    NORM = "norm"
    VIEW = "view"
    COPY = "copy"
    CREATE = "create"
    MATMUL = "matmul"
    CONV = "conv"
    RANDOM = "random"
    GRAD = "grad"  # backward kernels that reach the dispatch hook (relu_grad, gelu_grad, ...)
    OPAQUE = "opaque"


@dataclass(frozen=True)
class OpDef:
    name: str
    group: Group
    # Number of operands; -1 = variadic (concat/stack take any number of tensors).
    n_in: int
    attrs: dict = field(default_factory=dict)
    # Number of results; -1 = given by the instruction (split, unstack, call).
    n_out: int = 1
    doc: str = ""


OPS: dict[str, OpDef] = {}


def _op(name, group, n_in, attrs=None, n_out=1, doc=""):
    OPS[name] = OpDef(name, group, n_in, dict(attrs or {}), n_out, doc)


U, B, T = Group.UNARY, Group.BINARY, Group.TERNARY

# --- elementwise unary -------------------------------------------------------------------------
for _n in (
    "neg abs exp expm1 log log1p log2 sqrt rsqrt reciprocal square sin cos tan tanh sigmoid relu relu6 "
    "silu mish erf erfc floor ceil round trunc sign logical_not isnan isinf isfinite identity "
    "hardswish hardsigmoid"
).split():
    _op(_n, U, 1)
_op("gelu", U, 1, {"approximate": "none"}, doc="approximate: 'none' (erf form) or 'tanh'")
_op("elu", U, 1, {"alpha": 1.0})
_op("leaky_relu", U, 1, {"alpha": 0.01})
_op("softplus", U, 1, {"beta": 1.0, "threshold": 20.0}, doc="x if beta*x > threshold")
_op("cast", U, 1, {"dtype": REQUIRED})
_op("nan_to_num", U, 1, {"nan": 0.0, "posinf": None, "neginf": None},
    doc="NaN -> nan, +inf -> posinf, -inf -> neginf, each rounded to x's dtype (None: its largest / lowest "
        "finite value); float16 and float32 only, as MindSpore CPU's NanToNum")

# --- elementwise binary (NumPy broadcasting; either operand may be an immediate) ----------------
for _n in (
    "add sub mul div floor_div trunc_div mod fmod pow maximum minimum atan2 "
    "eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor"
).split():
    _op(_n, B, 2)

# --- elementwise ternary -----------------------------------------------------------------------
_op("where", T, 3, doc="where(cond, x, y)")
_op("masked_fill", T, 3, doc="masked_fill(x, mask, value): value where mask else x")
_op("clamp", T, 3, doc="clamp(x, lo, hi); lo or hi may be None")
_op("lerp", T, 3, doc="lerp(a, b, w) = a + w*(b-a)")
_op("addcmul", T, 3, {"value": 1.0}, doc="a + value*b*c (4th operand folded into attr)")

# --- backward kernels that the hook sees (OPS_SEEN.md) -----------------------------------------
_op("relu_grad", Group.GRAD, 2, doc="relu_grad(dy, y) = dy * (y > 0)")
_op("gelu_grad", Group.GRAD, 3, {"approximate": "none"}, doc="gelu_grad(dy, x, y)")
_op("sigmoid_grad", Group.GRAD, 2, doc="sigmoid_grad(y, dy) = dy * y * (1-y)")
_op("tanh_grad", Group.GRAD, 2, doc="tanh_grad(y, dy) = dy * (1-y*y)")
_op("silu_grad", Group.GRAD, 2, doc="silu_grad(dy, x)")
_op("elu_grad", Group.GRAD, 2, {"alpha": 1.0}, doc="elu_grad(dy, y): from the output, as MindSpore")
_op("softmax_grad", Group.GRAD, 2, {"axis": -1}, doc="softmax_grad(y, dy) = y*(dy - sum(dy*y))")
_op("gather_d_grad", Group.GRAD, 2, {"dim": REQUIRED, "shape": REQUIRED},
    doc="gather_d_grad(index, grad): zeros(shape) with grad scatter-added along dim")

# --- reductions --------------------------------------------------------------------------------
# axis: None (all axes) or a tuple of ints; dtype: optional result dtype.
for _n in ("sum", "mean", "prod"):
    _op(_n, Group.REDUCE, 1, {"axis": None, "keepdims": False, "dtype": None})
for _n in ("max", "min", "all", "any"):
    _op(_n, Group.REDUCE, 1, {"axis": None, "keepdims": False})
for _n in ("argmax", "argmin"):
    # axis: None (flattened) or one int; dtype of the index result.
    _op(_n, Group.REDUCE, 1, {"axis": None, "keepdims": False, "dtype": "i64"})
_op("max_with_index", Group.REDUCE, 1, {"axis": REQUIRED, "keepdims": False}, n_out=2,
    doc="(values, indices i64) along one axis")
_op("min_with_index", Group.REDUCE, 1, {"axis": REQUIRED, "keepdims": False}, n_out=2)
_op("var", Group.REDUCE, 1, {"axis": None, "keepdims": False, "correction": 1})
_op("logsumexp", Group.REDUCE, 1, {"axis": REQUIRED, "keepdims": False})

# --- reductions with an epilogue ---------------------------------------------------------------
_op("softmax", Group.NORM, 1, {"axis": -1})
_op("log_softmax", Group.NORM, 1, {"axis": -1})
_op("layer_norm", Group.NORM, 3, {"begin_norm_axis": -1, "begin_params_axis": -1, "eps": 1e-5},
    n_out=3, doc="(x, gamma, beta) -> (y, mean, var); mean/var keep normed dims as 1; var biased, without eps")
_op("softmax_cross_entropy", Group.NORM, 2, n_out=2,
    doc="(logits, labels) -> (loss per row, dlogits = softmax - labels)")

# --- views (metadata only) ---------------------------------------------------------------------
_op("reshape", Group.VIEW, 1, {"shape": REQUIRED}, doc="shape may contain one -1")
_op("transpose", Group.VIEW, 1, {"perm": REQUIRED})
_op("expand_dims", Group.VIEW, 1, {"axis": REQUIRED})
_op("squeeze", Group.VIEW, 1, {"axis": None}, doc="axis: None (all size-1 dims) or tuple")
_op("broadcast_to", Group.VIEW, 1, {"shape": REQUIRED}, doc="-1 keeps the input dim")
_op("slice", Group.VIEW, 1, {"begin": REQUIRED, "end": REQUIRED, "step": REQUIRED},
    doc="per-axis begin/end/step tuples (full rank), Python slice semantics")
_op("select", Group.VIEW, 1, {"axis": REQUIRED, "index": REQUIRED},
    doc="x.select(axis, index): drops the axis")

# --- data movement -----------------------------------------------------------------------------
_op("contiguous", Group.COPY, 1, doc="materialise (a copy); value-identical")
_op("concat", Group.COPY, -1, {"axis": 0})
_op("stack", Group.COPY, -1, {"axis": 0})
_op("split", Group.COPY, 1, {"axis": 0, "sizes": REQUIRED}, n_out=-1,
    doc="one result per entry of sizes")
_op("unstack", Group.COPY, 1, {"axis": 0}, n_out=-1)
_op("tile", Group.COPY, 1, {"multiples": REQUIRED})
_op("gather", Group.COPY, 2, {"axis": 0, "batch_dims": 0},
    doc="gather(x, idx): take along axis with index tensor (np.take), batch_dims leading dims shared")
_op("gather_d", Group.COPY, 2, {"dim": REQUIRED}, doc="gather_d(x, idx) = take_along_axis")
_op("gather_nd", Group.COPY, 2, doc="gather_nd(x, idx): idx[..., k] indexes x's first k dims")
_op("index_select", Group.COPY, 2, {"axis": 0})
_op("scatter_add", Group.COPY, 3, {"dim": REQUIRED},
    doc="scatter_add(x, idx, src) along dim (torch.scatter_add)")
_op("tensor_scatter_add", Group.COPY, 3, doc="(x, idx[...,k], updates) like gather_nd, adding")
_op("tensor_scatter_update", Group.COPY, 3, doc="(x, idx[...,k], updates), writing")
_op("unsorted_segment_sum", Group.COPY, 2, {"num_segments": REQUIRED},
    doc="(x, segment_ids): out[s] = sum of x[i] with ids[i]==s; ids out of range dropped")
_op("unsorted_segment_max", Group.COPY, 2, {"num_segments": REQUIRED},
    doc="(x, segment_ids): out[s] = the first of the largest x[i] with ids[i]==s, NaN skipped, at least the "
        "dtype's lowest finite value (an empty segment's value); ids in [0, num_segments)")
_op("unsorted_segment_min", Group.COPY, 2, {"num_segments": REQUIRED},
    doc="(x, segment_ids): as unsorted_segment_max with the smallest, at most the dtype's largest finite value")
_op("unsorted_segment_prod", Group.COPY, 2, {"num_segments": REQUIRED},
    doc="(x, segment_ids): out[s] = product of x[i] with ids[i]==s in index order, 1 for an empty segment; "
        "ids in [0, num_segments)")
_op("one_hot", Group.COPY, 3, {"depth": REQUIRED, "axis": -1},
    doc="one_hot(indices, on_value, off_value)")
_op("flip", Group.COPY, 1, {"axis": REQUIRED})
_op("pad", Group.COPY, 2, {"pads": REQUIRED},
    doc="pad(x, value): constant pad; pads = ((before, after), ...) per dim")
_op("tril", Group.COPY, 1, {"diagonal": 0})
_op("triu", Group.COPY, 1, {"diagonal": 0})
_op("cumsum", Group.COPY, 1, {"axis": REQUIRED, "dtype": None})
_op("cumprod", Group.COPY, 1, {"axis": REQUIRED, "exclusive": False, "reverse": False},
    doc="running product along axis in x's dtype, one rounding per step (integers wrap); exclusive: each "
        "result leaves its own element out (the first is 1); reverse: from the end; rank >= 1, not bool/bf16")

# --- creation ----------------------------------------------------------------------------------
_op("fill", Group.CREATE, 0, {"shape": REQUIRED, "dtype": REQUIRED, "value": REQUIRED})
_op("arange", Group.CREATE, 0, {"start": 0, "end": REQUIRED, "step": 1, "dtype": "i64"})
_op("full_like", Group.UNARY, 1, {"value": REQUIRED, "dtype": None},
    doc="a tensor of x's shape filled with value (ones_like/zeros_like)")

# --- linear algebra, convolution ---------------------------------------------------------------
_op("matmul", Group.MATMUL, 2, {"transpose_a": False, "transpose_b": False},
    doc="np.matmul semantics (batch dims broadcast) after optional swaps of the last two dims")
_op("bias_add", Group.BINARY, 2, {"axis": 1},
    doc="x + b with b along `axis` (1 for NCHW/NC, -1 for NHWC)")
_op("conv2d", Group.CONV, 2,
    {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1},
    doc="NCHW x, OIHW w; padding = (top, bottom, left, right)")
_op("max_pool2d", Group.CONV, 1, {"kernel": REQUIRED, "stride": REQUIRED, "padding": (0, 0, 0, 0)},
    doc="NCHW; padding as conv2d, padded with -inf")
_op("avg_pool2d", Group.CONV, 1, {"kernel": REQUIRED, "stride": REQUIRED, "padding": (0, 0, 0, 0)})

# --- random ------------------------------------------------------------------------------------
_op("dropout", Group.RANDOM, 1, {"p": REQUIRED}, n_out=2,
    doc="(y, mask); RNG-dependent: the interpreter cannot replay it and raises")

# --- opaque ------------------------------------------------------------------------------------
_op("call", Group.OPAQUE, -1, {"target": REQUIRED}, n_out=-1,
    doc="an op the VM does not model: always run eagerly by the frontend; ends its basic block")


def _names(*groups: Group) -> frozenset[str]:
    return frozenset(n for n, d in OPS.items() if d.group in groups)


UNARY = _names(Group.UNARY)
BINARY = _names(Group.BINARY)
TERNARY = _names(Group.TERNARY)
ELEMENTWISE = UNARY | BINARY | TERNARY | frozenset(
    {"relu_grad", "gelu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "elu_grad"}
)
REDUCE = _names(Group.REDUCE)
NORM = _names(Group.NORM)
VIEW = _names(Group.VIEW)
COPY = _names(Group.COPY)
CREATE = _names(Group.CREATE)
MATMUL = _names(Group.MATMUL)
CONV = _names(Group.CONV)
RANDOM = _names(Group.RANDOM)
OPAQUE = _names(Group.OPAQUE)
COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite"})
LOGICAL = frozenset({"logical_not", "logical_and", "logical_or", "logical_xor"})


def opdef(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown VM op {name!r}") from None


def full_attrs(name: str, attrs: dict) -> dict:
    """`attrs` completed with the op's defaults, in the table's order; raises on an unknown or a
    missing required attribute. Used by the parser and the verifier so that printed forms are
    canonical."""
    d = opdef(name)
    unknown = set(attrs) - set(d.attrs)
    if unknown:
        raise ValueError(f"{name}: unknown attribute(s) {sorted(unknown)}")
    out = {}
    for k, default in d.attrs.items():
        if k in attrs:
            out[k] = attrs[k]
        elif default is REQUIRED:
            raise ValueError(f"{name}: missing attribute {k!r}")
        else:
            out[k] = default
    return out
