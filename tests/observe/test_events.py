"""The event recorder, the tracing variants of METRICS, DYNVM_PROFILE=1, logging."""

import json
import logging
import os
import subprocess
import sys
import warnings
from collections import Counter

import pytest

from ms_dynvm import metrics, warn
from ms_dynvm.metrics import METRICS
from ms_dynvm.observe import events, log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_off_records_nothing_and_keeps_plain_classes():
    events.emit("x", "other", None, 5)
    events.instant("y", "other")
    METRICS.fallbacks["tier1: op_mismatch"] += 1
    assert events.snapshot() == []
    assert type(METRICS) is metrics.Metrics
    assert type(METRICS.fallbacks) is Counter


def test_tracing_emits_from_counter_updates_and_switches_back():
    events.start("test")
    try:
        assert type(METRICS) is not metrics.Metrics
        METRICS.fallbacks["tier1: op_mismatch"] += 2
        METRICS.guard_failures["no_kernel_for_signature"] += 1
        METRICS.step_calls["vm"] += 1
        METRICS.cache_hits += 1
        METRICS.fused_ops += 4
        with events.span("compile g", "compile", group="a>b"):
            pass
    finally:
        events.stop("test")
    assert type(METRICS) is metrics.Metrics and type(METRICS.fallbacks) is Counter
    evs = events.snapshot()
    names = [e[0] for e in evs]
    assert "fallback: tier1: op_mismatch" in names
    assert "guard failed: no_kernel_for_signature" in names
    assert "step: vm" in names
    assert "compile g" in names
    served = [e for e in evs if e[0] == "fused group served"]
    assert len(served) == 1 and served[0][5] == {"ops": 4} and served[0][3] >= 0
    fb = next(e for e in evs if e[0] == "fallback: tier1: op_mismatch")
    assert fb[5] == {"count": 2} and fb[3] is None  # an instant (a count of 1 carries no args)
    # the counters still count
    st = METRICS.snapshot()
    assert st["fallbacks"] == {"tier1: op_mismatch": 2} and st["cache_hits"] == 1 and st["fused_ops"] == 4
    # events are on the profiler's clock: wall-clock microseconds
    import time

    assert abs(evs[-1][2] - time.time() * 1e6) < 60e6


def test_reset_while_tracing_keeps_tracing():
    events.start("test")
    try:
        METRICS.reset()
        METRICS.fallbacks["tier1: x"] += 1
        assert any(e[0] == "fallback: tier1: x" for e in events.snapshot())
    finally:
        events.stop("test")


def test_sources_are_counted():
    events.start("a")
    events.start("b")
    events.stop("a")
    assert events.ON
    events.stop("b")
    assert not events.ON


def test_chrome_events_have_own_process_and_tracks():
    events.start("test")
    events.emit("s", "step", 1000, 50, key="k")
    events.instant("i", "fallback")
    events.counter("pool bytes", "pool", reserved=10, live=5)
    events.stop("test")
    doc = events.chrome_events(events.snapshot(), pid=77)
    meta = [e for e in doc if e["ph"] == "M"]
    assert {"ph": "M", "name": "process_name", "pid": 77, "tid": 0, "args": {"name": "ms_dynvm"}} in meta
    tracks = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert tracks == {"step", "fallback", "pool"}
    timed = [e for e in doc if e["ph"] != "M"]
    assert [e["ph"] for e in timed] == ["X", "i", "C"]  # sorted by ts (1000 is the oldest)
    assert timed[0]["dur"] == 50 and timed[2]["args"] == {"reserved": 10, "live": 5}


def test_ring_is_bounded(monkeypatch):
    from collections import deque

    monkeypatch.setattr(events, "_RING", deque(maxlen=10))
    events.start("test")
    for i in range(25):
        events.instant(f"e{i}", "other")
    events.stop("test")
    assert [e[0] for e in events.snapshot()] == [f"e{i}" for i in range(15, 25)]


def test_dynvm_profile_env_writes_a_trace_at_exit(tmp_path):
    code = ("import ms_dynvm\nfrom ms_dynvm.metrics import METRICS\n"
            "METRICS.fallbacks['tier1: op_mismatch'] += 1\nMETRICS.cache_hits += 1\nMETRICS.fused_ops += 3\n")
    env = dict(os.environ, DYNVM_PROFILE="1", DYNVM_PROFILE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    files = list(tmp_path.glob("ms_dynvm_trace_*.json"))
    assert len(files) == 1, r.stderr
    assert str(files[0]) in r.stderr  # the path is logged
    doc = json.loads(files[0].read_text())
    names = {e["name"] for e in doc if e["ph"] != "M"}
    assert {"fallback: tier1: op_mismatch", "fused group served"} <= names


def test_log_levels_and_warn_once(caplog):
    root = log.configure("debug")
    assert root.level == logging.DEBUG
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        assert log.warn_once("k1", "first %s", "alarm", "x")
        assert not log.warn_once("k1", "second %s", "alarm", "y")
        assert log.warn_once("k2", "other", "alarm")
    msgs = [(r.name, r.getMessage()) for r in caplog.records]
    assert msgs == [("ms_dynvm.alarm", "first x"), ("ms_dynvm.alarm", "other")]
    log.configure("warning")
    assert root.level == logging.WARNING


def test_unknown_log_level_is_ignored(capsys):
    root = log.configure("warning")
    log.configure("loud")
    assert root.level == logging.WARNING
    assert "DYNVM_LOG='loud'" in capsys.readouterr().err


def test_warn_once_warns_and_logs(caplog):
    key = "test-warn-once-key"
    with caplog.at_level(logging.DEBUG, logger="ms_dynvm"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert warn.warn_once(key, "something is missing")
        assert not warn.warn_once(key, "something is missing")
    assert [str(x.message) for x in w] == ["something is missing"]
    assert [r.name for r in caplog.records if "something is missing" in r.getMessage()] == ["ms_dynvm.warn"]
    warn._WARNED.discard(key)


def test_failures_are_counted_and_warned_once(monkeypatch, caplog):
    """A failure inside observability never reaches the runtime: counted, one logging warning."""
    from ms_dynvm.observe import series

    def boom(*a, **k):
        raise RuntimeError("broken sampler")

    monkeypatch.setattr(series, "counters", boom)
    before = series.errors
    with caplog.at_level(logging.WARNING, logger="ms_dynvm"):
        for _ in range(3):
            series.step_end((1, (3,)), 0.01, True)  # (what cost/step.py calls)
            series._last_sample = 0.0
    assert series.errors == before + 3
    warns = [r for r in caplog.records if "broken sampler" in r.getMessage()]
    assert len(warns) == 1 and warns[0].name == "ms_dynvm.report"



def test_samples_thin_out_instead_of_dropping_history(monkeypatch):
    from ms_dynvm.observe import series

    monkeypatch.setattr(series, "MAX_SAMPLES", 8)
    for i in range(20):
        series.sample(t=1000.0 + i, force=True)
    ts = [s["t"] for s in series.SAMPLES]
    assert len(ts) <= 8 and ts[0] == 1000.0 and ts[-1] == 1019.0 and ts == sorted(ts)
    assert series.sample_every_s > series.SAMPLE_EVERY_S
