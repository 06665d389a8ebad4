"""Vectorisable float32 math for generated C kernels: our own approximations as `static inline` C.

Every function is branch-free C (ternaries, bit casts through memcpy, `__builtin_rintf`), so GCC
inlines it into the kernel's inner loop and vectorises the loop (AVX2: 8 lanes); nothing calls libm
in the hot loop. Designs (coefficients fitted by us, see tests/codegen/test_math_accuracy.py):
- exp: Cody-Waite reduction x = n*ln2 + r (ln2 split in two, the high part with trailing zeros so
  n*LN2_HI is exact), Taylor polynomial of degree 7 on |r| <= ln2/2, scaling by 2^n in two steps so
  that results in the subnormal range are rounded once. `dvm_exp_hl(hi, lo)` takes x as hi + lo
  (used by erfc, whose argument -a^2 must be exact).
- expm1: degree-9 Taylor polynomial on |x| < ln2/2; outside, 2^n * expm1(r) + (2^n - 1).
- log: x = 2^e * m, m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f/(2+f):
  log(1+f) = f - s*(f - R(s^2)) with R the atanh series; e*ln2 added in two parts. log1p(x) =
  log(u) * x/(u-1) with u = 1+x (the rounding of u is compensated). log2 = log * log2(e).
- tanh(x) = -t/(t+2) with t = expm1(-2|x|), sign restored; sigmoid(x) = {1 or e}/(1+e) with
  e = exp(-|x|) (no cancellation on either side).
- erf: |x| < 1: x*P(x^2), P a degree-7 least-squares fit (relative error 3e-11); otherwise
  1 - erfc(|x|). erfc(a), a >= 0.5: exp(-a^2) * R(a), R = erfc*exp(a^2) fitted as a degree-11
  polynomial in a - 1.25 on [0.5, 2] and as Q(1/a^2)/a (degree 9) on [2, 10.06]; a^2 is formed
  exactly (Veltkamp split) and passed to dvm_exp_hl, because exp(-a^2) amplifies an error in a^2 by
  a^2. gelu(x) = 0.5*x*erfc(-x/sqrt(2)), with x^2/2 formed exactly the same way.
- gelu(tanh form) = x * sigmoid(2u), softplus = max(z,0) + log1p(exp(-|z|)), silu = x*sigmoid(x),
  mish = x*tanh(softplus(x)), elu = alpha*expm1(x); derivatives use sigmoid(-z) rather than 1-s.

Measured maximum error against float64 references (np.exp, math.erf, ... ; the error is counted in
units of the float32 spacing at the reference value, 2^-149 in the subnormal range) over every
1021st float32 bit pattern (about 4.2M values, all binades, subnormals included) plus NaN, +-Inf,
+-0, subnormals, overflow/underflow thresholds and |x| up to 3.4e38 (erf/erfc: |x| <= 12, gelu:
|x| <= 10); tests/codegen/test_math_accuracy.py re-measures and asserts the bounds in brackets:

    exp 0.89 [1]   expm1 1.44 [2]   log 0.89 [1]   log1p 2.34 [3]   tanh 2.47 [3]   sigmoid 2.01 [3]
    erf 2.33 [3]   erfc 2.87 [3]    gelu(erf) 3.59 [4]

Results in the subnormal range are included in these maxima (exp and erfc scale into it with a
single rounding). Functions not listed (softplus, mish, silu, elu, gelu tanh form, the *_grad ops)
are compositions of the above plus a few roundings; their error is not measured separately.
`fast_math` uses degree-5 polynomials for exp/expm1 (looser, not measured); `strict_ieee` replaces
all of these by libm calls (see c.py).
"""

from __future__ import annotations

# The C text is written out by hand (no generated coefficients at import time) so that the source,
# and hence the cache key, is stable. Both math libraries share a prelude and the functions built only
# on dvm_sig2 and bit casts (_SHARED_C); each defines the primitives its own way.
_PRELUDE_C = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline uint32_t dvm_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float dvm_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
"""

_SHARED_C = r"""static inline float dvm_gelu_grad_tanh(float dy, float x) {
    const float K = 0.7978845608028654f;
    float u = K * (x + 0.044715f * x * x * x);
    float s, sm;
    dvm_sig2(2.0f * u, &s, &sm);
    /* 0.5*(1+t) = s, 1 - t^2 = 4*s*sm */
    return dy * (s + 0.5f * x * (4.0f * s * sm) * K * (1.0f + 3.0f * 0.044715f * x * x));
}

