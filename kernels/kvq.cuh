// The KV cache's page formats (attention.cuh describes the pools): FP16
// (KV_F16), or blocks of 32 values with one FP16 scale each as ggml's
// Q8_0 (KV_Q8_0: signed bytes, x = q d) and Q4_0 (KV_Q4_0: nibbles, x =
// (q - 8) d). A quantized page of KV_PAGE rows of kv_dim values (kv_dim a
// multiple of 64) holds its quants first, row after row (kv_dim bytes a
// row, or kv_dim / 2 with two nibbles a byte: value 2i low, 2i + 1 high),
// then its scales, row after row (kv_dim / 32 halves a row): a page is
// KV_PAGE kv_dim (34 or 18) / 32 bytes, the size of ggml's blocks, with
// every load of 8 values aligned to its size.
//
// Before a quantized page takes them, keys are rotated by an orthonormal
// Walsh-Hadamard transform over runs of k_run values of a head (the
// largest power of two dividing the head size: the queries get the same
// rotation, so q.k is unchanged) and values over runs of 64 (the
// attention's output is rotated back after it): an outlier spreads over
// its block before the block's one scale is chosen (llama.cpp's KV
// cache does the same). The rotation and the rounding are the CPU
// backend's (crates/m40-model/src/cpu/kv.rs), operation for operation:
// the same pages on both.
#pragma once
#include "common.cuh"
#include "quant.cuh"

#define KV_F16 0
#define KV_Q8_0 1
#define KV_Q4_0 2

// Bits of a quant (16: an FP16 value, no scale).
template <int F>
struct KvBits {
    static constexpr int v = F == KV_F16 ? 16 : F == KV_Q8_0 ? 8 : 4;
};

// Bytes of one page of one layer's K (or V) pool.
template <int F>
__device__ __forceinline__ long long kv_page_bytes(int kv_dim) {
    // Quants, then a half per 32 values.
    return (long long)KV_PAGE * kv_dim * KvBits<F>::v / 8 + (F == KV_F16 ? 0 : (long long)KV_PAGE * kv_dim / 16);
}

// A row of a pool: its quants (or halves) and its scales.
struct KvRowPtr {
    const u8* q;
    const u16* s;
};

// Row `slot` of page `page` of `pool`.
template <int F>
__device__ __forceinline__ KvRowPtr kv_row_ptr(const u16* pool, long long page, int slot, int kv_dim) {
    const u8* base = (const u8*)pool + page * kv_page_bytes<F>(kv_dim);
    const int row_bytes = kv_dim * KvBits<F>::v / 8;
    KvRowPtr r;
    r.q = base + (long long)slot * row_bytes;
    r.s = F == KV_F16 ? nullptr : (const u16*)(base + (long long)KV_PAGE * row_bytes) + slot * (kv_dim / 32);
    return r;
}

// N consecutive values of a row (N = 2, 4 or 8, from a dimension that is
// a multiple of N), as loaded: raw quants and their block's scale.
template <int F, int N>
struct KvVals {
    static constexpr int BYTES = N * KvBits<F>::v / 8;
    u32 w[(BYTES + 3) / 4];
    u16 s;
};

// Load values d .. d + N - 1 of row r (zeros where !ok).
template <int F, int N>
__device__ __forceinline__ void kv_load(KvVals<F, N>& v, KvRowPtr r, int d, bool ok) {
    constexpr int B = KvVals<F, N>::BYTES;
    const u8* p = r.q + d * KvBits<F>::v / 8;
    if (B == 16) {
        const uint4 x = ok ? __ldg((const uint4*)p) : make_uint4(0, 0, 0, 0);
        v.w[0] = x.x, v.w[1 % ((B + 3) / 4)] = x.y, v.w[2 % ((B + 3) / 4)] = x.z, v.w[3 % ((B + 3) / 4)] = x.w;
    } else if (B == 8) {
        const uint2 x = ok ? __ldg((const uint2*)p) : make_uint2(0, 0);
        v.w[0] = x.x, v.w[1 % ((B + 3) / 4)] = x.y;
    } else if (B == 4) {
        v.w[0] = ok ? __ldg((const u32*)p) : 0u;
    } else if (B == 2) {
        v.w[0] = ok ? (u32)__ldg((const u16*)p) : 0u;
    } else {
        v.w[0] = ok ? (u32)__ldg(p) : 0u;
    }
    v.s = (F != KV_F16 && ok) ? __ldg(r.s + d / 32) : (u16)0;
}

// The values as FP32.
template <int F, int N>
__device__ __forceinline__ void kv_f32(const KvVals<F, N>& v, float f[N]) {
    if (F == KV_F16) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i)
            f[2 * i] = h2f((u16)(v.w[i] & 0xffff)), f[2 * i + 1] = h2f((u16)(v.w[i] >> 16));
    } else if (F == KV_Q8_0) {
        const float d = h2f(v.s);
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = (float)(signed char)(v.w[i / 4] >> (8 * (i % 4))) * d;
    } else {
        const float d = h2f(v.s);
#pragma unroll
        for (int i = 0; i < N; ++i) f[i] = (float)((int)((v.w[i / 8] >> (4 * (i % 8))) & 15) - 8) * d;
    }
}

