"""Memory-pool soak: a LayerNorm+GELU residual FFN training loop with seq_len random in 32..256.

Warm-up, then `--steps` measured training steps (value_and_grad + SGD, seq_len random, seed 0) under
`ms_dynvm.enable(compile_policy="threshold", pool_results=True)`
so that tier 1 fuses the elementwise/norm runs and takes their results from the pool. The warm-up
(`--warmup shapes`, the default) runs every seq_len in 32..256 once (225 steps, a fixed shuffled
order; `--sweep ascending` for increasing order): for a dynamic-shape workload, "warm" means every
shape has been seen, since MindSpore keeps state per shape (its in-use heap grows by ~50 MiB while new
seq_lens keep appearing, with or without ms_dynvm). `--warmup N` is the older definition: the first N
of the random steps (then only `--steps` - N are measured). Reported:
- pool peak reserved / peak live bytes (target <= 1.15; live = capacities of the blocks in use), and
  the same against the bytes actually requested;
- pool reuse rate over the post-warm-up allocations (target >= 99%);
- the pool's heap trimming (`Pool.heap_trim_mb`: glibc malloc_trim at safe points once the RSS grew;
  `--heap-trim-mb` sets it for the pool run): calls, their time, the RSS they released;
- process RSS growth after warm-up (target <= 5%): between the RSS peaks over the first and the last
  200 measured steps (read after every step: where the heap is trimmed the RSS moves up and down by
  tens of MiB between trims, and a single reading can fall anywhere in that band), then between single
  readings at the end of warm-up and at the end; also from 200 random steps later (where the older
  warm-up ended) and over the second half. Where the pool trims the heap (the pool run, with
  heap_trim_mb set, and the --trim-control run) the warm-up ends with one `trim_heap()`, so growth is
  measured from a trimmed heap (the lowest start) rather than from wherever the automatic trims,
  which wait while the RSS grows, have got to. With the pool's own reserved bytes, glibc's heap (in
  use / free but kept / mmapped chunks, from mallinfo2), anonymous and file-backed RSS, and per
  measured step the wall time, CPU time of all threads and minor page faults (what re-touching
  trimmed memory costs). Two control runs of the same loop in fresh processes (same seeds, so the
  same shapes): tier 1 with fresh NumPy results (`pool_results=False`, so no pool safe points and no
  heap trimming) and plain MindSpore without ms_dynvm; with --trim-control a third, plain MindSpore
  with the pool's heap trimming at one safe point per step. What grows in the controls too is not
  the pool's.
- median cost per buffer on the run's buffer sizes (B*S*d and B*S*hidden floats, S in 32, 100, 256),
  each sample timed on its own, the kinds interleaved: pool allocate+release+safe_point (target <= 2
  us), `Pool.array` + drop + safe_point (what tier 1 does per kernel result; target <= ~1.5 us), and a
  fresh `np.empty` + drop; one buffer per safe point, and 4 per safe point (a tier-1 launch makes 1 to
  8 results). Measured in this process twice: before the run (MindSpore imported, a new pool) and
  after it (the run's pool).

    python profiling/bench/bench_pool_soak.py [--steps 2000] [--warmup shapes|N] [--sweep shuffled|ascending]
                                        [--heap-trim-mb default|off|MB] [--no-control] [--trim-control]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Kernels compile synchronously here (inside the call that makes a group hot), so that the
# warm-up ends with every kernel in place; ms_dynvm's default compiles in the background.
os.environ.setdefault("DYNVM_COMPILE_ASYNC", "0")
import numpy as np  # noqa: E402

D, HIDDEN = 64, 256


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_parts() -> tuple[int, int]:
    """(anonymous, file-backed) resident bytes, from /proc/self/status."""
    parts = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                parts[line.split(":")[0]] = int(line.split()[1]) << 10
    return parts.get("RssAnon", 0), parts.get("RssFile", 0)


def heap() -> tuple[int, int, int] | None:
    """glibc's heap (bytes in use in the arenas, bytes free but kept in them, bytes in mmapped chunks),
    from mallinfo2; None where unavailable."""
    try:
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                         "usmblks", "fsmblks", "uordblks", "fordblks",
                                                         "keepcost")]

        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = MallInfo2
        m = fn()
        return m.uordblks, m.fordblks, m.hblkhd
    except (OSError, AttributeError):
        return None


SWEEP = list(range(32, 257))  # every seq_len of the random steps
OLD_WARMUP = 200  # the warm-up of earlier runs: the first 200 random steps
WINDOW = 200  # steps: RSS peaks over the first and the last of these (not tied to one reading)


def soak(mode: str, steps: int, warmup: int | None, batch: int, heap_trim_mb: str = "default",
         sweep: str = "shuffled") -> dict:
    """The training loop; mode "pool" (pooled tier-1 results), "fresh" (tier 1, fresh arrays),
    "eager" (no ms_dynvm) or "eager-trim" (no ms_dynvm; the default pool's heap trimming with one
    safe point per step, nothing else of the pool). `warmup` None: every seq_len in 32..256 once (in
    the `sweep` order), then `steps` random steps, all measured; an int: the first `warmup` of the
    `steps` random steps. The random steps are the same either way (seed 0). Returns RSS and pool
    readings."""
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
    if heap_trim_mb != "default":
        pool.heap_trim_mb = None if heap_trim_mb == "off" else float(heap_trim_mb)
    if not mode.startswith("eager"):
        ms_dynvm.enable(compile_policy="threshold", pool_results=mode == "pool")
    per_step = pool.safe_point if mode == "eager-trim" else (lambda: None)

    def step(s: int, gen) -> None:
        x = ms.Tensor(gen.standard_normal((batch, s, D)).astype(np.float32))
        loss, grads = grad_fn(x)
        opt(grads)
        float(loss)
        per_step()

    def mark(key: str) -> None:
        out["rss_" + key], out["heap_" + key], out["pool_" + key] = rss_bytes(), heap(), pool.stats()
        out["parts_" + key] = rss_parts()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out["minflt_" + key], out["cpu_" + key] = ru.ru_minflt, (ru.ru_utime, ru.ru_stime)
        out["t_" + key] = time.perf_counter()

    def end_warmup() -> None:
        # Where the pool trims the heap, the warm-up ends with one trim_heap() (what a program can do
        # once it is warm): the growth is then measured from a trimmed heap, not from wherever the
        # automatic trims, which wait while the RSS grows, happen to be.
        if mode in ("pool", "eager-trim") and pool.heap_trim_mb is not None:
            out["rss_pretrim"] = rss_bytes()
            pool.trim_heap()
        mark("warm")

    out: dict = {"rss_start": rss_bytes()}
    t0 = time.perf_counter()
    if warmup is None:
        sweep_rng = np.random.default_rng(1)
        for s in sweep_rng.permutation(SWEEP) if sweep == "shuffled" else SWEEP:
            step(int(s), sweep_rng)
        end_warmup()
    old = warmup if warmup is not None else OLD_WARMUP
    trace = out["rss_trace"] = []  # RSS after every measured step
    for i in range(steps):
        step(int(rng.integers(32, 257)), rng)
        if warmup is None or i >= warmup:
            trace.append(rss_bytes())
        if i + 1 == old and warmup is not None:
            end_warmup()
        elif i + 1 == old:
            mark("old")
        if i + 1 == (steps + (warmup or 0)) // 2:
            out["rss_mid"] = rss_bytes()
    mark("end")
    out["elapsed"] = out["t_end"] - t0
    out["measured_s"] = out["t_end"] - out["t_warm"]
    out["measured_steps"] = steps - (warmup or 0)
    if not mode.startswith("eager"):
        out["dynvm"] = ms_dynvm.stats()
        ms_dynvm.disable()
    return out


def growth(r: dict, frm: str, to: str = "end") -> float:
    return 100 * (r["rss_" + to] - r["rss_" + frm]) / r["rss_" + frm]


def rss_line(label: str, r: dict, pool_note: str = "", target: str = "") -> str:
    """RSS growth after warm-up: first between the peaks over the first and the last WINDOW measured
    steps (where the heap is trimmed the RSS moves up and down by tens of MiB between two trims, and a
    single reading can fall anywhere in that band), then between single readings: at the end of the
    warm-up and at the end, also from OLD_WARMUP random steps later and over the second half."""
    w, e = r["rss_warm"], r["rss_end"]
    tr, k = r["rss_trace"], min(WINDOW, len(r["rss_trace"]) // 2)
    first, last = max(tr[:k]), max(tr[-k:])
    also = [f"second half of the measured steps: {growth(r, 'mid'):+.2f}%"]
    if "rss_old" in r:
        also.insert(0, f"from {OLD_WARMUP} random steps later, the old warm-up's length: "
                       f"{growth(r, 'old'):+.2f}%")
    pre = (f" ({r['rss_pretrim'] / 2**20:.1f} MiB before the trim_heap() that ends it)"
           if "rss_pretrim" in r else "")
    line = (f"{label}: RSS growth after warm-up, peak over the first {k} measured steps "
            f"{first / 2**20:.1f} MiB, over the last {k} {last / 2**20:.1f} MiB: "
            f"{100 * (last - first) / first:+.2f}%{target}; single readings: after warm-up "
            f"{w / 2**20:.1f} MiB{pre}, at the end {e / 2**20:.1f} MiB: {growth(r, 'warm'):+.2f}% "
            f"({'; '.join(also)}){pool_note}")
    if r["heap_warm"] and r["heap_end"]:
        (uw, fw, mw), (ue, fe, me) = r["heap_warm"], r["heap_end"]
        line += (f"; glibc heap in use {uw / 2**20:.1f} -> {ue / 2**20:.1f} MiB, free but kept "
                 f"{fw / 2**20:.1f} -> {fe / 2**20:.1f} MiB, mmapped chunks {mw / 2**20:.1f} -> "
                 f"{me / 2**20:.1f} MiB")
    (aw, fw), (ae, fe) = r["parts_warm"], r["parts_end"]
    line += (f"; RSS anonymous {aw / 2**20:.1f} -> {ae / 2**20:.1f} MiB, file-backed {fw / 2**20:.1f} -> "
             f"{fe / 2**20:.1f} MiB")
    n = r["measured_steps"]
    (uw, sw), (ue, se) = r["cpu_warm"], r["cpu_end"]
    line += (f"; per measured step {1e3 * r['measured_s'] / n:.2f} ms, CPU (all threads) user "
             f"{1e3 * (ue - uw) / n:.2f} + system {1e3 * (se - sw) / n:.2f} ms, "
             f"{(r['minflt_end'] - r['minflt_warm']) / n:.0f} minor page faults")
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
    ap.add_argument("--warmup", default="shapes",
                    help='"shapes" (default): every seq_len 32..256 once before the --steps measured '
                         'random steps; N: the first N of the random steps (the old definition)')
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--sweep", choices=("shuffled", "ascending"), default="shuffled",
                    help="order of the warm-up's seq_lens (--warmup shapes)")
    ap.add_argument("--heap-trim-mb", default="default",
                    help='the pool\'s heap_trim_mb for the pool run: a number, "off", or "default" (the '
                         "default pool's own setting)")
    ap.add_argument("--no-control", action="store_true", help="skip the two control runs")
    ap.add_argument("--trim-control", action="store_true",
                    help="a third control: plain MindSpore with the pool's heap trimming at one safe "
                         "point per step")
    ap.add_argument("--mode", choices=("pool", "fresh", "eager", "eager-trim"), default="pool",
                    help=argparse.SUPPRESS)  # a control run: print its RSS line only
    args = ap.parse_args()
    warmup = None if args.warmup == "shapes" else int(args.warmup)

    if args.mode != "pool":
        r = soak(args.mode, args.steps, warmup, args.batch, sweep=args.sweep)
        label = {"fresh": "control, tier 1 with fresh arrays (pool_results=False)",
                 "eager": "control, plain MindSpore (no ms_dynvm)",
                 "eager-trim": "control, plain MindSpore, heap trimming at a safe point per step"}[args.mode]
        note = ""
        if args.mode == "eager-trim":
            e, w = r["pool_end"], r["pool_warm"]
            note = (f"; {e['heap_trims'] - w['heap_trims']} malloc_trim calls after warm-up, "
                    f"{(e['heap_trim_ns'] - w['heap_trim_ns']) / 1e6:.1f} ms")
        print(rss_line(label, r, note) + f"; {r['elapsed']:.1f} s in all")
        return 0

    import mindspore  # noqa: F401 - the same process state for the first measurement

    from ms_dynvm.runtime.memory_pool import Pool, default_pool

    micro(Pool(), args.batch, "per buffer before the run, a new pool")
    r = soak("pool", args.steps, warmup, args.batch, args.heap_trim_mb, args.sweep)
    end, warm, st = r["pool_end"], r["pool_warm"], r["dynvm"]
    post_allocs = end["allocs"] - warm["allocs"]
    post_reused = end["reused"] - warm["reused"]
    ratio = end["peak_reserved_bytes"] / max(end["peak_live_bytes"], 1)
    ratio_req = end["peak_reserved_bytes"] / max(end["peak_requested_bytes"], 1)
    wu = (f"warm-up: every seq_len 32..256 once ({len(SWEEP)} steps), then {args.steps} measured random "
          f"steps" if warmup is None else
          f"{args.steps} random steps, warm-up: the first {warmup}")
    print(f"{wu} (batch {args.batch}, seq_len 32..256, d {D}, hidden {HIDDEN}) in "
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
    trims = end["heap_trims"] - warm["heap_trims"]
    print(f"heap trimming (heap_trim_mb {default_pool().heap_trim_mb}): after warm-up {trims} "
          f"malloc_trim calls, {(end['heap_trim_ns'] - warm['heap_trim_ns']) / 1e6:.1f} ms in all, "
          f"RSS released {(end['heap_released_bytes'] - warm['heap_released_bytes']) / 2**20:.1f} MiB; "
          f"{end['heap_checks'] - warm['heap_checks']} RSS readings; {end['heap_trims']} calls in the "
          f"whole run")
    pool_note = (f"; pool reserved {warm['reserved_bytes'] / 2**20:.2f} -> "
                 f"{end['reserved_bytes'] / 2**20:.2f} MiB over the same steps")
    print(rss_line("pool run", r, pool_note, "   (target <= 5%)"))
    micro(default_pool(), args.batch, "per buffer after the run, its pool")
    if not args.no_control:
        for mode in ("fresh", "eager") + (("eager-trim",) if args.trim_control else ()):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode,
                                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                                   "--sweep", args.sweep, "--batch", str(args.batch)],
                                  capture_output=True, text=True, check=True)
            print(proc.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
