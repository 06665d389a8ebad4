"""Time series for `ms_dynvm.report()`, recorded always and cheaply (bounded deques):

- `STEPS`: one entry per step the step switch timed (cost/step.py calls `step_end`): wall time at its
  end, its key (anchor and size classes), seconds, and whether it ran under the VM or bare (plain
  MindSpore eager).
- `SAMPLES`: snapshots of the runtime's counters (compiles, compile seconds, kernel cache hits and
  misses, ops seen, fused ops, fallbacks) and of the memory pool (reserved and live bytes), taken at
  step ends and at op-count flushes, at most one per `sample_every_s`; when `MAX_SAMPLES` are held,
  every other one is dropped and the interval doubles (a long run keeps its whole history, coarser).
- `COMPILES`: one entry per kernel build or load (codegen/kernel.py calls `compile_done`): its time,
  outcome, group (op names), signature and canonical IR text: the compile log that `python -m
  ms_dynvm replay` re-runs. With `DYNVM_COMPILE_LOG=<file>` each entry is also appended there as one
  JSON line.

Every entry point catches its own failures (counted in `errors`, one logging warning): the runtime
never fails because of them. Core layer: no MindSpore.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque

from ms_dynvm.observe import events

SAMPLE_EVERY_S = 0.02
MAX_SAMPLES = 4096
sample_every_s = SAMPLE_EVERY_S
STEPS: deque = deque(maxlen=50_000)
SAMPLES: list = []
COMPILES: deque = deque(maxlen=1_000)
errors = 0
T0 = time.time()  # wall time at import: series times are reported relative to it
_last_sample = 0.0
_lock = threading.Lock()


def _failed(where: str, e: BaseException) -> None:
    global errors
    errors += 1
    from ms_dynvm.observe import log

    log.warn_once(f"series:{where}", "ms_dynvm: recording %s for the report failed (%r); the script "
                  "goes on, the report may miss it", "report", where, e)


def key_label(key) -> str:
    """A short text for a step key `(anchor, size classes)`: size classes are bit lengths of element
    counts, shown as the power of two they start at."""
    try:
        anchor, classes = key
        if isinstance(classes, tuple) and classes and classes[0] == "many":
            sizes = f"{classes[1]} tensors, total ~2^{max(classes[2] - 1, 0)}"
        else:
            sizes = ", ".join(f"~2^{max(c - 1, 0)}" for c in classes) if classes else "no tensors"
        if isinstance(anchor, tuple):
            anchor = " ".join(map(str, anchor))
        return f"region {anchor} [{sizes}]"
    except Exception:  # noqa: BLE001
        return str(key)


def step_end(key, seconds: float, vm: bool) -> None:
    """A step of `key` took `seconds` under the VM (`vm`) or bare (cost/step.py, StepSwitch.record)."""
    try:
        t = time.time()
        STEPS.append((t, key, seconds, vm))
        if events.ON:
            us = int(seconds * 1e6)
            events.emit("step (ms_dynvm)" if vm else "step (bare eager)", "step", int(t * 1e6) - us, us,
                        key=key_label(key))
        sample(t)
        from ms_dynvm.observe import alarm

        alarm.on_step()
    except Exception as e:  # noqa: BLE001
        _failed("a step", e)


def on_flush() -> None:
    """After the runtime folded a batch of op counts (metrics.flush_ops)."""
    try:
        sample()
        from ms_dynvm.observe import alarm

        alarm.on_flush()
    except Exception as e:  # noqa: BLE001
        _failed("an op batch", e)


def counters() -> dict:
    """The runtime's counters the report plots over time (cheap: no flush, no copies)."""
    from ms_dynvm.metrics import METRICS as m

    d = {"compiles": m.compiles, "compile_seconds": m.compile_seconds, "cache_hits": m.cache_hits,
         "cache_misses": m.cache_misses, "disk_cache_hits": m.disk_cache_hits, "fused_ops": m.fused_ops,
         "ops_seen": m.ops_seen + m.pending_ops(), "fallbacks": sum(m.fallbacks.values()),
         "ops_opaque": sum(m.ops_opaque.values())}
    mod = sys.modules.get("ms_dynvm.runtime.memory_pool")
    pool = getattr(mod, "_default", None) if mod is not None else None
    if pool is not None:
        st = pool.stats()
        d["pool_reserved_bytes"] = st["reserved_bytes"]
        d["pool_live_bytes"] = st["live_bytes"]
    return d


