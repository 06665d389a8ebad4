"""In-place optimizer updates for replayed optimizer calls (tier 2), in float32 NumPy.

MindSpore's `nn` optimizers run their update as a graph (`@jit construct`) that no dispatch hook
sees, so a recording cannot learn them. Instead each supported optimizer has its update rule
written here, after the CPU kernels of the primitives the optimizers call (`SGD`, `ApplyMomentum`,
`Adam`); the frontend (frontend/regions.py) checks a rule against one eager call before it is
used (every parameter and state tensor after the eager update, rtol 1e-5), so a rule that does not
match MindSpore is never replayed. Arrays are views of the parameters' and states' memory: the
updates write through them, as the graph does.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def sgd(params, grads, accums, stats, lr, momentum: float, dampening: float, nesterov: bool) -> None:
    """MindSpore's SGD kernel: with momentum, `accum = grad` at a parameter's first step (stat > 0,
    then stat = 0), else `accum = momentum * accum + (1 - dampening) * grad`; the step is accum, or
    grad + momentum * accum with nesterov; `param -= lr * step`."""
    lr = F32(lr)
    m = F32(momentum)
    for p, g, a, s in zip(params, grads, accums, stats):
        if momentum > 0.0:
            first = s > 0
            if first.all():
                a[...] = g
                s[...] = 0
            elif first.any():
                np.copyto(a, np.where(first, g, a * m + F32(1.0 - dampening) * g))
                s[first] = 0
            else:
                a *= m
                a += F32(1.0 - dampening) * g
            step = g + m * a if nesterov else a
        else:
            step = g
        p -= lr * step


def momentum(params, grads, moments, lr, mom: float, nesterov: bool) -> None:
    """MindSpore's ApplyMomentum: `accum = momentum * accum + grad`; `param -= lr * accum`, or
    `param -= lr * (grad + momentum * accum)` with nesterov."""
    lr = F32(lr)
    m = F32(mom)
    for p, g, a in zip(params, grads, moments):
        a *= m
        a += g
        if nesterov:
            p -= lr * (g + m * a)
        else:
            p -= lr * a


def adam(params, grads, m1s, m2s, lr, beta1: float, beta2: float, eps: float, beta1_power: float,
         beta2_power: float, nesterov: bool) -> None:
    """MindSpore's Adam kernel with the step's powers (already multiplied by beta1, beta2):
    `lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)`, `m += (g - m)(1 - beta1)`,
    `v += (g^2 - v)(1 - beta2)`, `param -= lr_t * m / (sqrt(v) + eps)` (nesterov: m * beta1 +
    (1 - beta1) * g in place of m)."""
    b1, b2, e = F32(beta1), F32(beta2), F32(eps)
    lr_t = F32(lr) * np.sqrt(F32(1.0) - F32(beta2_power)) / (F32(1.0) - F32(beta1_power))
    for p, g, m, v in zip(params, grads, m1s, m2s):
        m += (g - m) * (F32(1.0) - b1)
        v += (g * g - v) * (F32(1.0) - b2)
        num = m * b1 + (F32(1.0) - b1) * g if nesterov else m
        p -= lr_t * num / (np.sqrt(v) + e)
