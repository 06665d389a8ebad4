"""Reference executor of the bytecode in NumPy: it DEFINES what every VM op computes.

Every compiled kernel is tested against this module, and this module is tested against MindSpore
2.10 CPU eager (tests/runtime/test_interpreter.py). `IMPLS[op](args, attrs)` computes one op:
`args` are NumPy arrays (registers) or Python scalars/None (immediates), `attrs` complete; it
returns an array or a tuple of arrays whose dtype is the op's result dtype (the same rules as
`ms_dynvm.ir.registry`, written independently so that a test can compare the two).
`run_instr`/`interpret` execute instructions/programs: each result is cast to the NumPy dtype of its
declared type and checked against the declared shape (symbolic dims are bound on first use).

Numerics:
- Arithmetic (+ - * /, floor/ceil/round, sqrt, reciprocal, comparisons, sums, matmul) runs in the
  result dtype, as MindSpore does, so float32 results are bit-close; binary ops first cast both
  operands (immediates included) to the result dtype. f16 sums/means/matmuls accumulate in f32.
- Transcendental functions (exp, log, tanh, erf, gelu, softmax, layer_norm, var, ...) compute in
  float64 from the input cast to the result dtype, then round once to the result dtype (tested
  against MindSpore's float32 kernels with rtol = atol = 1e-5). erf uses a vectorised `math.erf`
  (float32 erf: the C library's erff, as MindSpore); float32 pow computes in double, rounds once.
  Except where MindSpore's own float32 formula was reproduced and is used instead (so the VM's
  semantics are eager's values): exp, expm1, log1p, tanh, mish, sigmoid, silu, elu, rsqrt
  (`_MS_F32`), hardswish and hardsigmoid (in float32) and softmax (`_softmax_f32_ms`); float16 exp, tanh, elu, mish, sigmoid, silu, rsqrt, expm1, log1p,
  sin, cos, tan as MindSpore's float16 kernels compute them (`_MS_F16`: float32 formulas, some
  rounding every step to float16; bit-equal over every finite float16 but 44 mish and 2 tan
  values, 1 ulp off).
- bf16 values are held in float32 and rounded to bfloat16 (round to nearest even on the bit
  pattern) after every op whose declared result is bf16, and on program inputs/constants; a bf16 op
  is thus computed in f32 and rounded once. A Python float operand of a bf16 add/sub/mul/div is
  rounded to bf16 first, as MindSpore does.

MindSpore CPU behaviours the VM adopts (measured; they are part of the semantics):
- sign(nan) = 0, relu(nan) = relu6(nan) = 0; clamp is r = (x > lo ? x : lo), then (r < hi ? r : hi):
  a NaN x gives the bound that is applied last, a NaN lo gives NaN unless hi replaces it, lo > hi
  gives hi.
- max/min/argmax/argmin/max_with_index reductions scan the reduced elements in row-major order
  keeping the first extreme: NaN wins only when it is the first element (else NaNs are ignored);
  ties give the first index. max/min over no elements give NaN (0 for integers): MindSpore's
  amax/amin give uninitialised memory there (its arg reductions raise, and so does the
  interpreter). max_pool2d ignores NaN and -inf: its result is at least the lowest finite value of
  the dtype (MindSpore's kernel starts from -FLT_MAX).
- Division by zero: in float div/floor_div/trunc_div the sign of the zero is ignored (MindSpore's
  tensor-tensor kernels; see the deviations below for scalar operands): x/(+-0) is inf
  for x > 0, NaN for x == 0 and -inf otherwise (NaN included); integer floor_div/trunc_div give the
  dtype's max for x > 0, min for x < 0 and 0 for x == 0; integer mod/fmod by zero give x. Otherwise
  floor_div = floor(x/y), trunc_div = trunc(x/y), float mod = x - floor(x/y)*y and fmod =
  x - trunc(x/y)*y (so mod(1, inf) is NaN, as in MindSpore).
- hardswish/hardsigmoid are piecewise (-inf -> 0); var divides by n - correction even when it is
  not positive.
- Integer pow is computed in double and converted as x86 does (`_int_pow`): with a negative
  exponent 1 -> 1, -1 -> +-1, others -> 0, 0 -> inf, and a result out of range is the minimum for
  i32/i64 (0 once wrapped to i8/i16/u8).
- mul/div type a 0-d tensor operand like a scalar (see ir/registry.py), and compute in
  that result dtype, except a float16 array times or divided by a 0-d float32/float64 array:
  computed in float32 (the 0-d value as float32), then rounded to float16, as MindSpore does.
- Integer mean is MindSpore's: the sum in double converted to the dtype (x86: INT_MIN out of range
  for i32/i64, wrapped for 8/16 bits), divided in float32, truncated toward zero (over no
  elements: NaN cast to the dtype, INT_MIN for i32);
  bool add/sub/mul are or/xor/and (computed as integers).
- Float -> integer casts of NaN/inf/out-of-range values follow x86 (INT_MIN for i32/i64), as
  MindSpore's CPU casts; float -> bool is `x != 0` (NaN -> True).
- gather/index_select/gather_d/scatter_add/gather_d_grad accept indices in [-n, n); gather_nd and
  tensor_scatter_* accept [0, n); anything else raises InterpreterError (MindSpore raises too).
  unsorted_segment_sum drops ids outside [0, num_segments); unsorted_segment_max/min/prod raise
  on them (MindSpore CPU raises). tensor_scatter_update: the last duplicate wins (MindSpore CPU's
  order).
- unsorted_segment_max/min are MindSpore CPU's loop: per segment, starting from the dtype's lowest
  (max) or largest (min) finite value, x[i] replaces the value when strictly greater (smaller), in
  index order: NaN never wins, -inf (+inf) gives the lowest (largest) finite value, an empty segment
  keeps it, and of 0.0 and -0.0 the first one seen stays. unsorted_segment_prod multiplies in index
  order in the dtype (1 for an empty segment).
- layer_norm returns (y, mean, var): the third output is the biased variance WITHOUT eps, as
  MindSpore's LayerNorm primitive on CPU (eps only enters y = (x-mean)/sqrt(var+eps)*gamma+beta).
- gelu_grad 'tanh' is MindSpore's GeLUGrad (the GeLU primitive is the tanh form); 'none' is the
  exact derivative. elu_grad(dy, y) = dy if y > 0 else dy*(y + alpha).
- avg_pool2d divides by the full kernel area (count_include_pad=True, MindSpore's default);
  max/avg_pool2d padding is at most half the kernel (no window lies wholly in the padding).
- dropout: the interpreter cannot replay an RNG; p == 0 gives (x, ones mask in x's dtype), any
  other p raises InterpreterError.

Deliberate deviations from MindSpore CPU (kernel artefacts the VM does not copy):
- logsumexp/softmax_cross_entropy on rows holding NaN or +-inf follow IEEE (PyTorch) semantics:
  logsumexp of all -inf is -inf (MindSpore's composite gives NaN). softmax and log_softmax follow
  MindSpore CPU there (measured on 2.10): a row holding NaN or +inf gives, in log_softmax (any float
  dtype and axis), NaN at those elements and -inf elsewhere; in float32 softmax along the last axis,
  NaN at those elements and 0 elsewhere, and 0 for a row of only -inf; softmax in other dtypes and
  along other axes follows IEEE (the whole row NaN), as MindSpore does. Not copied: MindSpore's
  log_softmax along a non-last axis gives some such rows wholly NaN ([-inf, -inf, 5, nan]), and with
  several such rows in one tensor its float32 softmax sometimes zeroes other rows as well.
- relu6(NaN) is 0 (MindSpore: 0 or NaN depending on the position in its vector loop).
- maximum/minimum propagate NaN (MindSpore does for equal shapes with more than one element, but may
  return the other operand when one operand has one element or broadcasts).
- The division-by-zero rules above hold for immediates too: x/(-0) is x/(+0) (MindSpore's scalar
  division kernels keep IEEE signed zeros) and integer x % 0 is x (MindSpore's scalar kernel gives
  INT_MIN). trunc_div broadcasting a scalar dividend is exact (MindSpore's broadcasting TruncateDiv
  returns inf for 1.5/1.5).
- any(x) is any(x != 0): MindSpore 2.10's CPU any (ReduceAny/AnyExt) is only right for bool inputs
  (any([[3., 0.]]) = False, any(i32 [[5, 5, 5, 5]], axis=0) = [T, F, F, F], any(u8 [3]) = 3).
- pad with negative pads crops; MindSpore's CPU PadV3 sometimes returns the pad value instead of the
  kept elements on repeated calls (pad([1, -0.], (-1, 0), 0.5) = [0.5] from the second call on).
- MindSpore's softmax backward on CPU is wrong for some single-row inputs (vjp of softmax on shape
  (2,), axis -1); softmax_grad is y * (dy - sum(dy * y)).
- Empty reductions: prod is 1, max/min/argmax raise (MindSpore returns uninitialised memory).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.text import Reg, format_instr
from ms_dynvm.bytecode.types import Sym, TensorType
from ms_dynvm.numerics import ms_sum_order  # (re-exported: shared with codegen.spec)


class InterpreterError(RuntimeError):
    """An instruction that the reference interpreter cannot execute (bad values, RNG, `call`)."""


Impl = Callable[[list, dict], "np.ndarray | tuple"]
IMPLS: dict[str, Impl] = {}
# The same implementations without the per-call NumPy error state and warnings filter, for
# executors that set `np.errstate(all="ignore")` once around many ops (jit/replay.py).
RAW_IMPLS: dict[str, Impl] = {}


def _impl(*names: str):
    """Register `fn` for `names`; an `fn(op, args, attrs)` (three parameters) is told which op runs."""

    def register(fn):
        takes_op = len(inspect.signature(fn).parameters) == 3
        for n in names:
            IMPLS[n] = _wrap(fn, n if takes_op else None)
            RAW_IMPLS[n] = functools.partial(fn, n) if takes_op else fn
        return fn

    return register


def _wrap(fn, op: str | None) -> Impl:
    def run(args: list, attrs: dict):
        # Overflow/NaN/division warnings are expected: inf and nan results are the semantics.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(args, attrs) if op is None else fn(op, args, attrs)

    run.__name__ = run.__qualname__ = fn.__name__ if op is None else f"{fn.__name__}[{op}]"
    run.__doc__ = fn.__doc__
    return run


# --- dtype helpers (independent of ir.registry on purpose) ---------------------------------------
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def _is_arr(v) -> bool:
    return isinstance(v, np.ndarray)


def _vm(a: np.ndarray) -> str:
    return dtypes.from_numpy(a.dtype)


def _promote(*vals) -> np.dtype:
    """NumPy dtype of the MindSpore promotion of arrays and immediates (None skipped)."""
    arrs = [v for v in vals if _is_arr(v)]
    scalars = [v for v in vals if not _is_arr(v) and v is not None]
    if arrs:
        dt = _vm(arrs[0])
        for a in arrs[1:]:
            dt = dtypes.promote(dt, _vm(a))
        for s in scalars:
            dt = dtypes.promote_scalar(dt, s)
    else:
        kinds = [0 if isinstance(s, bool) else 1 if isinstance(s, int) else 2 for s in scalars]
        dt = ("bool", "i64", "f32")[max(kinds)]
    return dtypes.to_numpy(dt)


def _promote2(op: str, a, b) -> np.dtype:
    """Binary promotion; mul/div (either side) treat a 0-d array against an array of rank >= 1 as a
    scalar of its kind, as MindSpore's Mul/Div kernels do. (fmod, TruncateMod's semantics, promotes
    plainly: MindSpore's FmodScalar, which had the rule, has no CPU kernel.)"""
    positions = {"mul": (0, 1), "div": (0, 1)}.get(op, ())
    pair = (a, b)
    for i in positions:
        z, other = pair[i], pair[1 - i]
        if _is_arr(z) and _is_arr(other) and z.ndim == 0 and other.ndim > 0:
            higher = dtypes.kind(_vm(z)) > dtypes.kind(_vm(other))
            return z.dtype if higher else other.dtype
    return _promote(a, b)


