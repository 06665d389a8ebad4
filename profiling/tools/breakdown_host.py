"""Where the host cost of one replay of a `bench_regions.py` workload goes (everything a replay does
around its plan): the argument key, the guards (`_Entry.guard`, and the guards as data,
`check_guards`), the input views (`Regions._arrays`), the output wrapping (`Tensor.from_numpy` and
the result's structure), each timed alone (median of rounds), then whole calls with the counters'
`region_replay_seconds` / `region_host_seconds` per replay, and the plan alone.

    python profiling/tools/breakdown_host.py [--workload attn_inf] [--size 4,16] [--reps 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

import numpy as np  # noqa: E402


def _time(f, reps: int, rounds: int = 5) -> float:
    f()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="attn_inf")
    ap.add_argument("--size", default="4,16")
    ap.add_argument("--reps", type=int, default=2000)
    args = ap.parse_args()

    import mindspore as ms

    import bench_regions as br
    import ms_dynvm
    from ms_dynvm.frontend import regions as R

    ms.runtime.launch_blocking()
    size = br.size_arg(args.size)
    build, make_inputs, _ = br.WORKLOADS[args.workload]()
    ms_dynvm.enable()
    try:
        net = build(0)
        inputs = make_inputs(np.random.default_rng(0), size)
        for _ in range(40):
            net(*inputs).asnumpy()
        region = R._region_of_cell(net)
        entries = [e for e in region.entries.values() if e.state == "replay"]
        if not entries:
            print("not replaying:", ms_dynvm.stats()["regions_not_replayable"])
            return 1
        entry = entries[0]
        flat: list = []
        R._arg_spec(inputs, flat)
        arrays = R.Regions._arrays(entry, flat)
        outs = entry.plan.run(arrays)
        from_numpy = ms.Tensor.from_numpy

        def wrap():
            return R._rebuild(entry.out_spec, iter([from_numpy(a) for a in outs]))

        n = args.reps
        res = {
            "argument key (_arg_spec)": _time(lambda: R._arg_spec(inputs, []), n),
            "guards (_Entry.guard)": _time(entry.guard, n),
            "  guards as data (check_guards)": _time(lambda: R.check_guards(entry.guards), n),
            "input views (Regions._arrays)": _time(lambda: R.Regions._arrays(entry, flat), n),
            "output wrapping (from_numpy, structure)": _time(wrap, n),
        }
        R.REVERIFY_EVERY = 10 ** 9
        R.REVERIFY_AT = ()
        st = ms_dynvm.stats()
        h0, r0, n0 = st["region_host_seconds"], st["region_replay_seconds"], st["regions_replayed"]
        calls = max(n // 2, 1)
        t0 = time.perf_counter()
        for _ in range(calls):
            net(*inputs)
        whole = (time.perf_counter() - t0) / calls * 1e6
        st = ms_dynvm.stats()
        k = st["regions_replayed"] - n0
        res["whole call"] = whole
        res["replay (region_replay_seconds)"] = (st["region_replay_seconds"] - r0) / k * 1e6
        res["host (region_host_seconds)"] = (st["region_host_seconds"] - h0) / k * 1e6
        res["plan.run alone"] = _time(lambda: entry.plan.run(arrays), max(n // 8, 1))
        print(f"{args.workload} {size}: {len(entry.guards)} guards, {len(entry.roles)} plan inputs, "
              f"{len(entry.plan.steps)} steps")
        for name, v in res.items():
            print(f"  {name:42s} {v:8.1f} us")
    finally:
        ms_dynvm.disable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
