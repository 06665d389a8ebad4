"""The vectorised float32 erf (jit/libm.py) against the C library's erff, bit for bit."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from ms_dynvm.jit import kernels, libm

erf = libm.erf_f32()
pytestmark = pytest.mark.skipif(erf is None, reason="no C compiler, or erff computed another way here")

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.erff.restype = ctypes.c_float
_LIBM.erff.argtypes = [ctypes.c_float]


def _erff(x: np.ndarray) -> np.ndarray:
    return np.array([_LIBM.erff(float(v)) for v in x.reshape(-1)], np.float32).reshape(x.shape)


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _edges() -> np.ndarray:
    """Each branch boundary of erff's formula (2^-28, 2^-14, 0.84375, 1.25, 6), 3 ulps either side,
    both signs, and the special values."""
    pats = []
    for b in (0x31800000, 0x38800000, 0x3F580000, 0x3FA00000, 0x40C00000):
        pats += [b + d for d in range(-3, 4)]
    pats += [0, 1, 0x00800000, 0x04000000, 0x3F800000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000]
    u = np.array(pats, np.uint32)
    return np.concatenate([u, u | 0x80000000]).view(np.float32)


def test_erf_matches_erff_at_the_branch_edges_and_special_values():
    x = _edges()
    y = np.empty_like(x)
    erf(x.ctypes.data, y.ctypes.data, x.size)
    want = _erff(x)
    same = (_bits(y) == _bits(want)) | (np.isnan(y) & np.isnan(want))
    assert same.all(), x[~same]


@pytest.mark.parametrize("scale", [0.01, 0.7, 3.0])
def test_erf_matches_erff_on_drawn_values_and_in_place(scale):
    x = (np.random.default_rng(5).standard_normal(5000) * scale).astype(np.float32)
    want = _erff(x)
    y = np.empty_like(x)
    erf(x.ctypes.data, y.ctypes.data, x.size)
    np.testing.assert_array_equal(_bits(y), _bits(want))
    z = x.copy()
    erf(z.ctypes.data, z.ctypes.data, z.size)  # (the output may be the input: a plan reuses buffers)
    np.testing.assert_array_equal(_bits(z), _bits(want))


def test_erf_matches_erff_on_a_strided_sweep_of_all_bit_patterns():
    assert libm.check(65537) == 0  # (~65,000 values over every exponent, both signs)


def test_the_replay_erf_kernel_is_the_vectorised_one_and_keeps_erffs_bits():
    k = kernels.flat_kernel("erf", {}, ("f32",), "f32")
    x = (np.random.default_rng(6).standard_normal((3, 7, 11)) * 2).astype(np.float32)
    got = k([x])
    assert got.shape == x.shape
    np.testing.assert_array_equal(_bits(got), _bits(_erff(x)))
