"""The recorder's C hot path (`frontend/_crecord.c`, loaded by `frontend/fastpath.py`): built and
used by default, the same blocks as the Python path (the reference-recorder tests of
test_recorder.py run with it on), hits in a steady loop, and a clean fallback without a compiler."""

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import ops  # noqa: E402

import ms_dynvm  # noqa: E402
from ms_dynvm.codegen import gcc  # noqa: E402
from ms_dynvm.frontend import fastpath  # noqa: E402
from ms_dynvm.frontend import recorder as R  # noqa: E402
from profiling.workloads import WORKLOADS  # noqa: E402

ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def _off(monkeypatch):
    monkeypatch.setenv("DYNVM_JIT", "0")
    ms_dynvm.disable()
    yield
    ms_dynvm.disable()
    R.set_c_hot_path(True)


def _blocks(name, c_path, monkeypatch):
    """Text of every block the plain-mode recorder closes over three calls of workload `name`."""
    texts = []
    close = R.Recorder.close_block

    def spy(self, reason):
        if self.block is not None and self.block.num_instrs():
            texts.append((reason, self.program.as_text()))
        return close(self, reason)

    monkeypatch.setattr(R.Recorder, "close_block", spy)
    fn, inputs = WORKLOADS[name](seed=4)
    ms_dynvm.enable(c_hot_path=c_path)
    assert (R._hit is not None) == c_path
    counted = []
    if c_path:
        hit = R._hit

        def counting(*a):
            r = hit(*a)
            counted.append(r)
            return r

        R._hit = counting
    for _ in range(3):
        fn(*inputs)
    ms_dynvm.disable()
    monkeypatch.setattr(R.Recorder, "close_block", close)
    return texts, counted


@pytest.mark.parametrize("name", ["mlp", "attention", "layernorm_gelu", "transformer", "gnn"])
def test_c_and_python_paths_record_the_same_blocks(monkeypatch, name):
    py, _ = _blocks(name, False, monkeypatch)
    c, counted = _blocks(name, True, monkeypatch)
    # Register numbers and epochs differ between two runs only by where each Program started; the
    # texts of the blocks (registers numbered per program) must be equal.
    assert len(c) == len(py) > 0
    assert [t for _, t in c] == [t for _, t in py]
    assert sum(counted) > 0  # the C path recorded some of these ops itself


def test_steady_loop_hits_in_c():
    x = ms.Tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
    ms_dynvm.enable()
    hit = R._hit
    counted = []
    R._hit = lambda *a: counted.append(hit(*a)) or counted[-1]
    for _ in range(5):
        x = ops.tanh(x * 0.5 + 1.0) - x
    R._hit = hit
    # The first call makes the plans and the inputs; later calls hit (x's register is current).
    assert sum(counted) >= 8, counted


def test_no_compiler_is_one_warning_and_the_python_path(monkeypatch):
    monkeypatch.setattr(gcc, "GCC", "no-such-cc-dvm")
    monkeypatch.setattr(fastpath, "_state", {})
    monkeypatch.setenv("DYNVM_CACHE_DIR", "/tmp/dvm-no-cache-for-this-test")
    # A fresh build is needed for the warning: a different source key than any cached one.
    real = open(fastpath._SOURCE).read()
    monkeypatch.setattr(fastpath, "_SOURCE", "/tmp/dvm_crecord_test.c")
    with open(fastpath._SOURCE, "w") as f:
        f.write(real + "\n/* test copy */\n")
    with pytest.warns(RuntimeWarning, match="C hot path is unavailable"):
        ms_dynvm.enable()
    assert R._hit is None
    x = ms.Tensor(np.ones((2, 2), np.float32))
    y = ops.exp(x) * 2
    np.testing.assert_allclose(y.asnumpy(), np.exp(np.ones((2, 2))) * 2, rtol=1e-6)
    assert not ms_dynvm.stats()["record_errors"]


def test_no_compiler_at_all_is_one_warning_for_the_hot_path_and_tier_1(monkeypatch, tmp_path):
    import warnings

    from ms_dynvm.frontend import dispatch
    from ms_dynvm import warn as warn_mod
    from ms_dynvm.runtime import cache as cache_mod

    monkeypatch.setattr(gcc, "GCC", "no-such-cc-dvm")
    monkeypatch.setattr(warn_mod, "_WARNED", set())
    monkeypatch.setattr(fastpath, "_state", {})
    monkeypatch.setattr(cache_mod, "_DEFAULT", None)
    monkeypatch.setenv("DYNVM_CACHE_DIR", str(tmp_path / "kc"))  # nothing cached: every kernel is a build
    real = open(fastpath._SOURCE).read()
    monkeypatch.setattr(fastpath, "_SOURCE", str(tmp_path / "crecord.c"))
    with open(fastpath._SOURCE, "w") as f:
        f.write(real + "\n/* test copy */\n")
    ms_dynvm.disable()
    dispatch.forget_compiled()
    ms_dynvm.reset_stats()
    x = ms.Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    want = (ops.tanh(x * 0.5 + 1.0) - x).asnumpy()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ms_dynvm.enable(jit=True, compile_policy="threshold", compile_threshold=1)
        for _ in range(4):
            np.testing.assert_allclose((ops.tanh(x * 0.5 + 1.0) - x).asnumpy(), want, rtol=1e-6)
        st = ms_dynvm.stats()
        ms_dynvm.disable()
    ours = [str(m.message) for m in w if "ms_dynvm" in str(m.message)]
    assert len(ours) == 1 and "no C compiler" in ours[0], ours
    assert any("compile error" in k for k in st["fallbacks"]), st["fallbacks"]


def test_c_path_holds_no_stray_references():
    """Reference counts of what a plan shares with every instruction it records (op name, attrs,
    result type, the plan itself) return to where they were once the Programs that held those
    instructions are dropped: the C path leaks no reference per op (a leak of one per hit would
    show as +300 here)."""
    import gc
    import sys

    x = ms.Tensor(np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32))
    ms_dynvm.enable()
    hit = R._hit
    hits = [0]

    def counting(*a):
        r = hit(*a)
        hits[0] += r is True  # (a count, not the results: a list of them would hold references)
        return r

    R._hit = counting

    def step():
        y = ops.exp(x) * 2.0
        y = ops.tanh(y - x)
        y.asnumpy()  # a sync point: the block ends and its Program is dropped

    for _ in range(5):
        step()
    plans = [p for name in ("Muls", "Exp", "Tanh", "SubExt", "Sub") for p in R._PLANS.get(name, {}).values()]
    assert plans
    gc.collect()
    # (None, True and False are held by many counters and lists in passing: not comparable.)
    shared = [o for p in plans for o in (p, *p) if o is not None and o is not True and o is not False]
    before = [sys.getrefcount(o) for o in shared]
    n0 = hits[0]
    for _ in range(300):
        step()
    gc.collect()
    after = [sys.getrefcount(o) for o in shared]
    R._hit = hit
    assert hits[0] - n0 >= 300  # the C path recorded them
    # Equal up to a few references held in passing (the last block's instructions, which
    # `last_op` keeps alive, vary by one now and then); a leak of one per op would be +300 or more.
    grown = [a - b for a, b in zip(after, before)]
    assert max(grown) <= 5, grown
