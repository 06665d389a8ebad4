"""Shape inference with symbolic dims: make a Function recorded at one size serve a family of sizes.

`generalize(fn, dynamic)` replaces chosen param dims by symbols and re-infers every result type with
the registry's rules (`ms_dynvm.ir.registry.infer`), e.g. `f32[4,8] -> f32[B,8]` turns a `reshape`
with shape (-1,) into `f32[B*8]` and a `sum` over axis 0 into `f32[8]`. When a rule cannot express a
result over the symbols (a slice, a concat of `B + 3`, an attribute that hard-codes the recorded
size such as `reshape(x, (4, 2, 4))` or `broadcast_to(x, (4, 8))`), it raises `GeneralizeError`
naming the instruction, and the caller keeps that dim static.

Which dims share a symbol is the caller's decision (the frontend knows which tensors were seen with
equal sizes), never guessed from equal recorded values: two batch-sized dims of 4 and a hidden
size of 4 look the same in one recording. `dynamic` is either
- `{(param, axis): name}`: dims given the same name get the same symbol; or
- `{param: {axis, ...}}`: every listed dim gets its own symbol `s0, s1, ...` (in param order, then
  axis order).
Dims given one name must have had equal recorded sizes. A symbol never stands for 0 or 1: shape
signatures specialise those sizes (1 changes broadcasting), so such a dim cannot be generalised.

Attributes whose sizes are not checked against operands (`fill.shape`, `arange.end`,
`gather_d_grad.shape`, `one_hot.depth`, `unsorted_segment_sum.num_segments`) may hold a value that the
script derived from a dynamic dim (`zeros(x.shape[0], 8)`). A generalised program would then return
a tensor of the recorded size at every size, so `generalize` raises when such an attribute holds a
recorded size of a generalised dim (conservative: the caller keeps the dim static). Opaque `call`s
have no rule: a call that reads a value whose type changed raises too.

`bind(fn, shapes)` solves the symbols from concrete param shapes (first monomials with one unknown,
then checks every dim), with an error that names the param and axis on any inconsistency.
"""

from __future__ import annotations

from collections.abc import Mapping

from ms_dynvm.bytecode import opcodes
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import Sym, TensorType
from ms_dynvm.ir import registry
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.util import clone

# op -> attributes whose ints are sizes that no shape rule ties to an operand
_SIZE_ATTRS = {
    "fill": ("shape",),
    "arange": ("start", "end"),
    "gather_d_grad": ("shape",),
    "one_hot": ("depth",),
    "unsorted_segment_sum": ("num_segments",),
    "unsorted_segment_max": ("num_segments",),
    "unsorted_segment_min": ("num_segments",),
    "unsorted_segment_prod": ("num_segments",),
}


class GeneralizeError(ValueError):
    """The Function cannot be expressed over the requested symbols (keep those dims static)."""


class BindError(ValueError):
    """Concrete shapes that do not fit a Function's symbolic param types."""


def _normalise(fn: Function, dynamic: Mapping) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    if all(isinstance(k, tuple) for k in dynamic):
        for (p, axis), name in dynamic.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise GeneralizeError(f"symbol name {name!r} for %{p} axis {axis} is not an identifier")
            out[(int(p), int(axis))] = name
    else:
        n = 0
        for p in fn.params:
            for axis in sorted(dynamic.get(p, ())):
                out[(p, axis)] = f"s{n}"
                n += 1
        unknown = set(dynamic) - set(fn.params)
        if unknown:
            raise GeneralizeError(f"not params of @{fn.name}: {sorted(unknown)}")
    return out


