"""Render a backend-neutral `KernelSpec` (codegen/spec.py) as CUDA C++ for NVRTC.

One `__global__` function per nest of the spec (`dvm_n<k>`), launched in order on one stream (a later
nest reads an earlier nest's statistics from global memory, so stream order is the only
synchronisation needed). Every kernel takes the same parameters: the spec's buffers (inputs, outputs,
temporaries) as pointers, then the element strides of every input/output axis, then the run-time size
of every symbolic dim (spec.syms order), then an int `vec` (bit k: step k of an elementwise nest may
take its vectorised path). Static dims are constants in the code, so one compile serves every size of
a shape family.

Two kernel shapes, from the templates in `cuda_templates/`:
- elementwise nest (no reduction step; `map_nest.cu`, `map_step.cu`): per step, a grid-stride loop
  over the flattened outer x inner iteration space, the loop variables recovered by div/mod; plus a
  vectorised path (16-byte `float4`/`int4` loads and stores, four elements per thread and
  iteration, then a scalar tail) that the launcher enables when every access of the step that reads
  a loop variable is the dense row-major index of the iteration space and every such buffer holds
  4-byte elements at a 16-byte aligned address (checked on the host once per layout).
- row nest (`row_nest.cu`): one thread block per outer point (grid-stride over the rows). A
  reduction step lets each thread accumulate a strided share of the reduced elements, then
  `dvm_block_reduce` (warp shuffles, shared memory) gives every thread the block's result; the step's
  post statements (the row statistics) run in every thread, their stores in thread 0 only. Map steps
  of the nest spread their inner elements over the threads. Row length is a run-time argument.

Scalar ops render through the C backend's `c_op` (the vocabulary is shared; `dvm_common.cuh` supplies
the helpers it names, on CUDA's device math), except where CUDA needs its own form: float products as
`__fmul_rn` (never contracted into an fma, as eager rounds each op), float16 rounding and casts
through the hardware's conversions.

Numerics against the reference: reductions combine in a fixed tree order (deterministic for a given
block size, not the CPU's order); the spec is lowered with `eager_math=False` (float32 sums and the
norm statistics accumulate in float64, as the reference does). `fast_math` compiles with
`--use_fast_math` (approximate transcendental intrinsics, flush-to-zero); `strict_ieee` with
`--fmad=false` (no contraction anywhere), so results are bitwise reproducible run to run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from string import Template

from ms_dynvm.codegen.c import _c_cast, c_ix, c_literal, c_op
from ms_dynvm.codegen.spec import Const, KernelSpec, Let, Load, Op, Step, Store, ix_dim, ix_vars

_CT = {"f32": "float", "f64": "double", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t",
       "u8": "uint8_t", "bool": "uint8_t"}
_STORAGE = {"f16": "uint16_t", "bf16": "float", "f32": "float", "f64": "double", "i8": "int8_t",
            "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "u8": "uint8_t", "bool": "uint8_t"}
_ITEMSIZE = {"f16": 2, "bf16": 4, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "u8": 1, "bool": 1}
_VEC4 = {"float": "float4", "int32_t": "int4"}
_KIND = {"sum": "DVM_SUM", "prod": "DVM_PROD", "max": "DVM_MAX", "min": "DVM_MIN", "nanmax": "DVM_NANMAX"}
_INIT = {"sum": "0", "prod": "1"}

MAP_THREADS = 256
ROW_CACHE = 4  # row elements per thread held in registers across a row nest's steps


def templates_dir() -> str:
    """`cuda_templates/`: beside the package in a checkout, or where package data put it."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = [os.path.join(here, "..", "..", "..", "cuda_templates"),  # checkout: <root>/cuda_templates
             os.path.join(here, "..", "..", "cuda_templates"),
             os.path.join(here, "..", "..", "..", "..", "cuda_templates")]
    for c in cands:
        if os.path.isfile(os.path.join(c, "dvm_common.cuh")):
            return os.path.normpath(c)
    raise FileNotFoundError("cuda_templates/ not found beside the ms_dynvm package")


_TEXT: dict = {}


