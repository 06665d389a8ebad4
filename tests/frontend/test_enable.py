"""enable/disable/enabled/record behaviour, options, sync points, phases, threads, robustness."""

import threading

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import ops  # noqa: E402

import ms_dynvm  # noqa: E402
from ms_dynvm.frontend import dispatch  # noqa: E402
from ms_dynvm.frontend.options import Options  # noqa: E402

ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def _off(monkeypatch):
    monkeypatch.setenv("DYNVM_JIT", "0")  # these tests are about recording; tier 1 has its own
    ms_dynvm.disable()
    ms_dynvm.reset_stats()
    yield
    ms_dynvm.disable()


def t(a):
    return ms.Tensor(np.asarray(a, dtype=np.float32))


def test_enable_twice_disable_twice():
    assert ms_dynvm.disable() is False
    ms_dynvm.enable()
    ms_dynvm.enable(debug=1)  # applies options, does not enter a second mode
    assert ms_dynvm.is_enabled() and dispatch.current_options().debug == 1
    ops.exp(t([1.0]))
    assert ms_dynvm.stats()["ops_seen"] == 1  # seen once, not twice
    assert ms_dynvm.disable() is True
    assert ms_dynvm.disable() is False
    ops.exp(t([1.0]))
    assert ms_dynvm.stats()["ops_seen"] == 1


def test_enabled_restores_previous_state():
    with ms_dynvm.enabled():
        assert ms_dynvm.is_enabled()
    assert not ms_dynvm.is_enabled()
    ms_dynvm.enable(max_block_ops=77)
    with ms_dynvm.enabled(max_block_ops=5):
        assert dispatch.current_options().max_block_ops == 5
    assert ms_dynvm.is_enabled() and dispatch.current_options().max_block_ops == 77


def test_options_validation_and_env(monkeypatch):
    with pytest.raises(TypeError, match="unknown ms_dynvm option"):
        ms_dynvm.enable(recrod=False)
    monkeypatch.setenv("DYNVM_MAX_BLOCK_OPS", "12")
    monkeypatch.setenv("DYNVM_RECORD", "false")
    o = Options.make()
    assert o.max_block_ops == 12 and o.record is False
    assert Options.make(max_block_ops=3).max_block_ops == 3  # keyword beats env
    monkeypatch.setenv("DYNVM_DEBUG", "lots")
    with pytest.raises(ValueError, match="DYNVM_DEBUG"):
        Options.make()
    monkeypatch.delenv("DYNVM_DEBUG")
    with pytest.raises(ValueError, match="cell_boundaries"):
        Options.make(cell_boundaries="some")
    # keywords of the wrong type (an API round: jit="false" kept tier 1 on, a float max_block_ops
    # made the recorder fail on every op)
    for bad in ({"jit": "false"}, {"step_switch": "off"}, {"max_block_ops": 10.5}, {"debug": "1"},
                {"dump_dir": 3}, {"record": 2}):
        with pytest.raises(TypeError, match="ms_dynvm option"):
            Options.make(**bad)
    assert Options.make(jit=0).jit is False and Options.make(max_block_ops=np.int64(7)).max_block_ops == 7
    for bad in ({"kernel_threads": -1}, {"pool_soft_cap_mb": -5}, {"debug": 7}):
        with pytest.raises(ValueError):
            Options.make(**bad)
    with pytest.raises(TypeError, match="ms_dynvm option"):
        ms_dynvm.enable(jit="false")


def test_sync_points_end_blocks_and_setitem_makes_new_value():
    x = t(np.arange(6).reshape(2, 3))
    with ms_dynvm.record() as rec:
        y = ops.exp(x) * 2.0
        _ = y.asnumpy()
        z = y + 1.0
        z[0, 0] = 100.0  # not dispatched: z's value changes behind the hook's back
        w = z * 3.0
    ends = [b.end for b in rec.program.blocks]
    assert ends[0] == "sync" and "sync" in ends[1:]
    got = ms_dynvm.interpret(rec.program, [a.asnumpy() for a in rec.inputs])
    np.testing.assert_allclose(got[rec.output_index(w)], w.asnumpy(), rtol=1e-6)
    assert float(w.asnumpy()[0, 0]) == 300.0
    st = ms_dynvm.stats()
    assert st["sync_points"]["asnumpy"] >= 1 and st["sync_points"]["__setitem__"] == 1


