"""Where the recorder's time goes per call of each benchmark workload, in `enable(jit=False)`.

CPU time of the calling thread (thread_time_ns) inside `Recorder.on_op` (every op: the C hot path
and its Python frame), `close_block` and `_open_block` (at Cell boundaries and phase changes) and
`_new_program`, summed per call of the workload and divided by its ops. The timers themselves add
about 0.3-1 us per timed call (more right after an op), so the figures are upper bounds; the end-to-
end cost of the same work is in bench_record_overhead.py.

    python profiling/breakdown_record.py [--calls 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


if __name__ == "__main__":
    main()