def template(name: str) -> str:
    if name not in _TEXT:
        with open(os.path.join(templates_dir(), name), encoding="utf-8") as f:
            _TEXT[name] = f.read()
    return _TEXT[name]


def storage_type(dtype: str) -> str:
    return _STORAGE[dtype]


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


def cu_ix(e) -> str:
    """An index expression as CUDA C (64-bit literals: `LL`)."""
    return c_ix(e, "LL")


# --- scalar ops ---------------------------------------------------------------------------------
def _cast(x: str, src: str, dst: str) -> str:
    return _c_cast(x, src, dst, "dvm_round_f16((float)({}))")


def cu_op(op: Op, ct: str) -> str:
    """CUDA expression of scalar op `op` computing in `ct` (args are variable names)."""
    a, fn = op.args, op.fn
    flt = ct in ("f32", "f64")
    mul = "__fmul_rn" if ct == "f32" else "__dmul_rn"
    if fn == "mul" and flt:
        return f"{mul}({a[0]}, {a[1]})"
    if fn == "square" and flt:
        return f"{mul}({a[0]}, {a[0]})"
    if fn == "cast":
        return _cast(a[0], op.attr("src"), op.attr("dst"))
    if fn == "round_to":
        return f"dvm_round_f16({a[0]})" if op.attr("dst") == "f16" else f"dvm_bf16({a[0]})"
    if fn == "size":
        return cu_ix(op.attr("ix"))
    if fn == "lerp" and flt:
        return f"({a[0]} + {mul}({a[2]}, ({a[1]} - {a[0]})))"
    return c_op(op, ct)


def render_stmt(s, spec: KernelSpec, load=None, store=None) -> str:
    """One statement. `load(buf, index) -> expr` / `store(buf, index, value) -> stmt` override how
    memory is addressed (the vectorised path)."""
    if isinstance(s, Store):
        b = spec.buffer(s.buf)
        if b.dtype == "f16":
            val = f"dvm_f2h({s.var})"
        elif b.dtype == "bool":
            val = f"(uint8_t)({s.var} != 0)"
        else:
            val = f"({storage_type(b.dtype)})({s.var})"
        if store is not None:
            return store(s.buf, s.index, val)
        return f"{s.buf}[{cu_ix(s.index)}] = {val};"
    T = _CT[s.ctype]
    expr = s.expr
    if isinstance(expr, Load):
        raw = load(expr.buf, expr.index) if load is not None else f"{expr.buf}[{cu_ix(expr.index)}]"
        if spec.buffer(expr.buf).dtype == "f16":
            raw = f"dvm_h2f({raw})"
        return f"const {T} {s.var} = ({T})({raw});"
    if isinstance(expr, Const):
        return f"const {T} {s.var} = {c_literal(expr.value, s.ctype)};"
    return f"const {T} {s.var} = ({T})({cu_op(expr, s.ctype)});"


def _accesses(stmts) -> list:
    """(buf, index, is_store) of every memory access in `stmts`."""
    out = []
    for s in stmts:
        if isinstance(s, Store):
            out.append((s.buf, s.index, True))
        elif isinstance(s, Let) and isinstance(s.expr, Load):
            out.append((s.expr.buf, s.expr.index, False))
    return out


# --- what the launcher needs to know --------------------------------------------------------------
@dataclass
class StepInfo:
    vars: list  # [(loop var, size Ix)] outer then inner: the flattened iteration space, row-major
    vec: bool  # a vectorised path was generated
    accesses: list  # (buf, index, is_store) that read a loop variable (the vec path's dense accesses)


@dataclass
class NestInfo:
    name: str
    kind: str  # "map" | "row"
    outer: list  # [(var, size Ix)]
    work: list  # per step: [size Ix] of its inner dims (row) or outer+inner dims (map)
    steps: list  # [StepInfo] (map nests)


# The ops whose C form follows MindSpore CPU's formulas under eager_math (codegen/c.py's names).
EAGER_OPS = ("exp", "expm1", "log1p", "tanh", "mish", "sigmoid", "elu", "erfc", "log", "silu_grad",
             "gelu_grad_tanh", "gelu_tanh")