def test_forward_backward_phases():
    net = ms.nn.Dense(3, 3, has_bias=False)

    def f(x):
        return ops.tanh(net(x)).sum()

    g = ms.value_and_grad(f, None, net.trainable_params())
    with ms_dynvm.record() as rec:
        g(t(np.ones((2, 3))))
    phases = [b.phase for b in rec.program.blocks if b.instrs]
    assert phases[0] == "fwd" and "bwd" in phases
    assert any(i.kind == "param" and i.name == "weight" for i in rec.program.inputs), \
        rec.program.as_text()
    assert ms_dynvm.stats()["ops_by_phase"]["bwd"] > 0


def test_cell_boundaries_end_blocks():
    net = ms.nn.Dense(3, 2)
    x = t(np.ones((2, 3)))
    with ms_dynvm.record() as rec:
        y = ops.exp(x)
        net(y)
        ops.exp(y)
    regions = [(b.region, b.end) for b in rec.program.blocks]
    assert ("", "cell") in regions and ("Dense", "cell") in regions


def test_other_threads_are_not_recorded():
    ms_dynvm.enable()
    ops.exp(t([1.0]))
    done = []

    def worker():
        done.append(float(ops.exp(t([2.0])).asnumpy()[0]))

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert done and abs(done[0] - np.exp(2.0)) < 1e-5
    st = ms_dynvm.stats()
    assert st["ops_seen"] == 1 and "asnumpy" not in st["sync_points"]


@pytest.mark.parametrize("then", ["enable", "disable"])
def test_a_thread_that_ends_enabled_leaves_nothing_behind(then):
    # A worker enables ms_dynvm and ends without disable(): the main thread can still enable (or
    # disable) afterwards, and the worker's hooks are gone (a sync point on the main thread is not
    # counted while nothing is enabled).
    def worker():
        ms_dynvm.enable()
        ops.exp(t([1.0]))

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert ms_dynvm.is_enabled()
    if then == "enable":
        ms_dynvm.enable()
        ops.exp(t([2.0])).asnumpy()
        assert dispatch._S.thread == threading.get_ident() and ms_dynvm.stats()["sync_points"] == {"asnumpy": 1}
        assert ms_dynvm.disable() is True
    else:
        assert ms_dynvm.disable() is True and not ms_dynvm.is_enabled()
        before = ms_dynvm.stats()["sync_points"]
        ops.exp(t([2.0])).asnumpy()
        assert ms_dynvm.stats()["sync_points"] == before
    assert ms_dynvm.disable() is False


def test_op_errors_propagate_like_eager():
    a, b = t(np.ones((2, 3))), t(np.ones((4, 5)))
    with pytest.raises(Exception) as eager:
        ops.add(a, b)
    ms_dynvm.enable()
    with pytest.raises(type(eager.value)):
        ops.add(a, b)
    assert ops.add(a, a).asnumpy().sum() == 12  # still works afterwards


def test_recorder_failure_never_breaks_the_script(monkeypatch):
    from ms_dynvm.frontend import recorder

    def boom(args, prim):
        raise RuntimeError("normaliser bug")

    monkeypatch.setitem(recorder._TABLE, "Exp", boom)  # the normaliser's handler for Exp
    ms_dynvm.enable()
    y = ops.exp(t([0.0, 1.0]))
    np.testing.assert_allclose(y.asnumpy(), np.exp([0.0, 1.0]), rtol=1e-6)
    assert ms_dynvm.stats()["record_errors"] == {"Exp: RuntimeError": 1}


