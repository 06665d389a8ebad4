"""Memory-pool soak: a LayerNorm+GELU residual FFN training loop with seq_len random in 32..256.

Runs `--steps` training steps (value_and_grad + SGD) under
`ms_dynvm.enable(compile_policy="threshold", pool_results=True)`
so that tier 1 fuses the elementwise/norm runs and takes their results from the pool, and reports after
a warm-up of `--warmup` steps:
- pool peak reserved / peak live bytes (target <= 1.15; live = capacities of the blocks in use), and
  the same against the bytes actually requested;
- pool reuse rate over the post-warm-up allocations (target >= 99%);
- process RSS growth from the end of warm-up to the end (target <= 5%), with the pool's own reserved
  bytes and glibc's heap (in use / free but kept, from mallinfo2) over the same steps, and two
  control runs of the same loop in fresh processes (same seed, so the same shapes): tier 1 with fresh
  NumPy results (`pool_results=False`) and plain MindSpore without ms_dynvm. What grows in the
  controls too is not the pool's.
- median cost per buffer on the run's buffer sizes (B*S*d and B*S*hidden floats, S in 32, 100, 256),
  each sample timed on its own, the kinds interleaved: pool allocate+release+safe_point (target <= 2
  us), `Pool.array` + drop + safe_point (what tier 1 does per kernel result; target <= ~1.5 us), and a
  fresh `np.empty` + drop; one buffer per safe point, and 4 per safe point (a tier-1 launch makes 1 to
  8 results). Measured in this process twice: before the run (MindSpore imported, a new pool) and
  after it (the run's pool).

    python profiling/bench_pool_soak.py [--steps 2000] [--warmup 200] [--no-control]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

D, HIDDEN = 64, 256


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def heap() -> tuple[int, int] | None:
    """glibc's heap (bytes in use, bytes free but kept), from mallinfo2; None where unavailable."""
    try:
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks",
                                                         "keepcost")]

        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = MallInfo2
        m = fn()
        return m.uordblks, m.fordblks
    except (OSError, AttributeError):
        return None


def soak(mode: str, steps: int, warmup: int, batch: int) -> dict:
    """The training loop; mode "pool" (pooled tier-1 results), "fresh" (tier 1, fresh arrays) or
    "eager" (no ms_dynvm). Returns RSS and pool readings."""
    import mindspore as ms
    from mindspore import nn, ops

    import ms_dynvm
    from ms_dynvm.runtime.memory_pool import default_pool

    ms.runtime.launch_blocking()

    class FFN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm((D,), epsilon=1e-5)
            self.fc1 = nn.Dense(D, HIDDEN)
            self.fc2 = nn.Dense(HIDDEN, D)

        def construct(self, x):
            return x + self.fc2(ops.gelu(self.fc1(self.ln(x)), approximate="none"))

    net = FFN()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-3)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).mean(), None, opt.parameters)
    rng = np.random.default_rng(0)
    pool = default_pool()
    if mode != "eager":
        ms_dynvm.enable(compile_policy="threshold", pool_results=mode == "pool")
    out: dict = {}
    t0 = time.perf_counter()
    for step in range(steps):
        s = int(rng.integers(32, 257))
        x = ms.Tensor(rng.standard_normal((batch, s, D)).astype(np.float32))
        loss, grads = grad_fn(x)
        opt(grads)
        float(loss)
        if step + 1 == warmup:
            out["rss_warm"], out["heap_warm"] = rss_bytes(), heap()
            out["pool_warm"] = pool.stats()
        if step + 1 == (steps + warmup) // 2:
            out["rss_mid"] = rss_bytes()
    out["elapsed"] = time.perf_counter() - t0
    out["pool_end"] = pool.stats()
    if mode != "eager":
        out["dynvm"] = ms_dynvm.stats()
        ms_dynvm.disable()
    out["rss_end"], out["heap_end"] = rss_bytes(), heap()
    return out


def rss_line(label: str, r: dict, pool_note: str = "") -> str:
    w, m, e = r["rss_warm"], r["rss_mid"], r["rss_end"]
    line = (f"{label}: RSS after warm-up {w / 2**20:.1f} MiB, at the end {e / 2**20:.1f} MiB: growth "
            f"{100 * (e - w) / w:.2f}% (second half of the post-warm-up steps: "
            f"{100 * (e - m) / m:.2f}%){pool_note}")
    if r["heap_warm"] and r["heap_end"]:
        (uw, fw), (ue, fe) = r["heap_warm"], r["heap_end"]
        line += (f"; glibc heap in use {uw / 2**20:.1f} -> {ue / 2**20:.1f} MiB, free but kept "
                 f"{fw / 2**20:.1f} -> {fe / 2**20:.1f} MiB")
    return line