// --- The append side: rotation and quantization by one warp ---
//
// A head vector of hd = 32 R values (R <= 8) in a warp, lane-major: lane l
// holds dimensions l + 32 r in x[r]. KVQ_MAX_R bounds R.
#define KVQ_MAX_R 8

// The Walsh-Hadamard transform of each run of `run` values (a power of
// two, 64 <= run <= hd), scaled by 1 / sqrt(run): the butterflies of
// strides 1, 2, 4, ... run / 2 in that order, as cpu/kv.rs's `rotate`.
__device__ __forceinline__ void kvq_rotate(float x[KVQ_MAX_R], int R, int run) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
        const bool upper = lane & h;
#pragma unroll
        for (int r = 0; r < KVQ_MAX_R; ++r) {
            if (r >= R) break;
            const float o = __shfl_xor_sync(0xffffffffu, x[r], h);
            // Lower: u + w (u its own); upper: u - w (u its partner's).
            x[r] = upper ? __fsub_rn(o, x[r]) : __fadd_rn(x[r], o);
        }
    }
#pragma unroll
    for (int s = 1; s < KVQ_MAX_R; s <<= 1) {
        if (32 * s >= run) break;
#pragma unroll
        for (int r = 0; r < KVQ_MAX_R; ++r) {
            if ((r & s) == 0 && r + s < R) {
                const float u = x[r], w = x[r + s];
                x[r] = __fadd_rn(u, w);
                x[r + s] = __fsub_rn(u, w);
            }
        }
    }
    const float scale = __frcp_rn(__fsqrt_rn((float)run));
#pragma unroll
    for (int r = 0; r < KVQ_MAX_R; ++r)
        if (r < R) x[r] = __fmul_rn(x[r], scale);
}

// Quantize block r (dimensions 32 r .. + 31: the warp's x[r]) into row
// `row` (quants, scales) at dimension d0 + 32 r, as m40-gguf's block_q8_0
// and block_q4_0 (the scale's division and reciprocal rounded, the
// product not fused with the rounding's add).
template <int F>
__device__ __forceinline__ void kvq_store_block(float x, u8* q, u16* s, int blk) {
    const int lane = threadIdx.x & 31;
    if (F == KV_Q8_0) {
        float amax = fabsf(x);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = __fdiv_rn(amax, 127.0f);
        const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
        const u32 b = (u32)(u8)(signed char)(int)roundf(__fmul_rn(x, id));
        // Four lanes' bytes to a word.
        const u32 w = b | (__shfl_down_sync(0xffffffffu, b, 1) << 8) | (__shfl_down_sync(0xffffffffu, b, 2) << 16) |
                      (__shfl_down_sync(0xffffffffu, b, 3) << 24);
        if ((lane & 3) == 0) *(u32*)(q + 32 * blk + lane) = w;
        if (lane == 0) s[blk] = f2h(d);
    } else {
        // The value of largest magnitude with its sign, the first on ties.
        float amax = fabsf(x), mx = x;
        int at = lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, mx, o);
            const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
            if (a2 > amax || (a2 == amax && at2 < at)) amax = a2, mx = m2, at = at2;
        }
        const float d = __fdiv_rn(mx, -8.0f);
        const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
        const u32 n = min(15, (int)__fadd_rn(__fmul_rn(x, id), 8.5f));
        // Eight lanes' nibbles to a word (value 2i low, 2i + 1 high).
        u32 w = n;
#pragma unroll
        for (int i = 1; i < 8; ++i) w |= __shfl_down_sync(0xffffffffu, n, i) << (4 * i);
        if ((lane & 7) == 0) *(u32*)(q + 16 * blk + lane / 2) = w;
        if (lane == 0) s[blk] = f2h(d);
    }
}

// Rotate a head vector of hd = 32 R values at `src` (shared or global;
// lane-major loads) over runs of `run` and write it back to `dst` (null:
// skip) or quantize it into row (q, s) at dimension d0 (a multiple of 32).
template <int F>
__device__ __forceinline__ void kvq_head(const float* src, int R, int run, float* dst, u8* q, u16* s, int d0) {
    const int lane = threadIdx.x & 31;
    float x[KVQ_MAX_R];
#pragma unroll
    for (int r = 0; r < KVQ_MAX_R; ++r) x[r] = r < R ? src[lane + 32 * r] : 0.0f;
    kvq_rotate(x, R, run);
    if (dst != nullptr) {
#pragma unroll
        for (int r = 0; r < KVQ_MAX_R; ++r)
            if (r < R) dst[lane + 32 * r] = x[r];
        return;
    }
    const int qb = 32 * KvBits<F>::v / 8;  // bytes of a block's quants
#pragma unroll
    for (int r = 0; r < KVQ_MAX_R; ++r)
        if (r < R) kvq_store_block<F>(x[r], q + (d0 / 32) * qb, s + d0 / 32, r);
}
