"""jit/optim.py: the fused C step gives the NumPy rules' bits (Adam, Adam nesterov, SGD)."""

from __future__ import annotations

import numpy as np
import pytest

from ms_dynvm.jit import optim

pytestmark = pytest.mark.skipif(not optim.available(), reason="no C compiler")

SHAPES = [(32, 32), (32,), (32, 64), (0,), (7, 3), (1,)]


def _arrays(rng, scale=1.0, positive=False):
    out = []
    for s in SHAPES:
        a = rng.standard_normal(s).astype(np.float32) * np.float32(scale)
        out.append(np.abs(a) if positive else a)
    return out


@pytest.mark.parametrize("nesterov", [False, True])
def test_fused_adam_equals_numpy_rule_bit_for_bit(nesterov):
    rng = np.random.default_rng(0)
    p, m, v = _arrays(rng), _arrays(rng, 0.1), _arrays(rng, 0.01, positive=True)
    p2, m2, v2 = [a.copy() for a in p], [a.copy() for a in m], [a.copy() for a in v]
    fused = optim.FusedStep("adam", p2, m2, v2)
    b1p = b2p = 1.0
    for step in range(5):
        g = _arrays(rng, 10.0 ** (step - 2))
        b1p, b2p = float(np.float32(b1p) * np.float32(0.9)), float(np.float32(b2p) * np.float32(0.999))
        optim.adam(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, b1p, b2p, nesterov)
        fused([a.ctypes.data for a in g], 1e-3, 0.9, 0.999, 1e-8, b1p, b2p, nesterov)
        for a, b in zip(p + m + v, p2 + m2 + v2):
            assert a.tobytes() == b.tobytes()
    assert not np.array_equal(p[0], _arrays(np.random.default_rng(0))[0])  # (the parameters moved)


def test_fused_sgd_equals_numpy_rule_bit_for_bit():
    rng = np.random.default_rng(1)
    p = _arrays(rng)
    p2 = [a.copy() for a in p]
    fused = optim.FusedStep("sgd", p2)
    for _ in range(3):
        g = _arrays(rng)
        optim.sgd(p, g, [None] * len(p), [None] * len(p), 0.05, 0.0, 0.0, False)
        fused([a.ctypes.data for a in g], 0.05)
        for a, b in zip(p, p2):
            assert a.tobytes() == b.tobytes()


def test_fused_step_refuses_arrays_it_cannot_update_in_place():
    with pytest.raises(ValueError):
        optim.FusedStep("sgd", [np.zeros((4, 4), np.float64)])
    with pytest.raises(ValueError):
        optim.FusedStep("sgd", [np.zeros((4, 4), np.float32)[:, ::2]])
