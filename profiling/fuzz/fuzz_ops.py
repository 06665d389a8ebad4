"""Broad differential fuzz of ms_dynvm against MindSpore eager.

    python profiling/fuzz/fuzz_ops.py SEED N [--nan] [--grad] [--only i,j] [--src] [--verbose] [--no-bf16]
                                 [--prog-timeout S]

--nan: NaN/+inf/-inf in some float inputs; --grad: also value_and_grad; --only: run only these program
indices of the seed; --src: print every program's source before running it; --verbose: per-template
generation counts; --no-bf16: bfloat16 inputs and casts become float16 (same random draws, so the
bf16 serving bug does not hide other classes); --prog-timeout: stop the run with a Python traceback
(faulthandler) when one program takes longer (MindSpore itself can hang, see below). Exit status 1
if any mismatch. Each MISMATCH line names seed, program index, phase (enabled:b=<first dim>:rep=<call>,
grad:..., record:values, record:errors, interp, grad_interp, record_errors), what differs, the inputs
(dtype[shape]@layout, * = first dim varies), tags (empty-reduce: a reduction saw an empty operand,
docs/numerics.md's known divergence; empty-reduce?: a reduction that may see one in the first-dim-0 variant;
alt0: a variant has first dim 0; nan-rule-op: max/min/arg/softmax ops with
MindSpore-specific NaN rules) and the program source.

Not fuzzed because MindSpore 2.10 CPU itself crashes or hangs there (ms_dynvm disabled): cumulative
ops and flip on empty tensors (cumsum of (0, 1, 3) along axis 1: SIGFPE), value_and_grad of a function that
raised (later StridedSlice: SIGFPE), value_and_grad of (log_)softmax/logsumexp on a 0-d tensor (hang).

Random programs of 2-10 steps over 1-3 input tensors (ranks 0-4, dims from {0,1,2,3,5,8,17},
broadcasting pairs, f32/f16/bf16/i32/i64/bool, some non-contiguous inputs: transposed views, strided
slices), drawn from a wide pool of mindspore.ops / mindspore.mint / Tensor methods and operators
(elementwise math and activations: exp/log/sqrt/rsqrt/reciprocal/trig/tanh/sigmoid/relu/relu6/gelu both
forms/silu/elu/selu/mish/softplus/leaky_relu/hardtanh/hardswish/erf...; tensor-tensor, tensor-scalar
and scalar-tensor add/sub/mul/div/pow/floor-div/mod with int, float and bool scalars; clamp/clip with
scalar, None and tensor bounds; minimum/maximum; comparisons; logical ops; where/select/masked_fill;
casts between f32/f16/bf16/i32/i64/bool; floor/ceil/round/trunc/sign; sum/mean/amax/amin/max/min/
prod/argmax/argmin/all/any/var/std/norm/logsumexp/cumsum/cumprod/cummax/topk/sort with random
axis/keepdims; softmax/log_softmax; layer_norm as nn.LayerNorm cell and legacy ops.LayerNorm;
reshape/view/transpose/permute/swapaxes/unsqueeze/squeeze/broadcast_to/flatten/narrow/split/chunk/
concat/stack/tile/flip/tril/triu; basic indexing; matmul/bmm/mm/dense/linear; gather/index_select/
mint.gather/one_hot/unsorted_segment_sum; addcmul/lerp; dropout in eval form; setitem and in-place
add_/mul_; a few mint forms without a CPU kernel (eager raises: exception parity)).
Each program is written as Python source (printed with --src and for every mismatching program) and
is validated on eager MindSpore while it is generated: a step eager rejects is redrawn, or, now and
then, kept as the last step so that exception parity is tested too.

Per program:
 1. eager (ms_dynvm disabled) on the base inputs and on 2 variants whose first dim differs; every
    eager run twice (a run that is not bit-identical to its repeat is "eager nondeterministic" and is
    not compared);
 2. `ms_dynvm.enable(compile_policy="threshold", compile_threshold=1)` (plus compile_async=False where
    that option exists): base x4, each variant x2,
    base again; results compared with eager (float32 rtol 1e-4 atol 1e-5, f16/bf16 2e-2, ints/bools
    exact, NaN/inf positions must agree, shape and dtype equal); an exception eager did not raise (or
    none where eager raised) is a mismatch;
 3. `ms_dynvm.record()` on the base inputs, then `ms_dynvm.interpret` of the program: its outputs
    compared with eager;
 4. with --grad: loss = sum of the float outputs cast to float32, `ms.value_and_grad` w.r.t. the
    float inputs: eager vs enabled (x4 + variants) and vs the interpreter on a recording of the
    gradient call.
stats()["record_errors"] growth and fallbacks whose reason mentions an error are printed per program.
A program is reproducible from (SEED, index); tier 1's learned state (kernels, templates) does carry
across programs of one process, as in a real script.
"""
import argparse
import faulthandler
import os
import random
import sys
import time
import traceback

os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("DYNVM_CACHE_DIR", "/tmp/fuzz_repros/kcache")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import mint, nn, ops  # noqa: E402
import mindspore.mint.nn.functional as MF  # noqa: E402

import ms_dynvm  # noqa: E402

ms.runtime.launch_blocking()

# compile at first sight; synchronously where the option exists, so that the following calls are served
ENABLE_OPTS = dict(compile_policy="threshold", compile_threshold=1)
try:
    from ms_dynvm.frontend.options import Options as _Options
    if "compile_async" in _Options.__dataclass_fields__:
        ENABLE_OPTS["compile_async"] = False
except ImportError:  # pragma: no cover
    pass

FLOATS = (ms.float32, ms.float16, ms.bfloat16, ms.float64)
INTS = (ms.int32, ms.int64, ms.int8, ms.uint8, ms.int16)
DT_NAME = {ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16", ms.int32: "int32",
           ms.int64: "int64", ms.bool_: "bool_", ms.float64: "float64"}

# --------------------------------------------------------------------------------------------------
# helpers visible to generated programs
_WC: dict = {}
_LN: dict = {}


