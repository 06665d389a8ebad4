"""GPU benchmark of the CUDA backend, side by side in one run on one device: torch eager,
torch.compile(dynamic=True), ms_dynvm's generated kernels, and the device-copy bandwidth.

Cases (the CUDA issue's): the elementwise chain (exp(x-1)*m + x)*0.5 at n = 19,200, 2^24, 2^27;
the masked softmax softmax(x + (1-m)*-1e4, -1) over 1024 rows at 39 sequence lengths 32..512
(one ms_dynvm compile for all of them); the host cost of one launch; NVRTC cold and warm compile
times; a second process with a warm disk cache (compiles counted). Times are CUDA-event medians over
`--rounds` rounds after warm-up, with the spread (min, max); bandwidth counts bytes read + written
once. ms_dynvm's kernels run on the data of torch's tensors (their device pointers), so all three
read the same memory.

    python profiling/bench/bench_cuda.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def summary(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "n": len(xs)}


def time_cuda(fn, stream_torch, iters: int, rounds: int, warm: int = 3):
    """Per-call µs over `rounds` rounds of `iters` calls, timed with torch CUDA events on `stream_torch`."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream_torch)
        for _ in range(iters):
            fn()
        b.record(stream_torch)
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    return summary(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "profiling", "results", "bench_cuda.json"))
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()

    import torch

    from ms_dynvm.bytecode.types import Sym
    from ms_dynvm.codegen.cuda import driver, nvrtc
    from ms_dynvm.codegen.cuda import kernel as ck
    from ms_dynvm.runtime.cache import KernelCache
    from ms_dynvm.runtime.device_pool import default_device_pool
    from tests.codegen.groups import G

    assert driver.available(), driver.unavailable_reason()
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    # ms_dynvm launches on its own stream; torch runs on the same one, so events order both.
    ts = torch.cuda.ExternalStream(driver.stream().handle)
    torch.cuda.set_stream(ts)
    pool = default_device_pool()
    cache_dir = os.environ.get("DYNVM_CACHE_DIR") or os.path.join(ROOT, ".bench_cache")
    cache = KernelCache(cache_dir)
    res = {"device": driver.device_name(), "arch": f"sm_{driver.arch()}", "nvrtc": list(nvrtc.version()),
           "torch": torch.__version__, "rounds": args.rounds, "unit": "us per call unless named"}

    # --- NVRTC: cold (first compile of the process) and warm compile times -----------------------
    N = Sym.of("N")
    g = G()
    x, m = g.param("f32", (N,)), g.param("f32", (N,))
    g.op("mul", g.op("add", g.op("mul", g.op("exp", g.op("sub", x, 1.0)), m), x), 0.5)
    chain_fn = g.fn(outputs=[g.body[-1].outs[0]])
    spec, src, _ = ck.kernel_source(chain_fn)
    t = time.perf_counter()
    nvrtc.compile_source(src + "\n// cold\n", driver.arch(), ck.options())
    cold = time.perf_counter() - t
    warm = []
    for i in range(5):
        t = time.perf_counter()
        nvrtc.compile_source(src + f"\n// warm {i} {time.time()}\n", driver.arch(), ck.options())
        warm.append((time.perf_counter() - t) * 1e3)
    res["nvrtc_compile_ms"] = {"cold_first_in_process": cold * 1e3, "warm": summary(warm)}

    # --- elementwise chain ------------------------------------------------------------------------
    chain = ck.compile_group(chain_fn, cache=cache)

    def torch_chain(x, m):
        return (torch.exp(x - 1) * m + x) * 0.5

    compiled_chain = torch.compile(torch_chain, dynamic=True)
    res["chain"] = {}
    for n in (19200, 1 << 24, 1 << 27):
        xt = torch.randn(n, device=dev)
        mt = (torch.rand(n, device=dev) > 0.3).float()
        ot = torch.empty(n, device=dev)
        plan = chain.plan([(n,), (n,)], [(1,), (1,)], (True, True))
        ptr_in, ptr_out = [xt.data_ptr(), mt.data_ptr()], [ot.data_ptr()]

        def ours():
            chain.launch(ptr_in, ptr_out, plan, pool)

        ours()
        torch.cuda.synchronize()
        ref = torch_chain(xt, mt)
        err = float((ot - ref).abs().max() / (ref.abs().max() + 1e-30))
        iters = 200 if n < (1 << 20) else (50 if n <= (1 << 24) else 10)
        t0 = time.perf_counter()
        compiled_chain(xt, mt)
        torch.cuda.synchronize()
        comp_first = time.perf_counter() - t0
        copy_dst = torch.empty_like(xt)
        r = {
            "torch_eager": time_cuda(lambda: torch_chain(xt, mt), ts, iters, args.rounds),
            "torch_compile": time_cuda(lambda: compiled_chain(xt, mt), ts, iters, args.rounds),
            "ms_dynvm": time_cuda(ours, ts, iters, args.rounds),
            "device_copy": time_cuda(lambda: copy_dst.copy_(xt), ts, iters, args.rounds),
            "torch_compile_first_call_s": comp_first,
            "max_rel_err_vs_torch": err,
            "vectorised_path": bool(plan.launches[0][3]),
        }
        nbytes = 3 * 4 * n  # x, m read; out written
        r["ms_dynvm_GBps"] = nbytes / (r["ms_dynvm"]["median"] * 1e-6) / 1e9
        r["device_copy_GBps"] = 2 * 4 * n / (r["device_copy"]["median"] * 1e-6) / 1e9
        r["fraction_of_copy_bw"] = r["ms_dynvm_GBps"] / r["device_copy_GBps"]
        res["chain"][str(n)] = r
        del xt, mt, ot, copy_dst
        torch.cuda.empty_cache()

    # --- host cost per launch ---------------------------------------------------------------------
    xt = torch.randn(19200, device=dev)
    ot = torch.empty_like(xt)
    ptr_in, ptr_out = [xt.data_ptr(), xt.data_ptr()], [ot.data_ptr()]
    shapes, strides, al = [(19200,), (19200,)], [(1,), (1,)], (True, True)
    host = []
    for _ in range(args.rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            chain.launch(ptr_in, ptr_out, chain.plan(shapes, strides, al), pool)
        host.append((time.perf_counter() - t) / 200 * 1e6)
        torch.cuda.synchronize()
        pool.safe_point()
    res["host_us_per_launch"] = summary(host)

    # --- masked softmax over 39 sequence lengths ----------------------------------------------------
    from tests.codegen import groups

    sm_fn = groups.masked_softmax()
    sm_fn.outputs = [sm_fn.outputs[-1]]
    before = ck.compiles()
    sm = ck.compile_group(sm_fn, cache=cache)
    sm_compiles = ck.compiles() - before
    lens = [int(v) for v in np.linspace(32, 512, 39).round()]
    data = []
    rng = np.random.default_rng(0)
    for s in lens:
        xs = torch.randn(1024, s, device=dev)
        ms = torch.from_numpy((rng.random((1024, s)) > 0.2).astype(np.float32)).to(dev)
        os_ = torch.empty_like(xs)
        plan = sm.plan([(1024, s), (1024, s)], [(s, 1), (s, 1)], (True, True))
        data.append((xs, ms, os_, plan))

    def torch_sm(x, m):
        return torch.softmax(x + (1.0 - m) * -1e4, -1)

    compiled_sm = torch.compile(torch_sm, dynamic=True)
    t0 = time.perf_counter()
    for xs, ms, _, _ in data:
        compiled_sm(xs, ms)
    torch.cuda.synchronize()
    comp_time = time.perf_counter() - t0
    errs = []
    for xs, ms, os_, plan in data:
        sm.launch([xs.data_ptr(), ms.data_ptr()], [os_.data_ptr()], plan, pool)
    torch.cuda.synchronize()
    for xs, ms, os_, plan in data:
        errs.append(float((os_ - torch_sm(xs, ms)).abs().max()))

    pairs = [(xs, ms) for xs, ms, _, _ in data]
    # ms_dynvm's launches take device pointers (what an executor holds), read once here.
    launches = [((xs.data_ptr(), ms.data_ptr()), (os_.data_ptr(),), plan) for xs, ms, os_, plan in data]

    def eager_loop():
        for x, m in pairs:
            torch_sm(x, m)

    def compiled_loop():
        for x, m in pairs:
            compiled_sm(x, m)

    launch = sm.launch

    def ours_loop():
        for pin, pout, plan in launches:
            launch(pin, pout, plan, pool)

    per = {
        "torch_eager": time_cuda(eager_loop, ts, 5, args.rounds),
        "torch_compile": time_cuda(compiled_loop, ts, 5, args.rounds),
        "ms_dynvm": time_cuda(ours_loop, ts, 5, args.rounds),
    }
    for v in per.values():  # per call: the loop makes 39 calls
        for key in ("median", "min", "max"):
            v[key] /= len(lens)

    def device_only(fn):
        """GPU time per call of the 39 calls queued behind a sleeping kernel (so that the host has
        queued them all before the GPU starts): the kernels' own time, without the host's."""
        out = []
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            torch.cuda._sleep(4_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(ts)
            fn()
            b.record(ts)
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / len(lens))
        return summary(out)

    device = {"torch_eager": device_only(eager_loop), "ms_dynvm": device_only(ours_loop)}
    res["masked_softmax_39_lengths"] = {
        "rows": 1024, "seq_lens": lens, "per_call": per, "device_only_per_call": device,
        "ms_dynvm_compiles": sm_compiles,
        "torch_compile_seconds_all_sizes": comp_time, "max_abs_err_vs_torch": max(errs),
        "speedup_vs_eager": per["torch_eager"]["median"] / per["ms_dynvm"]["median"],
        "speedup_vs_compile": per["torch_compile"]["median"] / per["ms_dynvm"]["median"],
        "threads_per_block": [p.launches[0][2][0] for *_, p in data][:3],
    }

    # --- a second process with the warm disk cache --------------------------------------------------
    code = ("import json,sys; sys.path.insert(0, %r)\n"
            "from ms_dynvm.codegen.cuda import kernel as ck\n"
            "from ms_dynvm.runtime.cache import KernelCache\n"
            "from tests.codegen import groups\n"
            "import time\n"
            "fn = groups.masked_softmax(); fn.outputs = [fn.outputs[-1]]\n"
            "t = time.perf_counter(); ck.compile_group(fn, cache=KernelCache(%r))\n"
            "print(json.dumps({'compiles': ck.compiles(), 'load_ms': (time.perf_counter() - t) * 1e3}))\n"
            % (ROOT, cache_dir))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    res["second_process"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
        "error": p.stderr[-2000:]}
    res["cache_stats"] = cache.stats()

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
