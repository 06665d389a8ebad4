"""A cheap event recorder for ms_dynvm's own timeline: recording, compiles, fused-kernel runs,
fallbacks and guard failures with their reasons, step-switch decisions, pool safe points.

Events are kept in a bounded ring (`CAPACITY`, oldest dropped first) as tuples
`(name, category, ts_us, dur_us, thread id, args)` on the clock MindSpore's profiler writes in
`trace_view.json`: wall-clock microseconds since the epoch, `time.time_ns() // 1000`. Recording is
off unless asked for: by a running `mindspore.profiler.profile` (observe/profiler.py starts and
stops it) or by `DYNVM_PROFILE=1` (on from import; the trace is written at exit, see
`write_trace`). While it is off, `emit` returns at its first test and the runtime's counters run
their untraced code (`Metrics.set_tracing`): nothing else is paid.

Emitting: `emit(name, cat, t0_us, dur_us, **args)` (a span; `dur_us=None`: an instant), `instant`,
`counter` (a counter track: values over time), `span(name, cat, **args)` (a context manager). Callers
on a hot path test `events.ON` first, so that they build no arguments while it is off.
Core layer: no MindSpore.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections import deque

CAPACITY = 200_000
ON = False  # read by callers before building an event's arguments
_RING: deque = deque(maxlen=CAPACITY)
_SOURCES: set = set()  # who asked for recording: "env", "profiler", "api"
_LOCK = threading.Lock()
emitted = 0  # events emitted since import (more than the ring holds once it has wrapped)

# Tracks (one Chrome-trace thread each) in the order they are shown.
TRACKS = ("step", "recording", "kernel", "compile", "fallback", "guard", "region", "pool", "sync", "other")


def now_us() -> int:
    return time.time_ns() // 1000


def emit(name: str, cat: str, t0: int | None = None, dur: int | None = 0, **args) -> None:
    """A span of `dur` µs from `t0` (µs since the epoch; None: now), or an instant (`dur=None`)."""
    global emitted
    if not ON:
        return
    _RING.append((name, cat, now_us() if t0 is None else int(t0), dur, threading.get_ident(), args or None))
    emitted += 1


def instant(name: str, cat: str, **args) -> None:
    emit(name, cat, None, None, **args)


def counter(name: str, cat: str, **values) -> None:
    """A sample of a counter track (Chrome trace phase "C"): `values` are numbers."""
    global emitted
    if not ON:
        return
    _RING.append((name, cat, now_us(), "C", threading.get_ident(), values))
    emitted += 1


@contextlib.contextmanager
def span(name: str, cat: str, **args):
    """`with span("compile", "compile", group=...):` records the block's wall time (also when it
    raises)."""
    if not ON:
        yield
        return
    t0 = now_us()
    try:
        yield
    finally:
        emit(name, cat, t0, now_us() - t0, **args)


# --- on / off -------------------------------------------------------------------------------------
def start(source: str = "api") -> None:
    """Start recording for `source` (recording stays on while any source wants it)."""
    global ON
    with _LOCK:
        _SOURCES.add(source)
        was, ON = ON, True
    if not was:
        _set_tracing(True)


def stop(source: str = "api") -> None:
    global ON
    with _LOCK:
        _SOURCES.discard(source)
        was = ON
        ON = bool(_SOURCES)
    if was and not ON:
        _set_tracing(False)


def is_on() -> bool:
    return ON


def clear() -> None:
    _RING.clear()


def _set_tracing(on: bool) -> None:
    """Switch the runtime's counters to their event-emitting variants (`Metrics.set_tracing`)."""
    try:
        from ms_dynvm.metrics import METRICS

        METRICS.set_tracing(on)
    except Exception as e:  # noqa: BLE001 - observability never breaks the script
        from ms_dynvm.observe import log

        log.warn_once("events-tracing", "ms_dynvm: could not switch event tracing %s: %r", "events",
                      "on" if on else "off", e)


# --- reading ----------------------------------------------------------------------------------------
def snapshot(t_from: float | None = None, t_to: float | None = None) -> list:
    """The recorded events (oldest first) whose start lies in [t_from, t_to] (µs; None: open)."""
    evs = list(_RING)
    if t_from is not None:
        evs = [e for e in evs if e[2] >= t_from]
    if t_to is not None:
        evs = [e for e in evs if e[2] <= t_to]
    return evs


def chrome_events(events: list, pid: int, process_name: str = "ms_dynvm") -> list:
    """Chrome-trace dicts for `events`: metadata naming the process and one thread (track) per
    category, then the events in time order ("X" spans, "i" instants, "C" counters)."""
    cats = sorted({e[1] for e in events}, key=lambda c: (TRACKS.index(c) if c in TRACKS else len(TRACKS), c))
    tids = {c: i + 1 for i, c in enumerate(cats)}
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process_name}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for c, tid in tids.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": c}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for name, cat, ts, dur, _thread, args in sorted(events, key=lambda e: e[2]):
        ev = {"name": name, "cat": f"ms_dynvm.{cat}", "pid": pid, "tid": tids[cat], "ts": ts}
        if dur == "C":
            ev["ph"] = "C"
            ev["args"] = args or {}
        elif dur is None:
            ev["ph"] = "i"
            ev["s"] = "t"
            if args:
                ev["args"] = _jsonable(args)
        else:
            ev["ph"] = "X"
            ev["dur"] = max(int(dur), 0)
            if args:
                ev["args"] = _jsonable(args)
        out.append(ev)
    return out


def _jsonable(args: dict) -> dict:
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in args.items()}


def write_trace(path: str, events: list | None = None) -> str:
    """Write the recorded events (or `events`) as a Chrome trace JSON file (open it in Perfetto or
    chrome://tracing); returns the path."""
    evs = snapshot() if events is None else events
    doc = chrome_events(evs, os.getpid())
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    return path


def _env_on() -> bool:
    return os.environ.get("DYNVM_PROFILE", "").strip().lower() in ("1", "true", "yes", "on")


def _write_at_exit() -> None:
    try:
        d = os.environ.get("DYNVM_PROFILE_DIR") or "ms_dynvm_profile"
        path = write_trace(os.path.join(d, f"ms_dynvm_trace_{os.getpid()}.json"))
        from ms_dynvm.observe import log

        log.get("profiler").warning("ms_dynvm: DYNVM_PROFILE trace written to %s", os.path.abspath(path))
    except Exception as e:  # noqa: BLE001
        from ms_dynvm.observe import log

        log.warn_once("profile-exit", "ms_dynvm: could not write the DYNVM_PROFILE trace: %r", "profiler", e)


if _env_on():
    start("env")
    atexit.register(_write_at_exit)
