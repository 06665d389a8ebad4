"""`enable()` / `disable()` / `enabled()` / `record()`: the one MsDispatchMode that ms_dynvm enters.

Behaviour chosen where MindSpore leaves it open (also in docs/architecture.md):
- `enable()` when already enabled applies the new options to the running VM (no second mode is
  entered); `disable()` when not enabled does nothing and returns False.
- `with enabled(**opts):` restores the previous state on exit (enabled with the previous options, or
  disabled).
- The mode is entered for the calling thread only (MindSpore's mode stack is per thread): ops that
  other threads issue are neither seen nor recorded, and they run as plain eager.
- An atexit handler exits the mode (a mode still entered at interpreter exit aborts the process).
- `blocking=True` calls `mindspore.runtime.launch_blocking()`; MindSpore cannot switch that back, so it
  stays in force after `disable()`.
- If the handler's own bookkeeping fails, the op's eager result is still returned and the failure is
  counted in `stats()["record_errors"]`; errors of the op itself propagate exactly as in eager.
- `disable()` inside a dispatch mode the script entered after `enable()` raises RuntimeError
  (MindSpore's stack pops its top, the script's mode).
- Steps (`StepGate`, cost/step.py): with jit, each step runs under this mode or bare, with the mode
  off the stack, whichever measures faster per size class.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import threading

import mindspore as ms
from mindspore import Tensor
from mindspore._c_expression import _DispatchGuardStack

from time import perf_counter as _perf

from ms_dynvm.frontend.options import Options
from ms_dynvm.frontend.normalize import INPLACE as _INPLACE, mutated_tensor as _mutated, \
    reads_target as _reads_target, side_effect_inputs as _side_effect_inputs
from ms_dynvm.frontend.recorder import Recorder, Recording, set_c_hot_path
from ms_dynvm.frontend.sync import Hooks, mixed_types_entered, mixed_types_entered_elsewhere
from ms_dynvm.cost.model import SizeSwitch
from ms_dynvm.cost.step import StepSwitch
from ms_dynvm.frontend.tier1 import _EAGER, _MISS, Tier1
from ms_dynvm.metrics import METRICS


class DynVMMode(ms.MsDispatchMode):
    """Serves the op from a fused kernel (tier 1) when it can; otherwise runs it eagerly and hands
    (name, args, result) to the recorder and to tier 1's run tracking."""

    def __init__(self, recorder: Recorder, tier1: Tier1 | None) -> None:
        self.recorder = recorder
        self.tier1 = tier1
        # False inside `ms_dynvm.record()`: a recording holds every dispatched op, so nothing is
        # served (or run unrecorded) there; runs are still tracked and compiled.
        self.serving = True
        # Set by the step gate at a sync point while steps are sync-anchored: the next op starts a
        # step (StepGate.first_op), which may run bare from this op on.
        self.step_next = False
        self.gate: StepGate | None = None

    def __ms_dispatch__(self, func, args, kwargs=None):
        name = func.name
        if self.step_next and self.gate.first_op(name, args):
            # This step runs bare: the mode is off the stack now, this op runs as plain eager.
            return func(*args, **kwargs) if kwargs else func(*args)
        t1 = self.tier1
        if not self.serving:  # (serving is off exactly inside record())
            self.recorder.cur_func = func  # (an opaque call keeps it: Recording.call_handler)
            if name in _INPLACE or len(args) == 3:  # (3 arguments: maybe a legacy primitive)
                self._before_inplace(name, args)
        mix = self.recorder._mix  # (see Recorder.mix_event: tier 1 stays off under a mixed type)
        if t1 is None or kwargs or mix is not None:
            if mix is not None and t1 is not None and (t1.run is not None or t1.pending is not None):
                t1.block_closed("mix")  # (a type another thread pushed: no block end said so)
            out = func(*args, **kwargs) if kwargs else func(*args)
            try:
                self.recorder.on_op(name, args, out)
            except Exception as e:  # noqa: BLE001 - the user's op already ran; never break the script
                self.recorder.on_error(name, e)
            return out
        try:
            if t1.pending is not None:
                res = t1.serve(name, args)
                if res is _EAGER:
                    return self._eager_step(func, args, name, t1)
                if res is not _MISS:
                    return res
            if name in t1.starts and self.serving:
                res = t1.try_start(name, args)
                if res is _EAGER:
                    return self._eager_step(func, args, name, t1)
                if res is not _MISS:
                    return res
        except Exception as e:  # noqa: BLE001 - fall back to eager, never break the script
            t1.pending = None
            METRICS.fallbacks[f"tier1: error ({type(e).__name__})"] += 1
        t0 = _perf()
        out = func(*args)
        dt = _perf() - t0
        try:
            self.recorder.on_op(name, args, out)
            t1.after_op(name, args, out, t0, dt)
        except Exception as e:  # noqa: BLE001
            self.recorder.on_error(name, e)
            t1.run = None
        return out

    def _before_inplace(self, name, args) -> None:
        """In a recording, an in-place op (or a legacy primitive with side effects) is about to write
        its target: an input's value is copied first (Recorder.before_write)."""
        try:
            target = _mutated(name, args)
            if target is not None:
                self.recorder.before_write(target, _reads_target(name, args, target))
            for t in _side_effect_inputs(name, args):
                self.recorder.before_write(t)
        except Exception as e:  # noqa: BLE001 - never break the script
            self.recorder.on_error(name, e)

    @staticmethod
    def _eager_step(func, args, name, t1):
        """One op of a group tier 1 runs eagerly without recording (see `Tier1.serve`). The op's own
        errors reach the user as in eager mode; ms_dynvm's bookkeeping never raises into the script."""
        try:
            out = func(*args)
        except BaseException:
            t1.pending = None
            raise
        try:
            t1.eager_done(name, out)
        except Exception as e:  # noqa: BLE001
            t1.pending = None
            METRICS.fallbacks[f"tier1: error ({type(e).__name__})"] += 1
        return out


