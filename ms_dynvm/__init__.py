"""ms_dynvm: a just-in-time compiler and runtime for MindSpore's eager (PyNative) mode.

`ms_dynvm.enable()` at the top of a script is the whole user-facing change. The core layers
(bytecode, ir, passes, cost, codegen, runtime) import without MindSpore; only `ms_dynvm.frontend`
imports it, and it is imported on first use of a frontend function, so `import ms_dynvm` works on
machines without MindSpore (the GPU machine).
"""

from __future__ import annotations

from ms_dynvm.bytecode.program import Program, load_program
from ms_dynvm.metrics import reset_stats, stats
from ms_dynvm import jit  # (a package that is also the `@ms_dynvm.jit` decorator: see its __init__)
from ms_dynvm.observe import events as _events  # noqa: F401 - DYNVM_PROFILE=1 starts recording at import
from ms_dynvm.version import __version__


def enable(**options) -> None:
    """Turn ms_dynvm on for this thread (options: see README or `ms_dynvm.frontend.options`)."""
    from ms_dynvm.frontend.dispatch import enable as _enable

    _enable(**options)
    _observe_profiler()


def _observe_profiler() -> None:
    """ms_dynvm's events join a MindSpore profile run (observe/profiler.py); never raises."""
    try:
        from ms_dynvm.observe import profiler

        profiler.install()
    except Exception:  # noqa: BLE001 - observability never breaks the script
        pass


def report(path: str = "ms_dynvm_report.html") -> dict:
    """Write what ms_dynvm saw and did as JSON and one self-contained HTML page with plots (step time
    eager vs ms_dynvm per size class, compiles and cache hits over time, top fused groups, fallbacks,
    memory pool); returns {"html": ..., "json": ...} (see `ms_dynvm.observe.report`)."""
    from ms_dynvm.observe.report import write

    return write(path)


def disable() -> bool:
    """Turn ms_dynvm off; False if it was not on."""
    from ms_dynvm.frontend.dispatch import disable as _disable

    return _disable()


def enabled(**options):
    """Context manager: `with ms_dynvm.enabled(): ...`."""
    from ms_dynvm.frontend.dispatch import enabled as _enabled

    _observe_profiler()
    return _enabled(**options)


def is_enabled() -> bool:
    import sys

    mod = sys.modules.get("ms_dynvm.frontend.dispatch")
    return bool(mod and mod.is_enabled())


def record(**options):
    """Context manager: `with ms_dynvm.record() as rec: out = net(x)`; then `rec.program`,
    `rec.inputs`, `rec.outputs`."""
    from ms_dynvm.frontend.dispatch import record as _record

    _observe_profiler()
    return _record(**options)


def interpret(program, inputs, **kwargs):
    """Run `program` with the NumPy reference interpreter: `inputs` are arrays in
    `program.inputs` order; returns the arrays of `program.outputs`."""
    from ms_dynvm.runtime.interpreter import interpret as _interpret

    return _interpret(program, inputs, **kwargs)


def exclude(cell_or_fn):
    """Keep a Cell (its calls) or a function (the gradient functions made of it) out of tier 2."""
    from ms_dynvm.frontend.regions import exclude as _exclude

    return _exclude(cell_or_fn)


def run_program(program, inputs, device: str = "cpu", **options):
    """Run bytecode `program` on `inputs` (arrays in `program.inputs` order) and return the arrays of
    `program.outputs`. device="cpu": the NumPy reference interpreter. device="cuda": the GPU executor
    (`runtime/gpu_executor.py`: fused groups as generated CUDA kernels, matmul through cuBLAS,
    gather/segment sums as kernels); without pycuda or a CUDA device, one warning and the interpreter.
    `options`: strict_ieee / fast_math for the CUDA kernels."""
    if device == "cpu":
        return interpret(program, inputs)
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    from ms_dynvm.codegen.cuda import driver

    if not driver.require("run_program(device='cuda')"):
        return interpret(program, inputs)
    from ms_dynvm.runtime.gpu_executor import executor_for

    return executor_for(program, **options).run(list(inputs))


__all__ = ["exclude", "jit", "Program", "disable", "enable", "enabled", "interpret", "is_enabled", "load_program",
           "record", "report", "reset_stats", "run_program", "stats", "__version__"]
