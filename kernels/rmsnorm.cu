// RMSNorm: y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]^2) + eps) * w[i].
//
// Layout: x, y (n_rows, n) row-major FP32; w (n) FP32. y may alias x.
// Launch: grid (n_rows), block 256 threads (a multiple of 32); one block per
// row, each thread strides over the row. Why this shape on Maxwell: rows are a
// few thousand floats, so one block per row keeps every SM busy with several
// resident blocks, the row is read twice (sum of squares, then scale) and the
// second read hits L2; warp shuffles do the reduction without shared-memory
// bank traffic beyond one float per warp.
#include "common.cuh"

__device__ __forceinline__ void rmsnorm_row(const float* x, const float* w, float* y, int n, float eps,
                                            float* scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] * scale * w[i];
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps) {
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    rmsnorm_row(x + row * n, w, y + row * n, n, eps, scratch);
}