def Wc(shape, seed, dtype=ms.float32):
    """A cached constant tensor (a weight: the same object on every call)."""
    key = (tuple(shape), seed, dtype)
    if key not in _WC:
        a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.5
        _WC[key] = ms.Tensor(a).astype(dtype) if dtype != ms.float32 else ms.Tensor(a)
    return _WC[key]


def I(n, k, seed, dt=ms.int32):
    """A fresh index tensor of k values in [0, n)."""
    a = np.random.default_rng(seed).integers(0, max(n, 1), size=k)
    return ms.Tensor(a.astype(np.int64 if dt == ms.int64 else np.int32))


def IG(shape, n, seed):
    """A fresh int64 index tensor of `shape` with values in [0, n) (for mint.gather)."""
    a = np.random.default_rng(seed).integers(0, max(n, 1), size=shape)
    return ms.Tensor(a.astype(np.int64))


def LN(n, eps=1e-5):
    """A cached nn.LayerNorm cell over the last dim."""
    key = (n, eps)
    if key not in _LN:
        _LN[key] = nn.LayerNorm((n,), epsilon=eps)
    return _LN[key]


def nz(t):
    """`t`, or ValueError if it is empty: MindSpore 2.10 CPU cumsum of an empty tensor can die with
    SIGFPE (shape (0, 1, 3), axis 1), so cumulative ops never see one; nor does flip (ReverseV2 of a
    (0, 1) matmul result died with SIGFPE after value_and_grad calls, ms_dynvm never enabled: seed 105
    program 12 before this guard)."""
    if 0 in t.shape:
        raise ValueError("empty input to a cumulative op or flip (skipped: MindSpore SIGFPE)")
    return t


def T(v, dt=ms.float32):
    return ms.Tensor(v, dt)


NS = dict(ms=ms, ops=ops, mint=mint, nn=nn, MF=MF, np=np, Wc=Wc, I=I, IG=IG, LN=LN, T=T, nz=nz)

# --------------------------------------------------------------------------------------------------
# op pool: templates over {a} (primary), {b} (broadcast-compatible second), {c} (third), {ax}
# (axis), {kd} (keepdims), {s} (scalar), {p} (exponent), {lo}/{hi} (bounds), {dt} (dtype)
UNARY = [
    "ops.neg({a})", "-{a}", "ops.abs({a})", "mint.abs({a})", "{a}.abs()",
    "ops.exp({a})", "mint.exp({a})", "{a}.exp()", "ops.expm1({a})",
    "ops.log(ops.abs({a}) + 0.5)", "ops.log({a})", "mint.log(mint.abs({a}) + 1e-3)", "ops.log1p(ops.abs({a}))",
    "ops.sqrt(ops.abs({a}))", "ops.sqrt({a})", "mint.sqrt({a}.abs())", "ops.rsqrt(ops.abs({a}) + 0.1)",
    "mint.rsqrt({a})", "{a}.sqrt()",
    "ops.square({a})", "mint.square({a})", "{a}.square()", "ops.reciprocal({a})", "mint.reciprocal({a})",
    "ops.sin({a})", "mint.sin({a})", "ops.cos({a})", "mint.cos({a})",
    "ops.tanh({a})", "mint.tanh({a})", "ops.sigmoid({a})", "mint.sigmoid({a})", "{a}.sigmoid()",
    "ops.relu({a})", "MF.relu({a})", "ops.gelu({a}, approximate='none')", "ops.gelu({a}, approximate='tanh')",
    "ops.silu({a})", "MF.silu({a})",
    "ops.elu({a})", "ops.selu({a})", "ops.mish({a})", "ops.logsigmoid({a})",
    "ops.softplus({a})", "ops.softplus({a}, beta=2, threshold=10)", "MF.softplus({a})",
    "ops.leaky_relu({a}, 0.1)", "ops.leaky_relu({a})", "ops.hardtanh({a})", "ops.relu6({a})", "ops.hardswish({a})", "ops.hardsigmoid({a})",
    "ops.sinh({a})", "ops.cosh({a})", "ops.atan({a})", "ops.trunc({a})", "ops.log2(ops.abs({a}) + 1)", "ops.exp2({a})",
    "ops.isnan({a})", "ops.isfinite({a})", "ops.nan_to_num({a})", "ops.flip(nz({a}), (0,))", "ops.tril({a})", "ops.triu({a}, 1)", "ops.erf({a})", "mint.erf({a})",
    "ops.floor({a})", "mint.floor({a})", "ops.ceil({a})", "mint.ceil({a})", "ops.round({a})",
    "mint.round({a})", "ops.sign({a})", "mint.sign({a})",
    "ops.logical_not({a})", "mint.logical_not({a})",
    "ops.dropout({a}, p=0.5, training=False)", "MF.dropout({a}, p=0.0)", "MF.dropout({a}, p=0.3, training=False)",
    "ops.zeros_like({a})", "ops.ones_like({a})", "ops.full_like({a}, 2.5)",
]
SCALAR = [
    "{a} + {s}", "{s} + {a}", "{a} - {s}", "{s} - {a}", "{a} * {s}", "{s} * {a}", "{a} / {s}", "{s} / {a}",
    "ops.add({a}, {s})", "ops.mul({a}, {s})", "ops.sub({a}, {s})", "ops.div({a}, {s})",
    "mint.add({a}, {s})", "mint.mul({a}, {s})", "mint.sub({a}, {s})", "mint.div({a}, {s})",
    "{a} ** {p}", "ops.pow({a}, {p})", "mint.pow({a}, {p})", "{sp} ** {a}", "ops.pow({sp}, {a})",
    "{a} > {s}", "{a} >= {s}", "{a} == {s}", "{a} != {s}", "{a} < {s}", "{a} <= {s}",
    "{a} // {s}", "{a} % {s}",
    "ops.clamp({a}, {lo}, {hi})", "ops.clamp({a}, None, {hi})", "ops.clamp({a}, {lo}, None)",
    "ops.clamp({a}, min={lo})", "{a}.clip({lo}, {hi})", "mint.clamp({a}, {lo}, {hi})",
    "mint.clamp({a}, max={hi})", "ops.clip({a}, {lo}, {hi})",
    "ops.masked_fill({a}, {a} > 0, {s})", "{a}.masked_fill({a} < 0.5, {s})",
    "ops.where({a} > 0, {a}, {s})", "mint.where({a} > 0, {a}, 0.0)",
]
BINARY = [
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "ops.add({a}, {b})", "mint.add({a}, {b}, alpha=2)",
    "ops.sub({a}, {b})", "mint.sub({a}, {b})", "ops.mul({a}, {b})", "mint.mul({a}, {b})", "ops.div({a}, {b})",
    "mint.div({a}, {b})", "mint.div({a}, {b}, rounding_mode='floor')", "ops.div({a}, {b}, rounding_mode='trunc')",
    "ops.pow({a}, {b})", "{a} ** {b}", "ops.pow(ops.abs({a}), {b})",
    "ops.minimum({a}, {b})", "ops.maximum({a}, {b})", "mint.minimum({a}, {b})", "mint.maximum({a}, {b})",
    "{a} > {b}", "{a} >= {b}", "{a} == {b}", "{a} != {b}", "{a} < {b}", "mint.eq({a}, {b})", "mint.ne({a}, {b})",
    "ops.logical_and({a}, {b})", "ops.logical_or({a}, {b})", "mint.logical_and({a}, {b})", "mint.logical_or({a}, {b})",
    "ops.where({a} > {b}, {a}, {b})", "ops.where({c}, {a}, {b})", "mint.where({a} < {b}, {b}, {a})",
    "ops.select({a} > 0, {a}, {b})",
    "ops.masked_fill({a}, {b} > 0, 1.0)", "ops.addcmul({a}, {b}, {b}, value=0.5)", "ops.addcmul({a}, {b}, {c}, value=T(2.0))",
    "ops.lerp({a}, {b}, 0.25)", "ops.fmod({a}, {b})", "ops.remainder({a}, {b})",
    "{a} // {b}", "{a} % {b}", "mint.clamp({a}, min={b})",
]
CAST = ["ops.cast({a}, ms.{dt})", "{a}.astype(ms.{dt})", "{a}.to(ms.{dt})", "{a}.float()", "{a}.half()",
        "{a}.int()", "{a}.long()", "{a}.bool()"]
