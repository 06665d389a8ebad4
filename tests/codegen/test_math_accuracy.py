"""Maximum error, in float32 ulp, of the vectorised math in `codegen/cmath.py` against float64
references, over a dense sweep of float32 bit patterns (every 1021st: ~4.2M values covering all
binades, subnormals included) plus NaN, +-Inf, +-0, subnormals and large |x|. The bounds asserted are
the measured maxima rounded up (documented in cmath's docstring); the functions are compiled exactly
as kernels use them (same flags, vectorised loop)."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from ms_dynvm.codegen import cmath, gcc

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])

# name -> (float64 reference, |x| domain limit, asserted max ulp)
REFS = {
    "exp": (np.exp, None, 1.0),
    "expm1": (np.expm1, None, 2.0),
    "log": (np.log, None, 1.0),
    "log1p": (np.log1p, None, 3.0),
    "tanh": (np.tanh, None, 2.0),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), None, 3.0),
    "erf": (_erf, 12.0, 2.0),
    "erfc": (_erfc, 12.0, 3.0),
    "gelu_erf": (lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)), 10.0, 4.0),
}
EDGE = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-38, 1.17549435e-38, 88.72283,
                 88.7229, -87.3, -103.9, -104.0, 1e30, -1e30, 3.4e38, -3.4e38, 0.34657359, -0.34657359, 1.0,
                 -1.0, 0.5, 2.0, 10.06, -10.06, 9.2], np.float32)


@pytest.fixture(scope="module")
def lib():
    loops = "\n".join(
        f"void v_{f}(const float *restrict x, float *restrict y, long n) "
        f"{{ for (long i = 0; i < n; i++) y[i] = dvm_{f}(x[i]); }}" for f in REFS
    )
    return gcc.load_shared(gcc.compile_shared(cmath.MATH_C + loops, gcc.flags()))


def _run(lib, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    getattr(lib, "v_" + name)(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_long(x.size))
    return y


def ulp_errors(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in units of the float32 spacing at ref (2^-149 below the normal range)."""
    with np.errstate(all="ignore"):
        r32 = ref.astype(np.float32)
        a = np.abs(r32)
        tiny = np.finfo(np.float32).tiny
        sp = np.where(a < tiny, 2.0**-149, np.spacing(np.maximum(a, tiny)).astype(np.float64))
        e = np.abs(y.astype(np.float64) - ref) / sp
    same = (y == r32) | (np.isnan(y) & np.isnan(ref))
    e[same] = 0.0
    e[np.isnan(y) != np.isnan(ref)] = np.inf
    e[np.isinf(r32) & (y != r32)] = np.inf
    return e


def sweep() -> np.ndarray:
    x = np.arange(0, 2**32, 1021, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([x[np.isfinite(x)], EDGE])


@pytest.mark.parametrize("name", list(REFS))
def test_max_ulp(lib, name):
    ref_fn, limit, bound = REFS[name]
    x = sweep()
    if limit is not None:
        x = x[~(np.abs(x) > limit)]  # keeps NaN
    y = _run(lib, name, x)
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64))
    e = ulp_errors(y, ref)
    worst = int(np.argmax(e))
    assert e[worst] <= bound, f"{name}: {e[worst]:.2f} ulp at x={x[worst]!r}: got {y[worst]!r}, want {ref[worst]!r}"


