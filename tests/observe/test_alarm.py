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


def test_small_windows_are_not_judged(report_path):
    _window(ops=10)
    _window(ops=50, opaque={"Unique": 40})  # < MIN_OPS ops
    assert not alarm.fired


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