_region_ids = itertools.count(1)
_REGION_ATTR = "_ms_dynvm_region"
_MAX_SIZED_ARGS = 16
_MAX_SIZE_CLASSES = 4
_BARE_SYNC_PATIENCE = 64
# A sync-anchored step (StepGate.sync_point) ends at the first sync point at least this long after
# its first op, and the switch gets its time per sync point: a loop with a sync point every few ops
# (basic indexing is one) would otherwise pay the switch's own work (a decision, the mode off and
# back on the stack, the recorder's block closed) every few ops. Per sync point, both ways measure
# the same unit, whatever number of them each way's steps take in.
MIN_SYNC_STEP_S = 0.002


def _region_id(owner):
    """A small number per region owner (a Cell, a differentiated function), kept on the object
    with the object's id (a `copy.deepcopy` of a Cell copies its __dict__: the copy, another
    object, gets its own number); the type's name where it has no __dict__. (The id only checks
    the entry; keys hold the number.)"""
    d = getattr(owner, "__dict__", None)
    if type(d) is not dict:
        return type(owner).__qualname__
    ent = d.get(_REGION_ATTR)
    if ent is None or ent[0] != id(owner):
        ent = d[_REGION_ATTR] = (id(owner), next(_region_ids))
    return ent[1]


def _size_classes(args) -> tuple:
    """Per tensor argument (top level, or in a top-level tuple or list), the bit length of its
    element count: the step switch's size class (cost/step.py). Past _MAX_SIZE_CLASSES tensors
    (a concat of variable pieces, say), ("many", their number, the class of their total): the
    classes of each would make nearly every step a new key, none of them ever settled."""
    size_class = SizeSwitch.size_class  # (tier 1's per-group size classes, the same measure)
    numels = []
    for a in args[:_MAX_SIZED_ARGS]:
        ta = type(a)
        if ta is Tensor:
            numels.append(math.prod(a.shape))
        elif ta is tuple or ta is list:
            for e in a[:_MAX_SIZED_ARGS]:
                if type(e) is Tensor:
                    numels.append(math.prod(e.shape))
    if len(numels) > _MAX_SIZE_CLASSES:
        return ("many", len(numels), size_class(sum(numels)))
    return tuple(size_class(n) for n in numels)


