"""Recording overhead per op: ms_dynvm's dispatch handler vs a pass-through MsDispatchMode handler.

Everything runs in one process, in MindSpore's blocking mode (its fastest eager mode on CPU), side by
side and interleaved (round-robin over the configurations, repeated), and reports medians:

- eager:        no dispatch mode at all
- passthrough:  an MsDispatchMode whose handler only calls `func(*args)`
- count-only:   ms_dynvm with record=False (counting and normalisation, no bytecode)
- record:       ms_dynvm.enable(jit=False): every op recorded into bytecode blocks, nothing compiled
- record+jit:   ms_dynvm.enable(): recording plus tier-1 run tracking (and serving where compiled)

Workloads: a 16-op elementwise/reduction chain on a 16x16 tensor (dispatch-bound, so the handler's
cost dominates), and the forward+backward steps of the test workloads (profiling/workloads.py).
Per-op overhead, two ways:
- end to end: (time(record) - time(passthrough)) / ops dispatched per call (wall clock; noisy on a
  shared 2-core machine);
- in the handler: CPU time of the calling thread (time.thread_time_ns) spent in ms_dynvm's bookkeeping
  after `func(*args)` returns, per op, minus the cost of the timer calls themselves. This is exactly
  what ms_dynvm's handler adds over a pass-through handler, and it is not inflated by other processes.

    python profiling/bench_record_overhead.py [--reps 15] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15, help="rounds over all configurations")
    ap.add_argument("--calls", type=int, default=50, help="calls of the workload per timing")
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import ops

    import ms_dynvm
    from profiling import workloads

    ms.runtime.launch_blocking()

    class PassThrough(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            return func(*a)

    x = ms.Tensor(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))

    def chain(x):
        for _ in range(2):
            y = ops.exp(x * 0.5 - 1.0)
            y = ops.relu(y + x)
            y = ops.tanh(y) - 0.25
            y = ops.sigmoid(y) * x
            x = y / 2.0 + ops.neg(y)
            x = ops.maximum(x, y)
        return x.sum(-1)

    cases = {"chain16x16": (chain, (x,))}
    for name in ("mlp", "layernorm_gelu", "attention"):
        step, inputs = workloads.WORKLOADS[name]()
        cases[name] = (step, inputs)

    class Counter(ms.MsDispatchMode):
        n = 0

        def __ms_dispatch__(self, func, a, kwargs=None):
            Counter.n += 1
            return func(*a)

    n_ops = {}
    for name, (fn, inp) in cases.items():
        Counter.n = 0
        with Counter():
            fn(*inp)
        n_ops[name] = Counter.n

    def run(fn, inp, calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*inp)
        return (time.perf_counter() - t0) / calls

    configs = ["eager", "passthrough", "count-only", "record", "record+jit"]
    times = {(c, n): [] for c in configs for n in cases}
    for name, (fn, inp) in cases.items():  # warm-up
        run(fn, inp, 3)
    for _ in range(args.reps):
        for cfg in configs:
            for name, (fn, inp) in cases.items():
                if cfg == "eager":
                    t = run(fn, inp, args.calls)
                elif cfg == "passthrough":
                    with PassThrough():
                        t = run(fn, inp, args.calls)
                else:
                    ms_dynvm.enable(record=(cfg != "count-only"), jit=(cfg == "record+jit"))
                    try:
                        t = run(fn, inp, args.calls)
                    finally:
                        ms_dynvm.disable()
                times[(cfg, name)].append(t)

    # In-handler CPU time per op (see module doc).
    from ms_dynvm.frontend import recorder as rec_mod

    tt = time.thread_time_ns
    calib = []
    for _ in range(20000):
        a = tt()
        calib.append(tt() - a)
    timer_ns = statistics.median(calib)
    spent = []
    orig = rec_mod.Recorder.on_op

    def timed_on_op(self, name, a, out):
        t0 = tt()
        orig(self, name, a, out)
        spent.append(tt() - t0 - timer_ns)

    in_handler = {}
    rec_mod.Recorder.on_op = timed_on_op
    try:
        for name, (fn, inp) in cases.items():
            ms_dynvm.enable(jit=False)
            try:
                run(fn, inp, 3)
                spent.clear()
                for _ in range(args.reps):
                    run(fn, inp, args.calls)
                in_handler[name] = (statistics.median(spent) / 1e3, statistics.mean(spent) / 1e3)
            finally:
                ms_dynvm.disable()
    finally:
        rec_mod.Recorder.on_op = orig

    print(f"median over {args.reps} rounds x {args.calls} calls; times per call in us, per op in us")
    print(f"{'workload':16s} {'ops':>5s} " + " ".join(f"{c:>12s}" for c in configs)
          + f" {'rec-pass/op':>12s} {'count-pass/op':>14s} {'handler cpu/op med':>19s} {'mean':>6s}")
    for name in cases:
        med = {c: statistics.median(times[(c, name)]) * 1e6 for c in configs}
        per_op = (med["record"] - med["passthrough"]) / n_ops[name]
        per_op_count = (med["count-only"] - med["passthrough"]) / n_ops[name]
        print(f"{name:16s} {n_ops[name]:5d} " + " ".join(f"{med[c]:12.1f}" for c in configs)
              + f" {per_op:12.2f} {per_op_count:14.2f} {in_handler[name][0]:19.2f} {in_handler[name][1]:6.2f}")


if __name__ == "__main__":
    main()
