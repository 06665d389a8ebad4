// Index kernels of the executor's library (ms_dynvm.codegen.cuda.library), instantiated per element
// type T and index type I by string substitution. Grid-stride loops; sizes are run-time arguments.

// gather / index_select along one axis (np.take): x viewed as [pre, n, post], idx flat [m],
// out [pre, m, post]. A negative index counts from the end; one still out of range reads 0 and
// raises the flag (the executor checks it and reports the error).
extern "C" __global__ void dvm_take_${TN}_${IN}(const ${T} *__restrict__ x, const ${I} *__restrict__ idx,
                                           ${T} *__restrict__ out, int *__restrict__ bad,
                                           const int64_t pre, const int64_t n, const int64_t m,
                                           const int64_t post) {
    const int64_t total = pre * m * post;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = t % post;
        const int64_t r = t / post;
        const int64_t i = r % m;
        const int64_t p = r / m;
        int64_t j = (int64_t)idx[i];
        j = j < 0 ? j + n : j;
        if (j < 0 || j >= n) {
            out[t] = (${T})0;
            *bad = 1;
        } else {
            out[t] = x[(p * n + j) * post + c];
        }
    }
}

// unsorted_segment_sum: x viewed as [rows, cols], ids flat [rows]; out [nseg, cols], zeroed by the
// caller; ids out of [0, nseg) are dropped (as the reference). Atomic adds: the order of the
// additions into one segment is not fixed (float sums may differ run to run in the last bits).
extern "C" __global__ void dvm_segsum_${TN}_${IN}(const ${T} *__restrict__ x, const ${I} *__restrict__ ids,
                                             ${T} *__restrict__ out, const int64_t rows, const int64_t cols,
                                             const int64_t nseg) {
    const int64_t total = rows * cols;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / cols;
        const int64_t s = (int64_t)ids[r];
        if (s >= 0 && s < nseg) atomicAdd(&out[s * cols + (t - r * cols)], x[t]);
    }
}