REDUCE = [
    "ops.sum({a})", "{a}.sum()", "{a}.sum({ax})", "{a}.sum(axis={ax}, keepdims={kd})", "ops.sum({a}, {ax}, {kd})",
    "mint.sum({a}, {ax}, {kd})", "mint.sum({a}, dim=({ax}, {ax2}))", "ops.mean({a}, {ax}, {kd})",
    "{a}.mean({ax}, {kd})", "mint.mean({a}, {ax}, {kd})", "mint.mean({a})",
    "ops.amax({a}, {ax}, {kd})", "ops.amin({a}, {ax}, {kd})", "mint.amax({a}, {ax}, {kd})", "{a}.max()",
    "{a}.max(axis={ax}, keepdims={kd})", "{a}.min(axis={ax}, keepdims={kd})", "mint.max({a})",
    "mint.max({a}, {ax}, {kd})[0]", "mint.max({a}, {ax}, {kd})[1]", "mint.min({a}, {ax})[0]",
    "ops.prod({a}, {ax}, {kd})", "mint.prod({a}, {ax}, {kd})", "{a}.prod()",
    "ops.argmax({a}, {ax}, {kd})", "ops.argmax({a}, {ax})", "{a}.argmax()", "ops.argmin({a}, {ax})",
    "ops.cumsum(nz({a}), {ax})", "nz({a}).cumsum({ax})", "ops.cumprod(nz({a}), {ax})", "ops.cummax(nz({a}), {ax})[0]",
    "ops.var({a}, {ax})", "ops.std({a}, {ax}, keepdims={kd})", "ops.norm({a})", "ops.topk({a}, 1)[0]", "ops.sort({a})[0]",
    "ops.logsumexp({a}, {ax}, {kd})", "mint.all({a} > 0, {ax})", "mint.any({a} < 0)",
]
NORM = [
    "ops.softmax({a}, {ax})", "mint.softmax({a}, {ax})", "MF.softmax({a}, {ax})", "ops.log_softmax({a}, {ax})",
    "ops.log_softmax({a})", "ops.softmax({a})",
    "LN({a}.shape[-1])({a})", "LN({a}.shape[-1], 1e-3)({a})",
    "ops.LayerNorm(-1, -1, 1e-5)({a}, Wc({a}.shape[-1:], {seed}, {a}.dtype), Wc({a}.shape[-1:], {seed2}, {a}.dtype))[0]",
]
VIEW = [
    "ops.reshape({a}, (-1,))", "{a}.reshape(-1)", "{a}.reshape({a}.shape[0], -1)", "mint.reshape({a}, ({a}.shape[0], -1))",
    "{a}.view(-1, {a}.shape[-1])", "ops.reshape({a}, {a}.shape[:-2] + ({a}.shape[-2] * {a}.shape[-1],))",
    "{a}.reshape({a}.shape + (1,))", "ops.reshape({a}, (-1, 1) + {a}.shape[1:])",
    "ops.transpose({a}, {perm})", "ops.permute({a}, {perm})", "{a}.permute(*{perm})", "mint.permute({a}, {perm})",
    "ops.swapaxes({a}, 0, -1)", "mint.transpose({a}, {ax}, {ax2})", "{a}.swapaxes({ax}, {ax2})",
    "ops.expand_dims({a}, {axn})", "{a}.unsqueeze({axn})", "mint.unsqueeze({a}, {axn})",
    "ops.squeeze({a})", "{a}.squeeze({ax})", "mint.squeeze({a}, {ax})",
    "ops.broadcast_to({a}, (2,) + {a}.shape)", "{a}.broadcast_to({bshape})", "mint.broadcast_to({a}, {bshape})",
    "ops.flatten({a})", "mint.flatten({a})", "mint.flatten({a}, {ax}, -1)", "{a}.flatten()",
    "ops.narrow({a}, {ax}, {st}, {ln})", "mint.narrow({a}, {ax}, {st}, {ln})",
    "ops.split({a}, {sz}, {ax})[{k}]", "mint.split({a}, {sz}, {ax})[{k}]", "ops.chunk({a}, {nch}, {ax})[{k}]",
    "mint.chunk({a}, {nch}, {ax})[{k}]",
    "ops.concat(({a}, {a} * 2), {ax})", "mint.cat([{a}, {b2}], {ax})", "ops.cat(({b2}, {a}), {ax})",
    "ops.stack([{a}, {b2}], {axn})", "ops.stack(({a}, {a}), {axn})",
    "ops.tile({a}, {reps})", "{a}.tile({reps})", "mint.tile({a}, {reps})",
    "{a}[:, 1:3]", "{a}[0]", "{a}[..., ::2]", "{a}[None]", "{a}[-1]", "{a}[:, None]", "{a}[1:]", "{a}[..., 0]",
]
MATMUL = [
    "ops.matmul({a}, {a}.swapaxes(-1, -2))", "mint.matmul({a}, mint.transpose({a}, -1, -2))", "{a} @ {b}",
    "ops.bmm({a}, ops.transpose({a}, (0, 2, 1)))", "mint.bmm({a}, mint.transpose({a}, 1, 2))",
    "ops.dense({a}, Wc(({nout}, {a}.shape[-1]), {seed}, {a}.dtype))",
    "ops.dense({a}, Wc(({nout}, {a}.shape[-1]), {seed}, {a}.dtype), Wc(({nout},), {seed2}, {a}.dtype))",
    "MF.linear({a}, Wc(({nout}, {a}.shape[-1]), {seed}, {a}.dtype), Wc(({nout},), {seed2}, {a}.dtype))",
    "ops.mm({a}, {a}.T)", "ops.matmul({a}, Wc(({a}.shape[-1], {nout}), {seed}, {a}.dtype))",
]
GATHER = [
    "ops.gather({a}, I({n}, {k}, {seed}), {ax})", "ops.index_select({a}, {ax}, I({n}, {k}, {seed}))",
    "ops.index_select({a}, {ax}, I({n}, {k}, {seed}, ms.int64))", "{a}[I({n}, {k}, {seed})]",
    "mint.gather({a}, {ax}, IG({a}.shape, {n}, {seed}))",
    "ops.one_hot(ops.cast(ops.abs({a}), ms.int32) % 4, 4, T(1.0), T(0.0))",
    "ops.unsorted_segment_sum({a}, I(3, {n0}, {seed}), 3)",
]
STMTS = [  # setitem and in-place ops: statements assigning {o}
    ["{o} = {a} + 0", "{o}[{o} > 0] = 0"],
    ["{o} = {a} * 1", "{o}[:, 0] = 1"],
    ["{o} = {a} - 0", "{o}[0] = 2"],
    ["{o} = {a} + 0", "{o}[..., 1:3] = {o}[..., 1:3] * 2"],
    ["{o} = {a} + 0", "{o}.add_({b})"],
    ["{o} = {a} * 1", "{o}.mul_(2)"],
    ["{o} = ops.exp({a})", "{o}[{o} > 2] = 0", "{o} = {o} + 1"],
]
UNREG = [  # kernels MindSpore 2.10 CPU lacks: eager raises, ms_dynvm must raise too
    "MF.gelu({a})", "mint.cumsum(nz({a}), {ax})", "MF.layer_norm({a}, ({a}.shape[-1],))", "mint.argmax({a}, {ax}, {kd})",
    "MF.log_softmax({a}, {ax})", "mint.addcmul({a}, {b}, {c})", "mint.full_like({a}, 2.5)",
]
FAMILIES = [  # (weight, name, templates)
    (18, "unary", UNARY), (12, "scalar", SCALAR), (16, "binary", BINARY), (6, "cast", CAST),
    (10, "reduce", REDUCE), (6, "norm", NORM), (12, "view", VIEW), (4, "matmul", MATMUL),
    (4, "gather", GATHER), (3, "stmts", STMTS), (1, "cpu-unregistered", UNREG),
]
SCALARS = ["2", "-1", "0", "3", "0.5", "-1.5", "1e-3", "2.0", "100.0", "0.0", "True"]
EXPONENTS = ["2", "3", "0.5", "-1", "2.0", "0", "1.5", "-0.5", "1"]
CAST_DTS = ["float32", "float32", "float16", "bfloat16", "int32", "int64", "bool_"]
DIMS = [0, 1, 2, 3, 5, 8, 17]
DIM_W = [1, 4, 5, 5, 5, 3, 2]


