"""Render a `KernelSpec` as C99 for GCC.

The generated translation unit holds the math library (`cmath.MATH_C`, or libm wrappers under
`strict_ieee`) and one entry point

    void dvm_kernel(void *const *ptrs, const int64_t *strides, const int64_t *sizes)

`ptrs`: the spec's inputs then outputs (in `KernelSpec.buffers` order); `strides`: for each of them
`rank` element strides (any value, 0 for broadcast views); `sizes`: the run-time size of every
symbolic dim (`KernelSpec.syms` order). Static dims are baked in as constants, so one kernel serves
every size of a symbolic dim. Temporaries are malloc'ed per call (statistics only: one value per row).

Code shape, per nest: one flat loop over the product of the outer dims (`#pragma omp parallel for`
when the nest's work exceeds `OMP_THRESHOLD` elements; single-threaded otherwise and under
`strict_ieee`), the outer indices recovered by div/mod. Per step: plain loops over the inner dims but
the last; the innermost loop comes twice: a fast path taken when every run-time stride along it is 1
(addresses become `p[j]`, the loop is `restrict`-qualified and vectorises: GCC 12 with
`-O3 -march=native` turns the inlined math into AVX2 code) and a generic strided path. Reductions
outside `strict_ieee` keep `LANES` partial accumulators (a fixed-width inner loop GCC vectorises, then
a fixed-order combine: results are deterministic run to run, but the order differs from a
sequential sum); the tail is peeled into lane 0. Under `strict_ieee` reductions are sequential,
transcendental functions call libm and `-ffp-contract=off` keeps every rounding explicit, so results
are bitwise reproducible.

Arithmetic that MindSpore defines specially follows the reference interpreter: float division by
+-0 ignores the zero's sign, maximum/minimum propagate NaN, relu(NaN) = 0, clamp's comparison order,
x86 float->int conversion (cvtt: INT_MIN for NaN/overflow; narrower integers wrap from int32),
integer arithmetic wraps (`-fwrapv`). Products are rounded on their own, as eager and the interpreter
round each op (`dvm_keepf`: GCC would otherwise contract a VM op's `a*b` and a following VM op's `+c`,
or mod's product and difference, into one fma; an fma turned an exact 0 of `1 % 3e-21` into
-8.6e-17); inside the math functions contraction stays on.
"""

from __future__ import annotations

import math

from ms_dynvm.codegen import cmath
from ms_dynvm.codegen.spec import (
    ZERO,
    Const,
    KernelSpec,
    Let,
    Load,
    Op,
    Step,
    Store,
    ix_dim,
    ix_split,
)

LANES = 8
OMP_THRESHOLD = 1 << 15  # elements of work below which a nest runs on one thread

_CT = {"f32": "float", "f64": "double", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
       "u8": "uint8_t", "bool": "uint8_t"}
_STORAGE = {"f16": "_Float16", "bf16": "float", "f32": "float", "f64": "double", "i8": "int8_t",
            "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t", "bool": "uint8_t"}
_FLOAT_CT = ("f32", "f64")

_HELPERS = r"""
#include <stdlib.h>
static inline float dvm_divf(float x, float y) {
    float z = x == 0.0f ? NAN : (x > 0.0f ? INFINITY : -INFINITY);
    return y == 0.0f ? z : x / y;
}
static inline double dvm_divd(double x, double y) {
    double z = x == 0.0 ? NAN : (x > 0.0 ? INFINITY : -INFINITY);
    return y == 0.0 ? z : x / y;
}
"""


def c_type(ctype: str) -> str:
    return _CT[ctype]


def storage_type(dtype: str) -> str:
    return _STORAGE[dtype]


# --- literals and index expressions -------------------------------------------------------------
def c_float(v: float, ctype: str) -> str:
    v = float(v)
    if math.isnan(v):
        return "NAN" if ctype == "f32" else "((double)NAN)"
    if math.isinf(v):
        s = "INFINITY" if v > 0 else "-INFINITY"
        return s if ctype == "f32" else f"((double){s})"
    return v.hex() + ("f" if ctype == "f32" else "")


def c_literal(value, ctype: str) -> str:
    if ctype in _FLOAT_CT:
        return c_float(value, ctype)
    v = int(value)
    if ctype == "i64" and v == -(2**63):
        return "(-9223372036854775807L - 1)"
    return f"(({_CT[ctype]}){v}L)"


