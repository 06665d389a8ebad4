"""jit/fusion.py: a plan's elementwise chains as one compiled kernel step, bit-identical to the
unfused plan (no MindSpore needed)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ms_dynvm.bytecode.program import Program
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.codegen import gcc
from ms_dynvm.jit import fusion
from ms_dynvm.jit.replay import RegionPlan


def T(dt, *shape):
    return TensorType(dt, tuple(shape))


def _compiler() -> bool:
    try:
        gcc.compiler_info()
        return True
    except Exception:  # noqa: BLE001
        return False


needs_gcc = pytest.mark.skipif(not _compiler(), reason="no C compiler")


def _block(b, s, h):
    """The attention block's mask arithmetic and erf-form GELU around a matmul (a fusion boundary):
    scores * 0.125 + (1 - m) * -1e4; gelu(x @ w) = y * (1 + erf(y / sqrt 2)) * 0.5."""
    p = Program()
    sc = p.add_input(T("f32", b, s, s))
    m = p.add_input(T("f32", b, 1, s))
    x = p.add_input(T("f32", b * s, h))
    w = p.add_input(T("f32", h, h), "param", "w")
    bias = p.add_input(T("f32", h), "param", "b")
    two = p.add_const(np.array(2.0, np.float32))
    blk = p.new_block()
    (a,) = p.emit(blk, "mul", (sc, 0.125), {}, [T("f32", b, s, s)])
    (om,) = p.emit(blk, "sub", (1.0, m), {}, [T("f32", b, 1, s)])
    (mm,) = p.emit(blk, "mul", (om, -10000.0), {}, [T("f32", b, 1, s)])
    (sc2,) = p.emit(blk, "add", (a, mm), {}, [T("f32", b, s, s)])
    (y0,) = p.emit(blk, "matmul", (x, w), {"transpose_a": False, "transpose_b": True}, [T("f32", b * s, h)])
    (y,) = p.emit(blk, "bias_add", (y0, bias), {"axis": 1}, [T("f32", b * s, h)])
    (y3,) = p.emit(blk, "reshape", (y,), {"shape": (b, s, h)}, [T("f32", b, s, h)])
    (r2,) = p.emit(blk, "sqrt", (two,), {}, [T("f32")])
    (d,) = p.emit(blk, "div", (y3, r2), {}, [T("f32", b, s, h)])
    (e,) = p.emit(blk, "erf", (d,), {}, [T("f32", b, s, h)])
    (e1,) = p.emit(blk, "add", (e, 1.0), {}, [T("f32", b, s, h)])
    (g,) = p.emit(blk, "mul", (y3, e1), {}, [T("f32", b, s, h)])
    (g2,) = p.emit(blk, "mul", (g, 0.5), {}, [T("f32", b, s, h)])
    p.outputs = [int(sc2), int(g2)]
    return p, [int(sc), int(m), int(x), int(w), int(bias)]


def _arrays(rng, b, s, h):
    m = (rng.random((b, 1, s)) < 0.7).astype(np.float32)
    # wide values: erf saturates, 1 + erf cancels for y < -5 (the case a 1-ulp erf would show)
    return [rng.standard_normal((b, s, s)).astype(np.float32) * 30, m,
            (rng.standard_normal((b * s, h)) * 4).astype(np.float32), rng.standard_normal((h, h)).astype(np.float32),
            rng.standard_normal(h).astype(np.float32)]


@needs_gcc
@pytest.mark.parametrize("b,s,h", [(8, 64, 256), (3, 5, 7), (1, 1, 1), (2, 1, 9), (4, 3, 1), (0, 4, 3), (2, 0, 5)])
def test_fused_plan_equals_the_unfused_plan_bit_for_bit(b, s, h):
    p, ins = _block(b, s, h)
    unfused = RegionPlan.build(p, ins, p.outputs, fuse=False)
    p2, ins2 = _block(b, s, h)
    fused = RegionPlan.build(p2, ins2, p2.outputs, fuse=True).fuse_now()
    assert unfused.fused == []
    rng = np.random.default_rng(b * 100 + s * 10 + h)
    for _ in range(2):
        arrays = _arrays(rng, b, s, h)
        want = unfused.run(arrays)
        got = fused.run(arrays)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
            assert not any(np.shares_memory(g, a) for a in arrays)
    if b * s * h and b * s:
        ops = [tuple(ops) for _, _, ops in fused.fused]
        assert ("mul", "sub", "mul", "add") in ops  # the mask arithmetic: one step
        assert ("add", "mul", "mul") in ops  # the GELU after erf (erf: the C library's, on its own)
        # the Dense bias moved behind the reshape joins the division: one kernel from the GEMM's output
        assert ("bias_add", "reshape", "sqrt", "div") in ops
        assert not any("erf" in o for o in ops)
        assert "fused" in fused.describe()["fused"]
        assert len(fused.steps) < len(unfused.steps)


@needs_gcc
def test_one_kernel_serves_every_size_of_the_family():
    keys = set()
    for b, s, h in [(8, 64, 256), (4, 32, 256), (2, 16, 128)]:
        p, _ = _block(b, s, h)
        cands = fusion.candidates(list(p.instrs()), p.types, p.outputs)
        assert len(cands) >= 2
        keys.add(tuple(fusion.compile_candidate(c.fn).key for c in cands))
    assert len(keys) == 1


@needs_gcc
def test_fusion_runs_in_the_background_and_swaps_in(monkeypatch):
    monkeypatch.setattr(fusion, "_BUILT", {})  # (no kernel built in this process yet)
    p, ins = _block(4, 8, 16)
    plan = RegionPlan.build(p, ins, p.outputs, fuse=True)
    arrays = _arrays(np.random.default_rng(3), 4, 8, 16)
    first = plan.run(arrays)  # unfused; the compile starts
    n = len(plan.steps)
    fut = plan._fuse
    fut.result(timeout=120)
    again = plan.run(arrays)  # swapped in at the start of this run
    assert len(plan.steps) < n and plan._fuse is None
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


@needs_gcc
def test_a_further_size_swaps_its_built_kernels_in_at_its_first_run(monkeypatch):
    submitted = []
    from ms_dynvm.jit import compile as jcompile

    p, ins = _block(4, 8, 16)
    other = RegionPlan.build(p, ins, p.outputs, fuse=True)
    other.run(_arrays(np.random.default_rng(4), 4, 8, 16))
    other.fuse_now()  # (the family's kernels, built for another size)
    assert other.fused
    real = jcompile.compile_pool
    monkeypatch.setattr(jcompile, "compile_pool", lambda: submitted.append(1) or real())
    p2, ins2 = _block(2, 4, 16)
    plan = RegionPlan.build(p2, ins2, p2.outputs, fuse=True)
    unfused = RegionPlan.build(*_block(2, 4, 16)[:1], ins2, p2.outputs, fuse=False)
    arrays = _arrays(np.random.default_rng(5), 2, 4, 16)
    got = plan.run(arrays)
    assert plan._fuse is None and plan.fused and not submitted  # (fused from the first run, no thread)
    for a, b in zip(got, unfused.run(arrays)):
        np.testing.assert_array_equal(a, b)


def test_a_missing_compiler_leaves_the_plan_unfused_with_one_warning(monkeypatch):
    from ms_dynvm import warn as _warn

    def refuse(*a, **k):
        raise gcc.CompilerUnavailable("test: no compiler")

    monkeypatch.setattr(fusion, "prepare_candidate", refuse)
    monkeypatch.setattr(_warn, "_WARNED", set())
    p, ins = _block(2, 4, 8)
    plan = RegionPlan.build(p, ins, p.outputs, fuse=True)
    arrays = _arrays(np.random.default_rng(4), 2, 4, 8)
    want = RegionPlan.build(*_block(2, 4, 8)[:1], ins, p.outputs, fuse=False).run(arrays)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        plan.fuse_now()
        plan.fuse_now()
        got = plan.run(arrays)
    assert sum("no C compiler" in str(x.message) for x in w) == 1
    assert plan.fused == []
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


@needs_gcc
@pytest.mark.parametrize("n", [3 * 8192, 3 * 8192 + 1, 3 * 8192 + 17, 10 * 8192 - 1, 131072])
def test_flat_erf_on_two_threads_equals_the_c_librarys(n, monkeypatch):
    """The flat erf kernel over chunks on the caller and a helper thread (kernels.PARALLEL) gives
    the bits of one thread, for any tail, into a given buffer too."""
    from ms_dynvm.jit import kernels
    from ms_dynvm.runtime.interpreter import IMPLS

    k = kernels.flat_kernel("erf", {}, ("f32",), "f32")
    if k is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(kernels, "_HELPER", [kernels._Helper()])  # (on whatever the core count)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    x[::97] = np.linspace(-9, 9, x[::97].size, dtype=np.float32)
    two = k([x])
    out = np.empty_like(x)
    assert k([x], out) is out
    monkeypatch.setattr(kernels, "PAR_MIN", 1 << 40)  # one thread
    one = k([x])
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(out, one)
    np.testing.assert_array_equal(one, IMPLS["erf"]([x], {}))


def _residual_ln(b, s, h):
    """x + y then LayerNorm over the last axis (gamma, beta): one 'norm' group."""
    p = Program()
    x = p.add_input(T("f32", b, s, h))
    y = p.add_input(T("f32", b, s, h))
    g = p.add_input(T("f32", h), "param", "gamma")
    be = p.add_input(T("f32", h), "param", "beta")
    blk = p.new_block()
    (z,) = p.emit(blk, "add", (x, y), {}, [T("f32", b, s, h)])
    (o, _, _) = p.emit(blk, "layer_norm", (z, g, be), {"begin_norm_axis": -1, "begin_params_axis": -1, "eps": 1e-5},
                       [T("f32", b, s, h), T("f32", b, s, 1), T("f32", b, s, 1)])
    (r,) = p.emit(blk, "mul", (o, 2.0), {}, [T("f32", b, s, h)])
    p.outputs = [int(r)]
    return p, [int(x), int(y), int(g), int(be)]


@needs_gcc
@pytest.mark.parametrize("b,s,h", [(8, 64, 64), (3, 5, 7), (1, 1, 33), (2, 3, 1), (0, 4, 8)])
def test_fused_layer_norm_equals_the_interpreters_bit_for_bit(b, s, h):
    p, ins = _residual_ln(b, s, h)
    unfused = RegionPlan.build(p, ins, p.outputs, fuse=False)
    assert unfused.describe()["layer_norm"] == {"interpreter": 1}
    p2, ins2 = _residual_ln(b, s, h)
    fused = RegionPlan.build(p2, ins2, p2.outputs, fuse=True).fuse_now()
    rng = np.random.default_rng(b + s + h)
    arrays = [rng.standard_normal((b, s, h)).astype(np.float32) * 3, rng.standard_normal((b, s, h)).astype(np.float32),
              rng.standard_normal(h).astype(np.float32), rng.standard_normal(h).astype(np.float32)]
    want = unfused.run(arrays)
    got = fused.run(arrays)
    np.testing.assert_array_equal(got[0], want[0])
    if b * s * h and h > 1:
        assert any("layer_norm" in ops for _, _, ops in fused.fused)


@needs_gcc
def test_a_forked_process_starts_its_own_erf_helper(monkeypatch):
    """A child made by fork() has no helper thread: the first parallel erf there starts one (a queue
    whose worker is gone would block the replay)."""
    from ms_dynvm.jit import kernels

    k = kernels.flat_kernel("erf", {}, ("f32",), "f32")
    if k is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("DYNVM_REPLAY_THREADS", "2")
    monkeypatch.setattr(kernels, "_HELPER", [kernels._Helper()])
    old = kernels._helper()
    monkeypatch.setattr(old, "pid", -1)  # as the parent's helper looks from a forked child
    x = np.linspace(-4, 4, 5 * kernels.CHUNK, dtype=np.float32)
    got = k([x])
    assert kernels._helper() is not old
    monkeypatch.setattr(kernels, "PAR_MIN", 1 << 40)
    np.testing.assert_array_equal(got, k([x]))


def test_step_buffers_have_a_process_wide_budget(monkeypatch):
    """Plans stop keeping buffers past MAX_TOTAL_BUFFER_BYTES, and a plan's share returns when it goes."""
    import gc

    from ms_dynvm.jit import replay

    p, ins = _block(4, 8, 16)
    before = replay._total_bytes[0]
    plan = RegionPlan.build(p, ins, p.outputs, fuse=False)
    assert plan.arena_bytes > 0 and replay._total_bytes[0] == before + plan.arena_bytes
    monkeypatch.setattr(replay, "MAX_TOTAL_BUFFER_BYTES", replay._total_bytes[0])
    p2, ins2 = _block(4, 8, 16)
    assert RegionPlan.build(p2, ins2, p2.outputs, fuse=False).arena_bytes == 0
    del plan
    gc.collect()
    assert replay._total_bytes[0] == before


