"""jit: the executor's package imports without MindSpore; the pass pipeline keeps a group's calling
convention (params, output positions); the compile driver refuses what the fusibility rule refuses
and installs what it builds."""

from __future__ import annotations

import subprocess
import sys

from ms_dynvm.bytecode.types import Sym
from ms_dynvm.jit.compile import Compiler, GroupKernels, optimize
from ms_dynvm.metrics import METRICS, reset_stats
from ms_dynvm.runtime.signature import InputDesc
from tests.codegen.groups import G


def test_jit_imports_without_mindspore():
    code = ("import sys; sys.modules['mindspore'] = None\n"
            "import ms_dynvm.jit.compile, ms_dynvm.jit.launch\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_optimize_keeps_params_and_output_positions():
    g = G()
    x = g.param("f32", (Sym.of("B"), 8))
    a = g.op("mul", x, 0.5)
    b = g.op("mul", x, 0.5)  # the same value: cse keeps one
    c = g.op("mul", g.op("add", a, b), 1.0)  # x * 1 -> x: simplify
    fn = g.fn()
    out = optimize(fn)
    assert out.params == fn.params
    assert len(out.outputs) == len(fn.outputs)
    assert out.outputs[0] == out.outputs[1]  # both positions read the one mul
    assert sum(i.op == "mul" for i in out.body) == 1, out.as_text()
    assert int(c) in fn.outputs


class _Opts:
    compile_threshold = 1
    compile_policy = "threshold"
    compile_async = False
    strict_ieee = fast_math = False
    eager_math = True


def _sig(fn):
    g = GroupKernels()
    descs = [InputDesc(fn.types[r].dtype, tuple(fn.types[r].shape), "contiguous") for r in fn.params]
    return g, g.family.observe(descs)


def test_the_driver_refuses_what_the_rule_refuses(monkeypatch):
    from ms_dynvm import codegen

    built = []
    monkeypatch.setattr(codegen, "compile_group", lambda fn, **kw: built.append(fn) or object())
    installed = []
    comp = Compiler(_Opts(), installed.append)
    reset_stats()
    g = G()
    g.op("exp", g.param("f64", (4, 8)))  # no f64 exp in the C backend
    fn = g.fn()
    grp, sig = _sig(fn)
    grp.stats.calls = 1
    comp.consider(grp, sig, 1, lambda: fn)
    assert grp.stats.failed and not built and not installed
    assert any("unsupported" in k and "f64" in k for k in METRICS.fallbacks), dict(METRICS.fallbacks)

    g = G()
    g.op("exp", g.param("f32", (4, 8)))
    fn = g.fn()
    grp, sig = _sig(fn)
    grp.stats.calls = 1
    comp.consider(grp, sig, 1, lambda: fn)
    assert len(built) == 1 and installed == [grp] and sig in grp.kernels and comp.generation == 1
    assert grp.kernels[sig].fn.outputs == fn.outputs
