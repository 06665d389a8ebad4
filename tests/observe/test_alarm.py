"""The fallback alarm: one logging warning when over a window more than 10% of ops (or of fused-group
or region calls) fall back, naming the top ops and reasons and a report it wrote."""

import json
import logging

import pytest

from ms_dynvm.metrics import METRICS
from ms_dynvm.observe import alarm, series


def _window(ops=0, opaque=None, fallbacks=None, hits=0, region_calls=0, region_fallbacks=None, steps=None):
    """One window's worth of counts, as the runtime would make them, ended by step ends."""
    METRICS.op_names.extend(["AddExt"] * ops)
    for k, v in (opaque or {}).items():
        METRICS.ops_opaque[k] += v
    for k, v in (fallbacks or {}).items():
        METRICS.fallbacks[k] += v
    METRICS.cache_hits += hits
    METRICS.region_calls += region_calls
    for k, v in (region_fallbacks or {}).items():
        METRICS.region_fallbacks[k] += v
    for _ in range(steps or alarm.WINDOW_STEPS):
        series.step_end((1, (5,)), 0.01, True)


@pytest.fixture
def report_path(tmp_path, monkeypatch):
    p = tmp_path / "alarm_report.html"
    monkeypatch.setenv("DYNVM_REPORT", str(p))
    monkeypatch.setenv("DYNVM_ALARM", "1")
    return p


def test_fires_once_naming_top_ops_and_the_report(report_path, caplog):
    _window(ops=100)  # the first window only sets the baseline
    assert not alarm.fired
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        _window(ops=1000, opaque={"Unique": 90, "NonZero": 40, "Sort": 1})
        _window(ops=1000, opaque={"Unique": 500})  # a second bad window: no second warning
    warns = [r for r in caplog.records if r.name == "ms_dynvm.alarm"]
    assert len(warns) == 1
    msg = warns[0].getMessage()
    assert "13.1% of ops fell back (131 of 1000)" in msg
    assert msg.index("Unique (opaque") < msg.index("NonZero (opaque")
    assert str(report_path) in msg
    assert report_path.exists() and report_path.with_suffix(".json").exists()
    data = json.loads(report_path.with_suffix(".json").read_text())
    row = next(r for r in data["fallbacks"] if r["op"] == "Unique")
    assert row["count"] == 90 and row["of"] == "ops"


def test_below_threshold_stays_quiet(report_path, caplog):
    _window(ops=100)
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        _window(ops=1000, opaque={"Unique": 100})  # exactly 10%: not more than 10%
        _window(ops=1000, opaque={"Unique": 50}, fallbacks={"tier1: eager probe": 500}, hits=10)
    assert not alarm.fired
    assert not [r for r in caplog.records if r.name == "ms_dynvm.alarm"]
    assert not report_path.exists()


def test_group_fallbacks_count_against_group_calls(report_path, caplog):
    _window(ops=100)
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        # deliberate eager runs are not fallbacks; op_mismatch is
        _window(ops=5000, hits=80, fallbacks={"tier1: op_mismatch": 20, "tier1: eager probe": 300})
    assert alarm.fired
    msg = alarm.last_message
    assert "20.0% of fused-group calls fell back (20 of 100)" in msg and "tier1: op_mismatch x20" in msg
    assert "eager probe" not in msg


def test_region_fallbacks(report_path):
    _window(ops=100)
    _window(ops=1000, region_calls=40, region_fallbacks={"guard: shape changed": 12})
    assert alarm.fired and "30.0% of region calls fell back (12 of 40)" in alarm.last_message


def test_small_windows_are_not_judged_but_go_on(report_path):
    _window(ops=10)
    _window(ops=50, opaque={"Unique": 40})  # < MIN_OPS ops: not judged yet
    assert not alarm.fired
    _window(ops=50, opaque={"Unique": 5})
    assert not alarm.fired
    _window(ops=150)  # 250 ops since the baseline, 45 of them fell back
    assert alarm.fired and "18.0% of ops fell back (45 of 250)" in alarm.last_message


def test_off_by_env(report_path, monkeypatch):
    monkeypatch.setenv("DYNVM_ALARM", "0")
    _window(ops=100)
    _window(ops=1000, opaque={"Unique": 900})
    assert not alarm.fired


def test_windows_by_ops_without_steps(report_path, monkeypatch):
    """A script without timed steps (step switch off): windows of WINDOW_OPS ops, judged at the
    runtime's op-count flushes."""
    monkeypatch.setattr(alarm, "WINDOW_OPS", 1000)
    METRICS.op_names.extend(["AddExt"] * 10)
    METRICS.flush_ops()  # baseline
    METRICS.op_names.extend(["AddExt"] * 1200)
    METRICS.ops_opaque["Unique"] += 300
    METRICS.flush_ops()
    assert alarm.fired and "over the last 1200 ops" in alarm.last_message


def test_fires_in_a_real_training_loop(report_path, caplog, monkeypatch):
    """A real loop whose every step sorts its batch and takes its top values (Sort, TopK: opaque ops)
    along with the recorded ops of a Dense layer and SGD: more than 10% of the ops seen fall back, and
    the alarm names them. (Step switch off: every step runs under ms_dynvm; windows of 1000 ops.)"""
    ms = pytest.importorskip("mindspore")
    import time

    import numpy as np
    from mindspore import nn, ops

    import ms_dynvm

    monkeypatch.setattr(alarm, "WINDOW_OPS", 1000)
    net = nn.Dense(8, 4)
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-2)

    def loss_fn(x):
        x, _ = ops.sort(x, axis=-1)
        top, _ = ops.topk(x, 4)
        return net(x).square().mean() + top.mean()

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    rng = np.random.default_rng(0)
    deadline = time.monotonic() + 20
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"), ms_dynvm.enabled(step_switch=False):
        while not alarm.fired and time.monotonic() < deadline:
            _, grads = grad_fn(ms.Tensor(rng.standard_normal((4, 8)).astype(np.float32)))
            opt(grads)
    st = ms_dynvm.stats()
    opaque = st["ops_opaque"].get("Sort", 0) + st["ops_opaque"].get("TopK", 0)
    assert opaque > 0.1 * st["ops_seen"], st["ops_opaque"]
    assert alarm.fired
    warns = [r.getMessage() for r in caplog.records if r.name == "ms_dynvm.alarm"]
    assert len(warns) == 1, warns
    assert "Sort (opaque" in warns[0] and "TopK (opaque" in warns[0] and str(report_path) in warns[0]
    assert report_path.exists()
