"""float32 erf with the C library's bits, vectorised where the C library's own formula is plain
arithmetic.

MindSpore's CPU erf is glibc's `erff` (a float version of fdlibm's erf), and the erf-form GELU
shows every last bit of it (1 + erf(x / sqrt 2) cancels for x < -5), so a replayed plan computes
erf as `erff` does, bit for bit (`kernels.LIBM`). `erff` is scalar and costs ~20-30 ns an element
on this project's Xeon: the largest step of a replayed attention block. For 2^-14 <= |x| < 1.25
its formula is two rational approximations in float arithmetic (no exp): x + x * P(x^2) / Q(x^2)
below 0.84375, sign(x) * (c + P(|x| - 1) / Q(|x| - 1)) above, with fdlibm's published coefficients
(Sun Microsystems, 1993; given here by their bit patterns). `dvm_erf_f32` computes those two
branches for a whole block in a vectorised loop (float arithmetic in the same order, no contraction:
`-ffp-contract=off`, so the same roundings) and calls `erff` itself for every other element (tiny,
|x| >= 1.25 where exp enters, Inf, NaN), found with AVX-512's compress where the machine has it and
a branch-free scan where not. For GELU inputs of unit spread about 8% of the elements take `erff`; the replayed attention
block's erf step at (4, 32) went from 575 to 166 us (`profiling/bench/profile_replay.py --size 4,32`,
Intel Xeon, AVX-512).

Checked, not assumed: the C library of another machine may compute erff another way (an FMA build,
a newer glibc with CORE-MATH's correctly rounded erff). On first use `dvm_erf_check` compares the
vectorised erf with `erff` on every 65521st float32 bit pattern (about 65,000 values over every
exponent, both signs, ~2 ms: another erff differs from this one on a few percent of inputs or
more); any difference and `erf_f32` is None (the plan keeps the scalar kernel). The full
comparison over all 2^32 patterns (0 differences on this project's machine, glibc 2.36) is
`profiling/tools/check_erf.py`.
"""

from __future__ import annotations

import ctypes

from ms_dynvm.jit.native import NativeLibrary

CHECK_STEP = 65521

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

static inline float dvm_bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t dvm_f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
#define DVM_ERF_LO 0x38800000u /* 2^-14: below, the C library's own path */
#define DVM_ERF_MID 0x3f580000u /* 0.84375 */
#define DVM_ERF_HI 0x3fa00000u /* 1.25: from here on exp is involved: the C library's own path */
#define DVM_ERF_BLOCK 512

