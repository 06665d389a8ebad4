"""A region's program, planned once and run as one call (tier 2; see frontend/regions.py).

`RegionPlan.build(program, inputs, outputs, extra)` takes a recorded bytecode Program and turns it
into a flat list of steps over a register file:
- dead instructions (nothing a region output depends on) are dropped;
- every instruction is bound once to the function that computes it: a NumPy fast path where the
  operation is a plain array operation on operands of the result dtype (matmul, the float32
  arithmetic, views, sums, ...), else the reference interpreter's implementation (which defines the
  VM's semantics), so no op is ever guessed;
- `extra` instructions (the backward rules of kernels MindSpore runs without dispatching them,
  placed by the frontend where the recording shows their results) are spliced in after the last
  register they read.
`run(arrays)` then executes the steps with NumPy's error state set once, and returns the output
arrays, each an array the caller may hand out (never a view of an input, of a parameter or of
another output).

Steady state (see docs/regions.md, "Steady-state costs"): steps that compute a temporary of static
shape keep their result buffer from run to run (`_fresh`: reused only where nothing but the plan
refers to it, so an array the caller still holds is never written again); batched matmuls run one C
loop over oneDNN's GEMM (`jit/gemm.py`); from the first run, chains of elementwise steps and
LayerNorms are compiled into fused C kernels on the background compile thread (`jit/fusion.py`) and
swapped in (`unfused_steps` keeps the original list; `fuse_now()` compiles in the caller).

The plan is specialised to the shapes it was recorded with; the frontend keys plans by input
signature and guards them. This module does not import MindSpore.
"""

from __future__ import annotations

import sys

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.jit import builtins as _builtins
from ms_dynvm.jit import fusion as _fusion
from ms_dynvm.jit import gemm as _gemm
from ms_dynvm.jit import kernels as _kernels
from ms_dynvm.runtime import interpreter as _interp

F32 = np.dtype(np.float32)


class NotReplayable(Exception):
    """The program cannot be planned as a region (the message is the reason, counted)."""


