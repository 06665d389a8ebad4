"""Backend-neutral kernel spec: one fusion group (an IR `Function`) lowered to loop nests.

What a spec is (and why)
------------------------
A `KernelSpec` is an ordered list of `Nest`s over a set of `Buffer`s (the group's inputs, its outputs,
and temporaries). A nest is a flat loop over its *outer* dims (run in parallel by a backend) holding an
ordered list of `Step`s; a step loops over its own *inner* dims and is either a map (per-element
statements and stores) or a reduction (per-element statements feeding accumulators, then `post`
statements that run once per outer point). Statements are SSA `Let`s over a small scalar-op vocabulary
(`Op` names such as "add", "exp", "gelu_erf", "cast") plus `Store`s; index expressions are tiny trees
(`ix_*` helpers) over loop variables, runtime sizes of symbolic dims and runtime element strides.
Nothing in here is C: `codegen/c.py` renders a spec to C99 and a CUDA renderer can consume the same
structure (outer dims -> blocks, inner dims -> threads/loops).

How a group is lowered
----------------------
- Views (reshape, transpose, expand_dims, squeeze, broadcast_to, slice, select, identity, contiguous)
  are never materialised: they map an output index tuple to an input index tuple (reshape through
  linearise/delinearise, only where dims really regroup). Broadcasting maps a static size-1 dim to
  index 0 (signatures specialise sizes 0 and 1, so a symbolic dim is never 1); NumPy 0-strides of the
  run-time inputs need nothing special since strides are run-time arguments.
- Elementwise ops are evaluated on demand at an index tuple (`_Lower.value`), memoised per step, so a
  chain of ops becomes straight-line code and values shared by several outputs are computed once.
- Reductions (sum/mean/prod/max/min) and the statistics of NORM ops (softmax: row max and sum of exp;
  log_softmax: row max and log of that sum; layer_norm: mean and 1/sqrt(var+eps) by two passes) are
  *materialised*: a reduction step computes them per outer point into a scalar, stored to a buffer
  (the output, or a temporary). The op's elementwise epilogue (softmax's exp(x-m)/s, layer_norm's
  affine map) stays lazy and is fused into whoever consumes it.
- Fusion of loops: a reduction or a store step joins the current nest when its outer dims have the
  same sizes and every materialised value of that nest it reads is read at "its own" outer point
  (structural equality of index expressions); otherwise it opens a new nest and reads the earlier
  statistics from their buffers. Row softmax, masked softmax, layer_norm(+gelu) and reductions along
  the last axis thus become one nest: for each row, max pass, sum pass, output pass.
- All outputs of the same shape are stored by one map step (tier 1 returns every op's result).
- Numerics: each value is computed in its dtype's compute type (f16/bf16 in f32, rounded to the
  dtype after every op, as the reference interpreter does); float sums and means, float64 products
  and the norm statistics accumulate in float64 (the reference computes norms in float64; a float32
  accumulator would drift by up to n*eps), except: float32/float16/bfloat16 products, in float32 in
  index order (as MindSpore and the reference: underflow to 0 and overflow to inf as eager); with
  `eager_math` (the default) float32 softmax sums and the float32 sums and means that MindSpore adds
  in its own float32 order (`numerics.ms_sum_order`, `_lower_softmax`, `Step.order`), and float64
  sums, means and products in index order, as MindSpore (`interpreter._seq_f64`); max/min
  follow the interpreter's NaN rule (first element NaN -> NaN, other NaNs ignored); softmax's max
  propagates NaN (IEEE semantics, as the reference).

Unsupported (`CodegenError`; per op and dtype also stated as data in `codegen.capability`, which
tests check against this lowering; `codegen.supports` lowers to find the shape-dependent cases):
COPY ops other than contiguous, matmul/conv, RANDOM/OPAQUE, complex dtypes, f64 transcendental
functions, integer floor_div/trunc_div/mod/fmod/pow, integer hardswish/hardsigmoid, integer mean,
argmax-like and var/logsumexp/softmax_cross_entropy/softmax_grad reductions, rank-0 softmax, slices of
symbolic dims other than the full range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, dim_mul
from ms_dynvm.codegen import capability
from ms_dynvm.ir import registry
from ms_dynvm.numerics import ms_sum_order


class CodegenError(Exception):
    """The group cannot be compiled (unsupported op/dtype/pattern) or the compiler failed."""


# --- index expressions --------------------------------------------------------------------------
# Nodes are tuples so that equal expressions compare (and hash) equal:
#   ("c", int) constant, ("v", name) loop variable, ("s", name) run-time size of symbol `name`,
#   ("st", buffer, axis) run-time element stride, ("+"|"*"|"/"|"%", a, b) (non-negative operands).
Ix = tuple
ZERO: Ix = ("c", 0)
ONE: Ix = ("c", 1)


def ix_const(v: int) -> Ix:
    return ("c", int(v))


def ix_add(a: Ix, b: Ix) -> Ix:
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    if a[0] == "c" and b[0] == "c":
        return ix_const(a[1] + b[1])
    return ("+", a, b)


def ix_mul(a: Ix, b: Ix) -> Ix:
    if a == ZERO or b == ZERO:
        return ZERO
    if a == ONE:
        return b
    if b == ONE:
        return a
    if a[0] == "c" and b[0] == "c":
        return ix_const(a[1] * b[1])
    return ("*", a, b)


def ix_div(a: Ix, b: Ix) -> Ix:
    if b == ONE or a == ZERO:
        return a
    if a[0] == "c" and b[0] == "c":
        return ix_const(a[1] // b[1])
    return ("/", a, b)


def ix_mod(a: Ix, b: Ix) -> Ix:
    if b == ONE or a == ZERO:
        return ZERO
    if a[0] == "c" and b[0] == "c":
        return ix_const(a[1] % b[1])
    return ("%", a, b)


def ix_dim(d) -> Ix:
    """A dim (int or Sym monomial) as an index expression over run-time symbol sizes."""
    if isinstance(d, int):
        return ix_const(d)
    out = ix_const(d.coeff)
    for name in d.names:
        out = ix_mul(out, ("s", name))
    return out


def ix_vars(e: Ix) -> set:
    """Loop variables that `e` reads."""
    if e[0] == "v":
        return {e[1]}
    if e[0] in "+*/%":
        return ix_vars(e[1]) | ix_vars(e[2])
    return set()


def ix_split(e: Ix, var: str):
    """(base, coeff) with e == base + var*coeff and neither reading `var`; None if not affine."""
    if var not in ix_vars(e):
        return e, ZERO
    kind = e[0]
    if kind == "v":
        return ZERO, ONE
    if kind == "+":
        a, b = ix_split(e[1], var), ix_split(e[2], var)
        if a is None or b is None:
            return None
        return ix_add(a[0], b[0]), ix_add(a[1], b[1])
    if kind == "*":
        left_has = var in ix_vars(e[1])
        inner, other = (e[1], e[2]) if left_has else (e[2], e[1])
        if var in ix_vars(other):
            return None
        s = ix_split(inner, var)
        if s is None:
            return None
        return ix_mul(s[0], other), ix_mul(s[1], other)
    return None  # / and % of the variable: not affine


# --- buffers, statements, steps, nests ----------------------------------------------------------
@dataclass(frozen=True)
class Buffer:
    """A tensor the kernel reads or writes. `role`: "in" (a group param), "out" (a group output) or
    "tmp" (a materialised statistic, allocated by the kernel). In/out buffers have run-time element
    strides; temporaries are C-contiguous."""

    name: str
    dtype: str
    shape: tuple
    role: str
    pos: int  # index among the buffers of its role

    def stride(self, axis: int) -> Ix:
        if self.role != "tmp":
            return ("st", self.name, axis)
        s = ONE
        for d in self.shape[axis + 1:]:
            s = ix_mul(s, ix_dim(d))
        return s

    def address(self, idx: tuple) -> Ix:
        """Element offset of index tuple `idx` (dims of static size 1 contribute nothing)."""
        off = ZERO
        for axis, (i, d) in enumerate(zip(idx, self.shape)):
            if d != 1:
                off = ix_add(off, ix_mul(i, self.stride(axis)))
        return off


@dataclass(frozen=True)
class Load:
    buf: str
    index: Ix


@dataclass(frozen=True)
class Const:
    value: object  # Python float/int/bool, already rounded to the dtype of its use


@dataclass(frozen=True)
class Op:
    """Scalar op `fn` on argument variables (names), computing in `ctype`; attrs are a sorted tuple of
    (name, value) pairs (e.g. cast's src/dst dtype, elu's alpha)."""

    fn: str
    args: tuple
    attrs: tuple = ()

    def attr(self, name: str):
        return dict(self.attrs)[name]


@dataclass(frozen=True)
class Let:
    var: str
    ctype: str  # compute type: f32 f64 i8 i16 i32 i64 u8 bool
    expr: object  # Load | Const | Op


@dataclass(frozen=True)
class Store:
    buf: str
    index: Ix
    var: str  # holds the value already converted to the buffer's dtype (compute type of it)


@dataclass
class Acc:
    """Accumulator of a reduction step: `kind` in sum/prod/max/min/nanmax; `value` is the per-element
    variable; `first` is the variable holding the element at inner index 0 (max/min init)."""

    var: str
    kind: str
    ctype: str
    value: str
    first: str | None = None


@dataclass
class Step:
    inner: list  # [(loop var, size Ix)]
    body: list  # statements per inner point (Let/Store)
    accs: list = field(default_factory=list)
    pre: list = field(default_factory=list)  # statements before the loop (max/min first element)
    post: list = field(default_factory=list)  # statements after the loop, once per outer point
    # Accumulation order over the innermost reduced loop: "lanes" (LANES partial accumulators, the
    # default: vectorisable), "seq" (one accumulator in index order), "ms8" (MindSpore CPU's float32
    # softmax sum along the last axis: 8 partial accumulators over the whole blocks of 8, summed in
    # lane order; then one block of 4 if 4 remain, summed in lane order and added; then the rest one
    # by one: nnacl's AVX, SSE and scalar stages), "ms8r" (MindSpore CPU's float32 ReduceSum/Mean
    # along the last axis of a matrix: as "ms8" without the block of 4).
    order: str = "lanes"

    @property
    def is_reduce(self) -> bool:
        return bool(self.accs)


@dataclass
class Nest:
    outer: list  # [(loop var, size Ix)]
    steps: list = field(default_factory=list)


@dataclass
class KernelSpec:
    name: str
    buffers: list  # [Buffer]: inputs (params order), outputs (fn.outputs order), temporaries
    syms: list  # names of symbolic dims, sorted: the `sizes` argument order
    nests: list
    params: list  # param registers, in order
    outputs: list  # output registers, in order

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    @property
    def inputs(self) -> list:
        return [b for b in self.buffers if b.role == "in"]

    @property
    def outs(self) -> list:
        return [b for b in self.buffers if b.role == "out"]

    @property
    def temps(self) -> list:
        return [b for b in self.buffers if b.role == "tmp"]


# --- dtype helpers ------------------------------------------------------------------------------
_CTYPE = {"f16": "f32", "bf16": "f32", "f32": "f32", "f64": "f64", "i8": "i8", "i16": "i16",
          "i32": "i32", "i64": "i64", "u8": "u8", "bool": "bool"}
ROUNDED = frozenset({"f16", "bf16"})  # held in f32, rounded after every op


def ctype_of(dtype: str) -> str:
    if dtype not in _CTYPE:
        raise CodegenError(f"dtype {dtype} is not supported by the C backend")
    return _CTYPE[dtype]


def _is_float(dtype: str) -> bool:
    return dtype in dtypes.FLOATS


def _const_of(value, dtype: str):
    """Python scalar `value` as the interpreter's `_cast(value, dtype)` gives it (rounded)."""
    if dtype == "bool":
        return bool(value)
    if dtype == "bf16":
        v = np.float32(value)
        if math.isnan(v):
            return float(v)
        b = int(np.asarray(v).reshape(1).view(np.uint32)[0])
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
        return float(np.asarray([r], np.uint32).view(np.float32)[0])
    with np.errstate(all="ignore"):
        v = np.asarray(value).astype(dtypes.to_numpy(dtype))
    return v.item()


