"""The recorder: turns the stream of dispatched ops into bytecode blocks.

It runs inside the dispatch handler for every op, right after MindSpore ran it, when MindSpore's worker
threads are still spinning on the machine's cores and its kernels have evicted the caches: every
Python operation and every call into MindSpore's C++ (`_get_user_data`, `_set_user_data`, `_dtype`,
`_shape` ...) costs several times what it costs in a tight loop. So the common case (a lowering of one
instruction whose one result is the op's result) is inlined in `on_op`: the normalisation table's
handler called directly (`normalize.lower`'s bare `(op, operands, attrs)` triple, no Lowering), one
user-data read per tensor operand, the result type read off the tensor MindSpore returned
(authoritative, cached per (dtype, shape, layout)), one user-data write; op counts are batched
(`Metrics.flush_ops`). Lowerings of several instructions type their temporaries with the registry's
shape rules.

Garbage: the instructions are stored as exact tuples of atomic values (`Block.append_raw`), which the
collector stops tracking at its first passes, and tags are `(epoch, int)` tuples: an `Instr` or a `Reg`
per instruction would stay tracked in the oldest generation and bring on full collections (tens of ms
each, a walk over every object of the process) every few thousand ops of a long block.

Tensor identity: MindSpore hands the handler a fresh Python wrapper for every tensor argument and
gives the user yet another wrapper for the result, so Python object identity (`is`, `id`, weakrefs)
says nothing. What survives is per-C++-tensor user data (`Tensor._set_user_data`): each result is
tagged `(epoch, register number)`, where the epoch names the Program being recorded. A tensor without
a tag of the current epoch (an argument, a Parameter, a tensor made by indexing or construction, which
MindSpore does not dispatch) becomes a program input. A tensor written through `__setitem__` or an in-place op gets a
new register, so later uses read the new value.

Views: MindSpore CPU hands a non-view op a fresh contiguous copy of a view argument (made before the
handler runs, with no tag). The recorder keeps the last few view results of the block and links such an
untagged argument to a view result of the same dtype and shape whose elements are bit-identical (read
in place through the view's strides, spans of at most `_VIEW_LINK_MAX_BYTES`); equal bits mean the
register holds exactly the argument's value, so the link is exact, never a guess. An argument that
matches none becomes an input, which is always correct. (Compared with memcmp where both are
row-major, element 0 first otherwise; a view's layout is computed once.)

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
from mindspore._c_expression import TensorPy

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.program import Input, Program
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.frontend import normalize as _norm
from ms_dynvm.metrics import METRICS

_META = _norm.META
_TMP = _norm.Tmp
_INPLACE = _norm.INPLACE
_IN_ORDER = _norm.TENSOR_ARGS_IN_ORDER
_mutated = _norm.mutated_tensor
_TABLE = _norm._TABLE
_REJECT = _norm._REJECT
_Lowering = _norm.Lowering
_OUT1 = (_norm.Tmp(0),)
_OPS = opcodes.OPS
_VIEW = opcodes.VIEW
_KEY = "ms_dynvm"  # user-data key on MindSpore tensors: (epoch, register number)
_PKEY = "ms_dynvm.param"  # user-data key: a Parameter's name
_is_contiguous = TensorPy.is_contiguous  # what Tensor.is_contiguous calls, without the wrapper
_FLUSH_NAMES = 4096  # pending op counts folded into METRICS from this many (checked at block ends, meta ops)


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


def _new_type(dt, shape, contiguous: bool) -> TensorType:
    ty = TensorType(_vm_dtype(dt), tuple(shape), "contiguous" if contiguous else "strided")
    if len(_TYPES) > 65536:
        _TYPES.clear()
    _TYPES[(id(dt), shape, contiguous)] = ty
    return ty


def tensor_type(t, contiguous: bool | None = None) -> TensorType:
    """TensorType of a MindSpore tensor (dtype, shape, layout class). Pass `contiguous=True` for the
    result of a non-view kernel (MindSpore kernels write contiguous results) to skip the query.
    (`_dtype`/`_shape` are what the `dtype`/`shape` properties return, without the wrapper.)"""
    dt = t._dtype
    shape = t._shape
    if contiguous is None:
        contiguous = _is_contiguous(t)
    ty = _TYPES.get((id(dt), shape, contiguous))
    if ty is None:
        ty = _new_type(dt, shape, contiguous)
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


try:
    _memcmp = ctypes.CDLL(None).memcmp
    _memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    _memcmp.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - no libc symbols in the process
    _memcmp = None

_EMPTY = object()  # `_layout` of a tensor with no elements


_C_STRIDES: dict = {}  # shape -> row-major strides (in elements), as Tensor.stride() gives them


def _c_strides(shape) -> list:
    out = _C_STRIDES.get(shape)
    if out is None:
        out, acc = [], 1
        for d in reversed(shape):
            out.append(acc)
            acc *= d
        out.reverse()
        if len(_C_STRIDES) > 4096:
            _C_STRIDES.clear()
        _C_STRIDES[shape] = out
    return out


_NOT_COMPARABLE = object()


def _layout(t, shape, c_strides):
    """How `_element_bytes(t, shape)` would see `t`, without reading its data: `_NOT_COMPARABLE`
    (it would be None), `_EMPTY`, or `(span in bytes, itemsize, strides)`, strides None when they
    are exactly the row-major `c_strides` (the elements are then the span's bytes, in order). A
    tensor's itemsize and strides do not change, so a view's layout is computed once; its data
    pointer is read at each comparison."""
    itemsize = t._itemsize
    if itemsize not in _UINT:
        return _NOT_COMPARABLE
    if 0 in shape:
        return _EMPTY
    strides = t.stride()
    if strides == c_strides:
        nbytes = (shape[0] * c_strides[0] if shape else 1) * itemsize
        if nbytes > _VIEW_LINK_MAX_BYTES:
            return _NOT_COMPARABLE
        return (nbytes, itemsize, None)
    span = sum((d - 1) * s for d, s in zip(shape, strides)) + 1
    if span * itemsize > _VIEW_LINK_MAX_BYTES or min(strides, default=0) < 0:
        return _NOT_COMPARABLE
    return (span * itemsize, itemsize, strides)


def _strided_array(ptr: int, layout, shape):
    """The elements as unsigned ints, read in place (= `_element_bytes`)."""
    nbytes, itemsize, strides = layout
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    return np.ndarray(shape, _UINT[itemsize], buf, 0,
                      None if strides is None else [s * itemsize for s in strides])


def _same_elements(a, pa: int, b, pb: int, shape) -> bool:
    """`np.array_equal(_element_bytes(ta, shape), _element_bytes(tb, shape))` (bit-identical
    elements) for tensors of layouts `a`, `b` (`_layout`, comparable) and data pointers `pa`, `pb`:
    the same memory in the same layout; two row-major tensors: one memcmp; else element 0 (at the
    data pointer of both) first, then NumPy."""
    if a is _EMPTY or b is _EMPTY:
        return a is b
    if pa == pb and a == b:
        return True
    if _memcmp is not None:
        if a[2] is None and b[2] is None:
            return a[0] == b[0] and _memcmp(pa, pb, a[0]) == 0
        if _memcmp(pa, pb, a[1]) != 0:
            return False
    return bool((_strided_array(pa, a, shape) == _strided_array(pb, b, shape)).all())


def _flat_tensors(obj, out: list) -> list:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _flat_tensors(x, out)
    return out


def _read_tags(args, out) -> tuple:
    """(tags of the top-level tensor arguments, tags of the tensor results), read off the tensors:
    what `Recorder.last_tags` holds (the legacy `(prim, name, inputs)` form is unwrapped)."""
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple:
        args = args[2]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return ([a._get_user_data(_KEY) for a in args if isinstance(a, Tensor)],
            [o._get_user_data(_KEY) for o in outs if isinstance(o, Tensor)])


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
            return Reg(tag[1])
        return None

    def output_index(self, tensor) -> int:
        """Index of `tensor`'s value in `outputs` (and in `interpret(program, ...)`'s result)."""
        r = self.reg_of(tensor)
        if r is None or int(r) not in self.program.outputs:
            raise ValueError("tensor is not an output of this recording")
        return self.program.outputs.index(int(r))


class Recorder:
    """Per op, `on_op` leaves for tier 1:
    - `last_op`: (block, first instruction index, end index, result register numbers) of what was
      recorded, or None when nothing was (meta op, opaque call, count-only mode);
    - `last_tags`, only while `want_tags` is true (tier 1 sets it), and only when `last_op` is not
      None: (arg_tags, out_tags), two lists: the recorder tag `(epoch, register number)` (or None) of
      every top-level tensor argument (legacy `(prim, name, inputs)` form: of `inputs`) and of every
      tensor result, as they stand after the op was recorded; exactly
      `[t._get_user_data("ms_dynvm") for t in ...]`, without reading them again. Else None.

    Block instructions are appended in the compact form (`Block.append_raw`); `Block.op_names`
    reads their op names without making Instr objects."""

    @property
    def opts(self):
        return self._opts

    @opts.setter
    def opts(self, opts) -> None:
        self._opts = opts
        self._max_block_ops = opts.max_block_ops
        self._last_index = opts.max_block_ops - 1  # an instruction at this index closes the block
        self._record = opts.record

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        # Ops are counted per phase in batches (METRICS.op_names): close the batch of the old phase.
        METRICS.flush_ops()
        METRICS.op_names_phase = phase
        self._phase = phase

    def __init__(self, opts) -> None:
        self.opts = opts
        self.last_op = None
        self.last_tags = None
        self.want_tags = False
        self.on_close = None  # callback(reason) before a block closes (tier 1 ends its run there)
        self.phase = "fwd"
        self.region = ""
        self.recording: Recording | None = None
        self._block_count = 0
        # Counted in batches (see Metrics.flush_ops): every op seen, and the ops recorded as one
        # instruction by on_op's common case.
        self._names = METRICS.op_names
        self._one_instr = METRICS.one_instr_ops
        self._new_program()

    # --- program and block management -----------------------------------------------------------
    def _new_program(self) -> None:
        self.program = Program()
        self.block = None
        self.epoch = next(_epochs)
        # [tensor, reg, dtype, shape, layout (`_layout`, once compared)]
        self._views: deque = deque(maxlen=_VIEW_CANDIDATES)
        self._results: list = []  # record mode: every result tensor, kept alive for rec.outputs

    def _open_block(self):
        b = self.block
        if b is None:
            b = self.block = self.program.new_block(self._phase, self.region)
        return b

    def close_block(self, reason: str) -> None:
        if self.on_close is not None:
            self.on_close(reason)
        if len(self._names) >= _FLUSH_NAMES:
            METRICS.flush_ops()
        b = self.block
        if b is None:
            return
        self.block = None
        b.end = reason
        if b.num_instrs():
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
        if phase != self._phase:
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
    def _reg_of(self, t) -> int:
        tag = t._get_user_data(_KEY)
        if tag is None or tag[0] != self.epoch:
            tag = self._input_tag(t)
        return tag[1]

    def _input_tag(self, t) -> tuple:
        """`t` holds no register of this program: link it to a view result or make it an input.
        Returns its new tag."""
        ty = tensor_type(t)
        if self._views:
            tag = self._link_view(t, ty)
            if tag is not None:
                return tag
        # The handler sees Parameters as plain Tensors: their names come from the tag that
        # `tag_parameters` put on the C++ tensor.
        pname = t._get_user_data(_PKEY)
        if pname is not None:
            kind, name = "param", pname
        elif isinstance(t, Parameter):
            kind, name = "param", t.name
        else:
            kind, name = "tensor", ""
        prog = self.program
        r = prog._n  # = prog.next_reg(): the recorder allocates every register of its programs
        prog._n = r + 1
        prog.types[r] = ty
        prog.inputs.append(Input(r, kind, name))
        tag = (self.epoch, r)
        t._set_user_data(_KEY, tag)
        if self.recording is not None:
            self.recording.inputs.append(t)
        return tag

    def _link_view(self, t, ty):
        """Tag of a recent view result holding exactly `t`'s values (now also `t`'s tag), or None
        (see module doc)."""
        shape = ty.shape
        dtype = ty.dtype
        arg = None
        for entry in reversed(self._views):
            view, reg, vdtype, vshape, vlayout = entry
            if vdtype != dtype or vshape != shape:
                continue
            if arg is None:
                c_strides = _c_strides(shape)
                arg = _layout(t, shape, c_strides)
                if arg is _NOT_COMPARABLE:
                    return None
                pa = 0 if arg is _EMPTY else t._data_ptr()
            if vlayout is None:
                vlayout = entry[4] = _layout(view, shape, c_strides)
            if vlayout is _NOT_COMPARABLE:
                continue
            pv = 0 if vlayout is _EMPTY else view._data_ptr()
            if _same_elements(arg, pa, vlayout, pv, shape):
                tag = (self.epoch, reg)
                t._set_user_data(_KEY, tag)
                return tag
        return None

    def _bind(self, t, reg: int) -> None:
        t._set_user_data(_KEY, (self.epoch, reg))
        if self.recording is not None:
            self._results.append(t)

    def on_op(self, name: str, args: tuple, out) -> None:
        """Called after the op ran eagerly with `out` as its result; sets `last_op` and `last_tags`
        (see the class doc)."""
        # Every return path sets last_op and last_tags (after an exception, dispatch calls on_error,
        # which clears them).
        self._names.append(name)
        # normalize.lower(name, args), inline
        low = _TABLE.get(name)
        if low is not None and low is not _META:
            try:
                if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple and args[1] == name:
                    low = low(args[2], args[0])  # legacy primitive: (prim, name, inputs)
                else:
                    low = low(args, None)
            except _REJECT:
                low = None
        if type(low) is not tuple:
            if (type(low) is _Lowering and len(low.instrs) == 1 and len(low.outputs) == 1
                    and type(out) is Tensor):
                low = low.instrs[0]
            else:
                self._other(name, args, out, low)
                return
        if type(out) is Tensor and self._record:
            # The common case, inline: one VM instruction whose one result is `out`. Counted in
            # METRICS through `_one_instr` (see Metrics.flush_ops).
            op, operands, attrs = low
            epoch = self.epoch
            regs = []
            tags = []
            mask = 0
            for i, a in enumerate(operands):
                if isinstance(a, Tensor):
                    tag = a._get_user_data(_KEY)
                    if tag is None or tag[0] != epoch:
                        tag = self._input_tag(a)
                    regs.append(tag[1])
                    tags.append(tag)
                    mask |= 1 << i
                else:
                    regs.append(a)
            block = self.block
            if block is None:
                block = self._open_block()
            prog = self.program
            r = prog._n
            is_view = op in _VIEW
            # tensor_type(out, ...), inline; MindSpore kernels write contiguous results.
            dt = out._dtype
            shape = out._shape
            contiguous = _is_contiguous(out) if is_view else True
            ty = _TYPES.get((id(dt), shape, contiguous))
            if ty is None:
                ty = _new_type(dt, shape, contiguous)
            prog.types[r] = ty
            prog._n = r + 1
            pending = block._pending
            start = len(block._instrs) + len(pending)
            outs = (r,)
            pending.append((op, tuple(regs), outs, mask))
            block._pattrs.append(attrs)
            otag = (epoch, r)
            out._set_user_data(_KEY, otag)
            if self.recording is not None:
                self._results.append(out)
            if is_view:
                self._views.append([out, r, ty.dtype, ty.shape, None])
            self.last_op = (block, start, start + 1, outs)
            if name in _INPLACE:
                target = _mutated(name, args)
                if target is not None:
                    self._bind(target, r)
                self.last_tags = _read_tags(args, out) if self.want_tags else None
            elif self.want_tags:
                self.last_tags = (tags if name in _IN_ORDER else _read_tags(args, out)[0], [otag])
            else:
                self.last_tags = None
            self._one_instr.append(None)
            if start >= self._last_index:
                self.close_block("limit")
            return
        self._other(name, args, out, _Lowering([low], _OUT1))

    def _other(self, name: str, args: tuple, out, low) -> None:
        """on_op for everything but the common case: META, count-only mode, opaque calls, lowerings
        of several instructions or results."""
        self.last_op = self.last_tags = None
        names = self._names
        if low is _META:
            METRICS.ops_meta[name] += 1
            if len(names) > _FLUSH_NAMES:
                METRICS.flush_ops()
            return
        if not self._record:
            if low is None:
                METRICS.ops_opaque[name] += 1
            if len(names) > _FLUSH_NAMES:
                METRICS.flush_ops()
            return
        if low is None:
            self._record_call(name, args, out)
            return
        self._record_lowering(name, args, out, low)

    def _emit(self, block, op: str, regs: list, mask: int, attrs: dict, types) -> list:
        """Append one instruction (registers in `regs` are the ints flagged by `mask`); returns its
        result register numbers."""
        prog = self.program
        r0 = prog.next_reg()
        n = len(types)
        prog._n = r0 + n
        outs = tuple(range(r0, r0 + n))
        ptypes = prog.types
        for r, t in zip(outs, types):
            ptypes[r] = t
        block.append_raw((op, tuple(regs), outs, mask), attrs)
        return list(outs)

    def _record_lowering(self, name: str, args: tuple, out, low) -> None:
        """A lowering of several instructions (or results): temporaries typed by the registry."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        final = {}
        for k, tmp in enumerate(low.outputs):
            final[(tmp.index, tmp.out)] = outs[k]
        block = self._open_block()
        prog = self.program
        start = block.num_instrs()
        results = []
        for i, (op, operands, attrs) in enumerate(low.instrs):
            regs = []
            mask = 0
            for j, a in enumerate(operands):
                if isinstance(a, Tensor):
                    regs.append(self._reg_of(a))
                    mask |= 1 << j
                elif isinstance(a, _TMP):
                    regs.append(results[a.index][a.out])
                    mask |= 1 << j
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
                types = self._infer(op, regs, mask, attrs)
            results.append(self._emit(block, op, regs, mask, attrs, types))
        for k, tmp in enumerate(low.outputs):
            t = outs[k]
            if isinstance(t, Tensor):
                reg = results[tmp.index][tmp.out]
                self._bind(t, reg)
                if low.instrs[tmp.index][0] in _VIEW_LIKE:
                    ty = prog.types[reg]
                    self._views.append([t, reg, ty.dtype, ty.shape, None])
        self.last_op = (block, start, block.num_instrs(),
                        tuple(results[t.index][t.out] for t in low.outputs))
        if name in _INPLACE and low.outputs:
            target = _mutated(name, args)
            if target is not None:
                first = low.outputs[0]
                self._bind(target, results[first.index][first.out])
        if self.want_tags:
            self.last_tags = _read_tags(args, out)
        m = METRICS
        m.ops_recorded += 1
        m.instrs += len(low.instrs)
        if block.num_instrs() >= self._max_block_ops:
            self.close_block("limit")

    def _infer(self, op, regs, mask, attrs):
        from ms_dynvm.ir import registry

        types = self.program.types
        arg_types = [types[r] if mask >> j & 1 else r for j, r in enumerate(regs)]
        return registry.infer(op, arg_types, attrs)

    def _record_call(self, name: str, args: tuple, out) -> None:
        """An op the VM does not model: one opaque `call` over its tensor arguments, ending the block."""
        METRICS.ops_opaque[name] += 1
        block = self._open_block()
        regs = [self._reg_of(t) for t in _flat_tensors(args, [])]
        res = _flat_tensors(out, [])
        types = [tensor_type(t) for t in res]
        outs = self._emit(block, "call", regs, (1 << len(regs)) - 1, {"target": name}, types)
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
        self.last_op = self.last_tags = None
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
