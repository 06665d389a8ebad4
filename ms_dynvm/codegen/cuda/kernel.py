"""`compile_group` / `supports` / `CudaKernel`: the CUDA backend's interface to the executors.

`compile_group(fn)` lowers a fusion group to a kernel spec (`spec.lower`, the C backend's spec),
renders CUDA C (`render.render`), and gets the NVRTC artifact from the kernel cache
(`runtime.cache`, the CPU kernels' cache: same key scheme, integrity check and atomic writes; the key
names the backend, the device architecture, the NVRTC version and options, the canonical IR text and
the source). The module is loaded with `pycuda.driver.module_from_buffer` and every nest's function
is `prepare`d once; a launch is one `prepared_async_call` per nest on the ms_dynvm stream.

`CudaKernel.plan(shapes, strides, aligned)` binds the symbolic dims from the input shapes and fixes
everything that depends only on the layout (sizes, strides, grid and block, the vectorised-path bits,
temporary sizes): plans are cached per layout, so a repeated launch costs a dict lookup, the
temporaries' allocation and the `prepared_async_call`s.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.types import eval_dim
from ms_dynvm.codegen.cuda import driver, nvrtc
from ms_dynvm.codegen.cuda.render import MAP_THREADS, itemsize, render
from ms_dynvm.codegen.kernel import _bind, canonical_text
from ms_dynvm.codegen.spec import CodegenError, ix_split, lower

_COUNTS = {"compiles": 0, "launches": 0}


def _pack(fmt: str, *args) -> bytes:
    from pycuda._pvt_struct import pack  # (what pycuda's prepared_async_call packs with)

    return pack(fmt, *args)


def options(strict_ieee: bool = False, fast_math: bool = False) -> list:
    """NVRTC options for the numerics switches (see render.py's module docstring)."""
    if fast_math:
        return ["--use_fast_math"]
    if strict_ieee:
        return ["--fmad=false", "--prec-div=true", "--prec-sqrt=true"]
    return ["--prec-div=true", "--prec-sqrt=true"]


def supports(fn) -> tuple[bool, str]:
    """(True, "") if the CUDA backend can compile group `fn`, else (False, why). Needs no GPU."""
    try:
        render(lower(fn, eager_math=False))
    except CodegenError as e:
        return False, str(e)
    except (ValueError, KeyError) as e:
        return False, f"CUDA rendering: {e}"
    return True, ""


def kernel_source(fn, eager_math: bool = True) -> tuple:
    """(spec, CUDA source, nest infos) of group `fn` (CodegenError where unsupported). The spec is
    lowered with the spec's eager_math off (float64 accumulation of float32 sums and statistics, as
    the reference computes them; no CPU-specific summation orders); `eager_math` here chooses the
    elementwise formulas (render.math_prelude)."""
    spec = lower(fn, eager_math=False)
    try:
        source, nests = render(spec, eager_math)
    except (ValueError, KeyError) as e:
        raise CodegenError(f"CUDA rendering: {e}") from e
    return spec, source, nests


def kernel_key(fn, source: str, arch: int, opts: list) -> str:
    from ms_dynvm import __version__
    from ms_dynvm.runtime.cache import make_key

    return make_key({
        "ms_dynvm": __version__,
        "backend": "cuda",
        "compiler": f"nvrtc {nvrtc.version()}",
        "flags": list(opts),
        "arch": f"sm_{arch}",
        "ir": canonical_text(fn),
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    })


def compile_group(fn, *, strict_ieee: bool = False, fast_math: bool = False, eager_math: bool = True,
                  cache=None) -> "CudaKernel":
    """Compile fusion group `fn` for the current CUDA device (CodegenError if unsupported, NvrtcError
    if NVRTC fails; the caller checks `driver.available()` first)."""
    from ms_dynvm.runtime.cache import default_cache

    spec, source, nests = kernel_source(fn, eager_math)
    arch = driver.arch()
    opts = options(strict_ieee, fast_math)
    key = kernel_key(fn, source, arch, opts)
    cache = default_cache() if cache is None else cache

    def build() -> bytes:
        _COUNTS["compiles"] += 1
        return nvrtc.compile_source(source, arch, opts)

    module = cache.get_or_build(key, build, _load_module, device=f"cuda:sm_{arch}")
    return CudaKernel(spec, source, key, module, nests, fn)


def _load_module(payload: bytes):
    kind, image = nvrtc.split_artifact(payload)
    return driver.drv().module_from_buffer(image)


def compiles() -> int:
    """NVRTC compiles in this process (cache hits do not count)."""
    return _COUNTS["compiles"]


# --- run-time index arithmetic (the launcher's layout checks) --------------------------------------
def ix_eval(e, sizes: dict, strides: dict) -> int:
    kind = e[0]
    if kind == "c":
        return e[1]
    if kind == "s":
        return sizes[e[1]]
    if kind == "st":
        return strides[(e[1], e[2])]
    a, b = ix_eval(e[1], sizes, strides), ix_eval(e[2], sizes, strides)
    if kind == "+":
        return a + b
    if kind == "*":
        return a * b
    if kind == "/":
        return a // b
    if kind == "%":
        return a % b
    raise ValueError(kind)


def _dense(index, vars_: list, sizes: dict, strides: dict) -> bool:
    """Whether `index` is the row-major linear index of the iteration space `vars_`."""
    lin = 1
    want = {}
    for v, s in reversed(vars_):
        want[v] = lin
        lin *= ix_eval(s, sizes, strides)
    e = index
    for v, s in vars_:
        split = ix_split(e, v)
        if split is None:
            return False
        e, coeff = split
        if ix_eval(s, sizes, strides) != 1 and ix_eval(coeff, sizes, strides) != want[v]:
            return False
    return ix_eval(e, sizes, strides) == 0


class Plan:
    """One layout's launch: [(function, grid, block, vec bits)], the scalar arguments, temp bytes."""

    __slots__ = ("launches", "scalars", "temp_bytes", "out_shapes", "packed")

    def __init__(self, launches, scalars, temp_bytes, out_shapes):
        self.packed: dict = {}  # pointer tuple -> [(function, grid, block, packed arguments)]
        self.launches = launches
        self.scalars = scalars
        self.temp_bytes = temp_bytes
        self.out_shapes = out_shapes


class CudaKernel:
    """A compiled fusion group. `params`/`outputs`: [(register, TensorType)] in call order."""

    def __init__(self, spec, source: str, key: str, module, nests: list, fn):
        self.spec = spec
        self.source = source
        self.key = key
        self.module = module
        self.nests = nests
        self.params = [(r, fn.types[r]) for r in fn.params]
        self.outputs = [(r, fn.types[r]) for r in fn.outputs]
        ext = [b for b in spec.buffers if b.role != "tmp"]
        n_scalar = sum(len(b.shape) for b in ext) + len(spec.syms)
        fmt = "P" * len(spec.buffers) + "q" * n_scalar + "i"
        self.funcs = []
        for n in nests:
            f = module.get_function(n.name)
            f.prepare(fmt)
            self.funcs.append(f)
        self._plans: dict = {}
        self.stream = driver.stream()

    def out_shapes(self, env: dict) -> list:
        return [tuple(eval_dim(d, env) for d in t.shape) for _, t in self.outputs]

    def plan(self, in_shapes, in_strides, aligned: tuple) -> Plan:
        """The launch plan for inputs of these shapes/element strides (outputs C-contiguous);
        `aligned[k]`: input k's pointer is 16-byte aligned."""
        key = (tuple(in_shapes), tuple(in_strides), aligned)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._make_plan(in_shapes, in_strides, aligned)
        return p

    def _make_plan(self, in_shapes, in_strides, aligned) -> Plan:
        spec = self.spec
        env: dict = {}
        for k, ((_, t), shape) in enumerate(zip(self.params, in_shapes)):
            _bind(t.shape, tuple(shape), env, f"input {k}")
        outs = self.out_shapes(env)
        strides: dict = {}
        scal = []
        ins, outb = spec.inputs, spec.outs
        for b, st in zip(ins, in_strides):
            for axis, s in enumerate(st):
                strides[(b.name, axis)] = int(s)
        for b, shape in zip(outb, outs):
            acc, st = 1, []
            for d in reversed(shape):
                st.append(acc)
                acc *= d
            for axis, s in enumerate(reversed(st)):
                strides[(b.name, axis)] = s
        for b in spec.buffers:
            if b.role != "tmp":
                scal += [strides[(b.name, a)] for a in range(len(b.shape))]
        scal += [env[s] for s in spec.syms]
        ok_align = {b.name: bool(a) for b, a in zip(ins, aligned)}
        ok_align.update({b.name: True for b in outb})
        temp_bytes = []
        for b in spec.temps:
            n = 1
            for d in b.shape:
                n *= eval_dim(d, env)
            temp_bytes.append(n * itemsize(b.dtype))
        sms = driver.sm_count()
        launches = []
        for f, nest in zip(self.funcs, self.nests):
            if nest.kind == "map":
                vec, most = 0, 0
                for k, (info, work) in enumerate(zip(nest.steps, nest.work)):
                    total = 1
                    for s in work:
                        total *= ix_eval(s, env, strides)
                    use = info.vec and total >= 4 and all(
                        ok_align.get(b, False) and _dense(ix, info.vars, env, strides) for b, ix, _ in info.accesses)
                    if use:
                        vec |= 1 << k
                    most = max(most, (total + 3) // 4 if use else total)
                if most == 0:
                    continue
                blocks = max(1, min((most + MAP_THREADS - 1) // MAP_THREADS, sms * 16))
                launches.append((f, (blocks, 1), (MAP_THREADS, 1, 1), vec))
            else:
                n_outer = 1
                for _, s in nest.outer:
                    n_outer *= ix_eval(s, env, strides)
                row = 1
                for work in nest.work[:1]:
                    for s in work:
                        row *= ix_eval(s, env, strides)
                if n_outer == 0:
                    continue
                threads = 32
                while threads < 1024 and threads * 4 < row:
                    threads *= 2
                if n_outer == 1:
                    threads = 1024 if row > 4096 else threads
                launches.append((f, (min(n_outer, 1 << 20), 1), (threads, 1, 1), 0))
        return Plan(launches, scal, temp_bytes, outs)

    def launch(self, in_ptrs, out_ptrs, plan: Plan, pool, stream=None) -> None:
        """Queue the nests on `stream` (inputs/outputs already on the device). The packed argument
        buffers are kept per pointer tuple (a repeated launch on the same buffers is one
        `_launch_kernel` per nest: pycuda's `prepared_async_call` without re-packing)."""
        if plan.temp_bytes:
            temps = [pool.allocate(n) for n in plan.temp_bytes]
            ptrs = (*in_ptrs, *out_ptrs, *[t.ptr for t in temps])
            calls = None
        else:
            temps = ()
            ptrs = (*in_ptrs, *out_ptrs)
            calls = plan.packed.get(ptrs)
        if calls is None:
            calls = [(f, grid, block, _pack(f.arg_format, *ptrs, *plan.scalars, vec))
                     for f, grid, block, vec in plan.launches]
            if not temps:
                if len(plan.packed) >= 256:
                    plan.packed.clear()
                plan.packed[ptrs] = calls
        s = stream or self.stream
        for f, grid, block, buf in calls:
            f._launch_kernel(grid, block, buf, 0, s)
        if temps:
            for t in temps:
                t.release()  # reused only after the next safe point (a stream synchronisation)

    def run_device(self, inputs: list, pool, stream=None, plan: Plan | None = None) -> list:
        """Run on DeviceArrays; returns C-contiguous DeviceArrays from `pool`. `plan`: a launch plan
        of the inputs' layout to use instead of the kernel's own (tests vary its launch shapes)."""
        if plan is None:
            plan = self.plan([a.shape for a in inputs], [a.strides for a in inputs],
                             tuple(a.ptr % 16 == 0 for a in inputs))
        outs = []
        for (_, t), shape in zip(self.outputs, plan.out_shapes):
            n = int(np.prod(shape, dtype=np.int64)) * driver.storage_itemsize(t.dtype)
            buf = pool.allocate(n)
            outs.append(driver.DeviceArray(buf.ptr, shape, t.dtype, buf=buf))
        self.launch([a.ptr for a in inputs], [o.ptr for o in outs], plan, pool, stream)
        return outs

    def __call__(self, inputs: list, pool=None) -> list:
        """Host arrays in, host arrays out (copies both ways; for tests)."""
        from ms_dynvm.runtime.device_pool import default_device_pool

        pool = pool or default_device_pool()
        dev = [to_device(np.asarray(a), t.dtype, pool) for a, (_, t) in zip(inputs, self.params)]
        outs = self.run_device(dev, pool)
        host = [o.get() for o in outs]
        for a in dev + outs:
            a.release()
        pool.safe_point()
        return [h.astype(dtypes.to_numpy(t.dtype)) if h.dtype != dtypes.to_numpy(t.dtype) else h
                for h, (_, t) in zip(host, self.outputs)]


def to_device(arr: np.ndarray, dtype: str, pool, stream=None) -> driver.DeviceArray:
    """A C-contiguous device copy of host array `arr` (bf16: float32 values rounded on entry, as the
    interpreter rounds them)."""
    if dtype == "bf16":
        from ms_dynvm.runtime.interpreter import _round_bf16

        arr = _round_bf16(np.asarray(arr, np.float32))
    # (np.ascontiguousarray makes a 0-d array 1-d: keep the shape)
    host = np.ascontiguousarray(arr, dtype=driver.storage_numpy(dtype)).reshape(np.shape(arr))
    buf = pool.allocate(max(host.nbytes, 1))
    if host.nbytes:
        driver.drv().memcpy_htod_async(buf.ptr, host, stream or driver.stream())
    return driver.DeviceArray(buf.ptr, host.shape, dtype, buf=buf)


__all__ = ["CudaKernel", "compile_group", "compiles", "kernel_key", "kernel_source", "options", "supports",
           "to_device"]