# --- lowering -----------------------------------------------------------------------------------
_REDUCE_OPS = frozenset({"sum", "mean", "prod", "max", "min"})
_NORM_OPS = frozenset({"softmax", "log_softmax", "layer_norm"})
# float16 ops whose MindSpore kernel rounds an inner step to float16, or calls the C library
# (erf), where the kernels otherwise compute in float32 and round once (`_Lower._f16_steps`).
_F16_STEPS = frozenset({"sigmoid", "silu", "rsqrt", "expm1", "log1p", "log2", "erf"})
_F16_STEPS2 = frozenset({"sigmoid_grad", "silu_grad"})
_VIEW_OPS = frozenset({"reshape", "transpose", "expand_dims", "squeeze", "broadcast_to", "slice", "select",
                       "identity", "contiguous"})
# The per-op dtype facts are the capability table's (one place: `codegen.capability`).
_TRANSCENDENTAL = capability.NO_F64
_FLOAT_UNARY = capability.FLOAT_INPUT
_INT_OK_BINARY = capability.INT_BINARY
_COMPARE = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


class _NotFusible(Exception):
    """A step read a statistic of the current nest at another outer point: open a new nest."""


@dataclass
class _Mat:
    """A materialised value: where it lives and how the nest that made it indexes it."""

    buf: str
    dtype: str
    nest: int
    var: str  # scalar variable (compute type of dtype) valid inside nest `nest`
    natural: tuple  # index tuple at which `var` is the value, in the loop vars of nest `nest`


