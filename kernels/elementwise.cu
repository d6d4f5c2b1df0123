// Element-wise kernels of the forward pass: SwiGLU, residual add, FP32->FP16.
//
// Layout: flat arrays of n elements (the launcher passes the product of the
// shape). Launch: grid ceil(n / ELEMENTWISE_THREADS) (capped, grid-stride
// loops cover the rest), block ELEMENTWISE_THREADS. One read and one write per
// element, coalesced: these are bound by memory bandwidth on any GPU and are
// kept as separate kernels only until they are fused into their neighbours.
#include "quant.cuh"

#define ELEMENTWISE_THREADS 256

// SiLU(g) * u, the gate of SwiGLU. Building block for fused kernels.
__device__ __forceinline__ float swiglu1(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// g[i] = silu(g[i]) * u[i]; g, u (n) FP32 (g may be the output of the gate
// projection, u of the up projection).
extern "C" __global__ void swiglu_f32(float* g, const float* u, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = swiglu1(g[i], u[i]);
}

// y[i] += x[i]: the residual connection. y, x (n) FP32.
extern "C" __global__ void add_f32(float* y, const float* x, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] += x[i];
}

// y[i] = fp16(x[i]), round to nearest even (KV cache append). x (n) FP32, y (n) FP16 bits.
extern "C" __global__ void f32_to_f16(const float* x, u16* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = f2h(x[i]);
}

// y[i] += b[i % width]: a bias added to every row of y (n elements, rows of width).
extern "C" __global__ void add_rows_f32(float* y, const float* b, long long n, int width) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] += b[i % width];
}
