"""Where a replayed region's time goes: the plan of one workload of `bench_regions.py` at one size,
step by step (time per step and per step kind, and minor page faults per run).

The workload runs under `ms_dynvm.enable()` until its region replays; the installed plan is then run
directly on the arrays of its last replay (`RegionPlan.run`), with its fused kernels swapped in
(`RegionPlan.fuse_now`) unless --unfused.

    python profiling/bench/profile_replay.py [--workload attn_inf] [--size 8,64] [--reps 200] [--unfused]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="attn_inf")
    ap.add_argument("--size", default="8,64")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--unfused", action="store_true")
    ap.add_argument("--calls", type=int, default=30, help="calls of the workload before profiling")
    args = ap.parse_args()

    import mindspore as ms

    import bench_regions as br
    import ms_dynvm
    from ms_dynvm.jit import replay

    ms.runtime.launch_blocking()
    runs: dict = {}
    orig_run = replay.RegionPlan.run

    def capture(self, arrays):
        runs[id(self)] = (self, [np.array(a, copy=True) for a in arrays])
        return orig_run(self, arrays)

    replay.RegionPlan.run = capture
    size = br.size_arg(args.size)
    build, make_inputs, _ = br.WORKLOADS[args.workload]()
    ms_dynvm.enable()
    try:
        step = build(0)
        rng = np.random.default_rng(0)
        for _ in range(args.calls):  # (new data each call: training regions learn from two different batches)
            step(*make_inputs(rng, size)).asnumpy()
    finally:
        ms_dynvm.disable()
        replay.RegionPlan.run = orig_run
    if not runs:
        print("no plan ran (not replayable?)", ms_dynvm.stats()["regions_not_replayable"])
        return 1
    plan, arrays = list(runs.values())[-1]
    unfused = getattr(plan, "unfused_steps", plan.steps)  # (a plan of a version without fusion)
    if args.unfused:
        plan._fuse = None
        plan.steps = unfused
    elif hasattr(plan, "fuse_now"):
        plan.fuse_now()
    for _ in range(20):
        plan.run(arrays)
    t0 = time.perf_counter()
    for _ in range(args.reps):
        plan.run(arrays)
    whole = (time.perf_counter() - t0) / args.reps
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        plan.run(arrays)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 50

    # RegionPlan.run itself, each step's function wrapped in a timer
    per = [0.0] * len(plan.steps)
    pc = time.perf_counter
    fns = [s.fn for s in plan.steps]

    def timed(i, fn):
        def run(a, attrs):
            t = pc()
            try:
                return fn(a, attrs)
            finally:
                per[i] += pc() - t
        return run

    steps = list(plan.steps)
    for i, s in enumerate(steps):
        s.fn = timed(i, s.fn)
    try:
        for _ in range(args.reps):
            plan.run(arrays)
    finally:
        for s, fn in zip(steps, fns):
            s.fn = fn
    assert plan.steps == steps, "the plan's steps changed while timed (fusion still compiling)"
    per = [p / args.reps for p in per]
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"{args.workload} {size}: {len(plan.steps)} steps ({len(unfused)} unfused), "
          f"plan.run {whole * 1e3:.3f} ms, steps {sum(per) * 1e3:.3f} ms, {faults:.0f} minor faults per run; "
          f"load {load}")
    kinds: dict = collections.defaultdict(float)
    for p, s in zip(per, plan.steps):
        name = getattr(s.fn, "__name__", type(s.fn).__name__)
        print(f"  {p * 1e6:8.1f} us  {s.op:12s} {name}")
        kinds[s.op if s.op != "fused" else name] += p
    print("per kind:")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {v * 1e6:8.1f} us  {100 * v / sum(per):5.1f}%  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
