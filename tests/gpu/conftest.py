"""Fixtures of the CUDA tests: `gpu` skips without pycuda or a CUDA device; `nvrtc_ok` skips
without NVRTC (rendering needs neither and always runs)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gpu():
    from ms_dynvm.codegen.cuda import driver

    if not driver.available():
        pytest.skip(f"no CUDA device through pycuda ({driver.unavailable_reason()})")
    return driver


@pytest.fixture(scope="session")
def kcache(tmp_path_factory):
    from ms_dynvm.runtime.cache import KernelCache

    return KernelCache(str(tmp_path_factory.mktemp("cuda_kcache")))
