"""`compile_group` / `supports` / `CompiledKernel`: the C backend's interface to the executors.

`compile_group(fn)` lowers a fusion group to a spec (`spec.lower`), renders C (`c.render`), and gets
the shared object from the kernel cache (`runtime.cache`; built with `gcc.compile_shared` on a miss).
The cache key hashes the ms_dynvm version, gcc version/target and flags, the host arch, the
canonical IR text of the group (registers renumbered, so equal groups share a kernel) and the
generated source. `CompiledKernel` binds symbolic dims from the input shapes at every call, so one
kernel serves every size of a shape family.
"""

from __future__ import annotations

import ctypes
import hashlib
import platform

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.program import Instr
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType, eval_dim
from ms_dynvm.codegen import c as c_backend
from ms_dynvm.codegen import gcc
from ms_dynvm.codegen.spec import CodegenError, KernelSpec, lower
from ms_dynvm.observe import series as compile_log


def canonical_text(fn) -> str:
    """The group's IR text with registers renumbered in order of definition and a fixed name: the
    part of the cache key that identifies the computation and its signature."""
    from ms_dynvm.ir.function import Function

    ren: dict[int, int] = {}
    for r in fn.params:
        ren.setdefault(int(r), len(ren))
    for ins in fn.body:
        for r in ins.outs:
            ren.setdefault(int(r), len(ren))

    def m(a):
        return Reg(ren[int(a)]) if isinstance(a, Reg) else a

    body = [Instr(i.op, tuple(m(a) for a in i.args), dict(i.attrs), tuple(ren[r] for r in i.outs)) for i in fn.body]
    types = {ren[r]: t for r, t in fn.types.items() if r in ren}
    g = Function("group", [ren[int(r)] for r in fn.params], body, [ren[int(r)] for r in fn.outputs], types)
    return g.as_text()


def supports(fn) -> tuple[bool, str]:
    """(True, "") if `compile_group(fn)` can compile the group, else (False, why). Needs no compiler
    and renders nothing: what the C backend computes per op and dtype is data
    (`codegen.capability`, which tests check against rendering); what depends on the group's shapes
    (slices of symbolic dims, reshapes that cannot be grouped, rank-0 softmax) is found by lowering."""
    try:
        lower(fn)
    except CodegenError as e:
        return False, str(e)
    return True, ""


def kernel_key(fn, *, strict_ieee: bool = False, fast_math: bool = False, eager_math: bool = True) -> tuple:
    """(cache key, spec, C source, gcc flags) of group `fn`: what `compile_group` builds and looks up
    (no gcc run; CodegenError where unsupported, CompilerUnavailable without a compiler)."""
    from ms_dynvm.runtime.cache import make_key
    from ms_dynvm.version import __version__

    spec = lower(fn, eager_math=eager_math)
    try:
        source = c_backend.render(spec, strict_ieee=strict_ieee, fast_math=fast_math, eager_math=eager_math)
    except ValueError as e:
        raise CodegenError(f"C rendering: {e}") from e
    flags = gcc.flags(strict_ieee=strict_ieee, fast_math=fast_math)
    key = make_key({
        "ms_dynvm": __version__,
        "compiler": gcc.compiler_info(),
        "flags": flags,
        "arch": platform.machine(),
        "ir": canonical_text(fn),
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
    })
    return key, spec, source, flags


def prepare_group(fn, *, strict_ieee: bool = False, fast_math: bool = False, eager_math: bool = True,
                  cache=None) -> tuple:
    """`compile_group` in two parts: group `fn` lowered and rendered here (Python: the caller's
    thread; raises CodegenError if unsupported), then `(obtain, finish)`: `obtain()` the GCC compile
    or the kernel cache's load (a subprocess and file I/O: fit for a background thread, which then
    never holds the GIL for long), `finish(lib)` the CompiledKernel (the caller's thread)."""
    from ms_dynvm.runtime.cache import default_cache

    key, spec, source, flags = kernel_key(fn, strict_ieee=strict_ieee, fast_math=fast_math,
                                          eager_math=eager_math)
    cache = default_cache() if cache is None else cache
    opts = {"strict_ieee": strict_ieee, "fast_math": fast_math, "eager_math": eager_math}  # (the compile log's)

    def obtain():
        return compile_log.timed_build(cache, key, fn, opts, lambda: cache.get_or_build(
            key, lambda: gcc.compile_shared(source, flags), gcc.load_shared, device="cpu"))

    def finish(lib):
        return CompiledKernel(spec, source, key, lib, fn)

    return obtain, finish


def compile_group(fn, *, strict_ieee: bool = False, fast_math: bool = False, eager_math: bool = True,
                  cache=None) -> "CompiledKernel":
    """Compile fusion group `fn` for the CPU; raises CodegenError if unsupported or if gcc fails."""
    obtain, finish = prepare_group(fn, strict_ieee=strict_ieee, fast_math=fast_math, eager_math=eager_math,
                                   cache=cache)
    return finish(obtain())


def _bind(shape_decl, shape, env: dict, what: str) -> None:
    if len(shape_decl) != len(shape):
        raise ValueError(f"{what}: rank {len(shape)}, expected {len(shape_decl)}")
    for d, n in zip(shape_decl, shape):
        if isinstance(d, int):
            if d != n:
                raise ValueError(f"{what}: shape {tuple(shape)} does not match {tuple(shape_decl)}")
            continue
        known, free = d.coeff, []
        for name in d.names:
            if name in env:
                known *= env[name]
            else:
                free.append(name)
        if not free:
            if known != n:
                raise ValueError(f"{what}: dim {d} = {n} contradicts {env}")
        elif len(free) == 1 and n % known == 0 and n // known > 1:
            env[free[0]] = n // known
        else:
            raise ValueError(f"{what}: cannot bind dim {d} to {n}")


