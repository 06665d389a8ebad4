"""jit/replay.py, jit/gemm.py, jit/builtins.py, jit/kernels.py against the reference interpreter
(no MindSpore needed)."""

from __future__ import annotations

import numpy as np
import pytest

from ms_dynvm.bytecode.program import Instr, Program
from ms_dynvm.bytecode.text import Reg
from ms_dynvm.bytecode.types import TensorType
from ms_dynvm.jit import builtins, gemm, kernels
from ms_dynvm.jit.replay import NotReplayable, RegionPlan
from ms_dynvm.runtime.interpreter import interpret


def T(dt, *shape):
    return TensorType(dt, tuple(shape))


def _mlp_program():
    p = Program()
    x = p.add_input(T("f32", 6, 10))
    w = p.add_input(T("f32", 8, 10), "param", "w")
    b = p.add_input(T("f32", 8), "param", "b")
    ids = p.add_input(T("i32", 6))
    blk = p.new_block()
    (h,) = p.emit(blk, "matmul", (x, w), {"transpose_a": False, "transpose_b": True}, [T("f32", 6, 8)])
    (h,) = p.emit(blk, "bias_add", (h, b), {"axis": 1}, [T("f32", 6, 8)])
    (r,) = p.emit(blk, "relu", (h,), {}, [T("f32", 6, 8)])
    (e,) = p.emit(blk, "erf", (h,), {}, [T("f32", 6, 8)])
    (sq,) = p.emit(blk, "pow", (e, 2.0), {}, [T("f32", 6, 8)])
    (sm,) = p.emit(blk, "softmax", (sq,), {"axis": -1}, [T("f32", 6, 8)])
    (seg,) = p.emit(blk, "unsorted_segment_sum", (sm, ids), {"num_segments": 4}, [T("f32", 4, 8)])
    (g,) = p.emit(blk, "matmul", (r, x), {"transpose_a": True, "transpose_b": False}, [T("f32", 8, 10)])
    (s,) = p.emit(blk, "sum", (g,), {"axis": (1,), "keepdims": False, "dtype": None}, [T("f32", 8)])
    (dead,) = p.emit(blk, "exp", (s,), {}, [T("f32", 8)])
    p.outputs = [int(seg), int(g), int(s)]
    return p, [int(x), int(w), int(b), int(ids)]


def _inputs(rng):
    return [rng.standard_normal((6, 10)).astype(np.float32), rng.standard_normal((8, 10)).astype(np.float32),
            rng.standard_normal(8).astype(np.float32), rng.integers(-1, 5, 6).astype(np.int32)]


def test_plan_matches_the_interpreter_and_drops_dead_code():
    p, ins = _mlp_program()
    plan = RegionPlan.build(p, ins, p.outputs, optimize=False)
    assert "exp" not in plan.describe()  # dead: no output needs it
    rng = np.random.default_rng(0)
    for _ in range(3):
        arrays = _inputs(rng)
        got = plan.run(arrays)
        want = interpret(p, arrays)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


def test_plan_through_the_pass_pipeline_matches_too():
    p, ins = _mlp_program()
    plan = RegionPlan.build(p, ins, p.outputs)
    arrays = _inputs(np.random.default_rng(1))
    for g, w in zip(plan.run(arrays), interpret(p, arrays)):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


def test_outputs_are_fresh_arrays_never_inputs():
    p = Program()
    x = p.add_input(T("f32", 3, 4))
    blk = p.new_block()
    (v,) = p.emit(blk, "reshape", (x,), {"shape": (4, 3)}, [T("f32", 4, 3)])
    p.outputs = [int(x), int(v)]
    plan = RegionPlan.build(p, [int(x)], p.outputs, optimize=False)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    o1, o2 = plan.run([a])
    assert not np.shares_memory(o1, a) and not np.shares_memory(o2, a)
    np.testing.assert_array_equal(o2, a.reshape(4, 3))