def is_float(dt):
    return dt in FLOATS


def bcast_ok(s1, s2):
    try:
        np.broadcast_shapes(tuple(s1), tuple(s2))
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------------
# inputs
class InputSpec:
    """One input: logical shape (dim 0 may be the dynamic batch dim), dtype, layout, values seed."""

    def __init__(self, shape, dtype, layout, dyn, seed, nan, scale):
        self.shape, self.dtype, self.layout, self.dyn = list(shape), dtype, layout, dyn
        self.seed, self.nan, self.scale = seed, nan, scale

    def array(self, b):
        shape = list(self.shape)
        if self.dyn:
            shape[0] = b
        rng = np.random.default_rng(self.seed + 7919 * (b or 0))
        if self.layout == "strided":  # made 2x longer in the last dim, then sliced [..., ::2]
            shape = shape[:-1] + [shape[-1] * 2]
        if self.layout == "T":  # made with reversed dims, then transposed back
            shape = shape[::-1]
        if self.dtype in FLOATS:
            a = np.asarray(rng.standard_normal(shape) * self.scale)
            if self.nan and a.size:
                flat = a.reshape(-1)
                for _ in range(rng.integers(1, 4)):
                    flat[rng.integers(0, a.size)] = rng.choice([np.nan, np.inf, -np.inf])
            a = a.astype(np.float32)
        elif self.dtype in INTS:
            a = rng.integers(-6, 7, size=shape).astype(np.int64 if self.dtype == ms.int64 else np.int32)
        else:
            a = rng.random(shape) < 0.5
        return a

    def tensor(self, b):
        a = self.array(b)
        t = ms.Tensor(a)
        if self.dtype in (ms.float16, ms.bfloat16):
            t = ms.Tensor(a).astype(self.dtype) if self.dtype == ms.bfloat16 else ms.Tensor(a.astype(np.float16))
        if self.layout == "T":
            t = t.transpose(tuple(range(t.ndim))[::-1]) if t.ndim else t
        elif self.layout == "strided":
            t = t[..., ::2]
        return t

    def __repr__(self):
        return f"{DT_NAME.get(self.dtype, self.dtype)}{self.shape}{'@' + self.layout if self.layout != 'c' else ''}{'*' if self.dyn else ''}"


