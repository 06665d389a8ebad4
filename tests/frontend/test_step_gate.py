"""The step switch in the frontend (`dispatch.StepGate`, hooks in `sync.py`): steps run bare (ms_dynvm's
dispatch mode off MindSpore's mode stack) or under the VM, with results equal to eager across every
transition, the mode stack always restored, and the script's own modes never touched."""

import time

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn, ops  # noqa: E402
from mindspore._c_expression import _DispatchGuardStack  # noqa: E402

import ms_dynvm  # noqa: E402
from ms_dynvm.cost.step import StepSwitch  # noqa: E402
from ms_dynvm.frontend import dispatch  # noqa: E402
from profiling.workloads import WORKLOADS  # noqa: E402

ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def _clean():
    ms_dynvm.disable()
    dispatch.forget_compiled()
    ms_dynvm.reset_stats()
    base = _DispatchGuardStack.depth()
    yield base
    ms_dynvm.disable()
    assert _DispatchGuardStack.depth() == base


def _script(monkeypatch, ways):
    """Make every StepSwitch decide as `ways` says, in order (then under the VM); the decisions made."""
    it = iter(ways)
    made = []

    def decide(self, key, generation, group=None):
        vm = next(it, True)
        made.append(vm)
        return vm

    monkeypatch.setattr(StepSwitch, "decide", decide)
    return made


def _np(outs):
    return [o.asnumpy() for o in outs]


WAYS = [True, True, False, False, True, False, True, True, False, True, False, False]


