"""Where a served call's time goes, and the least any tier-1 implementation could take.

For the CPU JIT issue's loops (`workloads.issue_loops`: the chain tanh(relu(exp(x*0.5-1)*m + x) -
0.25) on [B,784], the masked softmax on [4B,S], LayerNorm+GELU on [B,S,128]), with B and S drawn at
random on every call as in bench_tier1.py (or fixed with --b/--s), in one process, blocking mode,
interleaved rounds (the order of the sides alternates), medians per call (each call includes
`asnumpy()` of its result). Sides:

- eager:          no dispatch mode;
- floor:          an `MsDispatchMode` whose handler runs nothing and returns, for every op, a fresh
                  unwritten tensor of the op's result shape and dtype (taken from an eager run of
                  the same inputs before the timed part): MindSpore's own per-op work outside the
                  handler, the handler call and a result tensor: what serving inside dispatch
                  costs at the least;
- floor+writes:   the same, each result filled (`ndarray.fill`) in a buffer reused across calls:
                  adds the least memory traffic of handing back fully computed results (every
                  dispatched op's result is written once; no arithmetic, no reads);
- served:         ms_dynvm, `compile_policy="threshold"`, the step switch off and tier 1's size
                  switch forced on (every compiled group served: tier 1's own cost, whether or not
                  it beats eager at that size);
- ms_dynvm:       the default `enable()` after the same warm-up (both switches measuring).

Inside the served calls (perf_counter around the pieces): the kernels, a launch without its kernel
(binding, launch lookup, result tensors from the pool, tags) and serving one op.

Bound: tier 1 as ARCHITECTURE.md specifies it (ops dispatched one by one by MindSpore, every result
handed back fully computed) cannot take less than floor+writes per call, so eager / (floor+writes)
bounds its speed-up from above (arithmetic and launches come on top).

Last line (chain only): MindSpore's own threads, CPU seconds each used during a 3-second loop of
eager ops.

    python profiling/tools/breakdown_tier1.py [--workloads chain,softmax,lngelu] [--rounds 7] [--calls 30]
                                        [--b B] [--s S]
"""

from __future__ import annotations

import argparse
import gc
import glob
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Kernels compile synchronously here (inside the call that makes a group hot), so that the
# warm-up ends with every kernel in place; ms_dynvm's default compiles in the background.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
import numpy as np  # noqa: E402

