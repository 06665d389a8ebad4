"""Recording overhead per op: ms_dynvm's dispatch handler vs a pass-through MsDispatchMode handler.

Everything runs in one process, in MindSpore's blocking mode (its fastest eager mode on CPU), and the
configurations are interleaved: every round runs, for each workload, every configuration back to back
(their order rotates from round to round), and medians over the rounds are reported. The set-up's
garbage is collected before the first round.

Configurations:
- eager:        no dispatch mode at all
- passthrough:  an MsDispatchMode whose handler only calls `func(*args)` (twice: passthrough2, A/A)
- id-floor:     a pass-through MsDispatchMode that also does what every exact recorder must do per op
                in MindSpore 2.10, and nothing else: read the user data of each tensor argument
                (a legacy primitive's inputs unwrapped; tensors found by exact type, as the recorder
                finds them) and write each tensor result's (`_get_user_data`/`_set_user_data`, the
                only tensor identity that survives MindSpore's fresh Python wrappers; see
                frontend/recorder.py). Its overhead over passthrough is a floor under any recorder
                built on that identity.
- hooks-only:   ms_dynvm.enable(jit=False) with a recorder that does nothing per op (`Recorder.on_op`
                a no-op): ms_dynvm's dispatch mode and its hooks (nn.Cell calls, the grad wrapper,
                sync points) and the block ends they make, with nothing recorded: what the issue's
                design (blocks end at Cell boundaries and phase changes) costs before the first
                instruction is recorded
- hooks+id:     the same with `on_op` doing only what id-floor's handler does, from Python (the C
                trace below makes the same calls and more for less: Python's own cost per op shows)
- hooks+trace:  the same with `on_op` (in Python) also keeping a minimal trace: the op's name and the
                tags read appended to a flat list (ints and the name: nothing for the collector to
                track), results tagged with ints; no normalisation, no types, no plan lookup
- hooks+ctrace: that minimal trace in C (profiling/tools/_ctrace.c, a builtin as `on_op`; its trace is a
                preallocated C buffer)
- ctrace-bare:  the C trace in a bare MsDispatchMode (no ms_dynvm: no hooks, no blocks): the floor of
                any exact recorder in MindSpore 2.10's dispatch mode, whatever its design
- count-only:   ms_dynvm with record=False (counting and normalisation, no bytecode)
- record:       ms_dynvm.enable(jit=False): every op recorded into bytecode blocks, nothing compiled
                (ops that find their plan recorded by the C hot path, frontend/_crecord.c)
- record-py:    the same with enable(c_hot_path=False): the recorder in Python only
- record+jit:   only with --jit: ms_dynvm.enable(): recording plus tier-1 run tracking (and serving
                where compiled; compiling happens inside the timed calls)
- id-name, id-get, id-set: only with --identity: the parts of id-floor, each alone in a pass-through
                handler: reading `func.name` (every recorder needs the op's name; MindSpore makes a fresh
                op object per dispatch, so it cannot be cached), `_get_user_data` per tensor argument,
                `_set_user_data` per tensor result
- mode-noop, mode+rec: only with --decompose: ms_dynvm's dispatch mode (frontend/dispatch.DynVMMode)
                entered by hand, without the hooks (no Cell, grad or sync-point hooks, so no block
                ends but the recorder's own limit), with `Recorder.on_op` a no-op (mode-noop) or the
                recorder as in record (mode+rec): what the handler alone costs, and the recorder's
                per-op work alone, without block and program management

Workloads: a 27-op elementwise/reduction chain on a 16x16 tensor (dispatch-bound, so the handler's
cost dominates), and the forward+backward steps of the test workloads (profiling/workloads.py).

Per-op overhead of `record` over `passthrough`, several ways (all in us per dispatched op):
- end to end, wall: median over rounds of (wall time per call of record - of passthrough in the same
  round) / ops per call. What a user sees, but noisy on a 2-core machine, where MindSpore's worker
  threads spin for ~1 ms after each op: `passthrough2` (a second, identical pass-through run) gives
  the noise floor (A/A); differences smaller than it mean nothing.
- end to end, cpu: the same with the CPU time of the calling thread (time.thread_time) instead of wall
  time: not inflated by waiting for a core, still by cache and core sharing.
- handler: CPU time of the calling thread spent in the recorder (thread_time around
  `Recorder.on_op`, which is all ms_dynvm does for an op in this mode besides the hooks at sync points
  and cell/phase boundaries), minus the cost of a timer call measured right before it; median and mean
  over every op of every round (the mean includes the garbage collections that happen to run inside
  the recorder). Measured in a separate interleaved configuration, record(timed), so that the timer
  calls do not disturb the other figures.
- replay: the ops of one call (name, arguments, result) captured once, then fed to a fresh
  `Recorder.on_op` in a tight loop with the collector off and no MindSpore op running in between (no
  worker thread spinning, warm caches): the recorder's own cost, nearly independent of machine load.
  Caveat (found 2026-12-03): the captured argument tensors are the script's copies of the results,
  which carry the capture's tags (MindSpore copies user data when it hands a result to the script),
  so in a replay nearly every argument is a fresh input of the replaying recorder: the replay
  measures the first-sight path (inputs made, the plan still looked up), not the steady state's
  plan hits, which only the in-handler figures show. Median and minimum over repetitions of the
  per-op mean; "new": the median with the recorder's plan caches emptied before each repetition
  (every op a first of its key: the full path, and making the plan); "py": the median without the
  C hot path.
- record-py: the Python-only recorder (`c_hot_path=False`), end to end and in the handler
  (record-py(timed)), against record (with the C hot path for plan hits).

The recorder's plan cache (see its module doc) is process-wide: after the warm-up calls every op of
these workloads finds its plan, so the other figures are of the steady state.
- gc: time spent in garbage collections (gc.callbacks) per op, in each configuration, and the number
  of collections per generation over all rounds. Objects that the recorder keeps alive make the
  collector run more often; a full (generation 2) collection walks every object of the process.

    python profiling/bench/bench_record_overhead.py [--reps 9] [--calls 20] [--jit] [--decompose] [--identity]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


class GCMeter:
    """Time and count of garbage collections, per generation, through gc.callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.counts = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase, info) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.counts[info["generation"]] += 1

    def snapshot(self):
        return self.seconds, tuple(self.counts)


