"""Compiled elementwise kernels for replayed programs, one per (op, attributes, dtypes), any size.

NumPy has no erf, gelu or mish: the reference interpreter computes them element by element in
Python where no ufunc exists (erf: about 130 ms for 130,000 elements). A region plan runs such an
op through a kernel of the C backend instead (`codegen.kernel.compile_group`, the same code and
numerics tier 1 fuses with: tested against the interpreter): a one-instruction IR function over
operands flattened to one symbolic dim `f32[N]`, so one kernel serves every shape whose tensor
operands all have the shape of the result. Kernels are cached in memory and on disk (the kernel
cache); a compile failure (no gcc, an op the backend does not render) is remembered and the op stays
with the interpreter.
"""

from __future__ import annotations

import threading

import numpy as np

from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType

# Elementwise ops whose interpreter implementation is slow (no NumPy ufunc).
SLOW_ELEMENTWISE = frozenset(("erf", "erfc", "gelu", "gelu_grad", "mish", "softplus", "silu", "silu_grad",
                              "sigmoid", "sigmoid_grad", "tanh_grad", "elu", "elu_grad", "log1p", "expm1",
                              "hardswish", "hardsigmoid"))
# Ops MindSpore computes with the C library (float32 erf is glibc's erff): their kernels are
# compiled with strict_ieee (scalar libm), bit-equal to eager. A vectorised erf 1 ulp off would
# show in the erf-form GELU, x * (1 + erf(x / sqrt 2)) / 2, where 1 + erf cancels for x < -5.
# float32 erf runs `jit/libm.py`'s erf instead: erff's own formula, vectorised where it is plain
# arithmetic, checked against the C library when it loads.
LIBM = frozenset(("erf", "erfc"))
_N = Sym.of("N")
_kernels: dict = {}
_lock = threading.Lock()
compiles = 0  # kernels built (or loaded from the disk cache) in this process


def _attr_key(attrs: dict):
    return tuple(sorted((k, repr(v)) for k, v in attrs.items()))


def flat_kernel(op: str, attrs: dict, in_dtypes: tuple, out_dtype: str, imms: tuple = ()):
    """A callable `f(arrays) -> array` computing `op` on equally shaped operands, or None.
    `imms`: (position, value) of immediate operands, baked into the kernel."""
    key = (op, _attr_key(attrs), in_dtypes, out_dtype, imms)
    k = _kernels.get(key, False)
    if k is not False:
        return k
    with _lock:
        k = _kernels.get(key, False)
        if k is False:
            k = _kernels[key] = _build(op, attrs, in_dtypes, out_dtype, imms)
    return k


def _build(op, attrs, in_dtypes, out_dtype, imms):
    global compiles
    if op == "erf" and in_dtypes == ("f32",) and out_dtype == "f32" and not imms:
        k = _vector_erf()  # (erff's bits, vectorised where erff is plain arithmetic: jit/libm.py)
        if k is not None:
            return k
    from ms_dynvm.codegen.kernel import compile_group
    from ms_dynvm.ir.function import Function

    n_in = len(in_dtypes)
    args, it = [], iter(range(n_in))
    imm = dict(imms)
    for pos in range(n_in + len(imms)):
        args.append(imm[pos] if pos in imm else Reg(next(it)))
    types = {i: TensorType(dt, (_N,)) for i, dt in enumerate(in_dtypes)}
    types[n_in] = TensorType(out_dtype, (_N,))
    fn = Function("flat", list(range(n_in)), [Instr(op, tuple(args), dict(attrs), (n_in,))], [n_in], types)
    try:
        kern = compile_group(fn, strict_ieee=op in LIBM)
    except Exception:  # noqa: BLE001 - any failure: the op stays with the interpreter
        return None
    compiles += 1

    launches: dict = {}

    def launch(m):
        go = launches.get(m)
        if go is None:
            go = launches[m] = kern.prepare([(m,)] * n_in, [(1,)] * n_in, [(m,)])
        return go

    out_dt = np.dtype(kern._np_out[0])
    heavy = op in PARALLEL

    def run(arrays, out=None):
        shape = arrays[0].shape
        flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
        n = flat[0].shape[0]
        if n < 2:  # (a symbol never stands for 0 or 1: pad to two elements)
            flat = [np.concatenate([f, np.zeros(2 - n, f.dtype)]) for f in flat]
            return kern(flat)[0][:n].reshape(shape)
        if out is None or out.shape != shape or out.dtype != out_dt or not out.flags.c_contiguous:
            out = np.empty(shape, out_dt)
        ptrs = [f.ctypes.data for f in flat] + [out.ctypes.data]
        if heavy and n >= PAR_MIN and _helper() is not None:
            _helper().run(n, [f.itemsize for f in flat] + [out_dt.itemsize], ptrs, launch)
        else:
            launch(n)(ptrs)
        return out

    return run