def test_extra_groups_are_spliced_after_what_they_read():
    p = Program()
    x = p.add_input(T("f32", 5, 3))
    blk = p.new_block()
    (y,) = p.emit(blk, "mul", (x, 2.0), {}, [T("f32", 5, 3)])
    (z,) = p.emit(blk, "add", (y, 1.0), {}, [T("f32", 5, 3)])
    t1, t2 = 100, 101
    p.types[t1] = T("f32", 5, 3)
    p.types[t2] = T("f32", 3)
    group = [Instr("mul", (Reg(y), Reg(y)), {}, (t1,)),
             Instr("sum", (Reg(t1),), {"axis": (0,), "keepdims": False, "dtype": None}, (t2,))]
    plan = RegionPlan.build(p, [int(x)], [int(z), t2], [group], optimize=False)
    a = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    z_, s_ = plan.run([a])
    np.testing.assert_allclose(s_, ((2 * a) ** 2).sum(0), rtol=1e-6)


def test_unplannable_programs_say_why():
    p = Program()
    x = p.add_input(T("f32", 4))
    blk = p.new_block()
    (y, m) = p.emit(blk, "dropout", (x,), {"p": 0.5}, [T("f32", 4), T("f32", 4)])
    p.outputs = [int(y)]
    with pytest.raises(NotReplayable, match="random"):
        RegionPlan.build(p, [int(x)], p.outputs)
    q = Program()
    x = q.add_input(T("f32", 4))
    blk = q.new_block()
    (y,) = q.emit(blk, "exp", (Reg(99),), {}, [T("f32", 4)])
    q.types[99] = T("f32", 4)
    with pytest.raises(NotReplayable, match="no input or op supplies"):
        RegionPlan.build(q, [int(x)], [int(y)], optimize=False)


@pytest.mark.parametrize("sa,sb,ta,tb", [((7, 5), (5, 3), False, False), ((7, 5), (3, 5), False, True),
                                         ((5, 7), (5, 3), True, False), ((1, 5), (3, 5), False, True),
                                         ((2, 4, 5), (3, 5), False, True), ((2, 4, 5), (2, 5, 3), False, False),
                                         ((2, 5, 4), (2, 5, 3), True, False), ((0, 5), (5, 3), False, False),
                                         ((4, 0), (0, 3), False, False)])
def test_gemm_matches_numpy(sa, sb, ta, tb):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    want = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    got = gemm.matmul(a, b, ta, tb)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # transposed views (F-contiguous) and strided views go through as well
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    np.testing.assert_allclose(gemm.matmul(at, b, ta, tb), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb,ta,tb", [((8, 64, 64), (8, 64, 64), False, True), ((3, 5, 7), (3, 7, 4), False, False),
                                         ((4, 6, 5), (4, 7, 6), True, True), ((2, 1, 4, 5), (3, 5, 6), False, False),
                                         ((1, 1, 1), (1, 1, 1), False, False), ((0, 3, 5), (0, 5, 2), False, False),
                                         ((2, 0, 5), (2, 5, 3), False, False), ((2, 3, 0), (2, 0, 4), False, False)])
def test_batched_gemm_c_loop_equals_one_gemm_per_batch(sa, sb, ta, tb, monkeypatch):
    """The C batch loop (builtins.batched_sgemm) runs the same GEMM per batch as the Python loop:
    the same bits, on contiguous, transposed (column-major) and broadcast (batch stride 0) operands."""
    if gemm.BACKEND != "onednn" or builtins.batched_sgemm() is None:
        pytest.skip("no oneDNN or no C compiler")
    rng = np.random.default_rng(5)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)  # a transposed view
    assert gemm._batch_loop() is not None  # (the library is loaded: the C loop serves)
    got = [gemm.matmul(a, b, ta, tb), gemm.matmul(a, bt, ta, tb)]
    monkeypatch.setattr(gemm, "_LOOP", [None])  # the Python loop, one dnnl_sgemm per batch
    wants = [gemm.matmul(a, b, ta, tb), gemm.matmul(a, bt, ta, tb)]
    for g, want in zip(got, wants):
        assert g.shape == want.shape
        np.testing.assert_array_equal(g, want)
    ref = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_segment_sum_builtin_equals_the_interpreter():
    from ms_dynvm.runtime.interpreter import IMPLS

    if not builtins.available():
        pytest.skip("no C compiler: the builtin is not built (the interpreter's implementation is used)")
    rng = np.random.default_rng(4)
    for idt in (np.int32, np.int64):
        x = rng.standard_normal((300, 7)).astype(np.float32)
        ids = rng.integers(-3, 40, 300).astype(idt)
        np.testing.assert_array_equal(builtins.segment_sum(x, ids, 37),
                                      IMPLS["unsorted_segment_sum"]([x, ids], {"num_segments": 37}))


