"""Process-wide counters behind `ms_dynvm.stats()`.

Every layer counts into the one `METRICS` object; `snapshot()` turns it into the plain dict that
`stats()` returns. Counters are plain ints and `collections.Counter`s updated from the thread that
runs the dispatch hook (the hook is per thread), so no lock is taken on the hot path.

Tracing (`set_tracing`, turned on by `ms_dynvm.observe.events` while a profiler or `DYNVM_PROFILE`
asks for a timeline): METRICS and its reason counters change class to variants whose updates also
emit timeline events (a fallback with its reason, a guard failure, a step's way, a served fused
group, a closed block). Off, the plain classes run: tracing costs nothing until it is asked for.
"""

from __future__ import annotations

from collections import Counter

try:  # the C helper behind Counter.update(iterable), without its isinstance(Mapping) check
    from collections import _count_elements
except ImportError:  # pragma: no cover
    def _count_elements(counter, names):
        counter.update(names)


class Metrics:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # Ops not yet counted (the recorder's hot path appends to a list: cheaper than updating
        # counters): `op_names`, the name of every op seen in the current phase (one list per
        # phase, `phase_names`: a phase change swaps the list, `set_op_phase`, and counts nothing),
        # and `one_instr_ops`, one entry per op recorded as one instruction by the recorder's common
        # case. `flush_ops` folds them into ops_seen, ops_by_name, ops_by_phase, ops_recorded and
        # instrs (the recorder calls it when they grow long; `snapshot` too). Cleared in place: the
        # recorder holds on to the lists.
        if "op_names" in self.__dict__:
            for names in self.phase_names.values():
                names.clear()
            self.one_instr_ops.clear()
        else:
            self.phase_names: dict = {"fwd": []}
            self.op_names: list = self.phase_names["fwd"]
            self.one_instr_ops: list = []
        self.ops_seen = 0  # every dispatched op, meta ops included
        self.ops_recorded = 0  # ops that became VM instructions (opaque calls included)
        self.ops_by_name: Counter = Counter()
        self.ops_by_phase: Counter = Counter()
        self.ops_opaque: Counter = Counter()  # op name -> calls recorded as opaque `call`
        self.ops_meta: Counter = Counter()  # ops with no tensor semantics (typeof, make_range ...)
        self.blocks = 0  # basic blocks closed with at least one instruction
        self.block_ends: Counter = Counter()  # reason -> count
        self.instrs = 0  # VM instructions emitted (an op may lower to several)
        self.sync_points: Counter = Counter()  # hooked Tensor method -> count
        self.record_errors: Counter = Counter()  # recorder failures (the op itself still ran)
        self.recordings = 0
        # tier 1 (fused execution inside dispatch)
        self.groups_compiled = 0
        self.sized_groups = 0  # groups whose size-dependent scalars became kernel inputs (tier1._lift)
        self.compiles = 0
        self.compile_seconds = 0.0
        self.cache_hits = 0  # a compiled run served (kernel found for the call's signature)
        self.cache_misses = 0  # a kernel had to be compiled
        self.disk_cache_hits = 0
        self.guard_failures: Counter = Counter()  # reason -> count
        self.fallbacks: Counter = Counter()  # "where: reason" -> count
        self.fused_ops = 0  # ops whose result came from a fused kernel
        # step switch (cost/step.py)
        self.step_calls: Counter = Counter()  # "vm" / "bare" -> steps run that way
        self.step_flips = 0  # a step key's way changed (VM -> bare or back)
        self.steps_bare = 0  # step keys whose chosen way was bare at the last flip
        # tier 2: region replay (frontend/regions.py)
        self.region_calls = 0  # calls of region owners (grad functions, outermost Cells), nested excluded
        self.regions_seen = 0  # (region, input signature) pairs met
        self.regions_replayed = 0  # calls served by a replay
        self.region_compiles = 0  # region programs planned
        self.region_sizes_derived = 0  # of which written from a size family, not recorded (bytecode/family.py)
        self.region_derive_failures: Counter = Counter()  # reason -> derived programs that failed their check
        self.region_guard_failures: Counter = Counter()  # reason -> count
        self.regions_not_replayable: Counter = Counter()  # reason -> (region, signature) pairs
        self.region_reverifications = 0
        self.region_retired: Counter = Counter()  # reason -> regions retired after replaying
        self.region_replay_seconds = 0.0  # wall time inside replays (guards, program, wrapping)
        self.region_host_seconds = 0.0  # of which guards, input views and output wrapping
        self.region_pipeline_skipped: Counter = Counter()  # region programs the pass pipeline refused
        self.region_learn_seconds = 0.0  # recorded calls (learning, re-verification) and planning
        self.region_plan_seconds = 0.0  # of which planning (explaining, the pass pipeline, kernels)
        self.region_fallbacks: Counter = Counter()  # reason -> region calls run eagerly (learning excluded)
        if _TRACING:
            self._trace_counters(True)

    def set_op_phase(self, phase: str) -> None:
        """Ops seen from now on are counted in `phase` (`op_names` is that phase's list now)."""
        names = self.phase_names.get(phase)
        if names is None:
            names = self.phase_names[phase] = []
        self.op_names = names

    def pending_ops(self) -> int:
        """Ops seen and not yet counted (see `flush_ops`)."""
        return sum(map(len, self.phase_names.values()))

    def flush_ops(self) -> None:
        for phase, names in self.phase_names.items():
            if names:
                n = len(names)
                self.ops_seen += n
                _count_elements(self.ops_by_name, names)
                self.ops_by_phase[phase] += n
                names.clear()
        one = self.one_instr_ops
        if one:
            self.ops_recorded += len(one)
            self.instrs += len(one)
            one.clear()
        if on_flush is not None:
            on_flush()

    def snapshot(self) -> dict:
        import sys

        self.flush_ops()

        pool_stats = {}
        pool_mod = sys.modules.get("ms_dynvm.runtime.memory_pool")
        if pool_mod is not None and pool_mod._default is not None:
            pool_stats = {f"pool_{k}": v for k, v in pool_mod.default_pool().stats().items()}
        seen = self.ops_seen
        opaque = sum(self.ops_opaque.values())
        return {
            "ops_seen": seen,
            "ops_recorded": self.ops_recorded,
            "ops_by_name": dict(self.ops_by_name),
            "ops_by_phase": dict(self.ops_by_phase),
            "ops_opaque": dict(self.ops_opaque),
            "ops_opaque_total": opaque,
            "opaque_rate": opaque / seen if seen else 0.0,
            "ops_meta": dict(self.ops_meta),
            "blocks": self.blocks,
            "block_ends": dict(self.block_ends),
            "instrs": self.instrs,
            "sync_points": dict(self.sync_points),
            "record_errors": dict(self.record_errors),
            "recordings": self.recordings,
            "groups_compiled": self.groups_compiled,
            "sized_groups": self.sized_groups,
            "compiles": self.compiles,
            "compile_seconds": self.compile_seconds,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_hit_rate": (self.cache_hits / (self.cache_hits + self.cache_misses)
                               if self.cache_hits + self.cache_misses else 0.0),
            "disk_cache_hits": self.disk_cache_hits,
            "guard_failures": dict(self.guard_failures),
            "fallbacks": dict(self.fallbacks),
            "fused_ops": self.fused_ops,
            "fusion_rate": self.fused_ops / seen if seen else 0.0,
            "step_calls": dict(self.step_calls),
            "step_flips": self.step_flips,
            "steps_bare": self.steps_bare,
            "region_calls": self.region_calls,
            "regions_seen": self.regions_seen,
            "regions_replayed": self.regions_replayed,
            "region_replay_rate": self.regions_replayed / self.region_calls if self.region_calls else 0.0,
            "region_compiles": self.region_compiles,
            "region_sizes_derived": self.region_sizes_derived,
            "region_derive_failures": dict(self.region_derive_failures),
            "region_guard_failures": dict(self.region_guard_failures),
            "regions_not_replayable": dict(self.regions_not_replayable),
            "region_reverifications": self.region_reverifications,
            "region_retired": dict(self.region_retired),
            "region_replay_seconds": self.region_replay_seconds,
            "region_host_seconds": self.region_host_seconds,
            "region_pipeline_skipped": dict(self.region_pipeline_skipped),
            "region_learn_seconds": self.region_learn_seconds,
            "region_plan_seconds": self.region_plan_seconds,
            "region_fallbacks": dict(self.region_fallbacks),
            **pool_stats,
        }


    # --- tracing ------------------------------------------------------------------------------------
    def set_tracing(self, on: bool) -> None:
        """Emit timeline events from counter updates (`ms_dynvm.observe.events`) or stop doing so."""
        global _TRACING
        _TRACING = on
        self._trace_counters(on)
        self.__class__ = _TracingMetrics if on else Metrics
        self.__dict__.pop("_launch_t", None)
        _trace_pool(on)

    def _trace_counters(self, on: bool) -> None:
        _init_traced()
        for attr, cls in _TRACED.items():
            c = self.__dict__.get(attr)
            if c is not None:
                c.__class__ = cls if on else Counter


