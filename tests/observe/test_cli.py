"""`python -m ms_dynvm`: report (from a saved stats file), dump, replay (a compile log), cache."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ms_dynvm
from ms_dynvm.__main__ import main
from ms_dynvm.codegen import compile_group
from ms_dynvm.metrics import METRICS
from ms_dynvm.runtime.cache import KernelCache
from tests.codegen import groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_report_from_saved_stats(tmp_path):
    pytest.importorskip("matplotlib")
    METRICS.op_names.extend(["AddExt"] * 50)
    METRICS.ops_opaque["Unique"] += 7
    METRICS.fallbacks["tier1: op_mismatch"] += 3
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(ms_dynvm.stats()))
    out = tmp_path / "out" / "r.html"
    r = subprocess.run([sys.executable, "-m", "ms_dynvm", "report", str(stats), "-o", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    html = out.read_text()
    assert "Unique" in html and "op_mismatch" in html and "opaque: no VM semantics" in html
    assert html.count("data:image/png;base64,") == 4  # the plots say what is missing instead


def test_report_refuses_other_json(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    assert main(["report", str(p)]) == 2
    assert "neither a report JSON" in capsys.readouterr().err


def test_dump_program_and_block(tmp_path, capsys):
    ms = pytest.importorskip("mindspore")
    from mindspore import ops

    with ms_dynvm.record() as rec:
        x = ms.Tensor(np.ones((2, 3), np.float32))
        ops.exp(x * 2.0 + 1.0).sum()
    path = tmp_path / "p.dvm"
    rec.program.save(str(path))
    assert main(["dump", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == rec.program.as_text()
    assert main(["dump", str(path), "--block", "0"]) == 0
    assert capsys.readouterr().out.startswith("func @")
    assert main(["dump", str(path), "--block", "99"]) == 2


@pytest.fixture(scope="module")
def compile_log_template(tmp_path_factory):
    """A compile log written by the runtime's hook (DYNVM_COMPILE_LOG) while two groups compile."""
    log = tmp_path_factory.mktemp("log") / "compiles.jsonl"
    old = os.environ.get("DYNVM_COMPILE_LOG")
    os.environ["DYNVM_COMPILE_LOG"] = str(log)
    try:
        cache = KernelCache(disk=False)
        compile_group(groups.chain(), cache=cache)
        compile_group(groups.masked_softmax(), cache=cache, eager_math=False)
    finally:
        if old is None:
            del os.environ["DYNVM_COMPILE_LOG"]
        else:
            os.environ["DYNVM_COMPILE_LOG"] = old
    return log.read_text()


@pytest.fixture
def compile_log(tmp_path, compile_log_template):
    p = tmp_path / "compiles.jsonl"
    p.write_text(compile_log_template)
    return p


def test_compile_log_entries(compile_log):
    entries = [json.loads(line) for line in compile_log.read_text().splitlines()]
    assert [e["outcome"] for e in entries] == ["built", "built"]
    assert entries[0]["group"] == [ins.op for ins in groups.chain().body]
    assert entries[1]["opts"] == {"strict_ieee": False, "fast_math": False, "eager_math": False}
    assert all(e["seconds"] > 0 and e["ir"].startswith("func @") and len(e["key"]) == 64 for e in entries)


def test_replay_ok(compile_log, capsys):
    assert main(["replay", str(compile_log)]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == 2 and "2 groups replayed, 0 failed" in out
    assert main(["dump", str(compile_log)]) == 0
    assert capsys.readouterr().out.count("func @") == 2


def test_replay_reports_a_failing_group(compile_log, capsys):
    g = groups.G()
    x, w = g.param("f32", (groups.B, 8)), g.param("f32", (8, 4))
    g.op("matmul", x, w)
    bad = {"ir": g.fn().as_text(), "opts": {}, "outcome": "error", "key": "0" * 64, "seconds": 0.0}
    with open(compile_log, "a") as f:
        f.write(json.dumps(bad) + "\n")
    assert main(["replay", str(compile_log), "--json", "--use-cache"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in res] == ["ok", "ok", "compile error"]
    assert "not supported by the C backend" in res[2]["error"]
    assert main(["replay", str(compile_log), "--index", "2", "--use-cache"]) == 1


def test_replay_catches_a_wrong_kernel(compile_log, monkeypatch, capsys):
    """The comparison can fail: a kernel that returns wrong values is a mismatch."""
    from ms_dynvm.codegen.kernel import CompiledKernel

    real = CompiledKernel.__call__
    monkeypatch.setattr(CompiledKernel, "__call__", lambda self, ins, out=None: [o + 1 for o in real(self, ins, out)])
    assert main(["replay", str(compile_log), "--index", "0", "--use-cache"]) == 1
    assert "mismatch" in capsys.readouterr().out


def test_cache_ls_verify_clear(tmp_path, capsys):
    d = tmp_path / "cache"
    c = KernelCache(str(d))
    keys = [f"{i:064x}" for i in range(3)]
    for k in keys:
        c.get_or_build(k, lambda k=k: b"payload " + k.encode())
    assert main(["cache", "ls", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "3 entries" in out and all(k in out for k in keys)
    assert main(["cache", "verify", "--dir", str(d)]) == 0
    assert "3 entries checked, 0 corrupt" in capsys.readouterr().out
    p = c.path(keys[1])
    data = bytearray(open(p, "rb").read())
    data[-1] ^= 1
    open(p, "wb").write(bytes(data))
    assert main(["cache", "verify", "--dir", str(d)]) == 1
    assert f"corrupt: {p}" in capsys.readouterr().out
    assert main(["cache", "verify", "--dir", str(d), "--delete"]) == 1
    assert not os.path.exists(p)
    assert main(["cache", "verify", "--dir", str(d)]) == 0
    assert main(["cache", "clear", "--dir", str(d)]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert main(["cache", "ls", "--dir", str(d), "-q"]) == 0
    assert "0 entries" in capsys.readouterr().out


def test_timeline(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "CPU OP"}},
        {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "ms_dynvm"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "kernel"}},
        {"ph": "X", "name": "MatMul", "pid": 1, "tid": 0, "ts": "1000.5", "dur": "30"},
        {"ph": "X", "name": "fused group served", "pid": 2, "tid": 1, "ts": 1040, "dur": 20},
        {"ph": "i", "name": "fallback: tier1: op_mismatch", "pid": 2, "tid": 1, "ts": 5000, "s": "t"},
        {"ph": "C", "name": "pool bytes", "pid": 2, "tid": 1, "ts": 1100, "args": {"live": 1}}]))
    png = tmp_path / "t.png"
    assert main(["timeline", str(trace), "-o", str(png)]) == 0
    assert "(3 events drawn)" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["timeline", str(trace), "-o", str(png), "--span-ms", "0.05"]) == 0
    assert "(2 events drawn)" in capsys.readouterr().out
    trace.write_text("[]")
    assert main(["timeline", str(trace), "-o", str(png)]) == 2
