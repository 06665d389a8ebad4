"""memplan: liveness of intermediates and greedy best-fit buffer reuse (static sizes only)."""

from ms_dynvm.passes.fuse import fuse
from ms_dynvm.passes.memplan import liveness, nbytes, plan
from tests.passes.fxcheck import parse


def test_reuse_after_last_use():
    fn = parse("""
    func @t(%0 : f32[4,8]) {
      %1 : f32[4,8] = exp(%0)
      %2 : f32[4,8] = neg(%1)
      %3 : f32[4,8] = tanh(%2)
      %4 : f16[4,8] = cast(%3) {dtype="f16"}
      %5 : f32[4,8] = add(%3, %0)
      %6 : f32[4,8] = sigmoid(%5)
      return %6, %4
    }""")
    assert liveness(fn) == {1: (0, 1), 2: (1, 2), 3: (2, 4), 5: (4, 5)}
    p = plan(fn)
    # %2 cannot take %1's buffer (both live at instr 1); %3 can (freed after instr 1); %4 is an
    # output (not planned); %5 reuses %2's buffer.
    assert p.assignment == {1: 0, 2: 1, 3: 0, 5: 1}
    assert p.sizes == [128, 128] and p.static_bytes == 256 and p.naive_bytes(fn) == 512
    for a in p.assignment:  # no two simultaneously live registers share a buffer
        for b in p.assignment:
            if a < b and p.assignment[a] == p.assignment[b]:
                assert p.live[a][1] < p.live[b][0]


def test_best_fit_and_smaller_reuse():
    fn = parse("""
    func @t(%0 : f32[4,4], %1 : f32[4]) {
      %2 : f32[4,4] = exp(%0)
      %3 : f32[4] = exp(%1)
      %4 : f32[4,4] = add(%2, %3)
      %5 : f32[4] = sum(%4) {axis=(1,), keepdims=False, dtype=None}
      %6 : f32[4,4] = add(%0, %5)
      %7 : f32[4,4] = exp(%6)
      return %7
    }""")
    p = plan(fn)
    # after instr 2, the 16-byte buffer of %3 and the 64-byte one of %2 are free: %5 (16 bytes)
    # takes the smallest that fits; %6 (64) takes %2's.
    assert p.assignment == {2: 0, 3: 1, 4: 2, 5: 1, 6: 0}
    assert p.sizes == [64, 16, 64] and p.naive_bytes(fn) == 64 * 3 + 16 * 2


def test_symbolic_sizes_get_own_buffers():
    fn = parse("""
    func @t(%0 : f32[B,8]) {
      %1 : f32[B,8] = exp(%0)
      %2 : f32[B,8] = neg(%1)
      %3 : f32[B,8] = tanh(%2)
      %4 : f32[8] = sum(%3) {axis=(0,), keepdims=False, dtype=None}
      %5 : f32[8] = exp(%4)
      %6 : f32[8] = neg(%5)
      %7 : f32[8] = exp(%6)
      return %7
    }""")
    p = plan(fn)
    assert len({p.assignment[r] for r in (1, 2, 3)}) == 3
    assert [str(p.sizes[p.assignment[r]]) for r in (1, 2, 3)] == ["32*B"] * 3
    assert p.assignment[4] == 3 and p.assignment[6] == 3 and p.sizes[3] == 32  # static ones are shared
    assert str(nbytes(fn.types[1])) == "32*B"


def test_plan_of_a_fused_group():
    fn = parse("""
    func @t(%0 : f32[4,8]) {
      %1 : f32[4,1] = max(%0) {axis=(-1,), keepdims=True}
      %2 : f32[4,8] = sub(%0, %1)
      %3 : f32[4,8] = exp(%2)
      %4 : f32[4,1] = sum(%3) {axis=(-1,), keepdims=True, dtype=None}
      %5 : f32[4,8] = div(%3, %4)
      return %5
    }""")
    [g] = fuse(fn)
    p = plan(g.function)
    assert set(p.assignment) == {1, 2, 3, 4}
    assert p.assignment[4] == p.assignment[1]  # %1 dies at instr 1, %4 (same size) takes its buffer
