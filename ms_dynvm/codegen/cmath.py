"""Vectorisable float32 math for generated C kernels: our own approximations as `static inline` C.

Every function is branch-free C (ternaries, bit casts through memcpy), so GCC inlines it into the
kernel's inner loop and vectorises the loop (AVX2: 8 lanes); nothing calls libm in the hot loop. The
loops are bound by the FMA/multiply ports, so the designs minimise multiplies and FMAs and avoid
special-case selects: clamps are written `c < x ? c : x` so that NaN passes through, and overflow,
underflow and NaN then come out of the arithmetic itself. Coefficients are minimax fits made by us,
rounded to float one at a time (each rounding refitted by the rest). Designs:
- exp: n = rint(x/ln2) read from the low bits of x/ln2 + 0x1.8p23 (no round/convert), Cody-Waite
  reduction r = x - n*ln2 (ln2 in two parts), exp(r) = 1 + r + r^2 P(r), P of degree 4 (relative error
  3.1e-9), scaling by 2^n in two exact steps so that overflow gives +Inf and results in the subnormal
  range are rounded once; the input is clamped to [-104, 88.8]. `dvm_exp_hl(hi, lo)` takes x as
  hi + lo. `dvm_exp_neg` (x <= 0: sigmoid, softplus) scales once by 2^(n+24) and then by 2^-24.
- expm1: the same reduction, expm1(r) = r + r^2 P(r) (degree 4, 1.4e-8), then
  2 * (2^(n-1) expm1(r) + 2^(n-1) - 1/2), which neither overflows early nor cancels; |x| < 2^-25: x.
- log: x = 2^e * m with m in [sqrt(1/2), sqrt(2)) by subtracting the bits of sqrt(1/2) (no compare),
  f = m - 1, s = f/(2+f): log(1+f) = f - s*(f - R(s^2)) with R the atanh series; e*ln2 added in two
  parts. log1p(x) = log(u) * x/(u-1) with u = 1+x (the rounding of u is compensated).
  log2 = log * log2(e).
- tanh: |x| < 0.7: x + x^3 P(x^2) (degree 4, 1.5e-8); else 1 - 2/(1 + exp(2|x|)), where exp(2|x|)
  (|x| clamped to 10, one reduction constant, degree-5 polynomial, one scaling) errs by ~1e-7 but the
  error is damped by 2/(1+e)/tanh <= 0.6; sign restored with a bit operation.
- sigmoid(x) = {1 or e}/(1+e) with e = exp(-|x|) (no cancellation on either side).
- erf: |x| < 1.2: x + x P(x^2) (degree 6); else 1 - Q(|x| - 2.6), Q a degree-13 fit of erfc on
  [1.2, 4] in absolute error (6e-9); |x| is clamped to 4, where 1 - Q rounds to 1. No exp, no division.
- erfc(a), gelu(x) = 0.5*x*erfc(-x/sqrt(2)) and its gradient share `dvm_erfc_core`: erfc(a) =
  exp(-a^2) t G(t) with t = 1/(1 + 0.65a) and G a degree-10 fit in t - 1/4 (relative error 1.2e-8), one
  piece for a in [0, 10.19]. a^2 is formed exactly (Veltkamp split; gelu forms x^2/2), because exp(-a^2)
  amplifies an error in a^2 by a^2; the relative error of the rounded t (from the exact residuals of
  1 + 0.65a and of the division) is added back, and it and exp's polynomial part meet in one FMA. The
  result is scaled by 2^(n+24) and then 2^-24: one rounding into the subnormals. gelu clamps x to
  +-14.4 inside (beyond, the erfc term rounds to 0), so gelu(+Inf) = +Inf and gelu(-Inf) = -0.
- gelu(tanh form) = x * sigmoid(2u), softplus = max(z,0) + log1p(exp(-|z|)), silu = x*sigmoid(x),
  mish = x*tanh(softplus(x)), elu = alpha*expm1(x); derivatives use sigmoid(-z) rather than 1-s.

Measured maximum error against float64 references (np.exp, math.erf, ... ; the error is counted in
units of the float32 spacing at the reference value, 2^-149 in the subnormal range) over every
1021st float32 bit pattern (about 4.2M values, all binades, subnormals included) plus NaN, +-Inf,
+-0, subnormals, overflow/underflow thresholds and |x| up to 3.4e38 (erf/erfc: |x| <= 12, gelu:
|x| <= 10); tests/codegen/test_math_accuracy.py re-measures and asserts the bounds in brackets:

    exp 0.82 [1]   expm1 1.44 [2]   log 0.89 [1]   log1p 2.34 [3]   tanh 1.43 [2]   sigmoid 2.01 [3]
    erf 1.23 [2]   erfc 2.81 [3]    gelu(erf) 3.24 [4]

Over all 2^32 float32 inputs (same domains) the maxima are: exp 0.89, expm1 1.53, log 0.94,
log1p 2.47, tanh 1.44, sigmoid 2.40, erf 1.52, erfc 3.29, gelu(erf) 4.48 (16 inputs of gelu above
4, the worst at x = -4.0104); the previous version of this file had 0.94, 1.44, 0.94, 2.47, 2.50,
2.40, 2.76, 3.61 and 4.43 there.
Results in the subnormal range are included in these maxima (exp and erfc scale into it with a
single rounding). Functions not listed (softplus, mish, silu, elu, gelu tanh form, the *_grad ops)
are compositions of the above plus a few roundings; their error is not measured separately.
The ops exp, expm1, log1p, tanh, mish, sigmoid (silu) and elu are rendered as `dvm_<op>_op`, which the kernel's head maps to
the functions above (`eager_math=False`) or, by default, to `_EAGER_C`'s: MindSpore 2.10 CPU's own
formulas (exp with ln2 rounded to 0.693147 and a degree-5 Taylor polynomial; tanh a (7, 6) Pade
approximant, +-1 past |x| = 5; mish through (1 + e^x)^2; log1p, expm1 as logf(1 + x), expf(x) - 1;
sigmoid, silu, elu on that exp), reconstructed by testing candidates against MindSpore, so that fused
results are eager's: bit-identical on 94-100% of float32 inputs per op, within rtol 1e-5 on all
(`python -m tests.codegen.test_eager_math` prints the table; the tests assert it). Their error
against the true functions is MindSpore's (exp 2e-5 relative above |x| = 38, tanh 1e-4 near |x| = 5).
`fast_math` uses Taylor polynomials of degree 5 for exp (so sigmoid, softplus) and 6 for expm1 (looser,
not measured; tanh, erf, erfc and gelu are unchanged); `strict_ieee` replaces all of these by libm
calls (see c.py). profiling/bench/bench_math.py times each function.
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
/* A VM op's product, rounded on its own as eager rounds it: GCC contracts a product into a following
   add or subtract (one fma, one rounding) unless the product has another use; this one (a NaN test,
   which changes no value) keeps the multiply and the add apart, still vectorised (c.py: mul). */
static inline float dvm_keepf(float p) { return p != p ? p + 0.0f : p; }
static inline double dvm_keepd(double p) { return p != p ? p + 0.0 : p; }
/* x > 0 finite (subnormals too) as 2^e * m, m in [sqrt(1/2), sqrt(2)): both exact. */
static inline float dvm_log_reduce(float x, int32_t *e) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t u = (int32_t)(dvm_f2u(xs) - 0x3f3504f3u);
    *e = (u >> 23) - (sub ? 23 : 0);
    return dvm_u2f(((uint32_t)u & 0x007fffffu) + 0x3f3504f3u);
}

/* log(x) from its core value r (x > 0 finite): +Inf and NaN pass, log(+-0) = -Inf, x < 0 is NaN. */
static inline float dvm_log_special(float x, float r) {
    r = x < INFINITY ? r : x;
    r = x == 0.0f ? -INFINITY : r;
    return x < 0.0f ? NAN : r;
}
/* float32 pow as the interpreter computes it: in double, rounded once. Not inlined: GCC 12 at -O3
   dropped the float rounding of an inline `(float)pow(...)` whose result was widened again for a
   double accumulator (a fused mean of squares summed the unrounded squares: 1 ulp off eager). */
__attribute__((noinline)) static float dvm_powf_d(float x, float y) { return (float)pow((double)x, (double)y); }
/* float32 atan2, sin, cos, tan and erfc the same way, as the interpreter (and eager, measured: glibc's
   atan2f, sinf, cosf and tanf were 1 ulp off on 1-15% of inputs). Scalar, as the calls they replace. */
__attribute__((noinline)) static float dvm_atan2f_d(float y, float x) { return (float)atan2((double)y, (double)x); }
__attribute__((noinline)) static float dvm_sinf_d(float x) { return (float)sin((double)x); }
__attribute__((noinline)) static float dvm_cosf_d(float x) { return (float)cos((double)x); }
__attribute__((noinline)) static float dvm_tanf_d(float x) { return (float)tan((double)x); }
__attribute__((noinline)) static float dvm_erfcf_d(float x) { return (float)erfc((double)x); }
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

/* float -> int32/int64 as x86's cvtt (what MindSpore CPU gives): NaN and values out of range are
   the "integer indefinite" INT_MIN. A plain C cast of those is undefined, and gcc then folds
   (float)(int)x into trunc(x). */
static inline int32_t dvm_f2i32(double v) {
    return (v >= -2147483648.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}
static inline int64_t dvm_f2i64(double v) {
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}
"""