def generalize(fn: Function, dynamic: Mapping) -> Function:
    """A copy of `fn` whose marked param dims are symbols and whose result types are re-inferred."""
    marks = _normalise(fn, dynamic)
    types = dict(fn.types)
    values: dict[str, int] = {}
    for (p, axis), name in marks.items():
        if p not in fn.params:
            raise GeneralizeError(f"%{p} is not a param of @{fn.name}")
        shape = list(types[p].shape)
        if not -len(shape) <= axis < len(shape):
            raise GeneralizeError(f"%{p} : {types[p]} has no axis {axis}")
        axis %= len(shape)
        d = shape[axis]
        if not isinstance(d, int):
            raise GeneralizeError(f"%{p} axis {axis} is already symbolic ({d})")
        if d in (0, 1):
            raise GeneralizeError(f"%{p} axis {axis} has size {d}: sizes 0 and 1 are specialised")
        if values.setdefault(name, d) != d:
            raise GeneralizeError(f"symbol {name} names dims of sizes {values[name]} and {d} (%{p} axis {axis})")
        shape[axis] = Sym.of(name)
        types[p] = types[p].with_shape(shape)
    recorded_sizes = set(values.values())
    changed = {p for p, _ in marks}
    out = clone(fn)
    for i, ins in enumerate(out.body):
        where = f"@{fn.name}[{i}] {ins.op}"
        reads_changed = any(int(r) in changed for r in ins.regs())
        if ins.op in opcodes.OPAQUE:
            if reads_changed:
                raise GeneralizeError(f"{where}: an opaque call has no shape rule for symbolic operands")
            continue
        for key in _SIZE_ATTRS.get(ins.op, ()):
            if _mentions(ins.attrs.get(key), recorded_sizes):
                raise GeneralizeError(
                    f"{where}: attribute {key}={ins.attrs[key]!r} holds a recorded size of a generalised dim"
                )
        args = [types[int(a)] if isinstance(a, Reg) else a for a in ins.args]
        try:
            inferred = registry.infer(ins.op, args, ins.attrs)
        except registry.ShapeError as e:
            raise GeneralizeError(f"{where}: {e}") from None
        for r, t in zip(ins.outs, inferred):
            old = fn.types[r]
            new = TensorType(t.dtype, tuple(t.shape), old.layout)  # layout is a recorded fact
            if new.dtype != old.dtype:
                raise GeneralizeError(f"{where}: dtype of %{r} changes from {old.dtype} to {new.dtype}")
            if tuple(new.shape) != tuple(old.shape):
                changed.add(r)
            types[r] = new
    out.types = types
    return out


def _mentions(v, sizes: set) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v in sizes
    if isinstance(v, (tuple, list)):
        return any(_mentions(x, sizes) for x in v)
    return False


def symbols(fn: Function) -> list[str]:
    """Names of the symbols in the param types of `fn`, in first-appearance order."""
    out: list[str] = []
    for p in fn.params:
        for d in fn.types[p].shape:
            if isinstance(d, Sym):
                out.extend(n for n in d.names if n not in out)
    return out


def bind(fn: Function, shapes) -> dict[str, int]:
    """Values of the symbols of `fn` given concrete param shapes: a list in param order or a dict
    param -> shape. Raises BindError naming the param and axis on a rank/size mismatch, a symbol
    bound to two values, a size that a symbolic product does not divide, or a symbol left unbound;
    and on a symbol of size 0 or 1 (those sizes are specialised, never symbolic)."""
    if isinstance(shapes, Mapping):
        missing = [p for p in fn.params if p not in shapes]
        if missing:
            raise BindError(f"no shape given for params {missing}")
        shapes = [shapes[p] for p in fn.params]
    if len(shapes) != len(fn.params):
        raise BindError(f"@{fn.name} takes {len(fn.params)} params, got {len(shapes)} shapes")
    dims = []  # (declared, actual, where)
    for p, actual in zip(fn.params, shapes):
        declared = fn.types[p].shape
        actual = tuple(int(n) for n in actual)
        if len(declared) != len(actual):
            raise BindError(f"%{p} : {fn.types[p]}: rank {len(actual)} given ({actual})")
        dims.extend((d, n, f"%{p} axis {axis} ({fn.types[p]})") for axis, (d, n) in enumerate(zip(declared, actual)))
    env: dict[str, int] = {}
    pending = [(d, n, w) for d, n, w in dims if isinstance(d, Sym)]
    for d, n, where in dims:
        if isinstance(d, int) and d != n:
            raise BindError(f"{where}: size {n}, expected {d}")
    progress = True
    while pending and progress:
        progress = False
        rest = []
        for d, n, where in pending:
            known, unknown = d.coeff, [x for x in d.names if x not in env]
            for x in d.names:
                if x in env:
                    known *= env[x]
            if len(unknown) == 1 and d.names.count(unknown[0]) == 1:
                if known == 0 or n % known:
                    raise BindError(f"{where}: size {n} is not a multiple of {known} for {d}")
                env[unknown[0]] = n // known
                progress = True
            elif not unknown:
                if known != n:
                    raise BindError(f"{where}: size {n}, but {d} = {known} with {_fmt_env(env, d)}")
                progress = True
            else:
                rest.append((d, n, where))
        pending = rest
    if pending:
        names = sorted({x for d, _, _ in pending for x in d.names if x not in env})
        raise BindError(f"cannot solve symbols {names} from the param shapes")
    for name, v in env.items():
        if v in (0, 1):
            raise BindError(f"symbol {name} = {v}: sizes 0 and 1 are specialised, not symbolic")
    return env


def _fmt_env(env: dict, d: Sym) -> str:
    return ", ".join(f"{x}={env[x]}" for x in sorted(set(d.names)))
