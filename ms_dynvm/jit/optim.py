"""In-place optimizer updates for replayed optimizer calls (tier 2), in float32 NumPy.

MindSpore's `nn` optimizers run their update as a graph (`@jit construct`) that no dispatch hook
sees, so a recording cannot learn them. Instead each supported optimizer has its update rule
written here, after the CPU kernels of the primitives the optimizers call (`SGD`, `ApplyMomentum`,
`Adam`); the frontend (frontend/regions.py) checks a rule against one eager call before it is
used (every parameter and state tensor after the eager update, rtol 1e-5), so a rule that does not
match MindSpore is never replayed. Arrays are views of the parameters' and states' memory: the
updates write through them, as the graph does.

`FusedStep` runs Adam, and SGD without momentum, over all of an optimizer's parameters in one call
of a small C loop (built with the project's GCC driver, `-ffp-contract=off`, kept in the kernel
cache): the NumPy rule costs about ten array operations per parameter, each a microsecond or more of
dispatch on the small tensors of a model's biases and layers. The loop makes the NumPy rule's float32
operations in the NumPy rule's order, without contraction (no FMA), so both give the same bits (a
test compares them); without a compiler the NumPy rule runs.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ms_dynvm.jit.native import NativeLibrary

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


# --- one C call per step ---------------------------------------------------------------------------
# Each line is the NumPy rule's expression above, operation for operation (float32; no contraction:
# -ffp-contract=off), so the bits agree with it.
_SOURCE = r"""
#include <stdint.h>
#include <math.h>
void dvm_adam(int64_t n, float *const *p, const float *const *g, float *const *m, float *const *v,
              const int64_t *sizes, float lr_t, float b1, float b2, float e, int nesterov) {
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (int64_t k = 0; k < n; k++) {
        float *P = p[k], *M = m[k], *V = v[k];
        const float *G = g[k];
        const int64_t s = sizes[k];
        for (int64_t i = 0; i < s; i++) {
            const float gi = G[i];
            const float mi = M[i] + (gi - M[i]) * c1;
            const float vi = V[i] + (gi * gi - V[i]) * c2;
            M[i] = mi;
            V[i] = vi;
            const float num = nesterov ? mi * b1 + c1 * gi : mi;
            P[i] = P[i] - lr_t * num / (sqrtf(vi) + e);
        }
    }
}
void dvm_sgd(int64_t n, float *const *p, const float *const *g, const int64_t *sizes, float lr) {
    for (int64_t k = 0; k < n; k++) {
        float *P = p[k];
        const float *G = g[k];
        const int64_t s = sizes[k];
        for (int64_t i = 0; i < s; i++)
            P[i] = P[i] - lr * G[i];
    }
}
"""
_P = ctypes.c_void_p


def _setup(lib) -> None:
    f32 = ctypes.c_float
    lib.dvm_adam.restype = None
    lib.dvm_adam.argtypes = [ctypes.c_int64, _P, _P, _P, _P, _P, f32, f32, f32, f32, ctypes.c_int]
    lib.dvm_sgd.restype = None
    lib.dvm_sgd.argtypes = [ctypes.c_int64, _P, _P, _P, f32]


_load = NativeLibrary("optim", _SOURCE, _setup, strict_ieee=True).get


def available() -> bool:
    return _load() is not None


def _ptrs(arrays) -> np.ndarray:
    return np.array([a.ctypes.data for a in arrays], np.uint64)


class FusedStep:
    """An optimizer's update over all its parameters in one C call (see the module doc), for
    `kind` "adam" or "sgd" (no momentum). `params` (and for Adam `m1s`, `m2s`): the float32,
    C-contiguous arrays updated in place, the same arrays at every step (their addresses are read
    once). `__call__`'s gradients are given by address (`grad_ptrs`: float32, C-contiguous, each the
    size of its parameter; the caller checks), so a step reads no array attribute per call."""

    def __init__(self, kind: str, params: list, m1s: list = (), m2s: list = ()) -> None:
        self.lib = _load()
        if self.lib is None:
            raise RuntimeError("no C compiler")
        arrays = list(params) + list(m1s) + list(m2s)
        if any(a.dtype != F32 or not a.flags.c_contiguous or not a.flags.writeable for a in arrays):
            raise ValueError("float32 C-contiguous writable arrays only")
        self.kind = kind
        self.keep = arrays  # (the memory the addresses point into stays alive)
        self.n = len(params)
        self.p = _ptrs(params)
        self.m = _ptrs(m1s) if kind == "adam" else None
        self.v = _ptrs(m2s) if kind == "adam" else None
        self.sizes = np.array([a.size for a in params], np.int64)
        self.g = np.zeros(self.n, np.uint64)
        # (the pointer tables' own addresses, read once: `ndarray.ctypes` costs microseconds a call)
        self.args = tuple(a.ctypes.data if a is not None else None
                          for a in (self.p, self.g, self.m, self.v, self.sizes))

    def __call__(self, grad_ptrs, lr, beta1=0.0, beta2=0.0, eps=0.0, beta1_power=0.0, beta2_power=0.0,
                 nesterov=False) -> None:
        self.g[:] = grad_ptrs
        p, g, m, v, sizes = self.args
        if self.kind == "sgd":
            self.lib.dvm_sgd(self.n, p, g, sizes, float(F32(lr)))
            return
        lr_t = F32(lr) * np.sqrt(F32(1.0) - F32(beta2_power)) / (F32(1.0) - F32(beta1_power))
        self.lib.dvm_adam(self.n, p, g, m, v, sizes, float(lr_t), float(F32(beta1)), float(F32(beta2)),
                          float(F32(eps)), 1 if nesterov else 0)