static inline float dvm_silu_grad(float dy, float x) {
    float s, sm;
    dvm_sig2(x, &s, &sm);
    return dy * s * (1.0f + x * sm);
}

static inline float dvm_bf16(float x) {
    uint32_t b = dvm_f2u(x);
    uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    return x != x ? x : dvm_u2f(r);
}
"""

MATH_C = _PRELUDE_C + r"""
#ifndef DVM_FAST
#define DVM_FAST 0
#endif

/* exp(hi + lo) where lo is a small correction of hi. */
static inline float dvm_exp_hl(float hi, float lo) {
    const float L2E = 1.44269504088896341f;
    const float LN2_HI = 0.693145751953125f;      /* 0x3f317200: 9 trailing zero bits */
    const float LN2_LO = 1.428606765330187e-06f;  /* ln2 - LN2_HI */
    float xc = hi > 89.0f ? 89.0f : (hi < -104.0f ? -104.0f : hi);
    float n = __builtin_rintf(xc * L2E);
    float r = (xc - n * LN2_HI) - n * LN2_LO + lo;
#if DVM_FAST
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * 8.3333338e-3f))));
#else
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f + r * (8.33333377e-3f
              + r * (1.38888892e-3f + r * 1.98412701e-4f))))));
#endif
    int32_t ni = (int32_t)n;
    int32_t n1 = ni / 2;
    int32_t n2 = ni - n1;
    float s1 = dvm_u2f((uint32_t)(n1 + 127) << 23);
    float s2 = dvm_u2f((uint32_t)(n2 + 127) << 23);
    float res = (p * s1) * s2;
    res = hi > 88.72283935546875f ? INFINITY : res;
    res = hi < -103.97208404541015625f ? 0.0f : res;
    return hi != hi ? hi : res;
}

static inline float dvm_exp(float x) { return dvm_exp_hl(x, 0.0f); }

static inline float dvm_expm1(float x) {
    const float L2E = 1.44269504088896341f;
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    int small = fabsf(x) < 0.34657359f;
    float xc = x > 88.72283935546875f ? 88.72283935546875f : (x < -30.0f ? -30.0f : x);
    float n = small ? 0.0f : __builtin_rintf(xc * L2E);
    float r = (xc - n * LN2_HI) - n * LN2_LO;
#if DVM_FAST
    float q = r + r * r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f
              + r * 1.3888889e-3f))));
#else
    float q = r + r * r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f + r * (8.33333377e-3f
              + r * (1.38888892e-3f + r * (1.98412701e-4f + r * (2.48015876e-5f + r * 2.75573188e-6f)))))));
#endif
    int32_t ni = (int32_t)n;
    float s = dvm_u2f((uint32_t)((ni > 127 ? 127 : ni) + 127) << 23);   /* 2^n, n in [-44, 127] */
    float sh = dvm_u2f((uint32_t)(ni - 1 + 127) << 23);                  /* 2^(n-1) */
    float res = s * q + (s - 1.0f);
    res = ni > 100 ? (sh * (q + 1.0f)) * 2.0f : res;                     /* 2^n itself may overflow */
    res = x > 88.72283935546875f ? INFINITY : res;
    res = x < -17.5f ? -1.0f : res;
    return x != x ? x : res;
}

/* log of x > 0 (finite, normal or subnormal); special values handled by dvm_log. */
static inline float dvm_log_core(float x) {
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    uint32_t u = dvm_f2u(xs);
    int32_t e = (int32_t)(u >> 23) - 127 - (sub ? 23 : 0);
    float m = dvm_u2f((u & 0x007fffffu) | 0x3f800000u);
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float R = z * (6.66666667e-1f + z * (4.00000006e-1f + z * (2.85714298e-1f + z * (2.22222224e-1f
              + z * 1.81818187e-1f))));
    float l1p = f - s * (f - R);
    float ef = (float)e;
    return ef * LN2_HI + (ef * LN2_LO + l1p);
}

