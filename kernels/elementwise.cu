// Element-wise kernels of the forward pass: SwiGLU, GeGLU and gpt-oss's
// clamped SwiGLU, residual add,
// scaling and soft-capping, FP32->FP16.
//
// Layout: flat arrays of n elements (the launcher passes the product of the
// shape). Launch: grid ceil(n / ELEMENTWISE_THREADS) (capped, grid-stride
// loops cover the rest), block ELEMENTWISE_THREADS. One read and one write per
// element, coalesced: these are bound by memory bandwidth on any GPU and are
// kept as separate kernels only until they are fused into their neighbours.
#include "common.cuh"
#include "quant.cuh"

#define ELEMENTWISE_THREADS 256

// g[i] = silu(g[i]) * u[i]; g, u (n) FP32 (g may be the output of the gate
// projection, u of the up projection).
extern "C" __global__ void swiglu_f32(float* g, const float* u, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = swiglu1(g[i], u[i]);
}

// g[i] = gelu(g[i]) * u[i] (GeGLU, tanh approximation); as swiglu_f32.
extern "C" __global__ void geglu_f32(float* g, const float* u, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = geglu1(g[i], u[i]);
}

// g[i] = swiglu_oai(g[i], u[i]) (gpt-oss's experts); as swiglu_f32.
extern "C" __global__ void swiglu_oai_f32(float* g, const float* u, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        g[i] = swiglu_oai1(g[i], u[i]);
}

// x[i] *= s (gemma's embedding scale). x (n) FP32.
extern "C" __global__ void scale_f32(float* x, long long n, float s) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] *= s;
}

// x[i] = c tanh(x[i] / c): logits soft-capped to (-c, c) (gemma2). x (n) FP32.
extern "C" __global__ void softcap_f32(float* x, long long n, float c) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = c * tanhf(x[i] / c);
}

// The gate of an interleaved gate/up projection (gemv_packed.cu's glu
// layout): gu (m, 2f) holds per 4 columns gate 2i, gate 2i+1, up 2i, up
// 2i+1; out (m, f)[2i + j] = act(gate 2i+j) * up 2i+j (common.cuh glu_act:
// 0 SwiGLU, 1 GeGLU, 2 gpt-oss's). n = m * f / 2 pairs.
extern "C" __global__ void glu_pairs_f32(const float* gu, float* out, long long n, int act) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float2 g = ((const float2*)gu)[2 * i], u = ((const float2*)gu)[2 * i + 1];
        ((float2*)out)[i] = make_float2(glu_act(act, g.x, u.x), glu_act(act, g.y, u.y));
    }
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

// Llama 4's attention temperature (mistral3): row t of x (n_tok rows of
// width, a step's queries) times 1 + s ln(floor(p / fl) + 1), p the row's
// position: pos[t] (per_token: a batched step) or pos[0] + t (one sequence).
extern "C" __global__ void attn_temp_f32(float* x, const int* pos, int per_token, int n_tok, int width, float s,
                                         int fl) {
    const long long n = (long long)n_tok * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(i / width), p = per_token ? pos[t] : pos[0] + t;
        x[i] *= 1.0f + s * logf((float)(p / fl) + 1.0f);
    }
}