def math_prelude(eager_math: bool) -> str:
    """`dvm_<op>_op` for the ops of EAGER_OPS: MindSpore CPU's formulas (eager_math, what the
    reference interpreter computes) or CUDA's device functions."""
    lines = []
    if eager_math:
        from ms_dynvm.codegen import cmath

        lines += [template("dvm_eager.cuh"), cmath._EAGER_C.replace("static inline ", "DVM_DEV ").replace(
            "static const double", "static __device__ const double").replace("memcpy(", "dvm_memcpy(")]
    for f in EAGER_OPS:
        lines.append(f"#define dvm_{f}_op dvm_{f}{'_ms' if eager_math else ''}")
    return "\n".join(lines)


class CudaRenderer:
    def __init__(self, spec: KernelSpec, eager_math: bool = True):
        self.spec = spec
        self.eager_math = eager_math
        self.nests: list[NestInfo] = []

    def params(self) -> str:
        spec = self.spec
        ps = []
        for b in spec.buffers:
            const = "const " if b.role == "in" else ""
            ps.append(f"{const}{storage_type(b.dtype)} *__restrict__ {b.name}")
        for b in spec.buffers:
            if b.role == "tmp":
                continue
            for axis in range(len(b.shape)):
                ps.append(f"const int64_t st_{b.name}_{axis}")
        for name in spec.syms:
            ps.append(f"const int64_t s_{name}")
        ps.append("const int vec")
        return ", ".join(ps)

    def render(self) -> str:
        parts = ["// --- generated by ms_dynvm.codegen.cuda ---"]
        for nid, nest in enumerate(self.spec.nests):
            name = f"dvm_n{nid}"
            if any(step.is_reduce for step in nest.steps):
                parts.append(self._row_nest(name, nest))
            else:
                parts.append(self._map_nest(name, nest))
        body = "\n".join(parts) + "\n"
        prelude = template("dvm_common.cuh") + "\n" + math_prelude(self.eager_math)
        return shake(prelude, body) + "\n" + body

    # --- elementwise nests ------------------------------------------------------------------------
    def _map_nest(self, name: str, nest) -> str:
        steps, infos, work = [], [], []
        for k, step in enumerate(nest.steps):
            code, info = self._map_step(k, nest.outer, step)
            steps.append(code)
            infos.append(info)
            work.append([s for _, s in info.vars])
        self.nests.append(NestInfo(name, "map", list(nest.outer), work, infos))
        return Template(template("map_nest.cu")).substitute(
            name=name, threads=MAP_THREADS, params=self.params(), steps="\n".join(steps))

    def _map_step(self, k: int, outer, step: Step):
        spec = self.spec
        vars_ = list(outer) + list(step.inner)
        total = " * ".join(f"(int64_t){cu_ix(s)}" for _, s in vars_) or "1LL"
        names = {v for v, _ in vars_}
        dense = [(b, ix, st) for b, ix, st in _accesses(step.body) if ix_vars(ix) & names]
        vec = bool(vars_) and bool(dense) and all(storage_type(spec.buffer(b).dtype) in _VEC4 for b, _, _ in dense)
        body = "\n".join("            " + render_stmt(s, spec) for s in step.body)
        delin = "\n".join("            " + line for line in _delinearise("i", vars_))
        vec_body = self._vec_body(step, names) if vec else ""
        code = Template(template("map_step.cu")).substitute(
            total=total, bit=1 << k, vec_path=vec_body, delin=delin, body=body)
        return code, StepInfo(vars_, vec, dense)

    def _vec_body(self, step: Step, names: set) -> str:
        """Four elements per iteration: one 16-byte load per dense input buffer, the body four times
        over (variables suffixed _0.._3), one 16-byte store per dense output buffer."""
        spec = self.spec
        lines = []
        loaded, stored = {}, {}
        for b, ix, st in _accesses(step.body):
            if not ix_vars(ix) & names:
                continue
            T = _VEC4[storage_type(spec.buffer(b).dtype)]
            if st:
                if b not in stored:
                    stored[b] = f"w_{b}"
                    lines.append(f"{T} w_{b};")
            elif b not in loaded:
                loaded[b] = f"r_{b}"
                lines.append(f"const {T} r_{b} = reinterpret_cast<const {T} *>({b})[q];")
        comp = "xyzw"
        defined = [s.var for s in step.body if isinstance(s, Let)]
        for lane in range(4):
            def ren(text: str, lane=lane) -> str:
                return _rename(text, defined, f"_{lane}")

            def load(buf, index, lane=lane):
                if ix_vars(index) & names:
                    return f"{loaded[buf]}.{comp[lane]}"
                return f"{buf}[{cu_ix(index)}]"

            def store(buf, index, val, lane=lane):
                return f"{stored[buf]}.{comp[lane]} = {val};"

            lines.append(f"// element {lane}")
            for s in step.body:
                lines.append(ren(render_stmt(s, spec, load, store)))
        for b, w in stored.items():
            T = _VEC4[storage_type(spec.buffer(b).dtype)]
            lines.append(f"reinterpret_cast<{T} *>({b})[q] = {w};")
        return "\n".join("                " + ln for ln in lines)

    # --- row nests --------------------------------------------------------------------------------
    def _row_nest(self, name: str, nest) -> str:
        n_outer = " * ".join(f"(int64_t){cu_ix(s)}" for _, s in nest.outer) or "1LL"
        lines = _delinearise("o", list(nest.outer))
        work = [[s for _, s in step.inner] for step in nest.steps]
        general = self._row_general(nest)
        cached = self._row_cached(nest)
        if cached is None:
            lines += general
        else:
            n = " * ".join(f"(int64_t){cu_ix(s)}" for _, s in nest.steps[0].inner)
            lines.append(f"if ({n} <= (int64_t)blockDim.x * {ROW_CACHE}) {{")
            lines += ["    " + ln for ln in cached]
            lines.append("} else {")
            lines += ["    " + ln for ln in general]
            lines.append("}")
        # Every thread is done with this row's shared memory and statistics before the next row.
        lines.append("__syncthreads();")
        self.nests.append(NestInfo(name, "row", list(nest.outer), work, []))
        body = "\n".join("        " + ln for ln in lines)
        return Template(template("row_nest.cu")).substitute(
            name=name, params=self.params(), n_outer=n_outer, body=body)

    def _row_general(self, nest) -> list:
        """Any row length: each step loops over the row with a block-strided index, reading and
        writing global memory (a later step re-reads what an earlier one read or stored)."""
        spec = self.spec
        lines = []
        for k, step in enumerate(nest.steps):
            for s in step.pre:
                lines.append(render_stmt(s, spec))
            inner = list(step.inner)
            n = " * ".join(f"(int64_t){cu_ix(s)}" for _, s in inner) or "1LL"
            if step.is_reduce:
                lines += self._acc_init(step)
                if inner:
                    lines.append(f"for (int64_t j = threadIdx.x; j < {n}; j += blockDim.x) {{")
                    lines += ["    " + ln for ln in _delinearise("j", inner)]
                else:
                    lines.append("{")
                lines += ["    " + render_stmt(s, spec) for s in step.body]
                lines += ["    " + ln for ln in self._acc_combine(step)]
                lines.append("}")
                if inner:
                    lines += self._acc_reduce(step)
            elif inner:
                lines.append(f"for (int64_t j = threadIdx.x; j < {n}; j += blockDim.x) {{")
                lines += ["    " + ln for ln in _delinearise("j", inner)]
                lines += ["    " + render_stmt(s, spec) for s in step.body]
                lines.append("}")
            else:
                lines.append("if (threadIdx.x == 0) {")
                lines += ["    " + render_stmt(s, spec) for s in step.body]
                lines.append("}")
            lines += self._post(step)
            if not step.is_reduce and k + 1 < len(nest.steps):
                # a later step may read what this one stored, at elements other threads wrote
                lines.append("__syncthreads();")
        return lines

    def _acc_init(self, step) -> list:
        out = []
        for acc in step.accs:
            T = _CT[acc.ctype]
            init = acc.first if acc.first else _INIT.get(acc.kind, "-INFINITY")
            out.append(f"{T} {acc.var} = ({T})({init});")
        return out

    def _acc_combine(self, step) -> list:
        return [f"{acc.var} = dvm_combine<{_KIND[acc.kind]}>({acc.var}, ({_CT[acc.ctype]})({acc.value}));"
                for acc in step.accs]

    def _acc_reduce(self, step) -> list:
        return [f"{acc.var} = dvm_block_reduce<{_KIND[acc.kind]}>({acc.var});" for acc in step.accs]

    def _post(self, step) -> list:
        out = []
        for s in step.post:
            text = render_stmt(s, self.spec)
            out.append(f"if (threadIdx.x == 0) {text}" if isinstance(s, Store) else text)
        return out

    def _row_cached(self, nest):
        """Rows of at most blockDim.x * ROW_CACHE elements: thread t owns elements t + u*blockDim.x
        (u < ROW_CACHE) in every step, so what a step loads from an input, or stores, stays in that
        thread's registers for the later steps; each input element is read from memory once and each
        output element written once, after the last step. The elements a thread visits, and their
        order, are the general path's, so the results are bitwise the same. None where the nest does
        not allow it: steps over different row shapes, a scalar step, or a buffer stored in the nest
        that is accessed at more than one index (or outside the row loops)."""
        spec = self.spec
        steps = list(nest.steps)
        if len(steps) < 2 or not steps[0].inner:
            return None
        shape = [s for _, s in steps[0].inner]
        if any([s for _, s in st.inner] != shape for st in steps):
            return None
        canon = [(f"cj{i}", s) for i, s in enumerate(shape)]

        def canonical(step, index):
            return _ix_rename(index, {v: c for (v, _), (c, _) in zip(step.inner, canon)})

        written: dict = {}  # buffer stored in a row loop -> its one canonical index
        for st in steps:
            for b, ix, is_store in _accesses(st.body):
                if is_store:
                    c = canonical(st, ix)
                    if written.setdefault(b, c) != c:
                        return None
        for st in steps:
            for b, ix, _ in _accesses(st.pre + st.post):
                if b in written:
                    return None
            for b, ix, _ in _accesses(st.body):
                if b in written and canonical(st, ix) != written[b]:
                    return None
        regs: dict = {}  # (buffer, canonical index) -> register array name
        decl = []
        for st in steps:
            for b, ix, _ in _accesses(st.body):
                key = (b, canonical(st, ix))
                if key not in regs and (b in written or spec.buffer(b).role == "in"):
                    regs[key] = f"c{len(regs)}_{b}"
                    decl.append(f"{storage_type(spec.buffer(b).dtype)} {regs[key]}[{ROW_CACHE}];")
        held = set()  # register arrays holding their values (loaded or stored in an earlier step)
        lines = list(decl)
        for st in steps:
            lines += [render_stmt(s, spec) for s in st.pre]
            if st.is_reduce:
                lines += self._acc_init(st)
            lines.append("#pragma unroll")
            lines.append(f"for (int u = 0; u < {ROW_CACHE}; ++u) {{")
            lines.append("    const int64_t j = threadIdx.x + (int64_t)u * blockDim.x;")
            n = " * ".join(f"(int64_t){cu_ix(s)}" for s in shape)
            lines.append(f"    if (j < {n}) {{")
            lines += ["        " + ln for ln in _delinearise("j", list(st.inner))]
            first = set()

            def load(buf, index, st=st, first=first):
                r = regs.get((buf, canonical(st, index)))
                if r is None:
                    return f"{buf}[{cu_ix(index)}]"
                if r in held or r in first:
                    return f"{r}[u]"
                first.add(r)
                return f"({r}[u] = {buf}[{cu_ix(index)}])"

            def store(buf, index, val, st=st, first=first):
                r = regs[(buf, canonical(st, index))]
                first.add(r)
                return f"{r}[u] = {val};"

            lines += ["        " + render_stmt(s, spec, load, store) for s in st.body]
            if st.is_reduce:
                lines += ["        " + ln for ln in self._acc_combine(st)]
            lines.append("    }")
            lines.append("}")
            held |= first
            if st.is_reduce:
                lines += self._acc_reduce(st)
            lines += self._post(st)
        if written:
            lines.append("#pragma unroll")
            lines.append(f"for (int u = 0; u < {ROW_CACHE}; ++u) {{")
            lines.append("    const int64_t j = threadIdx.x + (int64_t)u * blockDim.x;")
            n = " * ".join(f"(int64_t){cu_ix(s)}" for s in shape)
            lines.append(f"    if (j < {n}) {{")
            lines += ["        " + ln for ln in _delinearise("j", canon)]
            for b, ix in written.items():
                lines.append(f"        {b}[{cu_ix(ix)}] = {regs[(b, ix)]}[u];")
            lines.append("    }")
            lines.append("}")
        return lines