def _compute_dtype(op: str, a, b, dt: np.dtype) -> np.dtype:
    """The dtype a binary op computes in before rounding to its result dtype `dt`: `dt`, except a
    float16 array times or divided by a 0-d float32/float64 array, which MindSpore computes in
    float32 with the 0-d value as float32 (measured bit-equal on 20,000 values each; rounding the
    value to float16 first was 1 ulp off on a fifth of them)."""
    if dt == np.float16 and op in ("mul", "div"):
        for z, other in ((a, b), (b, a)):
            if (_is_arr(z) and _is_arr(other) and z.ndim == 0 and other.ndim > 0 and z.dtype.kind == "f"
                    and z.dtype.itemsize > 2):
                return F32
    return dt


def _floaty(dt: np.dtype) -> np.dtype:
    """Result dtype of a float-valued op on `dt`: bool/integers -> float32."""
    return dt if dt.kind in "fc" else F32


def _cast(v, dt: np.dtype) -> np.ndarray:
    """`v` (array or immediate) as an array of `dt`; integers wrap, complex keeps the real part."""
    a = np.asarray(v)
    if a.dtype.kind == "c" and dt.kind != "c":
        a = a.real
    return a.astype(dt, copy=False)


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.complex128 if a.dtype.kind == "c" else F64)


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise InterpreterError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _axes(axis, rank: int) -> tuple[int, ...]:
    if axis is None or axis == ():
        return tuple(range(rank))
    if isinstance(axis, int):
        axis = (axis,)
    if rank == 0:
        return ()
    return tuple(sorted(_norm_axis(a, rank) for a in axis))


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), held in float32."""
    a = np.array(a, dtype=np.float32, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
    bits = a.view(np.uint32).astype(np.uint64)
    u = np.uint64  # typed constants: a Python int with a 0-d uint64 would promote to float64
    rounded = ((bits + u(0x7FFF) + ((bits >> u(16)) & u(1))) & u(0xFFFF0000)).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), a, rounded).astype(np.float32)


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# --- elementwise unary -------------------------------------------------------------------------
_FLOAT_FNS = {
    "exp": lambda x, a: np.exp(x),
    "expm1": lambda x, a: np.expm1(x),
    "log": lambda x, a: np.log(x),
    "log1p": lambda x, a: np.log1p(x),
    "log2": lambda x, a: np.log2(x),
    "rsqrt": lambda x, a: 1.0 / np.sqrt(x),
    "sin": lambda x, a: np.sin(x),
    "cos": lambda x, a: np.cos(x),
    "tan": lambda x, a: np.tan(x),
    "tanh": lambda x, a: np.tanh(x),
    "sigmoid": lambda x, a: _sigmoid(x),
    "silu": lambda x, a: x * _sigmoid(x),
    "mish": lambda x, a: x * np.tanh(np.logaddexp(0.0, x)),
    "erf": lambda x, a: _erf(x),
    "erfc": lambda x, a: _erfc(x),
    "gelu": lambda x, a: _gelu(x, a["approximate"]),
    "elu": lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(x)),
    "leaky_relu": lambda x, a: np.where(x > 0, x, a["alpha"] * x),
    "softplus": lambda x, a: _softplus(x, a["beta"], a["threshold"]),
}


def _gelu(x, approximate: str):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _softplus(x, beta: float, threshold: float):
    z = beta * x
    r = np.where(z > threshold, x, np.logaddexp(0.0, z) / beta)
    return np.where(np.isnan(z), np.asarray(np.inf, r.dtype), r)  # softplus(NaN) is +inf, as MindSpore's


# MindSpore 2.10's CPU kernels compute float32 exp, tanh and mish with their own formulas, which
# differ from the true functions by more than 1e-5 in places (exp: up to 2e-5 relative for |x| > 38,
# its reduction constant ln2 being rounded to 0.693147; tanh: a (7, 6) Pade approximant, 1.0000098 at
# x = 5 and +-1 beyond; mish: NaN above x = 44.36, where (1 + e^x)^2 overflows; log1p and expm1:
# logf(1 + x) and expf(x) - 1, 0 for |x| < 6e-8; sigmoid, silu, elu: built on that exp). These are eager's
# semantics, so the reference follows them in float32, in float32 steps (a fused multiply-add as one
# rounding of the float64 value: exact product, the sum rounded twice, which can differ from one
# rounding in the last bit); the kernels do the same (codegen/cmath._EAGER_C, `eager_math`).
_F32 = np.float32


def _fma32(a, b, c):
    return (a.astype(F64) * b + c).astype(_F32)


def _exp_ms(x):
    with np.errstate(all="ignore"):
        xc = np.clip(np.where(np.isnan(x), _F32(0), x), _F32(-87.3365478515625), _F32(88.72283935546875))
        t = xc * _F32(1.44269504088896341)
        t = np.where(xc > 0, t + _F32(0.5), t - _F32(0.5))
        k = t.astype(np.int32)
        d = _fma32(-k.astype(_F32), _F32(0.693147), xc)
        p = _fma32(d, _F32(1.0) / _F32(120.0), _F32(1.0) / _F32(24.0))
        for c in (_F32(1.0) / _F32(6.0), _F32(0.5), _F32(1.0), _F32(1.0)):
            p = _fma32(d, p, c)
        r = (_F32(2.0) * p) * ((k + 126).astype(np.uint32) << np.uint32(23)).view(_F32)
    return np.where(np.isnan(x), x, r).astype(_F32)


def _tanh_ms(x):
    with np.errstate(all="ignore"):
        s = x * x
        a = _fma32(_fma32(s + _F32(378.0), s, _F32(17325.0)), s, _F32(135135.0)) * x
        b = _fma32(_fma32(_fma32(_F32(28.0), s, _F32(3150.0)), s, _F32(62370.0)), s, _F32(135135.0))
        r = a / b
    return np.where(x > 5, _F32(1.0), np.where(x < -5, _F32(-1.0), r)).astype(_F32)


def _mish_ms(x):
    with np.errstate(all="ignore"):
        u = _F32(1.0) + _exp_ms(x)
        q = u * u
        return (x * ((q - _F32(1.0)) / (q + _F32(1.0)))).astype(_F32)


def _log1p_ms(x):  # logf(1 + x), expf(x) - 1: MindSpore's log1p and expm1 (0 for tiny x)
    with np.errstate(all="ignore"):
        return np.log((x + _F32(1.0)).astype(F64)).astype(_F32)


def _expm1_ms(x):
    with np.errstate(all="ignore"):
        return (np.exp(x.astype(F64)).astype(_F32) - _F32(1.0)).astype(_F32)


def _sigmoid_ms(x):  # 1 / (1 + e^-x) on MindSpore's exp; silu = x * that; elu = alpha * (e^x - 1)
    with np.errstate(all="ignore"):
        return (_F32(1.0) / (_F32(1.0) + _exp_ms(-x))).astype(_F32)


def _elu_ms(x, alpha):
    with np.errstate(all="ignore"):
        return np.where(x > 0, x, _F32(alpha) * (_exp_ms(x) - _F32(1.0))).astype(_F32)


def _silu_ms(x):
    with np.errstate(all="ignore"):
        return (x * _sigmoid_ms(x)).astype(_F32)


_LIBM: dict = {}  # name -> the C library's float function as a NumPy ufunc, or None


def _libm_f32(name: str, x: np.ndarray, fallback, dtype=None) -> np.ndarray:
    """The C library's float32 function `name` (expf, erff, tanhf) applied element by element, as
    MindSpore's kernels call it; where it cannot be loaded, `fallback(x in float64)` rounded to
    float32. `dtype` F64: the double function (tanh) on float64 x."""
    dt = _F32 if dtype is None else np.dtype(dtype).type
    if name not in _LIBM:
        try:
            import ctypes
            import ctypes.util

            fn = getattr(ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6"), name)
            ct = ctypes.c_float if dt is _F32 else ctypes.c_double
            fn.restype, fn.argtypes = ct, [ct]
            _LIBM[name] = np.frompyfunc(fn, 1, 1)
        except (OSError, AttributeError):
            _LIBM[name] = None
    f = _LIBM[name]
    if f is None or x.size == 0:
        with np.errstate(all="ignore"):
            return fallback(x.astype(F64)).astype(dt)
    return np.asarray(f(x), dtype=dt).reshape(x.shape)


def _gelu_tanh_ms(x: np.ndarray) -> np.ndarray:
    """MindSpore CPU's GeLU, tanh form: u = 0.7978845608 * (x + 0.044715*x*x*x), then
    (0.5 * x) * (1 + tanh(u)), every step in x's type (float32: the C library's tanhf; float64:
    its tanh); float16 runs the float32 form and rounds once (measured bit-equal to eager on
    16,009 values with NaN/inf/+-0/1e30 each; the closed form in float64 rounded once was
    off on 45% of float32 values, up to 2e-4 relative where 1 + tanh cancels)."""
    dt = np.dtype(x.dtype).type
    c, k = dt(0.044715), dt(0.7978845608)
    with np.errstate(all="ignore"):
        u = k * (x + ((c * x) * x) * x)
        t = _libm_f32("tanhf" if dt is _F32 else "tanh", u, np.tanh, dt)
        return (dt(0.5) * x) * (dt(1.0) + t)


def _gelu_ms(x: np.ndarray, attrs) -> np.ndarray:
    """gelu on float32 (or float32-held float16) x: MindSpore's tanh form; the erf form as
    _FLOAT_FNS computes it (float64, rounded by the caller)."""
    if attrs["approximate"] == "tanh":
        return _gelu_tanh_ms(x)
    return _gelu(x.astype(F64), "none")


def _erff_libm(x: np.ndarray) -> np.ndarray:
    """MindSpore CPU's float32 Erf: the C library's erff (bit-equal on 20,000 values, where erf in
    double rounded once was 1 ulp off on 4%)."""
    return _libm_f32("erff", x, _erf)


# op -> f(float32 x, attrs), as _FLOAT_FNS
_MS_F32 = {
    "erf": lambda x, a: _erff_libm(x),
    "exp": lambda x, a: _exp_ms(x),
    "expm1": lambda x, a: _expm1_ms(x),
    "log1p": lambda x, a: _log1p_ms(x),
    "tanh": lambda x, a: _tanh_ms(x),
    "mish": lambda x, a: _mish_ms(x),
    "sigmoid": lambda x, a: _sigmoid_ms(x),
    "silu": lambda x, a: _silu_ms(x),
    "elu": lambda x, a: _elu_ms(x, a["alpha"]),
    "rsqrt": lambda x, a: _F32(1.0) / np.sqrt(x),  # 1 / sqrtf(x): two float32 roundings
    "gelu": lambda x, a: _gelu_ms(x, a).astype(_F32),
}


_LN2 = math.log(2.0)


def _r16(a):
    """float32 values rounded to float16 and back: one float16 step of MindSpore's kernels."""
    return np.asarray(a).astype(np.float16).astype(_F32)


