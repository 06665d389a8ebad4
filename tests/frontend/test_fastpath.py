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


def _feed(rec_hit, events, rounds=3):
    """A plain-mode Recorder fed `events` (name, args, out) `rounds` times with the C path set to
    `rec_hit` (None: Python only): its program text and the last_op of every event."""
    from ms_dynvm.frontend.options import Options

    saved = R._hit
    R._hit = rec_hit
    try:
        rec = R.Recorder(Options.make(jit=False))
        lasts = []
        for _ in range(rounds):
            for name, args, out in events:
                rec.on_op(name, args, out)
                lo = rec.last_op
                lasts.append(None if lo is None else (lo[1], lo[2], tuple(lo[3])))
        return rec.program.as_text(), lasts
    finally:
        R._hit = saved


def test_key_cache_keys_as_the_python_key():
    """The C key cache (ctab in _crecord.c) finds the plan the Python key finds: scalar forms
    (float, int, bool, an int past 64 bits, None, a tuple, a list, the legacy form) each key their
    own plan, repeated events are answered by the cache, and the program equals the Python path's."""
    assert R.set_c_hot_path(True)
    mod = fastpath.load()
    rng = np.random.default_rng(7)
    base = rng.standard_normal((3, 4)).astype(np.float32)
    bias = rng.standard_normal((4,)).astype(np.float32)
    prim = ops.BiasAdd()

    def events():
        a, b, c = ms.Tensor(base), ms.Tensor(base + 1), ms.Tensor(bias)
        ev = [("Muls", (a, s), a * 1) for s in (2.0, 2, True, 2 ** 70, -3.5)]
        ev += [("SumExt", (b, (0,), False, None), ops.sum(b, 0)), ("SumExt", (b, [1], True, None), ops.sum(b, 1, True)),
               ("SumExt", (b, (1,), True, None), ops.sum(b, 1, True)), ("BiasAdd", (prim, "BiasAdd", (a, c, 1)), a * 1),
               ("AddExt", (a, b, 1), a + b), ("AddExt", (a, b, 2), a + b), ("AddExt", (a, b, 0.5), a + b)]
        return ev

    s0 = mod.stats()
    c_text, c_last = _feed(R._hit, events(), rounds=4)
    s1 = mod.stats()
    py_text, py_last = _feed(None, events(), rounds=4)
    assert c_text == py_text
    assert c_last == py_last
    # Rounds 1-2 make the plans (each new plan changes its dict: earlier entries end); in rounds 3
    # and 4 every event but the one with an int past 64 bits (keyed in Python) is a cache hit: 20,
    # unless 5 of the 10 keys fall in one set of the cache (the 4-way table; a direct-mapped one
    # lost hits to any two keys sharing a slot, as placed by their addresses: a flaky CI run).
    assert s1["key_cache_hits"] - s0["key_cache_hits"] >= 18, (s0, s1)


def test_key_cache_entry_ends_with_a_change_to_its_plans():
    """A cached lookup holds only while the plans dict it came from is unchanged (its version tag):
    any change to the dict makes the next lookup a miss that asks the dict again."""
    x = ms.Tensor(np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32))
    ms_dynvm.enable()
    mod = fastpath.load()
    for _ in range(3):
        ops.exp(x)
    s0 = mod.stats()
    ops.exp(x)
    s1 = mod.stats()
    assert s1["key_cache_hits"] == s0["key_cache_hits"] + 1
    plans = R._PLANS["Exp"]
    k, p = next(iter(plans.items()))
    plans[k] = tuple(list(p))  # an equal plan, another object: the dict changed
    ops.exp(x)
    s2 = mod.stats()
    assert s2["key_cache_hits"] == s1["key_cache_hits"] and s2["key_cache_misses"] == s1["key_cache_misses"] + 1
    ops.exp(x)
    assert mod.stats()["key_cache_hits"] == s2["key_cache_hits"] + 1
    ms_dynvm.disable()


def test_mixed_precision_plans_are_apart(monkeypatch):
    """A legacy primitive's plan under a mixed-precision type (its inputs cast) is not the plan of
    the same call outside it: alternating calls inside and outside a `to_float(float16)` Cell record
    the same blocks with the C path as with the Python path (which the C path mostly records), and
    only the inside ones cast."""
    from mindspore import nn

    class Legacy(nn.Cell):  # legacy primitives with plans: BiasAdd, ReLU, Sigmoid
        def __init__(self):
            super().__init__()
            self.b = ms.Parameter(ms.Tensor(np.linspace(-1, 1, 3).astype(np.float32)))
            self.bias_add, self.relu, self.sigmoid = ops.BiasAdd(), ops.ReLU(), ops.Sigmoid()

        def construct(self, x):
            return self.sigmoid(self.relu(self.bias_add(x, self.b)))

    plain, mixed = Legacy(), Legacy().to_float(ms.float16)
    x = ms.Tensor(np.random.default_rng(8).standard_normal((2, 3)).astype(np.float32))

    def run(c_path):
        texts, hits = [], []
        close = R.Recorder.close_block

        def spy(self, reason):
            if self.block is not None and self.block.num_instrs():
                texts.append(self.program.as_text())
            return close(self, reason)

        monkeypatch.setattr(R.Recorder, "close_block", spy)
        ms_dynvm.enable(c_hot_path=c_path)
        if c_path:
            hit = R._hit
            R._hit = lambda *a: hits.append(hit(*a)) or hits[-1]
        for _ in range(4):
            plain(x).asnumpy()
            mixed(x).asnumpy()
        ms_dynvm.disable()
        monkeypatch.setattr(R.Recorder, "close_block", close)
        return texts, hits

    (py, _), (c, hits) = run(False), run(True)
    assert c == py and len(c) == 8
    assert sum(hits) >= 12  # the C path recorded most ops of the last calls
    assert [("cast(" in t) for t in c] == [False, True] * 4


def test_staged_build_records_the_same_blocks_and_counts_stages(monkeypatch):
    """profiling/tools/breakdown_record.py's build of the hot path (-DDVM_STAGES: cycle counts by stage)
    records exactly what the normal build records, and its counts add up over the stages it ran."""
    c, _ = _blocks("mlp", True, monkeypatch)
    with open(fastpath._SOURCE) as f:
        staged = fastpath._load_bytes(gcc.compile_shared(f.read(), fastpath._build_flags() + ["-DDVM_STAGES"]),
                                      "_crecord")
    saved = fastpath._state.get("module")
    monkeypatch.setitem(fastpath._state, "module", staged)
    staged.stages()
    s, counted = _blocks("mlp", True, monkeypatch)
    st = staged.stages()
    monkeypatch.setitem(fastpath._state, "module", saved)
    assert [t for _, t in s] == [t for _, t in c] and sum(counted) > 0
    assert not hasattr(saved, "stages")  # the recorder's own build counts nothing
    for k in ("argument tags, key", "result tag", "block", "instruction", "cleanup"):
        assert st[k] > 0, (k, st)