def _ix_rename(e, names: dict):
    """Index expression `e` with loop variables renamed by `names`."""
    if isinstance(e, tuple):
        if len(e) == 2 and e[0] == "v":
            return ("v", names.get(e[1], e[1]))
        return tuple(_ix_rename(x, names) for x in e)
    return e


_IDENT = re.compile(r"[A-Za-z_]\w*")
_FUNC_NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")


def shake(prelude: str, code: str) -> str:
    """`prelude` without the device functions that `code` does not reach (directly, through other
    functions or through `#define` aliases): NVRTC's time grows with the text it parses, and a kernel
    uses a few of the prelude's functions. Declarations other than functions are all kept."""
    lines = prelude.splitlines()
    items = []  # (function name or None, text, identifiers, is_define_name)
    i = 0
    while i < len(lines):
        ln = lines[i]
        st = ln.lstrip()
        if st.startswith("DVM_DEV") or st.startswith("template"):
            buf = [ln]
            depth = ln.count("{") - ln.count("}")
            while (depth > 0 or "{" not in "".join(buf)) and i + 1 < len(lines):
                i += 1
                buf.append(lines[i])
                depth += lines[i].count("{") - lines[i].count("}")
            text = "\n".join(buf)
            m = _FUNC_NAME.search(st)
            items.append((m.group(1) if m else None, text, set(_IDENT.findall(text))))
        else:
            items.append((None, ln, set()))
        i += 1
    defines = {}
    for ln in lines:
        parts = ln.split()
        if len(parts) >= 3 and parts[0] == "#define":
            defines[parts[1]] = set(_IDENT.findall(" ".join(parts[2:])))
    need = set(_IDENT.findall(code))
    keep = set()
    changed = True
    while changed:
        changed = False
        for name, deps in defines.items():
            if name in need and not deps <= need:
                need |= deps
                changed = True
        for k, (name, _, ids) in enumerate(items):
            if name is not None and k not in keep and name in need:
                keep.add(k)
                need |= ids
                changed = True
    return "\n".join(text for k, (name, text, _) in enumerate(items) if name is None or k in keep)


