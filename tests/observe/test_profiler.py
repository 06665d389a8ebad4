"""A real training loop under `mindspore.profiler.profile` with ms_dynvm enabled: MindSpore's events and
ms_dynvm's end up in one trace_view.json, in time order, on one clock."""

import glob
import json
import os

import pytest

pytest.importorskip("mindspore")

import ms_dynvm  # noqa: E402
from ms_dynvm.observe import events, profiler  # noqa: E402
from tests.observe.train import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    out = str(tmp_path_factory.mktemp("profile"))
    merged_before = len(profiler.merged)
    from ms_dynvm.frontend.dispatch import forget_compiled

    forget_compiled()  # (tier 1's executors outlive a test: start from nothing learned)
    with ms_dynvm.enabled(step_switch=True, compile_policy="threshold"):
        t = Trainer()
        t.run(3)  # warm: the model is built and the first steps compile outside the profile
        assert not events.ON  # recording is off outside a profile
        with ms.profiler.profile(activities=[ProfilerActivity.CPU],
                                 on_trace_ready=ms.profiler.tensorboard_trace_handler(out)):
            assert events.ON
            t.run(12, batch=lambda i: 4 + 4 * (i % 2))
        assert not events.ON
    paths = glob.glob(os.path.join(out, "*", "ASCEND_PROFILER_OUTPUT", "trace_view.json"))
    assert len(paths) == 1
    assert profiler.merged[merged_before:] and profiler.merged[-1][0] == paths[0]
    with open(paths[0]) as f:
        return json.load(f)


def _split(doc):
    pname = {e["pid"]: e["args"]["name"] for e in doc if e.get("ph") == "M" and e["name"] == "process_name"}
    dvm = [p for p, n in pname.items() if n == "ms_dynvm"]
    assert len(dvm) == 1, pname
    ours = [e for e in doc if e.get("ph") != "M" and e["pid"] == dvm[0]]
    theirs = [e for e in doc if e.get("ph") != "M" and e["pid"] != dvm[0]]
    return ours, theirs, pname, dvm[0]


def test_both_in_one_file(trace):
    ours, theirs, pname, pid = _split(trace)
    assert len(theirs) > 100 and any(n == "CPU OP" for n in pname.values())
    assert any("SGD" in e["name"] for e in theirs)  # MindSpore's kernels of the loop
    tracks = {e["args"]["name"] for e in trace if e.get("ph") == "M" and e["pid"] == pid and e["name"] == "thread_name"}
    assert {"step", "kernel", "recording", "compile"} <= tracks
    cats = {e["cat"] for e in ours}
    assert {"ms_dynvm.step", "ms_dynvm.kernel"} <= cats
    assert any(e["name"] == "fused group served" and e["ph"] == "X" for e in ours)
    assert any(e["name"] in ("step (ms_dynvm)", "step (bare eager)") for e in ours)


def test_ordered(trace):
    timed = [e for e in trace if e.get("ph") != "M"]
    ts = [float(e["ts"]) for e in timed]
    assert ts == sorted(ts)
    first_timed = next(i for i, e in enumerate(trace) if e.get("ph") != "M")
    assert all(e.get("ph") != "M" for e in trace[first_timed:])  # metadata first


def test_one_clock(trace):
    """ms_dynvm's events lie within MindSpore's span (the profile's first kernel may start a little
    after the window opens: 0.2 s of slack, against a clock error that would be years or a factor
    of 1000), and each whole step ms_dynvm timed contains MindSpore kernels of that step."""
    ours, theirs, _, _ = _split(trace)
    lo = min(float(e["ts"]) for e in theirs)
    hi = max(float(e["ts"]) + float(e.get("dur", 0)) for e in theirs)
    for e in ours:
        assert lo - 2e5 <= float(e["ts"]) <= hi + 2e5, (e, lo, hi)
    inside = sum(lo <= float(e["ts"]) <= hi for e in ours)
    assert inside >= 0.9 * len(ours)
    steps = [e for e in ours if e["name"] in ("step (ms_dynvm)", "step (bare eager)")]
    assert len(steps) >= 5
    for s in steps:
        a, b = float(s["ts"]), float(s["ts"]) + s["dur"]
        assert any(a <= float(e["ts"]) <= b and "SGD" in e["name"] for e in theirs), s


