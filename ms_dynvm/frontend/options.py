"""Options of `ms_dynvm.enable(**options)`, also settable through `DYNVM_*` environment variables.

An explicit keyword wins over the environment, which wins over the default. Unknown option names raise
TypeError (a typo should not be silently ignored), and so does a keyword of the wrong type (a string
for a boolean, `jit="false"`, would be true; 0 and 1 are taken as booleans); an environment value
that does not parse (`DYNVM_JIT=maybe`) raises ValueError.

| option | env | default | meaning |
|---|---|---|---|
| blocking | DYNVM_BLOCKING | True | call `mindspore.runtime.launch_blocking()` (synchronous CPU execution, MindSpore's fastest eager mode on CPU; it cannot be turned off again in the process) |
| record | DYNVM_RECORD | True | record dispatched ops into bytecode blocks (False: count ops only) |
| cell_boundaries | DYNVM_CELL_BOUNDARIES | "top" | which nn.Cell calls end a basic block: "top" (outermost calls), "all", "none" |
| c_hot_path | DYNVM_C_HOT_PATH | True | the recorder records ops that find their plan in C (`frontend/_crecord.c`, built with gcc at first use and cached on disk); False, or without gcc or Python's headers: in Python (same result) |
| max_block_ops | DYNVM_MAX_BLOCK_OPS | 4096 | a block that grows past this many instructions is closed (reason "limit") |
| jit | DYNVM_JIT | True | tier 1: fuse hot runs of consecutive fusible ops into compiled C kernels (needs record) |
| compile_threshold | DYNVM_COMPILE_THRESHOLD | 2 | calls of a run before the cost model may promote it (1: compile at first sight, for tests) |
| compile_async | DYNVM_COMPILE_ASYNC | True | compile on a background thread while the group keeps running eagerly (tier-up); False: compile inside the call that makes the group hot (tests, benchmarks of compile counts) |
| compile_policy | DYNVM_COMPILE_POLICY | cost | "cost": compile when the cost model says it pays; "threshold": as soon as the threshold is passed (tests, demos) |
| step_switch | DYNVM_STEP_SWITCH | True | with jit: time whole steps (from one call of the anchor, the first outermost nn.Cell or differentiated function seen, to its next call; in a script with neither, from sync point to sync point), per size class, under the VM and bare (plain MindSpore: ms_dynvm's dispatch mode off the stack), and run each size class the faster way (`ms_dynvm/cost/step.py`); False: everything under the VM |
| regions | DYNVM_REGIONS | True | tier 2: calls of gradient functions (`ms.value_and_grad`, `ms.grad`, `ops.GradOperation`), outermost `nn.Cell` calls without gradient, `nn` optimizer steps and `@ms_dynvm.jit` functions are learned from recorded calls and then replayed as one planned program without per-op dispatch (docs/regions.md) |
| kernel_threads | DYNVM_KERNEL_THREADS | 0 | OpenMP threads of fused kernels; 0 = automatic (1 on <= 2 cores, where MindSpore's worker threads occupy the cores) |
| pool_results | DYNVM_POOL_RESULTS | True | kernel results from the memory pool (off: a fresh NumPy array per result) |
| pool_soft_cap_mb | DYNVM_POOL_SOFT_CAP_MB | 256 | memory pool for kernel results: free blocks above this many MiB reserved are returned at safe points |
| pool_heap_trim_mb | DYNVM_POOL_HEAP_TRIM_MB | 8 | memory pool: at a safe point, once the process RSS has grown by more than this many MiB since the last trim, call glibc `malloc_trim(0)` (at most once a second; skipped where unavailable); 0: never |
| strict_ieee | DYNVM_STRICT_IEEE | False | kernels use scalar libm, no contraction, fixed reduction order: bitwise run-to-run reproducible |
| fast_math | DYNVM_FAST_MATH | False | kernels may use looser approximations |
| eager_math | DYNVM_EAGER_MATH | True | the ops exp, expm1, log1p, tanh, mish, sigmoid, silu and elu in kernels use MindSpore CPU's own formulas, and float32 softmax its exp, summation order and division, so fused results equal eager's (MindSpore's exp errs by up to 2e-5 relative for abs(x) > 38, its tanh by up to 1e-4 on 3.9 < abs(x) <= 5 and is +-1 beyond 5, its mish is NaN above 44.36); False: ms_dynvm's own functions (<= 2 ulp) |
| debug | DYNVM_DEBUG | 0 | 1: verify recorded programs; 2: print each closed block's bytecode; 3: also its IR |
| dump_dir | DYNVM_DUMP_DIR | "" | write each closed block's bytecode there (block_<n>.dvm) |
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, fields


def _bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {s!r}")


def _check_type(name: str, v, want: type):
    """A keyword option of the option's type (an int 0/1 for a boolean; numpy integers for ints).
    A string for a boolean is refused: `jit="false"` would be true."""
    if want is bool:
        if isinstance(v, bool) or (isinstance(v, numbers.Integral) and v in (0, 1)):
            return bool(v)
    elif want is int:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            return int(v)
    elif isinstance(v, (str, os.PathLike)):
        return os.fspath(v) if isinstance(v, os.PathLike) else v
    raise TypeError(f"ms_dynvm option {name} must be {want.__name__}, got {type(v).__name__} {v!r}")


@dataclass
class Options:
    blocking: bool = True
    record: bool = True
    cell_boundaries: str = "top"
    max_block_ops: int = 4096
    c_hot_path: bool = True
    jit: bool = True
    compile_threshold: int = 2
    compile_policy: str = "cost"
    compile_async: bool = True
    step_switch: bool = True
    regions: bool = True
    kernel_threads: int = 0
    pool_results: bool = True
    pool_soft_cap_mb: int = 256
    pool_heap_trim_mb: int = 8  # memory_pool.HEAP_TRIM_MB
    strict_ieee: bool = False
    fast_math: bool = False
    eager_math: bool = True
    debug: int = 0
    dump_dir: str = ""

    @staticmethod
    def make(**kwargs) -> "Options":
        names = {f.name: f for f in fields(Options)}
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"unknown ms_dynvm option(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(names)}")
        values = {}
        for name, f in names.items():
            env = os.environ.get("DYNVM_" + name.upper())
            if name in kwargs:
                values[name] = _check_type(name, kwargs[name], type(f.default))
            elif env is not None:
                conv = {bool: _bool, int: int, str: str}[type(f.default)]
                try:
                    values[name] = conv(env)
                except ValueError as e:
                    raise ValueError(f"DYNVM_{name.upper()}: {e}") from None
        opts = Options(**values)
        if opts.cell_boundaries not in ("top", "all", "none"):
            raise ValueError(f"cell_boundaries must be 'top', 'all' or 'none', not {opts.cell_boundaries!r}")
        if opts.compile_policy not in ("cost", "threshold"):
            raise ValueError(f"compile_policy must be 'cost' or 'threshold', not {opts.compile_policy!r}")
        if opts.compile_threshold < 1:
            raise ValueError("compile_threshold must be >= 1")
        if opts.max_block_ops < 1:
            raise ValueError("max_block_ops must be >= 1")
        if opts.kernel_threads < 0:
            raise ValueError("kernel_threads must be >= 0 (0: automatic)")
        if opts.pool_soft_cap_mb < 0:
            raise ValueError("pool_soft_cap_mb must be >= 0")
        if opts.debug not in (0, 1, 2, 3):
            raise ValueError("debug must be 0, 1, 2 or 3")
        if opts.pool_heap_trim_mb < 0:
            raise ValueError("pool_heap_trim_mb must be >= 0 (0: no heap trimming)")
        return opts