def c_ix(e, suffix: str = "L") -> str:
    """An index expression as C (`suffix`: the integer literals' suffix; CUDA C's is "LL")."""
    kind = e[0]
    if kind == "c":
        return f"{e[1]}{suffix}"
    if kind == "v":
        return e[1]
    if kind == "s":
        return f"s_{e[1]}"
    if kind == "st":
        return f"st_{e[1]}_{e[2]}"
    return f"({c_ix(e[1], suffix)} {kind} {c_ix(e[2], suffix)})"


# --- scalar ops ---------------------------------------------------------------------------------
def _fsuffix(ct: str, name: str) -> str:
    return name + "f" if ct == "f32" else name


# Ops that follow MindSpore CPU's own float32 formulas under `eager_math` (cmath._EAGER_C).
# (erf stays ms_dynvm's vectorised one: the C library's erff, which eager's erf is, is scalar and made
# the fused erf-form GELU of bench_tier1's LayerNorm+GELU 2x slower, 3.7x -> 1.8x over eager.)
EAGER_MATH_OPS = ("exp", "expm1", "log1p", "tanh", "mish", "sigmoid", "elu", "erfc", "log")


def _kept(expr: str, ct: str) -> str:
    """`expr` (a float product or function result) rounded apart from what a later op adds to it, as
    eager rounds each op's result (cmath.dvm_keepf: no fma contraction across ops)."""
    return f"dvm_keep{'f' if ct == 'f32' else 'd'}({expr})"


def _zero(ct: str) -> str:
    return "0.0f" if ct == "f32" else "0.0" if ct == "f64" else f"(({_CT[ct]})0)"


def _one(ct: str) -> str:
    return "1.0f" if ct == "f32" else "1.0" if ct == "f64" else f"(({_CT[ct]})1)"


# --- the scalar-op table: one entry per spec op -------------------------------------------------
# `_ANY[fn](op, ct, a)`: C expression of spec op `fn` in compute type `ct` (any), `a` its argument
# variables; `_FLOAT[fn]`: float compute types only (f32, f64); `_F32[fn]`: float32 only, functions
# of the math library (cmath), their result rounded apart (`_kept`) as eager rounds each op's result.
_ANY: dict = {}
_FLOAT: dict = {}
_F32: dict = {}


def _entry(table: dict, *names: str):
    def register(f):
        for n in names:
            table[n] = f
        return f
    return register


_BINARY = {"add": "+", "sub": "-", "mul": "*", "div_plain": "/", "bitwise_and": "&", "bitwise_or": "|",
           "bitwise_xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@_entry(_ANY, *_BINARY)
def _binary(op: Op, ct: str, a) -> str:
    if ct in _FLOAT_CT:
        if op.fn == "mul":
            return _kept(f"{a[0]} * {a[1]}", ct)
        return f"({a[0]} {_BINARY[op.fn]} {a[1]})"
    return f"({_CT[ct]})({a[0]} {_BINARY[op.fn]} {a[1]})"


@_entry(_ANY, "sub_rounded")
def _sub_rounded(op: Op, ct: str, a) -> str:
    # a - b where a is rounded first, whatever computed it. GCC contracts a product that feeds a
    # subtraction into one FMA (-ffp-contract=fast, its default outside strict_ieee): softmax's
    # exp(x*s - max) would subtract the max from the UNROUNDED x*s, while the max pass took the
    # max of the rounded products; at the row's maximum the difference is then the product's
    # rounding error instead of 0, which overflows exp once |x*s| is above ~1e9 (inf / inf =
    # NaN). `a + 0` (not folded: -0 + 0 = +0) is where a product contracts now, fma(x, s, 0),
    # one rounding as in the max pass; the subtraction stays separate.
    return f"(({a[0]} + {_zero(ct)}) - {a[1]})"


@_entry(_ANY, "cast")
def _cast(op: Op, ct: str, a) -> str:
    return _c_cast(a[0], op.attr("src"), op.attr("dst"))


@_entry(_ANY, "round_to")
def _round_to(op: Op, ct: str, a) -> str:
    return f"(float)(_Float16)({a[0]})" if op.attr("dst") == "f16" else f"dvm_bf16({a[0]})"


@_entry(_ANY, "size")
def _size(op: Op, ct: str, a) -> str:
    return c_ix(op.attr("ix"))


@_entry(_ANY, "select")
def _select(op: Op, ct: str, a) -> str:
    return f"({a[0]} ? {a[1]} : {a[2]})"


_LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}


@_entry(_ANY, *_LOGICAL)
def _logical(op: Op, ct: str, a) -> str:
    return f"(uint8_t)(({a[0]} != 0) {_LOGICAL[op.fn]} ({a[1]} != 0))"