class StepGate:
    """Runs each step of the script under the VM or bare, as tier 1's `StepSwitch` decides (see
    ms_dynvm/cost/step.py for steps, anchors and the policy), and measures it.

    The hooks of frontend/sync.py call `region_start` at every outermost Cell call and backward pass
    (`depth` counts the hooked calls being run), `bare_sync` at every sync point while bare, and,
    until the first region start, `sync_point` at sync points outside any region (sync-anchored
    steps: `first_op`, called by the handler, starts each). At the anchor's start the gate ends the
    previous step (its wall time goes to the switch) and applies the next step's way:
    - to bare: the recorder's block is closed (reason "off": the Program is dropped, as at a sync
      point, since bare code may write tensors in place unseen; tier 1's run ends) and ms_dynvm's
      dispatch mode is popped off MindSpore's mode stack;
    - to the VM: the mode is pushed back.
    Only while the stack is as ms_dynvm left it: a mode the script entered on top of ours is never
    popped, and then the step is not switched (nor measured). While bare, the hooks call straight
    through. Not switched: without jit, with `step_switch=False`, inside `ms_dynvm.record()` (which
    puts the mode back for its scope). A bare stretch with no anchor start for
    `_BARE_SYNC_PATIENCE` sync points (the script has left its loop) goes back to the VM. The
    gate's bookkeeping never raises into the script: a failure is counted in `record_errors`, and
    the VM is put back."""

    def __init__(self, mode: "DynVMMode") -> None:
        self.mode = mode
        self.depth = 0  # hooked Cell calls and backward passes being run
        self.bare = False  # the mode is off the stack: the hooks call straight through
        self.stack_depth = _DispatchGuardStack.depth()  # with our mode on top
        self.anchor = None  # region id of the anchor
        self.since_anchor = 0  # region starts since the anchor's last one
        self.step = None  # the step being run: (key, perf_counter at its start, under the VM, tier 1's probes)
        self.bare_syncs = 0
        self.step_syncs = 0  # sync points in the sync-anchored step being run
        # The last sync-anchored step ran bare: a VM step right after one is no measurement (it
        # starts with the recorder's Program dropped, a cost a run of VM steps does not have).
        self.last_bare = False
        self.unmeasured = False  # the sync-anchored step being run is such a step

    def _switching(self) -> bool:
        """Steps are switched at all: with jit, the option on, outside `ms_dynvm.record()`."""
        opts = _S.options
        return self.mode.tier1 is not None and self.mode.serving and opts is not None and opts.step_switch

    def _failed(self, e: Exception) -> None:
        """The gate's own bookkeeping failed: counted (`record_errors`), the step unmeasured, the VM
        put back; never raised into the script."""
        self.step = None
        self.mode.step_next = False
        self.mode.recorder.on_error("step", e)
        if self.bare:
            self._to_vm()

    def region_start(self, owner, args, backward: bool = False) -> None:
        """An outermost Cell call (`owner` the Cell) or backward pass (`owner` the differentiated
        function or Cell, `backward`) with these arguments is starting."""
        mode = self.mode
        t1 = mode.tier1
        self.bare_syncs = 0  # (the script is still in its loop)
        try:
            if not self._switching():
                if self.bare:
                    self._to_vm()
                self.step = None
                return
            rid = _region_id(owner)
            if backward:  # (ms.grad(net): the forward call of net and its backward are two regions)
                rid = ("grad", rid)
            if rid != self.anchor:
                if self.anchor is not None:
                    self.since_anchor += 1
                    if self.since_anchor <= StepSwitch.ANCHOR_PATIENCE:
                        return
                self.anchor = rid
                self.step = None  # (a sync-anchored step ends unmeasured: regions anchor from now on)
                mode.step_next = False
            self.since_anchor = 0
            end = _perf()
            sw = t1.steps
            prev = self.step
            key = (rid, _size_classes(args))
            vm = sw.decide(key, t1.generation, rid)
            depth = _DispatchGuardStack.depth()
            switched = True
            if vm and self.bare:
                switched = self._to_vm()
            elif not vm and not self.bare:
                if depth == self.stack_depth:
                    self._to_bare()
                    # A VM step followed by a bare one pays for closing its last block here (a VM
                    # step followed by a VM step pays it in the next Cell boundary, inside it).
                    end = _perf()
                else:
                    switched = False
            if prev is not None:
                self._record(t1, prev, end - prev[1])
            if not switched:
                self.step = None  # the script entered a mode of its own meanwhile: not measured
                return
            METRICS.step_calls["vm" if vm else "bare"] += 1
            self.step = (key, _perf(), vm, t1.probes)
        except Exception as e:  # noqa: BLE001 - ms_dynvm's bookkeeping never breaks the script
            self._failed(e)

    def bare_sync(self) -> None:
        """A sync point while bare, outside any region (the hooks call it at depth 0 only): after
        `_BARE_SYNC_PATIENCE` of them with no region start, the script has left its loop. (With
        sync-anchored steps, the step ends here: `sync_point`.)"""
        if self.anchor is None:
            self.sync_point()
            return
        self.bare_syncs += 1
        if self.bare_syncs > _BARE_SYNC_PATIENCE:
            self.step = None
            self._to_vm()

    # --- sync-anchored steps: scripts without a region (no Cell call, no backward pass) -----------
    def sync_point(self) -> None:
        """A sync point outside any region while no anchor has been seen (the hooks call it after the
        recorder's sync; `bare_sync` while bare). The step being run ends here once it has run for
        MIN_SYNC_STEP_S (its time per sync point goes to the switch); then ms_dynvm's mode goes back
        on the stack, and the next dispatched op starts the next step (`first_op`)."""
        mode = self.mode
        try:
            step = self.step
            t1 = mode.tier1
            if step is not None and t1 is not None:
                self.step_syncs += 1
                elapsed = _perf() - step[1]
                if elapsed < MIN_SYNC_STEP_S:
                    return  # the step goes on past this sync point (see MIN_SYNC_STEP_S)
                if not self.unmeasured:
                    self._record(t1, step, elapsed / self.step_syncs)
            self.step = None
            if self.bare:
                self._to_vm()
            mode.step_next = self.anchor is None and not self.bare and self._switching()
        except Exception as e:  # noqa: BLE001 - ms_dynvm's bookkeeping never breaks the script
            self._failed(e)

    def first_op(self, name: str, args) -> bool:
        """The first op after a sync point (see `sync_point`) starts a step keyed by the op's name and
        its tensor arguments' size classes; True when that step runs bare (the mode has been taken
        off the stack: the caller runs the op plain)."""
        mode = self.mode
        mode.step_next = False
        try:
            if self.anchor is not None or self.depth or self.bare or not self._switching():
                return False
            t1 = mode.tier1
            start = _perf()
            group = ("sync", name)
            key = (group, _size_classes(args))
            vm = t1.steps.decide(key, t1.generation, group)
            if not vm:
                if _DispatchGuardStack.depth() != self.stack_depth:
                    return False  # the script entered a mode of its own: not switched, not measured
                self._to_bare()
            METRICS.step_calls["vm" if vm else "bare"] += 1
            self.step = (key, start, vm, t1.probes)
            self.step_syncs = 0
            self.unmeasured = vm and self.last_bare
            self.last_bare = not vm
            return not vm
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            return False

    @staticmethod
    def _record(t1, step, seconds: float) -> None:
        """The step `step` (key, start, under the VM, tier 1's probes at its start) took `seconds`."""
        sw = t1.steps
        flips = sw.flips
        sw.record(step[0], seconds, step[2], t1.generation, step[3] != t1.probes)
        if sw.flips != flips:
            METRICS.step_flips += sw.flips - flips
            METRICS.steps_bare = sw.bare_keys()

    def _to_bare(self) -> None:
        rec = self.mode.recorder
        try:
            rec.close_block("off")
        except Exception as e:  # noqa: BLE001
            rec.on_error("step", e)
        t1 = self.mode.tier1
        if t1 is not None:
            t1.pending = None  # (a run tier 1 was running eagerly, unrecorded, is over too)
            t1.run = None
            # The ops of the bare stretch are not in the history: a group starting after it must not
            # bind an input from before it as "the result of the op before" (its later steps would
            # then only be abandoned), nor keep those tensors alive meanwhile.
            t1.hist.clear()
        _DispatchGuardStack.pop()
        self.bare = True

    def _to_vm(self) -> bool:
        """Put ms_dynvm's mode back on the stack; False (still bare) where the stack is not as the
        gate left it (a mode the script entered since is on it: ours goes back on top of it only
        once it has left)."""
        if _S.mode is not self.mode:  # (disabled meanwhile: nothing to put back)
            self.bare = False
            return True
        if _DispatchGuardStack.depth() != self.stack_depth - 1:
            return False
        _DispatchGuardStack.push(self.mode)
        self.bare = False
        return True


