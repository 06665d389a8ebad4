"""Differential fuzz of tier 2 over changing sizes: random small Cells, called at sizes drawn anew
every call, under `ms_dynvm.enable()` and eagerly, inference and `value_and_grad` training steps.
Exercises learning, families, sizes derived from a family (`bytecode/family.py`) and their checks.
Tolerances: outputs within rtol 1e-5 (training: 1e-4) and an absolute term at that relative size of
the output's largest magnitude.

    python profiling/fuzz/fuzz_regions.py SEED N [--calls 24] [--verbose]

Each program: x [B, S, D] (B, S drawn per call from small sets; D fixed) through 2-6 layers drawn
from: Dense, LayerNorm, softmax, erf-GELU, relu, a reshape to heads and back (sizes read from
x.shape), a mean or sum over S, a scale by a Python number computed from a size (1/S, 1/sqrt(S): the
second no family explains), a concat with a learned token along S, a transpose-matmul-transpose
attention score, and a branch on a size (`if B > 3`). Exit status 1 on any mismatch (outputs beyond
rtol 1e-5 in inference; loss or gradients beyond rel 1e-4 in training). Prints the region counters.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

LAYERS = ("dense", "ln", "softmax", "gelu", "relu", "heads", "scale_inv", "scale_sqrt", "token", "attn",
          "branch", "pool")


def make_cell(rng, d):
    import mindspore as ms
    from mindspore import nn, ops

    kinds = [str(k) for k in rng.choice(LAYERS, int(rng.integers(2, 7)))]

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.kinds = kinds
            self.fc = nn.CellList([nn.Dense(d, d) for _ in kinds])
            self.ln = nn.LayerNorm((d,))
            self.tok = ms.Parameter(ms.Tensor(rng.standard_normal((1, 1, d)).astype(np.float32)), name="tok")

        def construct(self, x):
            pooled = False
            for i, k in enumerate(self.kinds):
                if pooled and k in ("heads", "token", "attn", "pool", "scale_inv", "scale_sqrt"):
                    k = "dense"
                b, s = x.shape[0], x.shape[1]
                if k == "dense":
                    x = self.fc[i](x)
                elif k == "ln":
                    x = self.ln(x)
                elif k == "softmax":
                    x = ops.softmax(x, -1)
                elif k == "gelu":
                    x = ops.gelu(x)
                elif k == "relu":
                    x = ops.relu(x)
                elif k == "heads":
                    x = x.reshape(b, s, 2, d // 2).transpose(0, 2, 1, 3).reshape(b * 2, s, d // 2)
                    x = x.reshape(b, 2, s, d // 2).transpose(0, 2, 1, 3).reshape(b, s, d)
                elif k == "scale_inv":
                    x = x * (1.0 / s)
                elif k == "scale_sqrt":
                    x = x * (1.0 / math.sqrt(s))
                elif k == "token":
                    x = ops.concat((ops.broadcast_to(self.tok, (b, 1, d)), x), 1)
                elif k == "attn":
                    a = ops.softmax(ops.bmm(x, x.transpose(0, 2, 1)) * 0.1, -1)
                    x = ops.bmm(a, x)
                elif k == "branch":
                    if b > 3:
                        x = x * 2.0
                elif k == "pool":
                    x = x.mean(1)
                    pooled = True
            return x

    return Net(), kinds


def run_one(seed, idx, calls, verbose):
    import mindspore as ms
    from mindspore import nn

    import ms_dynvm

    rng = np.random.default_rng([seed, idx])
    d = 8
    net, kinds = make_cell(rng, d)
    train = bool(rng.integers(0, 2))
    bs_set = [int(v) for v in rng.choice([1, 2, 3, 4, 5, 6, 8], int(rng.integers(2, 5)), replace=False)]
    s_set = [int(v) for v in rng.choice([1, 2, 3, 5, 7, 9, 16], int(rng.integers(1, 4)), replace=False)]
    drng = np.random.default_rng([seed, idx, 1])
    sizes = [(int(drng.choice(bs_set)), int(drng.choice(s_set))) for _ in range(calls)]
    xs = [drng.standard_normal((b, s, d)).astype(np.float32) for b, s in sizes]
    bad = []

    def step_fn():
        if not train:
            net.set_train(False)
            return lambda x: (net(x),)
        net.set_train(True)
        lossf = lambda x: (net(x) ** 2).mean()  # noqa: E731
        g = ms.value_and_grad(lossf, None, net.trainable_params())
        return lambda x: (g(x)[0],) + tuple(g(x)[1])

    outs = {}
    for mode in ("eager", "vm"):
        if mode == "vm":
            ms_dynvm.enable(step_switch=False)
        try:
            f = step_fn()
            outs[mode] = [[o.asnumpy() for o in f(ms.Tensor(x))] for x in xs]
        finally:
            if mode == "vm":
                ms_dynvm.disable()
    rtol = 1e-4 if train else 1e-5
    for c, (e, v) in enumerate(zip(outs["eager"], outs["vm"])):
        for k, (a, b) in enumerate(zip(e, v)):
            # (atol at the output's scale: MindSpore's BatchMatMul and oneDNN's sgemm differ in the last
            # bit for some small shapes, [7, 8] x [8, 7], and a LayerNorm after it scales that up)
            atol = rtol * max(1.0, float(np.max(np.abs(a), initial=0.0)))
            if a.shape != b.shape or not np.allclose(b, a, rtol=rtol, atol=atol, equal_nan=True):
                bad.append((c, k, sizes[c]))
                break
    if bad or verbose:
        print(f"seed {seed} program {idx} {'train' if train else 'infer'} {kinds} sizes {sorted(set(sizes))}: "
              f"{'MISMATCH at ' + str(bad[:3]) if bad else 'ok'}")
    return not bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("seed", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    import mindspore as ms

    import ms_dynvm

    ms.runtime.launch_blocking()
    ms_dynvm.reset_stats()
    ok = sum(run_one(a.seed, i, a.calls, a.verbose) for i in range(a.n))
    st = ms_dynvm.stats()
    keys = ("region_calls", "regions_replayed", "region_compiles", "region_sizes_derived", "region_derive_failures",
            "regions_not_replayable", "region_retired")
    print(f"programs {a.n}, with mismatches {a.n - ok}; " + ", ".join(f"{k} {st[k]}" for k in keys))
    return 0 if ok == a.n else 1


if __name__ == "__main__":
    sys.exit(main())