def chain(x):
    from mindspore import ops

    for _ in range(2):
        y = ops.exp(x * 0.5 - 1.0)
        y = ops.relu(y + x)
        y = ops.tanh(y) - 0.25
        y = ops.sigmoid(y) * x
        x = y / 2.0 + ops.neg(y)
        x = ops.maximum(x, y)
    return x.sum(-1)


def load_c(stem: str):
    """profiling/tools/<stem>.c built with gcc (the recorder's hot-path flags) and loaded as module `stem`."""
    from ms_dynvm.codegen import gcc
    from ms_dynvm.frontend import fastpath

    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
    with open(os.path.join(tools, stem + ".c")) as f:
        return fastpath._load_bytes(gcc.compile_shared(f.read(), fastpath._build_flags()), stem)


def load_ctrace():
    """profiling/tools/_ctrace.c built and loaded (the hooks+ctrace configuration)."""
    return load_c("_ctrace")


def make_cases():
    import mindspore as ms

    from profiling import workloads

    x = ms.Tensor(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))
    cases = {"chain16x16": (chain, (x,))}
    for name in ("mlp", "layernorm_gelu", "attention"):
        cases[name] = workloads.WORKLOADS[name]()
    return cases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=9, help="rounds over all configurations")
    ap.add_argument("--calls", type=int, default=20, help="calls of the workload per timing")
    ap.add_argument("--jit", action="store_true", help="also time record+jit (compiles kernels)")
    ap.add_argument("--decompose", action="store_true",
                    help="also time mode-noop and mode+rec (ms_dynvm's dispatch mode without its hooks, "
                         "with no recorder work, with the recorder)")
    ap.add_argument("--identity", action="store_true",
                    help="also time id-name, id-get and id-set (the parts of id-floor, each alone)")
    ap.add_argument("--keep-objects", type=int, default=0, metavar="N",
                    help="also time hooks+ctrace+keepN: the C trace making 3N Python objects per op "
                         "and keeping them (as a recorder keeps its instructions) and hooks+ctrace+freeN "
                         "(made and freed at once)")
    args = ap.parse_args()

    import mindspore as ms

    import ms_dynvm
    from ms_dynvm.frontend import recorder as rec_mod
    from ms_dynvm.frontend.options import Options

    ms.runtime.launch_blocking()
    cases = make_cases()

    class PassThrough(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            return func(*a)

    id_key = "bench.id_floor"
    id_n = [0]
    tensor_types = {}  # type -> whether it is a Tensor (class): an exact-type lookup, as the recorder's

    def is_tensor(x):
        tx = type(x)
        r = tensor_types.get(tx)
        if r is None:
            r = tensor_types[tx] = issubclass(tx, ms.Tensor)
        return r

    def tensor_args(a):
        """The arguments the recorder reads tags of: a legacy primitive's `(prim, name, inputs)`
        unwrapped."""
        if len(a) == 3 and type(a[1]) is str and type(a[2]) is tuple:
            return a[2]
        return a

    def tag_results(out):
        for o in (out,) if not isinstance(out, (tuple, list)) else out:
            if is_tensor(o):
                id_n[0] += 1
                o._set_user_data(id_key, id_n[0])

    def id_calls(a, out):
        for x in tensor_args(a):
            if is_tensor(x):
                x._get_user_data(id_key)
        tag_results(out)

    class IdFloor(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            out = func(*a)
            id_calls(a, out)
            return out

    class IdName(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            func.name  # noqa: B018 - the read is what is timed
            return func(*a)

    class IdGet(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            for x in tensor_args(a):
                if is_tensor(x):
                    x._get_user_data(id_key)
            return func(*a)

    class IdSet(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            out = func(*a)
            tag_results(out)
            return out

    identity_modes = {"id-name": IdName, "id-get": IdGet, "id-set": IdSet}

    class Counter(ms.MsDispatchMode):
        n = 0

        def __ms_dispatch__(self, func, a, kwargs=None):
            Counter.n += 1
            return func(*a)

    n_ops = {}
    for name, (fn, inp) in cases.items():
        Counter.n = 0
        with Counter():
            fn(*inp)
        n_ops[name] = Counter.n

    meter = GCMeter()
    gc.callbacks.append(meter)
    tt = time.thread_time
    perf = time.perf_counter

    def run(fn, inp, calls):
        """(wall seconds, thread CPU seconds, GC seconds, GC counts) per call."""
        g0, c0 = meter.snapshot()
        t0, u0 = perf(), tt()
        for _ in range(calls):
            fn(*inp)
        t1, u1 = perf(), tt()
        g1, c1 = meter.snapshot()
        return ((t1 - t0) / calls, (u1 - u0) / calls, (g1 - g0) / calls,
                tuple(b - a for a, b in zip(c0, c1)))

    # In-handler CPU time: thread_time_ns around Recorder.on_op (its own pass of each round). The
    # timer's own cost is measured in place, per op (t1 - t0: one call, as cold as the ones around
    # on_op), not in a quiet loop, where it is several times cheaper than right after an op.
    ttn = time.thread_time_ns
    spent = {name: [] for name in cases}
    spent_py = {name: [] for name in cases}
    orig_on_op = rec_mod.Recorder.on_op
    current = [None]

    def timed_on_op(self, name, a, out):
        t0 = ttn()
        t1 = ttn()
        orig_on_op(self, name, a, out)
        t2 = ttn()
        (spent if rec_mod._hit is not None else spent_py)[current[0]].append((t2 - t1) - (t1 - t0))

    def noop_on_op(self, name, a, out):
        self.last_op = self.last_tags = None

    def id_on_op(self, name, a, out):
        self.last_op = self.last_tags = None
        id_calls(a, out)

    trace = []

    def trace_on_op(self, name, a, out):  # _ctrace.c's on_op in Python (its buffer: a list)
        self.last_op = self.last_tags = None
        trace.append(name)
        for x in tensor_args(a):
            if is_tensor(x):
                trace.append(x._get_user_data(id_key))
        tag_results(out)
        trace.append(id_n[0])
        if len(trace) >= 1 << 16:  # a block's worth: dropped as a closed block would be handed on
            trace.clear()

    ctrace = load_ctrace()
    ctrace.setup(ms.Tensor, id_key)
    c_on_op = ctrace.on_op

    class CTraceBare(ms.MsDispatchMode):
        def __ms_dispatch__(self, func, a, kwargs=None):
            out = func(*a)
            c_on_op(func.name, a, out)
            return out

    def run_config(cfg, fn, inp, calls):
        if cfg == "eager":
            return run(fn, inp, calls)
        if cfg in ("passthrough", "passthrough2"):
            with PassThrough():
                return run(fn, inp, calls)
        if cfg == "id-floor":
            with IdFloor():
                return run(fn, inp, calls)
        if cfg in identity_modes:
            with identity_modes[cfg]():
                return run(fn, inp, calls)
        if cfg == "ctrace-bare":
            ctrace.set_keep(0, 0)
            with CTraceBare():
                return run(fn, inp, calls)
        if cfg in ("mode-noop", "mode+rec"):
            from ms_dynvm.frontend import dispatch as dispatch_mod

            if cfg == "mode-noop":
                rec_mod.Recorder.on_op = noop_on_op
            rec_mod.set_c_hot_path(True)
            mode = dispatch_mod.DynVMMode(rec_mod.Recorder(Options.make(jit=False)), None)
            try:
                with mode:
                    return run(fn, inp, calls)
            finally:
                rec_mod.Recorder.on_op = orig_on_op
        if cfg.endswith("(timed)"):
            rec_mod.Recorder.on_op = timed_on_op
        elif cfg == "hooks-only":
            rec_mod.Recorder.on_op = noop_on_op
        elif cfg == "hooks+id":
            rec_mod.Recorder.on_op = id_on_op
        elif cfg == "hooks+trace":
            rec_mod.Recorder.on_op = trace_on_op
        elif cfg.startswith("hooks+ctrace"):
            ctrace.set_keep(args.keep_objects if cfg != "hooks+ctrace" else 0, int("+keep" in cfg))
            rec_mod.Recorder.on_op = ctrace.on_op  # a builtin: not bound, called as on_op(name, a, out)
        ms_dynvm.enable(record=(cfg != "count-only"), jit=(cfg == "record+jit"),
                        c_hot_path=not cfg.startswith("record-py"))
        try:
            return run(fn, inp, calls)
        finally:
            ms_dynvm.disable()
            rec_mod.Recorder.on_op = orig_on_op

    configs = (["eager", "passthrough", "passthrough2", "id-floor", "hooks-only", "hooks+id", "hooks+trace",
                "hooks+ctrace", "ctrace-bare", "count-only",
                "record", "record-py"]
               + (["record+jit"] if args.jit else [])
               + (["mode-noop", "mode+rec"] if args.decompose else [])
               + (list(identity_modes) if args.identity else [])
               + ([f"hooks+ctrace+keep{args.keep_objects}", f"hooks+ctrace+free{args.keep_objects}"]
                  if args.keep_objects else [])
               + ["record(timed)", "record-py(timed)"])
    res = {(c, n): [] for c in configs for n in cases}
    for cfg in configs:  # warm-up
        n0, t0 = ctrace.calls(), len(trace)
        for name, (fn, inp) in cases.items():
            current[0] = name
            run_config(cfg, fn, inp, 2)
        if (cfg.startswith("hooks+ctrace") or cfg == "ctrace-bare") and ctrace.calls() == n0 or cfg == "hooks+trace" and len(trace) == t0:
            raise SystemExit(f"{cfg}: its on_op was not called")
    for s in list(spent.values()) + list(spent_py.values()):
        s.clear()
    gc.collect()  # the set-up's garbage is nobody's: do not bill it to the first config that allocates
    for r in range(args.reps):
        k = r % len(configs)
        for name, (fn, inp) in cases.items():
            current[0] = name
            for cfg in configs[k:] + configs[:k]:
                res[(cfg, name)].append(run_config(cfg, fn, inp, args.calls))

    # Replay: the recorder alone, on one call's ops captured from a real run.
    replay = {}
    opts = Options.make(jit=False)

    def replay_per_op(events, reps: int, empty_caches: bool, c_path: bool = True) -> list:
        """Recorder CPU time per op (us) of `reps` replays of `events` through fresh recorders, the
        collector off; `empty_caches`: the plan and inference caches emptied before each; `c_path`:
        with the C hot path."""
        per_op = []
        gc.collect()
        gc.disable()
        rec_mod.set_c_hot_path(c_path)
        try:
            for _ in range(reps):
                if empty_caches:
                    for plans in rec_mod._PLANS.values():
                        plans.clear()
                    rec_mod._INFERRED.clear()
                on_op = rec_mod.Recorder(opts).on_op
                u0 = ttn()
                for n, a, out in events:
                    on_op(n, a, out)
                per_op.append((ttn() - u0) / len(events) / 1e3)
        finally:
            gc.enable()
        return per_op

    for name, (fn, inp) in cases.items():
        events = []

        def capture(self, n, a, out, events=events):
            events.append((n, a, out))
            return orig_on_op(self, n, a, out)

        rec_mod.Recorder.on_op = capture
        ms_dynvm.enable(jit=False)
        try:
            fn(*inp)
        finally:
            ms_dynvm.disable()
            rec_mod.Recorder.on_op = orig_on_op
        time.sleep(0.01)  # let MindSpore's worker threads stop spinning
        per_op = replay_per_op(events, max(args.reps, 5) * 20, empty_caches=False)
        per_op_new = replay_per_op(events, max(args.reps, 5) * 4, empty_caches=True)
        per_op_py = replay_per_op(events, max(args.reps, 5) * 20, empty_caches=False, c_path=False)
        replay[name] = (statistics.median(per_op), min(per_op), statistics.median(per_op_new),
                        statistics.median(per_op_py))
        del events
    gc.callbacks.remove(meter)

    shown = [c for c in configs if not c.endswith("(timed)")]

    def med(cfg, name, i):
        return statistics.median(x[i] for x in res[(cfg, name)]) * 1e6

    def paired(cfg, name, i, base="passthrough"):
        """Median over rounds of (cfg - base) in the same round, per op."""
        return statistics.median(a[i] - b[i] for a, b in zip(res[(cfg, name)], res[(base, name)])) \
            * 1e6 / n_ops[name]

    print(f"{args.reps} interleaved rounds x {args.calls} calls; medians over rounds (times per call in us)")
    for i, what in ((0, "wall/call"), (1, "thread cpu/call")):
        print(f"{'workload':16s} {'ops':>4s} " + " ".join(f"{c:>12s}" for c in shown) + f"   {what}")
        for name in cases:
            print(f"{name:16s} {n_ops[name]:4d} " + " ".join(f"{med(c, name, i):12.1f}" for c in shown))
    print(f"{'workload':16s} {'ops':>4s} " + " ".join(f"{c:>12s}" for c in shown)
          + "   gc us/op (collections gen0/gen1/gen2, all rounds)")
    for name in cases:
        cells = []
        for c in shown:
            runs = res[(c, name)]
            gc_per_op = sum(x[2] for x in runs) / len(runs) * 1e6 / n_ops[name]
            cnt = [sum(x[3][g] for x in runs) for g in range(3)]
            cells.append(f"{gc_per_op:5.2f}({cnt[0]}/{cnt[1]}/{cnt[2]})")
        print(f"{name:16s} {n_ops[name]:4d} " + " ".join(f"{s:>12s}" for s in cells))
    print("per-op overhead over passthrough, us/op. end to end: median over rounds of the difference "
          "with passthrough in the same round (wall | thread cpu); A/A: passthrough2, the noise floor; "
          "handler: recorder cpu per op (median, mean); replay: recorder alone (median, min, new: "
          "plan caches emptied, py: Python only); gc: collector time per op in record; "
          "record-py wall: end to end of the Python-only recorder; py handler: its handler median, mean; "
          "id floor: the id-floor handler (user data read per tensor argument, written per result)")
    print(f"{'workload':16s} {'record wall':>11s} {'cpu':>7s} {'count wall':>10s} {'cpu':>7s} "
          f"{'A/A wall':>8s} {'cpu':>7s} {'handler med':>11s} {'mean':>7s} {'replay med':>10s} "
          f"{'min':>6s} {'new':>6s} {'py':>6s} {'gc':>6s} {'rec-py wall':>11s} {'py handler':>10s} {'mean':>6s} "
          f"{'id floor':>8s} {'cpu':>6s}")
    for name in cases:
        s = spent[name]
        runs = res[("record", name)]
        gc_rec = sum(x[2] for x in runs) / len(runs) * 1e6 / n_ops[name]
        print(f"{name:16s} {paired('record', name, 0):11.2f} {paired('record', name, 1):7.2f} "
              f"{paired('count-only', name, 0):10.2f} {paired('count-only', name, 1):7.2f} "
              f"{paired('passthrough2', name, 0):8.2f} {paired('passthrough2', name, 1):7.2f} "
              f"{statistics.median(s) / 1e3:11.2f} {statistics.mean(s) / 1e3:7.2f} "
              f"{replay[name][0]:10.2f} {replay[name][1]:6.2f} {replay[name][2]:6.2f} {replay[name][3]:6.2f} "
              f"{gc_rec:6.2f} {paired('record-py', name, 0):11.2f} "
              f"{statistics.median(spent_py[name]) / 1e3:10.2f} {statistics.mean(spent_py[name]) / 1e3:6.2f} "
              f"{paired('id-floor', name, 0):8.2f} {paired('id-floor', name, 1):6.2f}")
    print("floor: per-op wall overhead over passthrough (paired medians, us/op) of ms_dynvm's hooks with "
          "nothing recorded (hooks-only), of its hooks plus the identity calls from Python (hooks+id), "
          "of a minimal trace on top (hooks+trace; in C: ctrace; the C trace in a bare dispatch mode, without ms_dynvm: bare), of record, and record - hooks+id "
          "(rec-floor, paired)")
    print(f"{'workload':16s} {'id-floor':>8s} {'hooks-only':>10s} {'hooks+id':>8s} {'hooks+trace':>11s} {'ctrace':>7s} {'bare':>6s} "
          f"{'record':>7s} {'rec-floor':>9s} {'A/A':>6s}")
    for name in cases:
        print(f"{name:16s} {paired('id-floor', name, 0):8.2f} {paired('hooks-only', name, 0):10.2f} "
              f"{paired('hooks+id', name, 0):8.2f} {paired('hooks+trace', name, 0):11.2f} "
              f"{paired('hooks+ctrace', name, 0):7.2f} {paired('ctrace-bare', name, 0):6.2f} "
              f"{paired('record', name, 0):7.2f} "
              f"{paired('record', name, 0, 'hooks+id'):9.2f} {paired('passthrough2', name, 0):6.2f}")

    if args.decompose:
        print("decomposition: per-op wall | thread cpu overhead over passthrough (paired medians, us/op) of "
              "ms_dynvm's dispatch mode without its hooks and no recorder work (mode-noop), of the same with "
              "its hooks (hooks-only), of the mode with the recorder but no hooks (mode+rec: per-op recording "
              "without Cell/phase/sync block ends), and of record")
        print(f"{'workload':16s} {'mode-noop':>15s} {'hooks-only':>15s} {'mode+rec':>15s} {'record':>15s}")
        for name in cases:
            print(f"{name:16s} " + " ".join(f"{paired(c, name, 0):7.2f} {paired(c, name, 1):7.2f}"
                                            for c in ("mode-noop", "hooks-only", "mode+rec", "record")))

    if args.identity:
        print("identity: per-op wall | thread cpu overhead over passthrough (paired medians, us/op) of a "
              "pass-through handler that only reads func.name (id-name), only reads each tensor argument's "
              "user data (id-get), only writes each tensor result's (id-set), does both (id-floor), and of "
              "the minimal C trace in a bare dispatch mode (ctrace-bare), against record; A/A: passthrough2")
        cols = ("id-name", "id-get", "id-set", "id-floor", "ctrace-bare", "record", "passthrough2")
        print(f"{'workload':16s} " + " ".join(f"{c:>15s}" for c in cols))
        for name in cases:
            print(f"{name:16s} " + " ".join(f"{paired(c, name, 0):7.2f} {paired(c, name, 1):7.2f}" for c in cols))

    if args.keep_objects:
        k = args.keep_objects
        print(f"objects per op: per-op wall overhead over passthrough (paired medians, us/op) of the C trace under "
              f"ms_dynvm's hooks alone, making {3 * k} Python objects per op and keeping them (keep), making and "
              f"freeing them (free); and record")
        print(f"{'workload':16s} {'ctrace':>7s} {'keep':>6s} {'free':>6s} {'record':>7s}")
        for name in cases:
            print(f"{name:16s} {paired('hooks+ctrace', name, 0):7.2f} {paired(f'hooks+ctrace+keep{k}', name, 0):6.2f} "
                  f"{paired(f'hooks+ctrace+free{k}', name, 0):6.2f} {paired('record', name, 0):7.2f}")


if __name__ == "__main__":
    main()