MATH_C = _PRELUDE_C + r"""
#ifndef DVM_FAST
#define DVM_FAST 0
#endif

/* exp(r) on |r| <= ln2/2 (plus a little): 1 + r + r^2 P(r), P minimax (relative error 3.1e-9). */
static inline float dvm_exp_poly(float r) {
#if DVM_FAST
    return 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * 8.3333338e-3f))));
#else
    return 1.0f + r * (1.0f + r * (4.999999404e-01f + r * (1.666652113e-01f + r * (4.166825488e-02f
           + r * (8.368661627e-03f + r * 1.382145332e-03f)))));
#endif
}

/* exp(hi + lo), lo a small correction of hi. No special cases: the clamp lets NaN through, and the
   scaling 2^n = 2^n1 * 2^n2 overflows to +Inf above 88.72 and rounds into the subnormals (once) and
   to 0 below -103.97. n = rint(x/ln2) comes from the low bits of x/ln2 + 0x1.8p23. */
static inline float dvm_exp_hl(float hi, float lo) {
    const float LN2_HI = 0.693145751953125f;      /* 0x3f317200: 9 trailing zero bits */
    const float LN2_LO = 1.428606765330187e-06f;  /* ln2 - LN2_HI */
    float xc = 88.8f < hi ? 88.8f : hi;
    xc = -104.0f > xc ? -104.0f : xc;
    float kf = xc * 1.44269504088896341f + 12582912.0f;
    float n = kf - 12582912.0f;
    float r = (xc - n * LN2_HI) - (n * LN2_LO - lo);
    float p = dvm_exp_poly(r);
    int32_t ni = (int32_t)(dvm_f2u(kf) - 0x4b400000u);
    int32_t n1 = ni >> 1;
    float s1 = dvm_u2f((uint32_t)(n1 + 127) << 23);
    float s2 = dvm_u2f((uint32_t)(ni - n1 + 127) << 23);
    return (p * s1) * s2;
}

static inline float dvm_exp(float x) { return dvm_exp_hl(x, 0.0f); }

/* exp(x) for x <= 0 or NaN: one exact scaling by 2^(n+24) (0x1.8p23 + 151 puts n + 151 in kf's low
   bits), then by 2^-24, the only rounding into the subnormals. */
static inline float dvm_exp_neg(float x) {
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    float xc = -104.0f > x ? -104.0f : x;
    float kf = xc * 1.44269504088896341f + 12583063.0f;
    float n = kf - 12583063.0f;
    float r = (xc - n * LN2_HI) - n * LN2_LO;
    float p = dvm_exp_poly(r);
    return (p * dvm_u2f(dvm_f2u(kf) << 23)) * 5.96046448e-08f;
}

static inline float dvm_expm1(float x) {
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    float xc = 88.8f < x ? 88.8f : x;
    xc = -30.0f > xc ? -30.0f : xc;
    float kf = xc * 1.44269504088896341f + 12582912.0f;
    float n = kf - 12582912.0f;
    float r = (xc - n * LN2_HI) - n * LN2_LO;
#if DVM_FAST
    float q = r + r * r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f
              + r * 1.3888889e-3f))));
#else
    float q = r + r * r * (4.999999702e-01f + r * (1.666654646e-01f + r * (4.166744277e-02f + r * (8.366256952e-03f
              + r * 1.386981807e-03f))));
#endif
    int32_t ni = (int32_t)(dvm_f2u(kf) - 0x4b400000u);
    float sh = dvm_u2f((uint32_t)(ni + 126) << 23);   /* 2^(n-1), n in [-43, 128]: no overflow */
    float h = sh * q + (sh - 0.5f);                    /* expm1(x) / 2 = (2^n expm1(r) + 2^n - 1) / 2 */
    return fabsf(x) < 2.98023224e-08f ? x : h + h;     /* |x| < 2^-25: x (keeps subnormals and -0) */
}
/* log of x > 0 (finite, normal or subnormal); special values handled by the callers.
   x = 2^e * m with m in [sqrt(1/2), sqrt(2)) (offset trick on the bits), f = m - 1 exact. */
static inline float dvm_log_core(float x) {
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    int32_t e;
    float m = dvm_log_reduce(x, &e);
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float R = z * (6.66666667e-1f + z * (4.00000006e-1f + z * (2.85714298e-1f + z * (2.22222224e-1f
              + z * 1.81818187e-1f))));
    float l1p = f - s * (f - R);
    float ef = (float)e;
    return ef * LN2_HI + (ef * LN2_LO + l1p);
}

static inline float dvm_log(float x) { return dvm_log_special(x, dvm_log_core(x)); }

static inline float dvm_log1p(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f;
    float r = dvm_log(u) * (x / d);   /* log(u) * x/(u-1): compensates the rounding of u */
    /* x itself where u - 1 == 0 (tiny x) or x == +Inf, selected on the bits: gcc 13 does not
       if-convert `x == INFINITY ? x : r` here, which left every loop calling log1p (softplus, mish)
       scalar; gcc 12 and 13 vectorise this form at x86-64-v3, x86-64-v4 and native. */
    uint32_t keep_x = 0u - (uint32_t)((d == 0.0f) | (x == INFINITY));
    return dvm_u2f((dvm_f2u(x) & keep_x) | (dvm_f2u(r) & ~keep_x));
}

static inline float dvm_log2(float x) {
    float r = dvm_log(x);
    return r * 1.44269504088896341f;
}

/* tanh: |x| < 0.7: x + x^3 P(x^2) (minimax); else 1 - 2/(1 + exp(2|x|)), where the error of the
   exp (degree-5 polynomial, single-constant reduction: 2|x| is clamped to 20) is damped by
   2/(1+e) / tanh <= 0.6. Sign restored last (-0 stays -0, NaN stays NaN). */
static inline float dvm_tanh(float x) {
    float a = fabsf(x);
    float u = a * a;
    float ps = a + a * u * (-3.333319128e-01f + u * (1.332913190e-01f + u * (-5.355996266e-02f
               + u * (2.009433508e-02f + u * -5.140463356e-03f))));
    float ac = 10.0f < a ? 10.0f : a;
    float kf = ac * 2.88539008177792681f + 12583039.0f;   /* n = rint(2|x|/ln2), n + 127 in the low bits */
    float n = kf - 12583039.0f;
    float h = ac - n * 0.346573591f;                       /* 2|x| = n ln2 + 2h */
    float p = 1.0f + h * (2.0f + h * (1.999969244e+00f + h * (1.333368897e+00f + h * (6.702426672e-01f
              + h * 2.660092711e-01f))));
    float e = p * dvm_u2f(dvm_f2u(kf) << 23);
    float pl = 1.0f - 2.0f / (1.0f + e);
    float res = a < 0.7f ? ps : pl;
    return dvm_u2f(dvm_f2u(res) ^ (dvm_f2u(x) & 0x80000000u));
}

static inline float dvm_sigmoid(float x) {
    float e = dvm_exp_neg(-fabsf(x));
    float num = x >= 0.0f ? 1.0f : e;
    return num / (1.0f + e);
}

/* erf: |x| < 1.2: x + x P(x^2); else 1 - Q(|x| - 2.6), Q a degree-13 fit of erfc on [1.2, 4] (absolute
   error 6e-9; |x| is clamped to 4, where 1 - Q rounds to 1). */
static inline float dvm_erf(float x) {
    float a = fabsf(x);
    float u = a * a;
    float ps = a + a * (1.283791512e-01f + u * (-3.761253357e-01f + u * (1.128264666e-01f + u * (-2.681887895e-02f
               + u * (5.129369907e-03f + u * (-7.549414877e-04f + u * 6.495513662e-05f))))));
    float t = (a < 4.0f ? a : 4.0f) - 2.6f;
    float q = 2.360312938e-04f + t * (-1.307994709e-03f + t * (3.401098773e-03f + t * (-5.459905136e-03f
              + t * (5.961610936e-03f + t * (-4.558849148e-03f + t * (2.369118622e-03f + t * (-6.816022797e-04f
              + t * (-7.613314665e-05f + t * (1.846325031e-04f + t * (-7.385502249e-05f + t * (-2.940439288e-07f
              + t * (8.117624020e-06f + t * -1.625818413e-06f))))))))))));
    float res = a >= 1.2f ? 1.0f - q : ps;
    return dvm_u2f(dvm_f2u(res) ^ (dvm_f2u(x) & 0x80000000u));
}

/* a*a as hi + lo exactly (Veltkamp split: the high half has 12 significant bits). */
static inline void dvm_sq2(float a, float *hi, float *lo) {
    float ah = dvm_u2f(dvm_f2u(a) & 0xfffff000u);
    float al = a - ah;
    *hi = ah * ah;
    *lo = (a + ah) * al;
}

/* m * erfc(a) for a in [0, 10.19] (callers clamp; NaN passes), given a^2 = a2h + a2l exactly; *e =
   exp(-a^2). erfc(a) = exp(-a^2) t G(t), t = 1/(1 + 0.65a), G a degree-10 fit in t - 1/4 (relative
   error 1.2e-8); d is the relative error of the rounded t (from the exact residuals of 1 + 0.65a and
   of the division) and goes, with exp's polynomial part r*q, into the last fma. */
static inline float dvm_erfc_core(float xa, float k, float a2h, float a2l, float m, float c, float *e) {
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = 1.428606765330187e-06f;
    float v = 1.0f + k * xa;
    float t = 1.0f / v;
    float vl = k * xa + (1.0f - v);
    float d = (1.0f - t * v) - vl * t;
    float s = t - 0.25f;
    float g = (m * t) * (2.391067445e-01f + s * (2.649657428e-01f + s * (1.716633290e-01f + s * (-1.266671252e-02f
              + s * (-1.234835237e-01f + s * (-2.526396513e-02f + s * (1.336208284e-01f + s * (6.160195451e-03f
              + s * (-1.794492304e-01f + s * (1.609811485e-01f + s * -4.808173329e-02f))))))))));
    float kf = -a2h * 1.44269504088896341f + 12583063.0f;   /* n + 151 in the low bits, n >= -150 */
    float n = kf - 12583063.0f;
    float r = (-a2h - n * LN2_HI) - (n * LN2_LO + a2l);
    float q = 1.0f + r * (4.999999404e-01f + r * (1.666652113e-01f + r * (4.166825488e-02f + r * (8.368661627e-03f
              + r * 1.382145332e-03f))));                   /* exp(r) = 1 + r q */
    float sc = dvm_u2f(dvm_f2u(kf) << 23);                 /* 2^(n+24) */
    *e = ((1.0f + r * q) * sc) * 5.96046448e-08f;
    return ((g * (r * q + d) + g) * sc) * c;
}

static inline float dvm_erfc(float x) {
    float a = fabsf(x);
    a = 10.19f < a ? 10.19f : a;
    float h, l, e;
    dvm_sq2(a, &h, &l);
    float c = dvm_erfc_core(a, 0.65f, h, l, 1.0f, 1.1920929e-07f, &e);
    return x < 0.0f ? 2.0f - c : c;
}

/* gelu(x) = 0.5*x*erfc(-x/sqrt(2)) with x clamped to +-14.4 inside (beyond, erfc(|x|/sqrt(2)) * 7.2
   rounds to 0); z^2 = x^2/2 formed exactly. */
static inline float dvm_gelu_erf(float x) {
    float xc = 14.4f < x ? 14.4f : x;
    xc = -14.4f > xc ? -14.4f : xc;
    float xa = fabsf(xc);
    float h, l, e;
    dvm_sq2(xa, &h, &l);
    float g = dvm_erfc_core(xa * 0.70710678118654752f, 0.65f, 0.5f * h, 0.5f * l, xc, 5.96046448e-08f, &e);
    return x < 0.0f ? dvm_u2f(dvm_f2u(g) | 0x80000000u) : x - g;
}

/* sigmoid(z) and sigmoid(-z) without cancellation. */
static inline void dvm_sig2(float z, float *s, float *sm) {
    float e = dvm_exp_neg(-fabsf(z));
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
    float r = ((z > 0.0f ? z : 0.0f) + dvm_log1p(dvm_exp_neg(-fabsf(z)))) / beta;
    r = z > threshold ? x : r;
    return z != z ? INFINITY : r;  /* softplus(NaN) is +inf, as MindSpore's */
}

static inline float dvm_mish(float x) {
    return x * dvm_tanh(dvm_softplus(x, 1.0f, 1e30f));
}

static inline float dvm_elu(float x, float alpha) { return x > 0.0f ? x : alpha * dvm_expm1(x); }

static inline float dvm_gelu_grad_erf(float dy, float x) {
    float xc = 14.4f < x ? 14.4f : x;
    xc = -14.4f > xc ? -14.4f : xc;
    float xa = fabsf(xc);
    float h, l, e;
    dvm_sq2(xa, &h, &l);
    float hc = dvm_erfc_core(xa * 0.70710678118654752f, 0.65f, 0.5f * h, 0.5f * l, 1.0f, 5.96046448e-08f, &e);
    float phi = x < 0.0f ? hc : 1.0f - hc;
    return dy * (phi + xc * (e * 0.3989422804014327f));
}

""" + _SHARED_C

