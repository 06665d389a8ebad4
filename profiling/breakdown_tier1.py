"""Where a served call's time goes: the chain tanh(relu(exp(x*0.5-1)*m + x) - 0.25) on [B,784].

In one process, blocking mode, interleaved rounds, medians per call (8 dispatched ops + asnumpy):
- eager:       no dispatch mode;
- floor:       an MsDispatchMode that returns a fresh, unwritten NumPy-backed tensor for every op
               (what serving inside dispatch costs at the least: MindSpore's per-op work outside
               the handler, the handler call, a result tensor);
- ms_dynvm:    `enable(compile_policy="threshold")`, results from the memory pool, and the same with
               `pool_results=False` (fresh arrays);
and, inside the ms_dynvm calls (perf_counter around the pieces): the kernels themselves, launching
(binding, launch lookup, result tensors, tags) without the kernels, and serving one op.
Last, MindSpore's own threads: CPU seconds each thread used during a 3-second loop of eager ops.

    python profiling/breakdown_tier1.py [--b 72] [--rounds 7] [--calls 30]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Kernels compile synchronously here (inside the call that makes a group hot), so that the
# warm-up ends with every kernel in place; ms_dynvm's default compiles in the background.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
import numpy as np  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=72)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()

    import gc

    import mindspore as ms
    from mindspore import Tensor, ops

    import ms_dynvm
    from ms_dynvm.codegen import kernel as kernel_mod
    from ms_dynvm.frontend import tier1 as t1_mod

    ms.runtime.launch_blocking()
    rng = np.random.default_rng(0)
    b = args.b

    def chain(x, m):
        return ops.tanh(ops.relu(ops.exp(x * 0.5 - 1.0) * m + x) - 0.25)

    def inputs():
        return (ms.Tensor(rng.standard_normal((b, 784)).astype(np.float32)),
                ms.Tensor((rng.random((b, 784)) > 0.3).astype(np.float32)))

    class Floor(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kw=None):
            return Tensor.from_numpy(np.empty((b, 784), np.float32))

    # Timers around the pieces of tier 1 (installed once; they only add to `acc`).
    acc = {"kernel": 0.0, "launch": 0.0, "serve": 0.0}
    cnt = {"launch": 0, "serve": 0}
    prepare = kernel_mod.CompiledKernel.prepare_sized  # what tier 1's launches are made with

    def timed_prepare(self, *a):
        go = prepare(self, *a)

        def timed_go(ptrs):
            t = time.perf_counter()
            go(ptrs)
            acc["kernel"] += time.perf_counter() - t
        return timed_go

    kernel_mod.CompiledKernel.prepare_sized = timed_prepare
    for name in ("try_start", "serve"):
        orig = getattr(t1_mod.Tier1, name)

        def timed(self, *a, _orig=orig, _key="launch" if name == "try_start" else "serve"):
            t = time.perf_counter()
            r = _orig(self, *a)
            if r is not t1_mod._MISS:
                acc[_key] += time.perf_counter() - t
                cnt[_key] += 1
            return r
        setattr(t1_mod.Tier1, name, timed)

    for pool in (True, False):  # compile (and warm both allocators) before timing
        with ms_dynvm.enabled(compile_policy="threshold", pool_results=pool):
            for _ in range(20):
                chain(*inputs()).asnumpy()
    gc.collect()

    sides = ["eager", "floor", "ms_dynvm (pool)", "ms_dynvm (fresh arrays)"]
    per_call = {s: [] for s in sides}
    parts = {k: [] for k in ("kernel", "launch", "serve")}
    for r in range(args.rounds):
        batch = [inputs() for _ in range(args.calls)]
        for x, m in batch:  # first use of a fresh tensor copies it: not part of any side
            x._data_ptr()
            m._data_ptr()
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            mode = None
            if side == "floor":
                mode = Floor()
                mode.__enter__()
            elif side.startswith("ms_dynvm"):
                ms_dynvm.enable(compile_policy="threshold", pool_results=side.endswith("(pool)"))
                for k in acc:
                    acc[k] = 0.0
                cnt["launch"] = cnt["serve"] = 0
            t0 = time.perf_counter()
            for x, m in batch:
                chain(x, m).asnumpy()
            per_call[side].append((time.perf_counter() - t0) / len(batch))
            if mode is not None:
                mode.__exit__(None, None, None)
            elif side.startswith("ms_dynvm"):
                ms_dynvm.disable()
                if side.endswith("(pool)"):
                    n = len(batch)
                    parts["kernel"].append(acc["kernel"] / n)
                    parts["launch"].append((acc["launch"] - acc["kernel"]) / max(cnt["launch"], 1))
                    parts["serve"].append(acc["serve"] / max(cnt["serve"], 1))

    print(f"chain on [{b},784]: {args.rounds} interleaved rounds x {args.calls} calls, medians, us")
    for s in sides:
        print(f"  {s:26s} {statistics.median(per_call[s]) * 1e6:8.1f} per call")
    print(f"  inside ms_dynvm (pool): kernels {statistics.median(parts['kernel']) * 1e6:.1f} per call, "
          f"launch without the kernel {statistics.median(parts['launch']) * 1e6:.1f} per launch, "
          f"serving {statistics.median(parts['serve']) * 1e6:.1f} per served op")

    # MindSpore's own threads during a loop of eager ops.
    def thread_cpu():
        out = {}
        for path in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
            with open(path) as f:
                s = f.read()
            name = s[s.find("(") + 1:s.find(")")]
            fields = s[s.find(")") + 2:].split()
            out[(path.split("/")[4], name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    x = ms.Tensor(np.ones((b, 784), np.float32))
    before, t0, n = thread_cpu(), time.perf_counter(), 0
    while time.perf_counter() - t0 < 3.0:
        ops.exp(x)
        n += 1
    wall, after = time.perf_counter() - t0, thread_cpu()
    busy = sorted(((after[k] - before.get(k, 0.0), k[1]) for k in after), reverse=True)
    print(f"  eager op loop: {n} ops in {wall:.1f} s; CPU seconds by thread: "
          + ", ".join(f"{name} {sec:.2f}" for sec, name in busy if sec > 0.05))
    return 0


if __name__ == "__main__":
    sys.exit(main())
