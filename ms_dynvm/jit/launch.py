"""Launching compiled group kernels: which kernel serves an input layout, prepared launches, where
results live, and how many OpenMP threads kernels use.

A group's compiled kernels are keyed by signature (`jit.compile.GroupKernels.kernels`). A call
is served by the kernel whose signature its inputs have; what depends only on the inputs' layouts
(dtypes, shapes, element strides) is prepared once per layout (`Launch`) and cached by the caller,
so that a repeat launch costs one ctypes call plus allocating the results. `Family` holds what the
launches of one kernel share whatever the sizes, so a new layout of a known kernel binds its symbols
from the shapes alone, without the signature's guard walk.

`run` allocates the results (NumPy arrays, from the memory pool by default: `pool_for`), writes the
sized scalars' 0-d inputs and runs the kernel; wrapping the arrays as framework tensors is the
frontend's job. This module imports no MindSpore.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ms_dynvm import dtypes
from ms_dynvm.bytecode.types import eval_dim
from ms_dynvm.cost.model import SizeSwitch
from ms_dynvm.metrics import METRICS
from ms_dynvm.runtime.signature import GuardFailure, check

MAX_LAUNCHES_PER_GROUP = 512  # prepared launches (input layouts) kept per group


class Launch:
    """A prepared launch of one kernel for one input layout: `go(ptrs)` runs it (pointers: tensor
    inputs, constants, outputs), `out_specs` are the results' (shape, NumPy dtype)."""

    __slots__ = ("go", "out_specs", "const_ptrs", "size_class")

    def __init__(self, go, out_specs, const_ptrs, size_class):
        self.go = go
        self.out_specs = out_specs
        self.const_ptrs = const_ptrs
        self.size_class = size_class