@_entry(_ANY, "logical_not")
def _logical_not(op: Op, ct: str, a) -> str:
    return f"(uint8_t)({a[0]} == 0)"


@_entry(_ANY, "isnan")
def _isnan(op: Op, ct: str, a) -> str:
    return f"(uint8_t)({a[0]} != {a[0]})"


@_entry(_ANY, "isinf", "isfinite")
def _isinf(op: Op, ct: str, a) -> str:
    cmp = "==" if op.fn == "isinf" else "<"
    return f"(uint8_t)({_fsuffix(ct, 'fabs')}({a[0]}) {cmp} INFINITY)"


# maximum/minimum: MindSpore's rule, NaN included: maximum(nan, 0) = 0, maximum(0, nan) = nan
@_entry(_ANY, "clamp_lo", "maximum")
def _max(op: Op, ct: str, a) -> str:
    return f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"


@_entry(_ANY, "clamp_hi", "minimum")
def _min(op: Op, ct: str, a) -> str:
    return f"({a[0]} < {a[1]} ? {a[0]} : {a[1]})"


@_entry(_ANY, "neg")
def _neg(op: Op, ct: str, a) -> str:
    return f"({_CT[ct]})(-{a[0]})"


@_entry(_ANY, "abs")
def _abs(op: Op, ct: str, a) -> str:
    x = a[0]
    return f"{_fsuffix(ct, 'fabs')}({x})" if ct in _FLOAT_CT else f"({_CT[ct]})({x} < 0 ? -{x} : {x})"


@_entry(_ANY, "square")
def _square(op: Op, ct: str, a) -> str:
    x = a[0]
    return _kept(f"{x} * {x}", ct) if ct in _FLOAT_CT else f"({_CT[ct]})({x} * {x})"


@_entry(_ANY, "relu")
def _relu(op: Op, ct: str, a) -> str:
    return f"({a[0]} > {_zero(ct)} ? {a[0]} : {_zero(ct)})"


@_entry(_ANY, "relu6")
def _relu6(op: Op, ct: str, a) -> str:
    x, zero, six = a[0], _zero(ct), c_literal(6, ct)
    return f"({x} > {zero} ? ({x} < {six} ? {x} : {six}) : {zero})"


@_entry(_ANY, "sign")
def _sign(op: Op, ct: str, a) -> str:
    return f"({_CT[ct]})(({a[0]} > {_zero(ct)}) - ({a[0]} < {_zero(ct)}))"


@_entry(_ANY, "relu_grad")  # (dy, y)
def _relu_grad(op: Op, ct: str, a) -> str:
    return f"({a[1]} > {_zero(ct)} ? {a[0]} : {_zero(ct)})"


def _div(ct: str) -> str:
    return "dvm_divf" if ct == "f32" else "dvm_divd"


@_entry(_FLOAT, "div")
def _fdiv(op: Op, ct: str, a) -> str:
    return f"{_div(ct)}({a[0]}, {a[1]})"


@_entry(_FLOAT, "floor_div")  # in double, as MindSpore's FloorDiv (see the interpreter)
def _floor_div(op: Op, ct: str, a) -> str:
    return f"({_CT[ct]})floor(dvm_divd((double)({a[0]}), (double)({a[1]})))"


@_entry(_FLOAT, "trunc_div")
def _trunc_div(op: Op, ct: str, a) -> str:
    return f"{_fsuffix(ct, 'trunc')}({_div(ct)}({a[0]}, {a[1]}))"


@_entry(_FLOAT, "mod")  # in double, as MindSpore's FloorMod, the product rounded apart (dvm_keepd)
def _mod(op: Op, ct: str, a) -> str:
    q = f"floor(dvm_divd((double)({a[0]}), (double)({a[1]})))"
    return f"({_CT[ct]})((double)({a[0]}) - {_kept(f'{q} * (double)({a[1]})', 'f64')})"


@_entry(_FLOAT, "fmod")  # the exact C fmod, as MindSpore's TruncateMod (see the interpreter)
def _fmod(op: Op, ct: str, a) -> str:
    return f"{_fsuffix(ct, 'fmod')}({a[0]}, {a[1]})"


# pow, atan2 in float32: in double, rounded once, as the interpreter (powf was 1 ulp off eager's
# x ** 2 with a tensor exponent 2; see cmath)
@_entry(_FLOAT, "pow", "atan2")
def _pow_atan2(op: Op, ct: str, a) -> str:
    if ct == "f32":
        return f"dvm_{op.fn}f_d({a[0]}, {a[1]})"
    return f"{_fsuffix(ct, op.fn)}({a[0]}, {a[1]})"


