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
  cache makes it cheap, and the executor passes `cached=True` then.

A group whose compile failed is never promoted again (the failure is counted as a fallback).
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def should_compile(self, stats: GroupStats, n_ops: int, cached: bool = False) -> bool:
        if stats.failed or stats.compiled or stats.calls < self.threshold or n_ops < 2:
            return False
        future = stats.calls
        return self.predicted_saving(stats, n_ops) * future > self.compile_cost(cached)
