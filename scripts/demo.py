"""ms_dynvm demo: a small transformer-style training loop whose batch size and sequence length change
every step, run under `ms_dynvm.enable()`; prints what ms_dynvm saw and did, and ends by writing the
report (`ms_dynvm.report`) and printing its path. `--profile` runs the last steps under MindSpore's
profiler: ms_dynvm's events are merged into its trace_view.json (path printed too)."""

import argparse
import os
import time

import numpy as np

import ms_dynvm

# The one line a user adds. The demo is short, so it asks tier 1 to compile a run as soon as it has
# repeated (the default policy waits until the cost model predicts the compile pays for itself).
ms_dynvm.enable(compile_policy="threshold")

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402


class Block(nn.Cell):
    def __init__(self, d=64, ffn=128):
        super().__init__()
        self.ln = nn.LayerNorm((d,), epsilon=1e-5)
        self.qkv = nn.Dense(d, 3 * d)
        self.proj = nn.Dense(d, d)
        self.fc1 = nn.Dense(d, ffn)
        self.fc2 = nn.Dense(ffn, d)
        self.d = d

    def construct(self, x, mask):
        h = self.ln(x)
        q, k, v = ops.split(self.qkv(h), self.d, -1)
        s = ops.matmul(q, k.transpose(0, 2, 1)) / np.sqrt(self.d) + (1.0 - mask[:, None, :]) * -1e4
        x = x + self.proj(ops.matmul(ops.softmax(s, -1), v))
        return x + self.fc2(ops.gelu(self.fc1(self.ln(x))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default="demo_out", help="where the report (and profile) go")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="run the last N steps under mindspore.profiler.profile (ms_dynvm's events merged in)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    net = Block()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-2)

    def loss_fn(x, m):
        return (net(x, m) ** 2).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    def run(first, last):
        for step in range(first, last):
            b, s = int(rng.choice([2, 4, 8])), int(rng.choice([16, 32, 64]))
            x = ms.Tensor(rng.standard_normal((b, s, 64)).astype(np.float32))
            lengths = rng.integers(1, s + 1, b)
            m = ms.Tensor((np.arange(s)[None, :] < lengths[:, None]).astype(np.float32))
            loss, grads = grad_fn(x, m)
            opt(grads)
            if step % 5 == 0 or step == last - 1:
                print(f"step {step:2d}  batch {b}  seq_len {s:2d}  loss {float(loss):.5f}")

    t0 = time.perf_counter()
    n_prof = min(max(args.profile, 0), args.steps)
    run(0, args.steps - n_prof)
    trace = None
    if n_prof:
        from mindspore.profiler import ProfilerActivity

        prof_dir = os.path.join(args.out, "profile")
        with ms.profiler.profile(activities=[ProfilerActivity.CPU],
                                 on_trace_ready=ms.profiler.tensorboard_trace_handler(prof_dir)):
            run(args.steps - n_prof, args.steps)
        from ms_dynvm.observe import profiler

        trace = profiler.merged[-1][0] if profiler.merged else None
    dt = time.perf_counter() - t0
    st = ms_dynvm.stats()
    print(f"\n{args.steps} steps in {dt:.2f} s")
    print(f"ops seen {st['ops_seen']} (forward {st['ops_by_phase'].get('fwd', 0)}, "
          f"backward {st['ops_by_phase'].get('bwd', 0)}), recorded {st['ops_recorded']}, "
          f"VM instructions {st['instrs']}, basic blocks {st['blocks']} {st['block_ends']}")
    print(f"opaque ops {st['ops_opaque_total']} ({100 * st['opaque_rate']:.1f}%): {st['ops_opaque']}")
    top = sorted(st["ops_by_name"].items(), key=lambda kv: -kv[1])[:12]
    print("most dispatched:", ", ".join(f"{k} {v}" for k, v in top))
    print("sync points:", st["sync_points"])
    print(f"tier 1: {st['groups_compiled']} fused groups compiled ({st['compiles']} gcc runs, "
          f"{st['compile_seconds']:.2f} s, {st['disk_cache_hits']} from the disk cache), "
          f"{st['fused_ops']} ops served from fused kernels ({100 * st['fusion_rate']:.1f}%), "
          f"kernel cache hit rate {100 * st['cache_hit_rate']:.1f}%")
    print("tier-1 fallbacks:", st["fallbacks"] or "none", " guard failures:", st["guard_failures"] or "none")
    print(f"tier 2: {st['regions_replayed']} of {st['region_calls']} region calls replayed "
          f"({100 * st['region_replay_rate']:.0f}%: gradient steps and optimizer steps), {st['region_compiles']} "
          f"plans ({st['region_sizes_derived']} derived for a new size without recording it), "
          f"{st['regions_seen']} (region, signature) pairs; not replayable: "
          f"{st['regions_not_replayable'] or 'none'}; guard failures: {st['region_guard_failures'] or 'none'}")
    sc = st["step_calls"]
    print(f"step switch (per size class, by measured time): {sc.get('vm', 0)} steps under the VM, "
          f"{sc.get('bare', 0)} bare (plain MindSpore); size classes settled on bare: {st['steps_bare']}")
    with ms_dynvm.record() as rec:
        x = ms.Tensor(rng.standard_normal((2, 16, 64)).astype(np.float32))
        m = ms.Tensor(np.ones((2, 16), np.float32))
        out = net(x, m)
    print(f"\none forward recorded: {rec.program.num_instrs()} instructions, "
          f"{len(rec.inputs)} inputs; first lines of its bytecode:")
    print("\n".join(rec.program.as_text().splitlines()[:14]))
    res = ms_dynvm.interpret(rec.program, [t.asnumpy() for t in rec.inputs])
    ref = out.asnumpy()
    got = res[rec.output_index(out)]
    print(f"reference interpreter vs MindSpore on that forward: max |diff| = {np.abs(got - ref).max():.2e}")
    if trace:
        print(f"\nMindSpore profile with ms_dynvm's events merged in (open in Perfetto): {trace}")
    paths = ms_dynvm.report(os.path.join(args.out, "report.html"))
    print(f"\nreport: {paths['html']}  (data: {paths['json']})")


if __name__ == "__main__":
    main()