@needs_gcc
@pytest.mark.parametrize("shape", [(4, 33), (1, 7), (3, 1), (0, 5)])
def test_fused_selects_casts_and_clamps_equal_the_unfused_plan(shape):
    """The rest of FUSE_OPS (comparisons feeding where, masked_fill, casts, maximum/minimum, relu,
    neg, abs, square) fused against the unfused plan (NumPy fast paths and the interpreter), on
    values with NaN, infinities and signed zeros."""
    def build():
        p = Program()
        x = p.add_input(T("f32", *shape))
        y = p.add_input(T("f32", *shape))
        blk = p.new_block()
        (g,) = p.emit(blk, "gt", (x, y), {}, [T("bool", *shape)])
        (w,) = p.emit(blk, "where", (g, x, y), {}, [T("f32", *shape)])
        (mx,) = p.emit(blk, "maximum", (w, y), {}, [T("f32", *shape)])
        (mn,) = p.emit(blk, "minimum", (mx, 2.5), {}, [T("f32", *shape)])
        (r,) = p.emit(blk, "relu", (mn,), {}, [T("f32", *shape)])
        (n,) = p.emit(blk, "neg", (r,), {}, [T("f32", *shape)])
        (a,) = p.emit(blk, "abs", (x,), {}, [T("f32", *shape)])
        (sq,) = p.emit(blk, "square", (a,), {}, [T("f32", *shape)])
        (s,) = p.emit(blk, "add", (n, sq), {}, [T("f32", *shape)])
        (c,) = p.emit(blk, "cast", (g,), {"dtype": "f32"}, [T("f32", *shape)])
        (mf,) = p.emit(blk, "masked_fill", (s, g, -7.0), {}, [T("f32", *shape)])
        (o,) = p.emit(blk, "mul", (mf, c), {}, [T("f32", *shape)])
        (o2,) = p.emit(blk, "sub", (o, s), {}, [T("f32", *shape)])
        p.outputs = [int(o2), int(s)]
        return p, [int(x), int(y)]

    p, ins = build()
    unfused = RegionPlan.build(p, ins, p.outputs, fuse=False)
    p2, ins2 = build()
    fused = RegionPlan.build(p2, ins2, p2.outputs, fuse=True).fuse_now()
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    y = (rng.standard_normal(shape) * 3).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e30], np.float32)
    x.flat[: min(x.size, 7)] = special[: min(x.size, 7)]
    y.flat[: min(y.size, 7)] = special[::-1][: min(y.size, 7)]
    with np.errstate(all="ignore"):
        want = unfused.run([x, y])
        got = fused.run([x, y])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert np.array_equal(np.signbit(g), np.signbit(w))
    if x.size:
        assert fused.fused, fused.describe()