NO_BF16 = False  # --no-bf16: bfloat16 inputs and casts become float16 (same random draws)


def gen_inputs(R, nan, pseed):
    n = R.choice([1, 2, 2, 3])
    rank = R.choice([0, 1, 1, 2, 2, 2, 3, 3, 3, 4])
    main = [R.choices(DIMS, DIM_W)[0] for _ in range(rank)]
    dt0 = R.choices([ms.float32, ms.float16, ms.bfloat16, ms.int32, ms.int64, ms.bool_], [70, 8, 5, 8, 4, 5])[0]
    if NO_BF16 and dt0 == ms.bfloat16:
        dt0 = ms.float16
    specs = []
    for i in range(n):
        if i == 0:
            shape = list(main)
        else:
            k = R.random()
            if k < 0.35:
                shape = list(main)
            elif k < 0.85 and rank:
                keep = R.randint(0, rank)
                shape = list(main[rank - keep:])
                shape = [1 if R.random() < 0.3 else d for d in shape]
            else:
                shape = [R.choices(DIMS, DIM_W)[0] for _ in range(R.randint(0, 3))]
        dt = dt0 if R.random() < 0.75 else R.choices(
            [ms.float32, ms.float16, ms.bfloat16, ms.int32, ms.int64, ms.bool_], [60, 8, 4, 12, 6, 10])[0]
        if NO_BF16 and dt == ms.bfloat16:
            dt = ms.float16
        layout = "c"
        if len(shape) >= 2 and R.random() < 0.2:
            layout = R.choice(["T", "strided"])
        dyn = bool(rank) and len(shape) == rank and shape[0] == main[0] and (i == 0 or main[0] != 1)
        scale = R.choice([1.0, 1.0, 1.0, 3.0, 0.1, 100.0, 1e4]) if dt in FLOATS else 1.0
        specs.append(InputSpec(shape, dt, layout, dyn, pseed * 31 + i * 1009, nan and R.random() < 0.5, scale))
    b0 = main[0] if rank else None
    alts = []
    if rank:
        cand = [d for d in [1, 2, 3, 5, 8, 17] if d != b0]
        alts = R.sample(cand, 2)
        if R.random() < 0.1:
            alts[1] = 0
    return specs, b0, alts


# --------------------------------------------------------------------------------------------------
# program generation (validated on eager while generated)
class Gen:
    def __init__(self, R, specs, b0, verbose_counts):
        self.R = R
        self.env = {}
        self.names = []
        self.inputs = []
        for i, sp in enumerate(specs):
            nm = f"x{i}"
            self.env[nm] = sp.tensor(b0)
            self.names.append(nm)
            self.inputs.append(nm)
        self.lines = []
        self.ops = []
        self.counts = verbose_counts
        self.n = 0
        self.raises = False
        self.tags = set()
        self.reduces = False

    def meta(self, nm):
        v = self.env[nm]
        return tuple(v.shape), v.dtype

    def pick(self):
        if self.R.random() < 0.55:
            return self.names[-1]
        return self.R.choice(self.names)

    def pick_b(self, a, same=False):
        sa = self.meta(a)[0]
        cands = [n for n in self.names if n != a and (self.meta(n)[0] == sa if same else bcast_ok(sa, self.meta(n)[0]))]
        if not cands or self.R.random() < 0.1:
            return a
        return self.R.choice(cands)

    def fill(self, tmpl, a):
        R = self.R
        shape, dt = self.meta(a)
        rank = len(shape)
        ax = R.randrange(-rank, rank) if rank else 0
        ax2 = R.randrange(-rank, rank) if rank else 0
        perm = list(range(rank))
        R.shuffle(perm)
        axd = ax if ax >= 0 else ax + rank if rank else 0
        dimlen = shape[axd] if rank else 1
        st = R.randint(0, max(dimlen - 1, 0))
        ln = R.randint(0, max(dimlen - st, 0))
        bshape = tuple(3 if d == 1 and R.random() < 0.7 else d for d in shape)
        if R.random() < 0.3:
            bshape = (2,) + bshape
        lo = R.choice(["-1.0", "-0.5", "0", "-2", "0.25"])
        hi = R.choice(["1.0", "0.5", "2", "3.0"])
        b = self.pick_b(a) if "{b}" in tmpl or "{c}" in tmpl else a
        c = a
        if "{c}" in tmpl:
            if "ops.where({c}" in tmpl:
                bools = [n for n in self.names if self.meta(n)[1] == ms.bool_ and bcast_ok(shape, self.meta(n)[0])]
                c = R.choice(bools) if bools else f"({a} > 0)"
            else:
                c = self.pick_b(a)
        d = dict(a=a, b=b, c=c, ax=ax, ax2=ax2, kd=R.choice([True, False]), s=R.choice(SCALARS),
                 sp=R.choice(["2", "2.0", "0.5", "3"]), p=R.choice(EXPONENTS), lo=lo, hi=hi,
                 dt=R.choice(CAST_DTS), perm=tuple(perm), axn=R.randrange(-rank - 1, rank + 1),
                 bshape=bshape, st=st, ln=ln, sz=R.choice([1, 2, 3]), nch=R.choice([1, 2, 3]), k=R.choice([0, 0, 1, -1]),
                 b2=self.pick_b(a, same=True), reps=tuple(R.choice([1, 1, 2, 3]) for _ in range(max(rank, 1))),
                 nout=R.choice([1, 3, 8]), seed=R.randrange(1000), seed2=R.randrange(1000),
                 n=dimlen, n0=shape[0] if rank else 1, o="")
        d["k"] = d["k"] if "[{k}]" in tmpl else 0
        if NO_BF16 and d["dt"] == "bfloat16":
            d["dt"] = "float16"
        return d

    def step(self, max_tries=12):
        R = self.R
        for _ in range(max_tries):
            w, fam, tmpls = R.choices(FAMILIES, [f[0] for f in FAMILIES])[0]
            tmpl = R.choice(tmpls)
            a = self.pick()
            d = self.fill(tmpl if isinstance(tmpl, str) else " ".join(tmpl), a)
            if fam == "gather" and "{n}" in tmpl and d["n"] == 0:
                continue
            if ("softmax" in str(tmpl) or "logsumexp" in str(tmpl)) and not self.meta(a)[0]:
                continue  # MindSpore 2.10: value_and_grad of log_softmax on a 0-d tensor never returns
            nm = f"v{self.n}"
            d["o"] = nm
            stmts = [f"{nm} = {tmpl.format(**d)}"] if isinstance(tmpl, str) else [s.format(**d) for s in tmpl]
            env = dict(self.env)
            key = tmpl if isinstance(tmpl, str) else tmpl[-1]
            try:
                exec("\n".join(stmts), NS, env)
                v = env[nm]
                if isinstance(v, (tuple, list)):
                    raise TypeError("tuple result")
                if not isinstance(v, ms.Tensor):
                    raise TypeError(f"not a tensor: {type(v).__name__}")
                _ = v.shape
            except Exception:
                self.counts.setdefault(key, [0, 0])[1] += 1
                if R.random() < (0.5 if fam == "cpu-unregistered" else 0.06):  # keep it as the last step: exception parity
                    self.lines += stmts
                    self.ops.append(key)
                    self.raises = True
                    return False
                continue
            self.counts.setdefault(key, [0, 0])[0] += 1
            if fam in ("reduce", "norm", "matmul", "gather"):
                if 0 in self.meta(a)[0]:
                    self.tags.add("empty-reduce")
                else:
                    self.reduces = True  # empty in the first-dim-0 variant, if there is one (Prog)
            if fam in ("reduce", "norm") and any(k in key for k in ("max", "min", "arg", "softmax")):
                self.tags.add("nan-rule-op")
            self.env[nm] = v
            self.names.append(nm)
            self.lines += stmts
            self.ops.append(key)
            self.n += 1
            return True
        return True