class _State:
    mode: DynVMMode | None = None
    recorder: Recorder | None = None
    hooks: Hooks | None = None
    options: Options | None = None
    thread: int | None = None
    atexit_registered = False


_S = _State()
_lock = threading.Lock()


def is_enabled() -> bool:
    return _S.mode is not None


def current_options() -> Options | None:
    return _S.options


def _release_dead_owner() -> None:
    """ms_dynvm was enabled on a thread that has ended without disable(): its dispatch mode went with
    that thread's mode stack; the hooks and state are released here, so that another thread may
    enable or disable. (Called with `_lock` held.)"""
    if _S.mode is None or _S.thread in {t.ident for t in threading.enumerate()}:
        return
    try:
        _S.recorder.close_block("end")
    except Exception as e:  # noqa: BLE001 - the owner is gone; nothing to report to
        _S.recorder.on_error("release", e)
    _S.hooks.uninstall()
    _S.mode = _S.recorder = _S.hooks = _S.options = _S.thread = None


def enable(**options) -> None:
    """Turn ms_dynvm on for the calling thread. See `ms_dynvm.frontend.options` for the options."""
    opts = Options.make(**options)
    with _lock:
        _release_dead_owner()
        if _S.mode is not None:
            if _S.thread != threading.get_ident():
                raise RuntimeError("ms_dynvm is enabled on another thread; disable it there first")
            if _S.recorder.recording is not None and not opts.record:
                raise RuntimeError("ms_dynvm.enable(record=False) inside a record() scope: leave the "
                                   "scope first")
            _apply(opts)
            return
        if opts.blocking:
            ms.runtime.launch_blocking()
        set_c_hot_path(opts.c_hot_path and opts.record)
        rec = Recorder(opts)
        for t in mixed_types_entered():  # enable() inside a Cell with a mixed-precision type
            rec.mix_event(t, True)
        for _ in range(mixed_types_entered_elsewhere()):  # (or while another thread is inside one)
            rec.mix_event(None, True, True)
        tier1 = _make_tier1(rec, opts)
        hooks = Hooks(rec, opts.cell_boundaries)
        hooks.install()
        mode = DynVMMode(rec, tier1)
        mode.__enter__()
        hooks.gate = mode.gate = StepGate(mode)
        _S.mode, _S.recorder, _S.hooks, _S.options = mode, rec, hooks, opts
        _S.thread = threading.get_ident()
        if not _S.atexit_registered:
            atexit.register(_at_exit)
            _S.atexit_registered = True


