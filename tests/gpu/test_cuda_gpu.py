"""CUDA kernels and programs on the GPU against the NumPy reference interpreter (skipped without
pycuda or a CUDA device): the fused patterns over hypothesis-drawn sizes (one compile per group and
shape family), special values, strided and broadcast inputs, float16/bfloat16; every recorded program
through `run_program(..., device="cuda")`; the disk cache across processes; the device pool.

Tolerances: float32 rtol 1e-5 / atol 1e-6 (CUDA's device math is within 1-4 ulp, reductions
combine in a tree order); float16 and bfloat16 rtol/atol 1e-2 (one ulp of those types is 2^-10 and
2^-7 relative; the reference rounds after every op as the kernels do, but a transcendental of
CUDA and of NumPy may round the float32 value to either side of a half-way point); integers exact.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ms_dynvm
from ms_dynvm.codegen.cuda import kernel as ck
from tests.codegen import groups
from tests.codegen.groups import B, G, reference
from tests.gpu import cases

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = sorted(glob.glob(os.path.join(HERE, "programs", "*.dvm")))
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 88.8, -104.0, 30.0], np.float32)


def tol(dtype):
    return (1e-2, 1e-2) if dtype in ("f16", "bf16") else (1e-5, 1e-6)


def assert_close(out, ref, dtype="f32", what="", scaled=False):
    """`scaled`: the absolute floor is also 1e-5 of the output's largest magnitude (programs with
    matmuls: cuBLAS and NumPy add the K products in different orders, and where they cancel the
    difference is relative to the terms, not to the result)."""
    assert len(out) == len(ref)
    for k, (o, r) in enumerate(zip(out, ref)):
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape, (what, k, o.shape, r.shape)
        if r.dtype.kind == "f":
            rt, at = tol(dtype if r.dtype != np.float64 else "f32")
            if r.dtype == np.float16:
                rt, at = tol("f16")
            if scaled and r.size and np.isfinite(r).any():
                at = max(at, rt * float(np.nanmax(np.abs(r[np.isfinite(r)]))))
            np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), rtol=rt, atol=at,
                                       equal_nan=True, err_msg=f"{what} output {k}")
        else:
            np.testing.assert_array_equal(o, r, err_msg=f"{what} output {k}")


def arrays_for(fn, env, rng, special=False):
    out = []
    for r in fn.params:
        t = fn.types[r]
        shape = tuple(d if isinstance(d, int) else env[d.names[0]] * d.coeff for d in t.shape)
        dt = groups.np_dtype(t.dtype)
        if np.issubdtype(dt, np.integer):
            a = rng.integers(-50, 50, shape).astype(dt)
        else:
            a = (rng.standard_normal(shape) * 2).astype(np.float32)
            if special and a.size:
                k = max(1, a.size // 6)
                a.reshape(-1)[rng.integers(0, a.size, k)] = rng.choice(SPECIAL, k)
            a = a.astype(dt)
        out.append(a)
    return out


_K: dict = {}


def kern(name, fn, cache):
    if name not in _K:
        _K[name] = ck.compile_group(fn, cache=cache)
    return _K[name]


CASES = dict(cases.named_groups())


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_group_matches_reference(gpu, kcache, name, data):
    fn = CASES[name]
    before = ck.compiles()
    k = kern(name, fn, kcache)
    syms = sorted({n for t in fn.types.values() for d in t.shape if not isinstance(d, int) for n in d.names})
    env = {s: data.draw(st.sampled_from([2, 3, 5, 17, 64, 130, 257]), label=s) for s in syms}
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    special = data.draw(st.booleans()) and name not in ("int_mix",)
    ins = arrays_for(fn, env, rng, special)
    dtype = fn.types[fn.params[0]].dtype
    with np.errstate(all="ignore"):
        ref = reference(fn, ins)
    assert_close(k(ins), ref, dtype, name)
    assert ck.compiles() - before <= 1  # one compile per group, whatever the sizes


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_hypothesis_fusible_groups(gpu, kcache, data):
    """Random elementwise chains over shapes with 0/1 dims and broadcasting, with NaN/Inf."""
    rank = data.draw(st.integers(0, 3))
    full = tuple(data.draw(st.sampled_from([0, 1, 2, 3, 7, 33])) for _ in range(rank))
    g = G()
    shapes = [tuple(d if data.draw(st.booleans()) else 1 for d in full) for _ in range(3)]
    shapes[0] = full
    regs = [g.param("f32", s) for s in shapes]
    unary = ["exp", "tanh", "neg", "abs", "relu", "sigmoid", "sqrt", "log", "erf", "floor", "square"]
    binary = ["add", "sub", "mul", "div", "maximum", "minimum"]
    vals = list(regs)
    for _ in range(data.draw(st.integers(1, 6))):
        if data.draw(st.booleans()):
            vals.append(g.op(data.draw(st.sampled_from(unary)), data.draw(st.sampled_from(vals))))
        else:
            a, b = data.draw(st.sampled_from(vals)), data.draw(st.sampled_from(vals + [0.5, -2.0]))
            vals.append(g.op(data.draw(st.sampled_from(binary)), a, b))
    if data.draw(st.booleans()) and rank >= 1 and 0 not in full:
        vals.append(g.op("sum", vals[-1], axis=(-1,)))
    fn = g.fn()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    ins = arrays_for(fn, {}, rng, special=True)
    with np.errstate(all="ignore"):
        ref = reference(fn, ins)
    try:
        k = ck.compile_group(fn, cache=kcache)
    except ck.CodegenError:
        return
    assert_close(k(ins), ref, "f32", fn.as_text())


def test_strided_and_offset_inputs(gpu, kcache):
    """Inputs that are strided views of device memory (transposed, every other column)."""
    from ms_dynvm.codegen.cuda import driver
    from ms_dynvm.runtime.device_pool import default_device_pool

    fn = groups.chain(shape=(B, 24))
    k = kern("chain_b24", fn, kcache)
    pool = default_device_pool()
    rng = np.random.default_rng(0)
    big = rng.standard_normal((24, 10)).astype(np.float32)  # x = big.T (strides 1, 10)
    m2 = rng.standard_normal((10, 48)).astype(np.float32)  # m = m2[:, ::2]
    dbig, dm2 = ck.to_device(big, "f32", pool), ck.to_device(m2, "f32", pool)
    x = driver.DeviceArray(dbig.ptr, (10, 24), "f32", strides=(1, 10))
    m = driver.DeviceArray(dm2.ptr + 4, (10, 24), "f32", strides=(48, 2))
    outs = k.run_device([x, m], pool)
    got = [o.get() for o in outs]
    ref = reference(fn, [np.ascontiguousarray(big.T), np.ascontiguousarray(m2[:, 1::2])])
    assert_close(got, ref, "f32", "strided")
    for a in [dbig, dm2] + outs:
        a.release()
    pool.safe_point()


def _program(path):
    prog = ms_dynvm.load_program(path)
    z = np.load(path[:-4] + ".npz")
    return prog, [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("path", PROGRAMS, ids=[os.path.basename(p)[:-4] for p in PROGRAMS])
def test_recorded_program_on_gpu(gpu, path):
    prog, ins = _program(path)
    ref = ms_dynvm.interpret(prog, ins)
    out = ms_dynvm.run_program(prog, ins, device="cuda")
    dtype = "f16" if "f16" in path else "f32"
    has_matmul = any(i.op == "matmul" for i in prog.instrs())
    assert_close(out, ref, dtype, os.path.basename(path), scaled=has_matmul)
    from ms_dynvm.runtime.gpu_executor import executor_for

    st_ = executor_for(prog).stats()
    results = os.environ.get("DVM_RESULTS")
    if results:  # one file for all programs: {name: executor stats}
        os.makedirs(results, exist_ok=True)
        fpath = os.path.join(results, "programs.json")
        doc = json.load(open(fpath)) if os.path.exists(fpath) else {}
        doc[os.path.basename(path)[:-4]] = json.loads(json.dumps(st_, default=str))
        with open(fpath, "w") as f:
            json.dump(doc, f, indent=1)


def test_program_family_compiles_once(gpu):
    """The masked softmax program at other sizes: same kernel (symbolic dims), results still match."""
    prog, ins = _program(os.path.join(HERE, "programs", "masked_softmax.dvm"))
    ms_dynvm.run_program(prog, ins, device="cuda")
    before = ck.compiles()
    rng = np.random.default_rng(1)
    for rows, s in [(8, 33), (130, 512), (3, 2)]:
        x = rng.standard_normal((rows, s)).astype(np.float32)
        m = (rng.random((rows, s)) > 0.2).astype(np.float32)
        new = [ins[0], m, x]  # (the program's inputs: the scalar 1.0, the mask, the scores)
        ref_prog_out = _interpret_resized(prog, new)
        out = ms_dynvm.run_program(prog, new, device="cuda")
        assert_close(out, ref_prog_out, "f32", f"softmax {rows}x{s}")
    assert ck.compiles() == before


ROW_GROUPS = {"masked_softmax": groups.masked_softmax, "log_softmax": cases.log_softmax,
              "layer_norm_gelu_rows": lambda: groups.layer_norm_gelu(shape=(B, groups.S))}


@pytest.mark.parametrize("name", sorted(ROW_GROUPS))
def test_row_nest_register_and_general_paths(gpu, kcache, name):
    """A row nest has two paths: rows of at most blockDim.x * ROW_CACHE elements keep their elements
    in registers across the steps, longer rows loop over global memory. Both match the reference:
    long rows (general path at the launcher's block size), and short rows launched with one warp per
    row so that the general path runs them too, beside the default (register) launch."""
    from ms_dynvm.codegen.cuda.render import ROW_CACHE

    fn = ROW_GROUPS[name]()
    k = kern("rows_" + name, fn, kcache)
    rng = np.random.default_rng(7)
    syms = sorted({n for t in fn.types.values() for d in t.shape if not isinstance(d, int) for n in d.names})
    for env in ({s: (3 if s == "B" else 1024 * ROW_CACHE + 5) for s in syms},
                {s: (5 if s == "B" else 1024 * ROW_CACHE) for s in syms}):
        ins = arrays_for(fn, env, rng)
        with np.errstate(all="ignore"):
            ref = reference(fn, ins)
        assert_close(k(ins), ref, "f32", f"{name} {env}")
    env = {s: (9 if s == "B" else 200) for s in syms}
    ins = arrays_for(fn, env, rng)
    with np.errstate(all="ignore"):
        ref = reference(fn, ins)
    assert_close(k(ins), ref, "f32", f"{name} default launch")
    from ms_dynvm.runtime.device_pool import default_device_pool

    pool = default_device_pool()
    dev = [ck.to_device(np.asarray(a), t.dtype, pool) for a, (_, t) in zip(ins, k.params)]
    default = k.plan([a.shape for a in dev], [a.strides for a in dev], tuple(a.ptr % 16 == 0 for a in dev))
    assert any(block[0] * ROW_CACHE >= 200 for _, _, block, _ in default.launches)
    # (a fresh Plan: the kernel's own plans are cached)
    plan = ck.Plan([(f, grid, (32, 1, 1), vec) for f, grid, block, vec in default.launches],
                   default.scalars, default.temp_bytes, default.out_shapes)
    outs = k.run_device(dev, pool, plan=plan)
    got = [o.get() for o in outs]
    for a in dev + outs:
        a.release()
    pool.safe_point()
    assert_close(got, ref, "f32", f"{name} one warp per row (general path)")


def _interpret_resized(prog, inputs):
    """The reference at other input sizes: the program's types re-inferred (as the executor does)."""
    from ms_dynvm.bytecode.text import Reg
    from ms_dynvm.bytecode.types import TensorType
    from ms_dynvm.ir import registry
    from ms_dynvm.runtime.interpreter import run_instr

    types = dict(prog.types)
    vals = {}
    for i, a in zip(prog.inputs, inputs):
        types[i.reg] = TensorType(prog.types[i.reg].dtype, tuple(a.shape))
        vals[i.reg] = a
    for r, c in prog.consts.items():
        vals[r] = c
    for ins in prog.instrs():
        args = [types[int(x)] if isinstance(x, Reg) else x for x in ins.args]
        for r, t in zip(ins.outs, registry.infer(ins.op, args, ins.attrs)):
            types[r] = t
        run_instr(ins, vals, types)
    return [vals[r] for r in prog.outputs]


def test_disk_cache_second_process_compiles_nothing(gpu, tmp_path):
    code = (
        "import json, ms_dynvm\n"
        "from ms_dynvm.codegen.cuda import kernel as ck\n"
        "from tests.gpu import cases\n"
        "for name, fn in cases.named_groups(): ck.compile_group(fn)\n"
        "print(json.dumps(ck.compiles()))\n"
    )
    env = dict(os.environ, DYNVM_CACHE_DIR=str(tmp_path / "cache"))
    root = os.path.dirname(os.path.dirname(HERE))
    first = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert int(first.stdout.split()[-1]) == len(cases.named_groups())
    assert int(second.stdout.split()[-1]) == 0


def test_device_pool_reuses_after_safe_point(gpu):
    from ms_dynvm.codegen.cuda import driver
    from ms_dynvm.runtime.device_pool import DevicePool

    pool = DevicePool(stream=driver.stream(), headroom=None)
    a = pool.allocate(1 << 20)
    p = a.ptr
    a.release()
    b = pool.allocate(1 << 20)
    assert b.ptr != p  # pending until the safe point: a kernel may still read it
    b.release()
    pool.safe_point()
    c = pool.allocate(1 << 20)
    assert c.ptr in (p, b.ptr)
    c.release()
    pool.safe_point()
    s = pool.stats()
    assert s["reserved_bytes"] >= 2 << 20 if "reserved_bytes" in s else True


MATH = ["exp", "expm1", "log", "log1p", "log2", "tanh", "sigmoid", "erf", "erfc", "sin", "cos", "sqrt", "rsqrt",
        "gelu", "silu", "softplus"]


def _ulps(got, want64):
    w = want64.astype(np.float32)
    spacing = np.abs(np.spacing(w)).astype(np.float64)
    spacing[spacing == 0] = np.finfo(np.float32).tiny
    return np.abs(got.astype(np.float64) - want64) / spacing


def test_math_accuracy_measured(gpu, kcache):
    """Each device function against NumPy in float64 on 2^20 values (half in [-10, 10], half spread
    over the float32 range); the maximum error in float32 ulps is written to $DVM_RESULTS."""
    import math

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-10, 10, 1 << 19),
                        np.sign(rng.standard_normal(1 << 19)) * np.exp(rng.uniform(-80, 80, 1 << 19))])
    x = x.astype(np.float32)
    x64 = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    erfc = np.vectorize(math.erfc)
    ref = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "log2": np.log2, "tanh": np.tanh,
           "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "erf": erf, "erfc": erfc, "sin": np.sin, "cos": np.cos,
           "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "gelu": lambda v: 0.5 * v * erfc(-v / np.sqrt(2)),
           "silu": lambda v: v / (1 + np.exp(-v)), "softplus": lambda v: np.logaddexp(0, v)}
    out = {"cuda": {}, "eager_math": {}}
    for mode, eager in (("cuda", False), ("eager_math", True)):
        for name in MATH:
            g = G()
            p = g.param("f32", (1 << 20,))
            attrs = {"approximate": "none"} if name == "gelu" else {}
            g.op(name, p, **attrs)
            k = ck.compile_group(g.fn(), cache=kcache, eager_math=eager)
            (got,) = k([x])
            with np.errstate(all="ignore"):
                want = ref[name](x64)
            fin = np.isfinite(want) & (np.abs(want) < 3e38) & (np.abs(want) > 1.2e-38)
            u = _ulps(got[fin], want[fin])
            out[mode][name] = {"max_ulp": float(u.max()), "mean_ulp": float(u.mean()), "n": int(fin.sum())}
            if mode == "cuda":  # NaN where the true function is NaN (MindSpore's mish is not)
                nf = np.isnan(want)
                assert np.array_equal(np.isnan(got[nf]), np.isnan(want[nf])), name
    results = os.environ.get("DVM_RESULTS")
    if results:
        os.makedirs(results, exist_ok=True)
        with open(os.path.join(results, "cuda_math_accuracy.json"), "w") as f:
            json.dump(out, f, indent=1)
    # CUDA's own device functions (documented bounds: 1-4 ulp); the composites (gelu, silu, sigmoid,
    # softplus) and the eager_math formulas are measured and written down, not bounded here.
    for name in ("exp", "expm1", "log", "log1p", "log2", "tanh", "erf", "erfc", "sin", "cos", "sqrt", "rsqrt"):
        assert out["cuda"][name]["max_ulp"] <= 4, (name, out["cuda"][name])


def test_cuda_array_interface_tensors(gpu, kcache):
    """Zero-copy operands from another framework (PyTorch here; MindSpore-on-GPU would take the same
    adapter, untested: no MindSpore on the GPU machine)."""
    torch = pytest.importorskip("torch")
    from ms_dynvm.codegen.cuda import driver, interop

    fn = groups.masked_softmax()
    k = kern("masked_softmax_interop", fn, kcache)
    x = torch.randn(33, 70, device="cuda")
    m = (torch.rand(33, 70, device="cuda") > 0.3).float()
    assert interop.is_cuda_tensor(x) and not interop.is_cuda_tensor(np.zeros(3))
    torch.cuda.synchronize()
    outs = interop.run_kernel(k, [x, m])
    got = [o.get() for o in outs]
    ref = reference(fn, [x.cpu().numpy(), m.cpu().numpy()])
    assert_close(got, ref, "f32", "interop")
    xt = x.t()  # a strided view
    arr = interop.as_device_array(xt)
    assert arr.strides == (1, 70) and arr.ptr == x.data_ptr()
    for o in outs:
        o.release()
    driver.stream().synchronize()