def test_a_failure_at_a_sync_point_or_cell_boundary_never_breaks_the_script(monkeypatch):
    """The sync-point, grad and Cell hooks call the recorder (and through it tier 1) outside the
    dispatch handler: a failure there is counted, and the user's call goes on."""
    from mindspore import nn

    from ms_dynvm.frontend.tier1 import Tier1

    def boom(self, *a):
        raise IndexError("injected")

    x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    net = nn.Dense(3, 2)
    ms_dynvm.reset_stats()
    ms_dynvm.enable(jit=True)
    try:
        monkeypatch.setattr(Tier1, "end_run", boom)
        y = ops.exp(x) * 2.0
        assert np.allclose(y.asnumpy(), np.exp(x.asnumpy()) * 2.0)
        monkeypatch.setattr(dispatch._S.recorder.__class__, "sync", boom)
        monkeypatch.setattr(dispatch._S.recorder.__class__, "enter_region", boom)
        z = net(ops.relu(x))
        assert z.asnumpy().shape == (2, 2) and float(y[0, 0]) == 2.0
        st = ms_dynvm.stats()
    finally:
        ms_dynvm.disable()
    assert st["fallbacks"].get("tier1: error (IndexError)", 0) >= 1, st["fallbacks"]
    assert any(k.endswith("IndexError") for k in st["record_errors"]), st["record_errors"]


def test_record_does_not_nest_and_reports_opaque():
    with ms_dynvm.record():
        with pytest.raises(RuntimeError, match="do not nest"):
            with ms_dynvm.record():
                pass


def test_count_only_mode_records_nothing():
    ms_dynvm.enable(record=False)
    ops.exp(t([1.0])) * 2.0
    st = ms_dynvm.stats()
    assert st["ops_seen"] == 2 and st["instrs"] == 0 and st["blocks"] == 0


def test_max_block_ops_limit():
    ms_dynvm.enable(max_block_ops=3)
    x = t([1.0])
    for _ in range(7):
        x = ops.exp(x) * 0.5
    assert ms_dynvm.stats()["block_ends"].get("limit", 0) >= 4


def test_dump_dir_and_debug(tmp_path, capsys):
    ms_dynvm.enable(debug=2, dump_dir=str(tmp_path))
    y = ops.exp(t([1.0, 2.0])) * 2.0
    y.asnumpy()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files and files[0].startswith("block_")
    prog = ms_dynvm.load_program(tmp_path / files[0])
    assert [i.op for i in prog.instrs()] == ["exp", "mul"]
    assert "= exp(" in capsys.readouterr().err


def test_opaque_call_ends_its_block_and_is_counted():
    from ms_dynvm.runtime.interpreter import InterpreterError

    x = t(np.array([[3.0, 1.0, 2.0], [0.5, -1.0, 4.0]]))
    with ms_dynvm.record() as rec:
        y = ops.exp(x)
        s, _ = ops.sort(y, axis=-1)  # no VM op for sort: an opaque call
        z = s * 2.0
    calls = [i for i in rec.program.instrs() if i.op == "call"]
    assert calls and calls[0].attrs["target"] in ms_dynvm.stats()["ops_opaque"]
    ends = [b.end for b in rec.program.blocks]
    assert "call" in ends and rec.program.blocks[ends.index("call")].instrs[-1].op == "call"
    inputs = [a.asnumpy() for a in rec.inputs]
    # By default the recording's own handler runs the call again through MindSpore.
    np.testing.assert_array_equal(ms_dynvm.interpret(rec.program, inputs)[rec.output_index(z)], z.asnumpy())
    rec.program.call_handler = None  # (as a loaded program: no handler)
    with pytest.raises(InterpreterError):
        ms_dynvm.interpret(rec.program, inputs)

    def handler(instr, args):  # the caller supplies what the VM does not model
        vals = np.sort(args[0], axis=-1)
        return (vals, np.argsort(args[0], axis=-1, kind="stable").astype(np.int64))[:len(instr.outs)]

    got = ms_dynvm.interpret(rec.program, inputs, call_handler=handler)
    np.testing.assert_allclose(got[rec.output_index(z)], z.asnumpy(), rtol=1e-5)