def test_flat_erf_kernel_is_the_c_librarys():
    from ms_dynvm.runtime.interpreter import IMPLS

    k = kernels.flat_kernel("erf", {}, ("f32",), "f32")
    if k is None:
        pytest.skip("no C compiler: erf stays with the interpreter")
    x = np.linspace(-9, 9, 30000, dtype=np.float32).reshape(3, -1)
    np.testing.assert_array_equal(k([x]), IMPLS["erf"]([x], {}))


def test_buffers_are_reused_only_where_nothing_else_sees_them():
    """exp(x) is read last by the add, but a reshape of it (a view) is read after: the add must not
    write into exp's buffer. The second add may reuse its operand."""
    p = Program()
    x = p.add_input(T("f32", 4, 6))
    blk = p.new_block()
    (e,) = p.emit(blk, "exp", (x,), {}, [T("f32", 4, 6)])
    (v,) = p.emit(blk, "reshape", (e,), {"shape": (6, 4)}, [T("f32", 6, 4)])
    (a,) = p.emit(blk, "add", (e, 1.0), {}, [T("f32", 4, 6)])
    (m,) = p.emit(blk, "mul", (v, 2.0), {}, [T("f32", 6, 4)])
    (n,) = p.emit(blk, "neg", (x,), {}, [T("f32", 4, 6)])
    (b,) = p.emit(blk, "add", (n, 3.0), {}, [T("f32", 4, 6)])
    p.outputs = [int(a), int(m), int(b)]
    plan = RegionPlan.build(p, [int(x)], p.outputs, optimize=False)
    assert plan.n_inplace == 3  # (statically; at run time the view and the viewed buffer are refused)
    arr = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    ga, gm, gb = plan.run([arr])
    np.testing.assert_allclose(ga, np.exp(arr) + 1, rtol=1e-6)
    np.testing.assert_allclose(gm, (np.exp(arr) * 2).reshape(6, 4), rtol=1e-6)
    np.testing.assert_allclose(gb, 3 - arr, rtol=1e-6)


