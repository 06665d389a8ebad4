"""Served groups against writes and aliasing that eager mode shows (tier 1 with the C backend):

- a fused group computes all its results at its first op, so a tensor it reads must not change, by
  a path MindSpore does not dispatch, before its later ops: `Parameter.set_data`,
  `Tensor.assign_value`, a `@jit` function or Cell (every nn optimizer's construct is one) are sync
  points, before and after (frontend/sync.py);
- a view op (transpose, expand_dims, squeeze) returns a view of its input in eager mode: a later
  in-place write to the base shows through the view; a served group runs view ops themselves
  (`RunTemplate.view_steps`).

Each case runs a hot loop eagerly and under `enable()` (groups compiled at the first repeat) and
compares every iteration's values; `fused_ops > 0` shows fusion was active."""

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Parameter, Tensor, nn, ops  # noqa: E402

import ms_dynvm  # noqa: E402
from ms_dynvm.frontend import dispatch  # noqa: E402

ms.runtime.launch_blocking()

ITERS = 6


@pytest.fixture(autouse=True)
def _clean():
    ms_dynvm.disable()
    dispatch.forget_compiled()
    ms_dynvm.reset_stats()
    yield
    ms_dynvm.disable()


def _both(make):
    """`make()` -> a function of the iteration returning arrays; its values eagerly and under
    enable() (fresh state each), and the fused-op count of the enabled run."""
    step = make()
    want = [step(i) for i in range(ITERS)]
    step = make()
    ms_dynvm.enable(compile_policy="threshold", compile_threshold=1)
    try:
        got = [step(i) for i in range(ITERS)]
        fused = ms_dynvm.stats()["fused_ops"]
    finally:
        ms_dynvm.disable()
    return want, got, fused


def _assert_same(want, got):
    for i, (w, g) in enumerate(zip(want, got)):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6, err_msg=f"iteration {i}")


@pytest.mark.parametrize("how", ["set_data", "assign_value"])
def test_a_write_between_two_ops_of_a_group_is_seen(how):
    def make():
        x = Tensor(np.ones((2, 3), np.float32))
        if how == "set_data":
            w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")

            def update(i):
                w.set_data(Tensor(np.full((2, 3), float(i), np.float32)))
        else:
            w = Tensor(np.ones((2, 3), np.float32))

            def update(i):
                w.assign_value(Tensor(np.full((2, 3), float(i), np.float32)))

        def step(i):
            a = x * w
            update(i)  # eager: the next op reads the new w
            b = a + w
            c = b * 2.0
            return [c.asnumpy()]
        return step

    want, got, fused = _both(make)
    _assert_same(want, got)
    assert fused > 0


@pytest.mark.parametrize("opt_name", ["SGD", "Momentum", "Adam"])
def test_an_optimizer_between_two_ops_of_a_group(opt_name):
    """nn optimizers update their Parameters inside a @jit construct: no op is dispatched."""

    def make():
        w = Parameter(Tensor(np.linspace(0.5, 1.5, 6).reshape(2, 3).astype(np.float32)), name="w")
        opt = {"SGD": lambda: nn.SGD([w], learning_rate=0.1),
               "Momentum": lambda: nn.Momentum([w], learning_rate=0.1, momentum=0.9),
               "Adam": lambda: nn.Adam([w], learning_rate=0.1)}[opt_name]()
        g = Tensor(np.ones((2, 3), np.float32))

        def step(i):
            decay = w * 0.01
            g2 = g + decay
            opt((g2,))  # updates w in place
            wn = w * w
            s = wn + 1.0
            return [w.asnumpy(), s.asnumpy()]
        return step

    want, got, fused = _both(make)
    _assert_same(want, got)
    assert fused > 0


def test_a_jit_function_that_updates_a_parameter_between_two_ops():
    def make():
        w = Parameter(Tensor(np.ones((3,), np.float32)), name="w")

        @ms.jit
        def bump(p, v):
            ops.assign(p, p + v)
            return p

        x = Tensor(np.arange(3, dtype=np.float32))

        def step(i):
            a = x * w
            bump(w, Tensor(np.full((3,), 0.5, np.float32)))
            b = a + w
            c = b * 3.0
            return [c.asnumpy(), w.asnumpy()]
        return step

    want, got, fused = _both(make)
    _assert_same(want, got)
    assert fused > 0