def test_a_group_made_hot_by_the_exit_handler_is_not_compiled(recwarn):
    # A fusible run seen before and run once more as the script's last statements: the exit
    # handler's disable() closes its block, which would make it hot; nothing compiles at exit (gcc is
    # refused by then, and a warning eager never prints would reach the user: a held-out script).
    x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    ms_dynvm.enable(jit=True, compile_policy="threshold", step_switch=False, compile_async=False)
    ms_dynvm.reset_stats()
    for i in range(2):
        y = ops.exp(x * 0.5) + ops.sigmoid(x) * 2.0
        if i < 1:
            y.asnumpy()
    dispatch._at_exit()
    assert not dispatch.is_enabled()
    s = ms_dynvm.stats()
    assert s["compiles"] == 0 and s["groups_compiled"] == 0 and s["cache_hits"] == 0, s
    assert not [w for w in recwarn if "ms_dynvm" in str(w.message)]
    # The same script, ended by disable() instead: the closing block makes the group hot and it is
    # compiled (what the exit handler skips).
    ms_dynvm.enable(jit=True, compile_policy="threshold", step_switch=False, compile_async=False)
    y = ops.exp(x * 0.5) + ops.sigmoid(x) * 2.0
    ms_dynvm.disable()
    assert ms_dynvm.stats()["groups_compiled"] == 1


def test_scope_misuse_gives_clear_errors_and_leaves_a_sound_state():
    """(An API round.) disable() or enable(record=False) inside a record() scope raise RuntimeError
    there (leaving the scope raised AttributeError from ms_dynvm, or the ops after it were missing
    from the Program); record() on a thread while ms_dynvm is enabled on another raises as enable()
    does (it recorded the other thread's ops). Afterwards ms_dynvm is off and a new scope works."""
    x = t(np.ones((2, 3)))
    with ms_dynvm.record() as rec:
        y = x * 2
        with pytest.raises(RuntimeError, match="inside a record"):
            ms_dynvm.disable()
        with pytest.raises(RuntimeError, match="inside a record"):
            ms_dynvm.enable(record=False)
        z = y + 1
    assert not ms_dynvm.is_enabled() and rec.program.num_instrs() == 2
    np.testing.assert_array_equal(ms_dynvm.interpret(rec.program, rec.input_arrays())[rec.output_index(z)],
                                  z.asnumpy())
    ms_dynvm.enable(jit=False)
    try:
        err = []

        def worker():
            try:
                with ms_dynvm.record():
                    x * 5.0
            except RuntimeError as e:
                err.append(str(e))

        th = threading.Thread(target=worker)
        th.start()
        th.join()
        assert err and "another thread" in err[0]
    finally:
        ms_dynvm.disable()
    with ms_dynvm.record() as rec2:
        x * 3.0
    assert rec2.program.num_instrs() == 1
    # a thread that enabled ms_dynvm and ended without disable() holds nothing: record() works here
    th = threading.Thread(target=lambda: ms_dynvm.enable(jit=False))
    th.start()
    th.join()
    with ms_dynvm.record() as rec3:
        x * 4.0
    assert rec3.program.num_instrs() == 1 and not ms_dynvm.is_enabled()


def test_scope_suspended_in_a_generator_at_exit_is_quiet(tmp_path):
    """A generator suspended inside `enabled()` or `record()` when the script ends: exit status 0
    and nothing from ms_dynvm on stderr (the scopes' finally blocks ran after module teardown and
    printed 'Exception ignored ... NoneType')."""
    import subprocess
    import sys

    script = tmp_path / "s.py"
    script.write_text(
        "import numpy as np, mindspore as ms, ms_dynvm\n"
        "x = ms.Tensor(np.ones((4, 4), np.float32))\n"
        "def batches():\n"
        "    with ms_dynvm.enabled():\n"
        "        for i in range(10):\n"
        "            yield x * i\n"
        "def recorded():\n"
        "    with ms_dynvm.record():\n"
        "        yield x + 1\n"
        "        yield x + 2\n"
        "b = batches(); next(b)\n"
        "r = recorded(); next(r)\n"
        "print('done')\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "done" in p.stdout
    assert "Exception ignored" not in p.stderr and "ms_dynvm" not in p.stderr, p.stderr[-2000:]
