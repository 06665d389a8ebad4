"""Fallback alarm: when, over a window of steps, more than `THRESHOLD` (10%) of the ops ms_dynvm saw
fell back (or of the fused-group or region calls), one logging warning (`ms_dynvm.alarm`) names the
top ops and reasons and the path of a report written for it.

What falls back:
- ops: ops the VM recorded as opaque calls (no VM semantics for them: they split blocks and are never
  fused) and ops whose recording failed (`record_errors`), out of all ops dispatched to ms_dynvm;
- fused groups: tier 1's fallbacks (a launched group abandoned, a compile that failed, an unsupported
  group), out of its launches, guard failures and fallbacks; its deliberate choices (a group run
  eagerly because that measured faster, or to measure it) are not fallbacks;
- regions: `region_fallbacks` out of `region_calls` (whole regions run by ms_dynvm).

A window ends after `WINDOW_STEPS` steps (cost/step.py's steps), or, in a script without timed steps,
after `WINDOW_OPS` ops (judged where the runtime folds its op counts, every ~4096 ops), and once it
holds at least `MIN_OPS` ops or `MIN_CALLS` group or region calls (steps that ran bare, as plain
MindSpore, show ms_dynvm no ops: the window goes on until it has seen enough). One warning per process. `DYNVM_ALARM=0` turns the alarm off;
`DYNVM_ALARM_THRESHOLD`, `DYNVM_ALARM_WINDOW` (steps) override the numbers; the report goes to
`DYNVM_REPORT` (a path ending in .html; default: ms_dynvm-<pid>/report.html in the temp directory).
"""

from __future__ import annotations

import os
import tempfile

from ms_dynvm.observe import log

THRESHOLD = 0.10
WINDOW_STEPS = 20
WINDOW_OPS = 20_000
MIN_OPS = 200
MIN_CALLS = 20
DELIBERATE = ("tier1: eager probe", "tier1: eager (faster for this size)")

fired = False
last_message = ""
_base: dict | None = None
_steps = 0
_busy = False


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def enabled() -> bool:
    return os.environ.get("DYNVM_ALARM", "1").strip().lower() not in ("0", "false", "no", "off")


def report_path() -> str:
    p = os.environ.get("DYNVM_REPORT")
    if p:
        return os.path.abspath(p)
    return os.path.join(tempfile.gettempdir(), f"ms_dynvm-{os.getpid()}", "report.html")


def _counts() -> dict:
    from ms_dynvm.metrics import METRICS as m

    fb = {k: v for k, v in m.fallbacks.items() if k not in DELIBERATE}
    return {
        "ops": m.ops_seen + m.pending_ops(),
        "opaque": dict(m.ops_opaque),
        "record_errors": dict(m.record_errors),
        "group_fallbacks": fb,
        "group_calls": m.cache_hits + sum(m.guard_failures.values()) + sum(fb.values()),
        "region_calls": m.region_calls,
        "region_fallbacks": dict(m.region_fallbacks),
    }


def _delta(new: dict, old: dict) -> dict:
    return {k: v - old.get(k, 0) for k, v in new.items() if v - old.get(k, 0) > 0}


def reset() -> None:
    """Start a new window; forget that the alarm fired (tests)."""
    global fired, _base, _steps, last_message
    fired = False
    _base = None
    _steps = 0
    last_message = ""
    log.forget("fallback-alarm")


def on_step() -> None:
    global _steps
    if fired:
        return
    _steps += 1
    if _steps >= int(_env_float("DYNVM_ALARM_WINDOW", WINDOW_STEPS)):
        check()


def on_flush() -> None:
    if fired or _steps:  # (with timed steps, windows are counted in steps)
        return
    from ms_dynvm.metrics import METRICS

    if _base is None or METRICS.ops_seen - _base["ops"] >= WINDOW_OPS:
        check()


def check() -> str | None:
    """Judge the window that ends now and start the next; the warning's text when it fired."""
    global _base, _steps, fired, last_message, _busy
    if fired or _busy or not enabled():
        return None
    _busy = True
    try:
        new = _counts()
        old, steps = _base, _steps
        if old is None:
            _base, _steps = new, 0
            return None
        ops = new["ops"] - old["ops"]
        if (ops < MIN_OPS and new["group_calls"] - old["group_calls"] < MIN_CALLS
                and new["region_calls"] - old["region_calls"] < MIN_CALLS) and ops >= 0:
            return None  # too little seen yet (steps run bare, say): the window goes on
        _base, _steps = new, 0
        opaque = _delta(new["opaque"], old["opaque"])
        errs = _delta(new["record_errors"], old["record_errors"])
        fb = _delta(new["group_fallbacks"], old["group_fallbacks"])
        calls = new["group_calls"] - old["group_calls"]
        rcalls = new["region_calls"] - old["region_calls"]
        rfb = _delta(new["region_fallbacks"], old["region_fallbacks"])
        threshold = _env_float("DYNVM_ALARM_THRESHOLD", THRESHOLD)
        parts = []
        n_op = sum(opaque.values()) + sum(errs.values())
        if ops >= MIN_OPS and n_op > threshold * ops:
            top = sorted([(v, f"{k} (opaque: no VM semantics)") for k, v in opaque.items()]
                         + [(v, f"{k} (recording failed)") for k, v in errs.items()], reverse=True)[:5]
            parts.append(f"{100 * n_op / ops:.1f}% of ops fell back ({n_op} of {ops}); top: "
                         + ", ".join(f"{what} x{v}" for v, what in top))
        n_fb = sum(fb.values())
        if calls >= MIN_CALLS and n_fb > threshold * calls:
            top = sorted(((v, k) for k, v in fb.items()), reverse=True)[:5]
            parts.append(f"{100 * n_fb / calls:.1f}% of fused-group calls fell back ({n_fb} of {calls}); "
                         "reasons: " + ", ".join(f"{k} x{v}" for v, k in top))
        n_rfb = sum(rfb.values())
        if rcalls >= MIN_CALLS and n_rfb > threshold * rcalls:
            top = sorted(((v, k) for k, v in rfb.items()), reverse=True)[:5]
            parts.append(f"{100 * n_rfb / rcalls:.1f}% of region calls fell back ({n_rfb} of {rcalls}); "
                         "reasons: " + ", ".join(f"{k} x{v}" for v, k in top))
        if not parts:
            return None
        fired = True
        path = report_path()
        try:
            from ms_dynvm.observe import report

            written = report.write(path)
            where = f"report: {written['html']}"
        except Exception as e:  # noqa: BLE001 - the alarm still warns without its report
            where = f"the report could not be written to {path} ({e!r}); call ms_dynvm.report(path)"
        window = f"the last {steps} steps" if steps else f"the last {ops} ops"
        msg = (f"ms_dynvm: fallback alarm over {window}: " + "; ".join(parts)
               + f" (threshold {100 * threshold:.0f}%). Fallen-back work runs as plain MindSpore eager; {where}")
        last_message = msg
        log.warn_once("fallback-alarm", "%s", "alarm", msg)
        return msg
    finally:
        _busy = False
