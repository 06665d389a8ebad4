"""Where a whole tier-2 run's time goes, step by step: each step of a workload of
`profiling/bench/bench_regions.py` under `ms_dynvm.enable()`, classified by what tier 2 did with its
region calls (a first/warm-up eager call, a learning recording, an optimizer's rule check, an
installed plan's first replay, a replay, a re-verification, a program derived for a new size and
checked against the eager call), with its wall time, and per size the
count of calls that were not replays. The same steps under blocking eager for comparison.

    python profiling/tools/breakdown_regions.py [--only gnn] [--steps 120] [--rounds 3] [--profile]

`--profile` adds a cProfile of the last dynvm round (top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import numpy as np  # noqa: E402


def _counters(st: dict) -> dict:
    return {"calls": st["region_calls"], "replayed": st["regions_replayed"], "compiles": st["region_compiles"],
            "derived": st["region_sizes_derived"],
            "reverify": st["region_reverifications"], "learn_s": st["region_learn_seconds"],
            "plan_s": st["region_plan_seconds"], "replay_s": st["region_replay_seconds"],
            "host_s": st["region_host_seconds"], "recordings": st["recordings"]}


def _classify(d: dict, first: bool) -> str:
    """What one step's region calls were, from the counters' differences."""
    if d["reverify"]:
        return "reverify"
    if d["replayed"] == d["calls"]:
        return "replay"
    if d["derived"]:
        return "derive+check"
    if d["compiles"]:
        return "learn+install"
    if d["recordings"]:
        return "learn"
    return "first" if first else "eager (opt check / skip)"


def run(name: str, steps: int, rnd: int, profile: bool):
    import mindspore as ms

    import bench_regions as B
    import ms_dynvm

    build, make_inputs, sizes = B.WORKLOADS[name]()
    rng = np.random.default_rng(1000 + rnd)
    seq = [sizes[int(i)] for i in rng.integers(0, len(sizes), steps)]
    out = {}
    for cfg in ("eager", "dynvm"):
        if cfg == "dynvm":
            ms_dynvm.reset_stats()
            ms_dynvm.enable()
        prof = cProfile.Profile() if (profile and cfg == "dynvm") else None
        try:
            step = build(rnd)
            drng = np.random.default_rng(rnd + 7)
            data = [make_inputs(drng, s) for s in seq]
            rows = []
            prev = _counters(ms_dynvm.stats()) if cfg == "dynvm" else None
            t_all = time.perf_counter()
            if prof:
                prof.enable()
            for i, (s, inp) in enumerate(zip(seq, data)):
                t0 = time.perf_counter()
                step(*inp).asnumpy()
                dt = time.perf_counter() - t0
                if cfg == "dynvm":
                    cur = _counters(ms_dynvm.stats())
                    d = {k: cur[k] - prev[k] for k in cur}
                    prev = cur
                    rows.append((i, s, dt, _classify(d, i == 0), d))
                else:
                    rows.append((i, s, dt, "eager", None))
            if prof:
                prof.disable()
            total = time.perf_counter() - t_all
        finally:
            if cfg == "dynvm":
                ms_dynvm.disable()
        out[cfg] = (total, rows, prof)
    return seq, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gnn")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print every non-replay step")
    args = ap.parse_args()
    import mindspore as ms

    ms.runtime.launch_blocking()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    import bench_regions as B
    print(f"CPU: {B.cpu_name()}; load {' '.join(load)}; {time.strftime('%Y-%m-%d %H:%M')}")
    for name in args.only.split(","):
        for rnd in range(args.rounds):
            seq, out = run(name, args.steps, rnd, args.profile and rnd == args.rounds - 1)
            et, erows, _ = out["eager"]
            dt, drows, prof = out["dynvm"]
            eager_by = {}
            for i, s, t, _, _ in erows:
                eager_by.setdefault(s, []).append(t)
            eag_med = {s: statistics.median(v[len(v) // 2:]) for s, v in eager_by.items()}
            print(f"\n== {name} round {rnd}: eager {et:.3f} s, dynvm {dt:.3f} s ({et / dt:.2f}x); "
                  f"sizes seen {len(set(seq))}")
            by_kind: dict = {}
            for (i, s, t, kind, d), er in zip(drows, erows):
                k = by_kind.setdefault(kind, [0, 0.0, 0.0, 0.0])
                k[0] += 1
                k[1] += t
                k[2] += eag_med[s]
                k[3] += er[2]  # (the eager run's same step: the same size, as new to MindSpore then)
            for kind, (n, t, e, same) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
                print(f"   {kind:>26}: {n:4d} steps, {1e3 * t:8.1f} ms ({100 * t / dt:4.1f}%), "
                      f"{1e3 * t / n:6.2f} ms/step; eager: these steps {1e3 * same / n:6.2f}, "
                      f"steady at these sizes {1e3 * e / n:6.2f} ms/step")
            print("   first 8 steps, ms: eager " + " ".join(f"{1e3 * r[2]:.1f}" for r in erows[:8]) +
                  "; dynvm " + " ".join(f"{1e3 * r[2]:.1f}" for r in drows[:8]))
            per_size: dict = {}
            for i, s, t, kind, d in drows:
                if kind != "replay":
                    per_size.setdefault(s, []).append((i, kind, round(1e3 * t, 2)))
            for s, v in per_size.items():
                print(f"   size {s}: {len(v)} non-replay steps: " + ", ".join(f"#{i} {k} {t}ms" for i, k, t in v))
            d_last = drows[-1][4]
            import ms_dynvm
            st = ms_dynvm.stats()
            print(f"   counters: calls {st['region_calls']} replayed {st['regions_replayed']} compiles "
                  f"{st['region_compiles']} reverify {st['region_reverifications']} learn_s "
                  f"{st['region_learn_seconds']:.3f} plan_s {st['region_plan_seconds']:.3f} replay_s "
                  f"{st['region_replay_seconds']:.3f} host_s {st['region_host_seconds']:.3f}")
            if prof:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    return 0


if __name__ == "__main__":
    sys.exit(main())