static inline float dvm_log(float x) {
    float r = dvm_log_core(x);
    r = x == INFINITY ? INFINITY : r;
    r = x == 0.0f ? -INFINITY : r;
    return (x < 0.0f || x != x) ? NAN : r;
}

static inline float dvm_log1p(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f;
    float lu = dvm_log(u);
    float r = d == 0.0f ? x : lu * (x / d);
    r = x == INFINITY ? INFINITY : r;
    r = x == -1.0f ? -INFINITY : r;
    return x != x ? x : r;
}

static inline float dvm_log2(float x) {
    float r = dvm_log(x);
    return r * 1.44269504088896341f;
}

static inline float dvm_tanh(float x) {
    float a = fabsf(x);
    float t = dvm_expm1(-2.0f * a);
    float r = -t / (t + 2.0f);
    r = copysignf(r, x);
    return x != x ? x : r;
}

static inline float dvm_sigmoid(float x) {
    float e = dvm_exp(-fabsf(x));
    float num = x >= 0.0f ? 1.0f : e;
    return num / (1.0f + e);
}

/* erf(x) / x - 1 style polynomial: erf(x) = x * P(x^2) on |x| < 1. */
static inline float dvm_erf_small(float x) {
    float u = x * x;
    float p = 1.128379226e+00f + u * (-3.761263788e-01f + u * (1.128378212e-01f + u * (-2.686540037e-02f
              + u * (5.220945459e-03f + u * (-8.482828271e-04f + u * (1.125694398e-04f
              + u * -9.641505130e-06f))))));
    return x * p;
}

/* erfc(a) for a >= 0, given a^2 = a2h + a2l exactly. */
static inline float dvm_erfc_pos2(float a, float a2h, float a2l) {
    float t = a - 1.25f;
    float ra = 3.678229153e-01f + t * (-2.088218778e-01f + t * (1.067955866e-01f + t * (-5.021826923e-02f
               + t * (2.201111615e-02f + t * (-9.081654251e-03f + t * (3.554999363e-03f + t * (-1.325935824e-03f
               + t * (4.675245145e-04f + t * (-1.617645175e-04f + t * (6.401093560e-05f
               + t * -1.985799827e-05f))))))))));
    float ui = 1.0f / (a * a);
    float rb = (5.641895533e-01f + ui * (-2.820917666e-01f + ui * (4.228967726e-01f + ui * (-1.047503948e+00f
               + ui * (3.440873861e+00f + ui * (-1.229210663e+01f + ui * (3.908021164e+01f + ui * (-9.279120636e+01f
               + ui * (1.378820343e+02f + ui * -9.369770050e+01f))))))))) / a;
    float r = a < 2.0f ? ra : rb;
    float res = dvm_exp_hl(-a2h, -a2l) * r;
    res = a < 0.5f ? 1.0f - dvm_erf_small(a) : res;
    res = a > 10.06f ? 0.0f : res;
    return a != a ? a : res;
}

/* a*a as hi + lo exactly enough (Veltkamp split: the high half has 12 significant bits). */
static inline void dvm_sq2(float a, float *hi, float *lo) {
    float ah = dvm_u2f(dvm_f2u(a) & 0xfffff000u);
    float al = a - ah;
    *hi = ah * ah;
    *lo = (a + ah) * al;
}

static inline float dvm_erfc_pos(float a) {
    float h, l;
    dvm_sq2(a, &h, &l);
    return dvm_erfc_pos2(a, h, l);
}

static inline float dvm_erfc(float x) {
    float c = dvm_erfc_pos(fabsf(x));
    return x < 0.0f ? 2.0f - c : c;
}

static inline float dvm_erf(float x) {
    float a = fabsf(x);
    float big = 1.0f - dvm_erfc_pos(a);
    float r = a < 1.0f ? dvm_erf_small(a) : big;
    r = copysignf(r, x);
    return x != x ? x : r;
}