class _Lower:
    def __init__(self, fn, name: str, eager_math: bool = True):
        self.fn = fn
        self.name = name
        self.eager_math = eager_math
        self.types = fn.types
        self.producer = {}
        for ins in fn.body:
            for k, r in enumerate(ins.outs):
                self.producer[r] = (ins, k)
        self.buffers: list[Buffer] = []
        self.buf_of: dict = {}
        for i, r in enumerate(fn.params):
            self._check_dtype(self.types[r].dtype)
            b = Buffer(f"in{i}", self.types[r].dtype, tuple(self.types[r].shape), "in", i)
            self.buffers.append(b)
            self.buf_of.setdefault(r, b)
        self.out_buf: dict = {}  # reg -> its first output buffer
        self.out_bufs: dict = {}  # reg -> every output buffer (a register may be listed twice)
        for i, r in enumerate(fn.outputs):
            self._check_dtype(self.types[r].dtype)
            b = Buffer(f"out{i}", self.types[r].dtype, tuple(self.types[r].shape), "out", i)
            self.buffers.append(b)
            self.out_buf.setdefault(r, b)
            self.out_bufs.setdefault(r, []).append(b)
        self.mats: dict = {}  # key (reg or synthetic string) -> _Mat
        self.nests: list[Nest] = []
        self.n_tmp = 0
        self.n_var = 0
        # Per-step code generation state.
        self.code: list = []
        self.memo: dict = {}
        self.nest_id = -1
        self.syms = sorted({n for t in self.types.values() for d in t.shape if isinstance(d, Sym)
                            for n in d.names})

    # --- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _check_dtype(dt: str) -> None:
        if dt in dtypes.COMPLEX:
            raise CodegenError(f"complex dtype {dt} is not supported")
        ctype_of(dt)

    def fresh(self, prefix: str = "v") -> str:
        self.n_var += 1
        return f"{prefix}{self.n_var}"

    def let(self, ctype: str, expr, prefix: str = "v") -> str:
        v = self.fresh(prefix)
        self.code.append(Let(v, ctype, expr))
        return v

    def op(self, ctype: str, fn: str, *args, **attrs) -> str:
        key = ("op", ctype, fn, args, tuple(sorted(attrs.items())))
        if key in self.memo:
            return self.memo[key]
        v = self.let(ctype, Op(fn, tuple(args), tuple(sorted(attrs.items()))))
        self.memo[key] = v
        return v

    def const(self, value, dtype: str) -> str:
        c = _const_of(value, dtype)
        key = ("const", dtype, repr(c))
        if key not in self.memo:
            self.memo[key] = self.let(ctype_of(dtype), Const(c))
        return self.memo[key]

    def convert(self, var: str, src: str, dst: str) -> str:
        """`var` (compute type of dtype `src`) as a value of dtype `dst` (rounded to f16/bf16)."""
        if src == dst:
            return var
        if src == "f64" and dst in ("f16", "bf16"):  # round once through f32 is not exact: refuse
            raise CodegenError(f"cast f64 -> {dst} is not supported (double rounding)")
        if _is_float(src) and dst in ("i8", "i16", "u8", "i32", "i64") and src == "f64":
            raise CodegenError("cast f64 -> integer is not supported")
        return self.op(ctype_of(dst), "cast", var, src=src, dst=dst)

    def rounded(self, var: str, dtype: str) -> str:
        """Round an f32-computed result to its f16/bf16 dtype."""
        if dtype in ROUNDED:
            return self.op("f32", "round_to", var, dst=dtype)
        return var

    def operand(self, a, dtype: str, idx_of) -> str:
        """Operand `a` (Reg or immediate) converted to dtype `dtype`; idx_of(reg) gives its index."""
        if isinstance(a, Reg):
            r = int(a)
            return self.convert(self.value(r, idx_of(r)), self.types[r].dtype, dtype)
        if a is None:
            raise CodegenError("None operand")
        return self.const(a, dtype)

    # --- values at an index ---------------------------------------------------------------------
    def value(self, reg: int, idx: tuple) -> str:
        """Variable holding register `reg` at index tuple `idx` (compute type of its dtype)."""
        key = ("val", reg, idx)
        if key in self.memo:
            return self.memo[key]
        v = self._value(reg, idx)
        self.memo[key] = v
        return v

    def load(self, buf: Buffer, idx: tuple) -> str:
        v = self.let(ctype_of(buf.dtype), Load(buf.name, buf.address(idx)), "ld")
        if buf.dtype == "bf16" and buf.role == "in":  # inputs are rounded on entry (interpreter)
            v = self.rounded(v, "bf16")
        return v

    def _value(self, reg: int, idx: tuple) -> str:
        if reg in self.mats:
            return self._mat_value(reg, idx)
        if reg in self.buf_of:
            return self.load(self.buf_of[reg], idx)
        if reg not in self.producer:
            raise CodegenError(f"register %{reg} is neither a param nor defined in the group")
        ins, k = self.producer[reg]
        op = ins.op
        if op in _VIEW_OPS:
            return self.value(int(ins.args[0]), self._view_index(ins, idx))
        if op in opcodes.ELEMENTWISE:
            return self._elementwise(ins, idx)
        if op == "fill":  # a splat constant (what `passes.fold` leaves of constant chains)
            return self.const(ins.attrs["value"], self.types[reg].dtype)
        if op in ("softmax", "log_softmax"):
            return self._softmax_value(ins, idx)
        if op == "layer_norm" and k == 0:
            return self._layer_norm_value(ins, idx)
        raise CodegenError(f"op {op} cannot be evaluated here (not materialised)")

    def _mat_value(self, key, idx: tuple) -> str:
        m = self.mats[key]
        if m.nest == self.nest_id:
            if tuple(idx) != tuple(m.natural):
                raise _NotFusible(key)
            return m.var
        buf = self.buffer(m.buf)
        return self.load(buf, idx)

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    # --- views ----------------------------------------------------------------------------------
    def _view_index(self, ins, idx: tuple) -> tuple:
        op, a = ins.op, ins.attrs
        src = tuple(self.types[int(ins.args[0])].shape)
        dst = tuple(self.types[ins.outs[0]].shape)
        if op in ("identity", "contiguous"):
            return idx
        if op == "transpose":
            perm = [p % len(src) for p in a["perm"]] if src else []
            out = [ZERO] * len(src)
            for k, p in enumerate(perm):
                out[p] = idx[k]
            return tuple(out)
        if op == "broadcast_to":
            lead = len(dst) - len(src)
            return tuple(ZERO if (s == 1 and dst[lead + d] != 1) else idx[lead + d] for d, s in enumerate(src))
        if op == "slice":
            out = []
            for d, (b, e, s) in enumerate(zip(a["begin"], a["end"], a["step"])):
                n = src[d]
                if isinstance(n, Sym):
                    start = 0 if b in (0, None) else None
                    if start is None or s != 1:
                        raise CodegenError(f"slice {b}:{e}:{s} of symbolic dim {n}")
                    out.append(idx[d])
                    continue
                start, _, step = slice(b, e, s).indices(n)
                out.append(ix_add(ix_const(start), ix_mul(idx[d], ix_const(step))))
            return tuple(out)
        if op == "select":
            axis = a["axis"] % len(src)
            n = src[axis]
            index = a["index"]
            if index < 0:
                if isinstance(n, Sym):
                    raise CodegenError("select with a negative index on a symbolic dim")
                index += n
            return tuple(idx[:axis]) + (ix_const(index),) + tuple(idx[axis:])
        if op in ("expand_dims", "squeeze", "reshape"):
            return self._reshape_index(src, dst, idx)
        raise CodegenError(f"view {op}")

    @staticmethod
    def _reshape_index(src: tuple, dst: tuple, idx: tuple) -> tuple:
        """Index into `src` of element `idx` of `dst` (same numel, row-major). Dims are grouped where
        their products agree, so a split needs no division and only a merge needs div/mod."""
        out = [ZERO] * len(src)
        si = [i for i, d in enumerate(src) if d != 1]
        di = [i for i, d in enumerate(dst) if d != 1]
        p = q = 0
        while p < len(si) or q < len(di):
            gs, gd = [si[p]] if p < len(si) else [], [di[q]] if q < len(di) else []
            ps = src[gs[0]] if gs else 1
            pd = dst[gd[0]] if gd else 1
            p += bool(gs)
            q += bool(gd)
            while ps != pd:
                grow_src = _smaller(ps, pd)
                if grow_src is None:
                    raise CodegenError(f"reshape {src} -> {dst} cannot be grouped")
                if grow_src:
                    if p >= len(si):
                        raise CodegenError(f"reshape {src} -> {dst} cannot be grouped")
                    gs.append(si[p])
                    ps = dim_mul(ps, src[si[p]])
                    p += 1
                else:
                    if q >= len(di):
                        raise CodegenError(f"reshape {src} -> {dst} cannot be grouped")
                    gd.append(di[q])
                    pd = dim_mul(pd, dst[di[q]])
                    q += 1
            lin = ZERO
            for k in gd:
                lin = ix_add(ix_mul(lin, ix_dim(dst[k])), idx[k])
            if len(gs) == 1:
                out[gs[0]] = lin
                continue
            rest = lin
            for j, k in enumerate(reversed(gs)):
                out[k] = rest if j == len(gs) - 1 else ix_mod(rest, ix_dim(src[k]))
                rest = ix_div(rest, ix_dim(src[k]))
        return tuple(out)

    # --- elementwise ----------------------------------------------------------------------------
    def _bcast(self, reg: int, out_shape: tuple, idx: tuple) -> tuple:
        shape = tuple(self.types[reg].shape)
        lead = len(out_shape) - len(shape)
        return tuple(ZERO if (d == 1 and out_shape[lead + k] != 1) else idx[lead + k] for k, d in enumerate(shape))

    def _elementwise(self, ins, idx: tuple) -> str:
        out_t = self.types[ins.outs[0]]
        rd = out_t.dtype
        op, attrs, args = ins.op, ins.attrs, ins.args
        shape = tuple(out_t.shape)

        if op == "bias_add":
            # x + bias along one axis (not right-aligned broadcasting): the bias is read at that
            # axis's index; the rest is `add` (same promotion, rounding and integer rules).
            axis = attrs["axis"] % len(shape)
            bias = int(args[1])

            def at(r):
                return (idx[axis],) if r == bias else self._bcast(r, shape, idx)

            op = "add"
        else:
            def at(r):
                return self._bcast(r, shape, idx)

        def arg(i, dt):
            return self.operand(args[i], dt, at)

        ct = ctype_of(rd)
        if op == "cast":
            src = self.types[int(args[0])].dtype
            return self.convert(self.value(int(args[0]), at(int(args[0]))), src, rd)
        if op == "full_like":
            return self.const(attrs["value"], rd)
        if op in ("identity",):
            return arg(0, rd)
        if op in _COMPARE:
            dt = registry.promote_values(op, [self._arg_type(a) for a in args])
            if dt in dtypes.COMPLEX:
                raise CodegenError("complex compare")
            return self.op("bool", op, arg(0, dt), arg(1, dt))
        if op in ("logical_and", "logical_or", "logical_xor"):
            return self.op("bool", op, arg(0, "bool"), arg(1, "bool"))
        if op == "logical_not":
            return self.op("bool", "logical_not", arg(0, "bool"))
        if op in ("isnan", "isinf", "isfinite"):
            src = self.types[int(args[0])].dtype
            if not _is_float(src):
                return self.const(op == "isfinite", "bool")
            return self.op("bool", op, self.value(int(args[0]), at(int(args[0]))))
        if op == "where":
            c = arg(0, "bool")
            return self.op(ct, "select", c, arg(1, rd), arg(2, rd))
        if op == "masked_fill":
            return self.op(ct, "select", arg(1, "bool"), arg(2, rd), arg(0, rd))
        if op == "nan_to_num":
            if rd not in ("f16", "f32"):
                raise CodegenError(f"nan_to_num of {rd}")
            fi = np.finfo(dtypes.to_numpy(rd))
            pos = fi.max if attrs["posinf"] is None else attrs["posinf"]
            neg = fi.min if attrs["neginf"] is None else attrs["neginf"]
            x = arg(0, rd)
            inf = self.const(float("inf"), rd)
            r = self.op(ct, "select", self.op("bool", "eq", x, inf), self.const(float(pos), rd), x)
            r = self.op(ct, "select", self.op("bool", "eq", x, self.const(float("-inf"), rd)), self.const(float(neg), rd), r)
            return self.op(ct, "select", self.op("bool", "isnan", x), self.const(float(attrs["nan"]), rd), r)
        if op == "clamp":
            r = arg(0, rd)
            if args[1] is not None:
                r = self.op(ct, "clamp_lo", r, arg(1, rd))
            if args[2] is not None:
                r = self.op(ct, "clamp_hi", r, arg(2, rd))
            return r
        if (op in _FLOAT_UNARY and args and isinstance(args[0], Reg)
                and not _is_float(self.types[int(args[0])].dtype)):
            # MindSpore CPU refuses most of these on integer and bool tensors and has rules of its own
            # for the rest (selu of int32: -1 -> 0, measured; the VM's elu then mul gives -1).
            raise CodegenError(f"{op} of a {self.types[int(args[0])].dtype} tensor is left to eager")
        if rd == "bool":
            return self._bool_arith(op, args, arg)
        if not _is_float(rd):
            return self._int_op(op, ins, arg, rd)
        # float result
        if rd == "f64" and op in _TRANSCENDENTAL:
            raise CodegenError(f"{op} on f64 is not supported (no vectorised f64 math)")
        return self.rounded(self._float_op(op, ins, arg, rd, ct), rd)

    def _arg_type(self, a):
        return self.types[int(a)] if isinstance(a, Reg) else a

    def _bool_arith(self, op, args, arg) -> str:
        table = {"add": "logical_or", "sub": "logical_xor", "mul": "logical_and", "maximum": "logical_or",
                 "minimum": "logical_and", "bitwise_and": "logical_and", "bitwise_or": "logical_or",
                 "bitwise_xor": "logical_xor"}
        if op in table:
            return self.op("bool", table[op], arg(0, "bool"), arg(1, "bool"))
        if op in ("abs", "square", "relu", "floor", "ceil", "round", "trunc", "identity", "contiguous"):
            return arg(0, "bool")
        if op == "relu_grad":
            return self.op("bool", "logical_and", arg(0, "bool"), arg(1, "bool"))
        raise CodegenError(f"{op} on bool is not supported")

    def _int_op(self, op, ins, arg, rd) -> str:
        ct = ctype_of(rd)
        if op in _INT_OK_BINARY:
            return self.op(ct, op, arg(0, rd), arg(1, rd))
        if op in ("neg", "abs", "square", "relu", "relu6", "sign"):
            return self.op(ct, op, arg(0, rd))
        if op in ("floor", "ceil", "round", "trunc", "identity"):
            return arg(0, rd)
        if op == "relu_grad":
            return self.op(ct, "relu_grad", arg(0, rd), arg(1, rd))
        raise CodegenError(f"{op} with integer result {rd} is not supported")

    def _float_op(self, op, ins, arg, rd, ct) -> str:
        a = ins.attrs
        if rd == "f16" and self.eager_math and op in _F16_STEPS:
            return self._f16_steps(op, arg(0, rd))
        if rd == "f16" and self.eager_math and op in _F16_STEPS2:
            return self._f16_steps2(op, arg(0, rd), arg(1, rd))
        if op in ("add", "sub", "mul", "div", "floor_div", "trunc_div", "mod", "fmod", "maximum", "minimum",
                  "atan2"):
            return self.op(ct, op, arg(0, rd), arg(1, rd))
        if op == "pow":
            e = ins.args[1]
            if not isinstance(e, Reg) and e in (2, 2.0):
                x = arg(0, rd)
                return self.op(ct, "mul", x, x)
            return self.op(ct, "pow", arg(0, rd), arg(1, rd))
        if op in ("lerp",):
            # (a float16 lerp computes in float32 with the weight as float32: a float32 0-d weight,
            # or a Python float, is not rounded to float16 first; see the interpreter)
            return self.op(ct, "lerp", arg(0, rd), arg(1, rd), arg(2, "f32" if rd == "f16" else rd))
        if op == "addcmul":
            return self.op(ct, "addcmul", arg(0, rd), arg(1, rd), arg(2, rd), self.const(a["value"], rd))
        if op in ("relu_grad",):
            return self.op(ct, "relu_grad", arg(0, rd), arg(1, rd))
        if op in ("sigmoid_grad", "tanh_grad", "silu_grad"):
            return self.op(ct, op, arg(0, rd), arg(1, rd))
        if op == "elu_grad":
            return self.op(ct, "elu_grad", arg(0, rd), arg(1, rd), alpha=float(a["alpha"]))
        if op == "gelu_grad":
            return self.op(ct, "gelu_grad_" + a["approximate"], arg(0, rd), arg(1, rd))
        if op == "gelu":
            return self.op(ct, "gelu_" + ("erf" if a["approximate"] == "none" else "tanh"), arg(0, rd))
        if op in ("elu", "leaky_relu"):
            return self.op(ct, op, arg(0, rd), alpha=float(a["alpha"]))
        if op == "softplus":
            return self.op(ct, op, arg(0, rd), beta=float(a["beta"]), threshold=float(a["threshold"]))
        if op in _FLOAT_UNARY or op in ("neg", "abs", "square", "relu", "relu6", "floor", "ceil", "round",
                                        "trunc", "sign", "hardswish", "hardsigmoid"):
            return self.op(ct, op, arg(0, rd))
        raise CodegenError(f"op {op} is not supported by the C backend")

    def _r16(self, v: str) -> str:
        """`v` (float32) rounded to float16: one float16 step of MindSpore's kernels."""
        return self.rounded(v, "f16")

    def _f16_steps(self, op: str, x: str) -> str:
        """MindSpore 2.10 CPU's float16 kernels that round an inner step to float16 (the
        interpreter's `_MS_F16`, measured bit-equal to eager over every finite float16): x holds a
        float16 value in float32; the caller rounds the result."""
        one, r16 = self.const(1.0, "f32"), self._r16

        def sigmoid(v):  # 1 / f16(1 + f16(expf(-x)))
            return self.op("f32", "div_plain", one,
                           r16(self.op("f32", "add", one, r16(self.op("f32", "exp_libm", self.op("f32", "neg", v))))))

        if op == "sigmoid":
            return sigmoid(x)
        if op == "silu":
            return self.op("f32", "mul", x, r16(sigmoid(x)))
        if op == "rsqrt":
            return self.op("f32", "div_plain", one, r16(self.op("f32", "sqrt", x)))
        if op == "expm1":
            return self.op("f32", "sub", r16(self.op("f32", "exp_libm", x)), one)
        if op == "erf":  # the C library's erff, rounded (ms_dynvm's own erf: 2 of 63,488 values off)
            return self.op("f32", "erf_libm", x)
        if op == "log2":  # f16(log x) / f16(ln 2)
            return self.op("f32", "div_plain", r16(self.op("f32", "log", x)),
                           self.const(float(np.float16(math.log(2.0))), "f32"))
        return self.op("f32", "log", r16(self.op("f32", "add", x, one)))  # log1p

    def _f16_steps2(self, op: str, a: str, b: str) -> str:
        """`_f16_steps` for the gradients: sigmoid_grad (y, dy) as f16(f16(1 - y) * y) * dy;
        silu_grad (dy, x) on the float16 sigmoid s as f16(dy*s) + f16(f16(dy*x) * f16(s * f16(1 - s)))."""
        one, r16 = self.const(1.0, "f32"), self._r16
        if op == "sigmoid_grad":
            return self.op("f32", "mul", r16(self.op("f32", "mul", r16(self.op("f32", "sub", one, a)), a)), b)
        s = r16(self._f16_steps("sigmoid", b))  # silu_grad
        t = r16(self.op("f32", "mul", s, r16(self.op("f32", "sub", one, s))))
        return self.op("f32", "add", r16(self.op("f32", "mul", a, s)),
                       r16(self.op("f32", "mul", r16(self.op("f32", "mul", a, b)), t)))

    # --- norms (lazy epilogues) -----------------------------------------------------------------
    def _stat_index(self, x_shape: tuple, axes, idx: tuple) -> tuple:
        return tuple(ZERO if k in axes else i for k, i in enumerate(idx))

    def _softmax_value(self, ins, idx: tuple) -> str:
        xr = int(ins.args[0])
        xt = self.types[xr]
        axis = _softmax_axis(ins.attrs["axis"], xt.rank)
        sidx = self._stat_index(xt.shape, (axis,), idx)
        out = ins.outs[0]
        x = self.convert(self.value(xr, idx), xt.dtype, "f32")
        m = self._mat_value(f"max{out}", sidx)
        d = self.op("f32", "sub_rounded", x, m)  # (x as the max pass saw it: see c.py)
        if ins.op == "softmax":
            mode = self._softmax_mode(ins)
            r = self._softmax_scale(mode, self._softmax_exp(mode, d), self._mat_value(f"sum{out}", sidx))
            if _mindspore_softmax_rule(xt, axis):
                r = self.op("f32", "softmax_fix", r, x, m)
        else:
            r = self.op("f32", "sub", d, self._mat_value(f"logsum{out}", sidx))
            r = self.op("f32", "log_softmax_fix", r, x, m)
        return self.rounded(r, self.types[out].dtype)

    def _softmax_mode(self, ins):
        """How softmax `ins` is computed (see `_lower_softmax`): "last" or "other" (MindSpore's
        float32 softmax along the last or another axis, under eager_math), or None (ours)."""
        xt = self.types[int(ins.args[0])]
        if not (self.eager_math and ins.op == "softmax" and xt.dtype in ("f32", "f16")
                and self.types[ins.outs[0]].dtype == xt.dtype):
            return None
        if xt.dtype == "f16":
            return "f16"
        return "last" if _softmax_axis(ins.attrs["axis"], xt.rank) == xt.rank - 1 else "other"

    def _softmax_exp(self, mode, d: str) -> str:
        if mode == "f16":
            # MindSpore's float16 softmax (the interpreter's): f16(expf(f16(x - max))); the sum of
            # those in float32, rounded to float16; y = f16(e / that)
            return self._r16(self.op("f32", "exp_libm", self._r16(d)))
        return self.op("f32", "exp_libm" if mode == "other" else "exp", d)

    def _softmax_scale(self, mode, e: str, s: str) -> str:
        """e / s; or e * s, where the sum pass materialised 1/s (MindSpore's last-axis softmax)."""
        if mode == "last":
            return self.op("f32", "mul", e, s)
        return self.op("f32", "div_plain", e, s)

    def _layer_norm_value(self, ins, idx: tuple) -> str:
        xr = int(ins.args[0])
        xt = self.types[xr]
        bna = ins.attrs["begin_norm_axis"] % xt.rank
        bpa = ins.attrs["begin_params_axis"] % xt.rank
        sidx = tuple(ZERO if k >= bna else i for k, i in enumerate(idx))
        pidx = tuple(idx[bpa:])
        out = ins.outs[0]
        ydt = self.types[out].dtype
        mean = self._mat_value(f"lnmean{out}", sidx)
        if self._ln_eager(ydt):
            # MindSpore CPU's LayerNorm (the interpreter's `_layer_norm`): from the float32 statistics,
            # each step rounded to y's type: ((x - mean) / sqrt(var + eps)) * gamma + beta.
            sd = self._mat_value(f"lnsd{out}", sidx)
            if ydt == "f16":
                mean, sd = self.rounded(mean, ydt), self.rounded(sd, ydt)
            y = self.rounded(self.op("f32", "sub", self.convert(self.value(xr, idx), xt.dtype, ydt), mean), ydt)
            y = self.rounded(self.op("f32", "div_plain", y, sd), ydt)
            y = self.rounded(self.op("f32", "mul", y, self.operand(ins.args[1], ydt, lambda r: pidx)), ydt)
            return self.rounded(self.op("f32", "add", y, self.operand(ins.args[2], ydt, lambda r: pidx)), ydt)
        x = self.convert(self.value(xr, idx), xt.dtype, "f32")
        rstd = self._mat_value(f"lnrstd{out}", sidx)
        g = self.operand(ins.args[1], "f32", lambda r: pidx)
        b = self.operand(ins.args[2], "f32", lambda r: pidx)
        y = self.op("f32", "sub", x, mean)
        y = self.op("f32", "mul", y, rstd)
        y = self.op("f32", "fma", y, g, b)
        return self.rounded(y, self.types[out].dtype)

    # --- nests and steps ------------------------------------------------------------------------
    def _try_nest(self, outer_sizes: list, build) -> None:
        """Run `build(outer_vars)` as a step of the current nest if the sizes match and it fuses,
        else as the first step of a new nest."""
        if self.nests and [s for _, s in self.nests[-1].outer] == outer_sizes:
            if self._attempt(len(self.nests) - 1, build):
                return
        self.nests.append(Nest([(f"o{len(self.nests)}_{k}", s) for k, s in enumerate(outer_sizes)]))
        if not self._attempt(len(self.nests) - 1, build):
            raise CodegenError("internal: a step does not fit a fresh nest")

    def _attempt(self, nest_id: int, build) -> bool:
        saved = (dict(self.mats), self.n_tmp, list(self.buffers))
        self.nest_id = nest_id
        self.code, self.memo = [], {}
        nest = self.nests[nest_id]
        try:
            step = build([v for v, _ in nest.outer])
        except _NotFusible:
            self.mats, self.n_tmp, self.buffers = saved[0], saved[1], saved[2]
            return False
        nest.steps.append(step)
        return True

    def _tmp(self, dtype: str, shape: tuple) -> Buffer:
        b = Buffer(f"tmp{self.n_tmp}", dtype, tuple(shape), "tmp", self.n_tmp)
        self.n_tmp += 1
        self.buffers.append(b)
        return b

    def _reduction_step(self, x_eval, x_shape: tuple, axes: tuple, outer_vars, kind: str, acc_ct: str):
        """A reduction step over `axes` of a domain of shape `x_shape`: returns (step, acc var,
        kept index of the outer point). `x_eval(idx)` emits the element value (in acc_ct)."""
        kept = [a for a in range(len(x_shape)) if a not in axes and x_shape[a] != 1]
        inner = [(self.fresh(f"r{a}_"), ix_dim(x_shape[a])) for a in axes if x_shape[a] != 1]
        red_axes = [a for a in axes if x_shape[a] != 1]
        idx = [ZERO] * len(x_shape)
        for a, v in zip(kept, outer_vars):
            idx[a] = ("v", v)
        for a, (v, _) in zip(red_axes, inner):
            idx[a] = ("v", v)
        first = None
        pre = []
        if kind in ("max", "min"):
            first_idx = list(idx)
            for a in red_axes:
                first_idx[a] = ZERO
            first = x_eval(tuple(first_idx))
            pre, self.code = self.code, []
        # Variables made inside the loop are out of scope after it: forget them afterwards.
        outer_memo = dict(self.memo)
        val = x_eval(tuple(idx))
        body, self.code = self.code, []
        self.memo = outer_memo
        acc = self.fresh("acc")
        step = Step(inner, body, [Acc(acc, kind, acc_ct, val, first)], pre, [])
        return step, acc

    def _lower_reduce(self, ins) -> None:
        x = int(ins.args[0])
        xt = self.types[x]
        out = ins.outs[0]
        rt = self.types[out]
        op = ins.op
        axes = registry.norm_axes(op, ins.attrs["axis"], xt.rank)
        if rt.dtype == "bool" or xt.dtype == "bool" and op in ("max", "min"):
            raise CodegenError(f"{op} on bool is not supported")
        if op == "mean" and not _is_float(rt.dtype):
            raise CodegenError("integer mean is not supported")
        n = ONE
        for a in axes:
            n = ix_mul(n, ix_dim(xt.shape[a]))
        kind = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "max", "min": "min"}[op]
        ms_order = None  # a Step.order other than the default lanes
        if kind in ("sum", "prod"):
            elem_dt = rt.dtype  # the interpreter casts x to the result dtype first
            if kind == "sum" and elem_dt in ("f32", "bf16") and self.eager_math:
                # (bfloat16, which MindSpore CPU does not reduce, as the interpreter: its float32 values)
                ms_order = ms_sum_order(op, xt.rank, axes, xt.shape)
            if ms_order is not None:
                acc_ct = "f32"  # MindSpore's own float32 order (ms_sum_order)
            elif elem_dt == "f64" and self.eager_math:
                # MindSpore adds and multiplies float64 in index order (interpreter._seq_f64)
                acc_ct, ms_order = "f64", "seq"
            elif kind == "prod" and elem_dt in ("f32", "f16", "bf16"):
                # MindSpore multiplies float32/float16 products in float32 in index order, as the
                # interpreter does: a float64 product missed eager's underflow to 0 and overflow to inf
                # (0 * inf = NaN there), and partial products per lane kept [1e4]*10 + [1e-4]*10 finite.
                acc_ct, ms_order = "f32", "seq"
            else:
                acc_ct = "f64" if _is_float(elem_dt) else "i64"
        else:
            elem_dt = xt.dtype
            acc_ct = ctype_of(elem_dt)
        kept = [a for a in range(xt.rank) if a not in axes and xt.shape[a] != 1]
        outer_sizes = [ix_dim(xt.shape[a]) for a in kept]
        buf = self.out_buf.get(out)

        def build(outer_vars):
            def x_eval(idx):
                return self.convert(self.convert(self.value(x, idx), xt.dtype, elem_dt), elem_dt,
                                    "f64" if acc_ct == "f64" else elem_dt)

            step, acc = self._reduction_step(x_eval, xt.shape, axes, outer_vars, kind, acc_ct)
            if ms_order is not None:
                step.order = ms_order
            r, r_ct = acc, acc_ct
            if op == "mean" and elem_dt in ("f32", "bf16") and self.eager_math:
                # MindSpore: the float32 sum (its order, or float64 rounded), then / n in float32
                if r_ct == "f64":
                    r = self.op("f32", "cast", r, src="f64", dst="f32")
                r = self.op("f32", "div_plain", r, self.op("f32", "cast", self._size_var(n), src="i64", dst="f32"))
                r_ct = "f32"
            elif op == "mean":
                r = self.op("f64", "div_plain", acc, self.op("f64", "cast", self._size_var(n), src="i64",
                                                            dst="f64"))
            if r_ct == "f64" and rt.dtype != "f64":
                r = self.op("f32", "cast", r, src="f64", dst="f32")
                r = self.rounded(r, rt.dtype)
            elif r_ct == "i64" and rt.dtype != "i64":
                r = self.op(ctype_of(rt.dtype), "cast", r, src="i64", dst=rt.dtype)
            elif r_ct == "f32" and rt.dtype != "f32":
                r = self.rounded(r, rt.dtype)
            natural = self._natural(xt.shape, axes, kept, outer_vars, ins.attrs["keepdims"])
            self._materialise(out, rt.dtype, buf, natural, r)
            step.post = self.code
            return step

        self._try_nest(outer_sizes, build)

    def _size_var(self, n: Ix) -> str:
        return self.let("i64", Op("size", (), (("ix", n),)))

    def _natural(self, shape, axes, kept, outer_vars, keepdims: bool) -> tuple:
        pos = {a: ("v", v) for a, v in zip(kept, outer_vars)}
        idx = []
        for a in range(len(shape)):
            if a in axes:
                if keepdims:
                    idx.append(ZERO)
            else:
                idx.append(pos.get(a, ZERO))
        return tuple(idx)

    def _materialise(self, key, dtype: str, buf: Buffer | None, natural: tuple, var: str, shape=None) -> None:
        """Record `var` (this nest's scalar) as the value of `key` at `natural`; store it to `buf`
        (an output) or to a new temporary (dropped later if nobody loads it)."""
        if buf is None:
            if shape is None:
                shape = self.types[key].shape
            buf = self._tmp(dtype, shape)
        self.code.append(Store(buf.name, buf.address(natural), var))
        for other in self.out_bufs.get(key, [])[1:]:
            self.code.append(Store(other.name, other.address(natural), var))
        self.mats[key] = _Mat(buf.name, dtype, self.nest_id, var, natural)

    def _lower_softmax(self, ins) -> None:
        x = int(ins.args[0])
        xt = self.types[x]
        out = ins.outs[0]
        if xt.rank == 0:
            raise CodegenError("softmax of a 0-d tensor is not supported")
        if self.types[out].dtype == "f64":
            raise CodegenError("softmax on f64 is not supported")
        axis = _softmax_axis(ins.attrs["axis"], xt.rank)
        kept = [a for a in range(xt.rank) if a != axis and xt.shape[a] != 1]
        outer_sizes = [ix_dim(xt.shape[a]) for a in kept]
        stat_shape = tuple(1 if a == axis else d for a, d in enumerate(xt.shape))

        def x_eval_f32(idx):
            return self.convert(self.value(x, idx), xt.dtype, "f32")

        def build_max(outer_vars):
            step, acc = self._reduction_step(x_eval_f32, xt.shape, (axis,), outer_vars, "nanmax", "f32")
            natural = self._natural(xt.shape, (axis,), kept, outer_vars, True)
            self._materialise(f"max{out}", "f32", None, natural, acc, stat_shape)
            step.post = self.code
            return step

        # When the softmax result is a kernel output in f32, the sum pass stores each exp(x - max)
        # into it and a last pass scales it in place: one exp per element instead of two (the
        # stored value is the very f32 the sum adds, so results are bit-identical either way).
        out_bufs = self.out_bufs.get(out, [])
        keep_e = (ins.op == "softmax" and self.types[out].dtype == "f32" and bool(out_bufs)
                  and xt.shape[axis] != 1)
        # eager_math: float32 softmax as MindSpore 2.10 CPU computes it (nnacl; bit-identical to eager
        # on every input measured, `tests/codegen/test_eager_math.py`): along the last axis its own
        # exp (the kernels' eager exp), the sum in float32 in its SIMD order (Step.order "ms8") and
        # e * (1/sum); along another axis the C library's expf, the sum in float32 in index order and
        # e / sum. Otherwise (and for log_softmax, whose MindSpore kernel is oneDNN's): exp, a float64
        # sum, e / sum.
        mode = self._softmax_mode(ins)
        ms = mode is not None
        sum_ct = "f32" if ms else "f64"

        def build_sum(outer_vars):
            natural = self._natural(xt.shape, (axis,), kept, outer_vars, True)

            def e_eval(idx):
                d = self.op("f32", "sub_rounded", x_eval_f32(idx), self._mat_value(f"max{out}", natural))
                e = self._softmax_exp(mode, d)
                if keep_e:
                    self.code.append(Store(out_bufs[0].name, out_bufs[0].address(idx), e))
                return e if ms else self.op("f64", "cast", e, src="f32", dst="f64")

            step, acc = self._reduction_step(e_eval, xt.shape, (axis,), outer_vars, "sum", sum_ct)
            if ms:
                step.order = "ms8" if mode == "last" else "seq"
            if ins.op == "softmax":
                if not ms:
                    s = self.op("f32", "cast", acc, src="f64", dst="f32")
                elif mode == "f16":
                    s = self._r16(acc)
                elif mode == "last":
                    s = self.op("f32", "div_plain", self.const(1.0, "f32"), acc)
                else:
                    s = acc
                self._materialise(f"sum{out}", "f32", None, natural, s, stat_shape)
            else:
                s = self.op("f32", "cast", self.op("f64", "log_scalar", acc), src="f64", dst="f32")
                self._materialise(f"logsum{out}", "f32", None, natural, s, stat_shape)
            step.post = self.code
            return step

        def build_scale(outer_vars):
            natural = self._natural(xt.shape, (axis,), kept, outer_vars, True)
            var = self.fresh(f"j{axis}_")
            idx = [ZERO] * xt.rank
            for a, v in zip(kept, outer_vars):
                idx[a] = ("v", v)
            idx[axis] = ("v", var)
            idx = tuple(idx)
            e = self.load(out_bufs[0], idx)
            r = self._softmax_scale(mode, e, self._mat_value(f"sum{out}", natural))
            if _mindspore_softmax_rule(xt, axis):
                r = self.op("f32", "softmax_fix", r, x_eval_f32(idx), self._mat_value(f"max{out}", natural))
            for b in out_bufs:
                self.code.append(Store(b.name, b.address(idx), r))
            # Materialised: later readers load it (in a later nest: the sentinel index never matches
            # this nest's loop variables, whose scope ends with this step).
            self.mats[out] = _Mat(out_bufs[0].name, "f32", self.nest_id, r, ("<scaled>",))
            return Step([(var, ix_dim(xt.shape[axis]))], self.code)

        self._try_nest(outer_sizes, build_max)
        # The sum pass needs the max at its own outer point: same nest whenever the max's is current.
        self._try_nest(outer_sizes, build_sum)
        if keep_e:
            self._try_nest(outer_sizes, build_scale)

    def _ln_eager(self, ydt: str) -> bool:
        """layer_norm's y follows MindSpore CPU's float32/float16 steps (eager_math), else it is
        computed from the float64 statistics and rounded once."""
        return self.eager_math and ydt in ("f32", "f16")

    def _lower_layer_norm(self, ins) -> None:
        x = int(ins.args[0])
        xt = self.types[x]
        y, mean_r, var_r = ins.outs
        if self.types[y].dtype == "f64":
            raise CodegenError("layer_norm on f64 is not supported")
        bna = ins.attrs["begin_norm_axis"] % xt.rank
        axes = tuple(range(bna, xt.rank))
        kept = [a for a in range(bna) if xt.shape[a] != 1]
        outer_sizes = [ix_dim(xt.shape[a]) for a in kept]
        stat_shape = tuple(self.types[mean_r].shape)
        eps = float(ins.attrs["eps"])
        n = ONE
        for a in axes:
            n = ix_mul(n, ix_dim(xt.shape[a]))
        dt = self.types[mean_r].dtype

        def x_eval(idx):
            return self.op("f64", "cast", self.convert(self.value(x, idx), xt.dtype, "f32"), src="f32", dst="f64")

        def build(outer_vars):
            natural = self._natural(xt.shape, axes, kept, outer_vars, True)
            s1, acc1 = self._reduction_step(x_eval, xt.shape, axes, outer_vars, "sum", "f64")
            nf = self.op("f64", "cast", self._size_var(n), src="i64", dst="f64")
            mean_d = self.op("f64", "div_plain", acc1, nf)
            mean_f = self.rounded(self.op("f32", "cast", mean_d, src="f64", dst="f32"), dt)
            self._materialise(mean_r, dt, self.out_buf.get(mean_r), natural, mean_f)
            self._materialise(f"lnmean{y}", "f32", None, natural, mean_f, stat_shape)
            s1.post = self.code
            self.code = []

            def dev_eval(idx):
                d = self.op("f64", "sub", x_eval(idx), mean_d)
                return self.op("f64", "mul", d, d)

            s2, acc2 = self._reduction_step(dev_eval, xt.shape, axes, outer_vars, "sum", "f64")
            var_d = self.op("f64", "div_plain", acc2, nf)
            var_f = self.rounded(self.op("f32", "cast", var_d, src="f64", dst="f32"), dt)
            self._materialise(var_r, dt, self.out_buf.get(var_r), natural, var_f)
            if self._ln_eager(self.types[y].dtype):
                sd = self.op("f32", "sqrt", self.op("f32", "add", var_f, self.const(eps, "f32")))
                self._materialise(f"lnsd{y}", "f32", None, natural, sd, stat_shape)
            else:
                rstd = self.op("f64", "rsqrt_scalar", self.op("f64", "add", var_d, self.const(eps, "f64")))
                rstd_f = self.op("f32", "cast", rstd, src="f64", dst="f32")
                self._materialise(f"lnrstd{y}", "f32", None, natural, rstd_f, stat_shape)
            s2.post = self.code
            return [s1, s2]

        def build_both(outer_vars):
            steps = build(outer_vars)
            # Two steps from one build: append the first here, return the second.
            self.nests[self.nest_id].steps.append(steps[0])
            return steps[1]

        self._try_nest(outer_sizes, build_both)

    def _lower_stores(self, regs: list) -> None:
        """Map steps storing the lazy outputs `regs` (all of one shape)."""
        shape = tuple(self.types[regs[0]].shape)
        axes = [a for a in range(len(shape)) if shape[a] != 1]
        sizes = [ix_dim(shape[a]) for a in axes]

        def build_with(n_outer):
            def build(outer_vars):
                inner = [(self.fresh(f"j{a}_"), s) for a, s in zip(axes[n_outer:], sizes[n_outer:])]
                idx = [ZERO] * len(shape)
                for a, v in zip(axes, list(outer_vars) + [v for v, _ in inner]):
                    idx[a] = ("v", v)
                for r in regs:
                    v = self.value(r, tuple(idx))
                    for buf in self.out_bufs[r]:
                        self.code.append(Store(buf.name, buf.address(tuple(idx)), v))
                return Step(inner, self.code)
            return build

        # Join the first nest whose outer sizes prefix ours and that holds every statistic we read.
        for nid, nest in enumerate(self.nests):
            k = len(nest.outer)
            if k <= len(sizes) and [s for _, s in nest.outer] == sizes[:k] and self._deps_ready(regs, nid):
                if self._attempt(nid, build_with(k)):
                    return
        n_outer = max(len(sizes) - 1, 0)
        self.nests.append(Nest([(f"o{len(self.nests)}_{k}", s) for k, s in enumerate(sizes[:n_outer])]))
        if not self._attempt(len(self.nests) - 1, build_with(n_outer)):
            raise CodegenError("internal: store step does not fit a fresh nest")

    def _deps_ready(self, regs, nid: int) -> bool:
        return all(m.nest <= nid for m in self.mats.values())

    # --- driver ---------------------------------------------------------------------------------
    def run(self) -> KernelSpec:
        fn = self.fn
        for ins in fn.body:
            op = ins.op
            if op in _VIEW_OPS or op in opcodes.ELEMENTWISE or op == "fill":
                continue
            if op in _REDUCE_OPS:
                self._lower_reduce(ins)
            elif op in ("softmax", "log_softmax"):
                self._lower_softmax(ins)
            elif op == "layer_norm":
                self._lower_layer_norm(ins)
            else:
                grp = opcodes.OPS[op].group.value if op in opcodes.OPS else "unknown"
                raise CodegenError(f"op {op} ({grp}) is not supported by the C backend")
        lazy = [r for r in dict.fromkeys(fn.outputs) if r not in self.mats]
        by_shape: dict = {}
        for r in lazy:
            by_shape.setdefault(tuple(self.types[r].shape), []).append(r)
        for regs in by_shape.values():
            self._lower_stores(regs)
        self._drop_unused_temps()
        return KernelSpec(self.name, self.buffers, self.syms, self.nests, list(fn.params), list(fn.outputs))

    def _drop_unused_temps(self) -> None:
        loaded = set()
        for nest in self.nests:
            for step in nest.steps:
                for st in step.pre + step.body + step.post:
                    if isinstance(st, Let) and isinstance(st.expr, Load):
                        loaded.add(st.expr.buf)
        dead = {b.name for b in self.buffers if b.role == "tmp" and b.name not in loaded}
        for nest in self.nests:
            for step in nest.steps:
                step.post = [s for s in step.post if not (isinstance(s, Store) and s.buf in dead)]
        self.buffers = [b for b in self.buffers if b.name not in dead]