void dvm_erf_f32(const float *x, float *y, int64_t n) {
    const float pp0 = dvm_bits_f(0x3e0375d4u), pp1 = dvm_bits_f(0xbea66bebu), pp2 = dvm_bits_f(0xbce9528fu),
                pp3 = dvm_bits_f(0xbbbd1489u), pp4 = dvm_bits_f(0xb7c756b1u);
    const float qq1 = dvm_bits_f(0x3ecbbbceu), qq2 = dvm_bits_f(0x3d852a63u), qq3 = dvm_bits_f(0x3ba68116u),
                qq4 = dvm_bits_f(0x390aee49u), qq5 = dvm_bits_f(0xb684e21au);
    const float pa0 = dvm_bits_f(0xbb1acdc6u), pa1 = dvm_bits_f(0x3ed46805u), pa2 = dvm_bits_f(0xbebe9208u),
                pa3 = dvm_bits_f(0x3ea2fe54u), pa4 = dvm_bits_f(0xbde31cc2u), pa5 = dvm_bits_f(0x3d1151b3u),
                pa6 = dvm_bits_f(0xbb0df9c0u);
    const float qa1 = dvm_bits_f(0x3dd9f331u), qa2 = dvm_bits_f(0x3f0a5785u), qa3 = dvm_bits_f(0x3d931ae7u),
                qa4 = dvm_bits_f(0x3e013307u), qa5 = dvm_bits_f(0x3c5f6e13u), qa6 = dvm_bits_f(0x3c445aa3u);
    const float erx = dvm_bits_f(0x3f58560bu);
    for (int64_t b0 = 0; b0 < n; b0 += DVM_ERF_BLOCK) {
        int64_t m = n - b0 < DVM_ERF_BLOCK ? n - b0 : DVM_ERF_BLOCK;
        const float *xb = x + b0;
        float *yb = y + b0;
        /* the elements the C library computes, read before y (which may be x) is written */
        int32_t idx[DVM_ERF_BLOCK + 1];
        float val[DVM_ERF_BLOCK + 1];
        int k = 0;
        int64_t i0 = 0;
#ifdef __AVX512F__
        {
            const __m512i lo = _mm512_set1_epi32((int)DVM_ERF_LO), span = _mm512_set1_epi32((int)(DVM_ERF_HI - DVM_ERF_LO));
            const __m512i mag = _mm512_set1_epi32(0x7fffffff);
            const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            for (; i0 + 16 <= m; i0 += 16) {
                __m512 v = _mm512_loadu_ps(xb + i0);
                __m512i b = _mm512_and_si512(_mm512_castps_si512(v), mag);
                __mmask16 out = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(b, lo), span);
                if (out) {
                    _mm512_mask_compressstoreu_epi32(idx + k, out, _mm512_add_epi32(iota, _mm512_set1_epi32((int)i0)));
                    _mm512_mask_compressstoreu_ps(val + k, out, v);
                    k += __builtin_popcount((unsigned)out);
                }
            }
        }
#endif
        for (int64_t i = i0; i < m; i++) {
            uint32_t ix = dvm_f_bits(xb[i]) & 0x7fffffffu;
            idx[k] = (int32_t)i; /* (branch-free: written always, kept where k moves on) */
            val[k] = xb[i];
            k += (ix - DVM_ERF_LO) >= (DVM_ERF_HI - DVM_ERF_LO);
        }
        for (int64_t i = 0; i < m; i++) {
            float v = xb[i];
            float a = fabsf(v);
            float z = v * v;
            float r = pp0 + z * (pp1 + z * (pp2 + z * (pp3 + z * pp4)));
            float s = 1.0f + z * (qq1 + z * (qq2 + z * (qq3 + z * (qq4 + z * qq5))));
            float small = v + v * (r / s);
            float t = a - 1.0f;
            float p = pa0 + t * (pa1 + t * (pa2 + t * (pa3 + t * (pa4 + t * (pa5 + t * pa6)))));
            float q = 1.0f + t * (qa1 + t * (qa2 + t * (qa3 + t * (qa4 + t * (qa5 + t * qa6)))));
            float mid = erx + p / q;
            mid = v < 0.0f ? -mid : mid;
            yb[i] = a < 0.84375f ? small : mid;
        }
        for (int j = 0; j < k; j++) yb[idx[j]] = erff(val[j]);
    }
}

/* The number of float32 values among every `step`-th bit pattern from 0 (both signs) where
   dvm_erf_f32 and the C library's erff differ in bits (NaNs compare equal). */
int64_t dvm_erf_check(uint32_t step) {
    float x[1024], y[1024];
    int64_t bad = 0;
    uint64_t u = 0;
    while (u < 0x100000000ull) {
        int m = 0;
        for (; m < 1024 && u < 0x100000000ull; m++, u += step) x[m] = dvm_bits_f((uint32_t)u);
        dvm_erf_f32(x, y, m);
        for (int i = 0; i < m; i++) {
            float w = erff(x[i]);
            if (dvm_f_bits(w) != dvm_f_bits(y[i]) && !(w != w && y[i] != y[i])) bad++;
        }
    }
    return bad;
}
"""


def _setup(lib) -> None:
    lib.dvm_erf_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.dvm_erf_f32.restype = None
    lib.dvm_erf_check.argtypes = [ctypes.c_uint32]
    lib.dvm_erf_check.restype = ctypes.c_int64
    if lib.dvm_erf_check(CHECK_STEP) != 0:
        raise RuntimeError("vectorised erf differs from the C library's erff here")


_LIB = NativeLibrary("libm-erf", _SOURCE, _setup, strict_ieee=True)


def erf_f32():
    """`f(x_ptr, y_ptr, n)`: float32 erf of n elements with erff's bits (y may be x), or None where
    it cannot be built or does not match the C library here."""
    lib = _LIB.get()
    return None if lib is None else lib.dvm_erf_f32


def check(step: int) -> int:
    """Values among every `step`-th float32 bit pattern where the vectorised erf and erff differ
    (-1 where the library cannot be built or failed its own check)."""
    lib = _LIB.get()
    return -1 if lib is None else int(lib.dvm_erf_check(step))
