"""What the C backend can compute, per IR op and dtype, as data (no rendering needed to find out).

`C_OPS[op]` is the set of result dtypes for which `spec.lower` + `c.render` turn op into loop code;
an op missing from it is never fused on the C backend. Beside it, the facts that refine it:

- `FLOAT_INPUT`: float functions that refuse integer and bool inputs (MindSpore CPU refuses most of
  them there and has rules of its own for the rest, e.g. selu of int32: -1 -> 0);
- `NO_F64`: float ops without an f64 form (no vectorised f64 math): float16/bfloat16/float32 only;
- float16: which ops' eager results the kernels reproduce bit for bit (`F16_EAGER_ONLY`,
  `F16_EAGER_MATH_OK`, and the rule for a float16 mul/div of a wide 0-d operand);
- bfloat16: the kernels hold it in float32 storage (NumPy has no bfloat16), while every value of a
  fused group crosses the MindSpore boundary as 2-byte bfloat16: no bfloat16 value is fused;
- under `eager_math`, `EAGER_MATH_UNFUSED`: ops whose MindSpore CPU kernel is not reproduced.

`refusal(ins, types, eager_math)` reads these tables for one instruction and says why the C backend
refuses it, or None; `op_refusal(op, eager_math)` answers by op name alone. What only lowering can
tell (slices of symbolic dims, reshapes that cannot be grouped, rank-0 softmax) stays with
`spec.lower` (`codegen.supports`). The one fusibility rule, `passes.fuse.fusible`, asks this module
for the C backend; tests check the table against lowering and rendering op by op, dtype by dtype
(tests/codegen/test_capability.py).
"""

from __future__ import annotations

from ms_dynvm import dtypes
from ms_dynvm.bytecode.text import Reg

F32 = frozenset({"f16", "bf16", "f32"})  # computed in float32 (float16/bfloat16 rounded after each op)
F64 = frozenset({"f64"})
FLOAT = F32 | F64
INT = dtypes.INTS
BOOL = frozenset({"bool"})
ANY = FLOAT | INT | BOOL

# Float functions that refuse integer and bool inputs.
FLOAT_INPUT = frozenset({
    "exp", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
    "sigmoid", "silu", "mish", "erf", "erfc", "gelu", "elu", "leaky_relu", "softplus",
})
# Float ops with no f64 form (no vectorised f64 math).
NO_F64 = frozenset({
    "exp", "expm1", "log", "log1p", "log2", "sin", "cos", "tan", "tanh", "sigmoid", "silu", "mish", "erf",
    "erfc", "gelu", "elu", "softplus", "gelu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "atan2", "pow",
})
# Binary ops computed in integer arithmetic for integer results.
INT_BINARY = frozenset({"add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                        "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
                        "bitwise_xor"})
_INT_UNARY = frozenset({"neg", "abs", "square", "relu", "relu6", "sign", "floor", "ceil", "round", "trunc",
                        "identity", "relu_grad"})
# Ops with a bool result computed as logic (add -> or, mul -> and, ...), or passed through.
BOOL_ARITH = frozenset({"add", "sub", "mul", "maximum", "minimum", "bitwise_and", "bitwise_or",
                        "bitwise_xor", "abs", "square", "relu", "floor", "ceil", "round", "trunc",
                        "identity", "contiguous", "relu_grad"})
_FLOAT_OPS = FLOAT_INPUT | frozenset({
    "add", "sub", "mul", "div", "floor_div", "trunc_div", "mod", "fmod", "maximum", "minimum", "atan2",
    "pow", "lerp", "addcmul", "relu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "elu_grad",
    "gelu_grad", "neg", "abs", "square", "relu", "relu6", "floor", "ceil", "round", "trunc", "sign",
    "hardswish", "hardsigmoid"})


_VIEWS = frozenset({"reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "slice", "select",
                    "identity", "contiguous"})
_BOOL_RESULT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                          "logical_not", "isnan", "isinf", "isfinite"})


def _arith(op: str) -> frozenset:
    """The result dtypes of an arithmetic op: float ones (f64 unless NO_F64), integer ones where
    it is computed in integer arithmetic, bool where it is computed as logic."""
    out = frozenset()
    if op in _FLOAT_OPS:
        out |= F32 if op in NO_F64 else FLOAT
    if op in INT_BINARY or op in _INT_UNARY:
        out |= INT
    if op in BOOL_ARITH:
        out |= BOOL
    return out


C_OPS: dict[str, frozenset] = {
    # views: index expressions, any dtype
    **{op: ANY for op in _VIEWS},
    # any dtype (cast: see `computes` for f64 sources)
    **{op: ANY for op in ("cast", "full_like", "fill", "where", "masked_fill", "clamp")},
    **{op: BOOL for op in _BOOL_RESULT},
    "nan_to_num": frozenset({"f16", "f32"}),
    # arithmetic (bias_add is add along one axis)
    **{op: _arith(op) for op in (_FLOAT_OPS | INT_BINARY | _INT_UNARY | BOOL_ARITH) - _VIEWS - _BOOL_RESULT},
    "bias_add": _arith("add"),
    # reductions (bool results and max/min of bool inputs: no; mean: float results only)
    **{op: FLOAT | INT for op in ("sum", "prod", "max", "min")},
    "mean": FLOAT,
    # norms: float32 statistics, no f64 form
    "softmax": F32,
    "log_softmax": F32,
    "layer_norm": F32,
}

# Under eager_math, ops whose MindSpore CPU kernel is not reproduced: log_softmax is oneDNN's, with
# its own exp, log and summation order; a fused one is up to ~5e-6 off eager, which training
# amplifies (140 Momentum steps of a log_softmax loss ended with parameters up to 3e-3 relative off
# eager).
EAGER_MATH_UNFUSED = frozenset({"log_softmax"})