_TIER1_OPTS = ("strict_ieee", "fast_math", "eager_math", "compile_threshold", "compile_policy", "compile_async", "kernel_threads",
               "pool_results", "pool_soft_cap_mb", "pool_heap_trim_mb")
_tier1_by_opts: dict = {}


def forget_compiled() -> None:
    """Drop every tier-1 executor (run templates, kernels): the next enable() starts learning anew."""
    _tier1_by_opts.clear()
    if _S.mode is not None:
        _S.mode.tier1 = _make_tier1(_S.recorder, _S.options)


def _make_tier1(rec: Recorder, opts: Options) -> Tier1 | None:
    """The tier-1 executor for these options. What it learned (run templates, counters, compiled
    kernels) survives disable()/enable() in the process; only its transient state is reset."""
    if not (opts.jit and opts.record):
        rec.on_close = None
        return None
    key = tuple(getattr(opts, k) for k in _TIER1_OPTS)
    t1 = _tier1_by_opts.get(key)
    if t1 is None:
        t1 = _tier1_by_opts[key] = Tier1(rec, opts)
    else:
        t1.reset(rec, opts)
    rec.on_close = t1.block_closed
    return t1


def _apply(opts: Options) -> None:
    if opts.blocking and not _S.options.blocking:
        ms.runtime.launch_blocking()
    _S.recorder.opts = opts
    if (opts.c_hot_path, opts.record) != (_S.options.c_hot_path, _S.options.record):
        set_c_hot_path(opts.c_hot_path and opts.record)
    gate = _S.hooks.gate
    if gate.bare and not (opts.step_switch and opts.jit and opts.record):
        gate.step = None
        gate._to_vm()
    if any(getattr(opts, k) != getattr(_S.options, k) for k in ("jit", "record") + _TIER1_OPTS):
        _S.mode.tier1 = _make_tier1(_S.recorder, opts)
    if opts.cell_boundaries != _S.options.cell_boundaries:
        _S.hooks.uninstall()
        _S.hooks = Hooks(_S.recorder, opts.cell_boundaries)
        _S.hooks.install()
        _S.hooks.gate = gate
    _S.options = opts