def _sigmoid_f16(x):  # 1 / (1 + e^-x), each step rounded to float16, e^-x from float32 expf
    with np.errstate(all="ignore"):
        return _F32(1.0) / _r16(_F32(1.0) + _r16(np.exp(-x)))


# op -> f(float32 x holding float16 values, attrs) -> float32, rounded to float16 by the caller:
# MindSpore 2.10 CPU's float16 kernels, measured bit-equal over every finite float16:
# some run the float32 formula and round once, others round every step to float16.
_MS_F16 = {
    "exp": lambda x, a: _exp_ms(x),
    "tanh": lambda x, a: _tanh_ms(x),
    "elu": lambda x, a: _elu_ms(x, a["alpha"]),
    "mish": lambda x, a: _mish_ms(x),  # (44 of 63488 values 1 ulp apart; tan: 2)
    "sigmoid": lambda x, a: _sigmoid_f16(x),
    "silu": lambda x, a: x * _r16(_sigmoid_f16(x)),
    "rsqrt": lambda x, a: _F32(1.0) / _r16(np.sqrt(x)),
    "expm1": lambda x, a: _r16(np.exp(x)) - _F32(1.0),
    "log1p": lambda x, a: np.log(_r16(x + _F32(1.0))),
    # logf of the C library, as MindSpore's float16 Log and Log2 (f16(log x) / f16(ln 2)): measured
    # bit-equal on every finite float16 (NumPy's float32 log was 1 value off)
    "log": lambda x, a: _libm_f32("logf", x, np.log),
    "erf": lambda x, a: _erff_libm(x),  # (erff rounded: float64 erf rounded once was 2 values off)
    "log2": lambda x, a: _r16(_libm_f32("logf", x, np.log)) / _F32(np.float16(_LN2)),
    "sin": lambda x, a: np.sin(x),
    "cos": lambda x, a: np.cos(x),
    # (tan and erfc in double, rounded to float32, then by the caller to float16, as the kernels
    # and eager: rounding the double value once was 2 values off each)
    "tan": lambda x, a: np.tan(x.astype(F64)).astype(_F32),
    "erfc": lambda x, a: np.asarray(_erfc(x.astype(F64))).astype(_F32),
    "gelu": lambda x, a: _gelu_ms(x, a),
}


@_impl(*_FLOAT_FNS)
def _float_unary(op, args, attrs):
    """Float-valued unary ops: computed in float64 from x cast to the result dtype (float32 ops of
    _MS_F32 and float16 ops of _MS_F16: MindSpore's formulas, above)."""
    x = args[0]
    out = _floaty(x.dtype)
    if out == np.float32 and op in _MS_F32:
        return _MS_F32[op](np.asarray(x.astype(_F32)), attrs)
    if out == np.float16 and op in _MS_F16:
        with np.errstate(all="ignore"):
            return np.asarray(_MS_F16[op](np.asarray(x.astype(_F32)), attrs)).astype(np.float16)
    if out == F64 and op == "gelu" and attrs["approximate"] == "tanh":
        return _gelu_tanh_ms(x.astype(F64))
    return _FLOAT_FNS[op](_wide(x.astype(out)), attrs).astype(out)


@_impl("sqrt", "reciprocal")
def _native_float_unary(op, args, attrs):
    """Correctly rounded in the result dtype itself."""
    x = args[0]
    out = _floaty(x.dtype)
    xc = x.astype(out)
    return np.sqrt(xc) if op == "sqrt" else (np.ones((), out) / xc).astype(out)


