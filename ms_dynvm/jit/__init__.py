"""The executor both tiers share, apart from the frontend that intercepts ops:

- `jit.compile`: the compile driver. `Compiler.consider(group, signature, n_ops, make_fn)` decides
  when a group is compiled (threshold or cost model), refuses what the one fusibility rule refuses
  (`passes.fuse.fusible`), generalises the Function over its shape family, runs the pass pipeline
  (`passes.pipeline.PIPELINE`), builds the kernel (`codegen`, through the kernel cache) on the
  background compile thread or in the caller, and installs it in the group (`GroupKernels`);
- `jit.launch`: which installed kernel serves an input layout (`find_family`), prepared launches
  (`Launch`, cached per layout), running one (`run`: results as NumPy arrays from the memory pool,
  `pool_for`), and OpenMP threads (`set_kernel_threads`).

Imports no MindSpore: a frontend hands it Functions, signatures and data pointers, and wraps the
NumPy results as framework tensors itself. Tier 1 (`frontend/tier1.py`) is its first user; a group
of another tier is any `GroupKernels` (the fallback table's keys carry `Compiler.tier`).
"""