def test_special_values(lib):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    assert np.isnan(_run(lib, "exp", x)[0]) and _run(lib, "exp", x)[1:].tolist() == [np.inf, 0.0, 1.0, 1.0]
    assert _run(lib, "log", x)[1:].tolist()[:1] == [np.inf] and np.isnan(_run(lib, "log", x)[2])
    assert _run(lib, "log", x)[3] == -np.inf
    assert _run(lib, "tanh", x)[1:3].tolist() == [1.0, -1.0] and np.signbit(_run(lib, "tanh", x)[4])
    assert _run(lib, "erf", x)[1:3].tolist() == [1.0, -1.0]
    assert _run(lib, "erfc", x)[1:3].tolist() == [0.0, 2.0]
    assert _run(lib, "sigmoid", x)[1:3].tolist() == [1.0, 0.0]
    assert _run(lib, "expm1", x)[1:3].tolist() == [np.inf, -1.0]
    assert all(np.isnan(_run(lib, f, x[:1])[0]) for f in REFS)
    # signed zeros: odd functions keep the sign of -0, erfc/exp/sigmoid of +-0 are exact
    for f in ("tanh", "erf", "expm1"):
        y = _run(lib, f, x[3:5])
        assert y.tolist() == [0.0, 0.0] and not np.signbit(y[0]) and np.signbit(y[1]), f
    assert _run(lib, "erfc", x[3:5]).tolist() == [1.0, 1.0] and _run(lib, "sigmoid", x[3:5]).tolist() == [0.5, 0.5]
    # gelu's limits: x itself above, -0 below (0.5*x*erfc never reaches Inf*0)
    g = _run(lib, "gelu_erf", np.array([np.inf, -np.inf, 30.0, -30.0, -1e30], np.float32))
    assert g[0] == np.inf and g[2] == 30.0 and all(v == 0.0 and np.signbit(v) for v in g[[1, 3, 4]])
    # overflow/underflow thresholds of exp and expm1 (largest finite / first overflowing input, first input
    # rounding to 0 / last rounding to 2^-149)
    t = np.array([88.72283172607422, 88.72283935546875, -103.97208404541016, -103.97207641601562, -17.5],
                 np.float32)
    e = _run(lib, "exp", t)
    assert np.isfinite(e[0]) and e[1] == np.inf and e[2] == 0.0 and e[3] == 2.0**-149
    m = _run(lib, "expm1", t)
    assert np.isfinite(m[0]) and m[1] == np.inf and m[4] == -1.0


# One loop per line; every one must vectorise (a regression here costs ~8x, and before the rewrite of
# dvm_log's special cases a log after an exp -- softplus, mish -- did not vectorise at all).
VECTOR_LOOPS = [
    "dvm_gelu_erf(x[i]) + dvm_tanh(x[i]) + dvm_log1p(x[i])",
    "dvm_exp(x[i]) + dvm_expm1(x[i]) + dvm_sigmoid(x[i])",
    "dvm_erf(x[i]) + dvm_erfc(x[i]) + dvm_log2(x[i])",
    "dvm_softplus(x[i], 1.0f, 20.0f)",
    "dvm_mish(x[i])",
    "dvm_log(dvm_exp(x[i]))",
    "dvm_gelu_grad_erf(x[i], x[i]) + dvm_silu_grad(x[i], x[i]) + dvm_gelu_grad_tanh(x[i], x[i])",
]


@pytest.mark.parametrize("fast", [False, True])
def test_the_loops_vectorise(fast):
    """The math must not block vectorisation (a regression here costs ~8x)."""
    import os
    import subprocess
    import tempfile

    lines = [f"void v{k}(const float *restrict x, float *restrict y, long n) "
             f"{{ for (long i = 0; i < n; i++) y[i] = {e}; }}" for k, e in enumerate(VECTOR_LOOPS)]
    first = cmath.MATH_C.count("\n") + 1
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "v.c")
        with open(path, "w") as f:
            f.write(cmath.MATH_C + "\n".join(lines) + "\n")
        proc = subprocess.run([gcc.GCC, *gcc.flags(fast_math=fast), "-fopt-info-vec-optimized", path, "-o",
                               os.path.join(d, "v.so")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    done = {ln for ln in proc.stderr.splitlines() if "loop vectorized" in ln}
    for k, e in enumerate(VECTOR_LOOPS):
        assert any(f"v.c:{first + k}:" in ln for ln in done), f"not vectorised: {e}"