@_impl("neg", "abs", "square", "relu", "relu6", "floor", "ceil", "round", "trunc", "sign", "identity")
def _keep_unary(op, args, attrs):
    x = args[0]
    dt = x.dtype
    if op == "neg":
        if dt == BOOL:
            raise InterpreterError("neg: bool tensors cannot be negated")
        return np.negative(x)
    if op == "abs":
        return np.abs(x) if dt != BOOL else x.copy()
    if op == "square":
        return np.square(x) if dt != BOOL else x.copy()
    if op == "relu":  # where(x > 0): relu(nan) = 0 as MindSpore
        return np.where(x > 0, x, np.zeros((), dt)).astype(dt)
    if op == "relu6":
        return np.where(x > 0, np.where(x < 6, x, np.asarray(6).astype(dt)), np.zeros((), dt)).astype(dt)
    if op in ("floor", "ceil", "round", "trunc"):
        if dt.kind not in "fc":
            return x.copy()
        return {"floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc}[op](x)
    if op == "sign":  # sign(nan) = 0 as MindSpore
        return (np.where(x > 0, 1, 0) - np.where(x < 0, 1, 0)).astype(dt)
    return x.copy()


@_impl("hardswish", "hardsigmoid")
def _hard(op, args, attrs):
    """Piecewise as MindSpore: 0 for x <= -3; x (hardswish) or 1 (hardsigmoid) for x >= 3; else
    x*(x+3)/6 or (x+3)/6 (so -inf -> 0, NaN stays NaN); integer inputs truncate."""
    x = args[0]
    # float32 in float32, as MindSpore's kernel (x * relu6(x + 3) / 6): bit-equal on every
    # bfloat16-representable float32 (measured); the other dtypes in float64.
    ct = np.dtype(_F32) if x.dtype == _F32 else F64
    xf = x.astype(ct)
    three, six = ct.type(3.0), ct.type(6.0)
    mid = (xf * (xf + three)) / six if op == "hardswish" else (xf + three) / six
    r = np.where(xf <= -3.0, ct.type(0.0), np.where(xf >= 3.0, xf if op == "hardswish" else ct.type(1.0), mid))
    return (np.trunc(r) if x.dtype.kind in "iub" else r).astype(x.dtype)


@_impl("logical_not", "isnan", "isinf", "isfinite")
def _bool_unary(op, args, attrs):
    x = args[0]
    if op == "logical_not":
        return np.logical_not(x)
    if x.dtype.kind not in "fc":
        return np.full(x.shape, op == "isfinite", dtype=BOOL)
    return {"isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite}[op](x)


@_impl("cast")
def _cast_impl(args, attrs):
    out = dtypes.to_numpy(attrs["dtype"])
    x = args[0]
    if out == BOOL:
        return x != 0
    return np.array(_cast(x, out), copy=True)  # a new value even when the dtype does not change


@_impl("full_like")
def _full_like(args, attrs):
    x = args[0]
    out = dtypes.to_numpy(attrs["dtype"]) if attrs["dtype"] else x.dtype
    return np.full(x.shape, _cast(attrs["value"], out), dtype=out)


# --- elementwise binary ------------------------------------------------------------------------
def _int_div0(x, y, q, dt):
    """Integer division by zero as MindSpore CPU: max for x > 0, min for x < 0, 0 for 0."""
    if dt == BOOL:
        return q
    info = np.iinfo(dt)
    fix = np.where(x > 0, info.max, np.where(x < 0, info.min, 0)).astype(dt)
    return np.where(y == 0, fix, q)


def _int_pow(x, y, dt):
    """Integer pow as MindSpore 2.10 CPU computes it: in double, then converted as x86's cvttsd2si
    does, to int64 for 8-byte types and to int32 (then wrapped to the type) for the others: a result
    out of range, or 1/0, is the "integer indefinite" INT_MIN (0 once wrapped to 8 or 16 bits),
    negative exponents truncate toward 0, and int64 results above 2^53 carry double's rounding
    (measured: 10^10 in int32 is INT_MIN, 3^39 in int64 is 4052555153018976256)."""
    with np.errstate(all="ignore"):
        p = np.power(np.asarray(x).astype(F64), np.asarray(y).astype(F64))
    return _x86_int(p, dt)


def _x86_int(p, dt):
    """Floats converted to the integer dtype `dt` as x86's cvttsd2si does in MindSpore's kernels:
    truncated, to int64 for 8-byte types and to int32 (then wrapped to the type) for the others; a
    value out of range, or NaN, is the "integer indefinite" INT_MIN (0 once wrapped to 8/16 bits)."""
    it = np.dtype(np.int64 if dt.itemsize == 8 else np.int32)
    lim = -float(np.iinfo(it).min)
    p = np.asarray(p)
    with np.errstate(all="ignore"):
        ok = (p >= -lim) & (p < lim)  # (False for NaN)
        r = np.where(ok, p, 0.0).astype(it)
    return np.where(ok, r, np.iinfo(it).min).astype(dt)


def _fdiv(x, y):
    """Float x / y as MindSpore's CPU kernels: the sign of a zero divisor is ignored, so x/(+-0) is
    NaN for x == 0, inf for x > 0 and -inf otherwise (NaN included)."""
    by_zero = np.where(x == 0, np.nan, np.where(x > 0, np.inf, -np.inf)).astype(np.result_type(x, y))
    return np.where(y == 0, by_zero, x / y)


def _arith(op: str, x, y, dt):
    """One arithmetic op on arrays already cast to `dt` (an integer or float dtype)."""
    if op == "add":
        return x + y
    if op == "sub":
        return x - y
    if op == "mul":
        return x * y
    # MindSpore CPU's Maximum/Minimum are `x > y ? x : y` / `x < y ? x : y`, NaN included
    # (maximum(nan, 0) = 0, maximum(0, nan) = nan; measured for f16/f32/f64, any size, broadcast).
    if op == "maximum":
        return np.where(x > y, x, y) if x.dtype.kind in "fc" else np.maximum(x, y)
    if op == "minimum":
        return np.where(x < y, x, y) if x.dtype.kind in "fc" else np.minimum(x, y)
    if dt.kind in "fc":
        # MindSpore's FloorDiv and FloorMod compute float16/32 in double (measured: bit-equal on
        # 80k float32 pairs up to 1e7 in size; the float32 quotient rounds up to an integer where
        # the exact one is just below it, 0.5% of such pairs).
        if op == "floor_div":
            return np.floor(_fdiv(_wide(x), _wide(y))).astype(dt)
        if op == "trunc_div":
            return np.trunc(_fdiv(x, y))
        if op == "mod":
            xd, yd = _wide(x), _wide(y)
            return (xd - np.floor(_fdiv(xd, yd)) * yd).astype(dt)
        if op == "fmod":
            # TruncateMod (FmodScalar has no CPU kernel): the exact C fmod, as MindSpore CPU's
            # (measured bit-equal for float16/32/64 with NaN/inf/0 operands;
            # x - trunc(x/y)*y was off on 68%). (ops.fmod and mint.fmod dispatch DivMod, Mul and
            # SubExt instead.)
            return np.fmod(x, y)
        if op == "pow":
            if dt == _F32:
                # pow in double, rounded once (NumPy's float32 power is not correctly rounded: 1-2
                # ulp from eager on 20-33% of values; this matches eager on 100% for exponents 2
                # and -1 and 73-74% for 3, 0.5, 2.5, where MindSpore's vectorised path differs).
                with np.errstate(all="ignore"):
                    return np.power(x.astype(F64), np.asarray(y).astype(F64)).astype(_F32)
            return np.power(x, y)
    if op == "floor_div":
        return _int_div0(x, y, np.floor_divide(x, y), dt)
    if op == "trunc_div":
        q = np.floor_divide(x, y)
        q = np.where(((x - q * y) != 0) & ((x < 0) != (y < 0)), q + 1, q)
        return _int_div0(x, y, q, dt)
    if op == "mod":
        return np.where(y == 0, x, np.remainder(x, y))
    if op == "fmod":  # (TruncateMod of integers by 0 gives 0, measured)
        return np.where(y == 0, np.zeros((), dt), np.fmod(x, np.where(y == 0, np.ones((), dt), y)))
    if op == "pow":
        return _int_pow(x, y, dt)
    raise InterpreterError(f"unknown arithmetic op {op}")


@_impl("add", "sub", "mul", "floor_div", "trunc_div", "mod", "fmod", "pow", "maximum", "minimum")
def _arith_impl(op, args, attrs):
    a, b = args
    dt = _promote2(op, a, b)
    if dt == BOOL and op == "trunc_div":  # MindSpore divides bools in float: 0/0 is NaN, so True
        with np.errstate(all="ignore"):
            return np.trunc(_fdiv(_cast(a, np.dtype(np.float32)), _cast(b, np.dtype(np.float32)))) != 0
    if dt == BOOL:  # bool arithmetic as integers, then != 0 (add = or, sub = xor, mul = and)
        return _arith(op, _cast(a, np.dtype(np.int8)), _cast(b, np.dtype(np.int8)), np.dtype(np.int8)) != 0
    cdt = _compute_dtype(op, a, b, dt)
    return np.asarray(_arith(op, _cast(a, cdt), _cast(b, cdt), cdt)).astype(dt)


@_impl("div", "atan2")
def _div(op, args, attrs):
    a, b = args
    dt = _floaty(_promote2(op, a, b))
    cdt = _compute_dtype(op, a, b, dt)
    x, y = _cast(a, cdt), _cast(b, cdt)
    if op == "div":
        return np.asarray(_fdiv(x, y) if dt.kind == "f" else x / y).astype(dt)
    return np.arctan2(_wide(x), _wide(y)).astype(dt)


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}


@_impl(*_CMP)
def _compare(op, args, attrs):
    a, b = args
    dt = _promote(a, b)
    return np.asarray(_CMP[op](_cast(a, dt), _cast(b, dt)))


@_impl("logical_and", "logical_or", "logical_xor")
def _logical(op, args, attrs):
    a, b = (np.asarray(v) != 0 for v in args)
    return np.asarray(getattr(np, op)(a, b))


@_impl("bitwise_and", "bitwise_or", "bitwise_xor")
def _bitwise(op, args, attrs):
    a, b = args
    dt = _promote(a, b)
    if dt.kind not in "biu":
        raise InterpreterError(f"{op}: needs bool or integer operands, got {dt}")
    return np.asarray(getattr(np, op)(_cast(a, dt), _cast(b, dt))).astype(dt)


@_impl("bias_add")
def _bias_add(args, attrs):
    x, b = args
    dt = _promote(x, b)
    axis = _norm_axis(attrs["axis"], x.ndim)
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return (_cast(x, dt) + _cast(b, dt).reshape(shape)).astype(dt)


# --- elementwise ternary -----------------------------------------------------------------------
@_impl("where")
def _where(args, attrs):
    cond, x, y = args
    dt = _promote(x, y)
    return np.where(np.asarray(cond) != 0, _cast(x, dt), _cast(y, dt)).astype(dt)


@_impl("masked_fill")
def _masked_fill(args, attrs):
    x, mask, value = args
    return np.where(mask, _cast(value, x.dtype), x).astype(x.dtype)


@_impl("clamp")
def _clamp(args, attrs):
    """r = x > lo ? x : lo, then r < hi ? r : hi (MindSpore CPU's comparisons, NaN included)."""
    x, lo, hi = args
    dt = _promote(x, lo, hi)
    r = _cast(x, dt)
    if lo is not None:
        lo = _cast(lo, dt)
        r = np.where(r > lo, r, lo)
    if hi is not None:
        hi = _cast(hi, dt)
        r = np.where(r < hi, r, hi)
    return np.asarray(r).astype(dt)


@_impl("lerp")
def _lerp(args, attrs):
    a, b, w = args
    dt = _floaty(_promote(a, b))  # (the weight's dtype does not count: see ir/registry.py)
    # float16: MindSpore CPU computes a + w * (b - a) in float32 and rounds once, the weight taken as
    # float32 (a float32 0-d weight, which `ops.lerp(a, b, 0.7)` passes, is not rounded to float16;
    # measured bit-equal on 6,000 values; float16 steps were off on 20%)
    if dt == np.float16:
        a, b = (_cast(_cast(v, dt), F32) for v in (a, b))
        w = _cast(w, F32)
    else:
        a, b, w = (_cast(v, dt) for v in (a, b, w))
    return np.asarray(a + w * (b - a)).astype(dt)


@_impl("addcmul")
def _addcmul(args, attrs):
    value = attrs["value"]
    dt = dtypes.to_numpy(dtypes.promote_scalar(dtypes.from_numpy(_promote(*args)), value))
    a, b, c = (_cast(v, dt) for v in args)
    return np.asarray(a + _cast(value, dt) * (b * c)).astype(dt)


# --- backward kernels --------------------------------------------------------------------------
@_impl("relu_grad")
def _relu_grad(args, attrs):
    dy, y = args
    dt = _promote(dy, y)
    return np.where(y > 0, _cast(dy, dt), np.zeros((), dt)).astype(dt)


def _gelu_grad_f64(x, approximate: str):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x**3))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x)
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _gelu_grad_tanh_ms(dy, x):
    """MindSpore CPU's GeLUGrad, tanh form, in float32 (its float16 and float64 GeLUGrad give the
    same values rounded: measured bit-equal on 16,000 values each): tanh and the slope
    factor m in double, rounded to float32, then dy * (((1 + t) + (x * (1 - t*t)) * m) / 2), every
    step rounded to float32 (float64 in the closed form, `_gelu_grad_f64`, was off on about two
    thirds of the values)."""
    x32, dy32 = x.astype(F32), dy.astype(F32)
    d = x32.astype(F64)
    with np.errstate(all="ignore"):
        t = np.tanh(0.7978845608 * (d + 0.044715 * d * d * d)).astype(F32)
        m = (0.7978845608 + 0.1070322244 * d * d).astype(F32)
        one = np.float32(1.0)
        return dy32 * (((one + t) + (x32 * (one - t * t)) * m) / np.float32(2.0))


@_impl("gelu_grad", "sigmoid_grad", "tanh_grad", "silu_grad", "elu_grad")
def _grad(op, args, attrs):
    """Computed in float64 from operands cast to the result dtype."""
    ts = args[:2]
    dt = _floaty(_promote(*ts))
    if op == "sigmoid_grad" and dt == np.float16:
        # MindSpore CPU's float16 SigmoidGrad rounds each step: f16(f16(f16(1 - y) * y) * dy)
        # (measured bit-equal on 20,000 values; float64 rounded once was 1-2 ulp off on 29%).
        y16, dy16 = _cast(ts[0], dt), _cast(ts[1], dt)
        with np.errstate(all="ignore"):
            return np.asarray(((np.float16(1) - y16) * y16) * dy16).astype(dt)
    if op == "sigmoid_grad" and dt == F32:
        # MindSpore CPU's float32 SigmoidGrad: dy * (y * (1 - y)), each step rounded to float32
        # (measured bit-equal on 6,000 values; float64 rounded once was off on 28%)
        y32, dy32 = _cast(ts[0], dt), _cast(ts[1], dt)
        with np.errstate(all="ignore"):
            return np.asarray(dy32 * (y32 * (_F32(1.0) - y32))).astype(dt)
    if op == "silu_grad" and dt == np.float16:
        # MindSpore CPU's float16 SiLUGrad: the float16 sigmoid s (its own steps, `_sigmoid_f16`),
        # then dy*s + (dy*x) * (s*(1 - s)) with every step rounded to float16 (measured bit-equal on
        # 6,000 values; the float32 form rounded once was off on 57%)
        dy, x = (_cast(v, dt).astype(_F32) for v in ts)
        with np.errstate(all="ignore"):
            sg = _r16(_sigmoid_f16(x))
            return np.asarray(_r16(_r16(dy * sg) + _r16(_r16(dy * x) * _r16(sg * _r16(_F32(1.0) - sg))))).astype(dt)
    if op == "tanh_grad" and dt in (F32, np.float16):
        # MindSpore CPU's TanhGrad: dy * (1 - y*y), the 1 - y*y with one rounding (a fused
        # multiply-add; y*y is exact in double), the product rounded to float32 (measured bit-equal
        # on 20,000 values, float16's too after its rounding; (1-y)(1+y) was off on 21%, float64 on
        # 24%)
        y, dy = (_cast(v, dt).astype(F32) for v in ts)
        with np.errstate(all="ignore"):
            t = (1.0 - y.astype(F64) * y.astype(F64)).astype(F32)
            return np.asarray(dy * t).astype(dt)
    if op == "silu_grad" and dt == F32:
        # MindSpore CPU's float32 SiLUGrad: s = 1 / (1 + e^-x) on its exp, then
        # dy*s + (dy*x) * (s*(1 - s)), each step rounded to float32 (measured bit-equal on 12,000
        # values in [-104, 90]; float64 rounded once was off on 43%)
        dy, x = (_cast(v, dt) for v in ts)
        with np.errstate(all="ignore"):
            sg = _sigmoid_ms(x)
            return np.asarray(dy * sg + (dy * x) * (sg * (_F32(1.0) - sg))).astype(dt)
    if op == "gelu_grad" and attrs["approximate"] == "tanh" and dt in (F32, np.float16, F64):
        return np.asarray(_gelu_grad_tanh_ms(_cast(ts[0], dt), _cast(ts[1], dt))).astype(dt)
    a, b = (_wide(_cast(v, dt)) for v in ts)
    if op == "gelu_grad":  # (dy, x, y); y unused, as MindSpore's GeLUGrad
        r = a * _gelu_grad_f64(b, attrs["approximate"])
    elif op == "sigmoid_grad":  # (y, dy)
        r = b * a * (1.0 - a)
    elif op == "tanh_grad":  # (y, dy)
        r = b * (1.0 - a * a)
    elif op == "silu_grad":  # (dy, x)
        s = _sigmoid(b)
        r = a * s * (1.0 + b * (1.0 - s))
    else:  # elu_grad (dy, y)
        r = np.where(b > 0, a, a * (b + attrs["alpha"]))
    return np.asarray(r).astype(dt)