def _delinearise(lin: str, vars_: list) -> list:
    """C statements recovering the loop variables `vars_` (row-major) from the flat index `lin`."""
    if not vars_:
        return []
    if len(vars_) == 1:
        return [f"const int64_t {vars_[0][0]} = {lin};"]
    out, rest = [], lin
    for k in range(len(vars_) - 1, -1, -1):
        var, size = vars_[k]
        if k == 0:
            out.append(f"const int64_t {var} = {rest};")
        else:
            out.append(f"const int64_t {var} = {rest} % (int64_t){cu_ix(size)};")
            rest = f"({rest} / (int64_t){cu_ix(size)})"
    return out


def _rename(text: str, names: list, suffix: str) -> str:
    if not names:
        return text
    pat = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
    return pat.sub(lambda m: m.group(1) + suffix, text)


def render(spec: KernelSpec, eager_math: bool = True) -> tuple[str, list]:
    """(CUDA source, [NestInfo]) of `spec`; raises ValueError for an op without a rendering.
    `eager_math`: the ops of EAGER_OPS follow MindSpore CPU's formulas (as the reference)."""
    r = CudaRenderer(spec, eager_math)
    return r.render(), r.nests


def temp_elems(spec: KernelSpec) -> list:
    """Per temporary buffer: its element count as an Ix expression list (the product of its dims)."""
    return [[ix_dim(d) for d in b.shape] for b in spec.temps]


__all__ = ["CudaRenderer", "NestInfo", "StepInfo", "cu_ix", "cu_op", "itemsize", "render", "storage_type",
           "template", "templates_dir"]