SIDES = ["eager", "floor", "floor+writes", "served", "ms_dynvm"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="chain,softmax,lngelu")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--b", type=int, default=None, help="fixed B (default: random per call)")
    ap.add_argument("--s", type=int, default=None, help="fixed S (default: random per call)")
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import Tensor

    import ms_dynvm
    from ms_dynvm.codegen import kernel as kernel_mod
    from ms_dynvm.cost import model as cost_model
    from ms_dynvm.frontend import tier1 as t1_mod
    from profiling.workloads import issue_loops

    ms.runtime.launch_blocking()

    class FixedSizes:
        """The generator issue_loops draws from, with B (and S) fixed where given."""

        def __init__(self, rng):
            self.rng = rng

        workload = "chain"
        B_RANGE = {"chain": (16, 129), "softmax": (4, 33), "lngelu": (2, 9)}
        S_RANGE = {"softmax": (32, 257), "lngelu": (16, 129)}

        def integers(self, lo, hi=None, *a, **k):
            if (lo, hi) == self.B_RANGE[self.workload] and args.b is not None:
                return args.b
            if (lo, hi) == self.S_RANGE.get(self.workload) and args.s is not None:
                return args.s
            return self.rng.integers(lo, hi, *a, **k)

        def __getattr__(self, name):
            return getattr(self.rng, name)

    sizes = FixedSizes(np.random.default_rng(0))
    loops = issue_loops(sizes)

    class Shapes(ms.MsDispatchMode):
        """Runs each op and notes its results' (shape, dtype) in order."""

        def __init__(self):
            self.seen = []

        def __ms_dispatch__(self, func, a, kw=None):
            out = func(*a, **kw) if kw else func(*a)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.seen.append([(tuple(o.shape), o.asnumpy().dtype) for o in outs])
            return out

    class Floor(ms.MsDispatchMode):
        """Hands back unwritten (or, with `write`, filled) tensors of the recorded result shapes."""

        def __init__(self, write: bool):
            self.write = write
            self.plan = None
            self.i = 0
            self.buffers = {}

        def __ms_dispatch__(self, func, a, kw=None):
            specs = self.plan[self.i]
            self.i += 1
            outs = []
            for shape, dt in specs:
                if self.write:
                    # A ring of flat buffers per dtype, grown to the largest size seen and reused
                    # (as the memory pool reuses blocks): page faults are no part of the bound.
                    n = int(np.prod(shape))
                    ring = self.buffers.setdefault(dt, [[np.empty(0, dt)] * 4, 0])
                    k = ring[1] = (ring[1] + 1) % 4
                    if ring[0][k].size < n:
                        ring[0][k] = np.empty(max(n, 2 * ring[0][k].size), dt)
                        ring[0][k].fill(0)
                    arr = ring[0][k][:n].reshape(shape)
                    arr.fill(1)
                    outs.append(Tensor.from_numpy(arr))
                else:
                    outs.append(Tensor.from_numpy(np.empty(shape, dt)))
            return tuple(outs) if len(outs) > 1 else outs[0]

    # Timers around the pieces of tier 1 (they only add to `acc` when `on`).
    acc = {"kernel": 0.0, "launch": 0.0, "serve": 0.0, "on": False}
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
            if r is not t1_mod._MISS and r is not t1_mod._EAGER:
                acc[_key] += time.perf_counter() - t
                cnt[_key] += 1
            return r
        setattr(t1_mod.Tier1, name, timed)

    real_serve = cost_model.SizeSwitch.should_serve
    always = lambda self, cls, warm=False: True  # noqa: E731

    def configure(side):
        if side == "served":
            cost_model.SizeSwitch.should_serve = always
            ms_dynvm.enable(compile_policy="threshold", step_switch=False)
        else:
            cost_model.SizeSwitch.should_serve = real_serve
            ms_dynvm.enable()

    names = [w for w in args.workloads.split(",") if w]
    print(f"{args.rounds} interleaved rounds x {args.calls} calls per workload and side, medians, us per call "
          f"(sizes {'random per call' if args.b is None and args.s is None else f'B={args.b} S={args.s}'})")
    print(f"{'workload':10s}" + "".join(f"{s:>14s}" for s in SIDES)
          + f"{'3x budget':>11s}{'bound':>8s}   served: kernels, launch w/o kernel, serve per op")
    for wname in names:
        fn, make, _ = loops[wname]
        sizes.workload = wname
        for side in ("served", "ms_dynvm"):  # compile, and let the switches measure
            configure(side)
            for _ in range(args.warmup):
                fn(*make()).asnumpy()
            ms_dynvm.disable()
        gc.collect()
        per_call = {s: [] for s in SIDES}
        parts = {k: [] for k in ("kernel", "launch", "serve")}
        for r in range(args.rounds):
            batch = [make() for _ in range(args.calls)]
            for xs in batch:  # first use of a fresh tensor copies it: not part of any side
                for x in xs:
                    x._data_ptr()
            plans = []
            for xs in batch:
                with Shapes() as sh:
                    fn(*xs).asnumpy()
                plans.append(sh.seen)
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for side in order:
                mode = None
                if side.startswith("floor"):
                    mode = Floor(side == "floor+writes")
                    mode.__enter__()
                elif side in ("served", "ms_dynvm"):
                    configure(side)
                    for k in ("kernel", "launch", "serve"):
                        acc[k] = 0.0
                    cnt["launch"] = cnt["serve"] = 0
                t0 = time.perf_counter()
                for k, xs in enumerate(batch):
                    if mode is not None:
                        mode.plan, mode.i = plans[k], 0
                    fn(*xs).asnumpy()
                per_call[side].append((time.perf_counter() - t0) / len(batch))
                if mode is not None:
                    mode.__exit__(None, None, None)
                elif side in ("served", "ms_dynvm"):
                    ms_dynvm.disable()
                    if side == "served":
                        n = len(batch)
                        parts["kernel"].append(acc["kernel"] / n)
                        parts["launch"].append((acc["launch"] - acc["kernel"]) / max(cnt["launch"], 1))
                        parts["serve"].append(acc["serve"] / max(cnt["serve"], 1))
        cost_model.SizeSwitch.should_serve = real_serve
        med = {s: statistics.median(v) * 1e6 for s, v in per_call.items()}
        print(f"{wname:10s}" + "".join(f"{med[s]:14.1f}" for s in SIDES)
              + f"{med['eager'] / 3:11.1f}{med['eager'] / med['floor+writes']:7.2f}x   "
              + f"{statistics.median(parts['kernel']) * 1e6:.1f}, {statistics.median(parts['launch']) * 1e6:.1f}, "
              + f"{statistics.median(parts['serve']) * 1e6:.1f}")

    if "chain" in names:  # MindSpore's own threads during a loop of eager ops
        def thread_cpu():
            out = {}
            for path in glob.glob(f"/proc/{os.getpid()}/task/*/stat"):
                with open(path) as f:
                    s = f.read()
                name = s[s.find("(") + 1:s.find(")")]
                fields = s[s.find(")") + 2:].split()
                out[(path.split("/")[4], name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            return out

        from mindspore import ops
        x = ms.Tensor(np.ones((72, 784), np.float32))
        before, t0, n = thread_cpu(), time.perf_counter(), 0
        while time.perf_counter() - t0 < 3.0:
            ops.exp(x)
            n += 1
        wall, after = time.perf_counter() - t0, thread_cpu()
        busy = sorted(((after[k] - before.get(k, 0.0), k[1]) for k in after), reverse=True)
        print(f"eager op loop (exp on [72,784]): {n} ops in {wall:.1f} s; CPU seconds by thread: "
              + ", ".join(f"{name} {sec:.2f}" for sec, name in busy if sec > 0.05))
    return 0


if __name__ == "__main__":
    sys.exit(main())