@_impl("softmax_grad")
def _softmax_grad(args, attrs):
    y, dy = args
    dt = _floaty(_promote(y, dy))
    yw, dyw = _wide(_cast(y, dt)), _wide(_cast(dy, dt))
    shape = np.broadcast_shapes(yw.shape, dyw.shape)
    yw, dyw = (np.broadcast_to(v, shape).reshape(shape or (1,)) for v in (yw, dyw))
    axis = _softmax_axis(attrs["axis"], yw.ndim)
    return (yw * (dyw - np.sum(dyw * yw, axis=axis, keepdims=True))).reshape(shape).astype(dt)


def _check_index(op: str, idx: np.ndarray, n: int, negative: bool) -> np.ndarray:
    """Indices checked against a dim of size n (negatives wrap when allowed)."""
    lo = -n if negative else 0
    if idx.size and (idx.min() < lo or idx.max() >= n):
        bad = idx[(idx < lo) | (idx >= n)].reshape(-1)[0]
        raise InterpreterError(f"{op}: index {bad} out of range [{lo}, {n})")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


@_impl("gather_d_grad")
def _gather_d_grad(args, attrs):
    index, grad = args
    shape = tuple(attrs["shape"])
    if not shape:  # a 0-d x (dim 0 taken as of a 1-element tensor, as gather_d)
        _norm_axis(attrs["dim"], 1)
        return _gather_d_grad([np.asarray(index).reshape(1), np.asarray(grad).reshape(1)],
                              {"shape": (1,), "dim": 0}).reshape(())
    dim = _norm_axis(attrs["dim"], len(shape))
    out = np.zeros(shape, grad.dtype)
    full = list(np.indices(index.shape, sparse=True))
    full[dim] = _check_index("gather_d_grad", index, shape[dim], True)
    np.add.at(out, tuple(full), grad)
    return out


# --- reductions --------------------------------------------------------------------------------
def _acc(dt: np.dtype) -> np.dtype:
    """Accumulator for sums/means: f16 accumulates in f32 (MindSpore's CPU kernels)."""
    return F32 if dt == np.float16 else dt