def test_bias_add_writes_into_a_dead_product():
    p = Program()
    x = p.add_input(T("f32", 5, 7))
    w = p.add_input(T("f32", 3, 7))
    b = p.add_input(T("f32", 3))
    blk = p.new_block()
    (h,) = p.emit(blk, "matmul", (x, w), {"transpose_a": False, "transpose_b": True}, [T("f32", 5, 3)])
    (y,) = p.emit(blk, "bias_add", (h, b), {"axis": 1}, [T("f32", 5, 3)])
    p.outputs = [int(y)]
    plan = RegionPlan.build(p, [int(x), int(w), int(b)], p.outputs, optimize=False)
    assert plan.n_inplace == 1
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32),
              rng.standard_normal(3).astype(np.float32)]
    np.testing.assert_allclose(plan.run(arrays)[0], arrays[0] @ arrays[1].T + arrays[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(arrays[2], arrays[2].copy())  # (the bias, an input, untouched)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_relu_and_its_gradient_fast_paths_give_the_masked_selects_bits(dt):
    """`_relu` (fmax) and `_relu_grad` (a bit mask) equal np.where(x > 0, ., +0.0) bit for bit:
    nan, +-inf, -0.0 included, any length (vector loops and their tails), non-contiguous dy."""
    from ms_dynvm.jit import replay as rp

    rng = np.random.default_rng(0)
    u = np.dtype(f"u{np.dtype(dt).itemsize}")
    zero = np.zeros((), dt)
    for n in (1, 7, 33, 1000):
        x = rng.standard_normal(n).astype(dt)
        x[::5], x[1::7], x[2::11], x[3::13], x[4::9] = -0.0, np.nan, np.inf, -np.inf, 0.0
        dy = rng.standard_normal(n).astype(dt)
        dy[::3], dy[1::4], dy[2::6] = np.nan, -0.0, np.inf
        assert (rp._relu([x], {}).view(u) == np.where(x > 0, x, zero).view(u)).all()
        assert (rp._relu_grad([dy, x], {}).view(u) == np.where(x > 0, dy, zero).view(u)).all()
    y = rng.standard_normal((6, 8)).astype(dt)
    d = rng.standard_normal((8, 6)).astype(dt).T
    assert (rp._relu_grad([d, y], {}).view(u) == np.where(y > 0, d, zero).view(u)).all()


def test_step_buffers_are_reused_across_runs_but_never_under_a_held_result():
    """Steps keep their result buffers from run to run (no page faults per replay), but an array the
    caller still holds (an output, or a view of one) is never written by a later run."""
    p = Program()
    x = p.add_input(T("f32", 16, 32))
    w = p.add_input(T("f32", 8, 32), "param", "w")
    b = p.add_input(T("f32", 8))
    blk = p.new_block()
    (h,) = p.emit(blk, "matmul", (x, w), {"transpose_a": False, "transpose_b": True}, [T("f32", 16, 8)])
    (y,) = p.emit(blk, "bias_add", (h, b), {"axis": 1}, [T("f32", 16, 8)])
    (e,) = p.emit(blk, "exp", (y,), {}, [T("f32", 16, 8)])
    (s,) = p.emit(blk, "softmax", (e,), {"axis": -1}, [T("f32", 16, 8)])
    (m,) = p.emit(blk, "mul", (s, 3.0), {}, [T("f32", 16, 8)])
    (a,) = p.emit(blk, "add", (m, y), {}, [T("f32", 16, 8)])
    p.outputs = [int(a), int(s)]
    plan = RegionPlan.build(p, [int(x), int(w), int(b)], p.outputs, optimize=False, fuse=False)
    assert plan.arena_bytes > 0
    rng = np.random.default_rng(8)

    def inputs():
        return [rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((8, 32)).astype(np.float32),
                rng.standard_normal(8).astype(np.float32)]

    held, copies = [], []
    for k in range(4):
        arrays = inputs()
        outs = plan.run(arrays)
        want = interpret(p, arrays)
        for g, wv in zip(outs, want):
            # (a 32-term GEMM in oneDNN's order against the interpreter's: terms of ~3 cancel to
            # values near 0, so the floor follows the terms' size; oneDNN's order depends on the ISA)
            np.testing.assert_allclose(g, wv, rtol=2e-6, atol=2e-5)
        assert not np.shares_memory(outs[0], outs[1])
        if k % 2 == 0:  # hold these (and a view of one) across the next runs
            held.append((outs, outs[0][::2]))
            copies.append([o.copy() for o in outs])
    for (outs, view), cp in zip(held, copies):
        for o, c in zip(outs, cp):
            np.testing.assert_array_equal(o, c)
        np.testing.assert_array_equal(view, cp[0][::2])
    # temporaries (the product, exp) keep their buffer from run to run
    plan.run(inputs())
    bufs = [id(plan.holders[int(r)][-1][0]) for r in (h, e)]  # (ids: a reference would pin them)
    plan.run(inputs())
    assert [id(plan.holders[int(r)][-1][0]) for r in (h, e)] == bufs


def test_gemm_run2d_pointer_cache_follows_the_arrays():
    """run2d's pointer cache: the same arrays (contents changed in place) reuse their pointers; new
    arrays, and arrays that died and were replaced (maybe at the same id), are read afresh. The bits
    equal an uncached call's."""
    if gemm.BACKEND != "onednn":
        pytest.skip("no oneDNN")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    c = np.empty((16, 32), np.float32)
    p = gemm.prepare2d(a, w, False, True)
    ptrs = gemm.new_ptrs()

    def want(x, y):
        return gemm.run2d(p, x, y, np.empty((16, 32), np.float32))

    np.testing.assert_array_equal(gemm.run2d(p, a, w, c, ptrs), want(a, w))
    kept = list(ptrs)
    a[:] = rng.standard_normal(a.shape)  # (in place: the same array, its pointer kept)
    np.testing.assert_array_equal(gemm.run2d(p, a, w, c, ptrs), want(a, w))
    assert ptrs[1] == kept[1] and ptrs[0] is kept[0]
    for _ in range(20):  # new operand and result arrays each call (ids may be reused after a free)
        a = rng.standard_normal((16, 64)).astype(np.float32)
        w = np.ascontiguousarray(rng.standard_normal((32, 64)).astype(np.float32))
        c = np.empty((16, 32), np.float32)
        got = gemm.run2d(p, a, w, c, ptrs)
        assert got is c and ptrs[1] == a.ctypes.data and ptrs[3] == w.ctypes.data and ptrs[5] == c.ctypes.data
        np.testing.assert_array_equal(got, want(a, w))
        del a, w, c, got
