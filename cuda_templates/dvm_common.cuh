// ms_dynvm CUDA prelude: fixed-width types, special values, float16/bfloat16 storage conversions,
// the VM's arithmetic rules, the float32 math the scalar-op vocabulary names (on CUDA's own device
// functions), and warp-shuffle + shared-memory block reductions. Prepended by ms_dynvm.codegen.cuda
// to every generated kernel (NVRTC compiles it without any system header).
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define DVM_DEV static __device__ __forceinline__

// --- storage conversions -----------------------------------------------------------------------
// float16 is stored as its 16 bits; converted with the hardware's round-to-nearest-even.
DVM_DEV float dvm_h2f(uint16_t h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
DVM_DEV uint16_t dvm_f2h(float f) { uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
DVM_DEV float dvm_round_f16(float f) { return dvm_h2f(dvm_f2h(f)); }
// bfloat16 values live in float32 storage (as in the interpreter), rounded after every op.
DVM_DEV float dvm_bf16(float x) {
    uint32_t b = __float_as_uint(x);
    uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    return x != x ? x : __uint_as_float(r);
}

// --- the VM's arithmetic rules (as codegen/c.py and the reference interpreter) -------------------
// Products are rounded on their own (__fmul_rn is never contracted into an fma), as eager rounds
// each op; `keep` is the identity for the other results.
DVM_DEV float dvm_keepf(float p) { return p; }
DVM_DEV double dvm_keepd(double p) { return p; }
DVM_DEV float dvm_divf(float x, float y) {  // division by +-0 ignores the zero's sign
    float z = x == 0.0f ? NAN : (x > 0.0f ? INFINITY : -INFINITY);
    return y == 0.0f ? z : x / y;
}
DVM_DEV double dvm_divd(double x, double y) {
    double z = x == 0.0 ? (double)NAN : (x > 0.0 ? (double)INFINITY : -(double)INFINITY);
    return y == 0.0 ? z : x / y;
}
DVM_DEV int32_t dvm_f2i32(double v) {  // x86 cvtt: NaN and out of range give INT_MIN
    return (v >= -2147483648.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}
DVM_DEV int64_t dvm_f2i64(double v) {
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}

// --- float32 math on CUDA's device functions (accuracy: docs/gpu.md, measured by tests/gpu) -----
DVM_DEV float dvm_powf_d(float x, float y) { return (float)pow((double)x, (double)y); }
DVM_DEV float dvm_atan2f_d(float y, float x) { return (float)atan2((double)y, (double)x); }
DVM_DEV float dvm_sinf_d(float x) { return (float)sin((double)x); }
DVM_DEV float dvm_cosf_d(float x) { return (float)cos((double)x); }
DVM_DEV float dvm_tanf_d(float x) { return (float)tan((double)x); }
DVM_DEV float dvm_exp(float x) { return expf(x); }
DVM_DEV float dvm_expm1(float x) { return expm1f(x); }
DVM_DEV float dvm_log(float x) { return logf(x); }
DVM_DEV float dvm_log1p(float x) { return log1pf(x); }
DVM_DEV float dvm_log2(float x) { return log2f(x); }
DVM_DEV float dvm_tanh(float x) { return tanhf(x); }
DVM_DEV float dvm_erf(float x) { return erff(x); }
DVM_DEV float dvm_erfc(float x) { return erfcf(x); }
DVM_DEV float dvm_sigmoid(float x) {
    float e = expf(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
DVM_DEV void dvm_sig2(float z, float *s, float *sm) {  // sigmoid(z) and 1 - sigmoid(z)
    float e = expf(-fabsf(z));
    float inv = 1.0f / (1.0f + e);
    *s = z >= 0.0f ? inv : e * inv;
    *sm = z >= 0.0f ? e * inv : inv;
}
DVM_DEV float dvm_gelu_erf(float x) { return 0.5f * x * erfcf(-x * 0.70710678118654752f); }
DVM_DEV float dvm_gelu_tanh(float x) {
    const float K = 0.7978845608028654f;
    return x * dvm_sigmoid(2.0f * K * (x + 0.044715f * x * x * x));
}
DVM_DEV float dvm_softplus(float x, float beta, float threshold) {
    float z = beta * x;
    float r = (fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)))) / beta;
    r = z > threshold ? x : r;
    return z != z ? INFINITY : r;  // softplus(NaN) is +inf, as MindSpore's
}
DVM_DEV float dvm_mish(float x) { return x * tanhf(dvm_softplus(x, 1.0f, 1e30f)); }
DVM_DEV float dvm_elu(float x, float alpha) { return x > 0.0f ? x : alpha * expm1f(x); }
DVM_DEV float dvm_gelu_grad_erf(float dy, float x) {
    float phi = 0.5f * erfcf(-x * 0.70710678118654752f);
    return dy * (phi + x * expf(-0.5f * x * x) * 0.3989422804014327f);
}
DVM_DEV float dvm_gelu_grad_tanh(float dy, float x) {
    const float K = 0.7978845608028654f;
    float u = K * (x + 0.044715f * x * x * x);
    float s, sm;
    dvm_sig2(2.0f * u, &s, &sm);
    return dy * (s + 0.5f * x * (4.0f * s * sm) * K * (1.0f + 3.0f * 0.044715f * x * x));
}
DVM_DEV float dvm_silu_grad(float dy, float x) {
    float s, sm;
    dvm_sig2(x, &s, &sm);
    return dy * s * (1.0f + x * sm);
}
// --- reductions --------------------------------------------------------------------------------
// Accumulator combine rules (as codegen/c.py): max/min keep a NaN first element and skip later
// NaNs; nanmax propagates NaN.
#define DVM_SUM 0
#define DVM_PROD 1
#define DVM_MAX 2
#define DVM_MIN 3
#define DVM_NANMAX 4
template <int K, typename T> DVM_DEV T dvm_combine(T acc, T v) {
    if (K == DVM_SUM) return acc + v;
    if (K == DVM_PROD) return acc * v;
    if (K == DVM_MAX) return v > acc ? v : acc;
    if (K == DVM_MIN) return v < acc ? v : acc;
    return (v > acc || v != v) ? v : acc;
}
template <typename T> DVM_DEV T dvm_shfl(T v, int lane) { return __shfl_xor_sync(0xffffffffu, v, lane); }
DVM_DEV int8_t dvm_shfl(int8_t v, int lane) { return (int8_t)__shfl_xor_sync(0xffffffffu, (int)v, lane); }
DVM_DEV int16_t dvm_shfl(int16_t v, int lane) { return (int16_t)__shfl_xor_sync(0xffffffffu, (int)v, lane); }
DVM_DEV uint8_t dvm_shfl(uint8_t v, int lane) { return (uint8_t)__shfl_xor_sync(0xffffffffu, (int)v, lane); }

// All-reduce over the block (blockDim.x a multiple of 32, at most 1024): a butterfly of warp
// shuffles, the warps' partials through shared memory, the result broadcast to every thread. The
// order of combination is fixed for a given blockDim, so results are the same run to run.
template <int K, typename T> DVM_DEV T dvm_block_reduce(T v) {
    __shared__ uint64_t dvm_red[33];
    T *red = reinterpret_cast<T *>(dvm_red);
    for (int o = 16; o > 0; o >>= 1) v = dvm_combine<K>(v, dvm_shfl(v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (nw == 1) return v;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nw ? red[lane] : red[0];
        if (lane >= nw && K == DVM_SUM) w = (T)0;
        if (lane >= nw && K == DVM_PROD) w = (T)1;
        for (int o = 16; o > 0; o >>= 1) w = dvm_combine<K>(w, dvm_shfl(w, o));
        if (lane == 0) red[32] = w;
    }
    __syncthreads();
    T r = red[32];
    __syncthreads();
    return r;
}