_EAGER_C = r"""
/* eager_math (the default): the ops of c.EAGER_MATH_OPS evaluated with MindSpore 2.10 CPU's own
   formulas, so that a fused one gives what eager gives (see the module doc). Explicit fmaf where MindSpore's kernel fuses, `+ 0.0f` where
   it rounds a product on its own (GCC contracts a product into a following add otherwise: the
   contraction then is fma(a, b, 0), the rounded product). */
static inline float dvm_exp_ms(float x) {
    float xc = x == x ? x : 0.0f;
    xc = -87.3365478515625f > xc ? -87.3365478515625f : xc;
    xc = 88.72283935546875f < xc ? 88.72283935546875f : xc;
    float t = xc * 1.44269504088896341f + 0.0f;
    t = xc > 0.0f ? t + 0.5f : t - 0.5f;
    /* k = (int)t, rounded half away from zero; as a float (exact: |k| <= 128) and its bits read off
       k + 1.5 * 2^23, because GCC does not vectorise a loop holding the float -> int32 cast
       ("control flow in loop"): the same value for each of the 2^32 inputs (checked), 4-7x faster. */
    float kf = truncf(t);
    float d = fmaf(-kf, 0.693147f, xc);              /* ln2 rounded to 6 digits, as MindSpore's */
    float p = fmaf(d, 1.0f / 120.0f, 1.0f / 24.0f);  /* Taylor, degree 5 */
    p = fmaf(d, p, 1.0f / 6.0f);
    p = fmaf(d, p, 0.5f);
    p = fmaf(d, p, 1.0f);
    p = fmaf(d, p, 1.0f);
    uint32_t kb = dvm_f2u(kf + 12582912.0f) - 0x4b400000u;  /* k, two's complement */
    float r = 2.0f * p * dvm_u2f((kb + 126u) << 23);          /* overflows to +Inf past 88.72 */
    return x == x ? r : x;
}

/* Pade (7, 6) of tanh; +-1 beyond |x| > 5 (MindSpore's tanh(5) is 1.0000098). */
static inline float dvm_tanh_ms(float x) {
    float s = x * x + 0.0f;
    float a = fmaf(fmaf(s + 378.0f, s, 17325.0f), s, 135135.0f) * x;
    float b = fmaf(fmaf(fmaf(28.0f, s, 3150.0f), s, 62370.0f), s, 135135.0f);
    float r = a / b;
    r = x > 5.0f ? 1.0f : r;
    return x < -5.0f ? -1.0f : r;
}

/* log and exp of a float computed in double and rounded once: the correctly rounded value but in
   about 1 of 10,000 inputs (near-halfway cases: checked over all 2^32 floats against glibc's logf and
   expf, which differ there, glibc being the one off in the cases looked at), vectorised. What the
   interpreter computes (a float64 function rounded once). ln2 in two parts: e * LN2D_HI is exact. */
static const double LN2D_HI = 0.693147180369123816490;   /* 0x3fe62e42fee00000 */
static const double LN2D_LO = 1.90821492927058770002e-10;

static inline float dvm_log_cr_core(float x) {
    int32_t e;
    double f = (double)dvm_log_reduce(x, &e) - 1.0;
    double s = f / (2.0 + f);                   /* log(m) = 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + ...) */
    double z = s * s;
    double p = 1.0 / 23.0;
    p = p * z + 1.0 / 21.0; p = p * z + 1.0 / 19.0; p = p * z + 1.0 / 17.0; p = p * z + 1.0 / 15.0;
    p = p * z + 1.0 / 13.0; p = p * z + 1.0 / 11.0; p = p * z + 1.0 / 9.0; p = p * z + 1.0 / 7.0;
    p = p * z + 1.0 / 5.0; p = p * z + 1.0 / 3.0; p = p * z + 1.0;
    double ed = (double)e;
    return (float)(ed * LN2D_HI + (2.0 * s * p + ed * LN2D_LO));
}
static inline float dvm_log_cr(float x) { return dvm_log_special(x, dvm_log_cr_core(x)); }

/* exp of a float, computed in double and rounded once (NaN passes, +Inf past 88.73, 0 below). */
static inline float dvm_exp_cr(float x) {
    float xc = 89.0f < x ? 89.0f : x;
    xc = -105.0f > xc ? -105.0f : xc;
    double xd = (double)xc;
    double kd = xd * 1.4426950408889634074 + 6755399441055744.0;   /* rint(x / ln2) in the low bits */
    double n = kd - 6755399441055744.0;
    double r = (xd - n * LN2D_HI) - n * LN2D_LO;
    double p = 1.0 / 6227020800.0;                                   /* Taylor, degree 13 */
    p = p * r + 1.0 / 479001600.0; p = p * r + 1.0 / 39916800.0; p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0; p = p * r + 1.0 / 40320.0; p = p * r + 1.0 / 5040.0; p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0; p = p * r + 1.0 / 24.0; p = p * r + 1.0 / 6.0; p = p * r + 0.5;
    p = p * r + 1.0; p = p * r + 1.0;
    uint64_t kb; memcpy(&kb, &kd, 8);
    uint64_t sb = ((kb & 0xffffffffull) + 1023ull) << 52;             /* 2^n */
    double sc; memcpy(&sc, &sb, 8);
    float res = (float)(p * sc);
    return x == x ? res : x;
}

/* MindSpore's log1p and expm1 are logf(1 + x) and expf(x) - 1 in float32 (bit for bit against glibc's):
   0 for |x| < 6e-8, where the true functions give x. (The exp is never -0: `+ 0.0f` keeps its rounding
   out of an fma with the subtraction.) */
static inline float dvm_log1p_ms(float x) { return dvm_log_cr(1.0f + x); }
static inline float dvm_expm1_ms(float x) { return (dvm_exp_cr(x) + 0.0f) - 1.0f; }
/* The log op: MindSpore's own Log is not reproduced (docs/numerics.md), the interpreter's is followed. */
static inline float dvm_log_ms(float x) { return dvm_log_cr(x); }
/* MindSpore's float32 erfc is the true function rounded (as the interpreter: bit-equal to eager,
   measured; ms_dynvm's vectorised one was 1 ulp off on 21%). (Its erf is the C library's erff, scalar:
   the kernels keep their vectorised erf, 1 ulp off eager on 7%, for the erf-form GELU's speed.) */
static inline float dvm_erfc_ms(float x) { return dvm_erfcf_d(x); }

/* sigmoid, silu and elu as MindSpore builds them on its exp: 1 / (1 + e^-x), x * that,
   alpha * (e^x - 1). e^x >= 0:
   `+ 0.0f` rounds it apart from the add that follows. */
static inline float dvm_sigmoid_ms(float x) { return 1.0f / (1.0f + (dvm_exp_ms(-x) + 0.0f)); }
/* MindSpore's float32 SiLUGrad: s on its exp, then dy*s + (dy*x) * (s*(1 - s)), each product
   rounded on its own (no fused multiply-add), as the interpreter (measured bit-equal to eager). */
static inline float dvm_silu_grad_ms(float dy, float x) {
    float s = dvm_sigmoid_ms(x);
    float a = dvm_keepf(dy * s);
    float b = dvm_keepf(dy * x);
    return a + dvm_keepf(b * (s * (1.0f - s)));
}
/* MindSpore's GeLU, tanh form (float32; float16 eager runs it and rounds once): every step in
   float32 on the C library's tanhf, as the interpreter's `_gelu_tanh_ms` (measured bit-equal to
   eager). Scalar: tanhf is a call, as in eager. */
static inline float dvm_gelu_tanh_ms(float x) {
    float u = 0.7978845608f * (x + dvm_keepf(dvm_keepf(dvm_keepf(0.044715f * x) * x) * x));
    return dvm_keepf(0.5f * x) * (1.0f + tanhf(u));
}
/* MindSpore's GeLUGrad, tanh form (float32; float16 and float64 eager compute it in float32 too):
   tanh and the slope factor in double, each rounded to float32, then
   dy * (((1 + t) + (x * (1 - t*t)) * m) / 2) in float32 with every product rounded on its own
   (measured bit-equal to eager on 16,000 values; the interpreter's `_gelu_grad_tanh_ms`). Scalar:
   the C library's double tanh, as eager's. */
static inline float dvm_gelu_grad_tanh_ms(float dy, float x) {
    double d = (double)x;
    double u = d + dvm_keepd(dvm_keepd(dvm_keepd(0.044715 * d) * d) * d);
    float t = (float)tanh(dvm_keepd(0.7978845608 * u));
    float m = (float)(0.7978845608 + dvm_keepd(dvm_keepd(0.1070322244 * d) * d));
    float y = ((1.0f + t) + dvm_keepf(dvm_keepf(x * (1.0f - dvm_keepf(t * t))) * m)) / 2.0f;
    return dy * y;
}
static inline float dvm_elu_ms(float x, float alpha) {
    return x > 0.0f ? x : alpha * ((dvm_exp_ms(x) + 0.0f) - 1.0f);
}

/* x * tanh(log(1 + e^x)) as ((1 + e)^2 - 1) / ((1 + e)^2 + 1): NaN from x > 44.36 on (Inf / Inf), as
   in MindSpore. */
static inline float dvm_mish_ms(float x) {
    float u = 1.0f + dvm_exp_ms(x);
    float q = u * u + 0.0f;
    return x * ((q - 1.0f) / (q + 1.0f));
}
"""

MATH_C += _EAGER_C

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
    return z != z ? INFINITY : r;  /* softplus(NaN) is +inf, as MindSpore's */
}
static inline float dvm_mish(float x) { return x * tanhf(dvm_softplus(x, 1.0f, 1e30f)); }
static inline float dvm_elu(float x, float alpha) { return x > 0.0f ? x : alpha * expm1f(x); }
static inline float dvm_gelu_grad_erf(float dy, float x) {
    float phi = 0.5f * erfcf(-x * 0.70710678118654752f);
    return dy * (phi + x * expf(-0.5f * x * x) * 0.3989422804014327f);
}
""" + _SHARED_C

STRICT_C += _EAGER_C

MEASURED = ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "erfc", "gelu_erf")

__all__ = ["MATH_C", "MEASURED", "STRICT_C"]
