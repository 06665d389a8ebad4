"""Build generated C into a shared object with GCC and load it with ctypes.

Only generated source is compiled: the source is written to a private temporary directory and gcc is
run with an argument list (no shell). `compiler_info()` (gcc's version and target triple, cached per
process) and `flags(...)` feed the kernel cache key, so a compiler upgrade or a flag change never
loads a stale binary. A missing gcc or a failed compile raises `CodegenError` carrying gcc's output;
the caller falls back to eager execution. `CompilerUnavailable` (a CodegenError) means no compiler
runs at all: none on PATH, one that ran past its time limit once (it is not run again in the
process), or the interpreter exiting (running compiles are killed then, so exit does not wait for
a background compile). Its callers warn about it once per process (`ms_dynvm.warn.warn_once`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading

import concurrent.futures.thread  # noqa: F401 - its exit hook (joins pool threads) must register first

from ms_dynvm.codegen.spec import CodegenError


class CompilerUnavailable(CodegenError):
    """No C compiler to run: `GCC` is not on PATH or not executable, it hung once in this process
    (a compile ran past its timeout: it is not run again), or the interpreter is exiting."""


GCC = os.environ.get("DYNVM_CC", "gcc")
COMPILE_TIMEOUT_S = 60  # a kernel that takes longer is a fallback, not a wait (and gcc is not run again)
MAX_SOURCE_BYTES = 4 << 20  # generated C above this is refused (a blow-up, not a kernel)

# -fno-trapping-math lets GCC if-convert the branch-free math (it changes no result: we never read
# FP exception flags); -fno-math-errno lets sqrt/rint inline; -fwrapv gives integer ops NumPy's
# wrap-around semantics.
_BASE = ["-O3", "-march=native", "-std=gnu99", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
         "-fwrapv", "-fno-semantic-interposition"]


# GCC 12.2 at -O3 -march=native -fno-trapping-math on a CPU with AVX512-FP16 (this project's machine)
# vectorised a float16 value's rounding away: `(double)(float)(_Float16)x` fed to a float64 sum
# became a plain float -> double conversion, so a fused float16 sum to a scalar was up to 6 float16
# ulp off (measured). Without AVX512-FP16 it converts through F16C, correctly.
_NO_FP16_ARITH = "-mno-avx512fp16"


@functools.lru_cache(maxsize=None)
def _accepts(flag: str) -> bool:
    """gcc accepts `flag` (older ones do not know -mno-avx512fp16, and need it not)."""
    exe = shutil.which(GCC)
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, flag, "-E", "-x", "c", os.devnull], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def flags(*, strict_ieee: bool = False, fast_math: bool = False) -> list[str]:
    """GCC flags for a kernel build (part of the cache key)."""
    base = _BASE + ([_NO_FP16_ARITH] if _accepts(_NO_FP16_ARITH) else [])
    if strict_ieee:
        return base + ["-ffp-contract=off"]
    return base + ["-fopenmp"] + (["-DDVM_FAST=1"] if fast_math else [])


@functools.lru_cache(maxsize=None)
def compiler_info() -> str:
    """'gcc (Debian 12.2.0-...) 12.2.0 | x86_64-linux-gnu' (CodegenError when gcc is missing)."""
    exe = shutil.which(GCC)
    if exe is None:
        raise CompilerUnavailable(f"C compiler {GCC!r} not found on PATH")
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=True)
        machine = subprocess.run([exe, "-dumpmachine"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise CodegenError(f"cannot run {exe}: {e}") from e
    return f"{version.stdout.splitlines()[0].strip()} | {machine.stdout.strip()}"


def compile_shared(source: str, flag_list: list[str], timeout: float | None = None) -> bytes:
    """Compile C `source` with `flag_list`; returns the bytes of the shared object. A compile that
    runs past `timeout` (default COMPILE_TIMEOUT_S) is killed, and the compiler is not run again in
    this process (CompilerUnavailable): a hung compiler costs one wait, not one per kernel."""
    if _REFUSE:
        raise CompilerUnavailable(f"C compiler not run: {_REFUSE[0]}")
    limit = COMPILE_TIMEOUT_S if timeout is None else timeout
    exe = shutil.which(GCC)
    if exe is None:
        raise CompilerUnavailable(f"C compiler {GCC!r} not found on PATH")
    with tempfile.TemporaryDirectory(prefix="dvm-cc-") as d:
        src = os.path.join(d, "kernel.c")
        out = os.path.join(d, "kernel.so")
        with open(src, "w") as f:
            f.write(source)
        cmd = [exe, *flag_list, src, "-o", out, "-lm"]
        if len(source) > MAX_SOURCE_BYTES:
            raise CodegenError(f"generated source too large ({len(source)} bytes)")
        try:
            # Own process group: on a timeout the whole gcc pipeline (cc1, as, ld) is killed, not
            # only the driver (a killed driver leaves cc1 running).
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
        except OSError as e:
            raise CompilerUnavailable(f"gcc failed to run: {e}") from e
        _RUNNING.add(proc)
        try:
            _, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            _REFUSE.append(f"{GCC} took more than {limit} s once")
            raise CompilerUnavailable(f"{GCC} took more than {limit} s (not run again)") from None
        finally:
            _RUNNING.discard(proc)
        if _REFUSE and proc.returncode != 0:  # killed at exit
            raise CompilerUnavailable(f"C compiler stopped: {_REFUSE[0]}")
        if proc.returncode != 0:
            raise CodegenError(f"gcc exited with {proc.returncode}:\n{stderr[-4000:]}")
        with open(out, "rb") as f:
            return f.read()


_RUNNING: set = set()  # compiler processes running now
_REFUSE: list = []  # why no compiler is run any more in this process (empty: it is)


def _stop_compiles() -> None:
    """At interpreter exit, before the pool threads are joined (threading's exit hooks run last
    registered first, and concurrent.futures' registered before this module's): kill the running
    compilers so that exit does not wait for them, and start no other."""
    _REFUSE.append("the interpreter is exiting")
    for proc in list(_RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


if hasattr(threading, "_register_atexit"):  # (CPython >= 3.9)
    threading._register_atexit(_stop_compiles)


def load_shared(data: bytes) -> ctypes.CDLL:
    """Load shared-object bytes: written to a fresh private file (0600), dlopen'ed, then unlinked, so
    nobody can swap the file between its integrity check and the load."""
    fd, path = tempfile.mkstemp(prefix="dvm-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(path)
    finally:
        os.unlink(path)


__all__ = ["compile_shared", "compiler_info", "flags", "load_shared"]