def _finish(r, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """Reshape a reduction computed with keepdims=True to the requested form."""
    r = np.asarray(r)
    return r if keepdims else r.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _sum_f32_ms(op: str, x: np.ndarray, axes: tuple) -> np.ndarray:
    """MindSpore's float32 sum of `x` over `axes` (keepdims) in its order (`ms_sum_order`)."""
    order = ms_sum_order(op, x.ndim, axes, x.shape)
    with np.errstate(all="ignore"):
        if order == "ms8r":
            n = x.shape[1]
            k = n - n % 8
            lanes = np.zeros((x.shape[0], 8), F32)
            for j in range(0, k, 8):
                lanes = lanes + x[:, j:j + 8]  # (float32 + float32: rounded to float32)
            s = lanes[:, 0]
            for j in range(1, 8):
                s = s + lanes[:, j]
            for j in range(k, n):
                s = s + x[:, j]
            return s.reshape(-1, 1)
        if order == "seq":
            s = np.zeros(x.shape[1:], F32)
            for i in range(x.shape[0]):
                s = s + x[i]
            return s[None]
        return np.sum(x, axis=axes, dtype=F64, keepdims=True).astype(F32)


def _seq_f64(op: str, x: np.ndarray, axes: tuple) -> np.ndarray:
    """A float64 sum or product of `x` over `axes` (keepdims) in index order (row-major over the
    reduced axes), one accumulator starting at 0 (sum: a zero result is +0) or 1: MindSpore 2.10
    CPU's float64 ReduceSum/ReduceMean/ReduceProd (measured bit-equal on 16 shape/axis cases and
    reduced sizes up to 100,000; above about 150,000 reduced elements it splits the
    work over threads in an order not reproduced). NumPy's pairwise sum differs from it from 9
    elements on."""
    rows = _rows(x, axes)
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    if rows.shape[-1] == 0:
        return np.full(shape, 0.0 if op == "sum" else 1.0, F64)
    with np.errstate(all="ignore"):
        if op == "sum":
            r = np.add.accumulate(rows, axis=-1)[..., -1] + 0.0  # (+ 0.0: -0 -> +0, as from 0)
        else:
            r = np.multiply.accumulate(rows, axis=-1)[..., -1]
    return r.reshape(shape)


@_impl("sum", "prod")
def _sum_prod(op, args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    if attrs["dtype"]:
        out = dtypes.to_numpy(attrs["dtype"])
    else:
        out = I64 if x.dtype.kind in "biu" else x.dtype
    if op == "sum" and out == F32:
        return _finish(_sum_f32_ms(op, _cast(x, out), axes), x, axes, attrs["keepdims"])
    if out == F64:
        return _finish(_seq_f64(op, _cast(x, out), axes), x, axes, attrs["keepdims"])
    fn = np.sum if op == "sum" else np.prod
    r = fn(_cast(x, out), axis=axes, dtype=_acc(out), keepdims=True)
    return _finish(r, x, axes, attrs["keepdims"]).astype(out)


@_impl("mean")
def _mean(args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    out = dtypes.to_numpy(attrs["dtype"]) if attrs["dtype"] else x.dtype
    if out == BOOL:
        raise InterpreterError("mean: bool result dtype")
    n = math.prod(x.shape[a] for a in axes)
    xc = _cast(x, out)
    if out.kind in "iu":
        # MindSpore 2.10 CPU: the sum in double, converted to the dtype (x86: INT_MIN out of range
        # for i32/i64, wrapped for 8/16 bits), then float32(sum) / float32(n), truncated (measured:
        # int32 [2^31-1, 2^31-1, 1] -> -715827904, int8 [100, 100, 100] -> 14, [16777217, 2] ->
        # 8388610).
        sd = np.sum(xc.astype(F64), axis=axes, keepdims=True)
        if n == 0:  # 0/0 = NaN cast to the integer dtype (INT_MIN for i32/i64), as MindSpore
            return _finish(np.full(sd.shape, _cast(np.nan, out)), x, axes, attrs["keepdims"])
        with np.errstate(all="ignore"):
            q = _x86_int(sd, out).astype(np.float32) / np.float32(n)
        r = _x86_int(q.astype(F64), out)
    elif out == F32:  # MindSpore: its float32 sum (_sum_f32_ms), then / n in float32
        with np.errstate(all="ignore"):
            r = _sum_f32_ms("mean", xc, axes) / np.float32(n)
    elif out == F64:  # MindSpore: its float64 sum in index order (_seq_f64), then / n
        with np.errstate(all="ignore"):
            r = _seq_f64("sum", xc, axes) / np.float64(n)
    else:
        r = np.sum(xc, axis=axes, dtype=_acc(out), keepdims=True) / np.asarray(n, _acc(out))
    return _finish(r, x, axes, attrs["keepdims"]).astype(out)


def _rows(x: np.ndarray, axes) -> np.ndarray:
    """x with the reduced axes moved last and flattened (row-major order of the reduced run)."""
    rest = [i for i in range(x.ndim) if i not in axes]
    k = math.prod(x.shape[a] for a in axes)
    return np.transpose(x, rest + list(axes)).reshape([x.shape[i] for i in rest] + [k])


def _extreme(op: str, x: np.ndarray, axes) -> np.ndarray:
    """max/min over `axes` (keepdims=False) with MindSpore CPU's NaN rule (see module doc)."""
    rows = _rows(x, axes)
    if rows.shape[-1] == 0:
        # MindSpore hands back uninitialised memory (amax/amin over an empty axis): no value is
        # right; NaN (0 for integers) lets a program whose empty extreme goes unused run on.
        return np.full(rows.shape[:-1], np.nan if x.dtype.kind == "f" else 0, x.dtype)
    if x.dtype.kind == "f":
        red = (np.fmax if op == "max" else np.fmin).reduce(rows, axis=-1)
        first = rows[..., 0]
        return np.where(np.isnan(first), first, red)
    return (np.max if op == "max" else np.min)(rows, axis=-1)


def _arg_extreme(op: str, x: np.ndarray, axes) -> np.ndarray:
    rows = _rows(x, axes)
    if rows.shape[-1] == 0:
        raise InterpreterError(f"{op}: reduction over no elements")
    is_max = op in ("argmax", "max")
    if x.dtype.kind == "f":
        fill = -np.inf if is_max else np.inf
        idx = (np.argmax if is_max else np.argmin)(np.where(np.isnan(rows), fill, rows), axis=-1)
        return np.where(np.isnan(rows[..., 0]), 0, idx)
    return (np.argmax if is_max else np.argmin)(rows, axis=-1)


def _keep(r: np.ndarray, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    if not keepdims:
        return np.asarray(r)
    return np.asarray(r).reshape([1 if i in axes else d for i, d in enumerate(x.shape)])


@_impl("max", "min")
def _max_min(op, args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    return _keep(_extreme(op, x, axes), x, axes, attrs["keepdims"]).astype(x.dtype)


@_impl("argmax", "argmin")
def _argmax(op, args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    keepdims = attrs["keepdims"] and attrs["axis"] is not None  # flattened: always a scalar
    return _keep(_arg_extreme(op, x, axes), x, axes, keepdims).astype(dtypes.to_numpy(attrs["dtype"]))


@_impl("max_with_index", "min_with_index")
def _with_index(op, args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    kind = op[:3]
    values = _keep(_extreme(kind, x, axes), x, axes, attrs["keepdims"]).astype(x.dtype)
    return values, _keep(_arg_extreme(kind, x, axes), x, axes, attrs["keepdims"]).astype(I64)


@_impl("all", "any")
def _all_any(op, args, attrs):
    x = args[0]
    axes = _axes(attrs["axis"], x.ndim)
    r = (np.all if op == "all" else np.any)(x != 0, axis=axes, keepdims=attrs["keepdims"])
    return np.asarray(r).astype(np.uint8 if (op == "any" and x.dtype == np.uint8) else BOOL)


@_impl("var")
def _var(args, attrs):
    """sum((x - mean)^2) / (n - correction), as MindSpore (0/0 is NaN, a negative divisor gives -0 or a
    negative value)."""
    x = args[0]
    out = _floaty(x.dtype)
    axes = _axes(attrs["axis"], x.ndim)
    xw = _wide(x.astype(out))
    n = math.prod(x.shape[a] for a in axes)
    mean = np.sum(xw, axis=axes, keepdims=True) / n
    ss = np.sum(np.abs(xw - mean) ** 2, axis=axes, keepdims=True)
    r = ss / (n - attrs["correction"])
    return _finish(r, x, axes, attrs["keepdims"]).astype(out)


def _logsumexp_f64(x: np.ndarray, axes) -> np.ndarray:
    """keepdims=True; shifted by the max (0 where it is not finite): all -inf -> -inf, +inf -> inf."""
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m


@_impl("logsumexp")
def _logsumexp(args, attrs):
    x = args[0]
    out = _floaty(x.dtype)
    axes = _axes(attrs["axis"], x.ndim)
    return _finish(_logsumexp_f64(_wide(x.astype(out)), axes), x, axes, attrs["keepdims"]).astype(out)


# --- normalisations ----------------------------------------------------------------------------
def _softmax_axis(axis, rank: int) -> int:
    if isinstance(axis, (tuple, list)):
        (axis,) = axis
    return _norm_axis(axis, rank)


def _expf_libm(d: np.ndarray) -> np.ndarray:
    """The C library's expf (what MindSpore CPU's softmax along a non-last axis calls); without it,
    exp in float64 rounded to float32 (differs from glibc's in about 0.1% of inputs, by 1 ulp)."""
    return _libm_f32("expf", d, np.exp)


def _softmax_f32_ms(x: np.ndarray, axis: int) -> np.ndarray:
    """MindSpore 2.10 CPU's float32 softmax (nnacl), which fused kernels reproduce with eager_math
    (codegen/spec.py `_lower_softmax`): d = x - max in float32; along the last axis e = its own exp
    (`_exp_ms`), the sum in float32 in its SIMD order (8 partial sums over the whole blocks of 8,
    added in lane order; then one block of 4 if 4 remain, added in lane order; then the rest one by
    one) and e * (1 / sum); along another axis e = the C library's expf, the sum in float32 in index
    order and e / sum. (The rule for rows holding NaN or +inf is applied by the caller.)"""
    xm = np.moveaxis(x, axis, -1)
    last = axis == x.ndim - 1
    n = xm.shape[-1]
    with np.errstate(all="ignore"):
        m = np.max(xm, axis=-1, keepdims=True, initial=-np.inf).astype(_F32)
        d = (xm - m).astype(_F32)
        e = _exp_ms(d) if last else _expf_libm(d)
        s = np.zeros(xm.shape[:-1], _F32)
        k = 0
        if last:
            if n >= 8:
                lanes = np.zeros(xm.shape[:-1] + (8,), _F32)
                while k + 8 <= n:
                    lanes = (lanes + e[..., k:k + 8]).astype(_F32)
                    k += 8
                h = lanes[..., 0]
                for j in range(1, 8):
                    h = (h + lanes[..., j]).astype(_F32)
                s = (s + h).astype(_F32)
            if n - k >= 4:
                q = (_F32(0.0) + e[..., k:k + 4]).astype(_F32)
                s = (s + (((q[..., 0] + q[..., 1]).astype(_F32) + q[..., 2]).astype(_F32)
                          + q[..., 3]).astype(_F32)).astype(_F32)
                k += 4
        for j in range(k, n):
            s = (s + e[..., j]).astype(_F32)
        s = s[..., None]
        r = (e * (_F32(1.0) / s).astype(_F32)) if last else (e / s)
    return np.moveaxis(r.astype(_F32), -1, axis)


@_impl("nan_to_num")
def _nan_to_num(args, attrs):
    """MindSpore's NanToNum: each replacement rounded to x's dtype (float16: 1e5 -> inf, 65519 ->
    65504), None the dtype's largest / lowest finite value; float16 and float32 only."""
    x = args[0]
    if x.dtype not in (np.float16, _F32):
        raise InterpreterError(f"nan_to_num: {x.dtype} x is not supported")
    fi = np.finfo(x.dtype)
    pos = fi.max if attrs["posinf"] is None else attrs["posinf"]
    neg = fi.min if attrs["neginf"] is None else attrs["neginf"]
    with np.errstate(all="ignore"):
        nan, pos, neg = (_cast(v, x.dtype) for v in (attrs["nan"], pos, neg))
        r = np.where(np.isnan(x), nan, np.where(x == np.inf, pos, np.where(x == -np.inf, neg, x)))
    return r.astype(x.dtype)


@_impl("softmax", "log_softmax")
def _softmax(op, args, attrs):
    x = args[0]
    out = _floaty(x.dtype)
    xw = _wide(x.astype(out))
    if x.ndim == 0:
        xw = xw.reshape(1)
    axis = _softmax_axis(attrs["axis"], xw.ndim)
    with np.errstate(invalid="ignore"):
        m = np.max(xw, axis=axis, keepdims=True, initial=-np.inf)
        if op == "softmax" and x.dtype == _F32:
            r = _softmax_f32_ms(np.asarray(x).reshape(xw.shape), axis)
        elif op == "softmax" and x.dtype == np.float16:
            # MindSpore CPU's float16 softmax (measured bit-equal on 19,724 values, both axes, rows
            # of 1-3000, NaN/inf rows included): d = f16(x - max), e = f16(expf(d)) with the C
            # library's expf, the sum of e in float32, y = f16(e / f16(sum)).
            xf = np.asarray(x).reshape(xw.shape).astype(_F32)
            with np.errstate(all="ignore"):
                d = (xf - np.max(xf, axis=axis, keepdims=True, initial=-np.inf)).astype(np.float16).astype(_F32)
                e = _expf_libm(d).astype(np.float16).astype(_F32)
                sm = np.sum(e, axis=axis, keepdims=True, dtype=_F32).astype(np.float16).astype(_F32)
                r = (e / sm).astype(np.float16)
        elif op == "softmax":
            e = np.exp(xw - m)
            r = e / np.sum(e, axis=axis, keepdims=True)
        else:
            r = xw - m - np.log(np.sum(np.exp(xw - m), axis=axis, keepdims=True))
        # MindSpore CPU on rows holding NaN or +inf (m is then NaN or +inf): log_softmax gives NaN
        # there and -inf elsewhere; float32 softmax along the last axis gives NaN there and 0
        # elsewhere, and 0 on a row of only -inf. (Softmax in other dtypes and along other axes:
        # IEEE, the whole row NaN.)
        if op == "log_softmax" or (x.dtype == np.float32 and x.ndim >= 1 and axis == x.ndim - 1):
            bad_row = ~(m < np.inf)
            bad = np.isnan(xw) | (xw == np.inf)
            fill = -np.inf if op == "log_softmax" else 0.0
            r = np.where(bad_row, np.where(bad, np.nan, fill), r)
            if op == "softmax":
                r = np.where(m == -np.inf, 0.0, r)
    return r.reshape(x.shape).astype(out)


@_impl("layer_norm")
def _layer_norm(args, attrs):
    """(y, mean, var) with var the biased variance without eps (MindSpore's LayerNorm); mean and var
    are float32 for every float x, as MindSpore returns them."""
    x, gamma, beta = args
    out = _floaty(x.dtype)
    bna = _norm_axis(attrs["begin_norm_axis"], x.ndim)
    axes = tuple(range(bna, x.ndim))
    xw = _wide(x.astype(out))
    n = math.prod(x.shape[bna:])
    mean = np.sum(xw, axis=axes, keepdims=True) / n
    var = np.sum((xw - mean) ** 2, axis=axes, keepdims=True) / n
    if out == np.float16:
        # MindSpore CPU's float16 LayerNorm (measured bit-equal): mean and var in double, returned
        # as float32; y in float16 arithmetic, each step rounded to float16, from the float32
        # statistics: ((x - f16(mean)) / f16(sqrt(var + eps))) * gamma + beta.
        mean32, var32 = mean.astype(np.float32), var.astype(np.float32)
        sd = np.sqrt(var32 + np.float32(attrs["eps"])).astype(np.float16)
        with np.errstate(all="ignore"):
            y = (x.astype(np.float16) - mean32.astype(np.float16)) / sd
            y = y * _cast(gamma, out) + _cast(beta, out)
        return y.astype(np.float16), mean32, var32
    if out == np.float32:
        # MindSpore CPU's float32 LayerNorm (measured bit-equal): mean and var in double,
        # rounded to float32; then each step in float32: ((x - mean) / sqrtf(var + eps)) * gamma + beta.
        mean32, var32 = mean.astype(np.float32), var.astype(np.float32)
        with np.errstate(all="ignore"):
            sd = np.sqrt(var32 + np.float32(attrs["eps"]))
            y = (x.astype(np.float32) - mean32) / sd
            y = y * _cast(gamma, out) + _cast(beta, out)
        return y.astype(np.float32), mean32, var32
    y = (xw - mean) / np.sqrt(var + attrs["eps"]) * _wide(_cast(gamma, out)) + _wide(_cast(beta, out))
    # (the statistics are float32 whatever x's type, as MindSpore returns them)
    return y.astype(out), mean.astype(np.float32), var.astype(np.float32)


@_impl("softmax_cross_entropy")
def _softmax_cross_entropy(args, attrs):
    """loss = -sum(labels * log_softmax(logits), -1); dlogits = softmax(logits) - labels."""
    logits, labels = args
    out = _floaty(_promote(logits, labels))
    lw, yw = _wide(_cast(logits, out)), _wide(_cast(labels, out))
    logp = lw - _logsumexp_f64(lw, (lw.ndim - 1,))
    loss = -np.sum(yw * logp, axis=-1)
    return loss.astype(out), (np.exp(logp) - yw).astype(out)


# --- views -------------------------------------------------------------------------------------
@_impl("reshape")
def _reshape(args, attrs):
    shape = tuple(attrs["shape"])
    x = args[0]
    if x.size == 0 and -1 in shape and 0 in shape:
        # NumPy refuses (the -1 is ambiguous); MindSpore makes it 0 ([0, 3] -> (0, -1) is [0, 0]).
        shape = tuple(0 if d == -1 else d for d in shape)
    return x.reshape(shape).copy()


@_impl("transpose")
def _transpose(args, attrs):
    x = args[0]
    return np.ascontiguousarray(np.transpose(x, tuple(attrs["perm"]))) if x.ndim else x.copy()


@_impl("expand_dims")
def _expand_dims(args, attrs):
    axis = attrs["axis"]
    return np.expand_dims(args[0], tuple(axis) if isinstance(axis, (tuple, list)) else axis).copy()


@_impl("squeeze")
def _squeeze(args, attrs):
    x = args[0]
    axis = attrs["axis"]
    if axis is None or axis == ():
        return np.squeeze(x).copy()
    axes = _axes(axis, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise InterpreterError(f"squeeze: dims {axes} of {x.shape} are not all 1")
    return np.squeeze(x, axis=axes).copy()


@_impl("broadcast_to")
def _broadcast_to(args, attrs):
    x = args[0]
    target = tuple(attrs["shape"])
    lead = len(target) - x.ndim
    shape = tuple(x.shape[i - lead] if t == -1 else t for i, t in enumerate(target))
    return np.broadcast_to(x, shape).copy()


@_impl("slice")
def _slice(args, attrs):
    x = args[0]
    index = tuple(slice(b, e, s) for b, e, s in zip(attrs["begin"], attrs["end"], attrs["step"]))
    return x[index].copy()


@_impl("select")
def _select(args, attrs):
    x = args[0]
    axis = _norm_axis(attrs["axis"], x.ndim)
    index = int(_check_index("select", np.asarray(attrs["index"]), x.shape[axis], True))
    return np.take(x, index, axis=axis)


# --- data movement -----------------------------------------------------------------------------
@_impl("contiguous")
def _contiguous(args, attrs):
    return np.array(args[0], copy=True)


@_impl("concat", "stack")
def _concat_stack(op, args, attrs):
    dt = _promote(*args)
    parts = [_cast(a, dt) for a in args]
    return np.concatenate(parts, axis=attrs["axis"]) if op == "concat" else np.stack(parts, axis=attrs["axis"])


@_impl("split")
def _split(args, attrs):
    x = args[0]
    axis = _norm_axis(attrs["axis"], x.ndim)
    sizes = list(attrs["sizes"])
    if sum(sizes) != x.shape[axis]:
        raise InterpreterError(f"split: sizes {sizes} do not add up to dim {x.shape[axis]}")
    return tuple(p.copy() for p in np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@_impl("unstack")
def _unstack(args, attrs):
    x = args[0]
    axis = _norm_axis(attrs["axis"], x.ndim)
    return tuple(np.take(x, i, axis=axis) for i in range(x.shape[axis]))


@_impl("tile")
def _tile(args, attrs):
    return np.tile(args[0], tuple(attrs["multiples"]))


@_impl("gather")
def _gather(args, attrs):
    x, idx = args
    bd = attrs["batch_dims"] + idx.ndim if attrs["batch_dims"] < 0 else attrs["batch_dims"]
    axis = _norm_axis(attrs["axis"], x.ndim)
    idx = _check_index("gather", idx, x.shape[axis], True)
    if bd == 0:
        return np.take(x, idx, axis=axis)
    out = np.empty(x.shape[:axis] + idx.shape[bd:] + x.shape[axis + 1:], x.dtype)
    for b in np.ndindex(*x.shape[:bd]):
        out[b] = np.take(x[b], idx[b], axis=axis - bd)
    return out


@_impl("gather_d")
def _gather_d(args, attrs):
    x, idx = args
    if x.ndim == 0:  # MindSpore takes dim 0 (or -1) of a 0-d tensor as of a 1-element one
        _norm_axis(attrs["dim"], 1)
        return _gather_d([x.reshape(1), np.asarray(idx).reshape(1)], {"dim": 0}).reshape(())
    dim = _norm_axis(attrs["dim"], x.ndim)
    idx = _check_index("gather_d", idx, x.shape[dim], True)
    xs = x[tuple(slice(None) if i == dim else slice(0, n) for i, n in enumerate(idx.shape))]
    return np.take_along_axis(xs, idx, axis=dim)


def _nd_rows(op: str, x: np.ndarray, idx: np.ndarray) -> list[tuple]:
    k = idx.shape[-1]
    for j in range(k):
        _check_index(op, idx[..., j], x.shape[j], False)
    return [tuple(int(v) for v in idx[i]) for i in np.ndindex(*idx.shape[:-1])]


@_impl("gather_nd")
def _gather_nd(args, attrs):
    x, idx = args
    rows = _nd_rows("gather_nd", x, idx)
    k = idx.shape[-1]
    out = np.empty(idx.shape[:-1] + x.shape[k:], x.dtype)
    for i, r in zip(np.ndindex(*idx.shape[:-1]), rows):
        out[i] = x[r]
    return out


@_impl("index_select")
def _index_select(args, attrs):
    x, idx = args
    axis = _norm_axis(attrs["axis"], x.ndim)
    return np.take(x, _check_index("index_select", idx, x.shape[axis], True), axis=axis)


@_impl("scatter_add")
def _scatter_add(args, attrs):
    x, idx, src = args
    dim = _norm_axis(attrs["dim"], x.ndim)
    out = x.copy()
    full = list(np.indices(idx.shape, sparse=True))
    full[dim] = _check_index("scatter_add", idx, x.shape[dim], True)
    np.add.at(out, tuple(full), _cast(src[tuple(slice(0, n) for n in idx.shape)], x.dtype))
    return out


@_impl("tensor_scatter_add", "tensor_scatter_update")
def _tensor_scatter(op, args, attrs):
    """Rows of `updates` applied in order: duplicates add up (add) or the last one wins (update)."""
    x, idx, upd = args
    out = x.copy()
    upd = _cast(upd, x.dtype)
    for i, r in zip(np.ndindex(*idx.shape[:-1]), _nd_rows(op, x, idx)):
        if op == "tensor_scatter_add":
            out[r] = out[r] + upd[i]
        else:
            out[r] = upd[i]
    return out


@_impl("unsorted_segment_sum")
def _unsorted_segment_sum(args, attrs):
    x, ids = args
    n = attrs["num_segments"]
    out = np.zeros((n,) + x.shape[ids.ndim:], x.dtype)
    valid = (ids >= 0) & (ids < n)
    np.add.at(out, ids[valid].astype(np.int64), x[valid])
    return out


def _segment_ids(op: str, x, ids, n: int):
    """x as (rows, columns) and the flat ids, checked to lie in [0, n)."""
    flat = ids.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n):
        raise InterpreterError(f"{op}: segment ids must lie in [0, {n})")
    return x.reshape((flat.size, math.prod(x.shape[ids.ndim:]))), flat


@_impl("unsorted_segment_max", "unsorted_segment_min")
def _unsorted_segment_extreme(op, args, attrs):
    x, ids = args
    n = attrs["num_segments"]
    rows, flat = _segment_ids(op, x, ids, n)
    is_max = op == "unsorted_segment_max"
    floating = np.issubdtype(x.dtype, np.floating)
    info = np.finfo(x.dtype) if floating else np.iinfo(x.dtype)
    init = info.min if is_max else info.max
    out = np.full((n, rows.shape[1]), init, x.dtype)
    if rows.size:
        (np.maximum if is_max else np.minimum).at(out, flat, np.where(np.isnan(rows), init, rows) if floating else rows)
        zero = out == 0
        if floating and zero.any():
            # x[i] replaces the value only when strictly beyond it: of 0.0 and -0.0, the first seen
            first = np.full(out.shape, flat.size, np.int64)
            order = np.broadcast_to(np.arange(flat.size)[:, None], rows.shape)
            np.minimum.at(first, flat, np.where(rows == 0, order, flat.size))
            out[zero] = rows[first[zero], np.nonzero(zero)[1]]
    return out.reshape((n,) + x.shape[ids.ndim:])


@_impl("unsorted_segment_prod")
def _unsorted_segment_prod(args, attrs):
    x, ids = args
    n = attrs["num_segments"]
    rows, flat = _segment_ids("unsorted_segment_prod", x, ids, n)
    out = np.ones((n, rows.shape[1]), x.dtype)
    np.multiply.at(out, flat, rows)  # sequential, in index order, in x's dtype (bit-equal, measured)
    return out.reshape((n,) + x.shape[ids.ndim:])


@_impl("one_hot")
def _one_hot(args, attrs):
    idx, on, off = args
    dt = _promote(on, off)
    depth = attrs["depth"]
    axis = idx.ndim if attrs["axis"] == -1 else _norm_axis(attrs["axis"], idx.ndim + 1)
    shape = [1] * (idx.ndim + 1)
    shape[axis] = depth
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(shape)
    return np.where(hot, _cast(on, dt), _cast(off, dt)).astype(dt)


@_impl("flip")
def _flip(args, attrs):
    x = args[0]
    return np.flip(x, axis=_axes(attrs["axis"], x.ndim)).copy()


@_impl("pad")
def _pad(args, attrs):
    """Constant pad; a negative pad crops (as MindSpore's pad)."""
    x, value = args
    pads = [tuple(p) for p in attrs["pads"]]
    grow = [(max(b, 0), max(a, 0)) for b, a in pads]
    y = np.pad(x, grow, mode="constant", constant_values=_cast(value, x.dtype)) if x.ndim else x.copy()
    crop = tuple(slice(-min(b, 0), y.shape[i] + min(a, 0)) for i, (b, a) in enumerate(pads))
    return y[crop].copy()


@_impl("tril", "triu")
def _tri(op, args, attrs):
    return (np.tril if op == "tril" else np.triu)(args[0], attrs["diagonal"])


@_impl("cumsum")
def _cumsum(args, attrs):
    """Accumulates in the result dtype (f16 cumsum saturates as in MindSpore)."""
    x = args[0]
    if attrs["dtype"]:
        out = dtypes.to_numpy(attrs["dtype"])
    else:
        out = I64 if x.dtype == BOOL else x.dtype
    if x.ndim == 0:
        return _cast(x, out).copy()
    return np.cumsum(_cast(x, out), axis=_norm_axis(attrs["axis"], x.ndim), dtype=out)


@_impl("cumprod")
def _cumprod(args, attrs):
    """In x's dtype, one rounding per step (np.cumprod: float16 bit-equal to MindSpore's CumProd on
    random rows, integers wrap as there); exclusive shifts in a 1, reverse runs from the end."""
    x = args[0]
    if x.ndim == 0:
        raise InterpreterError("cumprod: x must have rank >= 1")
    axis = _norm_axis(attrs["axis"], x.ndim)
    v = np.flip(x, axis) if attrs["reverse"] else x
    if attrs["exclusive"] and v.shape[axis]:
        head = np.ones_like(np.take(v, [0], axis=axis))
        v = np.concatenate([head, np.take(v, range(v.shape[axis] - 1), axis=axis)], axis=axis)
    with np.errstate(all="ignore"):
        r = np.cumprod(v, axis=axis, dtype=x.dtype)
    return np.ascontiguousarray(np.flip(r, axis) if attrs["reverse"] else r)


# --- creation ----------------------------------------------------------------------------------
@_impl("fill")
def _fill(args, attrs):
    out = dtypes.to_numpy(attrs["dtype"])
    return np.full(tuple(attrs["shape"]), _cast(attrs["value"], out), dtype=out)


@_impl("arange")
def _arange(args, attrs):
    """start + i*step computed in the result's float precision (f32 for f16/bf16/f32), or in
    int64 when start/end/step are ints; then cast."""
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    out = dtypes.to_numpy(attrs["dtype"])
    if step == 0:
        raise InterpreterError("arange: step must not be 0")
    if all(isinstance(v, int) for v in (start, end, step)):
        n = max(0, -((start - end) // step))
        return (start + np.arange(n, dtype=I64) * step).astype(out)
    n = max(0, math.ceil((end - start) / step))
    comp = F64 if out == F64 or out.kind != "f" else F32
    r = np.arange(n, dtype=comp) * comp.type(step) + comp.type(start)
    return r.astype(out)


# --- matmul, convolution, pooling --------------------------------------------------------------
@_impl("matmul")
def _matmul(args, attrs):
    a, b = args
    if attrs["transpose_a"] and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if attrs["transpose_b"] and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    dt = _promote(a, b)
    comp = F32 if dt == np.float16 else dt
    return np.asarray(np.matmul(_cast(a, comp), _cast(b, comp))).astype(dt)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _quad(v) -> tuple[int, int, int, int]:
    if isinstance(v, int):
        return (v, v, v, v)
    return (v[0], v[0], v[1], v[1]) if len(v) == 2 else tuple(int(p) for p in v)


def _windows(x: np.ndarray, kernel, stride, dilation) -> np.ndarray:
    """x[..., H, W] -> [..., OH, OW, kh, kw] (a strided view)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    win = np.lib.stride_tricks.sliding_window_view(x, span, axis=(-2, -1))
    return win[..., ::sh, ::sw, ::dh, ::dw]


@_impl("conv2d")
def _conv2d(args, attrs):
    x, w = args
    dt = _promote(x, w)
    g = attrs["groups"]
    pt, pb, pl, pr = _quad(attrs["padding"])
    xp = np.pad(_wide(_cast(x, dt)), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = _windows(xp, w.shape[2:], _pair(attrs["stride"]), _pair(attrs["dilation"]))
    ww = _wide(_cast(w, dt))
    cg, og = x.shape[1] // g, w.shape[0] // g
    outs = [
        np.einsum("ncxyij,ocij->noxy", win[:, k * cg:(k + 1) * cg], ww[k * og:(k + 1) * og])
        for k in range(g)
    ]
    return np.concatenate(outs, axis=1).astype(dt)


@_impl("max_pool2d", "avg_pool2d")
def _pool2d(op, args, attrs):
    x = args[0]
    kernel, stride = _pair(attrs["kernel"]), _pair(attrs["stride"])
    pt, pb, pl, pr = _quad(attrs["padding"])
    pads = [(0, 0)] * (x.ndim - 2) + [(pt, pb), (pl, pr)]
    if op == "avg_pool2d":  # count_include_pad: zeros in the padding, divide by the kernel area
        win = _windows(np.pad(_wide(x), pads), kernel, stride, (1, 1))
        return (np.sum(win, axis=(-2, -1)) / (kernel[0] * kernel[1])).astype(x.dtype)
    low = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min if x.dtype.kind in "iu" else 0
    win = _windows(np.pad(x, pads, constant_values=low), kernel, stride, (1, 1))
    flat = win.reshape(win.shape[:-2] + (-1,))
    if x.dtype.kind == "f":  # NaN and -inf ignored: the scan starts from the lowest finite value
        return np.fmax(np.fmax.reduce(flat, axis=-1), low).astype(x.dtype)
    return np.max(flat, axis=-1)


# --- random ------------------------------------------------------------------------------------
@_impl("dropout")
def _dropout(args, attrs):
    x = args[0]
    if attrs["p"] != 0:
        raise InterpreterError(f"dropout: p={attrs['p']} depends on an RNG; only p == 0 is replayable")
    return x.copy(), np.ones_like(x)


# --- executing instructions and programs -------------------------------------------------------
def _describe(instr, types) -> str:
    try:
        return format_instr(instr.outs, types, instr.op, instr.args, instr.attrs)
    except (KeyError, TypeError, ValueError):  # a message helper must never hide the real error
        return f"{instr.op} -> {instr.outs}"


def _bind(sym: Sym, n: int, env: dict) -> bool:
    """Check/bind symbolic dim `sym` against size n; False on a contradiction. A monomial with one
    unbound name (appearing once) binds it; with more unknowns it is left unchecked."""
    known, unbound = sym.coeff, []
    for name in sym.names:
        if name in env:
            known *= env[name]
        else:
            unbound.append(name)
    if not unbound:
        return known == n
    if len(unbound) == 1 and known and n % known == 0:
        env[unbound[0]] = n // known
        return True
    return len(unbound) > 1 or known == 0 or n % known == 0


def _match_shape(declared, actual, env: dict) -> str | None:
    """None when `actual` fits `declared` (binding Syms in env), else the reason."""
    if len(declared) != len(actual):
        return f"rank {len(actual)} but declared {len(declared)}"
    for i, (d, n) in enumerate(zip(declared, actual)):
        if isinstance(d, Sym):
            if not _bind(d, n, env):
                bound = {k: env[k] for k in d.names if k in env}
                return f"dim {i} is {n}, which does not fit {d} (bound: {bound})"
        elif d != n:
            return f"dim {i} is {n} but declared {d}"
    return None


def _to_declared(arr, ty: TensorType) -> np.ndarray:
    """`arr` cast to the NumPy dtype of `ty` (bf16 rounded)."""
    want = dtypes.to_numpy(ty.dtype)
    with np.errstate(all="ignore"):
        a = np.asarray(arr)
        a = (a != 0) if (want == BOOL and a.dtype != BOOL) else _cast(a, want)
        a = np.asarray(a, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    return _round_bf16(a) if ty.dtype == "bf16" else a


def _store(instr, results, values: dict, types: dict, env: dict) -> None:
    if not isinstance(results, tuple):
        results = (results,)
    if len(results) != len(instr.outs):
        raise InterpreterError(
            f"{_describe(instr, types)}: produced {len(results)} results, declared {len(instr.outs)}"
        )
    for r, arr in zip(instr.outs, results):
        if r not in types:
            raise InterpreterError(f"{instr.op}: result %{r} has no declared type")
        ty = types[r]
        a = _to_declared(arr, ty)
        why = _match_shape(ty.shape, a.shape, env)
        if why:
            raise InterpreterError(f"{_describe(instr, types)}: result %{r} has shape {a.shape}: {why}")
        values[r] = a


def _operands(instr, values: dict) -> list:
    args = []
    for a in instr.args:
        if isinstance(a, Reg):
            if int(a) not in values:
                raise InterpreterError(f"{instr.op}: register %{int(a)} is read before it is defined")
            args.append(values[int(a)])
        else:
            args.append(a)
    return args


_BF16_SCALAR_OPS = frozenset({"add", "sub", "mul", "div"})


def run_instr(instr, values: dict[int, np.ndarray], types: dict[int, TensorType], *,
              env: dict | None = None) -> None:
    """Execute one (non-`call`) instruction: read its operands from `values`, write its results
    there, cast to and checked against their declared `types`. `env` binds symbolic dims."""
    env = {} if env is None else env
    if instr.op == "call":
        raise InterpreterError(f"{_describe(instr, types)}: `call` needs a call_handler (use interpret)")
    impl = IMPLS.get(instr.op)
    if impl is None:
        raise InterpreterError(f"unknown VM op {instr.op!r}")
    args = _operands(instr, values)
    if instr.op in _BF16_SCALAR_OPS and any(type(a) in (float, int) for a in args) and instr.outs \
            and types[instr.outs[0]].dtype == "bf16":
        # MindSpore rounds a Python float or int to bfloat16 before a bf16 add/sub/mul/div
        # (measured bit-equal on 20,000 values for 0.1, 3.7, 1e-3; with the float32 value, 1-24%
        # differ; `x * 257` is `x * 256`).
        args = [float(_round_bf16(np.asarray(a, F32))) if type(a) in (float, int) else a for a in args]
    attrs = opcodes.full_attrs(instr.op, instr.attrs)
    try:
        results = impl(args, attrs)
    except InterpreterError as e:
        raise InterpreterError(f"{_describe(instr, types)}: {e}") from e
    except (ValueError, IndexError, TypeError) as e:
        raise InterpreterError(f"{_describe(instr, types)}: {type(e).__name__}: {e}") from e
    _store(instr, results, values, types, env)


def interpret(program, inputs: list, *, call_handler=None) -> list[np.ndarray]:
    """Run `program` on `inputs` (arrays for `program.inputs`, in order) and return the arrays of
    `program.outputs`. Inputs must have exactly the NumPy dtype of their declared type (for bf16:
    float32, rounded on entry, or a 2-byte bfloat16 array as MindSpore's `asnumpy()` gives) and fit
    its shape. `call` instructions go to
    `call_handler(instr, args) -> tuple of arrays`, by default `program.call_handler` (what
    `ms_dynvm.record()` sets on the programs it makes)."""
    if len(inputs) != len(program.inputs):
        raise ValueError(f"program takes {len(program.inputs)} inputs, got {len(inputs)}")
    env: dict[str, int] = {}
    values: dict[int, np.ndarray] = {}
    for i, (inp, arr) in enumerate(zip(program.inputs, inputs)):
        ty = program.types[inp.reg]
        label = f"input {i} (%{inp.reg}{' ' + inp.name if inp.name else ''}: {ty})"
        if isinstance(arr, np.generic):  # a NumPy scalar is a 0-d array
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"{label}: expected a NumPy array, got {type(arr).__name__}")
        want = dtypes.to_numpy(ty.dtype)
        if ty.dtype == "bf16" and arr.dtype.name == "bfloat16" and arr.dtype.itemsize == 2:
            arr = arr.astype(want)  # a 2-byte bfloat16 array (MindSpore's asnumpy): exact in float32
        if arr.dtype != want:
            raise ValueError(f"{label}: dtype {arr.dtype}, expected {want}")
        why = _match_shape(ty.shape, arr.shape, env)
        if why:
            raise ValueError(f"{label}: shape {arr.shape}: {why}")
        values[inp.reg] = _round_bf16(arr) if ty.dtype == "bf16" else arr
    for r, c in program.consts.items():
        values[r] = _to_declared(c, program.types[r])
    if call_handler is None:
        call_handler = program.call_handler
    for instr in program.instrs():
        if instr.op != "call":
            run_instr(instr, values, program.types, env=env)
            continue
        if call_handler is None:
            raise InterpreterError(f"{_describe(instr, program.types)}: no call_handler for `call` (an opaque "
                                   "op: pass call_handler=; a program from ms_dynvm.record() has one in "
                                   "the process that recorded it, a loaded one does not)")
        results = call_handler(instr, _operands(instr, values))
        results = (results,) if isinstance(results, np.ndarray) else tuple(results)
        _store(instr, results, values, program.types, env)
    missing = [r for r in program.outputs if r not in values]
    if missing:
        raise InterpreterError(f"outputs {missing} are never defined")
    return [values[r] for r in program.outputs]


__all__ = ["IMPLS", "InterpreterError", "interpret", "run_instr"]
