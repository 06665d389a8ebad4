"""Cost model v1: when does compiling a group pay?

Per group key the executor keeps a `GroupStats` (calls seen, measured eager seconds). A group is
promoted when its counter has passed `threshold` (default 2) AND

    predicted saving per call x expected future calls > estimated compile cost

with
- predicted saving per call = eager time per call - predicted fused time, where the fused time is
  one memory pass (eager time / number of ops, since every eager op is one pass over similar data) plus
  the per-op cost of serving a precomputed result inside dispatch (`serve_cost_s`, measured);
- expected future calls = calls seen so far (a group seen n times is expected to run about n more:
  the usual "Lindy" estimate of a JIT that knows nothing else);
- compile cost = running mean of measured compile times (initially `initial_compile_s`); a warm disk
  cache makes it cheap, and the executor passes `cached=True` then. A background compile
  (`compile_async`, the default) does not stop the script: it costs the script only the CPU time
  gcc takes from it on a shared core, counted as `BACKGROUND_SHARE` (0.1, a chosen estimate, not a
  measurement) of the compile time. Serving a group that turns out slower for a size is undone by
  the size switch below, so promoting earlier risks compile time, not slower calls.

A group whose compile failed is never promoted again (the failure is counted as a fallback).

After compiling, measurement decides (`SizeSwitch`): per size class of the group's first input
(the bit length of its element count, so roughly per batch size), the executor keeps the wall time
of recent served calls and of recent eager calls (probe calls run eagerly on purpose, and not
recorded, so they measure MindSpore's own time; when no op ran eagerly just before, in pairs of
which the second is measured (MindSpore's worker threads sleep after ~0.25 s without eager ops, and
the first op pays for waking them): every other call (pair) of a class until it has `MIN_SAMPLES`
samples, then one in `PROBE_EVERY` = 32 calls), and serves the class only while its median
served time is not above its median eager time (with 5% hysteresis). A class switched off still
serves one call in `PROBE_EVERY`, so it switches back on when serving becomes cheaper (a warmer
cache, other sizes); its other calls run eagerly, unrecorded.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


BACKGROUND_SHARE = 0.1  # share of a background compile's time charged to the script (see the doc)


@dataclass
class GroupStats:
    calls: int = 0
    eager_seconds: float = 0.0  # summed over recorded (eager) calls
    eager_calls: int = 0
    served: int = 0
    failed: bool = False
    compiled: bool = False

    def eager_per_call(self) -> float:
        return self.eager_seconds / self.eager_calls if self.eager_calls else 0.0


@dataclass
class CostModel:
    threshold: int = 2
    initial_compile_s: float = 0.3
    serve_cost_s: float = 8e-6
    _compile_total: float = 0.0
    _compiles: int = 0

    def compile_cost(self, cached: bool = False) -> float:
        if cached:
            return 0.002
        if not self._compiles:
            return self.initial_compile_s
        return self._compile_total / self._compiles

    def record_compile(self, seconds: float) -> None:
        self._compile_total += seconds
        self._compiles += 1

    def predicted_saving(self, stats: GroupStats, n_ops: int) -> float:
        eager = stats.eager_per_call()
        fused = eager / max(n_ops, 1) + n_ops * self.serve_cost_s
        return max(eager - fused, 0.0)

    def should_compile(self, stats: GroupStats, n_ops: int, cached: bool = False,
                       background: bool = False) -> bool:
        if stats.failed or stats.compiled or stats.calls < self.threshold or n_ops < 2:
            return False
        future = stats.calls
        cost = self.compile_cost(cached) * (BACKGROUND_SHARE if background else 1.0)
        return self.predicted_saving(stats, n_ops) * future > cost


class _SizeClass:
    __slots__ = ("eager", "served", "on", "n", "second", "discard")

    def __init__(self, window: int) -> None:
        self.eager: deque = deque(maxlen=window)
        self.served: deque = deque(maxlen=window)
        self.on = True
        self.n = 0
        self.second = False  # the next call is the second (measured) half of a probe pair
        self.discard = False  # the next eager sample is the first (dropped) half


class SizeSwitch:
    """Serve or run eagerly, per size class, by measured time (see the module docstring)."""

    PROBE_EVERY = 32
    MIN_SAMPLES = 3
    WINDOW = 9
    HYSTERESIS = 0.05

    def __init__(self) -> None:
        self.classes: dict = {}

    @staticmethod
    def size_class(numel: int) -> int:
        return int(numel).bit_length()

    def _get(self, cls: int) -> _SizeClass:
        c = self.classes.get(cls)
        if c is None:
            c = self.classes[cls] = _SizeClass(self.WINDOW)
        return c

    def should_serve(self, cls: int, warm: bool = False) -> bool:
        """Decide for one call of size class `cls`. `warm`: an eager op ran very recently, so
        MindSpore's worker threads are awake and a single probe measures eager time fairly."""
        c = self._get(cls)
        c.n += 1
        if c.second:
            c.second = False
            return False
        probe = c.n % self.PROBE_EVERY == 0
        if not c.on:
            return probe
        if len(c.eager) < self.MIN_SAMPLES:
            probe = probe or c.n % 2 == 0  # too few eager measurements of this class: probe sooner
        if probe and not warm:
            # Probes come in pairs and only the second is measured: while a class is served (and
            # no other op runs eagerly), MindSpore's worker threads fall asleep, and the first
            # eager op after that pays for waking them, which a script that runs the group eagerly
            # all along does not.
            c.second = c.discard = True
        return not probe

    def record(self, cls: int, seconds: float, served: bool) -> None:
        c = self._get(cls)
        if not served and c.discard:
            c.discard = False
            return
        (c.served if served else c.eager).append(seconds)
        if len(c.eager) >= self.MIN_SAMPLES and len(c.served) >= self.MIN_SAMPLES:
            s, e = statistics.median(c.served), statistics.median(c.eager)
            if c.on and s > e * (1 + self.HYSTERESIS):
                c.on = False
            elif not c.on and s < e * (1 - self.HYSTERESIS):
                c.on = True

    def is_on(self, cls: int) -> bool:
        c = self.classes.get(cls)
        return c is None or c.on
