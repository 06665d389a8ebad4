"""The executor both tiers share: plans and runs programs (no MindSpore imports here).

`ms_dynvm.jit` is also the user's decorator: `@ms_dynvm.jit` marks a function as a tier-2 region
(`ms_dynvm.frontend.regions.jit`). A package cannot be a function, so the package's module object
is made callable (its class swapped for a ModuleType subclass with `__call__`, which Python allows
for modules); the call imports the frontend, and so MindSpore, only when it is made.
"""

from __future__ import annotations

import sys
import types


class _CallableModule(types.ModuleType):
    def __call__(self, fn):
        """`@ms_dynvm.jit`: calls of `fn` are a tier-2 region (learned from recorded calls, then
        replayed as one program while ms_dynvm is enabled)."""
        from ms_dynvm.frontend.regions import jit as _jit

        return _jit(fn)


sys.modules[__name__].__class__ = _CallableModule
