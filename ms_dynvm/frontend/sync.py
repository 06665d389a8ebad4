"""Hooks on what MindSpore does not dispatch but a recorder must know about.

- Sync points: Tensor methods that hand a value to Python (`asnumpy`, `item`, `tolist`, `__bool__`,
  `__float__`, `__int__`, `__index__`, `__array__`, `__repr__`, `__str__`, `data_ptr`) and indexing
  (`__getitem__`, `__setitem__`: MindSpore runs basic indexing without dispatching it). Each closes the
  current basic block. `__setitem__` also writes its tensor in place, so the recorder forgets that
  tensor's register (a later use reads the new value as a fresh input).
- Writes that are not dispatched: `Tensor.assign_value`, `Parameter.set_data` (sync points, then the
  tensor is forgotten, as for `__setitem__`); and graph-mode calls, `_JitExecutor.__call__` (a
  `@jit` function or Cell, such as every nn optimizer's construct): none of their ops is dispatched
  and they may update their inputs in place, so they are sync points before and after.
- Phase: `_PyNativeExecutor.grad` runs the backward pass; wrapping it tells forward from backward.
- Mixed precision: `_PyNativeExecutor.set_mixed_precision_type` pushes and pops MindSpore's stack of
  Cell mixed-precision types (`to_float`, amp O2/O3); the recorder mirrors it (`Recorder.mix_event`),
  as MindSpore casts a legacy primitive's float inputs to the type on top without dispatching the cast.
- Regions: `nn.Cell.__call__` boundaries (see the `cell_boundaries` option).
- Steps: every outermost Cell call and backward pass is a region start for the step switch
  (`dispatch.StepGate`, `cost/step.py`), also with `cell_boundaries="none"`; while a step runs bare
  (ms_dynvm's dispatch mode off the stack), the hooks call straight through. Until the first region
  start, sync points outside any region delimit the steps (`StepGate.sync_point`).

Hooks are installed once per `enable()` and removed by `disable()`. They act only for the thread that
called `enable()` (MindSpore's dispatch-mode stack is per thread, so ops from other threads are not
seen either); on other threads they call straight through. What a hook asks of the recorder never raises into the
script: a failure there is counted in `record_errors` (`_safe`), and the user's call goes on.
"""

from __future__ import annotations

import functools
import sys
import threading

from mindspore import Parameter, Tensor, nn

from ms_dynvm.frontend.recorder import tag_parameters

try:  # MindSpore 2.9+ moved it; the old path still works with a deprecation warning.
    from mindspore.graph.api import _PyNativeExecutor
except ImportError:  # pragma: no cover
    from mindspore.common.api import _PyNativeExecutor
try:
    from mindspore.graph.api import _JitExecutor
except ImportError:  # pragma: no cover
    try:
        from mindspore.common.api import _JitExecutor
    except ImportError:
        _JitExecutor = None

_MISSING = object()

SYNC_METHODS = ("asnumpy", "item", "tolist", "__bool__", "__float__", "__int__", "__index__",
                "__array__", "__repr__", "__str__", "data_ptr", "__getitem__")


