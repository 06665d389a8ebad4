// Row nest: one thread block per outer point; reductions are block-wide (dvm_block_reduce), so
// blockDim.x must be a multiple of 32. The row length is a run-time size.
extern "C" __global__ void __launch_bounds__(1024) ${name}(${params}) {
    const int64_t n_outer = ${n_outer};
    for (int64_t o = blockIdx.x; o < n_outer; o += gridDim.x) {
${body}
    }
}
