"""A small real training loop (LayerNorm, Dense, GELU, tanh; value_and_grad + SGD) shared by the
observe tests. `Trainer()` builds the model once; `run(steps)` trains it."""

import numpy as np


class Trainer:
    def __init__(self, seed: int = 0):
        import mindspore as ms
        from mindspore import nn, ops

        self.ms = ms
        self.rng = np.random.default_rng(seed)
        ms.set_seed(seed)
        net = nn.SequentialCell(nn.Dense(32, 64), nn.GELU(), nn.Dense(64, 32))
        ln = nn.LayerNorm((32,))
        opt = nn.SGD(net.trainable_params() + ln.trainable_params(), learning_rate=1e-2)

        def loss_fn(x):
            y = net(ln(x))
            return (ops.tanh(y * 0.5 - 1.0) * 2.0 + y).square().mean()

        self.opt = opt
        self.grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)

    def run(self, steps: int, batch=lambda i: 8) -> list:
        losses = []
        for i in range(steps):
            x = self.ms.Tensor(self.rng.standard_normal((batch(i), 32)).astype(np.float32))
            loss, grads = self.grad_fn(x)
            self.opt(grads)
            losses.append(float(loss))
        return losses


def train(steps: int = 16, batch=lambda i: 8, seed: int = 0) -> list:
    return Trainer(seed).run(steps, batch)
