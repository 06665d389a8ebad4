"""pipeline: the passes in order, verification after each, IR logging at DYNVM_DEBUG>=3."""

import logging

import pytest
from hypothesis import given

from ms_dynvm.ir.function import Function
from ms_dynvm.ir.verifier import VerifyError
from ms_dynvm.passes.pipeline import PIPELINE, Pass, optimize, run_pipeline
from tests.passes.fxcheck import check_pass, elementwise_programs, parse


def test_pipeline_order():
    assert [p.name for p in PIPELINE] == ["dce", "cse", "simplify", "fold", "dce"]


def test_optimize_end_to_end():
    before = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %2 : f32[4,8] = mul(%0, 1.0)
      %3 : f32[4,8] = mul(%0, 1.0)
      %4 : f32[4,8] = add(%2, %3)
      %5 : f32[4,8] = fill() {shape=(4, 8), dtype="f32", value=2.0}
      %6 : f32[4,8] = mul(%5, 0.25)
      %7 : f32[4,8] = mul(%4, %6)
      %8 : f32[4,8] = neg(%7)
      %9 : f32[4,8] = neg(%8)
      %10 : f32[4,8] = exp(%1)
      return %9
    }""")
    expected = parse("""
    func @t(%0 : f32[4,8], %1 : f32[4,8]) {
      %4 : f32[4,8] = add(%0, %0)
      %6 : f32[4,8] = fill() {shape=(4, 8), dtype="f32", value=0.5}
      %7 : f32[4,8] = mul(%4, %6)
      return %7
    }""")
    after = optimize(before, verify_each=True)
    assert after == expected
    check_pass(before, after)


def test_verify_each_names_the_broken_pass(monkeypatch):
    def broken(fn: Function) -> Function:
        return Function(fn.name, fn.params, [], fn.outputs, fn.types)

    fn = parse("func @t(%0 : f32[4]) {\n  %1 : f32[4] = exp(%0)\n  return %1\n}")
    with pytest.raises(VerifyError, match="after pass 'broken'"):
        run_pipeline(fn, [Pass("broken", broken)], verify_each=True)
    run_pipeline(fn, [Pass("broken", broken)])  # not verified without the flag or DYNVM_DEBUG
    monkeypatch.setenv("DYNVM_DEBUG", "1")
    with pytest.raises(VerifyError):
        run_pipeline(fn, [Pass("broken", broken)])


def test_debug_3_logs_ir_after_each_pass(monkeypatch, caplog):
    monkeypatch.setenv("DYNVM_DEBUG", "3")
    fn = parse("func @t(%0 : f32[4]) {\n  %1 : f32[4] = mul(%0, 1)\n  return %1\n}")
    with caplog.at_level(logging.INFO, logger="ms_dynvm.passes"):
        optimize(fn)
    msgs = [r.getMessage() for r in caplog.records]
    # One log before and one after each pass, per round: the first round changed the function, so
    # a second round confirms the fixpoint.
    assert len(msgs) == 2 * (1 + len(PIPELINE))
    assert msgs[3].startswith("IR after simplify:") and "return %0" in msgs[3]
    assert msgs[1 + len(PIPELINE)].startswith("IR before passes:")


@given(elementwise_programs())
def test_random_programs(fn):
    after = optimize(fn, verify_each=True)
    check_pass(fn, after, seeds=[0])
    assert optimize(after) == after  # a fixpoint