class Family:
    """What launches of one compiled kernel entry (a signature of a group) share, whatever the
    sizes: where each symbol is read off the inputs, the results' symbolic shapes and dtypes, the
    constants. `launch` makes the `Launch` for a new input layout from the bound symbols alone
    (`CompiledKernel.prepare_sized`), without the signature's guard walk and the checked `prepare`."""

    __slots__ = ("syms", "kernel", "out_dims", "const_ptrs", "const_shapes", "const_strides")

    def __init__(self, const_arrays: list, entry) -> None:
        kernel, fn, guards = entry
        self.kernel = kernel
        self.syms = [(g.input, g.axis, g.value) for g in guards if g.kind == "sym"]
        self.out_dims = [(tuple(fn.types[r].shape), dtypes.to_numpy(fn.types[r].dtype)) for r in fn.outputs]
        self.const_ptrs = [a.ctypes.data for a in const_arrays]
        self.const_shapes = [a.shape for a in const_arrays]
        self.const_strides = [tuple(s // a.itemsize for s in a.strides) for a in const_arrays]

    def env(self, lkey: tuple):
        """The symbols' values in a call of input layout `lkey`, None where two dims of one symbol
        differ."""
        env: dict = {}
        for i, a, name in self.syms:
            n = lkey[i][1][a]
            if env.setdefault(name, n) != n:
                return None
        return env

    def launch(self, lkey: tuple, env: dict, size_class: int) -> Launch:
        out_specs = [(tuple(d if type(d) is int else eval_dim(d, env) for d in dims), dt)
                     for dims, dt in self.out_dims]
        out_shapes = [s for s, _ in out_specs]
        in_strides = [k[2] for k in lkey] + self.const_strides
        kernel = self.kernel
        prepare_sized = getattr(kernel, "prepare_sized", None)
        if prepare_sized is not None:
            go = prepare_sized(env, in_strides, out_shapes)
        else:  # a kernel with only the raw entry (the tests' reference backend)
            in_shapes = [k[1] for k in lkey] + self.const_shapes
            n_in = len(in_shapes)

            def go(ptrs):
                kernel.run_raw(ptrs[:n_in], in_shapes, in_strides, ptrs[n_in:], out_shapes)
        return Launch(go, out_specs, self.const_ptrs, size_class)


def find_family(group, descs: list, lkey: tuple, const_arrays: list):
    """(the `Family` (kernel entry) of `group` that serves calls of input layout `lkey` (`descs`:
    its inputs' `InputDesc`s, constants included), the symbols' values), or None (counted) when no
    compiled kernel may: the signature (from the group's dynamic dims) must be one a kernel was
    compiled for, and the symbols bind consistently (the rest of the kernel's guards is implied by
    the equal signature: dtypes, ranks, layouts, static dims, and sizes >= 2 where a dim is a symbol,
    as `ShapeFamily.signature` puts the size there otherwise; the first layout of a family walks the
    full guards)."""
    sig = group.family.signature(descs)
    fam = group.families.get(sig)
    if fam is None:
        entry = group.kernels.get(sig)
        if entry is None:
            METRICS.guard_failures["no_kernel_for_signature"] += 1
            return None
        env = check(entry.guards, descs)
        if isinstance(env, GuardFailure):
            METRICS.guard_failures[env.reason] += 1
            return None
        fam = group.families[sig] = Family(const_arrays, entry)
        return fam, env
    env = fam.env(lkey)
    if env is None:
        METRICS.guard_failures["symbol_mismatch"] += 1
        return None
    return fam, env


def prepared(group, lkey: tuple, found, size_class: int) -> Launch:
    """The launch of `group` for input layout `lkey` (made from `found`, `find_family`'s answer,
    and cached, at most MAX_LAUNCHES_PER_GROUP per group)."""
    launch = found[0].launch(lkey, found[1], size_class)
    launches = group.launches
    if len(launches) >= MAX_LAUNCHES_PER_GROUP:
        launches.clear()
    launches[lkey] = launch
    return launch


def run(launch: Launch, in_ptrs: list, pool, sized=None, svals=None) -> list:
    """Run `launch` on the tensor inputs at `in_ptrs`: the results as C-contiguous NumPy arrays
    allocated from `pool`. `sized`/`svals`: the group's sized scalars (each with its 0-d input
    `array`) and this call's values, written before the kernel runs."""
    # The previous launch has finished (CPU kernels are synchronous): a safe point, so buffers whose
    # last tensor has died since become reusable.
    pool.safe_point()
    alloc = pool.array_ptr
    ptrs = in_ptrs + launch.const_ptrs
    outs = []
    for shape, dt in launch.out_specs:
        a, ptr = alloc(shape, dt)
        outs.append(a)
        ptrs.append(ptr)
    if svals is not None:  # the sized scalars' kernel inputs (0-d arrays at fixed addresses)
        for sz, v in zip(sized, svals):
            sz.array[()] = v
    launch.go(ptrs)
    return outs


def size_class(shapes) -> int:
    """Size class of a call (see `SizeSwitch`): from the element count of its largest tensor input
    (not the first: a group may start with a scalar made into a 0-d tensor, as `1.0 - m` does)."""
    most = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        most = max(most, n)
    return SizeSwitch.size_class(most)


class FreshArrays:
    """Kernel results in fresh NumPy arrays (`pool_results=False`)."""

    soft_cap = None
    array = staticmethod(np.empty)

    @staticmethod
    def array_ptr(shape, dtype):
        a = np.empty(shape, dtype)
        return a, a.__array_interface__["data"][0]

    @staticmethod
    def safe_point() -> int:
        return 0


def pool_for(opts):
    """Where kernel results live. By default (`pool_results`) in the memory pool
    (`ms_dynvm.runtime.memory_pool`), bounded by a soft cap: a block goes back when no tensor or
    array over it is left, and is reused after the next launch (a safe point). Per call it costs
    about what fresh arrays cost (`profiling/breakdown_tier1.py` runs both side by side), and the
    memory it holds stays bounded (`profiling/bench_pool_soak.py`), as does the C heap around it
    (`pool_heap_trim_mb`)."""
    if not opts.pool_results:
        return FreshArrays
    from ms_dynvm.runtime.memory_pool import default_pool

    pool = default_pool()
    pool.soft_cap = opts.pool_soft_cap_mb << 20
    pool.heap_trim_mb = opts.pool_heap_trim_mb or None  # malloc_trim at safe points (see the pool)
    return pool


def set_kernel_threads(n: int) -> None:
    """OpenMP threads for fused kernels. 0 = automatic: one thread on machines with <= 2 cores, where
    MindSpore's own worker threads keep the cores busy and a second kernel thread only contends with
    them (measured: the [B,784] chain kernel took ~5 ms with 2 threads, ~0.25 ms with 1)."""
    if n <= 0:
        cores = os.cpu_count() or 1
        n = 1 if cores <= 2 else max(1, cores // 2)
    try:
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(ctypes.c_int(n))
    except OSError:
        pass  # no libgomp: kernels then run single-threaded anyway
