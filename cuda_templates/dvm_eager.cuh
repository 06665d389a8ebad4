// eager_math (the default): the ops whose reference semantics are MindSpore CPU's own float32
// formulas (exp, expm1, log1p, tanh, mish, sigmoid, elu, erfc, log; runtime/interpreter.py follows
// them, see its _MS_F32) evaluated with those formulas, so fused GPU results match the reference
// within float32 rounding. The formulas are the C backend's (codegen/cmath._EAGER_C, inserted below
// by the renderer: one source for both backends); this prelude supplies what they use.
DVM_DEV void dvm_memcpy(void *d, const void *s, unsigned long n) {  // (the formulas' bit casts)
    for (unsigned long i = 0; i < n; i++) ((char *)d)[i] = ((const char *)s)[i];
}
DVM_DEV uint32_t dvm_f2u(float x) { return __float_as_uint(x); }
DVM_DEV float dvm_u2f(uint32_t u) { return __uint_as_float(u); }
DVM_DEV float dvm_log_reduce(float x, int32_t *e) {  // x > 0 finite as 2^e * m, m in [sqrt(1/2), sqrt(2))
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t u = (int32_t)(dvm_f2u(xs) - 0x3f3504f3u);
    *e = (u >> 23) - (sub ? 23 : 0);
    return dvm_u2f(((uint32_t)u & 0x007fffffu) + 0x3f3504f3u);
}
DVM_DEV float dvm_log_special(float x, float r) {
    r = x < INFINITY ? r : x;
    r = x == 0.0f ? -INFINITY : r;
    return x < 0.0f ? NAN : r;
}
DVM_DEV float dvm_erfcf_d(float x) { return (float)erfc((double)x); }
