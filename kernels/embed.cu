// Embedding gather: out[t, c] = dequant(W)[ids[t], c], for weights in any
// GGML format (the token embedding table stays in its GGUF format on the GPU).
//
// Layout: W (n_vocab, row_bytes) in its format; ids (n_ids) int32;
// out (n_ids, ncols) FP32.
// Launch: grid (n_ids, ceil(8 * subs_per_row / EMBED_THREADS)), block
// EMBED_THREADS; each thread dequantizes one 4-weight part of a sub-block
// straight from global memory (quant.cuh) and writes 4 floats. A few rows per step:
// latency, not bandwidth, matters here, so no staging.
// An id outside [0, n_vocab) writes a row of NaNs instead of reading out of
// bounds (callers check ids before upload; this keeps a bad one visible).
#include "packed.cuh"

#define EMBED_THREADS 128

template <class F>
__device__ __forceinline__ void embed(const u8* __restrict__ W, const int* __restrict__ ids, float* __restrict__ out,
                                      int ncols, long long row_bytes, int n_vocab) {
    const int t = blockIdx.x;
    const int item = blockIdx.y * EMBED_THREADS + threadIdx.x;
    const int nb = (ncols + F::QK - 1) / F::QK;
    if (item >= nb * F::SUBS * 8) return;
    const int sb = item >> 3, p = item & 7;
    const int b = sb / F::SUBS, s = sb % F::SUBS;
    const int c0 = b * F::QK + s * 32 + 4 * p;
    if (c0 >= ncols) return;  // past the end of a partial float pseudo-block
    float* o = out + (long long)t * ncols + c0;
    const int valid = min(4, ncols - c0);
    const int id = ids[t];
    float v[4];
    if (id < 0 || id >= n_vocab) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = __int_as_float(0x7fffffff);
    } else {
        F::part(W + (long long)id * row_bytes + (long long)b * F::BYTES, s, p, v);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (j < valid) o[j] = v[j];
}

#define EMBED_KERNEL(name, F)                                                                            \
    extern "C" __global__ void embed_##name##_f32(const u8* W, const int* ids, float* out, int ncols,    \
                                                  long long row_bytes, int n_vocab) {                    \
        embed<F>(W, ids, out, ncols, row_bytes, n_vocab);                                                \
    }
M40_FORMATS(EMBED_KERNEL)

// The same gather from a table in the packed layout (packed.cuh; tied
// embeddings share the output matrix's packed copy): thread item takes parts
// q and q + 4 of block item / 4 (8 weights). ncols is a multiple of 32.
template <class P>
__device__ __forceinline__ void embed_packed(const u8* __restrict__ W, const int* __restrict__ ids,
                                             float* __restrict__ out, int ncols, int n_vocab) {
    const int t = blockIdx.x;
    const int item = blockIdx.y * EMBED_THREADS + threadIdx.x;
    if (item >= (ncols >> 5) * 4) return;
    const int b = item >> 2, q = item & 3;
    float* o = out + (long long)t * ncols + 32 * b + 4 * q;
    const int id = ids[t];
    float v0[4], v1[4];
    if (id < 0 || id >= n_vocab) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v0[j] = v1[j] = __int_as_float(0x7fffffff);
    } else {
        P::parts(W, n_vocab, ncols, id, b, q, v0, v1);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        o[j] = v0[j];
        o[16 + j] = v1[j];
    }
}

#define EMBED_PACKED_KERNEL(name, P)                                                                     \
    extern "C" __global__ void embed_packed_##name##_f32(const u8* W, const int* ids, float* out, int ncols, \
                                                         int n_vocab) {                                  \
        embed_packed<P>(W, ids, out, ncols, n_vocab);                                                    \
    }
M40_PACKED_FORMATS(EMBED_PACKED_KERNEL)
