"""The recorder: turns the stream of dispatched ops into bytecode blocks.

It runs inside the dispatch handler for every op, so it is kept lean: one normalisation (a dict lookup
and a small function), one dict lookup per tensor operand, and the result types read off the tensors
MindSpore returned (authoritative; only the temporaries of a multi-instruction lowering are typed by the
registry's shape rules).

Tensor identity: MindSpore hands the handler a fresh Python wrapper for every tensor argument and
gives the user yet another wrapper for the result, so Python object identity (`is`, `id`, weakrefs)
says nothing. What survives is per-C++-tensor user data (`Tensor._set_user_data`): each result is
tagged `(epoch, Reg)`, where the epoch names the Program being recorded. A tensor without a tag of the
current epoch (an argument, a Parameter, a tensor made by indexing or construction, which MindSpore does
not dispatch) becomes a program input. A tensor written through `__setitem__` or an in-place op gets a
new register, so later uses read the new value.

Views: MindSpore CPU hands a non-view op a fresh contiguous copy of a view argument (made before the
handler runs, with no tag). The recorder keeps the last few view results of the block and links such an
untagged argument to a view result of the same dtype and shape whose elements are bit-identical (read
in place through the view's strides, spans of at most `_VIEW_LINK_MAX_BYTES`); equal bits mean the
register holds exactly the argument's value, so the link is exact, never a guess. An argument that matches none becomes an input, which is always correct.

Two modes:
- plain (`enable()`): each basic block is recorded into its own small Program, dropped when the block
  closes (only counters survive), so memory stays bounded however long the script runs; values from
  earlier blocks enter a block as inputs.
- recording (`with ms_dynvm.record() as rec:`): one Program for the whole scope, blocks kept, values
  flow between blocks; the input tensors are kept alive so `rec.inputs` can hand them back.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections import deque

import numpy as np
from mindspore import Parameter, Tensor

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Instr, Program
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.frontend import normalize as _norm
from ms_dynvm.metrics import METRICS

_META = _norm.META
_TMP = _norm.Tmp
_INPLACE = _norm.INPLACE
_mutated = _norm.mutated_tensor
_normalize = _norm.normalize
_OPS = opcodes.OPS
_VIEW = opcodes.VIEW
_KEY = "ms_dynvm"  # user-data key on MindSpore tensors: (epoch, Reg)
_PKEY = "ms_dynvm.param"  # user-data key: a Parameter's name


def tag_parameters(cell) -> None:
    """Tag the Parameters of `cell` (once per cell) so that recorded inputs can name them."""
    if cell.__dict__.get("_ms_dynvm_tagged"):
        return
    for name, p in cell.parameters_and_names():
        p._set_user_data(_PKEY, name)
    cell.__dict__["_ms_dynvm_tagged"] = True
_VIEW_LINK_MAX_BYTES = 1 << 22
_VIEW_CANDIDATES = 8
# Results of these ops may be views of their input in MindSpore (split/unstack give views too).
_VIEW_LIKE = _VIEW | {"split", "unstack"}
_epochs = iter(range(1, 1 << 62))

_vm_dtype = _norm.vm_dtype

# (id(MindSpore dtype), shape, contiguous) -> TensorType: types repeat, and building a frozen,
# validated TensorType costs more than the lookup.
_TYPES: dict = {}


def tensor_type(t, contiguous: bool | None = None) -> TensorType:
    """TensorType of a MindSpore tensor (dtype, shape, layout class). Pass `contiguous=True` for the
    result of a non-view kernel (MindSpore kernels write contiguous results) to skip the query."""
    dt = t.dtype
    shape = t.shape
    if contiguous is None:
        contiguous = t.is_contiguous()
    key = (id(dt), shape, contiguous)
    ty = _TYPES.get(key)
    if ty is None:
        ty = TensorType(_vm_dtype(dt), tuple(shape), "contiguous" if contiguous else "strided")
        if len(_TYPES) > 65536:
            _TYPES.clear()
        _TYPES[key] = ty
    return ty


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _element_bytes(t, shape):
    """The elements of host tensor `t` (any strides) as unsigned integers of the same width, read in
    place through its data pointer, so that equal arrays mean bit-identical values (NaNs included).
    None when `t` is too large to compare cheaply or of an unusual element width."""
    itemsize = t._itemsize
    uint = _UINT.get(itemsize)
    if uint is None:
        return None
    if 0 in shape:
        return np.empty(shape, uint)
    strides = t.stride()
    span = sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    if span * itemsize > _VIEW_LINK_MAX_BYTES or min(strides, default=0) < 0:
        return None
    buf = (ctypes.c_char * (span * itemsize)).from_address(t._data_ptr())
    base = np.frombuffer(buf, dtype=uint)
    return np.lib.stride_tricks.as_strided(base, shape=shape,
                                           strides=[s * itemsize for s in strides])


def _flat_tensors(obj, out: list) -> list:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _flat_tensors(x, out)
    return out


class Recording:
    """What `ms_dynvm.record()` yields. After the `with` block: `program` (a bytecode Program),
    `inputs` (the MindSpore tensors entering it, Parameters included, in program input order) and
    `outputs` (every tensor the program's instructions made, in register order, matching
    `program.outputs`; they hold their values as of the end of the recording)."""

    def __init__(self) -> None:
        self.program: Program | None = None
        self.inputs: list = []
        self.outputs: list = []
        self.errors: list = []  # recorder failures inside the scope ("name: error")
        self._epoch = None

    def reg_of(self, tensor):
        """The register holding `tensor`'s value at the end of the recording, or None."""
        tag = tensor._get_user_data(_KEY)
        if tag is not None and tag[0] == self._epoch:
            return tag[1]
        return None

    def output_index(self, tensor) -> int:
        """Index of `tensor`'s value in `outputs` (and in `interpret(program, ...)`'s result)."""
        r = self.reg_of(tensor)
        if r is None or int(r) not in self.program.outputs:
            raise ValueError("tensor is not an output of this recording")
        return self.program.outputs.index(int(r))


