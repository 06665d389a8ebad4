"""Served (fused, C backend) exp, tanh and mish give what eager gives where MindSpore's own CPU
kernels are not the true function (`eager_math`, the default: see codegen/cmath._EAGER_C): tanh on
3.9 < |x| <= 5 (its Pade approximant, up to 1e-4 off) and past 5 (+-1), exp above |x| = 38 (2e-5
relative), mish above 44.36 (NaN). With `eager_math=False` the served values are the true
functions' instead, and differ from eager there."""

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import ops  # noqa: E402

import ms_dynvm  # noqa: E402
from ms_dynvm.frontend import dispatch  # noqa: E402

ms.runtime.launch_blocking()

X = np.concatenate([np.linspace(3.5, 6.5, 3001), -np.linspace(3.5, 6.5, 3001), np.linspace(38, 88.7, 2000),
                    np.linspace(-87, -38, 2000), [44.0, 44.37, 50.0, np.inf, -np.inf, np.nan]]).astype(np.float32)


def step():
    x = ms.Tensor(X)
    return ops.tanh(x * 1.0) + 0.0, ops.exp(x * 1.0) * 1.0, ops.mish(x * 1.0) * 1.0


def _run(step, n, **opts):
    """Values of `step()` (its tensors as arrays) over n calls, eagerly without opts, else under
    `enable(compile_policy="threshold", **opts)` from a fresh tier 1; and the fused-op count."""
    ms_dynvm.disable()
    dispatch.forget_compiled()
    ms_dynvm.reset_stats()
    if opts:
        ms_dynvm.enable(compile_policy="threshold", **opts)
    try:
        outs = [[t.asnumpy() for t in step()] for _ in range(n)]
        return outs, ms_dynvm.stats()["fused_ops"]
    finally:
        ms_dynvm.disable()
        dispatch.forget_compiled()


def _same(a, b):
    return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)) or
                np.array_equal(a, b, equal_nan=True))


def test_served_exp_tanh_mish_equal_eager_where_mindspore_is_inexact():
    eager, _ = _run(step, 1)
    served, fused = _run(step, 6, eager_math=True)
    assert fused > 0
    for outs in served:  # served or (size switch probes) eager: the same values either way
        for k, (a, b) in enumerate(zip(outs, eager[0])):
            # (mish: last-bit differences, up to 1.1e-6 relative near x = -3.5; exp: results near
            # FLT_MIN, which MindSpore gives as 0 in some lanes of its thread pool)
            ok = np.isclose(a, b, rtol=1e-6 if k < 2 else 1e-5, atol=1e-37 if k < 2 else 1e-6, equal_nan=True)
            assert ok.all(), (k, X[~ok][:4], a[~ok][:4], b[~ok][:4])
            assert (np.isnan(a) == np.isnan(b)).all(), k


def test_eager_math_off_serves_the_true_functions():
    eager, _ = _run(step, 1)
    served, fused = _run(step, 6, eager_math=False)
    assert fused > 0
    true_tanh = np.tanh(X.astype(np.float64))
    # Calls in which the tanh group was served (the others ran it eagerly: the size switch's probes)
    # give the true tanh, which differs from eager's on 3.9 < |x| < 6.1.
    hits = [outs for outs in served if np.allclose(outs[0], true_tanh, rtol=3e-7, atol=1e-7, equal_nan=True)]
    assert hits, "tanh never served"
    for tanh, exp, mish in hits:
        assert not np.allclose(tanh, eager[0][0], rtol=1e-5, atol=1e-6, equal_nan=True)
    mish_served = [outs[2] for outs in served if (outs[2][X == 50.0] == 50.0).all()]
    assert mish_served and np.isnan(eager[0][2][X == 50.0]).all()


def test_a_product_and_a_following_add_round_apart_as_in_eager():
    """Eager rounds `x * a` and then `+ b` (two ops); a kernel must not contract them into one fma
    (cmath.dvm_keepf): served results are then bit-identical to eager's, and an exact 0 stays 0
    (FloorMod of 1 by a tiny divisor: x - floor(x/y)*y, which an fma made -8.6e-17, and the
    remainder by it NaN, which became a finite number)."""
    rng = np.random.default_rng(0)
    a = ms.Tensor(rng.standard_normal((64, 33)).astype(np.float32))
    b = ms.Tensor(rng.standard_normal((64, 33)).astype(np.float32))
    tiny = ms.Tensor(np.array([[-3.0703977e-21, 3e-21, 1e-3, -0.3]], np.float32))
    half = ms.Tensor(np.array([[0.1, 0.2, 0.3, 0.4]], np.float32))

    def step():
        r = True % tiny
        return [(a * 1.7 + b) * a - b, r, ms.mint.remainder(half, r)]

    (want,), _ = _run(step, 1)
    got, fused = _run(step, 6, eager_math=True)
    assert fused > 0
    for outs in got:
        for x, w in zip(outs, want):
            assert _same(x, w)


def test_float64_masked_fill_with_a_python_float_computes_in_float32_as_eager():
    """`ops.masked_fill(x_f64, mask, 2.5)` dispatches MaskedFill with a float32 value, which MindSpore
    2.10 computes in float32: the unmasked values come back rounded to float32 (1e300 becomes inf).
    Recorded, interpreted and served, the VM does the same."""
    x = ms.Tensor(np.array([[0.1257302210933933, 1e-300, 300.0, 1e300, np.pi]] * 3, np.float64))

    def step():
        return [ops.masked_fill(x, x == 300.0, -0.0) * 1.0]

    want = step()[0].asnumpy()
    assert want[0, 3] == np.inf and want[0, 0] == np.float64(np.float32(0.1257302210933933))
    with ms_dynvm.record() as rec:
        step()
    got = ms_dynvm.interpret(rec.program, [t.asnumpy() for t in rec.inputs])
    assert _same(got[-1], want)
    outs, fused = _run(step, 6, eager_math=True)
    assert fused > 0
    for (o,) in outs:
        assert _same(o, want)
