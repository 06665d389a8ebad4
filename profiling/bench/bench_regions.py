"""Tier 2 (region replay) against MindSpore's blocking eager and `ms.jit`, whole training and
inference steps with sizes drawn anew every step, side by side in one process.

Each round draws one sequence of sizes per workload; every configuration runs that same sequence
from the same starting weights and data, freshly built (so learning, recording and compiling are
inside the timed run):
- eager:  MindSpore PyNative after `ms.runtime.launch_blocking()` (its fastest eager mode on CPU);
- dynvm:  the same script after `ms_dynvm.enable()` (default options: tier 1, tier 2, step switch);
- ms.jit: the step function under `@ms.jit` (MindSpore's graph compiler; one compile per new shape).
The order of the configurations rotates from round to round. Reported per workload and
configuration: the whole run's time (median over rounds, and min-max), the median step time per
size class in the last round, ratios to eager, and for dynvm the share of region calls replayed, the
host cost of a replay (guards + program + wrapping, mean) and what was not replayable.

Workloads (CE = cross-entropy):
- mlp:       784-512-512-10 MLP, CE loss, value_and_grad + SGD; batch in {1, 8, 32, 64}
- gnn:       message passing: gather of source features, an edge MLP (Dense-ReLU), unsorted_segment_sum
             into destinations, division by in-degree, an update Dense, MSE loss, Adam;
             nodes in 64..512 (edges = 4 x nodes)
- ffn:       LN+GELU feed-forward block x + W2 GELU(W1 LN(x)) on [B, S, 64], mean-square loss, SGD;
             B in {2, 4}, S in {16, 32, 64}
- encoder:   nn.TransformerEncoderLayer(64, 4, 128) with a key padding mask, mean-square loss, SGD;
             B in {2, 4}, S in {16, 32}
- attn_inf:  attention block inference (Dense q/k/v, masked softmax, output Dense, LayerNorm, GELU
             FFN) on [B, S, 64]; B in {1, 4, 8}, S in {16, 32, 64}

    python profiling/bench/bench_regions.py [--rounds 3] [--steps 120] [--only mlp,gnn] [--no-msjit]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


def size_arg(text: str):
    """A workload size from the command line: "8,64" -> (8, 64), "32" -> 32 (as WORKLOADS name them)."""
    size = tuple(int(v) for v in text.split(","))
    return size[0] if len(size) == 1 else size


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _init(net, seed):
    import mindspore as ms

    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        shape = tuple(p.shape)
        if "gamma" in p.name or (len(shape) == 1 and p.name.endswith("weight")):
            val = np.ones(shape)
        elif "beta" in p.name or "bias" in p.name:
            val = np.zeros(shape)
        else:
            val = rng.standard_normal(shape) / np.sqrt(max(shape[-1], 1))
        p.set_data(ms.Tensor(val.astype(np.float32)))


# Each workload: build(seed) -> (step, make_inputs(rng, size), sizes); step(*inputs) -> a tensor.
def mlp():
    import mindspore as ms
    from mindspore import nn

    def build(seed):
        net = nn.SequentialCell(nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10))
        _init(net, seed)
        opt = nn.SGD(net.trainable_params(), 0.01)
        lossf = nn.CrossEntropyLoss()
        def loss_fn(x, y):
            return lossf(net(x), y)
        gf = ms.value_and_grad(loss_fn, None, net.trainable_params())

        def step(x, y):
            loss, g = gf(x, y)
            opt(g)
            return loss
        return step

    def inputs(rng, b):
        return (ms.Tensor(rng.standard_normal((b, 784)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 10, b).astype(np.int32)))
    return build, inputs, [1, 8, 32, 64]


def gnn():
    import mindspore as ms
    from mindspore import nn, ops

    d = 32

    class MP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.msg = nn.Dense(d, d)
            self.upd = nn.Dense(2 * d, d)
            self.relu = nn.ReLU()

        def construct(self, x, src, dst, inv_deg):
            m = self.relu(self.msg(ops.gather(x, src, 0)))
            agg = ops.unsorted_segment_sum(m, dst, x.shape[0]) * inv_deg
            return self.upd(ops.concat((x, agg), -1))

    def build(seed):
        net = MP()
        _init(net, seed)
        opt = nn.Adam(net.trainable_params(), 1e-3)
        def loss_fn(x, s, t, w, y):
            return ((net(x, s, t, w) - y) ** 2).mean()
        gf = ms.value_and_grad(loss_fn, None, net.trainable_params())

        def step(x, s, t, w, y):
            loss, g = gf(x, s, t, w, y)
            opt(g)
            return loss
        return step

    def inputs(rng, n):
        e = 4 * n
        src = rng.integers(0, n, e).astype(np.int32)
        dst = rng.integers(0, n, e).astype(np.int32)
        deg = np.bincount(dst, minlength=n).astype(np.float32)
        inv = (1.0 / np.maximum(deg, 1.0)).reshape(n, 1).astype(np.float32)
        return (ms.Tensor(rng.standard_normal((n, d)).astype(np.float32)), ms.Tensor(src), ms.Tensor(dst),
                ms.Tensor(inv), ms.Tensor(rng.standard_normal((n, d)).astype(np.float32)))
    return build, inputs, [64, 128, 256, 512]


def ffn():
    import mindspore as ms
    from mindspore import nn, ops

    class FFN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm((64,), epsilon=1e-5)
            self.w1 = nn.Dense(64, 256)
            self.w2 = nn.Dense(256, 64)

        def construct(self, x):
            return x + self.w2(ops.gelu(self.w1(self.ln(x)), approximate="none"))

    def build(seed):
        net = FFN()
        _init(net, seed)
        opt = nn.SGD(net.trainable_params(), 0.01)
        def loss_fn(x):
            return (net(x) ** 2).mean()
        gf = ms.value_and_grad(loss_fn, None, net.trainable_params())

        def step(x):
            loss, g = gf(x)
            opt(g)
            return loss
        return step

    def inputs(rng, bs):
        b, s = bs
        return (ms.Tensor(rng.standard_normal((b, s, 64)).astype(np.float32)),)
    return build, inputs, [(b, s) for b in (2, 4) for s in (16, 32, 64)]


def encoder():
    import mindspore as ms
    from mindspore import nn

    def build(seed):
        layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
        _init(layer, seed)
        layer.set_train(True)
        opt = nn.SGD(layer.trainable_params(), 0.01)
        def loss_fn(x, m):
            return (layer(x, src_key_padding_mask=m) ** 2).mean()
        gf = ms.value_and_grad(loss_fn, None, layer.trainable_params())

        def step(x, m):
            loss, g = gf(x, m)
            opt(g)
            return loss
        return step

    def inputs(rng, bs):
        b, s = bs
        lengths = rng.integers(1, s + 1, b)
        mask = np.arange(s)[None, :] >= lengths[:, None]
        return (ms.Tensor(rng.standard_normal((b, s, 64)).astype(np.float32)), ms.Tensor(mask))
    return build, inputs, [(b, s) for b in (2, 4) for s in (16, 32)]


def attn_inf():
    import mindspore as ms
    from mindspore import nn, ops

    d = 64

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = nn.Dense(d, d), nn.Dense(d, d), nn.Dense(d, d), nn.Dense(d, d)
            self.ln = nn.LayerNorm((d,), epsilon=1e-5)
            self.f1, self.f2 = nn.Dense(d, 4 * d), nn.Dense(4 * d, d)

        def construct(self, x, m):
            q, k, v = self.q(x), self.k(x), self.v(x)
            s = ops.matmul(q, k.transpose(0, 2, 1)) * (1.0 / 8.0) + (1.0 - m) * -1e4
            h = self.ln(x + self.o(ops.matmul(ops.softmax(s, -1), v)))
            return h + self.f2(ops.gelu(self.f1(h), approximate="none"))

    def build(seed):
        net = Block()
        _init(net, seed)
        net.set_train(False)
        return net

    def inputs(rng, bs):
        b, s = bs
        lengths = rng.integers(1, s + 1, b)
        m = (np.arange(s)[None, :] < lengths[:, None]).astype(np.float32)[:, None, :]
        return (ms.Tensor(rng.standard_normal((b, s, d)).astype(np.float32)), ms.Tensor(m))
    return build, inputs, [(b, s) for b in (1, 4, 8) for s in (16, 32, 64)]


WORKLOADS = {"mlp": mlp, "gnn": gnn, "ffn": ffn, "encoder": encoder, "attn_inf": attn_inf}


def run_config(cfg, build, make_inputs, sizes_seq, seed):
    import mindspore as ms

    import ms_dynvm

    if cfg == "dynvm":
        ms_dynvm.reset_stats()
        ms_dynvm.enable()
    try:
        step = build(seed)
        if cfg == "ms.jit":
            step = ms.jit(step)
        rng = np.random.default_rng(seed + 7)
        data = [make_inputs(rng, s) for s in sizes_seq]
        times = []
        t_all = time.perf_counter()
        for inp in data:
            t0 = time.perf_counter()
            out = step(*inp)
            out.asnumpy()
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - t_all
        st = ms_dynvm.stats() if cfg == "dynvm" else None
        return total, times, st
    finally:
        if cfg == "dynvm":
            ms_dynvm.disable()


def _ms(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-msjit", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import mindspore as ms

    ms.runtime.launch_blocking()
    names = [n for n in WORKLOADS if not args.only or n in args.only.split(",")]
    configs = ["eager", "dynvm"] + ([] if args.no_msjit else ["ms.jit"])
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    load0 = os.getloadavg()
    print(f"CPU: {cpu_name()}; {os.cpu_count()} cores; MindSpore {ms.__version__}; "
          f"{args.rounds} rounds x {args.steps} steps; {time.strftime('%Y-%m-%d %H:%M')}")
    results = {}
    for name in names:
        build, make_inputs, sizes = WORKLOADS[name]()
        totals = {c: [] for c in configs}
        last_times = {}
        last_stats = None
        for rnd in range(args.rounds):
            rng = np.random.default_rng(1000 + rnd)
            seq = [sizes[int(i)] for i in rng.integers(0, len(sizes), args.steps)]
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for cfg in order:
                total, times, st = run_config(cfg, build, make_inputs, seq, seed=rnd)
                totals[cfg].append(total)
                last_times[cfg] = (seq, times)
                if st is not None:
                    last_stats = st
        res = {"whole_run_s": {c: statistics.median(v) for c, v in totals.items()},
               "whole_run_spread_s": {c: [min(v), max(v)] for c, v in totals.items()}}
        per_class = {}
        for cfg, (seq, times) in last_times.items():
            by: dict = {}
            for s, t in zip(seq, times):
                by.setdefault(str(s), []).append(t)
            # steady state: the second half of each class's steps
            per_class[cfg] = {s: statistics.median(v[len(v) // 2:]) for s, v in by.items()}
        res["step_ms_by_size"] = {c: {s: round(t * 1e3, 3) for s, t in d.items()} for c, d in per_class.items()}
        res["ratio_whole_run"] = {c: res["whole_run_s"]["eager"] / res["whole_run_s"][c] for c in configs}
        res["ratio_steady_by_size"] = {c: {s: per_class["eager"][s] / per_class[c][s] for s in per_class[c]}
                                       for c in configs}
        if last_stats:
            n = last_stats["regions_replayed"]
            res["dynvm"] = {
                "region_replay_rate": last_stats["region_replay_rate"],
                "regions_replayed": n, "region_calls": last_stats["region_calls"],
                "replay_ms_mean": 1e3 * last_stats["region_replay_seconds"] / n if n else None,
                "replay_host_ms_mean": 1e3 * last_stats["region_host_seconds"] / n if n else None,
                "learn_s": last_stats["region_learn_seconds"], "plan_s": last_stats["region_plan_seconds"],
                "replay_s": last_stats["region_replay_seconds"],
                "regions_not_replayable": last_stats["regions_not_replayable"],
                "region_guard_failures": last_stats["region_guard_failures"],
                "fusion_rate": last_stats["fusion_rate"], "step_calls": last_stats["step_calls"]}
        results[name] = res
        w = res["whole_run_s"]
        print(f"\n== {name}: whole run (median of {args.rounds}, s): " +
              ", ".join(f"{c} {w[c]:.3f} [{res['whole_run_spread_s'][c][0]:.3f}-{res['whole_run_spread_s'][c][1]:.3f}]"
                        f" ({res['ratio_whole_run'][c]:.2f}x)" for c in configs))
        for s in per_class["eager"]:
            print(f"   size {s:>10}: step ms " + ", ".join(
                f"{c} {res['step_ms_by_size'][c][s]:.2f} ({res['ratio_steady_by_size'][c][s]:.2f}x)" for c in configs))
        if "dynvm" in res:
            d = res["dynvm"]
            print(f"   dynvm: replayed {d['regions_replayed']}/{d['region_calls']} region calls "
                  f"({d['region_replay_rate']:.0%}); a replay: {_ms(d['replay_ms_mean'])} ms, of which host cost "
                  f"(guards, views, wrapping) {_ms(d['replay_host_ms_mean'])} ms; learning {d['learn_s']:.3f} s "
                  f"(planning {d['plan_s']:.3f} s), replays {d['replay_s']:.3f} s; "
                  f"not replayable {d['regions_not_replayable']}; guard failures {d['region_guard_failures']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "cores": os.cpu_count(), "started_utc": started,
                       "loadavg_start": load0, "loadavg_end": os.getloadavg(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