class Prog:
    def __init__(self, src, inputs, outs, ops_, specs, b0, alts, raises, tags=()):
        self.tags = sorted(tags) + (["alt0"] if 0 in alts else [])
        self.src, self.inputs, self.outs, self.ops = src, inputs, outs, ops_
        self.specs, self.b0, self.alts, self.raises = specs, b0, alts, raises
        env = {}
        exec(src, NS, env)
        self.fn = env["prog"]


def make_prog(seed, idx, nan, counts):
    R = random.Random(seed * 1000003 + idx)
    specs, b0, alts = gen_inputs(R, nan, seed * 100000 + idx)
    g = Gen(R, specs, b0, counts)
    nsteps = R.randint(2, 10)
    for _ in range(nsteps):
        if not g.step():
            break
    made = [n for n in g.names if n.startswith("v")]
    if g.raises:
        outs = made[-1:] or g.inputs[:1]
    else:
        outs = made[-1:] if made else g.inputs[:1]
        extra = [n for n in made[:-1] if R.random() < 0.3][:2]
        outs = outs + extra
    body = "\n".join("    " + ln for ln in g.lines) or "    pass"
    src = f"def prog({', '.join(g.inputs)}):\n{body}\n    return ({', '.join(outs)},)\n"
    tags = set(g.tags)
    if g.reduces and 0 in alts:
        tags.add("empty-reduce?")  # a reduction may see an empty operand in the b=0 variant
    return Prog(src, g.inputs, outs, g.ops, specs, b0, alts, g.raises, tags)


# --------------------------------------------------------------------------------------------------
# running and comparing
def to_np(t):
    if isinstance(t, ms.Tensor):
        if t.dtype == ms.bfloat16:
            return t.asnumpy().astype(np.float32), "bfloat16"
        a = t.asnumpy()
        return a, str(a.dtype)
    return np.asarray(t), "py:" + type(t).__name__


def run_once(prog, b, convert=True):
    """(results as [(array, dtype)] or an Exception, raw outputs)."""
    try:
        ins = [sp.tensor(b) for sp in prog.specs]
        outs = prog.fn(*ins)
        if convert:
            return [to_np(o) for o in outs], outs
        return None, outs
    except Exception as e:  # noqa: BLE001
        return e, None


def same_bits(r1, r2):
    if isinstance(r1, Exception) or isinstance(r2, Exception):
        return type(r1) is type(r2)
    if len(r1) != len(r2):
        return False
    for (a, da), (b, db) in zip(r1, r2):
        if da != db or a.shape != b.shape:
            return False
        if a.dtype.kind == "f":
            if not np.array_equal(np.isnan(a), np.isnan(b)) or not np.array_equal(np.nan_to_num(a), np.nan_to_num(b)):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def compare(ref, got):
    """None when `got` matches the eager `ref`, else a short description."""
    if isinstance(ref, Exception) and isinstance(got, Exception):
        if type(ref) is not type(got):
            return f"exception type: eager {type(ref).__name__}, dynvm {type(got).__name__}: {str(got)[:160]!r}"
        return None
    if isinstance(ref, Exception):
        return f"eager raised {type(ref).__name__} ({str(ref).splitlines()[0][:100]!r}), dynvm did not"
    if isinstance(got, Exception):
        tb = traceback.extract_tb(got.__traceback__)
        where = next((f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb) if "ms_dynvm" in f.filename), "")
        return f"dynvm raised {type(got).__name__}: {str(got).splitlines()[0][:160]!r} {where}"
    if len(ref) != len(got):
        return f"number of outputs {len(ref)} vs {len(got)}"
    for i, ((a, da), (b, db)) in enumerate(zip(ref, got)):
        m = compare_arr(a, da, b, db)
        if m:
            return f"out {i}: {m}"
    return None