def test_profile_started_before_enable(tmp_path):
    """A profile made before ms_dynvm hooked the profiler: the window opens at enable() and closes
    when MindSpore analyses (its controller calls the unwrapped stop)."""
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    t = Trainer(seed=1)
    profiler.uninstall()
    before = len(profiler.merged)
    prof = ms.profiler.profile(activities=[ProfilerActivity.CPU],
                               on_trace_ready=ms.profiler.tensorboard_trace_handler(str(tmp_path)))
    prof.start()
    try:
        with ms_dynvm.enabled(step_switch=True, compile_policy="threshold"):
            assert events.ON
            t.run(4)
    finally:
        prof.stop()
    assert not events.ON
    assert len(profiler.merged) == before + 1
    path, n = profiler.merged[-1]
    assert n > 0 and path.startswith(str(tmp_path))
    with open(path) as f:
        ours, theirs, _, _ = _split(json.load(f))
    assert len(ours) == n and theirs


def test_merge_into_a_dict_trace_and_async(tmp_path, monkeypatch):
    """A trace in the {"traceEvents": [...]} form; and with async analysis, a file that appears later."""
    import threading
    import time

    events.start("test")
    events.emit("fused group served", "kernel", 2_000, 10, ops=3)
    events.stop("test")
    evs = events.snapshot()
    p = tmp_path / "trace_view.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "CPU OP"}},
        {"ph": "X", "name": "MatMul", "pid": 7, "tid": 0, "ts": "2005.5", "dur": "3"},
        {"ph": "X", "name": "Add", "pid": 7, "tid": 0, "ts": "1000.0", "dur": "3"}], "displayTimeUnit": "ms"}))
    assert profiler.merge_into(str(p), evs) == 1
    doc = json.loads(p.read_text())
    assert doc["displayTimeUnit"] == "ms"
    timed = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert [e["name"] for e in timed] == ["Add", "fused group served", "MatMul"]
    assert timed[1]["pid"] == 8  # a pid the file does not use

    q = tmp_path / "later" / "trace_view.json"
    monkeypatch.setattr(profiler, "_pending", list(evs))
    profiler._on_analysed(str(q), async_mode=True)

    def write_later():
        time.sleep(0.3)
        q.parent.mkdir()
        q.write_text(json.dumps([{"ph": "X", "name": "Add", "pid": 1, "tid": 0, "ts": 1000, "dur": 1}]))

    threading.Thread(target=write_later).start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (profiler.merged and profiler.merged[-1][0] == str(q)):
        time.sleep(0.1)
    assert profiler.merged[-1] == (str(q), 1)
    assert [e["name"] for e in json.loads(q.read_text()) if e["ph"] != "M"] == ["Add", "fused group served"]


def test_a_failed_merge_never_reaches_the_script(tmp_path, monkeypatch, caplog):
    """MindSpore's analyse goes through ms_dynvm's wrapper; a trace that cannot be merged is logged
    once and the call returns normally."""
    import logging

    from mindspore.profiler.profiler_interface import ProfilerInterface

    assert profiler.install()
    p = tmp_path / "trace_view.json"
    p.write_text("{not json")
    monkeypatch.setattr(profiler, "trace_path", lambda: str(p))
    monkeypatch.setattr(profiler, "_pending", [("x", "other", 1, 1, 0, None)])
    monkeypatch.setattr(ProfilerInterface, "is_initialized", False)  # MindSpore's own analyse: a no-op
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        ProfilerInterface.analyse()
    assert any(r.name == "ms_dynvm.profiler" and "failed in analyse" in r.getMessage() for r in caplog.records)
    assert p.read_text() == "{not json"