@_entry(_FLOAT, "lerp")  # (the product rounded apart, as eager's Lerp: GCC would contract it into the add)
def _lerp(op: Op, ct: str, a) -> str:
    return f"({a[0]} + {_kept(f'{a[2]} * ({a[1]} - {a[0]})', ct)})"


@_entry(_FLOAT, "addcmul")
def _addcmul(op: Op, ct: str, a) -> str:
    return f"({a[0]} + {a[3]} * ({a[1]} * {a[2]}))"


@_entry(_FLOAT, "softmax_fix")  # (r, x, max): MindSpore CPU's float32 last-axis softmax (see the interpreter)
def _softmax_fix(op: Op, ct: str, a) -> str:
    r, xv, m = a
    return (f"({m} < INFINITY ? ({m} == -INFINITY ? 0.0f : {r}) "
            f": ((({xv} != {xv}) | ({xv} == INFINITY)) ? NAN : 0.0f))")


@_entry(_FLOAT, "log_softmax_fix")  # (r, x, max), f32: MindSpore CPU's log_softmax on rows with NaN or +inf
def _log_softmax_fix(op: Op, ct: str, a) -> str:
    r, xv, m = a
    return f"({m} < INFINITY ? {r} : ((({xv} != {xv}) | ({xv} == INFINITY)) ? NAN : -INFINITY))"


@_entry(_FLOAT, "fma")
def _fma(op: Op, ct: str, a) -> str:
    return f"({a[0]} * {a[1]} + {a[2]})"


@_entry(_FLOAT, "sin", "cos", "tan")  # float32: in double, rounded once (see cmath)
def _trig(op: Op, ct: str, a) -> str:
    return f"dvm_{op.fn}f_d({a[0]})" if ct == "f32" else f"{op.fn}({a[0]})"


@_entry(_FLOAT, "sqrt", "floor", "ceil", "trunc")
def _libm(op: Op, ct: str, a) -> str:
    return f"{_fsuffix(ct, op.fn)}({a[0]})"


@_entry(_FLOAT, "round")
def _round(op: Op, ct: str, a) -> str:
    return f"{_fsuffix(ct, 'rint')}({a[0]})"


@_entry(_FLOAT, "rsqrt")
def _rsqrt(op: Op, ct: str, a) -> str:
    return f"({_one(ct)} / {_fsuffix(ct, 'sqrt')}({a[0]}))"


@_entry(_FLOAT, "reciprocal")
def _reciprocal(op: Op, ct: str, a) -> str:
    return f"({_one(ct)} / {a[0]})"


@_entry(_FLOAT, "hardswish")
def _hardswish(op: Op, ct: str, a) -> str:
    x = a[0]
    return f"({x} <= -3 ? {_zero(ct)} : ({x} >= 3 ? {x} : {x} * ({x} + 3) / 6))"


@_entry(_FLOAT, "hardsigmoid")
def _hardsigmoid(op: Op, ct: str, a) -> str:
    x = a[0]
    return f"({x} <= -3 ? {_zero(ct)} : ({x} >= 3 ? {_one(ct)} : ({x} + 3) / 6))"


@_entry(_FLOAT, "leaky_relu")
def _leaky_relu(op: Op, ct: str, a) -> str:
    x = a[0]
    return f"({x} > {_zero(ct)} ? {x} : {c_literal(op.attr('alpha'), ct)} * {x})"


@_entry(_FLOAT, "log_scalar")
def _log_scalar(op: Op, ct: str, a) -> str:
    return f"log({a[0]})"


@_entry(_FLOAT, "rsqrt_scalar")
def _rsqrt_scalar(op: Op, ct: str, a) -> str:
    return f"(1.0 / sqrt({a[0]}))"


@_entry(_FLOAT, "sigmoid_grad")  # (y, dy)
def _sigmoid_grad(op: Op, ct: str, a) -> str:
    return f"({a[1]} * ({a[0]} * ({_one(ct)} - {a[0]})))"


@_entry(_FLOAT, "tanh_grad")  # (y, dy)
def _tanh_grad(op: Op, ct: str, a) -> str:
    if ct == "f32":  # MindSpore's: dy * (1 - y*y), 1 - y*y rounded once (interpreter: _grad)
        return f"({a[1]} * fmaf(-{a[0]}, {a[0]}, 1.0f))"
    one = _one(ct)
    return f"({a[1]} * (({one} - {a[0]}) * ({one} + {a[0]})))"


