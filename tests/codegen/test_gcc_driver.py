"""The gcc driver: a compiler that hangs is killed whole (its children too) and reported as a
CodegenError; oversized sources are refused before gcc runs."""

import os
import stat
import time

import pytest

from ms_dynvm.codegen import gcc
from ms_dynvm.codegen.spec import CodegenError


def test_a_hanging_compiler_is_killed_with_its_children(tmp_path, monkeypatch):
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "fakecc"
    # Like gcc: the driver starts a long-running child (cc1) and waits for it.
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(gcc, "GCC", str(fake))
    monkeypatch.setattr(gcc, "COMPILE_TIMEOUT_S", 1)
    monkeypatch.setattr(gcc, "_REFUSE", [])  # (this process's later tests compile again)
    t0 = time.monotonic()
    with pytest.raises(CodegenError, match="more than 1 s"):
        gcc.compile_shared("int x;", [])
    assert time.monotonic() - t0 < 20
    # A compiler that hung once is not run again in the process: no second wait.
    t0 = time.monotonic()
    with pytest.raises(gcc.CompilerUnavailable, match="not run"):
        gcc.compile_shared("int y;", [])
    assert time.monotonic() - t0 < 0.5
    child = int(pidfile.read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment to reap
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":  # a zombie is dead
                break
        time.sleep(0.1)
    else:
        pytest.fail("the compiler's child process survived the timeout")


def test_exit_does_not_wait_for_a_hanging_background_compile(tmp_path):
    """A compile on a pool thread (tier 1's tier-up) with a compiler that hangs: the interpreter
    kills it at exit instead of waiting for its timeout."""
    import subprocess
    import sys

    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\nsleep 60 &\nwait\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    script = ("import concurrent.futures, time\n"
              "from ms_dynvm.codegen import gcc\n"
              "pool = concurrent.futures.ThreadPoolExecutor(1)\n"
              "fut = pool.submit(gcc.compile_shared, 'int x;', [])\n"
              "time.sleep(0.5)\n"
              "print('leaving')\n")
    env = dict(os.environ, DYNVM_CC=str(fake), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "leaving" in out.stdout, out.stderr
    assert time.monotonic() - t0 < 20  # (the compile timeout is 60 s)


def test_oversized_source_is_refused(monkeypatch):
    monkeypatch.setattr(gcc, "MAX_SOURCE_BYTES", 100)
    with pytest.raises(CodegenError, match="too large"):
        gcc.compile_shared("/*" + "x" * 200 + "*/", [])
