"""The step switch on plain-function loops (no nn.Cell, no backward pass): sync-anchored steps.

A script that calls plain functions in a loop has no region to anchor steps on; its steps run from
one sync point (here each call's `asnumpy()`) to the next at least `dispatch.MIN_SYNC_STEP_S` later
(see docs/architecture.md, "The step switch"). Three loops, the sizes changing every call:
- small-matmul: `cumsum(matmul(x, m.T), 1)` on [B,16] (B in 2..8): nothing to fuse, so the VM only
  adds recording and run tracking to MindSpore's own time;
- chain:        tanh(relu(exp(x*0.5-1)*m + x) - 0.25) on [B,784] (B in 16..128);
- softmax:      softmax(x + (1-m)*-1e4, -1) on [4B,S] (B in 4..32, S in 32..256).
(The chain and the softmax are bench_tier1.py's: `profiling/workloads.issue_loops`.)
Sides, in one process, interleaved (the order alternates every round), blocking mode:
- eager:    MindSpore alone;
- vm-only:  `enable(step_switch=False, compile_policy="threshold")`: every call under the VM;
- ms_dynvm: `enable(compile_policy="threshold")`, the step switch on (its default).
Each side warms up first (compiles, the switch's first samples), then R rounds of N calls each;
reported: median per-call time per side, and eager / side.

    python profiling/bench/bench_plain_loop.py [--rounds 9] [--calls 30] [--warmup 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")  # kernels in place before the timed part
import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=40)
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import ops

    import ms_dynvm

    ms.runtime.launch_blocking()
    rng = np.random.default_rng(0)

    def small_matmul(x, m):
        return ops.cumsum(ops.matmul(x, m.T), 1)

    def small_inputs():
        b = int(rng.integers(2, 9))
        return (ms.Tensor(rng.standard_normal((b, 16)).astype(np.float32)),
                ms.Tensor(rng.standard_normal((b, 16)).astype(np.float32)))

    from profiling.workloads import issue_loops

    loops = issue_loops(rng)  # the chain and the masked softmax of bench_tier1.py
    cases = {"small-matmul": (small_matmul, small_inputs), "chain": loops["chain"][:2],
             "softmax": loops["softmax"][:2]}
    # compile_policy="threshold": the groups are compiled during the warm-up (the default cost policy
    # compiles the chain's groups only after ~170 calls with background compiles), so the switch
    # decides with the fused groups in place.
    sides = {"eager": None, "vm-only": {"step_switch": False, "compile_policy": "threshold"},
             "ms_dynvm": {"compile_policy": "threshold"}}
    print(f"{args.rounds} rounds x {args.calls} calls per loop and side, after {args.warmup} warm-up calls "
          f"per side; median us per call (each call includes asnumpy())")
    print(f"{'loop':14s} {'eager':>8s} {'vm-only':>8s} {'ms_dynvm':>9s}   vm-only   ms_dynvm  steps vm/bare")
    for name, (fn, make) in cases.items():
        for opts in sides.values():
            if opts is not None:
                with ms_dynvm.enabled(**opts):
                    for _ in range(args.warmup):
                        fn(*make()).asnumpy()
        ms_dynvm.reset_stats()
        times = {s: [] for s in sides}
        for r in range(args.rounds):
            batch = [make() for _ in range(args.calls)]
            for x, m in batch:  # the first use of a fresh tensor copies it: in no side's time
                x._data_ptr()
                m._data_ptr()
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
            for side, opts in order:
                if opts is not None:
                    ms_dynvm.enable(**opts)
                t0 = time.perf_counter()
                for x, m in batch:
                    fn(x, m).asnumpy()
                times[side].append((time.perf_counter() - t0) / len(batch) * 1e6)
                if opts is not None:
                    ms_dynvm.disable()
        med = {s: statistics.median(v) for s, v in times.items()}
        calls = ms_dynvm.stats()["step_calls"]
        print(f"{name:14s} {med['eager']:8.1f} {med['vm-only']:8.1f} {med['ms_dynvm']:9.1f}   "
              f"{med['eager'] / med['vm-only']:6.2f}x   {med['eager'] / med['ms_dynvm']:6.2f}x   "
              f"{calls.get('vm', 0)}/{calls.get('bare', 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
