"""Small MindSpore PyNative workloads shared by tests, coverage and benchmarks.

Each `make_<name>(seed, **sizes)` builds a network and returns `(step, inputs)`: `step(*inputs)`
runs one forward (+ backward where the workload trains) and returns a tuple of tensors (loss/outputs and
gradients). Sizes are small so that the CPU suite stays fast; benchmarks pass larger ones. Dropout is 0
so that runs are deterministic (RNG ops cannot be replayed by the reference interpreter).
"""

from __future__ import annotations

import numpy as np


def _ms():
    import mindspore as ms

    return ms


def _tensor(a):
    ms = _ms()
    return ms.Tensor(np.ascontiguousarray(a))


def _init(net, seed: int) -> None:
    """Deterministic parameters (MindSpore's initialisers use their own RNG)."""
    rng = np.random.default_rng(seed)
    for p in net.get_parameters():
        shape = tuple(p.shape)
        if "gamma" in p.name or p.name.endswith("weight") and len(shape) == 1:
            val = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            fan_in = shape[-1] if shape else 1
            val = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
        p.set_data(_tensor(val.astype(np.float32)))


def make_mlp(seed: int = 0, batch: int = 8, d_in: int = 32, hidden: int = 64, classes: int = 10):
    """MLP (Dense-ReLU-Dense) with a softmax cross-entropy loss under value_and_grad."""
    ms = _ms()
    from mindspore import nn, ops

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(d_in, hidden)
            self.fc2 = nn.Dense(hidden, classes)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.fc2(self.relu(self.fc1(x)))

    net = MLP()
    _init(net, seed)

    def loss_fn(x, y):
        logits = net(x)
        logp = ops.log_softmax(logits, -1)
        return -(logp * y).sum(-1).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, net.trainable_params())
    rng = np.random.default_rng(seed + 1)
    x = _tensor(rng.standard_normal((batch, d_in)).astype(np.float32))
    y = _tensor(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, batch)])

    def step(x, y):
        loss, grads = grad_fn(x, y)
        return (loss, *grads)

    return step, (x, y)


def make_transformer(seed: int = 0, batch: int = 2, seq: int = 8, d_model: int = 32, nhead: int = 4,
                     ffn: int = 64):
    """nn.TransformerEncoderLayer forward + backward with a key padding mask."""
    ms = _ms()
    from mindspore import nn

    layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=ffn, dropout=0.0,
                                       batch_first=True)
    _init(layer, seed)
    layer.set_train(True)

    def loss_fn(src, mask):
        out = layer(src, src_key_padding_mask=mask)
        return (out * out).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, layer.trainable_params())
    rng = np.random.default_rng(seed + 1)
    src = _tensor(rng.standard_normal((batch, seq, d_model)).astype(np.float32))
    lengths = rng.integers(1, seq + 1, batch)
    mask = _tensor(np.arange(seq)[None, :] >= lengths[:, None])  # True = padding

    def step(src, mask):
        loss, grads = grad_fn(src, mask)
        return (loss, *grads)

    return step, (src, mask)


def make_attention(seed: int = 0, batch: int = 2, seq: int = 16, d: int = 32, train: bool = True):
    """Masked-softmax attention block: projections, scaled scores + (1-m)*-1e4, softmax, @v, output
    projection; forward + backward."""
    ms = _ms()
    from mindspore import nn, ops

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q = nn.Dense(d, d)
            self.k = nn.Dense(d, d)
            self.v = nn.Dense(d, d)
            self.o = nn.Dense(d, d)

        def construct(self, x, m):
            q, k, v = self.q(x), self.k(x), self.v(x)
            scores = ops.matmul(q, k.transpose(0, 2, 1)) / np.sqrt(d)
            scores = scores + (1.0 - m[:, None, :]) * -1e4
            p = ops.softmax(scores, -1)
            return self.o(ops.matmul(p, v))

    net = Attention()
    _init(net, seed)
    rng = np.random.default_rng(seed + 1)
    x = _tensor(rng.standard_normal((batch, seq, d)).astype(np.float32))
    lengths = rng.integers(1, seq + 1, batch)
    m = _tensor((np.arange(seq)[None, :] < lengths[:, None]).astype(np.float32))
    if not train:
        return (lambda x, m: (net(x, m),)), (x, m)
    grad_fn = ms.value_and_grad(lambda x, m: net(x, m).sum(), None, net.trainable_params())

    def step(x, m):
        loss, grads = grad_fn(x, m)
        return (loss, *grads)

    return step, (x, m)


