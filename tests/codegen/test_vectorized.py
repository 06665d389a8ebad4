"""Every float32 math function of the kernels vectorises: compiled exactly as a generated kernel
uses it (a `y[i] = f(x[i])` loop over restrict pointers, `gcc.flags()`), GCC must report the loop
vectorised (`-fopt-info-vec-optimized`). A scalar loop is a silent 4-8x slowdown with unchanged
results, which no value test sees: a float -> int32 cast in the MindSpore-formula exp (`eager_math`, the
default) once kept every loop calling it (exp, sigmoid, silu, elu, mish) scalar, and the chain
benchmark's exp kernel took ~220 us at 72 x 784 instead of ~40."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from ms_dynvm.codegen import cmath, gcc

pytestmark = pytest.mark.skipif(shutil.which(gcc.GCC) is None, reason="needs gcc")

# name -> C expression of x[i] (d[i]: a second input), as c.py renders the ops
EXPRS = {
    **{f: f"dvm_{f}(x[i])" for f in ("exp", "expm1", "log", "log1p", "log2", "tanh", "sigmoid", "erf",
                                      "erfc", "gelu_erf", "gelu_tanh", "mish")},
    "elu": "dvm_elu(x[i], 1.0f)",
    "softplus": "dvm_softplus(x[i], 1.0f, 20.0f)",
    "silu_grad": "dvm_silu_grad(d[i], x[i])",
    "gelu_grad_erf": "dvm_gelu_grad_erf(d[i], x[i])",
    "gelu_grad_tanh": "dvm_gelu_grad_tanh(d[i], x[i])",
    # MindSpore's formulas (eager_math, the default)
    **{f"{f}_ms": f"dvm_{f}_ms(x[i])" for f in ("exp", "expm1", "log1p", "tanh", "sigmoid", "mish", "log")},
    "silu_ms": "x[i] * dvm_sigmoid_ms(x[i])",
    "silu_grad_ms": "dvm_silu_grad_ms(d[i], x[i])",
    "tanh_grad_fma": "d[i] * fmaf(-x[i], x[i], 1.0f)",
    "elu_ms": "dvm_elu_ms(x[i], 1.0f)",
    "keepf_product": "dvm_keepf(x[i] * d[i]) + 1.0f",
}


def _report(tmp_path, fast: bool, march: str = "native") -> tuple[dict, str]:
    lines, first = {}, cmath.MATH_C.count("\n") + 1
    loops = []
    for k, (name, e) in enumerate(EXPRS.items()):
        loops.append(f"void v_{name}(const float *restrict x, const float *restrict d, float *restrict y, "
                     f"long n) {{ for (long i = 0; i < n; i++) y[i] = {e}; }}")
        lines[name] = first + k
    src = tmp_path / "v.c"
    src.write_text(cmath.MATH_C + "\n".join(loops) + "\n")
    flags = [f"-march={march}" if f == "-march=native" else f
             for f in gcc.flags(fast_math=fast) if f not in ("-shared", "-fPIC")]
    proc = subprocess.run([shutil.which(gcc.GCC), *flags, "-c", "-fopt-info-vec-optimized", str(src), "-o",
                           os.fspath(tmp_path / "v.o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return lines, proc.stderr


# The kernels are built with -march=native; the loops must vectorise whatever the processor's SIMD
# level, so they are also checked for AVX2 (x86-64-v3) and AVX-512 (x86-64-v4) on any machine (only
# compiled here, not run). gcc 12 and 13 differ in what they if-convert: the math is written so that
# both vectorise every loop.
@pytest.mark.parametrize("march", ["native", "x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("fast", [False, True])
def test_every_math_loop_vectorises(tmp_path, fast, march):
    if march != "native" and not gcc._accepts(f"-march={march}"):
        pytest.skip(f"{gcc.GCC} does not know -march={march}")
    lines, report = _report(tmp_path, fast, march)
    vectorised = {int(m.group(1)) for m in re.finditer(r"v\.c:(\d+):\d+: optimized: loop vectorized", report)}
    scalar = [name for name, line in lines.items() if line not in vectorised]
    assert not scalar, f"loops not vectorised: {scalar}"
