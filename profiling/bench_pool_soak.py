"""Memory-pool soak: a LayerNorm+GELU residual FFN training loop with seq_len random in 32..256.

Runs `--steps` training steps (value_and_grad + SGD) under
`ms_dynvm.enable(compile_policy="threshold", pool_results=True)`
so that tier 1 fuses the elementwise/norm runs and takes their results from the pool, and reports after
a warm-up of `--warmup` steps:
- pool peak reserved / peak live bytes (target <= 1.15),
- pool reuse rate over the post-warm-up allocations (target >= 99%),
- process RSS growth from the end of warm-up to the end (target <= 5%),
- median allocate+release cost per buffer for the pool vs a fresh NumPy allocation, measured in the
  same process on the buffer sizes the run used (target <= 2 us).

    python profiling/bench_pool_soak.py [--steps 2000] [--warmup 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import nn, ops

    import ms_dynvm
    from ms_dynvm.runtime.memory_pool import default_pool

    ms.runtime.launch_blocking()
    d, hidden = 64, 256

    class FFN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm((d,), epsilon=1e-5)
            self.fc1 = nn.Dense(d, hidden)
            self.fc2 = nn.Dense(hidden, d)

        def construct(self, x):
            return x + self.fc2(ops.gelu(self.fc1(self.ln(x)), approximate="none"))

    net = FFN()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-3)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).mean(), None, opt.parameters)
    rng = np.random.default_rng(0)
    pool = default_pool()
    ms_dynvm.enable(compile_policy="threshold", pool_results=True)
    t0 = time.perf_counter()
    rss_warm = None
    warm_stats = None
    for step in range(args.steps):
        s = int(rng.integers(32, 257))
        x = ms.Tensor(rng.standard_normal((args.batch, s, d)).astype(np.float32))
        loss, grads = grad_fn(x)
        opt(grads)
        float(loss)
        if step + 1 == args.warmup:
            rss_warm = rss_bytes()
            warm_stats = pool.stats()
    elapsed = time.perf_counter() - t0
    end = pool.stats()
    st = ms_dynvm.stats()
    ms_dynvm.disable()
    rss_end = rss_bytes()

    post_allocs = end["allocs"] - warm_stats["allocs"]
    post_reused = end["reused"] - warm_stats["reused"]
    ratio = end["peak_reserved_bytes"] / max(end["peak_live_bytes"], 1)
    print(f"{args.steps} steps (batch {args.batch}, seq_len 32..256, d {d}, hidden {hidden}) in "
          f"{elapsed:.1f} s; fused ops {100 * st['fusion_rate']:.1f}%, groups compiled "
          f"{st['groups_compiled']}, compiles {st['compiles']}")
    print(f"pool: allocs {end['allocs']} ({post_allocs} after warm-up), exact {end['exact_allocs']}, "
          f"fallback {end['fallback_allocs']}")
    print(f"peak reserved {end['peak_reserved_bytes'] / 2**20:.2f} MiB / peak live "
          f"{end['peak_live_bytes'] / 2**20:.2f} MiB = {ratio:.3f}   (target <= 1.15)")
    print(f"reuse rate after warm-up {100 * post_reused / max(post_allocs, 1):.2f}%   (target >= 99%)")
    print(f"RSS after warm-up {rss_warm / 2**20:.1f} MiB, at the end {rss_end / 2**20:.1f} MiB: growth "
          f"{100 * (rss_end - rss_warm) / rss_warm:.2f}%   (target <= 5%)")

    # Allocate + release cost per buffer, on sizes like the run's (B*S*d and B*S*hidden floats).
    sizes = [args.batch * s * c * 4 for s in (32, 100, 256) for c in (d, hidden)]
    n = 2000
    pool_ns, np_ns = [], []
    for size in sizes:
        for _ in range(n):
            a = time.perf_counter_ns()
            buf = pool.allocate(size)
            buf.release()
            pool.safe_point()
            pool_ns.append(time.perf_counter_ns() - a)
            a = time.perf_counter_ns()
            arr = np.empty(size, np.uint8)
            del arr
            np_ns.append(time.perf_counter_ns() - a)
    print(f"allocate+release+safe_point per buffer: pool median {statistics.median(pool_ns) / 1e3:.2f} us, "
          f"fresh np.empty median {statistics.median(np_ns) / 1e3:.2f} us   (target <= 2 us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