_TRACING = False
on_flush = None  # called after each flush_ops (ms_dynvm.observe.alarm checks its window there)


def _traced_counter(label: str, cat: str) -> type:
    """A Counter whose increments also emit an instant event `<label><key>` on track `cat`."""
    from ms_dynvm.observe import events

    def __setitem__(self, key, value, _set=dict.__setitem__, _get=dict.get):
        n = value - _get(self, key, 0)
        _set(self, key, value)
        if n > 0 and events.ON:
            if n == 1:  # (the common case: no args dict per event)
                events.emit(f"{label}{key}", cat, None, None)
            else:
                events.emit(f"{label}{key}", cat, None, None, count=n)

    return type(f"Traced{cat.title()}Counter", (Counter,), {"__setitem__": __setitem__, "__slots__": ()})


_TRACED: dict = {}


def _init_traced() -> None:
    if not _TRACED:
        _TRACED.update({
            "fallbacks": _traced_counter("fallback: ", "fallback"),
            "guard_failures": _traced_counter("guard failed: ", "guard"),
            "step_calls": _traced_counter("step: ", "step"),
            "block_ends": _traced_counter("block closed: ", "recording"),
            "sync_points": _traced_counter("sync point: ", "sync"),
            "region_fallbacks": _traced_counter("region fallback: ", "region"),
        })