# --- fast paths: (args, attrs) -> array, used only where the operand dtypes equal the result's ---
def _matmul(a, attrs):
    return _gemm.matmul(a[0], a[1], bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b")))


def _axes_of(axis, rank):
    if axis is None or axis == ():
        return None
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(ax % rank if rank else 0 for ax in axis)


def _sum(a, attrs):
    x = a[0]
    return np.sum(x, axis=_axes_of(attrs.get("axis"), x.ndim), keepdims=bool(attrs.get("keepdims")))


def _mean(a, attrs):
    x = a[0]
    return np.mean(x, axis=_axes_of(attrs.get("axis"), x.ndim), keepdims=bool(attrs.get("keepdims")))


def _bias_add(a, attrs):
    x, b = a[0], a[1]
    axis = attrs.get("axis", 1) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return x + b.reshape(shape)


def _transpose(a, attrs):
    return np.transpose(a[0], attrs["perm"])


def _reshape(a, attrs):
    return np.reshape(a[0], attrs["shape"])


# (A masked select, np.where(m, a, 0), costs ~6 ns an element in NumPy 1.26; the forms below ~1,
# with the same bits: +0.0 where not kept, relu(nan) = 0 as MindSpore.)
def _relu_grad(a, attrs):
    dy, y = a[0], a[1]
    if dy.shape != y.shape or dy.ndim == 0:
        return np.where(y > 0, dy, np.zeros((), dy.dtype))
    u = np.dtype(f"u{dy.itemsize}")
    keep = np.negative((y > 0).astype(u))  # all bits set where y > 0
    return np.bitwise_and(np.ascontiguousarray(dy).view(u), keep).view(dy.dtype)


def _relu(a, attrs):
    out = np.fmax(a[0], np.zeros((), a[0].dtype))  # (fmax(nan, 0) = 0)
    out += 0  # -0.0 -> +0.0
    return out


def _tile(a, attrs):
    return np.tile(a[0], attrs["multiples"])


def _axis1(attrs):
    ax = attrs.get("axis", -1)
    return ax[0] if isinstance(ax, (tuple, list)) else ax


def _softmax(a, attrs):
    x = a[0]
    ax = _axis1(attrs)
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    return e / np.sum(e, axis=ax, keepdims=True)


def _softmax_grad(a, attrs):
    y, dy = a[0], a[1]
    return y * (dy - np.sum(dy * y, axis=_axis1(attrs), keepdims=True))


def _pow(a, attrs):
    x, e = a[0], a[1]
    ev = float(e) if type(e) is not np.ndarray or e.ndim == 0 else None
    if ev == 2.0:
        return x * x
    if ev == 1.0:
        return x.copy()
    return np.power(x, e if type(e) is np.ndarray else x.dtype.type(e))


def _segment_sum(a, attrs):
    return _builtins.segment_sum(a[0], a[1], attrs["num_segments"])


def _binary(ufunc):
    def run(a, attrs):
        return ufunc(a[0], a[1])
    run.__name__ = ufunc.__name__
    run.ufunc = ufunc
    return run


def _unary(ufunc):
    def run(a, attrs):
        return ufunc(a[0])
    run.__name__ = ufunc.__name__
    run.ufunc = ufunc
    return run


# Ops whose fast path equals the interpreter's result where every tensor operand and the result
# have one float dtype (float32 or float64) and every immediate is a Python float or int (NumPy
# keeps the array's dtype for a Python scalar). Reductions and matmul may add in another order
# than MindSpore's kernels (last bits; rtol 1e-5 holds).
_FAST = {
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul": _binary(np.multiply),
    "div": _binary(np.divide), "maximum": _binary(np.maximum), "minimum": _binary(np.minimum),
    "neg": _unary(np.negative), "exp": _unary(np.exp), "sqrt": _unary(np.sqrt),
    "square": _unary(np.square), "abs": _unary(np.abs),
    "matmul": _matmul, "sum": _sum, "mean": _mean, "bias_add": _bias_add, "relu": _relu,
    "relu_grad": _relu_grad, "transpose": _transpose, "reshape": _reshape, "tile": _tile,
    "softmax": _softmax, "softmax_grad": _softmax_grad, "pow": _pow,
    "unsorted_segment_sum": _segment_sum,
}
# An operand's buffer is written only where the array owns its memory and nothing but the plan's
# register file, the step's argument list and this frame refers to it: a view of it (a reshape
# result still live) holds a reference to it, which this count sees.
_OWN_REFS = 4  # vals[r], the argument list, the local `x`, getrefcount's own argument


def _reusable(x) -> bool:
    return (type(x) is np.ndarray and x.base is None and x.flags.writeable and x.flags.c_contiguous
            and sys.getrefcount(x) <= _OWN_REFS + 1)  # (+1: the call of _reusable holds it too)


def _inplace_binary(ufunc):
    def run(a, attrs):
        x = a[0]
        if _reusable(x):
            return ufunc(x, a[1], out=x)
        return ufunc(x, a[1])
    run.__name__ = ufunc.__name__ + "_"
    run.ufunc = ufunc
    return run


def _inplace_unary(ufunc):
    def run(a, attrs):
        x = a[0]
        if _reusable(x):
            return ufunc(x, out=x)
        return ufunc(x)
    run.__name__ = ufunc.__name__ + "_"
    run.ufunc = ufunc
    return run


def _bias_add_(a, attrs):
    x, b = a[0], a[1]
    axis = attrs.get("axis", 1) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    if _reusable(x):
        return np.add(x, b.reshape(shape), out=x)
    return x + b.reshape(shape)


_INPLACE = {
    "bias_add": _bias_add_,
    "add": _inplace_binary(np.add), "sub": _inplace_binary(np.subtract), "mul": _inplace_binary(np.multiply),
    "div": _inplace_binary(np.divide), "maximum": _inplace_binary(np.maximum),
    "minimum": _inplace_binary(np.minimum), "neg": _inplace_unary(np.negative), "exp": _inplace_unary(np.exp),
    "sqrt": _inplace_unary(np.sqrt), "square": _inplace_unary(np.square), "abs": _inplace_unary(np.abs),
}
# --- step buffers kept across runs (`RegionPlan.build`, "Memory reuse") ---------------------------
# A fresh NumPy array of a few hundred KiB is mmap'ed or taken from a trimmed heap top by glibc's
# malloc: its first writes page-fault (the attention block at (8, 64) took ~1,300 minor faults per
# replay, ~2 ms of ~7). A step that computes a temporary of static shape writes it into a buffer
# the step keeps (its holder, a one-element list) from run to run. The buffer is reused only where
# nothing but the holder refers to it (its reference count: a result handed out as a tensor, or a
# view of it, holds it), else the step allocates a new one: results the caller holds never change.
MAX_BUFFER_BYTES = 1 << 26  # per step; larger results are allocated per run
MAX_PLAN_BUFFER_BYTES = 1 << 27  # per plan
MAX_TOTAL_BUFFER_BYTES = 1 << 29  # all live plans of the process (a plan's share returns when it goes)
_total_bytes = [0]


def _release(n: int) -> None:
    _total_bytes[0] -= n


def _fresh(h, shape, dt):
    buf = h[0]
    if buf is None or sys.getrefcount(buf) > _FRESH_REFS:
        buf = h[0] = np.empty(shape, dt)
    return buf


def _fresh_refs() -> int:
    """The reference count `_fresh` sees for a buffer nothing else refers to (the holder, `buf`,
    getrefcount's argument: 3 on CPython 3.11), measured the way `_fresh` measures it."""
    h = [np.empty(1)]
    buf = h[0]
    return sys.getrefcount(buf)


_FRESH_REFS = _fresh_refs()


def _held(x, hs) -> bool:
    """`x` is the buffer of one of holders `hs` and only the plan refers to it (see _reusable: +1
    for the holder, +1 for this call)."""
    return sys.getrefcount(x) <= _OWN_REFS + 2 and any(h[0] is x for h in hs)


def _buffered(op, fn, h, shape, dt, hs):
    """Step function `fn` writing into the buffer of holder `h`; `hs`: the holders whose buffer an
    in-place step's first operand may be (it writes there where only the plan refers to it). None
    where `fn` has no buffered form."""
    uf = getattr(fn, "ufunc", None)
    if fn is _matmul:
        layouts: dict = {}  # (strides of a, of b) -> gemm.prepare2d's arguments, or None
        ptrs = _gemm.new_ptrs()  # (the operands' and the buffer's data pointers: gemm.run2d)

        def run(a, attrs):
            x, y = a[0], a[1]
            key = (x.strides, y.strides)
            p = layouts.get(key, False)
            if p is False:
                p = layouts[key] = _gemm.prepare2d(x, y, bool(attrs.get("transpose_a")),
                                                   bool(attrs.get("transpose_b")))
            if p is not None:
                return _gemm.run2d(p, x, y, _fresh(h, shape, dt), ptrs)
            return _gemm.matmul(x, y, bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b")),
                                _fresh(h, shape, dt))
    elif uf is not None and fn in _INPLACE_FNS:
        if uf.nin == 2:
            def run(a, attrs):
                x = a[0]
                if _reusable(x) or _held(x, hs):
                    return uf(x, a[1], out=x)
                return uf(x, a[1], out=_fresh(h, shape, dt))
        else:
            def run(a, attrs):
                x = a[0]
                if _reusable(x) or _held(x, hs):
                    return uf(x, out=x)
                return uf(x, out=_fresh(h, shape, dt))
    elif uf is not None:
        if uf.nin == 2:
            def run(a, attrs):
                return uf(a[0], a[1], out=_fresh(h, shape, dt))
        else:
            def run(a, attrs):
                return uf(a[0], out=_fresh(h, shape, dt))
    elif fn is _bias_add or fn is _bias_add_:
        inplace = fn is _bias_add_

        def run(a, attrs):
            x, b = a[0], a[1]
            axis = attrs.get("axis", 1) % x.ndim
            bs = [1] * x.ndim
            bs[axis] = b.shape[0]
            if inplace and (_reusable(x) or _held(x, hs)):
                return np.add(x, b.reshape(bs), out=x)
            return np.add(x, b.reshape(bs), out=_fresh(h, shape, dt))
    elif getattr(fn, "flat", None) is not None:  # a flat C kernel (`_compiled`)
        k = fn.flat

        def run(a, attrs):
            return k([x for x in a if isinstance(x, np.ndarray)], _fresh(h, shape, dt))
        run.__name__ = fn.__name__
        run.inplace = False
        return run
    elif fn is _softmax:
        def run(a, attrs):
            x = a[0]
            ax = _axis1(attrs)
            e = np.subtract(x, np.max(x, axis=ax, keepdims=True), out=_fresh(h, shape, dt))
            np.exp(e, out=e)
            return np.divide(e, np.sum(e, axis=ax, keepdims=True), out=e)
    else:
        return None
    run.__name__ = fn.__name__
    run.how = "numpy"
    run.inplace = fn in _INPLACE_FNS
    return run


_INPLACE_FNS = frozenset(_INPLACE.values())
_FLOATS = frozenset(("f32", "f64"))
# Ops the fast path may run on any dtype (they move or pick elements, no arithmetic).
_ANY_DTYPE = frozenset(("reshape", "transpose", "tile"))


class _Step:
    __slots__ = ("fn", "args", "regmask", "attrs", "outs", "dts", "op")

    def __init__(self, op, fn, args, regmask, attrs, outs, dts) -> None:
        self.op, self.fn, self.args, self.regmask, self.attrs, self.outs, self.dts = \
            op, fn, args, regmask, attrs, outs, dts


def _fast_ok(ins, types) -> bool:
    op = ins.op
    if op not in _FAST or len(ins.outs) != 1:
        return False
    if op == "unsorted_segment_sum":
        return _segment_ok(ins, types)
    want = types[ins.outs[0]].dtype
    if op in _ANY_DTYPE:
        return types[int(ins.args[0])].dtype == want
    if want not in _FLOATS:
        return False
    for a in ins.args:
        if isinstance(a, Reg):
            if types[int(a)].dtype != want:
                return False
        elif type(a) not in (float, int):
            return False
    if op in ("sum", "mean") and ins.attrs.get("dtype") not in (None, want):
        return False
    return True


def _segment_ok(ins, types) -> bool:
    """unsorted_segment_sum of float32 rows by 1-d int32/int64 ids, where the builtin exists."""
    x, ids = (int(a) for a in ins.args[:2])
    return (types[x].dtype == "f32" and types[ids].dtype in ("i32", "i64") and len(types[ids].shape) == 1
            and _builtins.available())


def _opaque(ins, handler):
    """A step running opaque op `ins` through `handler` (MindSpore, one dispatch)."""
    def run(args, attrs, ins=ins):
        res = handler(ins, args)
        return tuple(res) if len(ins.outs) != 1 else res[0]
    run.__name__ = f"call[{ins.attrs.get('target')}]"
    return run


def _compiled(ins, attrs, types):
    """A compiled flat kernel for a slow elementwise op whose tensor operands all have the result's
    (static) shape, or None (`jit/kernels.py`)."""
    if ins.op not in _kernels.SLOW_ELEMENTWISE or len(ins.outs) != 1:
        return None
    from ms_dynvm.passes.fuse import fusible  # (the one rule: does this fuse, on the C backend)

    if not fusible(ins, types):
        return None
    shape = tuple(types[ins.outs[0]].shape)
    regs = [int(a) for a in ins.args if isinstance(a, Reg)]
    if not regs or any(tuple(types[r].shape) != shape for r in regs) or \
            not all(type(d) is int for d in shape):
        return None
    imms = tuple((i, a) for i, a in enumerate(ins.args) if not isinstance(a, Reg))
    k = _kernels.flat_kernel(ins.op, attrs, tuple(types[r].dtype for r in regs), types[ins.outs[0]].dtype, imms)
    if k is None:
        return None

    def run(args, attrs, k=k):
        return k([a for a in args if isinstance(a, np.ndarray)])
    run.__name__ = f"kernel[{ins.op}]"
    run.flat = k
    return run


def _optimized(program, instrs: list, inputs: list, outputs: list) -> list:
    """The region's instructions through the pass pipeline once (`passes.pipeline.run_pipeline`:
    dce, cse, simplify, fold, dce; not to a fixpoint, which compares whole functions by their text,
    for little more) as one IR Function; the instructions as they were where the pipeline cannot
    take them (counted in `region_pipeline_skipped`). Returns (instructions, output registers)."""
    from ms_dynvm.ir.function import Function
    from ms_dynvm.metrics import METRICS
    from ms_dynvm.passes.pipeline import run_pipeline

    params = [int(r) for r in inputs] + [int(r) for r in program.consts]
    fn = Function("region", params, list(instrs), [int(r) for r in outputs], dict(program.types))
    try:
        out = run_pipeline(fn)
    except Exception as e:  # noqa: BLE001 - the unoptimised program is still right
        METRICS.region_pipeline_skipped[type(e).__name__] += 1
        return instrs, outputs
    program.types.update(out.types)
    # (outputs keep their positions; a rewrite may have renamed them, `x * 1` -> `x`)
    return list(out.body), [int(r) for r in out.outputs]


class RegionPlan:
    """A planned region: `run(arrays)` -> the arrays of `outputs` (see the module doc)."""

    def __init__(self, steps, in_regs, out_regs, consts, nregs, types) -> None:
        self.steps = steps
        self.in_regs = in_regs
        self.out_regs = out_regs
        self.consts = consts
        self.nregs = nregs
        self.out_dts = [dtypes.to_numpy(types[r].dtype) for r in out_regs]
        self._types = types
        self.n_out = len(out_regs)  # (the caller's outputs; registers past them it uses itself)
        self.opt_steps: list = []  # set by frontend/regions.py: optimizer steps run after the program
        self.n_fast = sum(1 for s in steps if s.fn in _FAST.values() or s.fn in _INPLACE.values()
                          or getattr(s.fn, "how", "") == "numpy")
        self.n_inplace = sum(1 for s in steps if s.fn in _INPLACE.values() or getattr(s.fn, "inplace", False))
        self.holders = None
        self.unfused_steps = steps
        self._fuse = None  # (keep, types): fusion not started; a Future while compiling; None: done
        self.fused: list = []  # the fused groups swapped in: (first step, end step, op names)

    def describe(self) -> dict:
        """How the steps run: op -> how many run by a NumPy fast path, a compiled kernel, the
        reference interpreter (a fused step: op "fused", how "fused")."""
        out: dict = {}
        fast = set(_FAST.values()) | set(_INPLACE.values())
        for s in self.steps:
            name = getattr(s.fn, "__name__", "")
            if s.fn in fast or getattr(s.fn, "how", "") == "numpy":
                how = "numpy"
            elif name.startswith("kernel["):
                how = "kernel"
            else:
                how = "fused" if name.startswith("fused[") else "interpreter"
            d = out.setdefault(s.op, {})
            d[how] = d.get(how, 0) + 1
        return out

    @classmethod
    def build(cls, program, inputs: list, outputs: list, extra: list = (), optimize: bool = True,
              call_handler=None, fuse: bool | None = None) -> "RegionPlan":
        """`inputs`: the registers the caller supplies arrays for, in order; `outputs`: the registers
        returned; `extra`: groups (lists) of Instr objects to splice in, each group contiguously
        (their result types in `program.types`); `call_handler(instr, arrays) -> arrays` runs the
        program's opaque `call`s (ops the VM does not model: one MindSpore dispatch each), else a
        program holding one is not plannable. `fuse`: whether chains of elementwise steps are
        compiled into fused kernels in the background from the first run (`jit/fusion.py`; default:
        unless the environment sets DYNVM_REPLAY_FUSE=0)."""
        types = program.types
        instrs = list(program.instrs())
        for ins in instrs:
            if ins.op == "call":
                if call_handler is None:
                    raise NotReplayable(f"opaque op {ins.attrs.get('target')}")
                continue
            if ins.op not in _interp.IMPLS:
                raise NotReplayable(f"no implementation of {ins.op}")
            if opcodes.opdef(ins.op).group == opcodes.Group.RANDOM:
                raise NotReplayable(f"random op {ins.op}")
        # Splice each group of extra instructions in, in order, after the definition of the last
        # register of the program that the group reads.
        pos = {r: i for i, ins in enumerate(instrs) for r in ins.outs}
        placed = []
        for k, group in enumerate(extra):
            own = {r for e in group for r in e.outs}
            at = max((pos.get(int(a), -1) for e in group for a in e.args
                      if isinstance(a, Reg) and int(a) not in own), default=-1)
            placed.append((at, k, group))
            for r in own:  # (a later group reading it goes after it: same place, later in order)
                pos.setdefault(r, at)
        new, it = [], iter(sorted(placed, key=lambda t: (t[0], t[1])))
        nxt = next(it, None)
        while nxt is not None and nxt[0] < 0:
            new.extend(nxt[2])
            nxt = next(it, None)
        for i, ins in enumerate(instrs):
            new.append(ins)
            while nxt is not None and nxt[0] == i:
                new.extend(nxt[2])
                nxt = next(it, None)
        instrs = new
        if optimize and not any(ins.op == "call" for ins in instrs):
            instrs, outputs = _optimized(program, instrs, inputs, outputs)
        # Dead code: keep what the outputs need.
        need = set(int(r) for r in outputs)
        keep = []
        for ins in reversed(instrs):
            if any(r in need for r in ins.outs):
                keep.append(ins)
                need.update(int(a) for a in ins.args if isinstance(a, Reg))
        keep.reverse()
        have = set(int(r) for r in inputs) | set(program.consts)
        for ins in keep:
            for a in ins.args:
                if isinstance(a, Reg) and int(a) not in have:
                    raise NotReplayable(f"{ins.op} reads %{int(a)}, which no input or op supplies")
            have.update(ins.outs)
        missing = [int(r) for r in outputs if int(r) not in have]
        if missing:
            raise NotReplayable(f"output %{missing[0]} is not computed")
        # Memory reuse: an elementwise step whose first operand is a temporary of the plan read for
        # the last time there, of the result's shape and dtype, writes its result into that
        # operand's buffer (`_inplace`; checked again at run time: the buffer must own its memory).
        last = {}
        for i, ins in enumerate(keep):
            for a in ins.args:
                if isinstance(a, Reg):
                    last[int(a)] = i
        ext = set(int(r) for r in inputs) | set(program.consts) | set(int(r) for r in outputs)
        steps = []
        # Step buffers kept across runs (see `_fresh`); not in plans with opaque calls (MindSpore
        # may hold on to what it is handed without a reference NumPy sees).
        arena = not any(ins.op == "call" for ins in keep)
        holders: dict = {}  # register -> the holders whose buffer may hold its value
        arena_bytes = 0
        for i, ins in enumerate(keep):
            if ins.op == "call":
                mask = tuple(isinstance(a, Reg) for a in ins.args)
                args = tuple(int(a) if m else a for a, m in zip(ins.args, mask))
                dts = tuple(dtypes.to_numpy(types[r].dtype) for r in ins.outs)
                steps.append(_Step("call", _opaque(ins, call_handler), args, mask, ins.attrs, tuple(ins.outs), dts))
                continue
            attrs = opcodes.full_attrs(ins.op, ins.attrs)
            fast = _fast_ok(ins, types)
            fn = _FAST[ins.op] if fast else _compiled(ins, attrs, types) or _interp.RAW_IMPLS[ins.op]
            if fast and ins.op in _INPLACE and isinstance(ins.args[0], Reg):
                a0 = int(ins.args[0])
                if a0 not in ext and last.get(a0) == i and types[a0] == types[ins.outs[0]] and \
                        all(int(a) != a0 for a in ins.args[1:] if isinstance(a, Reg)):
                    fn = _INPLACE[ins.op]
            mask = tuple(isinstance(a, Reg) for a in ins.args)
            args = tuple(int(a) if m else a for a, m in zip(ins.args, mask))
            dts = tuple(dtypes.to_numpy(types[r].dtype) for r in ins.outs)
            if arena and len(ins.outs) == 1:
                t = types[ins.outs[0]]
                shape = tuple(t.shape)
                nbytes = int(np.prod(shape, dtype=np.int64)) * dts[0].itemsize if \
                    all(type(d) is int for d in shape) else None
                if nbytes is not None and nbytes <= MAX_BUFFER_BYTES and arena_bytes + nbytes <= MAX_PLAN_BUFFER_BYTES \
                        and _total_bytes[0] + arena_bytes + nbytes <= MAX_TOTAL_BUFFER_BYTES:
                    h = [None]
                    hs = holders.get(int(ins.args[0]), ()) if fn in _INPLACE_FNS and mask[0] else ()
                    bfn = _buffered(ins.op, fn, h, shape, dts[0], hs)
                    if bfn is not None:
                        fn = bfn
                        arena_bytes += nbytes
                        holders[ins.outs[0]] = hs + (h,)
            steps.append(_Step(ins.op, fn, args, mask, attrs, tuple(ins.outs), dts))
        consts = {int(r): _interp._to_declared(c, types[r]) for r, c in program.consts.items()}
        nregs = 1 + max([int(r) for r in have] + [0])
        plan = cls(steps, [int(r) for r in inputs], [int(r) for r in outputs], consts, nregs, types)
        plan.holders = holders if arena else None
        plan.arena_bytes = arena_bytes
        if arena_bytes:
            import weakref

            _total_bytes[0] += arena_bytes
            weakref.finalize(plan, _release, arena_bytes)
        if _fusion.ENABLED if fuse is None else fuse:
            plan._types = dict(types)
            plan._fuse = (keep, plan._types)
        return plan

    # --- fused kernels (jit/fusion.py) -------------------------------------------------------------
    def _fuse_prepare(self, keep, types) -> list:
        """[(candidate, kernel | exception | None, (build, finish) | None)] for the plan's fusible
        groups, lowered and rendered in the caller's thread (`fusion.prepare_candidate`)."""
        items = []
        for cand in _fusion.candidates(keep, types, self.out_regs):
            try:
                k, todo = _fusion.prepare_candidate(cand.fn)
            except Exception as e:  # noqa: BLE001 - a group that cannot be rendered stays unfused
                k, todo = e, None
            items.append((cand, k, todo))
        return items

    @staticmethod
    def _fuse_build(items) -> list:
        """The GCC compiles (or disk cache loads) of `_fuse_prepare`'s items (any thread):
        [(candidate, kernel | exception | built library, finish | None)]."""
        out = []
        for cand, k, todo in items:
            if todo is None:
                out.append((cand, k, None))
                continue
            try:
                out.append((cand, todo[0](), todo[1]))
            except Exception as e:  # noqa: BLE001 - a group that cannot be built stays unfused
                out.append((cand, e, None))
        return out

    @staticmethod
    def _fuse_finish(built) -> list:
        done = []
        for cand, k, finish in built:
            if finish is not None:
                try:
                    k = finish(k)
                except Exception as e:  # noqa: BLE001
                    k = e
            done.append((cand, k))
        return done

    def _fuse_poll(self) -> None:
        f = self._fuse
        if type(f) is tuple:  # first run: prepare here; the kernels now if built, else compiled
            from ms_dynvm.jit.compile import compile_pool

            try:
                items = self._fuse_prepare(*f)
            except Exception as e:  # noqa: BLE001 - fusion is an optimisation: keep the plan unfused
                self._fuse = None
                _fusion.warn_failed(e)
                return
            if all(todo is None for _, _, todo in items):
                self._fuse = None
                self._install_fused([(c, k) for c, k, _ in items])
                return
            try:
                self._fuse = compile_pool().submit(self._fuse_build, items)
            except RuntimeError:  # (the pool is shut down: interpreter exit) the plan stays unfused
                self._fuse = None
            return
        if f.done():
            self._fuse = None
            try:
                built = f.result()
            except Exception as e:  # noqa: BLE001 - fusion is an optimisation: keep the plan unfused
                _fusion.warn_failed(e)
                return
            self._install_fused(self._fuse_finish(built))

    def fuse_now(self) -> "RegionPlan":
        """Compile and swap in the fused kernels now, in the caller (tests, benchmarks)."""
        f = self._fuse
        if f is None:
            return self
        self._fuse = None
        built = f.result() if type(f) is not tuple else self._fuse_build(self._fuse_prepare(*f))
        self._install_fused(self._fuse_finish(built))
        return self

    def _install_fused(self, done) -> None:
        types = self._types
        by_lo = {}
        for cand, k in done:
            if isinstance(k, Exception):
                _fusion.warn_failed(k)
                continue
            fn = _fusion.fused_step_fn(k, cand, types, self.holders)
            dts = tuple(dtypes.to_numpy(types[r].dtype) for r in cand.outs)
            by_lo[cand.lo] = (cand.hi, _Step("fused", fn, tuple(cand.params), (True,) * len(cand.params), {},
                                             tuple(cand.outs), dts))
        if not by_lo:
            return
        steps, i, base = [], 0, self.unfused_steps
        while i < len(base):
            if i in by_lo:
                hi, st = by_lo[i]
                steps.append(st)
                self.fused.append((i, hi, [s.op for s in base[i:hi]]))
                i = hi
            else:
                steps.append(base[i])
                i += 1
        self.steps = steps

    def run(self, arrays: list) -> list:
        if self._fuse is not None:
            self._fuse_poll()
        vals = [None] * self.nregs
        for r, a in zip(self.in_regs, arrays):
            vals[r] = a
        for r, c in self.consts.items():
            vals[r] = c
        with np.errstate(all="ignore"):
            for s in self.steps:
                args = [vals[a] if m else a for a, m in zip(s.args, s.regmask)]
                res = s.fn(args, s.attrs)
                if len(s.outs) == 1:
                    if type(res) is tuple:
                        res = res[0]
                    dt = s.dts[0]
                    if type(res) is not np.ndarray or res.dtype != dt:
                        res = np.asarray(res, dtype=dt) if dt != _interp.BOOL else np.asarray(res) != 0
                    vals[s.outs[0]] = res
                else:
                    for r, v, dt in zip(s.outs, res, s.dts):
                        vals[r] = np.asarray(v, dtype=dt)
        outs = []
        for r, dt in zip(self.out_regs, self.out_dts):
            v = vals[r]
            # A fresh, C-contiguous array of its own: never a view of an input, a parameter or
            # another output (the caller wraps it as a tensor the script may write into).
            outs.append(np.array(v, dtype=dt, order="C", copy=True) if v.base is not None or
                        r in self.in_regs or not v.flags.c_contiguous else v)
        return outs