def compare_arr(a, da, b, db):
    if da != db:
        return f"dtype eager {da} vs dynvm {db}"
    if a.shape != b.shape:
        return f"shape eager {a.shape} vs dynvm {b.shape}"
    if a.dtype.kind != "f":
        if not np.array_equal(a, b):
            bad = np.argwhere(a != b)
            i = tuple(bad[0])
            return f"{da} differ at {len(bad)}/{a.size}; first {i}: eager {a[i]!r} dynvm {b[i]!r}"
        return None
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        bad = np.argwhere(na != nb)
        i = tuple(bad[0])
        return f"NaN positions differ at {len(bad)}/{a.size}; first {i}: eager {a[i]!r} dynvm {b[i]!r}"
    ia, ib = np.isinf(a) & ~na, np.isinf(b) & ~nb
    if not np.array_equal(ia & (a > 0), ib & (b > 0)) or not np.array_equal(ia & (a < 0), ib & (b < 0)):
        bad = np.argwhere((ia != ib) | (ia & (np.sign(a) != np.sign(b))))
        i = tuple(bad[0])
        return f"inf positions differ at {len(bad)}/{a.size}; first {i}: eager {a[i]!r} dynvm {b[i]!r}"
    tol = (1e-4, 1e-5) if da in ("float32", "float64") else (2e-2, 2e-2)
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    fin = np.isfinite(fa)
    ok = np.isclose(fb[fin], fa[fin], rtol=tol[0], atol=tol[1])
    if not ok.all():
        diff = np.asarray(np.abs(fb - fa)).reshape(a.shape)
        diff[~fin] = 0
        i = np.unravel_index(np.argmax(diff), a.shape)
        scale = float(np.max(np.abs(fa[fin]))) if fin.any() else 0.0
        return (f"{da} values differ at {int((~ok).sum())}/{a.size}; max |diff| {diff[i]:.3g} at {tuple(int(j) for j in i)}: "
                f"eager {a[i]!r} dynvm {b[i]!r} (max |eager| {scale:.3g})")
    return None


def grad_fn_for(prog):
    fpos = tuple(i for i, sp in enumerate(prog.specs) if sp.dtype in FLOATS)
    if not fpos:
        return None

    def loss(*ins):
        outs = prog.fn(*ins)
        tot = ops.zeros((), ms.float32)
        for o in outs:
            if isinstance(o, ms.Tensor) and o.dtype in FLOATS and 0 not in o.shape:
                tot = tot + ops.cast(o, ms.float32).sum()
        return tot

    return ms.value_and_grad(loss, grad_position=fpos)


def run_grad(prog, gf, b):
    try:
        ins = [sp.tensor(b) for sp in prog.specs]
        val, grads = gf(*ins)
        if not isinstance(grads, (tuple, list)):
            grads = (grads,)
        return [to_np(val)] + [to_np(g) for g in grads]
    except Exception as e:  # noqa: BLE001
        return e


def counter_delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def sizes_of(prog):
    return [prog.b0] + list(prog.alts) if prog.b0 is not None else [None]


