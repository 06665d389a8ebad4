"""Why ms_dynvm keeps Python off its background threads: blocking-eager steps of bench_regions.py's
attention block, alone and while a second thread runs pure Python. MindSpore releases the GIL at
every op and then waits up to the interpreter's switch interval (5 ms) to get it back from a busy
thread, so the eager steps slow down far more than two threads sharing a core would explain.

    python profiling/tools/gil_contention.py [--loops 10] [--switch-interval S]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=10, help="passes over the 9 sizes")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval for the run")
    a = ap.parse_args()
    import mindspore as ms

    import bench_regions as B

    ms.runtime.launch_blocking()
    build, make_inputs, sizes = B.WORKLOADS["attn_inf"]()
    rng = np.random.default_rng(7)
    inputs = [make_inputs(rng, s) for s in sizes]
    step = build(0)
    for x in inputs:
        step(*x).asnumpy()

    def eager() -> float:
        t0 = time.perf_counter()
        for _ in range(a.loops):
            for x in inputs:
                step(*x).asnumpy()
        return (time.perf_counter() - t0) / (a.loops * len(inputs))

    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    alone = eager()
    stop = []

    def busy():
        x = 0
        while not stop:
            for i in range(1000):
                x += i

    th = threading.Thread(target=busy, daemon=True)
    th.start()
    try:
        shared = eager()
    finally:
        stop.append(True)
        th.join()
    print(f"CPU: {B.cpu_name()}; switch interval {sys.getswitchinterval() * 1e3:.2f} ms")
    print(f"eager step alone {1e3 * alone:.2f} ms, with a busy Python thread {1e3 * shared:.2f} ms "
          f"({shared / alone:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