def sample(t: float | None = None, force: bool = False) -> None:
    global _last_sample, sample_every_s
    t = time.time() if t is None else t
    if not force and t - _last_sample < sample_every_s:
        return
    _last_sample = t
    d = counters()
    d["t"] = t
    if len(SAMPLES) >= MAX_SAMPLES:
        SAMPLES[:] = SAMPLES[::2]
        sample_every_s *= 2
    SAMPLES.append(d)
    if events.ON and "pool_reserved_bytes" in d:
        events.counter("pool bytes", "pool", reserved=d["pool_reserved_bytes"], live=d["pool_live_bytes"])
        pool = sys.modules["ms_dynvm.runtime.memory_pool"]._default
        if "safe_point" not in pool.__dict__:  # a pool made after recording started: time its safe points too
            from ms_dynvm import metrics

            metrics._trace_pool(True)


def compile_done(fn, key: str, seconds: float, outcome: str, opts: dict, error: str = "") -> None:
    """A kernel for group `fn` was obtained (`outcome`: "built", "disk", "memory") or failed
    ("error") in `seconds` (codegen/kernel.py, compile_group)."""
    try:
        t = time.time()
        ops = [ins.op for ins in fn.body]
        sig = ", ".join(f"{fn.types[r].dtype}{list(fn.types[r].shape)}" for r in fn.params)
        entry = {"t": t, "seconds": seconds, "outcome": outcome, "key": key, "group": ops,
                 "signature": sig, "opts": opts, "ir": fn.as_text()}
        if error:
            entry["error"] = error
        COMPILES.append(entry)
        from ms_dynvm.observe import log

        log.get("compile").debug("%s %.1f ms: %s (%s)%s", outcome, 1e3 * seconds, " > ".join(ops), sig,
                                 f": {error}" if error else "")
        if events.ON:
            us = int(seconds * 1e6)
            events.emit(f"compile {'+'.join(ops[:6])}{'…' if len(ops) > 6 else ''}", "compile",
                        int(t * 1e6) - us, us, outcome=outcome, signature=sig, key=key[:16], ops=len(ops),
                        **({"error": error} if error else {}))
        path = os.environ.get("DYNVM_COMPILE_LOG")
        if path:
            with _lock, open(path, "a") as f:
                f.write(json.dumps(entry) + "\n")
    except Exception as e:  # noqa: BLE001
        _failed("a compile", e)


def clear() -> None:
    global _last_sample, sample_every_s
    STEPS.clear()
    SAMPLES.clear()
    COMPILES.clear()
    _last_sample = 0.0
    sample_every_s = SAMPLE_EVERY_S


def timed_build(cache, key: str, fn, opts: dict, get):
    """`get()` (the kernel cache's get_or_build for group `fn`), timed and logged in `COMPILES`
    with its outcome, read from the cache's counters (one compile thread: they move for this build
    only). Errors propagate, logged first."""
    try:
        before = cache.stats()
    except Exception:  # noqa: BLE001
        before = None
    t0 = time.perf_counter()
    try:
        lib = get()
    except BaseException as e:
        compile_done(fn, key, time.perf_counter() - t0, "error", opts, f"{type(e).__name__}: {e}"[:2000])
        raise
    dt = time.perf_counter() - t0
    outcome = "memory"
    try:
        after = cache.stats()
        if before is not None:
            if after.get("compiles", 0) > before.get("compiles", 0):
                outcome = "built"
            elif after.get("disk_hits", 0) > before.get("disk_hits", 0):
                outcome = "disk"
    except Exception:  # noqa: BLE001
        outcome = "unknown"
    compile_done(fn, key, dt, outcome, opts)
    return lib


def _install() -> None:
    from ms_dynvm import metrics

    metrics.on_flush = on_flush


_install()