def _safe(rec, where: str, fn, *args) -> None:
    """`fn(*args)`, a recorder call made by a hook: a failure of ms_dynvm's bookkeeping is counted
    (the recorder starts a new block) and never reaches the script."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        try:
            rec.on_error(where, e)
        except Exception:  # noqa: BLE001 - counting failed too: the script still goes on
            pass


def _mixed_cells(frame):
    """The Cells with a mixed-precision type whose `_complex_call` is running in `frame` or the
    frames below it, innermost first (each one's `_call_pre_process` pushed its type onto
    MindSpore's stack before `construct`)."""
    code = getattr(getattr(nn.Cell, "_complex_call", None), "__code__", None)
    while code is not None and frame is not None:
        if frame.f_code is code:
            cell = frame.f_locals.get("self")
            if getattr(cell, "mixed_precision_type", None) is not None:
                yield cell
        frame = frame.f_back


def mixed_types_entered() -> list:
    """The mixed-precision types MindSpore has pushed for the Cells this thread is calling right
    now, outermost first. MindSpore has no getter for its stack; this lets an `enable()` made inside
    such a Cell start from it. (A type left pushed by a Cell whose construct raised, which
    MindSpore never pops, is not seen.)"""
    return [c.mixed_precision_type for c in reversed(list(_mixed_cells(sys._getframe(1))))]


def mixed_types_entered_elsewhere() -> int:
    """How many mixed-precision types Cells being called on other threads have pushed (MindSpore's
    stack is one per process), as `mixed_types_entered` finds them."""
    me = threading.get_ident()
    return sum(len(list(_mixed_cells(f))) for ident, f in sys._current_frames().items() if ident != me)


class Hooks:
    def __init__(self, recorder, cell_boundaries: str) -> None:
        self.recorder = recorder
        self.thread = threading.get_ident()
        self.cell_boundaries = cell_boundaries
        self._saved: list = []
        self._cell_depth = 0
        self.gate = None  # dispatch.StepGate: steps under the VM or bare (cost/step.py)
        self.regions = None  # regions.Regions: tier 2 (set by regions.install)

    def _patch(self, owner, name: str, wrapper) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return
        # Inherited methods (TensorPy's C slots) are shadowed on the subclass and deleted again.
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, functools.wraps(orig)(wrapper(orig)))

    def install(self) -> None:
        rec, me = self.recorder, self.thread
        hooks = self

        for name in SYNC_METHODS:
            def make(orig, reason=name):
                def sync_hook(self, *a, **k):
                    if reason == "__getitem__" and hooks.regions is not None and hooks.regions.cells is not None \
                            and threading.get_ident() == me and len(a) == 1 and not k:
                        # Inside a region being learned, basic indexing is an op of the program.
                        out = orig(self, *a)
                        try:
                            ok = rec.record_getitem(self, a[0], out)
                        except Exception as e:  # noqa: BLE001 - a sync point then, as always
                            ok = False
                            rec.on_error(reason, e)
                        if not ok:
                            _safe(rec, reason, rec.sync, reason)
                        return out
                    if threading.get_ident() == me:
                        gate = hooks.gate
                        if gate is not None and gate.bare:
                            if not gate.depth:  # (sync points inside a step's Cells are its own)
                                gate.bare_sync()
                        else:
                            _safe(rec, reason, rec.sync, reason)
                            if gate is not None and gate.anchor is None and not gate.depth:
                                gate.sync_point()  # steps from sync point to sync point (no region yet)
                    return orig(self, *a, **k)
                return sync_hook
            self._patch(Tensor, name, make)

        # Writes MindSpore does not dispatch (setitem, assign_value, set_data): a sync point (a fused
        # group being served stops there: its kernel read the old value), then the tensor's value is
        # new. (Inside a bare step too: the tensor may carry a tag or a token of before it.)
        def make_writer(orig, reason):
            def writer_hook(self, *a, **k):
                if threading.get_ident() == me:
                    _safe(rec, reason, rec.sync, reason)
                    _safe(rec, reason, rec.before_write, self)
                    out = orig(self, *a, **k)
                    _safe(rec, reason, rec.forget, self)
                    return out
                return orig(self, *a, **k)
            return writer_hook
        for owner, name in ((Tensor, "__setitem__"), (Tensor, "assign_value"), (Parameter, "set_data")):
            self._patch(owner, name, lambda orig, reason=name: make_writer(orig, reason))

        # A jit function or Cell (nn optimizers' construct is one) runs as a graph: none of its ops
        # is dispatched, and it may update its inputs in place (an optimizer's Parameters). A sync
        # point before it (a group being served stops: its kernel read the old values) and after
        # it (the Program is dropped: no register holds a value from before the call).
        def make_jit(orig):
            def jit_hook(executor, *a, **k):
                if threading.get_ident() != me:
                    return orig(executor, *a, **k)
                gate = hooks.gate
                if gate is not None and gate.bare:
                    return orig(executor, *a, **k)
                _safe(rec, "jit", rec.sync, "jit")
                _safe(rec, "jit", rec.before_graph_call)
                try:
                    return orig(executor, *a, **k)
                finally:
                    _safe(rec, "jit", rec.after_graph_call)
                    _safe(rec, "jit", rec.sync, "jit")
            return jit_hook
        if _JitExecutor is not None:
            self._patch(_JitExecutor, "__call__", make_jit)

        def make_grad(orig):
            def vm_grad(a, k):
                prev = rec.phase
                _safe(rec, "grad", rec.set_phase, "bwd")
                try:
                    return orig(*a, **k)
                finally:
                    _safe(rec, "grad", rec.set_phase, prev)

            def grad_hook(*a, **k):
                if threading.get_ident() != me:
                    return orig(*a, **k)
                gate = hooks.gate
                if gate is None:
                    return vm_grad(a, k)
                if not gate.depth:
                    # (executor, obj, grad, weights, grad_position, has_aux, *args)
                    gate.region_start(a[1] if len(a) > 1 else None, a[6:], True)
                gate.depth += 1
                try:
                    return orig(*a, **k) if gate.bare else vm_grad(a, k)
                finally:
                    gate.depth -= 1
            return grad_hook
        self._patch(_PyNativeExecutor, "grad", make_grad)

        def make_mix(orig):
            def mix_hook(executor, mixed_precision_type, is_push=True):
                out = orig(executor, mixed_precision_type, is_push)
                # (MindSpore's stack is one per process: other threads' Cells count too)
                _safe(rec, "mixed precision", rec.mix_event, mixed_precision_type, is_push,
                      threading.get_ident() != me)
                return out
            return mix_hook
        self._patch(_PyNativeExecutor, "set_mixed_precision_type", make_mix)

        top_only = self.cell_boundaries == "top"
        no_bounds = self.cell_boundaries == "none"

        def make_call(orig):
            def vm_call(cell, a, k):
                outer = rec.region
                _safe(rec, "Cell", tag_parameters, cell)
                _safe(rec, "Cell", rec.enter_region, type(cell).__name__)
                hooks._cell_depth += 1
                try:
                    return orig(cell, *a, **k)
                finally:
                    hooks._cell_depth -= 1
                    _safe(rec, "Cell", rec.exit_region)
                    rec.region = outer

            def cell_call_hook(cell, *a, **k):
                if threading.get_ident() != me:
                    return orig(cell, *a, **k)
                regions = hooks.regions
                if regions is not None:
                    if regions.cells is not None:
                        regions.note_cell(cell)
                        if regions.is_optimizer(cell) and not k:
                            return regions.optimizer_in_recording(cell, a, lambda: hooked_call(cell, a, k))
                    elif not k and not regions.depth and (not hooks._cell_depth or regions.is_optimizer(cell)):
                        return regions.cell_call(cell, a, lambda: hooked_call(cell, a, k))
                return hooked_call(cell, a, k)

            def hooked_call(cell, a, k):
                gate = hooks.gate
                if gate is not None:
                    if not gate.depth:
                        gate.region_start(cell, a)
                    gate.depth += 1
                try:
                    if (top_only and hooks._cell_depth) or no_bounds or (gate is not None and gate.bare):
                        hooks._cell_depth += 1
                        try:
                            return orig(cell, *a, **k)
                        finally:
                            hooks._cell_depth -= 1
                    return vm_call(cell, a, k)
                finally:
                    if gate is not None:
                        gate.depth -= 1
            return cell_call_hook
        self._patch(nn.Cell, "__call__", make_call)
        from ms_dynvm.frontend import regions as _regions

        _regions.install(self)

    def uninstall(self) -> None:
        if self.regions is not None:
            from ms_dynvm.frontend import regions as _regions

            _regions.uninstall()
            self.regions = None
        while self._saved:
            owner, name, orig = self._saved.pop()
            if orig is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, orig)
