"""Tier-1 fused execution vs MindSpore's best eager mode (blocking), in one process, side by side.

Three workloads, with the batch size B and sequence length S changing on every call (drawn from a
fixed random sequence, the same for both sides):
- chain:          tanh(relu(exp(x*0.5-1)*m + x) - 0.25)  on [B,784]
- masked softmax: softmax(x + (1-m)*-1e4, -1)             on [4B,S]
- layernorm+gelu: gelu(layer_norm(x), erf form)           on [B,S,128]

Protocol: warm-up calls under ms_dynvm (compiles happen there, counted and timed), then R rounds; in
each round every workload runs N calls eagerly and N calls under ms_dynvm (same sizes), alternating
which goes first. Reported: median per-call time of each side, the ratio eager/ms_dynvm, and over the
timed part: cache hit rate, compiles, compile seconds as a share of the whole ms_dynvm run, fused-op
share. Results are checked against eager on every timed call with rtol 1e-5 and atol 1e-6 (the
kernels' exp and tanh follow MindSpore's own formulas, `eager_math`); the max |diff| is printed.

    python profiling/bench/bench_tier1.py [--rounds 7] [--calls 20] [--warmup 30] [--policy cost|threshold]

Run it twice with the same DYNVM_CACHE_DIR: the second process should compile nothing (disk cache).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Kernels compile synchronously here (inside the call that makes a group hot), so that the
# warm-up ends with every kernel in place; ms_dynvm's default compiles in the background.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--policy", default="threshold", choices=["cost", "threshold"])
    ap.add_argument("--workloads", default="chain,softmax,lngelu")
    args = ap.parse_args()

    import mindspore as ms

    import ms_dynvm

    ms.runtime.launch_blocking()
    rng = np.random.default_rng(0)

    from profiling.workloads import issue_loops

    all_cases = issue_loops(rng)
    cases = {k: all_cases[k] for k in args.workloads.split(",")}

    opts = dict(compile_policy=args.policy)
    ms_dynvm.reset_stats()
    t_warm = time.perf_counter()
    with ms_dynvm.enabled(**opts):
        for _ in range(args.warmup):
            for fn, make, _ in cases.values():
                fn(*make()).asnumpy()
    warm_s = time.perf_counter() - t_warm
    warm = ms_dynvm.stats()

    # Collect the warm-up's garbage (compiler objects, recorded blocks) now, so that a full collection
    # it would trigger does not land in one side's timed calls.
    gc.collect()
    times = {(k, side): [] for k in cases for side in ("eager", "dynvm")}
    ms_dynvm.reset_stats()
    dynvm_total = 0.0
    max_err = 0.0
    for r in range(args.rounds):
        for name, (fn, make, _) in cases.items():
            batch = [make() for _ in range(args.calls)]
            order = ("eager", "dynvm") if r % 2 == 0 else ("dynvm", "eager")
            results = {}
            for side in order:
                outs = []
                if side == "dynvm":
                    ms_dynvm.enable(**opts)
                try:
                    for inp in batch:
                        t0 = time.perf_counter()
                        y = fn(*inp)
                        y.asnumpy()
                        dt = time.perf_counter() - t0
                        times[(name, side)].append(dt)
                        if side == "dynvm":
                            dynvm_total += dt
                        outs.append(y.asnumpy())
                finally:
                    if side == "dynvm":
                        ms_dynvm.disable()
                results[side] = outs
            for a, b in zip(results["eager"], results["dynvm"]):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
                max_err = max(max_err, float(np.max(np.abs(b - a))) if a.size else 0.0)
    st = ms_dynvm.stats()

    print(f"warm-up: {args.warmup} calls per workload in {warm_s:.2f} s, compiles {warm['compiles']}, "
          f"compile seconds {warm['compile_seconds']:.2f}, groups compiled {warm['groups_compiled']}, "
          f"disk cache hits {warm['disk_cache_hits']}")
    print(f"timed: {args.rounds} rounds x {args.calls} calls per workload and side; "
          f"median per call in us (each call includes asnumpy() of the result)")
    print(f"{'workload':10s} {'shapes':34s} {'eager':>9s} {'ms_dynvm':>9s} {'speed-up':>9s}")
    for name, (_, _, shapes) in cases.items():
        e = statistics.median(times[(name, "eager")]) * 1e6
        d = statistics.median(times[(name, "dynvm")]) * 1e6
        print(f"{name:10s} {shapes:34s} {e:9.1f} {d:9.1f} {e / d:8.2f}x")
    share = st["compile_seconds"] / dynvm_total if dynvm_total else 0.0
    print(f"timed part: cache hit rate {100 * st['cache_hit_rate']:.1f}% ({st['cache_hits']} hits, "
          f"{st['cache_misses']} misses), compiles {st['compiles']}, compile time {st['compile_seconds']:.3f} s "
          f"= {100 * share:.1f}% of the ms_dynvm run, fused ops {100 * st['fusion_rate']:.1f}%, "
          f"max |diff| vs eager {max_err:.2e}")
    print(f"fallbacks: {st['fallbacks']}  guard failures: {st['guard_failures']}")
    if st["step_calls"]:  # workloads that call a Cell have steps (docs/architecture.md, "The step switch")
        print(f"step switch in the timed part: {st['step_calls'].get('vm', 0)} calls under the VM, "
              f"{st['step_calls'].get('bare', 0)} bare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
