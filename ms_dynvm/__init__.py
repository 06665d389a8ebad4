"""ms_dynvm: a just-in-time compiler and runtime for MindSpore's eager (PyNative) mode.

`ms_dynvm.enable()` at the top of a script is the whole user-facing change. The core layers
(bytecode, ir, passes, cost, codegen, runtime) import without MindSpore; only `ms_dynvm.frontend`
imports it, and it is imported on first use of a frontend function, so `import ms_dynvm` works on
machines without MindSpore (the GPU machine).
"""

from __future__ import annotations

from ms_dynvm.bytecode.program import Program, load_program
from ms_dynvm.metrics import reset_stats, stats

__version__ = "0.1.0"


def enable(**options) -> None:
    """Turn ms_dynvm on for this thread (options: see README or `ms_dynvm.frontend.options`)."""
    from ms_dynvm.frontend.dispatch import enable as _enable

    _enable(**options)


def disable() -> bool:
    """Turn ms_dynvm off; False if it was not on."""
    from ms_dynvm.frontend.dispatch import disable as _disable

    return _disable()


def enabled(**options):
    """Context manager: `with ms_dynvm.enabled(): ...`."""
    from ms_dynvm.frontend.dispatch import enabled as _enabled

    return _enabled(**options)


def is_enabled() -> bool:
    import sys

    mod = sys.modules.get("ms_dynvm.frontend.dispatch")
    return bool(mod and mod.is_enabled())


def record(**options):
    """Context manager: `with ms_dynvm.record() as rec: out = net(x)`; then `rec.program`,
    `rec.inputs`, `rec.outputs`."""
    from ms_dynvm.frontend.dispatch import record as _record

    return _record(**options)


def interpret(program, inputs, **kwargs):
    """Run `program` with the NumPy reference interpreter: `inputs` are arrays in
    `program.inputs` order; returns the arrays of `program.outputs`."""
    from ms_dynvm.runtime.interpreter import interpret as _interpret

    return _interpret(program, inputs, **kwargs)


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


__all__ = ["Program", "disable", "enable", "enabled", "interpret", "is_enabled", "load_program",
           "record", "reset_stats", "run_program", "stats", "__version__"]