/* gelu(x) = 0.5*x*erfc(-x/sqrt(2)); z^2 = x^2/2 formed exactly. */
static inline float dvm_gelu_erf(float x) {
    float a = fabsf(x) * 0.70710678118654752f;
    float h, l;
    dvm_sq2(x, &h, &l);
    float c = dvm_erfc_pos2(a, 0.5f * h, 0.5f * l);
    float hx = 0.5f * x;
    return x < 0.0f ? hx * c : x - hx * c;
}

/* sigmoid(z) and sigmoid(-z) without cancellation. */
static inline void dvm_sig2(float z, float *s, float *sm) {
    float e = dvm_exp(-fabsf(z));
    float inv = 1.0f / (1.0f + e);
    float big = inv, small = e * inv;
    *s = z >= 0.0f ? big : small;
    *sm = z >= 0.0f ? small : big;
}

static inline float dvm_gelu_tanh(float x) {
    const float K = 0.7978845608028654f;
    float u = K * (x + 0.044715f * x * x * x);
    return x * dvm_sigmoid(2.0f * u);
}

static inline float dvm_softplus(float x, float beta, float threshold) {
    float z = beta * x;
    float r = (fmaxf(z, 0.0f) + dvm_log1p(dvm_exp(-fabsf(z)))) / beta;
    r = z > threshold ? x : r;
    return z != z ? z : r;
}

static inline float dvm_mish(float x) {
    return x * dvm_tanh(dvm_softplus(x, 1.0f, 1e30f));
}

static inline float dvm_elu(float x, float alpha) { return x > 0.0f ? x : alpha * dvm_expm1(x); }

static inline float dvm_gelu_grad_erf(float dy, float x) {
    float a = fabsf(x) * 0.70710678118654752f;
    float h, l;
    dvm_sq2(x, &h, &l);
    float c = dvm_erfc_pos2(a, 0.5f * h, 0.5f * l);
    float phi = x < 0.0f ? 0.5f * c : 1.0f - 0.5f * c;
    float pdf = dvm_exp_hl(-0.5f * h, -0.5f * l) * 0.3989422804014327f;
    return dy * (phi + x * pdf);
}

""" + _SHARED_C

# strict_ieee: the same entry points on top of libm (scalar, correctly rounded where glibc is).
STRICT_C = _PRELUDE_C + r"""static inline float dvm_exp(float x) { return expf(x); }
static inline float dvm_expm1(float x) { return expm1f(x); }
static inline float dvm_log(float x) { return logf(x); }
static inline float dvm_log1p(float x) { return log1pf(x); }
static inline float dvm_log2(float x) { return log2f(x); }
static inline float dvm_tanh(float x) { return tanhf(x); }
static inline float dvm_erf(float x) { return erff(x); }
static inline float dvm_erfc(float x) { return erfcf(x); }
static inline float dvm_sigmoid(float x) {
    float e = expf(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
static inline void dvm_sig2(float z, float *s, float *sm) {
    float e = expf(-fabsf(z));
    float inv = 1.0f / (1.0f + e);
    *s = z >= 0.0f ? inv : e * inv;
    *sm = z >= 0.0f ? e * inv : inv;
}
static inline float dvm_gelu_erf(float x) { return 0.5f * x * erfcf(-x * 0.70710678118654752f); }
static inline float dvm_gelu_tanh(float x) {
    const float K = 0.7978845608028654f;
    return x * dvm_sigmoid(2.0f * K * (x + 0.044715f * x * x * x));
}
static inline float dvm_softplus(float x, float beta, float threshold) {
    float z = beta * x;
    float r = (fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)))) / beta;
    r = z > threshold ? x : r;
    return z != z ? z : r;
}
static inline float dvm_mish(float x) { return x * tanhf(dvm_softplus(x, 1.0f, 1e30f)); }
static inline float dvm_elu(float x, float alpha) { return x > 0.0f ? x : alpha * expm1f(x); }
static inline float dvm_gelu_grad_erf(float dy, float x) {
    float phi = 0.5f * erfcf(-x * 0.70710678118654752f);
    return dy * (phi + x * expf(-0.5f * x * x) * 0.3989422804014327f);
}
""" + _SHARED_C

MEASURED = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "erfc", "gelu_erf")

__all__ = ["MATH_C", "MEASURED", "STRICT_C"]
