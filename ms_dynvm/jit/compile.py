"""The compile driver: when a recorded group is compiled, into what, and how its kernel is installed.

A frontend (tier 1's run tracker) hands the driver a group (`GroupKernels`: what the executor keeps
per group) together with the signature of a recorded call and a way to build that call's IR
`Function`. The driver

1. decides whether the group is hot and pays (`Compiler.consider`: a fixed threshold, or the cost
   model `ms_dynvm.cost.model`, told whether the kernel is already in the kernel cache);
2. asks the one fusibility rule (`passes.fuse.refusal`) whether every instruction fuses on the C
   backend under the options (float16/bfloat16 reproducibility included), and refuses the group
   otherwise (counted in the fallback table with the rule's reason);
3. generalises the Function over the signature's symbolic dims (`generalize`: one kernel per shape
   family) and runs the pass pipeline on it (`optimize`: `passes.pipeline` passes that keep every
   result bit-equal to eager, see its docstring), then checks what only lowering can tell
   (`codegen.supports`: slices of symbolic dims, reshapes that cannot be grouped);
4. builds the kernel (`codegen.compile_group`, through the kernel cache), on one background thread
   with `compile_async` (tier-up: the group keeps running eagerly meanwhile, `Compiler.poll`
   installs it later) or in the caller. In the background case the group is lowered and rendered
   in the caller first (`codegen.prepare_group`) and only GCC or the disk cache's load runs on the
   thread: Python there would hold the GIL that every MindSpore op of the caller releases and
   then waits for (up to the interpreter's 5 ms switch interval each time);
5. installs it: `group.kernels[signature] = KernelEntry(kernel, fn, guards)`, counts it, and tells
   the frontend (`on_install`) so that it starts matching the group's first op.

A compile error is a counted fallback with one warning per process, never an error. This module
imports no MindSpore; codegen is looked up at call time (`codegen.compile_group`,
`codegen.supports`), so that tests can put a reference backend in its place.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ms_dynvm.cost.model import CostModel, GroupStats, SizeSwitch
from ms_dynvm.ir.function import Function
from ms_dynvm.metrics import METRICS
from ms_dynvm.runtime.signature import InputDesc, ShapeFamily

MAX_KERNELS_PER_GROUP = 8


class KernelEntry(NamedTuple):
    """One compiled kernel of a group: the kernel, the (generalised) Function it computes, and the
    guards of its signature."""

    kernel: object
    fn: Function
    guards: list


class Building(NamedTuple):
    """A compile in flight for an observed signature: the future, the signature the kernel will be
    installed under (the generalised one, or a static one), the Function it compiles."""

    future: object
    sig: object
    fn: Function


@dataclass(kw_only=True)
class GroupKernels:
    """What the executor keeps per group, whatever the frontend that records it."""

    family: ShapeFamily = field(default_factory=ShapeFamily)
    stats: GroupStats = field(default_factory=GroupStats)
    kernels: dict = field(default_factory=dict)  # Signature -> KernelEntry
    launches: dict = field(default_factory=dict)  # input (dtype, shape, strides)s -> launch.Launch
    families: dict = field(default_factory=dict)  # Signature -> launch.Family (see launch.find_family)
    switch: SizeSwitch = field(default_factory=SizeSwitch)  # serve or not, per size class
    building: dict = field(default_factory=dict)  # observed Signature -> Building
    on_disk: dict = field(default_factory=dict)  # observed Signature -> its kernel is cached (`cached`)


def kernel_opts(opts) -> dict:
    """The options that make a kernel (its source and flags: part of its cache key)."""
    return {"strict_ieee": opts.strict_ieee, "fast_math": opts.fast_math, "eager_math": opts.eager_math}


def symbol_marks(fn: Function, sig) -> dict:
    """(param register, axis) -> symbol name, for every dim the signature `sig` makes symbolic."""
    return {(r, axis): d for r, (_, _, dims) in zip(fn.params, sig.inputs)
            for axis, d in enumerate(dims) if isinstance(d, str)}


def generalize(fn: Function, sig, family: ShapeFamily, tier: str = "tier1"):
    """(`fn` with the signature's symbols in its param dims and every result type re-inferred, sig).
    When the shape rules cannot express a result symbolically (e.g. a reshape whose target size is
    baked into its attributes), the dims stay static: the returned signature is then the call's
    static one, and the family is frozen so that it stops proposing symbols for this group."""
    from ms_dynvm.passes.shapes import GeneralizeError, generalize as _generalize

    if not sig.symbols():
        return fn, sig
    try:
        return _generalize(fn, symbol_marks(fn, sig)), sig
    except GeneralizeError:
        METRICS.fallbacks[f"{tier}: kept static (not generalisable)"] += 1
        family.frozen = True
        family.dynamic.clear()
        static = family.signature([InputDesc(fn.types[r].dtype, tuple(fn.types[r].shape),
                                             fn.types[r].layout) for r in fn.params])
        return fn, static


def optimize(fn: Function, tier: str = "tier1") -> Function:
    """`fn` through the pass pipeline (`passes.pipeline.PIPELINE`: dce, cse, simplify, fold, dce),
    once. Every pass keeps each value bit for bit and keeps the params and the outputs' positions
    (an output may become another register holding the same value), which is all the kernel's
    calling convention needs. A pass that fails leaves the group as it was (counted)."""
    from ms_dynvm.passes.pipeline import PIPELINE, run_pipeline

    try:
        return run_pipeline(fn, PIPELINE)
    except Exception as e:  # noqa: BLE001 - an optimisation is never needed for correctness
        METRICS.fallbacks[f"{tier}: pass pipeline error ({type(e).__name__})"] += 1
        return fn


def _timed(cache, make):
    """(make(), seconds, gcc runs, disk-cache loads); on the compile thread or not. (One compile
    thread: the cache's counters move for this build only.)"""
    before = cache.stats()
    t0 = time.perf_counter()
    out = make()
    dt = time.perf_counter() - t0
    after = cache.stats()
    return (out, dt, after.get("compiles", 0) - before.get("compiles", 0),
            after.get("disk_hits", 0) - before.get("disk_hits", 0))


def build(fn: Function, cache, opts: dict):
    """(kernel, seconds, gcc runs, disk-cache loads) for group `fn`."""
    from ms_dynvm import codegen

    return _timed(cache, lambda: codegen.compile_group(fn, cache=cache, **opts))


class _Prepared(NamedTuple):
    future: object
    finish: Callable


_POOL = None


def compile_pool():
    """The background compile thread (one: gcc and MindSpore share two cores on small machines)."""
    global _POOL
    if _POOL is None:
        import concurrent.futures

        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dvm-compile")
    return _POOL


class Compiler:
    """Compiles and installs the kernels of the groups of one frontend (see the module docstring).

    `on_install(group)` is called after a kernel of `group` is installed; `generation` counts the
    kernels installed (the step switch ages its measurements with it); `exiting` (set at interpreter
    exit) stops new compiles. `tier` prefixes the fallback table's keys ("tier1: unsupported (...)")."""

    def __init__(self, opts, on_install: Callable, tier: str = "tier1") -> None:
        self.opts = opts
        self.tier = tier
        self.cost = CostModel(threshold=opts.compile_threshold)
        self.on_install = on_install
        self.generation = 0
        self.exiting = False
        self._warned = False

    def reset(self, opts) -> None:
        """New options (a new enable()); what was learned (the cost model's compile times) stays."""
        self.opts = opts
        self.exiting = False

    def consider(self, g: GroupKernels, sig, n_steps: int, make_fn: Callable[[], Function]) -> None:
        """A recorded call of group `g` with observed signature `sig` (of its `n_steps` ops; its
        Function from `make_fn()`): install finished compiles, and compile for `sig` when the group
        is hot and no kernel for `sig` exists or is being built."""
        st = g.stats
        if g.building:
            self.poll(g)
        if sig in g.kernels or sig in g.building or st.failed:
            return
        if len(g.kernels) + len(g.building) >= MAX_KERNELS_PER_GROUP:
            # A group that cannot be generalised would compile once per shape: stop at a bound.
            st.failed = True
            METRICS.fallbacks[f"{self.tier}: too many shapes for a static group"] += 1
            return
        opts = self.opts
        fn = None
        if opts.compile_policy == "threshold":
            hot = st.calls >= opts.compile_threshold
        else:
            cached = False
            if st.calls >= self.cost.threshold and not st.compiled:
                # A kernel already in the cache (a warm disk cache: an earlier process) costs a
                # load, not a compile, in the cost model. Looked up once per signature (it renders
                # the kernel's source for the key).
                cached = g.on_disk.get(sig)
                if cached is None:
                    fn = make_fn()
                    cached = g.on_disk[sig] = self.cached(sig, fn)
            hot = self.cost.should_compile(st, n_steps, cached=cached, background=opts.compile_async)
        if hot:
            # Generalise the function of THIS call: the signature's symbols group this call's dims.
            self.compile(g, sig, fn or make_fn())

    def cached(self, sig, fn: Function) -> bool:
        """Whether the kernel `compile` would build for `fn` is in the kernel cache already (memory
        or disk). False where it cannot tell (unsupported, no compiler): the compile decides then."""
        from ms_dynvm import codegen
        from ms_dynvm.passes.shapes import generalize as _generalize
        from ms_dynvm.runtime.cache import default_cache

        try:
            # (`generalize` without its side effects: a group that cannot be generalised is only
            # frozen, and counted, by the compile itself)
            marks = symbol_marks(fn, sig)
            gfn = _generalize(fn, marks) if marks else fn
            key = codegen.kernel.kernel_key(optimize(gfn, self.tier), **kernel_opts(self.opts))[0]
            return default_cache().has(key)
        except Exception:  # noqa: BLE001 - a guess for the cost model, never an error
            return False

    def compile(self, g: GroupKernels, sig, fn: Function) -> None:
        """Compile group `g` for observed signature `sig` from `fn` (the Function of a call)."""
        if self.exiting:  # the block closed by the exit handler made it hot: nothing will run it
            return
        from ms_dynvm import codegen
        from ms_dynvm.passes.fuse import refusal

        opts = self.opts
        why = refusal(fn, backend="c", eager_math=opts.eager_math)
        if why is not None:
            g.stats.failed = True
            METRICS.fallbacks[f"{self.tier}: unsupported ({why})"] += 1
            return
        key_sig = sig  # the observed signature (generalize may fall back to a static one)
        fn, sig = generalize(fn, sig, g.family, self.tier)
        fn = optimize(fn, self.tier)
        ok, why = codegen.supports(fn)
        if not ok:
            g.stats.failed = True
            METRICS.fallbacks[f"{self.tier}: unsupported ({why})"] += 1
            return
        from ms_dynvm.runtime.cache import default_cache

        job = (fn, default_cache(), kernel_opts(opts))
        if opts.compile_async:
            # Tier-up: gcc runs on a background thread while the group keeps running eagerly; the
            # kernel is installed at the group's next recorded run after it is ready (`poll`).
            # Lowering and rendering (Python) run here, not there: a Python thread holding the GIL
            # makes every GIL release of this one (each MindSpore op) wait the interpreter's 5 ms
            # switch interval. (A backend put in codegen's place, in tests, is run whole there.)
            from ms_dynvm.codegen import kernel as _kernel

            if codegen.compile_group is _kernel.compile_group:
                try:
                    obtain, finish = codegen.prepare_group(fn, cache=job[1], **job[2])
                except Exception as e:  # noqa: BLE001 - a backend refusal is a fallback, never an error
                    self._failed(g, e)
                    return
                fut = _Prepared(compile_pool().submit(_timed, job[1], obtain), finish)
                g.building[key_sig] = Building(fut, sig, fn)
                return
            g.building[key_sig] = Building(compile_pool().submit(build, *job), sig, fn)
            return
        try:
            built = build(*job)
        except Exception as e:  # noqa: BLE001 - a compiler failure is a fallback, never an error
            self._failed(g, e)
            return
        self._install(g, sig, fn, built)

    def poll(self, g: GroupKernels) -> None:
        """Install the kernels of `g` whose background compiles have finished."""
        for key_sig, b in list(g.building.items()):
            fut = b.future.future if type(b.future) is _Prepared else b.future
            if not fut.done():
                continue
            del g.building[key_sig]
            try:
                built = fut.result()
                if type(b.future) is _Prepared:  # (the kernel object made here, from the library)
                    built = (b.future.finish(built[0]),) + tuple(built[1:])
            except Exception as e:  # noqa: BLE001 - a compiler failure is a fallback, never an error
                self._failed(g, e)
                continue
            self._install(g, b.sig, b.fn, built)

    def _failed(self, g: GroupKernels, e: Exception) -> None:
        g.stats.failed = True
        METRICS.fallbacks[f"{self.tier}: compile error ({type(e).__name__})"] += 1
        if not self._warned:
            from ms_dynvm.codegen import gcc
            from ms_dynvm.warn import warn_once

            if isinstance(e, gcc.CompilerUnavailable):  # one warning per process, the hot path's or this
                warn_once("no-compiler", f"ms_dynvm: no C compiler ({e}): compiling a fused group failed, "
                          "fused groups run eagerly", stacklevel=4)
            else:
                warnings.warn(f"ms_dynvm: compiling a fused group failed, running it eagerly: {e}",
                              RuntimeWarning, stacklevel=4)
            self._warned = True

    def _install(self, g: GroupKernels, sig, fn: Function, built) -> None:
        kernel, dt, compiled, disk_hits = built
        if compiled:
            self.cost.record_compile(dt)
        METRICS.compiles += compiled
        METRICS.disk_cache_hits += disk_hits
        METRICS.compile_seconds += dt  # time spent obtaining kernels: gcc, or a disk-cache load
        METRICS.cache_misses += 1
        if not g.kernels:
            METRICS.groups_compiled += 1
        g.kernels[sig] = KernelEntry(kernel, fn, sig.guards())
        self.generation += 1
        g.families.pop(sig, None)
        g.stats.compiled = True
        self.on_install(g)