@pytest.mark.parametrize("how", ["copy_", "assign"])
@pytest.mark.parametrize("view", ["T", "expand_dims", "squeeze"])
def test_a_served_view_shares_its_base_memory(view, how):
    def make():
        x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3, 1) if view == "squeeze"
                   else np.arange(6, dtype=np.float32).reshape(2, 3))
        z = Tensor(np.zeros(x.shape, np.float32))

        def step(i):
            a = x * 2.0
            v = {"T": lambda t: t.T, "expand_dims": lambda t: ops.expand_dims(t, 0),
                 "squeeze": lambda t: ops.squeeze(t, -1)}[view](a)
            u = v + 1.0  # a group: mul, view, add
            if how == "copy_":
                a.copy_(z)
            else:
                ops.assign(a, z)
            return [v.asnumpy(), u.asnumpy(), (v * 3.0).asnumpy()]
        return step

    want, got, fused = _both(make)
    assert np.all(want[-1][0] == 0.0)  # eager: the write shows through the view
    _assert_same(want, got)
    assert fused > 0


def test_a_group_that_starts_with_a_view():
    def make():
        xs = [Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + i) for i in range(ITERS)]
        z = Tensor(np.zeros((2, 3), np.float32))

        def step(i):
            x = xs[i]  # the script's own tensor: the group starts at the view
            v = x.T
            a = v * 2.0
            b = a - 1.0
            x.copy_(z)  # a write to the base shows through the view
            return [v.asnumpy(), a.asnumpy(), b.asnumpy()]
        return step

    want, got, fused = _both(make)
    assert np.all(want[-1][0] == 0.0)
    _assert_same(want, got)
    assert fused > 0


def test_the_kernel_does_not_write_the_views_results():
    """A view step's result is the real view (run for real), so the kernel keeps its copy out of
    memory: one output fewer per view step; a run of views alone is not a group."""
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    ms_dynvm.enable(compile_policy="threshold", compile_threshold=1)
    for _ in range(4):
        a = x * 2.0
        v = a.T  # view
        u = ops.expand_dims(v + 1.0, 0)  # add, then a view
        w = u * 3.0
        np.testing.assert_allclose(w.asnumpy(), ((x.asnumpy() * 2.0).T + 1.0)[None] * 3.0, rtol=1e-6)
        ops.squeeze(ops.expand_dims(x, 0), 0).asnumpy()  # views alone
    t1 = dispatch._S.mode.tier1
    groups = [t for t in t1.templates.values() if t.kernels]
    assert groups, "nothing compiled"
    for t in groups:
        n_results = sum(st.n_out for st in t.steps)
        for _kernel, fn, _guards in t.kernels.values():
            assert len(fn.outputs) == n_results - sum(st.n_out for st in t.steps if st.view)
    assert any(t.view_steps for t in groups)
    assert all(not all(st.view for st in t.steps) for t in t1.templates.values())
    assert ms_dynvm.stats()["fused_ops"] > 0


def test_view_candidates_do_not_keep_tensors_alive():
    """The recorder's view-link candidates are weak references: holding the view results would change
    when MindSpore frees and reuses their memory (a held-out round: an LSTM gradient under amp O2,
    wrong in eager itself, changed with the candidates held), and a dead view is no candidate."""
    import gc
    import weakref

    from ms_dynvm.frontend import dispatch

    x = ms.Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    ms_dynvm.enable(compile_policy="threshold")
    try:
        rec = dispatch._S.recorder
        y = ops.transpose(x * 2.0, (1, 0))
        assert rec._views, "a view result is a candidate while tier 1 links views"
        entry = rec._views[-1]
        assert type(entry[0]) is weakref.ref
        del y
        gc.collect()
        z = (x * 2.0).sum()  # (dispatches more ops; the dead candidate is skipped, not read)
        assert float(z.asnumpy()) == float(np.arange(24).sum() * 2)
    finally:
        ms_dynvm.disable()