@_entry(_FLOAT, "elu_grad")  # (dy, y)
def _elu_grad(op: Op, ct: str, a) -> str:
    return f"({a[1]} > {_zero(ct)} ? {a[0]} : {a[0]} * ({a[1]} + {c_literal(op.attr('alpha'), ct)}))"


@_entry(_F32, "elu")
def _elu(op: Op, a) -> str:
    return f"dvm_elu_op({a[0]}, {c_float(op.attr('alpha'), 'f32')})"


# MindSpore's formulas or ours: the kernel's head says (eager_math); elu has its own entry
@_entry(_F32, *(set(EAGER_MATH_OPS) - {"elu"}), "gelu_tanh")
def _eager_math_op(op: Op, a) -> str:
    return f"dvm_{op.fn}_op({a[0]})"


@_entry(_F32, "log2", "erf", "gelu_erf")
def _own_math(op: Op, a) -> str:
    return f"dvm_{op.fn}({a[0]})"


@_entry(_F32, "exp_libm")  # the C library's expf (MindSpore CPU's softmax along a non-last axis)
def _exp_libm(op: Op, a) -> str:
    return f"expf({a[0]})"


@_entry(_F32, "erf_libm")  # the C library's erff (MindSpore CPU's float16 Erf; scalar)
def _erf_libm(op: Op, a) -> str:
    return f"erff({a[0]})"


@_entry(_F32, "silu")
def _silu(op: Op, a) -> str:
    return f"{a[0]} * dvm_sigmoid_op({a[0]})"


@_entry(_F32, "softplus")
def _softplus(op: Op, a) -> str:
    return f"dvm_softplus({a[0]}, {c_float(op.attr('beta'), 'f32')}, {c_float(op.attr('threshold'), 'f32')})"


_GRAD_FUNCS = {"gelu_grad_none": "gelu_grad_erf", "silu_grad": "silu_grad_op", "gelu_grad_tanh": "gelu_grad_tanh_op"}


@_entry(_F32, *_GRAD_FUNCS)
def _grad_func(op: Op, a) -> str:
    return f"dvm_{_GRAD_FUNCS[op.fn]}({a[0]}, {a[1]})"


def c_op(op: Op, ct: str) -> str:
    """C expression of scalar op `op` computing in compute type `ct` (args are variable names): the
    entry of `op.fn` in `_ANY`, `_FLOAT` (float compute types) or `_F32` (float32 functions)."""
    fn = op.fn
    render = _ANY.get(fn)
    if render is not None:
        return render(op, ct, op.args)
    if ct not in _FLOAT_CT:
        raise ValueError(f"op {fn} on {ct}")
    render = _FLOAT.get(fn)
    if render is not None:
        return render(op, ct, op.args)
    if ct != "f32":
        raise ValueError(f"op {fn} on {ct}")
    render = _F32.get(fn)
    if render is None:
        raise ValueError(f"no C rendering for op {fn}")
    return _kept(render(op, op.args), ct)  # (as eager rounds each op's result)


def _c_cast(x: str, src: str, dst: str, f16: str = "(float)(_Float16)({})") -> str:
    """A C cast with the VM's rules (`f16`: how a backend rounds to float16; CUDA C has no _Float16)."""
    fsrc = src in ("f16", "bf16", "f32", "f64")
    if dst == "bool":
        return f"(uint8_t)({x} != 0)"
    if dst == "f16":
        return f16.format(x)
    if dst == "bf16":
        return f"dvm_bf16((float)({x}))"
    if dst in ("f32", "f64"):
        return f"({_CT[dst]})({x})"
    if fsrc and dst in ("i8", "i16", "u8", "i32"):  # x86: convert to int32 (cvtt), then wrap
        return f"({_CT[dst]})dvm_f2i32((double)({x}))"
    if fsrc and dst == "i64":
        return f"dvm_f2i64((double)({x}))"
    return f"({_CT[dst]})({x})"


