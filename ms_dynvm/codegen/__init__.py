"""Code generation: fusion group (IR Function) -> backend-neutral kernel spec -> C (GCC) kernels.

Pipeline: `spec.lower` (loop nests, index math, reductions with prologue/epilogue) ->
`c.render` (C99, vectorisable inner loops, OpenMP, own vectorised math in `cmath`) ->
`gcc.compile_shared` (.so, cached by `ms_dynvm.runtime.cache`) -> `kernel.CompiledKernel`.
"""

from ms_dynvm.codegen.kernel import CompiledKernel, canonical_text, compile_group, prepare_group, supports
from ms_dynvm.codegen.spec import CodegenError

__all__ = ["CodegenError", "CompiledKernel", "canonical_text", "compile_group", "prepare_group", "supports"]
