"""Where the recorder's time goes per call of each benchmark workload, in `enable(jit=False)`.

CPU time of the calling thread (thread_time_ns) inside `Recorder.on_op` (every op: the C hot path
and its Python frame), `close_block` and `_open_block` (at Cell boundaries and phase changes) and
`_new_program`, summed per call of the workload and divided by its ops. The timers themselves add
about 0.3-1 us per timed call (more right after an op), so the figures are upper bounds; the end-to-
end cost of the same work is in bench_record_overhead.py.

Then, in a second pass with nothing patched, the C hot path alone (`_crecord.hit`, called by the
dispatcher) in time-stamp-counter cycles per call, through a C shim (`_tsc.c`) that adds no Python
frame or timer call: far less noisy than the timers above (median over rounds of the mean per call;
the shim's own cost, about 100 cycles, included), and the share of ops it recorded.

Then the C hot path by stage: `_crecord.c` built again with -DDVM_STAGES (time-stamp counter reads
between its stages, summed per stage), each op's hit timed where it runs (in place: "cold", right
after the MindSpore op, as in a real loop) and then called a second time at once on the same
arguments ("warm": the same work with the caches holding what the first call touched; it records the
op a second time, so only the timing of this pass means anything). The stage "argument tags, key"
is mostly MindSpore's `_get_user_data` on each tensor argument, "result tag" its `_set_user_data`:
the tensor identity every exact recorder pays for in MindSpore 2.10 (see bench_record_overhead.py);
the rest is the recorder's own work. Medians over the hits (a garbage collection that happens to run
inside one stage moves the means, not the medians), and their sum.

    python profiling/tools/breakdown_record.py [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

METHODS = ("on_op", "close_block", "_open_block", "_new_program")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()

    import mindspore as ms

    import bench_record_overhead as bench
    import ms_dynvm
    from ms_dynvm.frontend import recorder as rec_mod

    ms.runtime.launch_blocking()
    cases = bench.make_cases()
    spent: dict[str, list[int]] = {}
    ttn = time.thread_time_ns

    def timed(name):
        orig = getattr(rec_mod.Recorder, name)

        def w(self, *a, **k):
            t0 = ttn()
            try:
                return orig(self, *a, **k)
            finally:
                spent.setdefault(name, []).append(ttn() - t0)
        return orig, w

    origs = {}
    for name in METHODS:
        origs[name], w = timed(name)
        setattr(rec_mod.Recorder, name, w)
    ms_dynvm.enable(jit=False)
    try:
        print(f"{'workload':16s} {'ops':>4s} " + " ".join(f"{m + ' us/op (per call)':>30s}" for m in METHODS))
        for wname, (fn, inp) in cases.items():
            for _ in range(10):
                fn(*inp)
            spent.clear()
            for _ in range(args.calls):
                fn(*inp)
            n_ops = len(spent.get("on_op", [])) // args.calls
            cells = []
            for m in METHODS:
                v = spent.get(m, [])
                cells.append(f"{sum(v) / args.calls / 1e3 / max(n_ops, 1):8.2f} ({len(v) / args.calls:4.1f}x"
                             f" {sum(v) / max(len(v), 1) / 1e3:6.1f} us)")
            print(f"{wname:16s} {n_ops:4d} " + " ".join(f"{c:>30s}" for c in cells))
    finally:
        ms_dynvm.disable()
        for name, orig in origs.items():
            setattr(rec_mod.Recorder, name, orig)
    hit_cycles(cases, args.calls)
    stage_cycles(cases, args.calls)


def load_tsc():
    """profiling/tools/_tsc.c built with gcc and loaded, or None (no gcc, not x86-64)."""
    import bench_record_overhead as bench

    try:
        return bench.load_c("_tsc")
    except Exception as e:  # noqa: BLE001 - a profiling extra
        print(f"(no cycle counts: {type(e).__name__}: {e})")
        return None


def hit_cycles(cases, calls: int, rounds: int = 5) -> None:
    """Cycles per call of the C hot path in a steady loop of each workload (see the module doc)."""
    import statistics

    import ms_dynvm
    from ms_dynvm.frontend import recorder as rec_mod

    tsc = load_tsc()
    if tsc is None:
        return
    t0, c0 = time.perf_counter(), tsc.now()
    time.sleep(0.2)
    ghz = (tsc.now() - c0) / (time.perf_counter() - t0) / 1e9
    per = {name: [] for name in cases}
    hits = {}
    for _ in range(rounds):
        for wname, (fn, inp) in cases.items():
            ms_dynvm.enable(jit=False)
            try:
                if rec_mod._hit is None:
                    print("(no C hot path: nothing to count)")
                    return
                hit = rec_mod._hit
                tsc.set(hit)
                rec_mod._hit = tsc.call
                for _ in range(3):
                    fn(*inp)
                tsc.take()
                yes = [0, 0]

                def counted(*a):
                    r = tsc.call(*a)
                    yes[r is True] += 1
                    return r

                for _ in range(calls):
                    fn(*inp)
                cyc, n = tsc.take()
                per[wname].append(cyc / max(n, 1))
                rec_mod._hit = counted
                fn(*inp)
                hits[wname] = yes[1] / max(sum(yes), 1)
            finally:
                ms_dynvm.disable()
    print(f"\nC hot path alone (time stamp counter at {ghz:.2f} GHz; median over {rounds} rounds of "
          f"{calls} calls each)")
    print(f"{'workload':16s} {'cycles/call':>12s} {'us/call':>8s} {'recorded in C':>14s}")
    for wname, v in per.items():
        m = statistics.median(v)
        print(f"{wname:16s} {m:12.0f} {m / ghz / 1e3:8.2f} {hits[wname]:13.0%}")


def stage_cycles(cases, calls: int) -> None:
    """The C hot path's cycles by stage, cold (in place) and warm (called again at once); see the
    module doc."""
    import statistics

    import ms_dynvm
    from ms_dynvm.codegen import gcc
    from ms_dynvm.frontend import fastpath
    from ms_dynvm.frontend import recorder as rec_mod

    try:
        with open(fastpath._SOURCE) as f:
            staged = fastpath._load_bytes(gcc.compile_shared(f.read(), fastpath._build_flags() + ["-DDVM_STAGES"]),
                                          "_crecord")
    except Exception as e:  # noqa: BLE001 - a profiling extra
        print(f"(no stage counts: {type(e).__name__}: {e})")
        return
    saved = fastpath._state.get("module")
    fastpath._state["module"] = staged
    rows = {}
    try:
        for wname, (fn, inp) in cases.items():
            ms_dynvm.enable(jit=False)
            try:
                rec_mod.set_c_hot_path(True)
                hit = rec_mod._hit
                if hit is not staged.hit:
                    print("(the staged hot path did not load: no stage counts)")
                    return
                cold, warm = [], []

                def twice(*a):
                    staged.stages()
                    r = hit(*a)
                    c = staged.stages()
                    if r is True:
                        hit(*a)
                        cold.append(c)
                        warm.append(staged.stages())
                    return r

                for _ in range(3):
                    fn(*inp)
                rec_mod._hit = twice
                for _ in range(calls):
                    fn(*inp)
                rows[wname] = (cold, warm)
            finally:
                ms_dynvm.disable()
    finally:
        fastpath._state["module"] = saved
        rec_mod.set_c_hot_path(True)
    names = [k for k in next(iter(rows.values()))[0][0]]
    print(f"\nC hot path by stage (time stamp counter cycles per hit, medians; cold: in place | warm: "
          f"the same call again at once; {calls} calls of each workload)")
    print(f"{'stage':24s}" + "".join(f"{w:>18s}" for w in rows))
    med = statistics.median
    for k in names + ["sum of the stages"]:
        cells = []
        for cold, warm in rows.values():
            if k == "sum of the stages":
                c, w = med(sum(x.values()) for x in cold), med(sum(x.values()) for x in warm)
            else:
                c, w = med(x[k] for x in cold), med(x[k] for x in warm)
            cells.append(f"{c:8.0f} |{w:7.0f}")
        print(f"{k:24s}" + "".join(f"{c:>18s}" for c in cells))


if __name__ == "__main__":
    main()