# --- statements ---------------------------------------------------------------------------------
class _Ctx:
    """How loads/stores address memory inside the loop being rendered: `ptr` maps an access to
    the name of a pointer already offset to the loop's base plus its per-iteration step."""

    def __init__(self, spec: KernelSpec, var: str | None = None, unit: bool = False):
        self.spec = spec
        self.var = var
        self.unit = unit
        self.bases: dict = {}  # (buf, base ix) -> pointer variable

    def address(self, buf: str, index) -> str:
        if self.var is None:
            return f"{buf}[{c_ix(index)}]"
        split = ix_split(index, self.var)
        if split is None:
            return f"{buf}[{c_ix(index)}]"
        base, coeff = split
        key = (buf, base)
        if key not in self.bases:
            self.bases[key] = f"p{len(self.bases)}_{self.var}"
        p = self.bases[key]
        if coeff == ZERO:
            return f"{p}[0]"
        if self.unit and coeff[0] != "c":
            return f"{p}[{self.var}]"
        return f"{p}[{self.var} * {c_ix(coeff)}]"

    def runtime_coeffs(self, stmts) -> list:
        """Run-time strides along the loop variable (the fast path requires them to be 1)."""
        out = []
        for s in stmts:
            index = s.index if isinstance(s, Store) else s.expr.index if isinstance(s, Let) and isinstance(
                s.expr, Load) else None
            if index is None:
                continue
            split = ix_split(index, self.var)
            if split is None:
                return None
            coeff = split[1]
            if coeff != ZERO and coeff[0] != "c" and coeff not in out:
                out.append(coeff)
        return out

    def base_decls(self) -> list:
        lines = []
        for (buf, base), p in self.bases.items():
            b = self.spec.buffer(buf)
            const = "const " if b.role == "in" else ""
            lines.append(f"{const}{storage_type(b.dtype)} *restrict {p} = {buf} + {c_ix(base)};")
        return lines


def render_stmt(s, ctx: _Ctx, spec: KernelSpec) -> str:
    if isinstance(s, Store):
        b = spec.buffer(s.buf)
        return f"{ctx.address(s.buf, s.index)} = ({storage_type(b.dtype)})({s.var});"
    expr = s.expr
    T = _CT[s.ctype]
    if isinstance(expr, Load):
        return f"const {T} {s.var} = ({T}){ctx.address(expr.buf, expr.index)};"
    if isinstance(expr, Const):
        return f"const {T} {s.var} = {c_literal(expr.value, s.ctype)};"
    return f"const {T} {s.var} = ({T}){c_op(expr, s.ctype)};"


# --- loops --------------------------------------------------------------------------------------
_ACC_INIT = {"sum": "0", "prod": "1"}


def _combine(kind: str, acc: str, v: str) -> str:
    if kind == "sum":
        return f"{acc} += {v};"
    if kind == "prod":
        return f"{acc} *= {v};"
    if kind == "max":  # a NaN first element stays; later NaNs are ignored (v > acc is false)
        return f"{acc} = {v} > {acc} ? {v} : {acc};"
    if kind == "min":
        return f"{acc} = {v} < {acc} ? {v} : {acc};"
    if kind == "nanmax":  # NaN propagates
        return f"{acc} = ({v} > {acc} || {v} != {v}) ? {v} : {acc};"
    raise ValueError(kind)


