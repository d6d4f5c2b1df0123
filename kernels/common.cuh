// Shared device helpers for m40-llm's kernels (sm_52: no FP16 arithmetic, no
// tensor cores; everything accumulates in FP32).
#pragma once

// Sum of `v` over the 32 lanes of a warp (every lane gets the total).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum of `v` over a block of `blockDim.x` threads (a multiple of 32, at most
// 1024); `scratch` holds 32 floats of shared memory. Every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    v = lane < n_warps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

// a * s * w: a normed value (s the row's scale, w the norm's weight).
__device__ __forceinline__ float scale_mul(float a, float s, float w) { return a * s * w; }
__device__ __forceinline__ float4 scale_mul(float4 a, float s, float4 w) {
    return make_float4(a.x * s * w.x, a.y * s * w.y, a.z * s * w.z, a.w * s * w.w);
}

// SiLU(g) * u, the gate of SwiGLU.
__device__ __forceinline__ float swiglu1(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// gpt-oss's gate (ggml's swiglu_oai): g = min(g, 7), u = clamp(u, -7, 7),
// g sigmoid(1.702 g) (u + 1); expf, as the CPU reference's exp.
__device__ __forceinline__ float swiglu_oai1(float g, float u) {
    const float x = fminf(g, 7.0f), y = fminf(fmaxf(u, -7.0f), 7.0f);
    return x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
}

// GELU(g) * u with GELU's tanh approximation, the gate of GeGLU (gemma);
// tanhf, not a fast approximation: the CPU reference's tanh.
__device__ __forceinline__ float geglu1(float g, float u) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608f * g * (1.0f + 0.044715f * g * g))) * u;
}

// act(g) * u of the gate activations (m40_gguf's Activation, in order:
// 0 SwiGLU, 1 GeGLU, 2 gpt-oss's clamped SwiGLU).
__device__ __forceinline__ float glu_act(int act, float g, float u) {
    return act == 2 ? swiglu_oai1(g, u) : act == 1 ? geglu1(g, u) : swiglu1(g, u);
}

// RoPE's angle for a rotary pair: theta = p * inv_freq in FP32 (p = the
// position times pos_scale), its sine and cosine in double precision
// (theta reaches thousands of radians, where --use_fast_math's __sinf is
// off by ~1e-3; this matches the CPU reference's sin_cos).
__device__ __forceinline__ void rope_sin_cos(float p, float inv_freq, float* s, float* c) {
    const float theta = p * inv_freq;
    double sd, cd;
    sincos((double)theta, &sd, &cd);
    *s = (float)sd;
    *c = (float)cd;
}

// The pair (x0, x1) rotated by the angle whose sine and cosine are s, c.
__device__ __forceinline__ float rope_rot0(float x0, float x1, float s, float c) { return x0 * c - x1 * s; }
__device__ __forceinline__ float rope_rot1(float x0, float x1, float s, float c) { return x0 * s + x1 * c; }

// Tokens per page of the paged KV cache (attention.cu describes the pools):
// position p of a sequence is row (table[p / KV_PAGE] * KV_PAGE + p %
// KV_PAGE) of its pool.
#define KV_PAGE 32

__device__ __forceinline__ long long kv_row(const int* table, int p) {
    return (long long)table[p / KV_PAGE] * KV_PAGE + p % KV_PAGE;
}

// Where a matmul's output row r of token m goes when its weight rows are up
// to three matrices stacked (fused Q/K/V, gate/up): rows [0, r1) to y0,
// [r1, r2) to y1, [r2, n) to y2, each part (tokens, its rows) row-major.
// One matrix: r1 = r2 = n, and y1, y2 are never used.
struct RowParts {
    float* y0;
    float* y1;
    float* y2;
    int r1, r2, n;
    __device__ __forceinline__ float* at(int m, int r) const {
        if (r < r1) return y0 + (long long)m * r1 + r;
        if (r < r2) return y1 + (long long)m * (r2 - r1) + (r - r1);
        return y2 + (long long)m * (n - r2) + (r - r2);
    }
};

// Y (+)= v at token m, rows n .. n + 3 (those below N), plane `part` floats
// on: one 16-byte store where the 4 lie in one part of Y, 16-byte aligned,
// else one by one; the same sums either way (gemm.cu's narrow tile,
// gemm_rows.cuh).
__device__ __forceinline__ void store_row4(const RowParts& Y, long long part, int m, int n, int N, const float* v,
                                           int accumulate) {
    float* y = Y.at(m, n) + part;
    const bool one_part = (n < Y.r1) == (n + 3 < Y.r1) && (n < Y.r2) == (n + 3 < Y.r2);
    if (n + 3 < N && one_part && ((unsigned long long)y & 15) == 0) {
        float4 o = make_float4(v[0], v[1], v[2], v[3]);
        if (accumulate) {
            const float4 a = *(const float4*)y;
            o = make_float4(a.x + o.x, a.y + o.y, a.z + o.z, a.w + o.w);
        }
        *(float4*)y = o;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (n + j >= N) break;
        float* yj = Y.at(m, n + j) + part;
        *yj = accumulate ? *yj + v[j] : v[j];
    }
}

// Where a launch's token t reads x and writes y: rows t0 + t (ContigRows),
// or a mixture's slots grouped by expert (GatheredRows: gemv_packed_grp's
// and gemm_grp's tile of slots order[0 .. m - 1], x row slot / x_per, y row
// slot).
struct ContigRows {
    enum { CONTIG = 1 };
    __device__ int x_row(int t) const { return t; }
    __device__ int y_row(int t) const { return t; }
};
struct GatheredRows {
    enum { CONTIG = 0 };
    const int* order;
    int x_per;
    __device__ int x_row(int t) const { return order[t] / x_per; }
    __device__ int y_row(int t) const { return order[t]; }
};
