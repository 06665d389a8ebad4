"""Record the GPU test programs on the CPU machine (needs MindSpore): one `.dvm` program and one
`.npz` of its input arrays per workload, under tests/gpu/programs/. The GPU machine has no
MindSpore; it loads these files and runs them with `ms_dynvm.run_program(..., device="cuda")`.

    python -m tests.gpu.record_programs
"""

from __future__ import annotations

import os

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


def _workloads():
    import mindspore as ms
    from mindspore import nn, ops

    from profiling import workloads as w

    rng = np.random.default_rng(7)

    def chain(x, m):
        return (ops.tanh(ops.relu(ops.exp(x * 0.5 - 1.0) * m + x) - 0.25),)

    def masked_softmax(x, m):
        return (ops.softmax(x + (1.0 - m) * -1e4, -1),)

    x = rng.standard_normal((24, 784)).astype(np.float32)
    m = (rng.random((24, 784)) > 0.3).astype(np.float32)
    xs = rng.standard_normal((64, 77)).astype(np.float32)
    ms_ = (rng.random((64, 77)) > 0.2).astype(np.float32)
    ln = nn.LayerNorm((128,), epsilon=1e-5)

    def lngelu_f16(x):
        return (ops.gelu(ops.cast(x, ms.float16), approximate="tanh") * 0.5,)

    out = {
        "chain": (chain, (ms.Tensor(x), ms.Tensor(m))),
        "masked_softmax": (masked_softmax, (ms.Tensor(xs), ms.Tensor(ms_))),
        "attention": w.make_attention(seed=1, batch=2, seq=16, d=32),
        "layernorm_gelu": w.make_layernorm_gelu(seed=2, batch=2, seq=16, d=128),
        "gnn": w.make_gnn(seed=3, nodes=12, edges=40, d=16),
        "mlp": w.make_mlp(seed=4),
        "f16_gelu": (lngelu_f16, (ms.Tensor(rng.standard_normal((8, 96)).astype(np.float32)),)),
    }
    del ln
    return out


def main() -> None:
    import ms_dynvm

    os.makedirs(HERE, exist_ok=True)
    for name, (step, inputs) in _workloads().items():
        with ms_dynvm.record() as rec:
            step(*inputs)
        prog = rec.program
        prog.save(os.path.join(HERE, f"{name}.dvm"))
        arrays = rec.input_arrays()
        np.savez_compressed(os.path.join(HERE, f"{name}.npz"), *arrays)
        ops = sorted({i.op for i in prog.instrs()})
        print(f"{name}: {prog.num_instrs()} instrs, {len(arrays)} inputs; ops {ops}")


if __name__ == "__main__":
    main()