class CRenderer:
    def __init__(self, spec: KernelSpec, strict_ieee: bool = False, fast_math: bool = False,
                 eager_math: bool = True):
        self.spec = spec
        self.strict = strict_ieee
        self.fast = fast_math
        self.eager = eager_math
        self.lines: list[str] = []
        self.depth = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def open(self, line: str) -> None:
        self.emit(line + " {")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.emit("}")

    # --- top level ------------------------------------------------------------------------------
    def render(self) -> str:
        spec = self.spec
        head = ["/* generated by ms_dynvm.codegen.c */"]
        if self.fast:
            head.append("#define DVM_FAST 1")
        head.append(cmath.STRICT_C if self.strict else cmath.MATH_C)
        for f in EAGER_MATH_OPS + ("silu_grad", "gelu_grad_tanh", "gelu_tanh"):  # (see cmath._EAGER_C)
            head.append(f"#define dvm_{f}_op dvm_{f}{'_ms' if self.eager else ''}")
        head.append(_HELPERS)
        self.open("void dvm_kernel(void *const *ptrs, const int64_t *strides, const int64_t *sizes)")
        for k, name in enumerate(spec.syms):
            self.emit(f"const int64_t s_{name} = sizes[{k}];")
        self.emit("(void)sizes; (void)strides;")
        pos = 0
        ext = [b for b in spec.buffers if b.role in ("in", "out")]
        for k, b in enumerate(ext):
            const = "const " if b.role == "in" else ""
            T = f"{const}{storage_type(b.dtype)}"
            self.emit(f"{T} *restrict {b.name} = ({T} *)ptrs[{k}];")
            for axis in range(len(b.shape)):
                self.emit(f"const int64_t st_{b.name}_{axis} = strides[{pos}]; (void)st_{b.name}_{axis};")
                pos += 1
        for b in spec.temps:
            n = "1L"
            for d in b.shape:
                n = f"{n} * {c_ix(ix_dim(d))}"
            T = storage_type(b.dtype)
            self.emit(f"{T} *restrict {b.name} = ({T} *)malloc(sizeof({T}) * ({n}) + 16);")
        for nid, nest in enumerate(spec.nests):
            self.emit(f"/* nest {nid} */")
            self._nest(nid, nest)
        for b in spec.temps:
            self.emit(f"free({b.name});")
        self.close()
        return "\n".join(head) + "\n" + "\n".join(self.lines) + "\n"

    def _nest(self, nid: int, nest) -> None:
        self.open("")
        if nest.outer:
            total = " * ".join(f"(int64_t){c_ix(s)}" for _, s in nest.outer)
            self.emit(f"const int64_t n_outer = {total};")
            work = ["n_outer"]
            for step in nest.steps[:1]:
                work += [f"(int64_t){c_ix(s)}" for _, s in step.inner]
            if not self.strict:
                self.emit(f"#pragma omp parallel for schedule(static) if({' * '.join(work)} >= {OMP_THRESHOLD})")
            self.open("for (int64_t o = 0; o < n_outer; o++)")
            rest = "o"
            for k in range(len(nest.outer) - 1, -1, -1):
                var, size = nest.outer[k]
                if k == 0:
                    self.emit(f"const int64_t {var} = {rest};")
                else:
                    self.emit(f"const int64_t {var} = {rest} % {c_ix(size)};")
                    rest = f"({rest} / {c_ix(size)})"
            for step in nest.steps:
                self._step(step)
            self.close()
        else:
            for step in nest.steps:
                self._step(step)
        self.close()

    # --- steps ----------------------------------------------------------------------------------
    def _plain(self, stmts) -> None:
        ctx = _Ctx(self.spec)
        for s in stmts:
            self.emit(render_stmt(s, ctx, self.spec))

    def _step(self, step: Step) -> None:
        # No block around a step: its accumulators and post statements (row statistics) are read by
        # the later steps of the nest. Every name is unique, so nothing clashes.
        self._plain(step.pre)
        ms8 = step.is_reduce and bool(step.inner) and step.order in ("ms8", "ms8r")
        lanes = step.is_reduce and not self.strict and bool(step.inner) and step.order == "lanes"
        if ms8 and (len(step.inner) != 1 or any(acc.kind != "sum" for acc in step.accs)):
            raise ValueError("the ms8 order is for sums over one axis")
        for acc in step.accs:
            T = _CT[acc.ctype]
            init = acc.first if acc.first else _ACC_INIT.get(acc.kind, "-INFINITY")
            if lanes or ms8:
                self.emit(f"{T} {acc.var}_l[{LANES}];")
                self.emit(f"for (int l = 0; l < {LANES}; l++) {acc.var}_l[l] = ({T})({init});")
            if not lanes:
                self.emit(f"{T} {acc.var} = ({T})({init});")
        for var, size in step.inner[:-1]:
            self.open(f"for (int64_t {var} = 0; {var} < {c_ix(size)}; {var}++)")
        if step.inner:
            self._innermost(step, lanes)
        else:
            self.open("")
            self._plain(step.body)
            for acc in step.accs:
                self.emit(_combine(acc.kind, acc.var, acc.value))
            self.close()
        for _ in step.inner[:-1]:
            self.close()
        if lanes:
            for acc in step.accs:
                T = _CT[acc.ctype]
                self.emit(f"{T} {acc.var} = {acc.var}_l[0];")
                self.emit(f"for (int l = 1; l < {LANES}; l++) {{ {_combine(acc.kind, acc.var, f'{acc.var}_l[l]')} }}")
        self._plain(step.post)

    def _innermost(self, step: Step, lanes: bool) -> None:
        var, size = step.inner[-1]
        n = f"n_{var}"
        self.emit(f"const int64_t {n} = {c_ix(size)};")
        probe = _Ctx(self.spec, var)
        coeffs = probe.runtime_coeffs(step.body)
        if coeffs:
            cond = " && ".join(f"{c_ix(c)} == 1" for c in coeffs)
            self.open(f"if ({cond})")
            self._loop(step, var, n, lanes, unit=True)
            self.close()
            self.open("else")
            self._loop(step, var, n, lanes, unit=False)
            self.close()
        else:
            self._loop(step, var, n, lanes, unit=coeffs is not None)

    def _loop(self, step: Step, var: str, n: str, lanes: bool, unit: bool) -> None:
        ctx = _Ctx(self.spec, var, unit)
        body = [render_stmt(s, ctx, self.spec) for s in step.body]
        self.open("")
        for line in ctx.base_decls():
            self.emit(line)
        if step.is_reduce and step.order in ("ms8", "ms8r"):
            self._ms8_loop(step, var, n, body, quad=step.order == "ms8")
        elif not step.is_reduce:
            if not self.strict:
                self.emit("#pragma GCC ivdep")
            self.open(f"for (int64_t {var} = 0; {var} < {n}; {var}++)")
            for line in body:
                self.emit(line)
            self.close()
        elif not lanes:
            self._acc_loop(step, var, "0", n, body)
        else:
            base = self._lane_blocks(step, var, n, body)
            self._acc_loop(step, var, base, n, body, "_l[0]")  # peeled tail into lane 0
        self.close()

    def _acc_loop(self, step: Step, var: str, start: str, n: str, body: list, into: str = "") -> None:
        """The elements start..n-1 in index order, each combined into its accumulator (`into`: the
        suffix naming the accumulator variable, "_l[0]" for lane 0)."""
        self.open(f"for (int64_t {var} = {start}; {var} < {n}; {var}++)")
        for line in body:
            self.emit(line)
        for acc in step.accs:
            self.emit(_combine(acc.kind, f"{acc.var}{into}", acc.value))
        self.close()

    def _lane_blocks(self, step: Step, var: str, n: str, body: list) -> str:
        """The whole blocks of LANES elements, element l of a block into partial accumulator l;
        returns the name of the index where the blocks end."""
        base = f"{var}_0"
        self.emit(f"int64_t {base} = 0;")
        self.open(f"for (; {base} + {LANES} <= {n}; {base} += {LANES})")
        self.open(f"for (int l = 0; l < {LANES}; l++)")
        self.emit(f"const int64_t {var} = {base} + l;")
        for line in body:
            self.emit(line)
        for acc in step.accs:
            self.emit(_combine(acc.kind, f"{acc.var}_l[l]", acc.value))
        self.close()
        self.close()
        return base

    def _ms8_loop(self, step: Step, var: str, n: str, body: list, quad: bool = True) -> None:
        """A sum in MindSpore CPU's float32 softmax order (Step.order "ms8"): LANES partial sums over
        the whole blocks of LANES, added in lane order; then one block of 4 (if 4 remain), added in
        lane order; then the rest in index order. Without `quad` (Step.order "ms8r", its float32
        ReduceSum along the last axis of a matrix) no block of 4: the rest in index order."""
        base = self._lane_blocks(step, var, n, body)
        self.open(f"if ({base} > 0)")
        for acc in step.accs:
            T = _CT[acc.ctype]
            self.emit(f"{T} {acc.var}_h = {acc.var}_l[0];")
            self.emit(f"for (int l = 1; l < {LANES}; l++) {acc.var}_h += {acc.var}_l[l];")
            self.emit(f"{acc.var} += {acc.var}_h;")
        self.close()
        if not quad:
            self._acc_loop(step, var, base, n, body)
            return
        self.open(f"if ({n} - {base} >= 4)")
        for acc in step.accs:
            self.emit(f"{_CT[acc.ctype]} {acc.var}_q[4];")
        self.open("for (int l = 0; l < 4; l++)")
        self.emit(f"const int64_t {var} = {base} + l;")
        for line in body:
            self.emit(line)
        for acc in step.accs:
            self.emit(f"{acc.var}_q[l] = 0.0f + {acc.value};")
        self.close()
        for acc in step.accs:
            q = f"{acc.var}_q"
            self.emit(f"{acc.var} += (({q}[0] + {q}[1]) + {q}[2]) + {q}[3];")
        self.emit(f"{base} += 4;")
        self.close()
        self._acc_loop(step, var, base, n, body)  # (sums only: += in index order)


def render(spec: KernelSpec, *, strict_ieee: bool = False, fast_math: bool = False,
           eager_math: bool = True) -> str:
    """C99 source of `spec` (see the module doc for the entry point's signature). `eager_math`: the
    ops of EAGER_MATH_OPS follow MindSpore CPU's formulas (cmath._EAGER_C), else ms_dynvm's."""
    return CRenderer(spec, strict_ieee, fast_math, eager_math).render()


__all__ = ["LANES", "OMP_THRESHOLD", "render", "c_op", "c_type", "storage_type"]
