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
    t0 = time.monotonic()
    with pytest.raises(CodegenError, match="more than 1 s"):
        gcc.compile_shared("int x;", [])
    assert time.monotonic() - t0 < 20
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


def test_oversized_source_is_refused(monkeypatch):
    monkeypatch.setattr(gcc, "MAX_SOURCE_BYTES", 100)
    with pytest.raises(CodegenError, match="too large"):
        gcc.compile_shared("/*" + "x" * 200 + "*/", [])