@pytest.mark.parametrize("name", ["mlp", "attention", "layernorm_gelu", "transformer"])
def test_results_equal_eager_across_transitions(monkeypatch, _clean, name):
    fn, inputs = WORKLOADS[name](seed=5)
    want = _np(fn(*inputs))
    made = _script(monkeypatch, WAYS)
    ms_dynvm.enable(step_switch=True, compile_policy="threshold", compile_threshold=1)
    depths, last = [], []
    for _ in range(len(WAYS)):
        got = fn(*inputs)
        depths.append(_DispatchGuardStack.depth())
        last.append(made[-1])  # the way of the last anchor start (layernorm_gelu calls its net twice)
        for g, w in zip(_np(got), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    s = ms_dynvm.stats()
    assert not s["record_errors"], s["record_errors"]
    assert made[:len(WAYS)] == WAYS[:len(made)] and len(made) >= len(WAYS)
    # Bare steps leave the mode off the stack until the next anchor start; VM steps keep it on.
    assert depths == [_clean + (1 if w else 0) for w in last]
    assert s["step_calls"]["bare"] == made.count(False) == WAYS[:len(made)].count(False)


def test_bare_steps_are_bit_identical_to_eager_and_unseen(monkeypatch):
    fn, inputs = WORKLOADS["mlp"](seed=1)
    want = _np(fn(*inputs))
    _script(monkeypatch, [True, False, False, False])
    ms_dynvm.enable(step_switch=True)
    fn(*inputs)
    seen = ms_dynvm.stats()["ops_seen"]
    for _ in range(3):
        got = _np(fn(*inputs))
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    # Bare: the handler saw none of their ops (what the sync hook closes is the VM step's block).
    assert ms_dynvm.stats()["ops_seen"] == seen


class _Boom(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 3)
        self.fail = False

    def construct(self, x):
        y = ops.relu(self.dense(x))
        if self.fail:
            raise ValueError("boom")
        return y

def _bare_after_one_vm_step(monkeypatch):
    """A _Boom net, its input, and ms_dynvm enabled with the switch scripted VM then bare; the net
    has run both steps, so ms_dynvm is bare now."""
    net = _Boom()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    _script(monkeypatch, [True, False])
    ms_dynvm.enable(step_switch=True)
    net(x)
    net(x)  # bare
    assert dispatch._S.hooks.gate.bare
    return net, x


def _vm_sees_the_next_op(x):
    before = ms_dynvm.stats()["ops_seen"]
    ops.exp(x)
    return ms_dynvm.stats()["ops_seen"] == before + 1


def _spy():
    """A dispatch mode of the script's own (to enter), and the names of the ops it sees."""
    seen = []

    class Spy(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, args, kwargs=None):
            seen.append(func.name)
            return func(*args)

    return Spy(), seen



def test_an_exception_in_a_bare_step_leaves_the_stack_sound(monkeypatch, _clean):
    net = _Boom()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    _script(monkeypatch, [True, False, False, True])
    ms_dynvm.enable(step_switch=True)
    net(x)
    net.fail = True
    with pytest.raises(ValueError, match="boom"):
        net(x)  # bare
    net.fail = False
    assert _DispatchGuardStack.depth() == _clean  # still bare: the mode is off the stack
    np.testing.assert_array_equal(net(x).asnumpy(), ops.relu(net.dense(x)).asnumpy())
    net(x)  # under the VM again
    assert _DispatchGuardStack.depth() == _clean + 1
    assert ms_dynvm.disable() and _DispatchGuardStack.depth() == _clean


def test_disable_and_enable_while_bare(monkeypatch, _clean):
    net, x = _bare_after_one_vm_step(monkeypatch)
    assert ms_dynvm.disable() is True
    assert _DispatchGuardStack.depth() == _clean
    ms_dynvm.enable(step_switch=True)
    assert _DispatchGuardStack.depth() == _clean + 1
    assert _vm_sees_the_next_op(x)


def test_turning_the_switch_off_while_bare_puts_the_vm_back(monkeypatch, _clean):
    net, x = _bare_after_one_vm_step(monkeypatch)
    ms_dynvm.enable(step_switch=False)
    assert _DispatchGuardStack.depth() == _clean + 1
    assert _vm_sees_the_next_op(x)


def test_a_mode_the_script_entered_is_never_popped(monkeypatch, _clean):
    spy, seen = _spy()
    net = _Boom()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    made = _script(monkeypatch, [True, False, False])
    ms_dynvm.enable(step_switch=True)
    net(x)
    with spy:
        net(x)  # the switch says bare, but the Spy is on top of ms_dynvm's mode: nothing is popped
        assert _DispatchGuardStack.depth() == _clean + 2
        assert seen  # the script's mode saw the ops
    assert made[:2] == [True, False]
    assert _DispatchGuardStack.depth() == _clean + 1
    assert ms_dynvm.stats()["step_calls"].get("bare", 0) == 0


def test_record_inside_a_bare_step_records(monkeypatch):
    net, x = _bare_after_one_vm_step(monkeypatch)
    with ms_dynvm.record() as rec:
        y = ops.exp(x) * 2
    assert "exp" in rec.program.as_text()
    np.testing.assert_allclose(ms_dynvm.interpret(rec.program, [x.asnumpy()])[-1], y.asnumpy(), rtol=1e-6)
    assert dispatch._S.hooks.gate.bare  # still bare after the recording


def test_a_long_bare_stretch_without_the_anchor_returns_to_the_vm(monkeypatch, _clean):
    net, x = _bare_after_one_vm_step(monkeypatch)  # the loop is over, the script goes on without the anchor
    for _ in range(dispatch._BARE_SYNC_PATIENCE + 1):
        ops.exp(x).asnumpy()
    assert _DispatchGuardStack.depth() == _clean + 1
    assert _vm_sees_the_next_op(x)


def test_not_switched_without_jit_or_with_the_option_off(monkeypatch):
    net = _Boom()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    _script(monkeypatch, [False] * 10)
    for opts in ({"jit": False, "step_switch": True}, {"step_switch": False}):
        ms_dynvm.reset_stats()
        ms_dynvm.enable(**opts)
        for _ in range(4):
            net(x)
        assert not ms_dynvm.stats()["step_calls"]
        ms_dynvm.disable()


def test_measured_policy_on_a_training_loop():
    """Real timing: the switch measures both ways, and every step's results equal eager."""
    fn, inputs = WORKLOADS["mlp"](seed=2)
    want = _np(fn(*inputs))
    ms_dynvm.enable(step_switch=True)
    for _ in range(40):
        for g, w in zip(_np(fn(*inputs)), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    calls = ms_dynvm.stats()["step_calls"]
    assert calls.get("vm", 0) >= StepSwitch.MIN_SAMPLES and calls.get("bare", 0) >= StepSwitch.MIN_SAMPLES


def _trainer(seed):
    """A fresh Dense-ReLU-Dense regression with deterministic weights, trained with Adam (in-place
    parameter and state updates, some of them in bare steps), the batch size changing every step;
    (step, batches)."""
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    rng = np.random.default_rng(seed)
    for p in net.trainable_params():
        p.set_data(ms.Tensor((0.3 * rng.standard_normal(p.shape)).astype(np.float32)))
    opt = nn.Adam(net.trainable_params(), 1e-2)
    grad_fn = ms.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return float(loss.asnumpy())

    batches = []
    for _ in range(16):
        b = int(rng.integers(1, 9))
        batches.append((ms.Tensor(rng.standard_normal((b, 8)).astype(np.float32)),
                        ms.Tensor(rng.standard_normal((b, 4)).astype(np.float32))))
    return step, batches


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_with_in_place_updates_in_bare_steps_matches_eager(monkeypatch, seed):
    step, batches = _trainer(seed)
    want = [step(x, y) for x, y in batches]
    ways = [bool(w) for w in np.random.default_rng(seed + 10).integers(0, 2, 64)]
    _script(monkeypatch, ways)
    step, batches = _trainer(seed)
    ms_dynvm.enable(step_switch=True, compile_policy="threshold", compile_threshold=1)
    got = [step(x, y) for x, y in batches]
    assert not ms_dynvm.stats()["record_errors"]
    assert ms_dynvm.stats()["step_calls"].get("bare", 0) > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_only_the_anchor_decides_and_a_new_anchor_takes_over(monkeypatch):
    a, b = _Boom(), _Boom()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    keys = []

    def decide(self, key, generation, group=None):
        keys.append(key)
        return True

    monkeypatch.setattr(StepSwitch, "decide", decide)
    ms_dynvm.enable(step_switch=True)
    for _ in range(5):
        a(x)
        b(x)
    rid_a = dispatch._region_id(a)
    assert len(keys) == 5 and all(k[0] == rid_a for k in keys)
    # The loop now calls b alone: after ANCHOR_PATIENCE starts without a, b is the anchor.
    keys.clear()
    for _ in range(StepSwitch.ANCHOR_PATIENCE + 5):
        b(x)
    rid_b = dispatch._region_id(b)
    # (b's start after the last a counted too: b takes over at the 64th start of this loop.)
    assert all(k[0] == rid_b for k in keys) and len(keys) == 6
    # Size classes: another batch size is another key of the same anchor.
    keys.clear()
    b(ms.Tensor(np.ones((64, 4), np.float32)))
    assert keys[-1][0] == rid_b and keys[-1][1] != (x.size.bit_length(),) and keys[-1][1] == ((64 * 4).bit_length(),)


def test_train_one_step_cell_under_the_switch_matches_eager(monkeypatch):
    """nn.TrainOneStepCell: the backward pass runs inside the anchor Cell (not a region of its own)."""

    def make(seed):
        net = nn.SequentialCell(nn.Dense(6, 12), nn.Tanh(), nn.Dense(12, 3))
        rng = np.random.default_rng(seed)
        for p in net.trainable_params():
            p.set_data(ms.Tensor((0.4 * rng.standard_normal(p.shape)).astype(np.float32)))
        loss_net = nn.WithLossCell(net, nn.MSELoss())
        return nn.TrainOneStepCell(loss_net, nn.Momentum(net.trainable_params(), 0.05, 0.9))

    rng = np.random.default_rng(7)
    data = []
    for _ in range(14):
        b = int(rng.integers(1, 6))
        data.append((ms.Tensor(rng.standard_normal((b, 6)).astype(np.float32)),
                     ms.Tensor(rng.standard_normal((b, 3)).astype(np.float32))))
    train = make(3)
    want = [float(train(x, y).asnumpy()) for x, y in data]
    _script(monkeypatch, [True, True, False, True, False, False, True, False, True, True, False, True, False, True])
    train = make(3)
    ms_dynvm.enable(step_switch=True, compile_policy="threshold", compile_threshold=1)
    got = [float(train(x, y).asnumpy()) for x, y in data]
    s = ms_dynvm.stats()
    assert not s["record_errors"] and s["step_calls"]["bare"] == 6 and s["step_calls"]["vm"] == 8
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class _Indexing(nn.Cell):
    """A Cell whose forward has many sync points of its own (basic indexing is one)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)

    def construct(self, x):
        y = self.dense(x)
        acc = y[0]
        for t in range(1, dispatch._BARE_SYNC_PATIENCE + 20):
            acc = acc + y[t % y.shape[0]]
        return acc


def test_sync_points_inside_a_bare_step_do_not_end_it(monkeypatch, _clean):
    net = _Indexing()
    x = ms.Tensor(np.ones((3, 4), np.float32))
    want = net(x).asnumpy()
    _script(monkeypatch, [True, False, False, False])
    ms_dynvm.enable(step_switch=True)
    net(x)
    for _ in range(3):
        seen = ms_dynvm.stats()["ops_seen"]
        np.testing.assert_array_equal(net(x).asnumpy(), want)
        # Still bare after its 80 indexing sync points: the handler saw none of the step's ops.
        assert dispatch._S.hooks.gate.bare and _DispatchGuardStack.depth() == _clean
        assert ms_dynvm.stats()["ops_seen"] == seen


def test_putting_the_vm_back_never_lands_on_a_mode_the_script_entered(monkeypatch, _clean):
    spy, seen = _spy()
    net, x = _bare_after_one_vm_step(monkeypatch)
    with spy:
        ms_dynvm.enable(step_switch=False)  # wants the VM back: not on top of the script's mode
        assert _DispatchGuardStack.depth() == _clean + 1
    assert _DispatchGuardStack.depth() == _clean  # the Spy left, ours was not under it
    seen.clear()
    ops.exp(x)
    assert not seen  # the Spy is gone
    net(x)  # a region start: now the VM goes back
    assert _DispatchGuardStack.depth() == _clean + 1 and not dispatch._S.hooks.gate.bare
    assert _vm_sees_the_next_op(x)


def test_a_deep_copy_of_a_cell_is_another_region():
    import copy

    a = _Boom()
    rid = dispatch._region_id(a)  # (kept in a's __dict__, which deepcopy copies)
    b = copy.deepcopy(a)
    assert dispatch._region_id(b) != rid
    assert dispatch._region_id(a) == dispatch._region_id(a)


def test_disable_inside_a_mode_entered_after_enable_is_a_clear_error(_clean):
    spy, _ = _spy()
    ms_dynvm.enable()
    with spy:
        with pytest.raises(RuntimeError, match="leave that mode first"):
            ms_dynvm.disable()
        assert ms_dynvm.is_enabled() and _DispatchGuardStack.depth() == _clean + 2
    assert ms_dynvm.disable() and _DispatchGuardStack.depth() == _clean


# --- sync-anchored steps: a script with no Cell call and no backward pass --------------------------
def _plain(x, m):
    return ops.tanh(ops.relu(ops.exp(x * 0.5 - 1.0) * m + x) - 0.25)


def _plain_inputs(seed, sizes):
    rng = np.random.default_rng(seed)
    return [(ms.Tensor(rng.standard_normal((b, 6)).astype(np.float32)),
             ms.Tensor((rng.random((b, 6)) > 0.3).astype(np.float32))) for b in sizes]


def test_sync_anchored_steps_equal_eager_and_bare_ones_are_unseen(monkeypatch, _clean):
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)  # one step per call
    data = _plain_inputs(3, [3, 5, 3, 4, 3, 5, 3, 4, 2, 3, 3])
    want = [_plain(x, m).asnumpy() for x, m in data]
    ways = [True, False, False, True, False, True, True, False, False, True]
    made = _script(monkeypatch, ways)
    ms_dynvm.enable(step_switch=True, compile_policy="threshold", compile_threshold=1)
    seen = []
    for (x, m), w in zip(data, want):
        before = ms_dynvm.stats()["ops_seen"]
        np.testing.assert_allclose(_plain(x, m).asnumpy(), w, rtol=1e-5, atol=1e-6)
        seen.append(ms_dynvm.stats()["ops_seen"] - before)
        # The sync point ends the step: ms_dynvm's mode is back on the stack after each.
        assert _DispatchGuardStack.depth() == _clean + 1 and not dispatch._S.hooks.gate.bare
    # The first call has no step (steps run from one sync point to the next); then one decision per
    # call, at its first op.
    assert made == ways
    assert seen[0] == 8 and all((n == 8) if vm else (n == 0) for n, vm in zip(seen[1:], ways))
    s = ms_dynvm.stats()
    assert s["step_calls"]["bare"] == ways.count(False) and s["step_calls"]["vm"] == ways.count(True)
    assert not s["record_errors"] and s["fused_ops"] > 0


def test_sync_anchored_keys_are_the_first_op_and_its_size_classes(monkeypatch):
    keys = []

    def decide(self, key, generation, group=None):
        keys.append((key, group))
        return True

    monkeypatch.setattr(StepSwitch, "decide", decide)
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)
    ms_dynvm.enable(step_switch=True)
    for x, m in _plain_inputs(4, [2, 2, 40]):
        _plain(x, m).asnumpy()
    assert len(keys) == 2
    (k1, g1), (k2, g2) = keys
    assert g1 == g2 == k1[0] == k2[0] and g1[0] == "sync"
    assert k1[1] == ((2 * 6).bit_length(),) and k2[1] == ((40 * 6).bit_length(),)


def test_a_region_start_hands_the_steps_to_its_anchor(monkeypatch, _clean):
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)
    made = _script(monkeypatch, [False] * 40)
    ms_dynvm.enable(step_switch=True)
    (x, m), = _plain_inputs(5, [3])
    want = _plain(x, m).asnumpy()
    np.testing.assert_allclose(_plain(x, m).asnumpy(), want, rtol=1e-5, atol=1e-6)  # a bare sync step
    assert len(made) == 1
    net = _Boom()
    xc = ms.Tensor(np.ones((2, 4), np.float32))
    net(xc)  # in the bare step: its start makes the Cell the anchor, which decides from now on
    assert len(made) == 2 and dispatch._S.hooks.gate.anchor == dispatch._region_id(net)
    for _ in range(3):
        np.testing.assert_allclose(_plain(x, m).asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert len(made) == 2  # sync points no longer start steps
    assert dispatch._S.hooks.gate.bare  # (the anchor's bare step goes on until its next start)


def test_sync_anchored_steps_not_switched_inside_a_mode_the_script_entered(monkeypatch, _clean):
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)
    spy, seen = _spy()
    made = _script(monkeypatch, [False] * 10)
    ms_dynvm.enable(step_switch=True)
    (x, m), = _plain_inputs(6, [3])
    _plain(x, m).asnumpy()
    with spy:
        # The switch says bare, but the spy is on top of ms_dynvm's mode: nothing is popped.
        _plain(x, m).asnumpy()
        assert _DispatchGuardStack.depth() == _clean + 2 and seen
    assert made == [False] and _DispatchGuardStack.depth() == _clean + 1
    assert ms_dynvm.stats()["step_calls"].get("bare", 0) == 0
    before = ms_dynvm.stats()["ops_seen"]
    _plain(x, m).asnumpy()  # now the step runs bare
    assert made == [False, False] and ms_dynvm.stats()["step_calls"]["bare"] == 1
    assert ms_dynvm.stats()["ops_seen"] == before and _DispatchGuardStack.depth() == _clean + 1


def test_measured_policy_takes_a_slow_vm_out_of_a_plain_loop(monkeypatch):
    """Real timing, with the VM made slow on purpose (0.5 ms per eagerly run op): the switch measures
    both ways and runs the loop bare, results equal to eager throughout."""
    from ms_dynvm.frontend.tier1 import Tier1

    after_op = Tier1.after_op

    def slow_after_op(self, *a):
        end = time.perf_counter() + 5e-4
        while time.perf_counter() < end:
            pass
        return after_op(self, *a)

    monkeypatch.setattr(Tier1, "after_op", slow_after_op)
    data = _plain_inputs(7, [4] * 60)
    want = [_plain(x, m).asnumpy() for x, m in data]
    ms_dynvm.enable(step_switch=True, jit=True)
    for k, ((x, m), w) in enumerate(zip(data, want)):
        if k == 40:
            seen = ms_dynvm.stats()["ops_seen"]
        np.testing.assert_allclose(_plain(x, m).asnumpy(), w, rtol=1e-5, atol=1e-6)
    s = ms_dynvm.stats()
    assert s["steps_bare"] == 1
    assert s["step_calls"]["bare"] >= StepSwitch.MIN_SAMPLES and s["step_calls"]["vm"] >= StepSwitch.MIN_SAMPLES
    # The last 20 calls ran bare (bar probes of the VM): the handler saw few of their 160 ops.
    assert s["ops_seen"] - seen <= 40


def test_short_sync_anchored_steps_merge(monkeypatch, _clean):
    """A step ends at the first sync point MIN_SYNC_STEP_S after its start: a loop of short calls makes
    one decision per few calls, and the switch gets the time per sync point."""
    times = []
    monkeypatch.setattr(StepSwitch, "record", lambda self, key, seconds, *a: times.append(seconds))
    made = _script(monkeypatch, [False] * 100)
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 3600.0)
    ms_dynvm.enable(step_switch=True)
    data = _plain_inputs(8, [3] * 12)
    stamps = []
    for x, m in data:
        stamps.append(time.perf_counter())
        _plain(x, m).asnumpy()
    assert made == [False] and not times  # one step (from the second call on), not over: bare all along
    assert dispatch._S.hooks.gate.bare and _DispatchGuardStack.depth() == _clean
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)
    x, m = data[0]
    t_last = time.perf_counter()
    _plain(x, m).asnumpy()  # the step's 12th sync point ends it
    t_end = time.perf_counter()
    assert len(times) == 1
    # Its time per sync point: the step ran from inside the second call to inside the last one.
    assert (t_last - stamps[2]) / 12 <= times[0] <= (t_end - stamps[1]) / 12
    assert _DispatchGuardStack.depth() == _clean + 1 and not dispatch._S.hooks.gate.bare


def test_keys_of_many_tensor_arguments_are_compact():
    """A first op over a list of variable pieces (a concat) is keyed by their number and the class of
    their total, not one class each: else nearly every step would be a new key."""
    few = [ms.Tensor(np.ones((n, 3), np.float32)) for n in (1, 5, 9)]
    many = [ms.Tensor(np.ones((n, 3), np.float32)) for n in (1, 5, 9, 2, 7, 3)]
    assert dispatch._size_classes((few,)) == tuple((n * 3).bit_length() for n in (1, 5, 9))
    assert dispatch._size_classes((many, 0)) == ("many", 6, (27 * 3).bit_length())
    other = [ms.Tensor(np.ones((n, 3), np.float32)) for n in (3, 3, 9, 4, 6, 2)]
    assert dispatch._size_classes((other,)) == dispatch._size_classes((many,))


def test_a_sync_anchored_vm_step_right_after_a_bare_one_is_no_sample(monkeypatch, _clean):
    """It starts with the recorder's Program dropped (the bare step dropped it), a cost that a run of
    VM steps does not pay: measuring it would bias the switch toward bare."""
    monkeypatch.setattr(dispatch, "MIN_SYNC_STEP_S", 0.0)
    ways = [True, False, True, True, False, False, True]
    made = _script(monkeypatch, ways)
    recorded = []
    monkeypatch.setattr(StepSwitch, "record", lambda self, key, seconds, vm, *a: recorded.append(vm))
    ms_dynvm.enable(step_switch=True)
    for x, m in _plain_inputs(9, [3] * (len(ways) + 2)):
        _plain(x, m).asnumpy()
    assert made == ways + [True]  # (8 steps: the first call has none; then the script's default, VM)
    # Every step is recorded at the next call's sync point, except the VM steps that follow a bare
    # one (the 3rd and the 7th).
    assert recorded == [True, False, True, False, False, True]