def disable() -> bool:
    """Turn ms_dynvm off. Returns False if it was not on."""
    with _lock:
        if _S.mode is not None and _S.thread != threading.get_ident():
            _release_dead_owner()
            if _S.mode is None:
                return True
        if _S.mode is None:
            return False
        if _S.thread != threading.get_ident():
            raise RuntimeError("ms_dynvm was enabled on another thread; disable it there")
        if _S.recorder.recording is not None:
            raise RuntimeError("ms_dynvm.disable() inside a record() scope: leave the scope first")
        gate = _S.hooks.gate
        depth = _DispatchGuardStack.depth()
        if not gate.bare and depth > gate.stack_depth:
            # MindSpore's stack pops its top: that is a mode the script entered after enable().
            raise RuntimeError("ms_dynvm.disable() inside a dispatch mode entered after ms_dynvm.enable(): "
                               "leave that mode first")
        _S.recorder.close_block("end")
        if not gate.bare and depth == gate.stack_depth:  # (while bare the mode is already off the stack)
            _S.mode.__exit__(None, None, None)
        gate.bare = False
        _S.hooks.uninstall()
        _S.mode = _S.recorder = _S.hooks = _S.options = _S.thread = None
        return True


@contextlib.contextmanager
def enabled(**options):
    """`with ms_dynvm.enabled(**options):` enable for a scope, then restore the previous state."""
    prev = _S.options
    enable(**options)
    try:
        yield
    finally:
        if _S is not None:  # (None: a generator suspended in the scope, finalised at interpreter exit)
            if prev is None:
                disable()
            else:
                enable(**{f: getattr(prev, f) for f in prev.__dataclass_fields__})


@contextlib.contextmanager
def record(**options):
    """`with ms_dynvm.record() as rec: out = net(x)` records one Program of everything dispatched in
    the scope (see `Recording`). Enables ms_dynvm for the scope if it is not on."""
    if is_enabled() and _S.thread != threading.get_ident():
        with _lock:
            _release_dead_owner()  # (an owner thread that ended without disable() holds nothing)
        if is_enabled():
            raise RuntimeError("ms_dynvm is enabled on another thread: record() there, or disable it "
                               "there first")
    was_on = is_enabled()
    if not was_on:
        enable(**options)
    elif options:
        raise TypeError("record() takes options only when ms_dynvm is not already enabled")
    rec = Recording()
    mode = _S.mode
    gate = _S.hooks.gate
    bare = gate.bare  # a recording while bare (cost/step.py): the mode goes back on for its scope
    _S.recorder.begin_recording(rec)
    mode.serving = False
    if mode.tier1 is not None:
        mode.tier1.pending = None
    if bare:
        _DispatchGuardStack.push(mode)
        gate.bare = False
    try:
        yield rec
    finally:
        if _S is not None:  # (None: a generator suspended in the scope, finalised at interpreter exit)
            if bare and _S.mode is mode:
                gate.bare = True
                _DispatchGuardStack.pop()
            mode.serving = True
            _S.recorder.end_recording()
            if not was_on:
                disable()


def _at_exit() -> None:
    if _S.mode is not None and _S.thread == threading.get_ident():
        if _S.mode.tier1 is not None:
            # The last block closes now and may make a group hot: nothing is compiled any more
            # (gcc is refused at exit, and eager prints no warning there).
            _S.mode.tier1.exiting = True
        try:
            disable()
        except RuntimeError:  # a mode the script entered is still on the stack: leave it all be
            pass