class Recorder:
    @property
    def opts(self):
        return self._opts

    @opts.setter
    def opts(self, opts) -> None:
        self._opts = opts
        self._max_block_ops = opts.max_block_ops
        self._record = opts.record

    def __init__(self, opts) -> None:
        self.opts = opts
        self.last_op = None
        self.on_close = None  # callback(reason) before a block closes (tier 1 ends its run there)
        self.phase = "fwd"
        self.region = ""
        self.recording: Recording | None = None
        self._block_count = 0
        self._new_program()

    # --- program and block management -----------------------------------------------------------
    def _new_program(self) -> None:
        self.program = Program()
        self.block = None
        self.epoch = next(_epochs)
        self._views: deque = deque(maxlen=_VIEW_CANDIDATES)  # (tensor, Reg, dtype, shape)
        self._results: list = []  # record mode: every result tensor, kept alive for rec.outputs

    def _open_block(self):
        b = self.block
        if b is None:
            b = self.block = self.program.new_block(self.phase, self.region)
        return b

    def close_block(self, reason: str) -> None:
        if self.on_close is not None:
            self.on_close(reason)
        b = self.block
        if b is None:
            return
        self.block = None
        b.end = reason
        if b.instrs:
            METRICS.blocks += 1
            METRICS.block_ends[reason] += 1
            self._block_count += 1
            if self.opts.debug or self.opts.dump_dir:
                self._debug_block(b)
        if self.recording is None:
            self._new_program()

    def _debug_block(self, b) -> None:
        from ms_dynvm.ir.verifier import verify_program

        prog = self.program
        if self.recording is not None:
            # A block-local view: the full program is verified when the recording ends.
            return
        if self.opts.debug >= 1:
            verify_program(prog)
        if self.opts.debug >= 2:
            print(f"[ms_dynvm] block {self._block_count} ({b.phase}, end={b.end})\n{prog.as_text()}",
                  file=sys.stderr)
        if self.opts.debug >= 3:
            from ms_dynvm.ir.function import Function

            print(Function.from_block(prog, b.id, outputs=[r for i in b.instrs for r in i.outs]),
                  file=sys.stderr)
        if self.opts.dump_dir:
            os.makedirs(self.opts.dump_dir, exist_ok=True)
            prog.save(os.path.join(self.opts.dump_dir, f"block_{self._block_count}.dvm"))

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.close_block("phase")
            self.phase = phase

    def enter_region(self, name: str) -> None:
        self.close_block("cell")
        self.region = name

    def exit_region(self) -> None:
        self.close_block("cell")
        self.region = ""

    def sync(self, reason: str) -> None:
        METRICS.sync_points[reason] += 1
        self.close_block("sync")

    def forget(self, tensor) -> None:
        """`tensor` was written in place by code the hook does not see: its value is new."""
        tensor._set_user_data(_KEY, None)

    # --- recording ------------------------------------------------------------------------------
    def _reg_of(self, t):
        tag = t._get_user_data(_KEY)
        if tag is not None and tag[0] == self.epoch:
            return tag[1]
        ty = tensor_type(t)
        if self._views:
            r = self._link_view(t, ty)
            if r is not None:
                return r
        # The handler sees Parameters as plain Tensors: their names come from the tag that
        # `tag_parameters` put on the C++ tensor.
        pname = t._get_user_data(_PKEY)
        if pname is not None:
            kind, name = "param", pname
        elif isinstance(t, Parameter):
            kind, name = "param", t.name
        else:
            kind, name = "tensor", ""
        r = self.program.add_input(ty, kind, name)
        t._set_user_data(_KEY, (self.epoch, r))
        if self.recording is not None:
            self.recording.inputs.append(t)
        return r

    def _link_view(self, t, ty):
        """Register of a recent view result holding exactly `t`'s values, or None (see module doc)."""
        arg_bytes = None
        for view, reg, dtype, shape in reversed(self._views):
            if dtype != ty.dtype or shape != ty.shape:
                continue
            if arg_bytes is None:
                arg_bytes = _element_bytes(t, ty.shape)
                if arg_bytes is None:
                    return None
            view_bytes = _element_bytes(view, shape)
            if view_bytes is not None and np.array_equal(arg_bytes, view_bytes):
                t._set_user_data(_KEY, (self.epoch, reg))
                return reg
        return None

    def _bind(self, t, reg) -> None:
        t._set_user_data(_KEY, (self.epoch, reg))
        if self.recording is not None:
            self._results.append(t)

    def on_op(self, name: str, args: tuple, out) -> None:
        """Called after the op ran eagerly with `out` as its result. Afterwards `last_op` is
        (block, first instruction index, end index, result registers) of what was recorded for it, or
        None when nothing was (meta op, opaque call, count-only mode)."""
        self.last_op = None
        m = METRICS
        m.ops_seen += 1
        m.ops_by_name[name] += 1
        m.ops_by_phase[self.phase] += 1
        low = _normalize(name, args)
        if low is _META:
            m.ops_meta[name] += 1
            return
        if not self._record:
            if low is None:
                m.ops_opaque[name] += 1
            return
        if low is None:
            self._record_call(name, args, out)
            return
        instrs = low.instrs
        if len(instrs) == 1 and len(low.outputs) == 1 and type(out) is Tensor:
            self._record_one(instrs[0], out, name, args)
            return
        outs = out if isinstance(out, (tuple, list)) else (out,)
        final = {}
        for k, tmp in enumerate(low.outputs):
            final[(tmp.index, tmp.out)] = outs[k]
        block = self._open_block()
        prog = self.program
        start = len(block.instrs)
        results = []
        for i, (op, operands, attrs) in enumerate(low.instrs):
            regs = []
            for a in operands:
                if isinstance(a, Tensor):
                    regs.append(self._reg_of(a))
                elif isinstance(a, _TMP):
                    regs.append(results[a.index][a.out])
                else:
                    regs.append(a)
            n_out = _OPS[op].n_out
            types = None
            if n_out >= 0:
                types = []
                for j in range(n_out):
                    t = final.get((i, j))
                    if t is None:
                        types = None
                        break
                    types.append(tensor_type(t))
            if types is None:
                types = self._infer(op, regs, attrs)
            results.append(prog.emit(block, op, regs, attrs, types))
        for k, tmp in enumerate(low.outputs):
            t = outs[k]
            if isinstance(t, Tensor):
                reg = results[tmp.index][tmp.out]
                self._bind(t, reg)
                if low.instrs[tmp.index][0] in _VIEW_LIKE:
                    ty = prog.types[int(reg)]
                    self._views.append((t, reg, ty.dtype, ty.shape))
        self.last_op = (block, start, len(block.instrs),
                        tuple(int(results[t.index][t.out]) for t in low.outputs))
        if name in _INPLACE and low.outputs:
            target = _mutated(name, args)
            if target is not None:
                first = low.outputs[0]
                self._bind(target, results[first.index][first.out])
        m.ops_recorded += 1
        m.instrs += len(low.instrs)
        if len(block.instrs) >= self._max_block_ops:
            self.close_block("limit")

    def _record_one(self, instr, out, name, args) -> None:
        """The common case: one VM instruction with one result, which is `out`."""
        op, operands, attrs = instr
        regs = [self._reg_of(a) if isinstance(a, Tensor) else a for a in operands]
        block = self.block
        if block is None:
            block = self._open_block()
        prog = self.program
        r = prog._n
        start = len(block.instrs)
        is_view = op in _VIEW
        ty = tensor_type(out, None if is_view else True)
        prog.types[r] = ty
        prog._n = r + 1
        block.instrs.append(Instr(op, tuple(regs), attrs, (r,)))
        reg = Reg(r)
        out._set_user_data(_KEY, (self.epoch, reg))
        if self.recording is not None:
            self._results.append(out)
        if is_view:
            self._views.append((out, reg, ty.dtype, ty.shape))
        self.last_op = (block, start, start + 1, (r,))
        if name in _INPLACE:
            target = _mutated(name, args)
            if target is not None:
                self._bind(target, reg)
        m = METRICS
        m.ops_recorded += 1
        m.instrs += 1
        if len(block.instrs) >= self._max_block_ops:
            self.close_block("limit")

    def _infer(self, op, regs, attrs):
        from ms_dynvm.bytecode.text import Reg
        from ms_dynvm.ir import registry

        types = self.program.types
        arg_types = [types[int(r)] if isinstance(r, Reg) else r for r in regs]
        return registry.infer(op, arg_types, attrs)

    def _record_call(self, name: str, args: tuple, out) -> None:
        """An op the VM does not model: one opaque `call` over its tensor arguments, ending the block."""
        METRICS.ops_opaque[name] += 1
        block = self._open_block()
        regs = [self._reg_of(t) for t in _flat_tensors(args, [])]
        res = _flat_tensors(out, [])
        types = [tensor_type(t) for t in res]
        outs = self.program.emit(block, "call", regs, {"target": name}, types)
        for t, r in zip(res, outs):
            self._bind(t, r)
        if name in _INPLACE and outs:
            target = _mutated(name, args)
            if target is not None:
                self._bind(target, outs[0])
        METRICS.ops_recorded += 1
        METRICS.instrs += 1
        self.close_block("call")

    def on_error(self, name: str, exc: BaseException) -> None:
        """The recorder failed on an op that ran fine: count it and start a new block, so that the
        recorded program never contains a half-recorded op's consumers with a missing producer."""
        METRICS.record_errors[f"{name}: {type(exc).__name__}"] += 1
        if self.block is not None and self.recording is None:
            self.close_block("error")
        elif self.recording is not None:
            self.recording.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            self.close_block("error")

    # --- record() scopes --------------------------------------------------------------------------
    def begin_recording(self, rec: Recording) -> None:
        if self.recording is not None:
            raise RuntimeError("ms_dynvm.record() scopes do not nest")
        self.close_block("end")
        self._new_program()
        self.recording = rec
        METRICS.recordings += 1

    def end_recording(self) -> Recording:
        rec = self.recording
        self.close_block("end")
        prog = self.program
        # The latest tag of each result tensor says which register it holds now (a tensor written in
        # place holds a newer value than its first register).
        by_reg = {}
        for t in self._results:
            tag = t._get_user_data(_KEY)
            if tag is not None and tag[0] == self.epoch:
                by_reg.setdefault(int(tag[1]), t)
        prog.outputs = sorted(by_reg)
        rec.program = prog
        rec.outputs = [by_reg[r] for r in prog.outputs]
        rec._epoch = self.epoch
        self.recording = None
        self._new_program()
        return rec
