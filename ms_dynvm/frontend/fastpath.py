"""The recorder's hot path in C (`_crecord.c`): built with gcc at first use, cached, loaded.

`Recorder.on_op` first offers each op to `_crecord.hit`, which records an op that finds its plan
(the common case of a steady loop: one instruction, or a cached lowering of several; tensor
arguments that are registers already, or become inputs and could not be linked to a view) exactly as on_op's Python plan-cache branch does, and returns False for anything else, which
then takes the Python path unchanged (tests/frontend/test_recorder.py checks both against a
reference recorder).

The extension is compiled from the source file next to this module with the kernels' compiler
(`codegen.gcc`, no shell) and stored in the kernel disk cache (`runtime/cache.py`: hash-checked,
atomic writes) under a key of the source, the compiler, the flags and the Python ABI, so a second
process loads it without compiling (about 1 s the first time). It is loaded from a private temporary
file that is unlinked right after. Any failure (no gcc, no Python headers, a failed build or load)
is one warning, and the Python path runs alone; `enable(c_hot_path=False)` asks for that.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import sysconfig
import tempfile
import threading
import warnings

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_crecord.c")
_FLAGS = ["-O2", "-fPIC", "-shared", "-std=gnu99", "-fno-strict-aliasing"]
_lock = threading.Lock()
_state: dict = {}  # "module" -> the loaded module, or None after a failure (not retried)


def _build_flags() -> list[str]:
    inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(inc, "Python.h")):
        raise RuntimeError(f"Python.h not found in {inc}")
    return _FLAGS + [f"-I{inc}"]


def _load_bytes(data: bytes, name: str = "ms_dynvm.frontend._crecord"):
    """The extension module `name` from the built shared object `data` (also used by profiling/)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    fd, path = tempfile.mkstemp(prefix="dvm-crecord-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        os.unlink(path)


HOT_PATH_TIMEOUT_S = 20  # its build takes about 1 s


def load():
    """The `_crecord` module, or None (with one warning) where it cannot be built or loaded."""
    with _lock:
        if "module" in _state:
            return _state["module"]
        mod = None
        try:
            from ms_dynvm.codegen import gcc
            from ms_dynvm.runtime.cache import KernelCache, make_key

            with open(_SOURCE) as f:
                source = f.read()
            flags = _build_flags()
            key = make_key({"artifact": "crecord", "source": hashlib.sha256(source.encode()).hexdigest(),
                            "compiler": gcc.compiler_info(), "flags": flags, "python": sys.version,
                            "soabi": sysconfig.get_config_var("SOABI")})
            # A cache of its own (same directory): the kernels' cache counters stay theirs.
            cache = KernelCache(capacity=2)
            # (inside enable(): a hung compiler holds it up HOT_PATH_TIMEOUT_S at most, once)
            mod = cache.get_or_build(key, lambda: gcc.compile_shared(source, flags, HOT_PATH_TIMEOUT_S),
                                     _load_bytes)
        except Exception as e:  # noqa: BLE001 - no C hot path is a slower recorder, not an error
            from ms_dynvm.codegen import gcc
            from ms_dynvm.warn import warn_once

            if isinstance(e, gcc.CompilerUnavailable):  # (tier 1 finds it missing too: one warning)
                warn_once("no-compiler", f"ms_dynvm: no C compiler ({str(e)[:300]}): the recorder's C hot "
                          "path is unavailable (recording in Python) and fused groups run eagerly",
                          stacklevel=3)
            else:
                warnings.warn(f"ms_dynvm: the recorder's C hot path is unavailable ({type(e).__name__}: "
                              f"{str(e)[:300]}); recording in Python", RuntimeWarning, stacklevel=3)
            mod = None
        _state["module"] = mod
        return mod
