"""A fixed C source of ms_dynvm's own (builtins, fused optimizer steps) built once per process.

`NativeLibrary(tag, source, setup)` compiles `source` with GCC on first use, through the kernel
cache on disk (keyed by tag, compiler, flags and source), loads it, and lets `setup(lib)` declare
the functions' ctypes signatures. Without a compiler (or where the build fails) `get()` returns
None and the caller keeps its NumPy path; the build is not tried again in this process.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable


class NativeLibrary:
    def __init__(self, tag: str, source: str, setup: Callable, strict_ieee: bool = False) -> None:
        self.tag = tag
        self.source = source
        self.setup = setup
        self.strict_ieee = strict_ieee
        self.tried = False  # whether get() has run (built, found or failed): no compile to ask this
        self._lib = None
        self._lock = threading.Lock()

    def get(self):
        """The loaded library, or None where it cannot be built."""
        with self._lock:
            if self.tried:
                return self._lib
            self.tried = True
            try:
                from ms_dynvm.codegen import gcc
                from ms_dynvm.runtime.cache import default_cache

                fl = gcc.flags(strict_ieee=self.strict_ieee)
                key = hashlib.sha256((self.tag + "\0" + gcc.compiler_info() + "\0" + " ".join(fl) + "\0"
                                      + self.source).encode()).hexdigest()
                lib = default_cache().get_or_build(key, lambda: gcc.compile_shared(self.source, fl),
                                                   gcc.load_shared, device="cpu")
                self.setup(lib)
                self._lib = lib
            except Exception:  # noqa: BLE001 - no compiler: the caller's NumPy path stays
                self._lib = None
            return self._lib
