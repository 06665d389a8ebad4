"""The backend protocol: each code generator says in one place what it can compile (`supports`),
renders a fusion group's kernel spec to source (`render`), and builds source into a loadable
artifact (`build`). Executors pick a backend by device and ask it; nothing outside a backend knows
its op coverage.

    backend = get_backend("cuda")
    ok, why = backend.supports(fn)      # no compiler or device needed
    source = backend.render(spec)       # spec = codegen.spec.lower(fn, ...)
    artifact = backend.build(source)    # bytes: a .so (C) or a cubin/PTX (CUDA)

`CBackend` is a thin adapter over the existing C path (codegen/kernel.py, c.py, gcc.py);
`CudaBackend` over codegen/cuda.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    name: str

    def supports(self, fn) -> tuple[bool, str]: ...

    def render(self, spec) -> str: ...

    def build(self, source: str) -> bytes: ...


class CBackend:
    """GCC: C99 from the kernel spec, built to a shared object."""

    name = "c"

    def __init__(self, *, strict_ieee: bool = False, fast_math: bool = False, eager_math: bool = True):
        self.options = {"strict_ieee": strict_ieee, "fast_math": fast_math}
        self.eager_math = eager_math

    def supports(self, fn) -> tuple[bool, str]:
        from ms_dynvm.codegen.kernel import supports

        return supports(fn)

    def render(self, spec) -> str:
        from ms_dynvm.codegen import c

        return c.render(spec, eager_math=self.eager_math, **self.options)

    def build(self, source: str) -> bytes:
        from ms_dynvm.codegen import gcc

        return gcc.compile_shared(source, gcc.flags(**self.options))


class CudaBackend:
    """NVRTC: CUDA C++ from the kernel spec (lowered with eager_math=False), built to a cubin for
    `arch` (default: the current device's; 90 without a device) or PTX."""

    name = "cuda"

    def __init__(self, *, strict_ieee: bool = False, fast_math: bool = False, arch: int | None = None):
        self.strict_ieee = strict_ieee
        self.fast_math = fast_math
        self.arch = arch

    def supports(self, fn) -> tuple[bool, str]:
        from ms_dynvm.codegen.cuda.kernel import supports

        return supports(fn)

    def render(self, spec) -> str:
        from ms_dynvm.codegen.cuda.render import render

        return render(spec)[0]

    def build(self, source: str) -> bytes:
        from ms_dynvm.codegen.cuda import driver, nvrtc
        from ms_dynvm.codegen.cuda.kernel import options

        arch = self.arch
        if arch is None:
            arch = driver.arch() if driver.available() else 90
        return nvrtc.compile_source(source, arch, options(self.strict_ieee, self.fast_math))


BACKENDS = {"c": CBackend, "cpu": CBackend, "cuda": CudaBackend}


def get_backend(device: str, **options) -> Backend:
    try:
        return BACKENDS[device](**options)
    except KeyError:
        raise ValueError(f"no backend for device {device!r}") from None


__all__ = ["BACKENDS", "Backend", "CBackend", "CudaBackend", "get_backend"]
