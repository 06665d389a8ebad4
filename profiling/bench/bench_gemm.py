"""GEMM choice for replayed regions (ms_dynvm/jit/gemm.py): NumPy's matmul (the OpenBLAS NumPy's
wheel ships), oneDNN's `dnnl_sgemm` (the library MindSpore's wheel ships, which its MatMul uses)
through `jit.gemm.matmul`, and MindSpore's own MatMul in blocking mode, on the products of an MLP
training step (x W^T forward, dY W and dY^T X backward), side by side in one process.

    python profiling/bench/bench_gemm.py [--reps 50] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import mindspore as ms
    from mindspore import ops

    from ms_dynvm.jit import gemm
    from bench_regions import cpu_name

    ms.runtime.launch_blocking()
    print(f"CPU: {cpu_name()}; {os.cpu_count()} cores; gemm backend {gemm.BACKEND}; NumPy {np.__version__}")
    rng = np.random.default_rng(0)
    cases = []
    for m in (1, 8, 64):
        x = rng.standard_normal((m, 784)).astype(np.float32)
        w = rng.standard_normal((512, 784)).astype(np.float32)
        dy = rng.standard_normal((m, 512)).astype(np.float32)
        cases += [(f"[{m},784] x [512,784]^T", x, w, False, True),
                  (f"[{m},512] x [512,784]", dy, w, False, False),
                  (f"[{m},512]^T x [{m},784]", dy, x, True, False)]
    print(f"{'product':<26} {'numpy us':>10} {'onednn us':>10} {'mindspore us':>13}  (median of {args.rounds} rounds)")
    for name, a, b, ta, tb in cases:
        ta_, tb_ = ms.Tensor(a), ms.Tensor(b)
        res = {"numpy": [], "onednn": [], "ms": []}
        for _ in range(args.rounds):
            res["numpy"].append(_time(lambda: np.matmul(a.T if ta else a, b.T if tb else b), args.reps))
            res["onednn"].append(_time(lambda: gemm.matmul(a, b, ta, tb), args.reps))
            res["ms"].append(_time(lambda: ops.matmul(ta_.T if ta else ta_, tb_.T if tb else tb_).asnumpy(), args.reps))
        want = np.matmul(a.T if ta else a, b.T if tb else b)
        err = float(np.max(np.abs(gemm.matmul(a, b, ta, tb) - want)) / max(1.0, float(np.max(np.abs(want)))))
        med = {k: statistics.median(v) for k, v in res.items()}
        print(f"{name:<26} {med['numpy']:>10.1f} {med['onednn']:>10.1f} {med['ms']:>13.1f}  rel.err {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
