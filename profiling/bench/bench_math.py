"""Per-element cost of the vectorised float32 math in `codegen/cmath.py`, old vs new.

Each function is compiled into its own loop exactly as the generated kernels use it
(`y[i] = dvm_f(x[i])` over restrict pointers, `gcc.compile_shared` with `gcc.flags()`, so -O3
-march=native and GCC's auto-vectorisation) and timed on a 72x784 = 56,448-element float32 array
(the chain workload of bench_tier1.py; the row `chain` is that workload's whole elementwise chain in
one loop). Inputs are N(0, 3^2) (the cost does not depend on the values: the code is branch-free).
Reported: median ns/element over --repeats calls (each call one pass over the array, in a fresh
shuffled order of functions per round so drift hits all equally), for the current MATH_C ("new")
and for MATH_C at git revision --old-rev ("old", default b211bfa, the last revision with the
previous math). A `copy` loop gives the memory floor. The machine is noisy: compare medians of
one run (both sides are measured interleaved), not numbers across runs.

    python profiling/bench/bench_math.py [--repeats 300] [--old-rev b211bfa] [--no-old] [--fast]

--fast compiles with -DDVM_FAST=1 (the fast_math library) for both sides.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from ms_dynvm.codegen import cmath, gcc  # noqa: E402

N = 72 * 784
UNARY = ["exp", "expm1", "log", "log1p", "log2", "tanh", "sigmoid", "erf", "erfc", "gelu_erf", "gelu_tanh",
         "mish"]
# name -> C expression of x[i] (and d[i] for the gradients), as c.py renders these ops
OTHER = {
    "silu": "x[i] * dvm_sigmoid(x[i])",
    "elu": "dvm_elu(x[i], 1.0f)",
    "softplus": "dvm_softplus(x[i], 1.0f, 20.0f)",
    "silu_grad": "dvm_silu_grad(d[i], x[i])",
    "gelu_grad_erf": "dvm_gelu_grad_erf(d[i], x[i])",
    "gelu_grad_tanh": "dvm_gelu_grad_tanh(d[i], x[i])",
    # bench_tier1's elementwise chain tanh(relu(exp(x*0.5-1)*m + x) - 0.25) as one fused loop
    "chain": "dvm_tanh(((t = dvm_exp(x[i] * 0.5f - 1.0f) * d[i] + x[i]) > 0.0f ? t : 0.0f) - 0.25f)",
    # MindSpore's own formulas (cmath._EAGER_C: eager_math, the default)
    **{f"{f}_ms": f"dvm_{f}_ms(x[i])" for f in ("exp", "expm1", "log1p", "tanh", "sigmoid", "mish")},
    "silu_ms": "x[i] * dvm_sigmoid_ms(x[i])",
    "elu_ms": "dvm_elu_ms(x[i], 1.0f)",
    "chain_ms": "dvm_tanh_ms(((t = dvm_exp_ms(x[i] * 0.5f - 1.0f) * d[i] + x[i]) > 0.0f ? t : 0.0f) - 0.25f)",
}


def old_math_c(rev: str) -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = subprocess.run(["git", "show", f"{rev}:ms_dynvm/codegen/cmath.py"], cwd=here, capture_output=True,
                          text=True, check=True).stdout
    ns: dict = {}
    exec(compile(text, f"cmath@{rev}", "exec"), ns)  # our own file at a past revision
    return ns["MATH_C"]


def build(math_c: str, fast: bool) -> ctypes.CDLL:
    exprs = {"copy": "x[i]", **{f: f"dvm_{f}(x[i])" for f in UNARY}, **OTHER}
    # Functions an older revision does not have are left out of its library.
    exprs = {k: e for k, e in exprs.items()
             if all(f"{ident}(" in math_c for ident in re.findall(r"dvm_\w+", e))}
    loops = "\n".join(
        f"void v_{name}(const float *restrict x, const float *restrict d, float *restrict y, long n) "
        f"{{ float t; for (long i = 0; i < n; i++) y[i] = {e}; }}" for name, e in exprs.items()
    )
    lib = gcc.load_shared(gcc.compile_shared(math_c + loops, gcc.flags(fast_math=fast)))
    lib._names = list(exprs)
    return lib


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--old-rev", default="b211bfa")
    ap.add_argument("--no-old", action="store_true")
    ap.add_argument("--fast", action="store_true")
    args = ap.parse_args()

    libs = {"new": build(cmath.MATH_C, args.fast)}
    if not args.no_old:
        libs["old"] = build(old_math_c(args.old_rev), args.fast)
    names = libs["new"]._names

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(N) * 3.0).astype(np.float32)
    d = rng.standard_normal(N).astype(np.float32)
    y = np.empty_like(x)
    xp, dp, yp = (ctypes.c_void_p(a.ctypes.data) for a in (x, d, y))
    n = ctypes.c_long(N)
    fns = [(side, name, getattr(lib, "v_" + name)) for side, lib in libs.items() for name in lib._names]
    for _, _, f in fns:  # warm-up (page faults, frequency)
        for _ in range(5):
            f(xp, dp, yp, n)
    times: dict = {(s, nm): [] for s, nm, _ in fns}
    clock = time.perf_counter_ns
    for _ in range(args.repeats):
        random.shuffle(fns)
        for side, name, f in fns:
            t0 = clock()
            f(xp, dp, yp, n)
            times[(side, name)].append(clock() - t0)

    med = {k: statistics.median(v) / N for k, v in times.items()}
    print(f"ns/element, median of {args.repeats}, n={N} float32, gcc {' '.join(gcc.flags(fast_math=args.fast))}")
    if "old" in libs:
        print(f"{'function':<16}{'old':>8}{'new':>8}{'speedup':>9}")
        for name in names:
            w = med[("new", name)]
            if ("old", name) not in med:
                print(f"{name:<16}{'-':>8}{w:8.3f}")
                continue
            o = med[("old", name)]
            print(f"{name:<16}{o:8.3f}{w:8.3f}{o / w:8.2f}x")
    else:
        print(f"{'function':<16}{'new':>8}")
        for name in names:
            print(f"{name:<16}{med[('new', name)]:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
