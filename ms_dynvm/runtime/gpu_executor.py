"""The GPU executor for bytecode programs: `GpuExecutor(program).run(inputs)` runs a Program on the
CUDA device with NumPy inputs and returns NumPy outputs (`ms_dynvm.run_program(..., device="cuda")`).

Structure (the region program shape: block Functions -> fusion groups -> one launch per group):
- Each block becomes an IR Function (`Function.from_block`), partitioned by `passes.fuse`.
- A fused group (elementwise, reduction or norm) is compiled by the CUDA backend once per shape
  family: its param dims of size >= 2 are made symbolic first (`passes.shapes.generalize`, dims of
  equal recorded size sharing a symbol), so one kernel serves every size; where a rule cannot be
  generalised, or the group's layout at run time contradicts the shared symbols, the group is
  compiled for its static shapes instead.
- Library ops: matmul through cuBLAS (`codegen/cuda/library.py`), gather/index_select and
  unsorted_segment_sum as kernels.
- Everything else (concat, split, tile, ops the CUDA backend does not compile, ...) runs on the host
  with the NumPy reference interpreter's `run_instr`: operands copied device -> host, results host ->
  device; each such op is counted in `stats()["host_ops"]` with its bytes copied.
- Device memory comes from the device pool; a register's buffer is released after its last use and
  reused after the safe point at the end of the run (a stream synchronisation).

Register types are re-inferred from the inputs' shapes (`ir.registry.infer`) once per input shape
signature, so a program recorded at one size runs at another.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.codegen.cuda import driver, library
from ms_dynvm.codegen.cuda.kernel import compile_group, to_device
from ms_dynvm.codegen.spec import CodegenError
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.fuse import fuse
from ms_dynvm.passes.shapes import GeneralizeError, generalize
from ms_dynvm.runtime.interpreter import run_instr

_TAKE_OPS = ("gather", "index_select")


def _generalised(fn: Function) -> Function | None:
    dyn = {}
    for p in fn.params:
        for axis, d in enumerate(fn.types[p].shape):
            if isinstance(d, int) and d >= 2:
                dyn[(p, axis)] = f"d{d}"
    if not dyn:
        return None
    try:
        return generalize(fn, dyn)
    except (GeneralizeError, registry.ShapeError, KeyError, ValueError):
        return None


class _Step:
    __slots__ = ("kind", "instrs", "group", "kernels", "last")

    def __init__(self, kind, instrs, group=None):
        self.kind = kind  # kernel | matmul | take | segsum | host
        self.instrs = instrs
        self.group = group
        self.kernels = []  # [the family's kernel, then static kernels for layouts it cannot serve]
        self.last = []


class GpuExecutor:
    def __init__(self, program, *, strict_ieee: bool = False, fast_math: bool = False, cache=None, pool=None):
        from ms_dynvm.runtime.device_pool import default_device_pool

        self.program = program
        self.opts = {"strict_ieee": strict_ieee, "fast_math": fast_math}
        self.cache = cache
        self.pool = pool or default_device_pool()
        self.counters = Counter()
        self.host_ops = Counter()
        self.steps: list[_Step] = []
        self._types: dict = {}
        self._consts: dict = {}
        for bi in range(len(program.blocks)):
            if not program.blocks[bi].instrs:
                continue
            fn = Function.from_block(program, bi)
            for g in fuse(fn):
                self.steps.append(self._classify(g))
        self._lifetimes()

    # --- planning -----------------------------------------------------------------------------
    def _classify(self, g) -> _Step:
        ins = [g.function.body[i - g.instrs[0]] for i in g.instrs]
        if g.kind != "single":
            step = _Step("kernel", ins, g)
            gen = _generalised(g.function)
            kern = None
            for fn in ([gen] if gen is not None else []) + [g.function]:
                try:
                    kern = compile_group(fn, cache=self.cache, **self.opts)
                    break
                except CodegenError as e:
                    self.counters["codegen_errors"] += 1
                    why = str(e)
            if kern is None:
                step.kind = "host"
                self.counters[f"unsupported: {why[:80]}"] += 1
            else:
                step.kernels = [kern]
            return step
        op = ins[0].op
        if op == "matmul" and library.cublas() is not None:
            return _Step("matmul", ins, g)
        if op in _TAKE_OPS and ins[0].attrs.get("batch_dims", 0) == 0:
            return _Step("take", ins, g)
        if op == "unsorted_segment_sum":
            return _Step("segsum", ins, g)
        return _Step("host", ins, g)

    def _lifetimes(self) -> None:
        """Per step, the registers whose last use it is (released after it; program outputs never)."""
        last: dict = {}
        for k, st in enumerate(self.steps):
            for ins in st.instrs:
                for r in ins.regs():
                    last[int(r)] = k
                for r in ins.outs:
                    last.setdefault(r, k)
        keep = set(self.program.outputs)
        for r, k in last.items():
            if r not in keep:
                self.steps[k].last.append(r)

    def _concrete_types(self, inputs) -> dict:
        key = tuple((a.shape, a.dtype.str) for a in inputs)
        t = self._types.get(key)
        if t is not None:
            return t
        prog = self.program
        types = dict(prog.types)
        same = all(tuple(prog.types[i.reg].shape) == tuple(a.shape) for i, a in zip(prog.inputs, inputs))
        if not same:
            for i, a in zip(prog.inputs, inputs):
                types[i.reg] = TensorType(prog.types[i.reg].dtype, tuple(a.shape))
            for ins in prog.instrs():
                args = [types[int(x)] if isinstance(x, Reg) else x for x in ins.args]
                for r, ty in zip(ins.outs, registry.infer(ins.op, args, ins.attrs)):
                    types[r] = ty
        self._types[key] = types
        return types

    # --- running --------------------------------------------------------------------------------
    def run(self, inputs: list) -> list[np.ndarray]:
        """Host arrays in (program.inputs order), host arrays out (program.outputs order)."""
        prog = self.program
        if len(inputs) != len(prog.inputs):
            raise ValueError(f"program takes {len(prog.inputs)} inputs, got {len(inputs)}")
        arrs = []
        for inp, a in zip(prog.inputs, inputs):
            a = np.asarray(a)
            want = dtypes.to_numpy(prog.types[inp.reg].dtype)
            if a.dtype != want:
                raise ValueError(f"input %{inp.reg}: dtype {a.dtype}, expected {want}")
            arrs.append(a)
        types = self._concrete_types(arrs)
        vals = {}
        for inp, a in zip(prog.inputs, arrs):
            vals[inp.reg] = to_device(a, types[inp.reg].dtype, self.pool)
            self.counters["h2d_bytes"] += a.nbytes
        outs = self.run_device(vals, types)
        host = []
        for r in prog.outputs:
            h = outs[r].get()
            want = dtypes.to_numpy(types[r].dtype)
            host.append(h.astype(want) if h.dtype != want else h)
            self.counters["d2h_bytes"] += h.nbytes
        for a in outs.values():
            a.release()
        self.pool.safe_point()
        return host

    def run_device(self, vals: dict, types: dict) -> dict:
        """Run every step on device values `vals` (reg -> DeviceArray, the inputs; consumed); returns
        reg -> DeviceArray for the program outputs (the caller releases them)."""
        for r, c in self.program.consts.items():
            if r not in self._consts:
                self._consts[r] = to_device(np.asarray(c), self.program.types[r].dtype, self.pool)
            vals[r] = self._consts[r]
        const_ids = {id(v) for v in self._consts.values()}
        for st in self.steps:
            getattr(self, "_run_" + st.kind)(st, vals, types)
            for r in st.last:
                v = vals.pop(r, None)
                if v is not None and id(v) not in const_ids and not any(v is w for w in vals.values()):
                    v.release()
        out = {}
        for r in self.program.outputs:
            v = vals[r]
            if id(v) in const_ids or any(v is w for k, w in out.items()):
                v = self._copy(v)
            out[r] = v
        for r, v in vals.items():
            if r not in out and id(v) not in const_ids and not any(v is w for w in out.values()):
                v.release()
        return out

    def _copy(self, v):
        buf = self.pool.allocate(max(v.nbytes, 1))
        if v.nbytes:
            driver.drv().memcpy_dtod_async(buf.ptr, v.ptr, v.nbytes, driver.stream())
        return driver.DeviceArray(buf.ptr, v.shape, v.dtype, buf=buf)

    def _run_kernel(self, st: _Step, vals: dict, types: dict) -> None:
        fn = st.group.function
        ins = [vals[r] for r in fn.params]
        kern = st.kernels[0]
        try:
            outs = kern.run_device(ins, self.pool)
        except ValueError:
            # The shapes contradict the kernel's symbols (dims that shared a symbol differ now) or
            # its static dims: a kernel for these static shapes.
            shapes = tuple(a.shape for a in ins)
            sfn = self._static_fn(st, types)
            kern = next((k for k in st.kernels[1:] if getattr(k, "params_shapes", None) == shapes), None)
            if kern is None:
                kern = compile_group(sfn, cache=self.cache, **self.opts)
                kern.params_shapes = shapes
                st.kernels.append(kern)
            outs = kern.run_device(ins, self.pool)
        self.counters["kernel_launches"] += len(kern.nests)
        for r, o in zip(fn.outputs, outs):
            vals[r] = o

    def _static_fn(self, st: _Step, types: dict) -> Function:
        fn = st.group.function
        sub = {r: types[r] for r in fn.types}
        return Function(fn.name, list(fn.params), list(fn.body), list(fn.outputs), sub)

    def _run_matmul(self, st: _Step, vals: dict, types: dict) -> None:
        ins = st.instrs[0]
        a, b = (vals[int(x)] for x in ins.args)
        out_t = types[ins.outs[0]]
        ta, tb = bool(ins.attrs.get("transpose_a")), bool(ins.attrs.get("transpose_b"))
        ok = (a.dtype == b.dtype == out_t.dtype and a.dtype in ("f32", "f64", "f16") and len(a.shape) >= 2
              and len(b.shape) >= 2 and a.is_contiguous() and b.is_contiguous())
        if ok:
            m = a.shape[-1] if ta else a.shape[-2]
            k = a.shape[-2] if ta else a.shape[-1]
            n = b.shape[-2] if tb else b.shape[-1]
            ba, bb = int(np.prod(a.shape[:-2], dtype=np.int64)), int(np.prod(b.shape[:-2], dtype=np.int64))
            batch = int(np.prod(out_t.shape[:-2], dtype=np.int64))
            ok = (ba == batch or ba == 1) and (bb == batch or bb == 1) and (
                ba == 1 or bb == 1 or a.shape[:-2] == b.shape[:-2])
        if not ok:
            return self._run_host(st, vals, types)
        nbytes = int(np.prod(out_t.shape, dtype=np.int64)) * driver.storage_itemsize(out_t.dtype)
        buf = self.pool.allocate(max(nbytes, 1))
        c = driver.DeviceArray(buf.ptr, out_t.shape, out_t.dtype, buf=buf)
        if m * n * batch:
            if k == 0:
                driver.drv().memset_d8_async(c.ptr, 0, c.nbytes, driver.stream())
            else:
                library.cublas().matmul(a.dtype, a.ptr, b.ptr, c.ptr, m, n, k, ta, tb, batch,
                                        0 if ba == 1 else m * k, 0 if bb == 1 else k * n)
        self.counters["cublas_calls"] += 1
        vals[ins.outs[0]] = c

    def _run_take(self, st: _Step, vals: dict, types: dict) -> None:
        ins = st.instrs[0]
        x, idx = (vals[int(r)] for r in ins.args)
        if not (library.index_supported(x.dtype, idx.dtype) and x.is_contiguous() and idx.is_contiguous()):
            return self._run_host(st, vals, types)
        axis = ins.attrs.get("axis", 0) % max(len(x.shape), 1)
        pre = int(np.prod(x.shape[:axis], dtype=np.int64))
        post = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        out_t = types[ins.outs[0]]
        take, _ = library.index_module(x.dtype, idx.dtype, self.cache)
        nbytes = int(np.prod(out_t.shape, dtype=np.int64)) * driver.storage_itemsize(out_t.dtype)
        buf = self.pool.allocate(max(nbytes, 1))
        flag = self.pool.allocate(4)
        s = driver.stream()
        driver.drv().memset_d32_async(flag.ptr, 0, 1, s)
        total = pre * idx.size * post
        if total:
            take.prepared_async_call(library.grid_for(total), (256, 1, 1), s, x.ptr, idx.ptr, buf.ptr, flag.ptr,
                                     pre, x.shape[axis], idx.size, post)
        bad = np.zeros(1, np.int32)
        driver.drv().memcpy_dtoh_async(bad, flag.ptr, s)
        s.synchronize()
        flag.release()
        if bad[0]:
            buf.release()
            raise IndexError(f"{ins.op}: index out of range [-{x.shape[axis]}, {x.shape[axis]})")
        self.counters["index_kernels"] += 1
        vals[ins.outs[0]] = driver.DeviceArray(buf.ptr, out_t.shape, out_t.dtype, buf=buf)

    def _run_segsum(self, st: _Step, vals: dict, types: dict) -> None:
        ins = st.instrs[0]
        x, ids = (vals[int(r)] for r in ins.args)
        if not (library.index_supported(x.dtype, ids.dtype) and x.is_contiguous() and ids.is_contiguous()):
            return self._run_host(st, vals, types)
        out_t = types[ins.outs[0]]
        nseg = ins.attrs["num_segments"]
        rows = ids.size
        cols = int(np.prod(x.shape[len(ids.shape):], dtype=np.int64))
        _, seg = library.index_module(x.dtype, ids.dtype, self.cache)
        nbytes = int(np.prod(out_t.shape, dtype=np.int64)) * driver.storage_itemsize(out_t.dtype)
        buf = self.pool.allocate(max(nbytes, 1))
        s = driver.stream()
        if nbytes:
            driver.drv().memset_d8_async(buf.ptr, 0, nbytes, s)
        if rows * cols:
            seg.prepared_async_call(library.grid_for(rows * cols), (256, 1, 1), s, x.ptr, ids.ptr, buf.ptr,
                                    rows, cols, nseg)
        self.counters["index_kernels"] += 1
        vals[ins.outs[0]] = driver.DeviceArray(buf.ptr, out_t.shape, out_t.dtype, buf=buf)

    def _run_host(self, st: _Step, vals: dict, types: dict) -> None:
        """The step's instructions on the host (reference interpreter), with copies both ways."""
        local = {}
        for ins in st.instrs:
            for r in ins.regs():
                r = int(r)
                if r not in local and r in vals:
                    h = vals[r].get()
                    if types[r].dtype == "bf16":
                        h = h.astype(np.float32)
                    local[r] = h
                    self.counters["d2h_bytes"] += h.nbytes
        env: dict = {}
        for ins in st.instrs:
            run_instr(ins, local, types, env=env)
            self.host_ops[ins.op] += 1
        for ins in st.instrs:
            for r in ins.outs:
                if st.group is None or r in st.group.function.outputs or r in self.program.outputs:
                    a = np.asarray(local[r])
                    vals[r] = to_device(a, types[r].dtype, self.pool)
                    self.counters["h2d_bytes"] += a.nbytes

    def stats(self) -> dict:
        out = dict(self.counters)
        out["host_ops"] = dict(self.host_ops)
        out["steps"] = Counter(s.kind for s in self.steps)
        return out


_EXECUTORS: dict = {}


def executor_for(program, **options) -> GpuExecutor:
    """The executor of `program` for these options (built once per program object and options:
    compiled kernels and launch plans are kept across calls)."""
    key = (id(program), tuple(sorted(options.items())))
    hit = _EXECUTORS.get(key)
    if hit is not None and hit[0] is program:
        return hit[1]
    ex = GpuExecutor(program, **options)
    _EXECUTORS[key] = (program, ex)
    return ex


__all__ = ["GpuExecutor", "executor_for"]
