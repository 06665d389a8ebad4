"""MindSpore Profiler integration: ms_dynvm's events as extra tracks of MindSpore's timeline.

`install()` (called by `ms_dynvm.enable()`) wraps three class methods of MindSpore's
`ProfilerInterface`, the object every `mindspore.profiler.profile` (and the older `Profiler`) drives:
- `start`: ms_dynvm's event recording starts (`events.start("profiler")`), and the window opens;
- `stop`: recording stops; the events of the window [start, stop] are kept for the merge;
- `analyse` (run by `tensorboard_trace_handler` when the trace is ready, or by the script): after
  MindSpore has written `<output>/ASCEND_PROFILER_OUTPUT/trace_view.json`, the kept events are merged
  into it (`merge_into`): a process "ms_dynvm" (its own pid, one track per category: steps, recording,
  fused kernels, compiles, fallbacks, guards, regions, pool), on MindSpore's clock (both are wall-clock
  microseconds since the epoch), the file's timed events sorted by time. With `async_mode=True` the
  file appears later: a daemon thread waits for it (up to `ASYNC_WAIT_S`).
A profiler already running when `install()` runs starts the window there (its controller holds the
unwrapped `stop`: the window then closes at `analyse`). MindSpore is imported only
inside these functions (this module is a core layer's). Failures are logged once and never reach
the script.
"""

from __future__ import annotations

import json
import os
import threading
import time

from ms_dynvm.observe import events, log


def _ms(module: str):
    """A MindSpore module, imported when first needed (this module imports without MindSpore)."""
    import importlib

    return importlib.import_module(module)

ASYNC_WAIT_S = 120.0
PROCESS_NAME = "ms_dynvm"

_installed = False
_window_start: int | None = None
_pending: list = []  # events of finished windows not merged yet
merged: list = []  # (path, number of ms_dynvm events) of every merge done (tests, report)


def _fail(where: str, e: BaseException) -> None:
    log.warn_once(f"profiler:{where}", "ms_dynvm: profiler integration failed in %s (%r); MindSpore's "
                  "profile is unaffected, ms_dynvm's events are missing from it", "profiler", where, e)


def install() -> bool:
    """Hook MindSpore's profiler (idempotent). False when MindSpore's profiler is not importable."""
    global _installed
    if _installed:
        return True
    try:
        PI = _ms("mindspore.profiler.profiler_interface").ProfilerInterface
    except Exception as e:  # noqa: BLE001
        _fail("install", e)
        return False
    orig_start = PI.__dict__["start"].__func__
    orig_stop = PI.__dict__["stop"].__func__
    orig_analyse = PI.__dict__["analyse"].__func__

    def start(cls):
        orig_start(cls)
        try:
            _on_start()
        except Exception as e:  # noqa: BLE001
            _fail("start", e)

    def stop(cls):
        try:
            _on_stop()
        except Exception as e:  # noqa: BLE001
            _fail("stop", e)
        orig_stop(cls)

    def analyse(cls, **kwargs):
        path = None
        try:
            # A profile whose controller was made before install() calls the unwrapped stop: its
            # window closes here.
            _on_stop()
            path = trace_path()
        except Exception as e:  # noqa: BLE001
            _fail("analyse", e)
        orig_analyse(cls, **kwargs)
        try:
            _on_analysed(path, bool(kwargs.get("async_mode")))
        except Exception as e:  # noqa: BLE001
            _fail("analyse", e)

    for name, fn, orig in (("start", start, orig_start), ("stop", stop, orig_stop), ("analyse", analyse, orig_analyse)):
        fn.__wrapped__ = orig
        fn.__name__ = name
        setattr(PI, name, classmethod(fn))
    _installed = True
    if PI.is_initialized and PI.platform_profilers_set:  # a profile already running
        _on_start()
    return True


def uninstall() -> None:
    """Undo `install` (tests)."""
    global _installed
    if not _installed:
        return
    PI = _ms("mindspore.profiler.profiler_interface").ProfilerInterface
    for name in ("start", "stop", "analyse"):
        fn = PI.__dict__[name].__func__
        setattr(PI, name, classmethod(getattr(fn, "__wrapped__", fn)))
    _installed = False
    if _window_start is not None:
        _on_stop()


def trace_path() -> str:
    """Where MindSpore writes this run's trace_view.json."""
    ctx = _ms("mindspore.profiler.common.profiler_context").ProfilerContext()
    return os.path.join(ctx.ascend_profiler_output_path, "trace_view.json")


def _on_start() -> None:
    global _window_start
    if _window_start is None:
        _window_start = events.now_us()
        events.start("profiler")


def _on_stop() -> None:
    global _window_start
    if _window_start is None:
        return
    t0, _window_start = _window_start, None
    t1 = events.now_us()
    events.stop("profiler")
    _pending.extend(events.snapshot(t0, t1))


def _on_analysed(path: str | None, async_mode: bool) -> None:
    global _pending
    evs, _pending = _pending, []
    if path is None:
        return
    if os.path.exists(path) and not async_mode:
        merge_into(path, evs)
        return
    threading.Thread(target=_wait_and_merge, args=(path, evs), daemon=True, name="dvm-profile-merge").start()


def _wait_and_merge(path: str, evs: list) -> None:
    deadline = time.monotonic() + ASYNC_WAIT_S
    last = None
    while time.monotonic() < deadline:
        try:
            st = os.stat(path)
            sig = (st.st_size, st.st_mtime_ns)
            if sig == last:
                with open(path) as f:
                    json.load(f)
                merge_into(path, evs)
                return
            last = sig
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    _fail("analyse", TimeoutError(f"{path} did not appear within {ASYNC_WAIT_S:.0f} s"))


def merge_into(path: str, evs: list) -> int:
    """Add `evs` (events.snapshot() tuples) to the Chrome trace at `path` as the process "ms_dynvm"
    (a pid the file does not use) and write it back (atomically) with its timed events sorted by
    time, metadata first. Returns the number of ms_dynvm events added."""
    with open(path) as f:
        doc = json.load(f)
    trace = doc["traceEvents"] if isinstance(doc, dict) else doc
    pids = [e.get("pid") for e in trace if isinstance(e.get("pid"), int)]
    pid = max(pids, default=0) + 1
    ours = events.chrome_events(evs, pid, PROCESS_NAME)
    meta = [e for e in trace if e.get("ph") == "M"] + [e for e in ours if e["ph"] == "M"]
    timed = [e for e in trace if e.get("ph") != "M"] + [e for e in ours if e["ph"] != "M"]
    timed.sort(key=lambda e: float(e.get("ts", 0)))
    merged_list = meta + timed
    if isinstance(doc, dict):
        doc["traceEvents"] = merged_list
    else:
        doc = merged_list
    tmp = path + ".dvm-tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    n = sum(1 for e in ours if e["ph"] != "M")
    merged.append((path, n))
    log.get("profiler").info("merged %d ms_dynvm events into %s", n, path)
    return n