class CompiledKernel:
    """A compiled fusion group. `params`/`outputs`: [(register, TensorType)] in call order."""

    def __init__(self, spec: KernelSpec, source: str, key: str, lib, fn):
        self.spec = spec
        self.source = source
        self.key = key
        self._lib = lib  # keeps the library loaded as long as the kernel lives
        self._fn = lib.dvm_kernel
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.params = [(r, fn.types[r]) for r in fn.params]
        self.outputs = [(r, fn.types[r]) for r in fn.outputs]
        self._np_in = [dtypes.to_numpy(t.dtype) for _, t in self.params]
        self._np_out = [dtypes.to_numpy(t.dtype) for _, t in self.outputs]
        self._ptr_t = ctypes.c_void_p * max(len(self.params) + len(self.outputs), 1)

    def _sizes(self, in_shapes) -> dict:
        env: dict = {}
        for k, ((_, t), shape) in enumerate(zip(self.params, in_shapes)):
            _bind(t.shape, tuple(shape), env, f"input {k}")
        return env

    def out_shapes(self, env: dict) -> list[tuple]:
        try:
            return [tuple(eval_dim(d, env) for d in t.shape) for _, t in self.outputs]
        except KeyError as e:
            raise ValueError(f"symbolic dim {e} is not bound by any input") from None

    def _launch(self, ptrs, strides, env: dict) -> None:
        sizes = (ctypes.c_int64 * max(len(self.spec.syms), 1))(*[env[s] for s in self.spec.syms])
        p = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
        st = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self._fn(p, st, sizes)

    def __call__(self, inputs: list, out: list | None = None) -> list[np.ndarray]:
        """Run on NumPy arrays of any strides; allocates C-contiguous outputs unless `out` is given."""
        if len(inputs) != len(self.params):
            raise ValueError(f"kernel takes {len(self.params)} inputs, got {len(inputs)}")
        arrs = []
        for k, (a, want) in enumerate(zip(inputs, self._np_in)):
            a = np.asarray(a)
            if a.dtype != want:
                raise ValueError(f"input {k}: dtype {a.dtype}, expected {want}")
            arrs.append(a)
        env = self._sizes([a.shape for a in arrs])
        shapes = self.out_shapes(env)
        if out is None:
            out = [np.empty(s, dt) for s, dt in zip(shapes, self._np_out)]
        else:
            if len(out) != len(self.outputs):
                raise ValueError(f"kernel writes {len(self.outputs)} outputs, got {len(out)}")
            for k, (o, s, dt) in enumerate(zip(out, shapes, self._np_out)):
                if o.shape != s or o.dtype != dt:
                    raise ValueError(f"out {k}: {o.dtype}{o.shape}, expected {dt}{s}")
        ptrs, strides = [], []
        for a in list(arrs) + list(out):
            ptrs.append(a.ctypes.data)
            strides.extend(s // a.itemsize for s in a.strides)
        self._launch(ptrs, strides, env)
        return list(out)

    def prepare(self, in_shapes, in_strides, out_shapes):
        """A launcher for calls whose inputs have exactly these shapes and element strides and whose
        outputs are C-contiguous `out_shapes` (checked here, once): `go(ptrs)` runs the kernel on
        host pointers, inputs then outputs. Everything that depends only on the shapes (sizes,
        strides, the pointer-array type) is built here, so a launch costs one ctypes call; the
        tier-1 executor caches launchers per input layout."""
        env = self._sizes(in_shapes)
        want = self.out_shapes(env)
        if [tuple(s) for s in out_shapes] != want:
            raise ValueError(f"out shapes {out_shapes}, expected {want}")
        return self.prepare_sized(env, in_strides, want)

    def prepare_sized(self, env: dict, in_strides, out_shapes):
        """`prepare` without its derivations and checks, for a caller that has bound the symbols
        (`env`, every symbol of `spec.syms`) from the inputs' shapes itself and computed `out_shapes`
        from this kernel's output types with it (tier 1, once per new input layout: the per-shape
        part of a launch is then a few list operations and two ctypes arrays)."""
        strides = [int(s) for st in in_strides for s in st]
        for shape in out_shapes:
            acc, st = 1, []
            for d in reversed(shape):
                st.append(acc)
                acc *= d
            strides.extend(reversed(st))
        sizes = (ctypes.c_int64 * max(len(self.spec.syms), 1))(*[env[s] for s in self.spec.syms])
        st = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        ptr_t = self._ptr_t
        fn = self._fn

        def go(ptrs) -> None:
            fn(ptr_t(*ptrs), st, sizes)

        return go

    def run_raw(self, in_ptrs, in_shapes, in_strides, out_ptrs, out_shapes) -> None:
        """Zero-copy entry: host pointers (ints), shapes, element strides of the inputs; outputs are
        C-contiguous buffers of `out_shapes` (checked against the shapes the kernel computes)."""
        go = self.prepare(in_shapes, in_strides, out_shapes)
        go([int(p) for p in in_ptrs] + [int(p) for p in out_ptrs])


__all__ = ["CompiledKernel", "canonical_text", "compile_group", "kernel_key", "supports"]