def make_layernorm_gelu(seed: int = 0, batch: int = 2, seq: int = 16, d: int = 128, train: bool = True):
    """LayerNorm + GELU (erf form) on [B, S, d], forward (+ backward of sum)."""
    ms = _ms()
    from mindspore import nn, ops

    class LNGelu(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm((d,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=1e-5)

        def construct(self, x):
            return ops.gelu(self.ln(x), approximate="none")

    net = LNGelu()
    _init(net, seed)
    rng = np.random.default_rng(seed + 1)
    x = _tensor(rng.standard_normal((batch, seq, d)).astype(np.float32))
    if not train:
        return (lambda x: (net(x),)), (x,)
    grad_fn = ms.value_and_grad(lambda x: (net(x) * net(x)).mean(), 0, net.trainable_params())

    def step(x):
        loss, (gx, grads) = grad_fn(x)
        return (loss, gx, *grads)

    return step, (x,)


def make_gnn(seed: int = 0, nodes: int = 12, edges: int = 40, d: int = 16, train: bool = True):
    """One message-passing step: gather source features, a Dense message, unsorted_segment_sum into
    destinations, a residual update with ReLU; forward + backward."""
    ms = _ms()
    from mindspore import nn, ops

    class MessagePassing(nn.Cell):
        def __init__(self):
            super().__init__()
            self.msg = nn.Dense(d, d)
            self.upd = nn.Dense(2 * d, d)

        def construct(self, x, src, dst):
            m = self.msg(ops.gather(x, src, 0))
            agg = ops.unsorted_segment_sum(m, dst, x.shape[0])
            return ops.relu(self.upd(ops.concat((x, agg), -1))) + x

    net = MessagePassing()
    _init(net, seed)
    rng = np.random.default_rng(seed + 1)
    x = _tensor(rng.standard_normal((nodes, d)).astype(np.float32))
    src = _tensor(rng.integers(0, nodes, edges).astype(np.int32))
    dst = _tensor(rng.integers(0, nodes, edges).astype(np.int32))
    if not train:
        return (lambda x, s, t: (net(x, s, t),)), (x, src, dst)
    grad_fn = ms.value_and_grad(lambda x, s, t: net(x, s, t).sum(), None, net.trainable_params())

    def step(x, s, t):
        loss, grads = grad_fn(x, s, t)
        return (loss, *grads)

    return step, (x, src, dst)


WORKLOADS = {
    "mlp": make_mlp,
    "transformer": make_transformer,
    "attention": make_attention,
    "layernorm_gelu": make_layernorm_gelu,
    "gnn": make_gnn,
}


def issue_loops(rng) -> dict:
    """The CPU JIT issue's three benchmark loops, sizes drawn from `rng` on every call:
    name -> (fn, make_inputs, shapes text). Shared by bench_tier1.py and bench_plain_loop.py, so
    that both measure the same workloads."""
    ms = _ms()
    from mindspore import nn, ops

    def chain(x, m):
        return ops.tanh(ops.relu(ops.exp(x * 0.5 - 1.0) * m + x) - 0.25)

    def masked_softmax(x, m):
        return ops.softmax(x + (1.0 - m) * -1e4, -1)

    ln = nn.LayerNorm((128,), epsilon=1e-5)

    def lngelu(x):
        return ops.gelu(ln(x), approximate="none")

    def chain_inputs():
        b = int(rng.integers(16, 129))
        x = rng.standard_normal((b, 784)).astype(np.float32)
        m = (rng.random((b, 784)) > 0.3).astype(np.float32)
        return (ms.Tensor(x), ms.Tensor(m))

    def softmax_inputs():
        b, s = int(rng.integers(4, 33)), int(rng.integers(32, 257))
        x = rng.standard_normal((4 * b, s)).astype(np.float32)
        m = (rng.random((4 * b, s)) > 0.2).astype(np.float32)
        return (ms.Tensor(x), ms.Tensor(m))

    def lngelu_inputs():
        b, s = int(rng.integers(2, 9)), int(rng.integers(16, 129))
        return (ms.Tensor(rng.standard_normal((b, s, 128)).astype(np.float32)),)

    return {"chain": (chain, chain_inputs, "[B,784], B in 16..128"),
            "softmax": (masked_softmax, softmax_inputs, "[4B,S], B in 4..32, S in 32..256"),
            "lngelu": (lngelu, lngelu_inputs, "[B,S,128], B in 2..8, S in 16..128")}