def _vector_erf():
    from ms_dynvm.jit import libm

    fn = libm.erf_f32()
    if fn is None:
        return None
    f32 = np.dtype(np.float32)

    def launch(m):
        return lambda ptrs: fn(ptrs[0], ptrs[1], m)

    def run(arrays, out=None):
        x = np.ascontiguousarray(arrays[0], dtype=f32)
        if out is None or out.shape != x.shape or out.dtype != f32 or not out.flags.c_contiguous:
            out = np.empty(x.shape, f32)
        n = x.size
        if n >= PAR_MIN and _helper() is not None:
            _helper().run(n, [4, 4], [x.ctypes.data, out.ctypes.data], launch)
        else:
            fn(x.ctypes.data, out.ctypes.data, n)
        return out

    return run


# --- two threads for the C library's scalar functions ----------------------------------------------
# erf/erfc run the C library's scalar erff/erfc (bit-equal to eager): ~20 ns an element, the largest
# step of a replayed attention block. The flat kernel runs over chunks of CHUNK elements that the
# calling thread and one helper thread take in turn (a shared counter; ctypes releases the GIL during
# each chunk), so a helper that is late (a busy core) costs at most the chunk it holds. Elementwise:
# the bits do not depend on the split. On by default only above two cores, as tier 1's kernel
# threads (`jit.launch.set_kernel_threads`): on this project's 2-core Xeon the erf alone ran 1.7x
# faster on two threads, but a replayed attention block at (8, 64) was no faster (3.10 against
# 3.01 ms: MindSpore's worker threads hold the second core). DYNVM_REPLAY_THREADS=2 turns it on,
# =1 off.
PARALLEL = LIBM
CHUNK = 8192
PAR_MIN = 3 * CHUNK
_HELPER: list = []


class _Helper:
    def __init__(self) -> None:
        import os
        import queue

        self.pid = os.getpid()  # (a forked child has no helper thread: it starts its own)
        self.busy = threading.Lock()  # one parallel loop at a time (else the caller runs it alone)
        self.jobs = queue.SimpleQueue()
        self.done = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="dvm-replay-helper").start()

    def _loop(self) -> None:
        while True:
            work = self.jobs.get()
            try:
                work()
            finally:
                self.done.put(None)

    def run(self, n: int, itemsizes: list, ptrs: list, launch) -> None:
        import itertools

        nch = max(1, n // CHUNK)  # (the last chunk takes the rest: CHUNK to 2 CHUNK - 1 elements, never 1)
        nxt = itertools.count()  # (next() is atomic under the GIL)
        full = launch(CHUNK)
        tail = launch(n - (nch - 1) * CHUNK)

        def work():
            while True:
                c = next(nxt)
                if c >= nch:
                    return
                lo = c * CHUNK
                (tail if c == nch - 1 else full)([p + lo * sz for p, sz in zip(ptrs, itemsizes)])

        if not self.busy.acquire(blocking=False):
            work()
            return
        try:
            self.jobs.put(work)
            work()
            self.done.get()
        finally:
            self.busy.release()


def _helper():
    import os

    if not _HELPER or (_HELPER[0] is not None and _HELPER[0].pid != os.getpid()):
        want = os.environ.get("DYNVM_REPLAY_THREADS", "")
        on = want == "2" or (want != "1" and (os.cpu_count() or 1) > 2)
        _HELPER[:] = [_Helper() if on else None]
    return _HELPER[0]
