"""The executor both tiers share, apart from the frontend that intercepts ops:

- `jit.compile`: the compile driver. `Compiler.consider(group, signature, n_ops, make_fn)` decides
  when a group is compiled (threshold or cost model), refuses what the one fusibility rule refuses
  (`passes.fuse.fusible`), generalises the Function over its shape family, runs the pass pipeline
  (`passes.pipeline.PIPELINE`), builds the kernel (`codegen`, through the kernel cache) on the
  background compile thread or in the caller, and installs it in the group (`GroupKernels`);
- `jit.launch`: which installed kernel serves an input layout (`find_family`), prepared launches
  (`Launch`, cached per layout), running one (`run`: results as NumPy arrays from the memory pool,
  `pool_for`), and OpenMP threads (`set_kernel_threads`);
- `jit.replay`: tier 2's region plans (a recorded program through the pass pipeline, each step bound
  to NumPy, oneDNN's GEMM (`jit.gemm`), a C kernel (`jit.kernels`, `jit.builtins`) or the reference
  interpreter); `jit.optim`: the optimizer update rules replayed optimizer steps run.

Imports no MindSpore: a frontend hands it Functions, signatures, programs and data pointers, and
wraps the NumPy results as framework tensors itself. Tier 1 (`frontend/tier1.py`) and tier 2
(`frontend/regions.py`) are its users; a group of another tier is any `GroupKernels` (the fallback
table's keys carry `Compiler.tier`).

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
