"""Op coverage: how many dispatched ops ms_dynvm models (VM ops) vs records as opaque calls.

Runs every workload of profiling/workloads.py (forward + backward, two steps each), an optimiser
step (nn.SGD / nn.Adam on the MLP) and a small conv/BatchNorm/pool network under
`ms_dynvm.enable(jit=False)` (recording only), and prints per workload: ops dispatched,
meta ops (no tensor semantics), opaque ops and their share, and which names were opaque.

    python profiling/tools/coverage.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def optimizer_workload(kind: str):
    import mindspore as ms
    from mindspore import nn

    from profiling.workloads import make_mlp

    step, inputs = make_mlp(seed=0)
    # make_mlp's grad_fn closes over its own net; build an optimiser over fresh params of one.
    net = nn.Dense(32, 10)
    opt = nn.SGD(net.trainable_params(), 0.1) if kind == "sgd" else nn.Adam(net.trainable_params(), 1e-3)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).mean(), None, opt.parameters)

    def train(x, y):
        loss, grads = grad_fn(x)
        opt(grads)
        return (loss,)

    return train, inputs


def cnn_workload():
    """A small ResNet-style block: Conv2d, BatchNorm (train mode), ReLU, MaxPool, Dense."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    class CNN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, pad_mode="same")
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(2, 2)
            self.flat = nn.Flatten()
            self.fc = nn.Dense(8 * 4 * 4, 10)

        def construct(self, x):
            h = self.relu(self.bn(self.conv(x)))
            return self.fc(self.flat(self.pool(h + self.conv(x))))

    net = CNN()
    net.set_train(True)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).mean(), None, net.trainable_params())
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))

    def step(x):
        loss, grads = grad_fn(x)
        return (loss, *grads)

    return step, (x,)


def main() -> int:
    import mindspore as ms

    import ms_dynvm
    from profiling.workloads import WORKLOADS

    ms.runtime.launch_blocking()
    cases = {name: mk() for name, mk in WORKLOADS.items()}
    cases["mlp+sgd"] = optimizer_workload("sgd")
    cases["mlp+adam"] = optimizer_workload("adam")
    cases["cnn (conv/bn)"] = cnn_workload()
    total_seen = total_opaque = 0
    print(f"{'workload':16s} {'ops':>6s} {'meta':>5s} {'opaque':>7s} {'share':>7s}  opaque names")
    for name, (step, inputs) in cases.items():
        ms_dynvm.reset_stats()
        with ms_dynvm.enabled(jit=False):
            for _ in range(2):
                step(*inputs)
        st = ms_dynvm.stats()
        seen, opaque = st["ops_seen"], st["ops_opaque_total"]
        meta = sum(st["ops_meta"].values())
        total_seen += seen
        total_opaque += opaque
        print(f"{name:16s} {seen:6d} {meta:5d} {opaque:7d} {100 * opaque / max(seen, 1):6.2f}%  "
              f"{st['ops_opaque'] or ''}")
    print(f"{'all':16s} {total_seen:6d} {'':5s} {total_opaque:7d} {100 * total_opaque / total_seen:6.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