class _TracingMetrics(Metrics):
    """Metrics whose updates of a few counters also emit timeline events (see `set_tracing`): a fused
    launch (`cache_hits`) opens a "fused group" span that the group's end (`fused_ops`) closes; kernel
    installs, step-way flips and recordings are instants."""

    @property
    def cache_hits(self):
        return self.__dict__["cache_hits"]

    @cache_hits.setter
    def cache_hits(self, v):
        from ms_dynvm.observe import events

        d = self.__dict__
        if v > d.get("cache_hits", 0):
            d["_launch_t"] = events.now_us()
        d["cache_hits"] = v

    @property
    def fused_ops(self):
        return self.__dict__["fused_ops"]

    @fused_ops.setter
    def fused_ops(self, v):
        from ms_dynvm.observe import events

        d = self.__dict__
        n = v - d.get("fused_ops", 0)
        d["fused_ops"] = v
        t0 = d.pop("_launch_t", None)
        if n > 0 and t0 is not None:
            events.emit("fused group served", "kernel", t0, events.now_us() - t0, ops=n)

    @property
    def cache_misses(self):
        return self.__dict__["cache_misses"]

    @cache_misses.setter
    def cache_misses(self, v):
        from ms_dynvm.observe import events

        d = self.__dict__
        if v > d.get("cache_misses", 0):
            events.instant("kernel installed", "compile", compiles=d.get("compiles", 0),
                           compile_seconds=round(d.get("compile_seconds", 0.0), 6))
        d["cache_misses"] = v

    @property
    def step_flips(self):
        return self.__dict__["step_flips"]

    @step_flips.setter
    def step_flips(self, v):
        from ms_dynvm.observe import events

        d = self.__dict__
        if v > d.get("step_flips", 0):
            events.instant("step switch: a size class changed way", "step", flips=v)
        d["step_flips"] = v

    @property
    def region_calls(self):
        return self.__dict__["region_calls"]

    @region_calls.setter
    def region_calls(self, v):
        from ms_dynvm.observe import events

        if v > self.__dict__.get("region_calls", 0):
            events.instant("region call", "region", calls=v)
        self.__dict__["region_calls"] = v

    @property
    def recordings(self):
        return self.__dict__["recordings"]

    @recordings.setter
    def recordings(self, v):
        from ms_dynvm.observe import events

        if v > self.__dict__.get("recordings", 0):
            events.instant("recording finished", "recording", recordings=v)
        self.__dict__["recordings"] = v


def _trace_pool(on: bool) -> None:
    """While tracing, the default memory pool's safe points are timed (an instance attribute shadows
    `Pool.safe_point`; removed again when tracing stops)."""
    import sys

    mod = sys.modules.get("ms_dynvm.runtime.memory_pool")
    pool = getattr(mod, "_default", None) if mod is not None else None
    if pool is None:
        return
    if not on:
        pool.__dict__.pop("safe_point", None)
        return
    from ms_dynvm.observe import events

    plain = type(pool).safe_point.__get__(pool)

    def safe_point():
        t0 = events.now_us()
        moved = plain()
        if events.ON:
            try:
                events.emit("pool safe point", "pool", t0, events.now_us() - t0, moved=moved)
                events.counter("pool bytes", "pool", reserved=pool._reserved, live=pool._live)
            except Exception:  # noqa: BLE001 - tracing never breaks a launch
                pass
        return moved

    pool.safe_point = safe_point


METRICS = Metrics()


def stats() -> dict:
    """A snapshot of every counter (see README, 'stats()')."""
    return METRICS.snapshot()


def reset_stats() -> None:
    METRICS.reset()
