"""Training steps with the batch size changing every step: blocking eager vs ms_dynvm, side by side.

In one process, MindSpore's blocking mode (its fastest eager mode on CPU). Each workload is one
training step (forward, backward through `value_and_grad`, optimizer update) of a small model, on a
batch whose size is drawn anew for every step. Every round runs N steps eagerly, then the same N
steps (same sizes, same data, same starting weights) under `ms_dynvm.enable()` (the defaults: cost
policy, background compiles, the step switch), under `enable(step_switch=False)` (every step under
the VM), and under `enable(compile_policy="threshold", compile_async=False, step_switch=False)`
(every group compiled once hot, within the warm-up, every step under the VM); the order of the four
rotates from round to round. The step switch learns per size class (cost/step.py); "steps vm/bare"
is how the last round's steps ran. Medians of the per-step wall time over rounds are reported, with the ratio to
eager, the fusion rate and fallbacks of the timed rounds, and the largest relative difference of a
step's loss from eager's (the weights start equal in each configuration of a round).

Workloads:
- mlp:      Dense(64,256)-ReLU-Dense(256,256)-ReLU-Dense(256,10), MSE loss, SGD; B in 8..128
- lngelu:   x + Dense(GELU(LayerNorm(x))) on [B,S,64] (S in 8..32), mean-square loss, Adam; B in 2..8

    python profiling/bench/bench_train.py [--rounds 5] [--steps 20] [--warmup 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=20, help="steps per configuration before timing")
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import nn, ops

    import ms_dynvm

    ms.runtime.launch_blocking()

    def mlp():
        net = nn.SequentialCell(nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 10))
        opt = nn.SGD(net.trainable_params(), 0.01)

        def loss_fn(x, y):
            return ((net(x) - y) ** 2).mean()

        def data(rng):
            b = int(rng.integers(8, 129))
            return (rng.standard_normal((b, 64)).astype(np.float32),
                    rng.standard_normal((b, 10)).astype(np.float32))
        return net, opt, loss_fn, data

    def lngelu():
        class Block(nn.Cell):
            def __init__(self):
                super().__init__()
                self.ln = nn.LayerNorm((64,))
                self.fc = nn.Dense(64, 64)

            def construct(self, x):
                return x + self.fc(ops.gelu(self.ln(x), approximate="none"))

        net = Block()
        opt = nn.Adam(net.trainable_params(), 1e-3)

        def loss_fn(x, y):
            return ((net(x) - y) ** 2).mean()

        def data(rng):
            b, s = int(rng.integers(2, 9)), int(rng.integers(8, 33))
            return (rng.standard_normal((b, s, 64)).astype(np.float32),
                    rng.standard_normal((b, s, 64)).astype(np.float32))
        return net, opt, loss_fn, data

    def setup(make):
        net, opt, loss_fn, data = make()
        grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
        init = [p.asnumpy().copy() for p in opt.parameters]

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return float(loss.asnumpy())

        def reset():
            for p, v in zip(opt.parameters, init):
                p.set_data(ms.Tensor(v))
        return step, reset, data

    configs = {
        "eager": None,
        "ms_dynvm": {},
        "vm-only": {"step_switch": False},
        "threshold": {"compile_policy": "threshold", "compile_async": False, "step_switch": False},
    }
    results = {}
    for wname, make in (("mlp", mlp), ("lngelu", lngelu)):
        step, reset, data = setup(make)
        rng = np.random.default_rng(0)
        batches = [tuple(ms.Tensor(a) for a in data(rng)) for _ in range(args.steps)]
        warm = [tuple(ms.Tensor(a) for a in data(rng)) for _ in range(args.warmup)]
        for cfg, opts in configs.items():  # warm-up: compiles happen here, outside the timing
            if opts is not None:
                ms_dynvm.enable(**opts)
            reset()
            for x, y in warm:
                step(x, y)
            if opts is not None:
                ms_dynvm.disable()
        times = {c: [] for c in configs}
        losses = {c: [] for c in configs}
        stats = {}
        names = list(configs)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for cfg in order:
                opts = configs[cfg]
                if opts is not None:
                    ms_dynvm.enable(**opts)
                    ms_dynvm.reset_stats()
                reset()
                ls = []
                t0 = time.perf_counter()
                for x, y in batches:
                    ls.append(step(x, y))
                times[cfg].append((time.perf_counter() - t0) / len(batches))
                losses[cfg].append(ls)
                if opts is not None:
                    st = ms_dynvm.stats()
                    stats.setdefault(cfg, []).append(st)
                    ms_dynvm.disable()
        results[wname] = (times, losses, stats)

    print(f"{args.rounds} rounds x {args.steps} steps per workload and configuration, after {args.warmup} "
          f"warm-up steps each; median ms per step (each step includes loss.asnumpy())")
    print(f"{'workload':10} {'config':10} {'ms/step':>9} {'vs eager':>9} {'fusion':>7} {'max rel loss diff':>18}  fallbacks (last round)")
    for wname, (times, losses, stats) in results.items():
        eager_med = statistics.median(times["eager"])
        for cfg in configs:
            med = statistics.median(times[cfg])
            diff = max(abs(a - b) / max(abs(b), 1e-30)
                       for la, lb in zip(losses[cfg], losses["eager"]) for a, b in zip(la, lb))
            if cfg == "eager":
                print(f"{wname:10} {cfg:10} {med * 1e3:9.3f} {'1.00x':>9} {'':>7} {'':>18}")
                continue
            st = stats[cfg][-1]
            fb = {k: v for k, v in st["fallbacks"].items()}
            sc = st["step_calls"]
            steps = f"  steps vm/bare {sc.get('vm', 0)}/{sc.get('bare', 0)}" if sc else ""
            print(f"{wname:10} {cfg:10} {med * 1e3:9.3f} {eager_med / med:8.2f}x {st['fusion_rate']:7.1%} "
                  f"{diff:18.2e}  {fb}{steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