# float16 ops whose eager results the kernels do not reproduce bit for bit: MindSpore CPU computes
# them in float16 steps, each rounded, or in its own formulas; the kernels (with eager_math off: all
# of these) compute in float32 and round once (closer to the exact value, but up to 2-5 ulp from
# eager: measured for sigmoid, silu, softmax, tanh, exp). The rest (arithmetic, comparisons, relu,
# sqrt, sum, mean ...) measured equal.
F16_EAGER_ONLY = frozenset({
    "exp", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "silu", "softmax",
    "log_softmax", "softplus", "mish", "elu", "erf", "erfc", "pow", "rsqrt", "reciprocal", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "layer_norm",
    "sigmoid_grad", "tanh_grad", "silu_grad", "gelu_grad", "elu_grad", "hardswish", "hardsigmoid",
    "atan2", "lerp", "gelu"})

# ... of which, under `eager_math`, the kernels follow MindSpore's float16 kernels (their float16
# steps, or the float32 form rounded once), measured bit-equal to eager on every finite float16 for
# the unary ops and on 6,000 values with NaN/inf for the others (tests/codegen/test_eager_math.py).
# gelu and gelu_grad: their tanh form only (MindSpore CPU's only one; ms_dynvm's own float16 erf-form
# gelu is 271 of 63,488 values off).
F16_EAGER_MATH_OK = frozenset({
    "exp", "expm1", "log1p", "tanh", "sigmoid", "silu", "softmax", "erfc", "rsqrt", "reciprocal", "sin",
    "cos", "tan", "layer_norm", "sigmoid_grad", "tanh_grad", "silu_grad", "elu", "atan2", "lerp",
    "hardsigmoid", "log", "log2", "erf"})


def f16_eager_only(op: str, attrs: dict, eager_math: bool) -> bool:
    """A float16 op whose eager result the kernels do not reproduce (see F16_EAGER_ONLY)."""
    if op not in F16_EAGER_ONLY:
        return False
    if not eager_math:
        return True
    if op in ("gelu", "gelu_grad"):
        return attrs.get("approximate") != "tanh"
    return op not in F16_EAGER_MATH_OK


def _reg_dtype(types: dict, a):
    return types[int(a)].dtype if isinstance(a, Reg) else None


def op_refusal(op: str, eager_math: bool = True) -> str | None:
    """Why the C backend never computes op `op` as eager does, whatever the dtypes, or None."""
    if op not in C_OPS:
        return f"op {op} is not supported by the C backend"
    if eager_math and op in EAGER_MATH_UNFUSED:
        return f"{op}: MindSpore's kernel is not reproduced"
    return None


def refusal(ins, types: dict, eager_math: bool = True) -> str | None:
    """Why the C backend does not compute instruction `ins` (register types `types`) as eager does,
    or None when it does: `computes` (what the kernels can compute) and `eager_refusal` (where
    their results would differ from eager's)."""
    return eager_refusal(ins, types, eager_math) or computes(ins, types)


def eager_refusal(ins, types: dict, eager_math: bool = True) -> str | None:
    """Why the C kernels' result of `ins` would differ from eager's (bfloat16 storage, float16
    rounding, MindSpore kernels not reproduced under `eager_math`), or None."""
    op = ins.op
    if eager_math and op in EAGER_MATH_UNFUSED:
        return f"{op}: MindSpore's kernel is not reproduced"
    if any(isinstance(a, Reg) and types[int(a)].dtype == "bf16" for a in ins.args) or any(
            types[r].dtype == "bf16" for r in ins.outs):
        return "bfloat16 tensors"
    if ins.outs and types[ins.outs[0]].dtype == "f16":
        if f16_eager_only(op, ins.attrs, eager_math):
            return f"float16 {op}: eager rounds each step"
        if op in ("mul", "div") and any(isinstance(a, Reg) and len(types[int(a)].shape) == 0
                                        and types[int(a)].dtype in ("f32", "f64") for a in ins.args):
            # MindSpore computes it in float32 with the 0-d value as float32; the kernels round that
            # value to float16 first (1 ulp apart on a fifth of values, measured).
            return f"float16 {op}: eager rounds each step"
    return None


def computes(ins, types: dict) -> str | None:
    """Why the C backend cannot compute `ins` at all (the tables above), or None."""
    op = ins.op
    out_dts = C_OPS.get(op)
    if out_dts is None:
        return f"op {op} is not supported by the C backend"
    if not ins.outs:
        return None
    rd = types[ins.outs[0]].dtype
    if rd not in out_dts:
        return f"{op} with a {rd} result is not supported by the C backend"
    src = _reg_dtype(types, ins.args[0]) if ins.args else None
    if op in FLOAT_INPUT and src is not None and src not in FLOAT:
        return f"{op} of a {src} tensor is left to eager"
    if op in ("max", "min") and src == "bool":
        return f"{op} of a bool tensor is not supported"
    if op == "cast" and src == "f64" and rd not in FLOAT and rd != "bool":
        return "cast f64 -> integer is not supported"
    if (rd in ("f16", "bf16") or rd in INT) and op != "full_like":
        # An f64 operand converted to a narrower result dtype: rounded twice (through float32), or
        # an f64 -> integer conversion. (where's condition and masked_fill's mask become bool; a
        # float16 lerp's weight float32; full_like reads no values.)
        skip = {"where": 0, "masked_fill": 1, "lerp": 2}.get(op)
        for k, a in enumerate(ins.args):
            if k != skip and _reg_dtype(types, a) == "f64":
                return f"cast f64 -> {rd} is not supported (double rounding)"
    return None