def micro(pool, batch: int, label: str, n: int = 2000) -> None:
    """Median ns per buffer, each sample timed on its own, the three kinds interleaved: one buffer
    per safe point, then 4 per safe point (per buffer)."""
    f32 = np.dtype(np.float32)
    shapes = [(batch, s, c) for s in (32, 100, 256) for c in (D, HIDDEN)]
    clock = time.perf_counter_ns
    one = ([], [], [])
    four = ([], [], [])
    for shape in shapes:
        size = 4 * shape[0] * shape[1] * shape[2]
        for _ in range(2):  # warm the free lists with 4 blocks of this size
            bufs = [pool.allocate(size) for _ in range(4)]
            for b in bufs:
                b.release()
            arrs = [pool.array(shape, f32) for _ in range(4)]
            del arrs
            pool.safe_point()
        pool.safe_point()
        for _ in range(n):
            t0 = clock()
            b = pool.allocate(size)
            b.release()
            pool.safe_point()
            t1 = clock()
            a = pool.array(shape, f32)
            del a
            pool.safe_point()
            t2 = clock()
            a = np.empty(shape, f32)
            del a
            t3 = clock()
            one[0].append(t1 - t0)
            one[1].append(t2 - t1)
            one[2].append(t3 - t2)
        for _ in range(n // 4):
            t0 = clock()
            b0, b1 = pool.allocate(size), pool.allocate(size)
            b2, b3 = pool.allocate(size), pool.allocate(size)
            b0.release()
            b1.release()
            b2.release()
            b3.release()
            pool.safe_point()
            t1 = clock()
            a0, a1 = pool.array(shape, f32), pool.array(shape, f32)
            a2, a3 = pool.array(shape, f32), pool.array(shape, f32)
            del a0, a1, a2, a3
            pool.safe_point()
            t2 = clock()
            a0, a1 = np.empty(shape, f32), np.empty(shape, f32)
            a2, a3 = np.empty(shape, f32), np.empty(shape, f32)
            del a0, a1, a2, a3
            t3 = clock()
            four[0].append((t1 - t0) / 4)
            four[1].append((t2 - t1) / 4)
            four[2].append((t3 - t2) / 4)
    for what, (al, ar, em) in (("1 per safe point", one), ("4 per safe point", four)):
        print(f"{label}, {what}: pool allocate+release+safe_point median "
              f"{statistics.median(al) / 1e3:.2f} us (target <= 2 us); pool.array+drop+safe_point median "
              f"{statistics.median(ar) / 1e3:.2f} us (target <= ~1.5 us); fresh np.empty+drop median "
              f"{statistics.median(em) / 1e3:.2f} us")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--no-control", action="store_true", help="skip the two control runs")
    ap.add_argument("--mode", choices=("pool", "fresh", "eager"), default="pool",
                    help=argparse.SUPPRESS)  # a control run: print its RSS line only
    args = ap.parse_args()

    if args.mode != "pool":
        r = soak(args.mode, args.steps, args.warmup, args.batch)
        label = {"fresh": "control, tier 1 with fresh arrays (pool_results=False)",
                 "eager": "control, plain MindSpore (no ms_dynvm)"}[args.mode]
        print(rss_line(label, r) + f"; {r['elapsed']:.1f} s")
        return 0

    import mindspore  # noqa: F401 - the same process state for the first measurement

    from ms_dynvm.runtime.memory_pool import Pool, default_pool

    micro(Pool(), args.batch, "per buffer before the run, a new pool")
    r = soak("pool", args.steps, args.warmup, args.batch)
    end, warm, st = r["pool_end"], r["pool_warm"], r["dynvm"]
    post_allocs = end["allocs"] - warm["allocs"]
    post_reused = end["reused"] - warm["reused"]
    ratio = end["peak_reserved_bytes"] / max(end["peak_live_bytes"], 1)
    ratio_req = end["peak_reserved_bytes"] / max(end["peak_requested_bytes"], 1)
    print(f"{args.steps} steps (batch {args.batch}, seq_len 32..256, d {D}, hidden {HIDDEN}) in "
          f"{r['elapsed']:.1f} s; fused ops {100 * st['fusion_rate']:.1f}%, groups compiled "
          f"{st['groups_compiled']}, compiles {st['compiles']}")
    print(f"pool: allocs {end['allocs']} ({post_allocs} after warm-up), exact {end['exact_allocs']}, "
          f"best fit from a larger block {end['reused_larger']}, fresh {end['fresh_allocs']} "
          f"({end['fresh_allocs'] - warm['fresh_allocs']} after warm-up), trimmed "
          f"{end['trimmed_bytes'] / 2**20:.2f} MiB, fallback {end['fallback_allocs']}")
    print(f"peak reserved {end['peak_reserved_bytes'] / 2**20:.2f} MiB / peak live "
          f"{end['peak_live_bytes'] / 2**20:.2f} MiB = {ratio:.3f}   (target <= 1.15); against peak "
          f"requested {end['peak_requested_bytes'] / 2**20:.2f} MiB: {ratio_req:.3f}")
    print(f"reuse rate after warm-up {100 * post_reused / max(post_allocs, 1):.2f}%   (target >= 99%)")
    pool_note = (f"; pool reserved {warm['reserved_bytes'] / 2**20:.2f} -> "
                 f"{end['reserved_bytes'] / 2**20:.2f} MiB over the same steps")
    print(rss_line("pool run", r, pool_note) + "   (target <= 5%)")
    micro(default_pool(), args.batch, "per buffer after the run, its pool")
    if not args.no_control:
        for mode in ("fresh", "eager"):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode,
                                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                                   "--batch", str(args.batch)],
                                  capture_output=True, text=True, check=True)
            print(proc.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
