"""Tier 2's steady-state machinery (jit/replay.py step buffers, jit/fusion.py fused kernels, the
batched GEMM loop) seen from the script: replayed attention outputs equal eager's (inference: rtol
1e-5), and output tensors the script keeps never change under later replays (of the same size or
of others)."""

from __future__ import annotations

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

import ms_dynvm

ms.runtime.launch_blocking()


class Block(nn.Cell):
    """bench_regions.py's attention block, smaller: Dense q/k/v, masked softmax, output Dense,
    LayerNorm, erf-form GELU feed-forward."""

    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v, self.o = nn.Dense(d, d), nn.Dense(d, d), nn.Dense(d, d), nn.Dense(d, d)
        self.ln = nn.LayerNorm((d,), epsilon=1e-5)
        self.f1, self.f2 = nn.Dense(d, 4 * d), nn.Dense(4 * d, d)

    def construct(self, x, m):
        q, k, v = self.q(x), self.k(x), self.v(x)
        s = ops.matmul(q, k.transpose(0, 2, 1)) * 0.25 + (1.0 - m) * -1e4
        h = self.ln(x + self.o(ops.matmul(ops.softmax(s, -1), v)))
        return h + self.f2(ops.gelu(self.f1(h), approximate="none"))


def _inputs(rng, b, s, d=16):
    lengths = rng.integers(1, s + 1, b)
    m = (np.arange(s)[None, :] < lengths[:, None]).astype(np.float32)[:, None, :]
    return ms.Tensor(rng.standard_normal((b, s, d)).astype(np.float32)), ms.Tensor(m)


@pytest.mark.parametrize("sizes", [[(3, 5)], [(4, 8), (1, 3), (4, 8), (2, 7)]])
def test_replayed_attention_keeps_every_output_the_script_holds(sizes):
    net = Block()
    rng = np.random.default_rng(0)
    for p in net.get_parameters():
        p.set_data(ms.Tensor((rng.standard_normal(p.shape) * 0.3).astype(np.float32)))
    net.set_train(False)
    calls = [_inputs(rng, *sizes[i % len(sizes)]) for i in range(40)]
    ms_dynvm.reset_stats()
    ms_dynvm.enable(regions=True, step_switch=False)
    try:
        held = [net(*c) for c in calls]  # every output tensor kept while later calls replay
    finally:
        ms_dynvm.disable()
    st = ms_dynvm.stats()
    assert st["regions_replayed"] >= 25, st
    for c, got in zip(calls, held):
        want = net(*c).asnumpy()
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-5)