def check_program(seed, idx, args, counts, tally):
    prog = make_prog(seed, idx, args.nan, counts)
    head = f"seed={seed} prog={idx} ins={prog.specs} b0={prog.b0} alts={prog.alts} tags={prog.tags} ops={prog.ops}"
    if args.src:
        print(f"--- {head}\n{prog.src}", flush=True)
    found = []

    def report(phase, msg):
        found.append((phase, msg))
        tally.setdefault(phase.split(":")[0], 0)
        tally[phase.split(":")[0]] += 1

    # 1. eager, twice
    sizes = sizes_of(prog)
    ref, nondet = {}, set()
    for b in sizes:
        r1, _ = run_once(prog, b)
        r2, _ = run_once(prog, b)
        ref[b] = r1
        if not same_bits(r1, r2):
            nondet.add(b)
            tally["eager_nondeterministic"] = tally.get("eager_nondeterministic", 0) + 1
    gref = {}
    # MindSpore 2.10 breaks after an exception inside value_and_grad (a later StridedSlice dies with
    # SIGFPE): gradients only where the forward program ran without an exception.
    gsizes = [b for b in sizes if not isinstance(ref[b], Exception)]
    gf = grad_fn_for(prog) if args.grad and gsizes and not prog.raises else None
    if gf is not None:
        for b in gsizes:
            g1, g2 = run_grad(prog, gf, b), run_grad(prog, gf, b)
            gref[b] = g1
            if not same_bits(g1, g2):
                nondet.add(("g", b))
                tally["eager_nondeterministic"] = tally.get("eager_nondeterministic", 0) + 1

    st0 = ms_dynvm.stats()
    rec_err0 = dict(st0["record_errors"])
    fb0 = dict(st0["fallbacks"])
    fused0 = st0.get("fused_ops", 0)
    # 2. enabled, served
    order = [sizes[0]] * 4 + [b for b in sizes[1:] for _ in range(2)] + [sizes[0]]
    ms_dynvm.enable(**ENABLE_OPTS)
    try:
        for rep, b in enumerate(order):
            got, raw = run_once(prog, b)
            if b in nondet:
                continue
            m = compare(ref[b], got)
            if m:
                report(f"enabled:b={b}:rep={rep}", m)
                break
        if gf is not None:
            for rep, b in enumerate(order):
                if b not in gref:
                    continue
                got = run_grad(prog, gf, b)
                if ("g", b) in nondet:
                    continue
                m = compare(gref[b], got)
                if m:
                    report(f"grad:b={b}:rep={rep}", m)
                    break
    except Exception as e:  # noqa: BLE001
        report("harness", f"{type(e).__name__}: {e}")
    finally:
        st1 = ms_dynvm.stats()
        ms_dynvm.disable()
    fused = st1.get("fused_ops", 0) - fused0
    tally["fused_ops"] = tally.get("fused_ops", 0) + fused

    # 3. record + interpret
    b = sizes[0]
    if b not in nondet and not isinstance(ref[b], Exception):
        try:
            with ms_dynvm.record() as rec:
                got, raw = run_once(prog, b, convert=False)
            if isinstance(got, Exception):
                report("record", f"raised under record(): {type(got).__name__}: {str(got)[:160]}")
            else:
                m = compare(ref[b], [to_np(o) for o in raw])
                if m:
                    report("record:values", m)
                if rec.errors:
                    report("record:errors", "; ".join(rec.errors)[:300])
                opaque = [i.op for i in rec.program.instrs() if i.op == "call"]
                if opaque:
                    tally["interp_skipped_opaque"] = tally.get("interp_skipped_opaque", 0) + 1
                else:
                    ins = [to_np(t)[0] for t in rec.inputs]
                    outs = ms_dynvm.interpret(rec.program, ins)
                    for k, (o, (ra, rd)) in enumerate(zip(raw, ref[b])):
                        try:
                            ix = rec.output_index(o)
                        except ValueError:
                            continue  # not made by a recorded instruction (basic indexing, pass-through)
                        ia = outs[ix]
                        idt = rd if rd == "bfloat16" else str(ia.dtype)
                        m = compare_arr(ra, rd, np.asarray(ia).astype(np.float32) if rd == "bfloat16" else np.asarray(ia), idt)
                        if m:
                            report("interp", f"out {k}: {m}")
                            break
        except Exception as e:  # noqa: BLE001
            tb = traceback.extract_tb(e.__traceback__)
            where = next((f"{os.path.basename(f.filename)}:{f.lineno}" for f in reversed(tb) if "ms_dynvm" in f.filename), "")
            report("interp", f"raised {type(e).__name__}: {str(e)[:200]} {where}")
        if ms_dynvm.is_enabled():
            ms_dynvm.disable()
    # 4. grad under record + interpret
    if gf is not None and b in gref and ("g", b) not in nondet and not isinstance(gref[b], Exception):
        try:
            ins_t = [sp.tensor(b) for sp in prog.specs]
            with ms_dynvm.record() as rec:
                val, grads = gf(*ins_t)
            grads = grads if isinstance(grads, (tuple, list)) else (grads,)
            if not any(i.op == "call" for i in rec.program.instrs()):
                outs = ms_dynvm.interpret(rec.program, [to_np(t)[0] for t in rec.inputs])
                for k, (g, (ra, rd)) in enumerate(zip(grads, gref[b][1:])):
                    try:
                        ix = rec.output_index(g)
                    except ValueError:
                        continue
                    ia = np.asarray(outs[ix])
                    m = compare_arr(ra, rd, ia.astype(np.float32) if rd == "bfloat16" else ia,
                                    rd if rd == "bfloat16" else str(ia.dtype))
                    if m:
                        report("grad_interp", f"grad {k}: {m}")
                        break
        except Exception as e:  # noqa: BLE001
            report("grad_interp", f"raised {type(e).__name__}: {str(e)[:200]}")
        if ms_dynvm.is_enabled():
            ms_dynvm.disable()

    st2 = ms_dynvm.stats()
    rec_err = counter_delta(rec_err0, dict(st2["record_errors"]))
    if rec_err:
        report("record_errors", str(rec_err))
    fbe = {k: v for k, v in counter_delta(fb0, dict(st2["fallbacks"])).items() if "error" in k.lower() or "fail" in k.lower()}
    if fbe:
        print(f"  note {head}: fallbacks {fbe}", flush=True)
    for phase, msg in found:
        print(f"MISMATCH seed={seed} prog={idx} phase={phase}: {msg}\n  {head}", flush=True)
    if found and not args.src:
        print("  " + prog.src.replace("\n", "\n  "), flush=True)
    return bool(found)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seed", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--nan", action="store_true", help="NaN/+inf/-inf in some float inputs")
    ap.add_argument("--grad", action="store_true", help="also compare value_and_grad")
    ap.add_argument("--only", default="", help="comma-separated program indices")
    ap.add_argument("--src", action="store_true", help="print every program's source")
    ap.add_argument("--verbose", action="store_true", help="per-template generation counts")
    ap.add_argument("--prog-timeout", type=float, default=300,
                    help="seconds per program before the run is stopped with a traceback (a hang)")
    ap.add_argument("--no-bf16", action="store_true", help="bfloat16 inputs and casts become float16")
    args = ap.parse_args()
    global NO_BF16
    NO_BF16 = args.no_bf16
    only = set(int(v) for v in args.only.split(",") if v) if args.only else None
    counts, tally = {}, {}
    bad = 0
    t0 = time.time()
    run = 0
    for idx in range(args.n):
        if only is not None and idx not in only:
            continue
        run += 1
        faulthandler.dump_traceback_later(args.prog_timeout, exit=True)
        try:
            bad += check_program(args.seed, idx, args, counts, tally)
        except Exception as e:  # noqa: BLE001
            bad += 1
            print(f"HARNESS ERROR seed={args.seed} prog={idx}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            if ms_dynvm.is_enabled():
                ms_dynvm.disable()
    faulthandler.cancel_dump_traceback_later()
    st = ms_dynvm.stats()
    print(f"programs {run}, with mismatches {bad}; by phase {tally}; {time.time() - t0:.0f} s")
    print(f"record_errors {dict(st['record_errors'])}; ops_opaque {dict(st.get('ops_opaque', {}))}; "
          f"groups_compiled {st.get('groups_compiled')}; guard_failures {dict(st.get('guard_failures', {}))}")
    if args.verbose:
        never = [k for k, (ok, fail) in counts.items() if ok == 0]
        print("templates never valid:", never)
        print("template counts (ok, rejected):", {k: v for k, v in sorted(counts.items())})
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