def _smaller(a, b):
    """True if the running product `a` must grow (a < b), False if `b` must, None if unknown."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    if isinstance(a, int):  # int vs Sym: grow the int side
        return True
    if isinstance(b, int):
        return False
    # Two monomials: grow the one whose names are a sub-multiset of the other's (the coefficients
    # decide between equal name sets).
    ra, rb = list(a.names), list(b.names)
    if sorted(ra) == sorted(rb):
        return a.coeff < b.coeff
    if all(ra.count(n) <= rb.count(n) for n in ra):
        return True
    if all(rb.count(n) <= ra.count(n) for n in rb):
        return False
    return None


def _mindspore_softmax_rule(xt, axis: int) -> bool:
    """MindSpore CPU's float32 softmax along the last axis treats rows holding NaN, +inf or only -inf
    its own way (see `runtime.interpreter`'s softmax; log_softmax has its rule in every dtype and
    along every axis); other dtypes and axes are IEEE."""
    return xt.dtype == "f32" and axis == xt.rank - 1


def _softmax_axis(axis, rank: int) -> int:
    if isinstance(axis, (tuple, list)):
        (axis,) = axis
    return axis % rank


def lower(fn, name: str = "dvm_kernel", eager_math: bool = True) -> KernelSpec:
    """The kernel spec of fusion group `fn`; raises CodegenError when it cannot be compiled.
    `eager_math`: float32 softmax computed as MindSpore CPU computes it (see `_lower_softmax`)."""
    for ins in fn.body:
        if ins.op not in opcodes.OPS:
            raise CodegenError(f"unknown op {ins.op}")
    try:
        return _Lower(fn, name, eager_math).run()
    except CodegenError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        raise CodegenError(f"cannot lower group: {type(e).__name__}: {e}") from e


__all__ = ["Acc", "Buffer", "CodegenError", "Const", "KernelSpec", "Let", "Load", "Nest", "Op", "Step",
           "Store", "ctype_of", "ix_split", "ix_vars", "lower"]
