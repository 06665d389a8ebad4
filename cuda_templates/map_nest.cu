// Elementwise nest: every step is a grid-stride loop over its flattened iteration space.
extern "C" __global__ void __launch_bounds__(${threads}) ${name}(${params}) {
    const int64_t gtid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t gstride = (int64_t)gridDim.x * blockDim.x;
${steps}
}
