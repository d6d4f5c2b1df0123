// The rows tile: Y = X W^T (+ Y) for up to 32 tokens over packed weights
// (gemv_packed.cuh's layout and Pack* formats), each lane holding the sums
// of one row group (4 rows) for all 32 tokens in registers.
//
// Layout: as gemm.cu (X (M, K) FP32 row-major, 16-byte aligned, M <= 32;
// Y (M, N) or RowParts; split over K into gridDim.z planes, added by
// gemm_reduce_f32). Launch: blocks of ROWS_WARPS warps, grid (ceil(strips
// / ROWS_WARPS), 1, splits), a strip 32 row groups (128 rows): warp w of
// block b takes strip ROWS_WARPS b + w, lane l group 32 strip + l.
//
// Why: the narrow tile (gemm.cu, 32 tokens x 128 rows) stages every weight
// in shared memory and reads each k's weights and tokens from there: 8
// wavefronts for 32 FMAs a warp (a broadcast 16-byte read takes 2 on an
// H100), and its L1 ran at 82% beside an FMA pipe at 58% (ncu, BENCHMARKS.md
// issue 33, sixteenth session). Here a lane's weights go from its own
// 16-byte loads (the packed GEMV's, a block's four eighths one after
// another) straight into registers, are decoded once (P::weights) and used
// by 32 tokens, whose x every lane reads at the same address (4 tokens a
// broadcast, 16 FMAs a lane). Only X is staged in shared memory, 4 blocks
// of 32 k (a chunk) at a time, double-buffered: one barrier a chunk; every
// sum adds its k in the same order for any M. 128 sums a lane: 225-247
// registers (sm_52), 2 blocks an SM, so few warps that only grids of one
// full wave run it (m40-kernels' gemm_plan): on an H100, an 8B's output
// matrix at 32 tokens. Tried and not kept (BENCHMARKS.md): the warps of a
// block on one strip, splitting its k (o and down 5-20% slower than the
// narrow tile through the driver's JIT, though not through nvcc's sm_90).
#pragma once
#include "gemv_packed.cuh"

#define ROWS_WARPS 4
#define ROWS_TOKENS 32

template <class P>
__device__ __forceinline__ void gemm_rows(const u8* __restrict__ W, const float* __restrict__ X, const RowParts Y,
                                          int M, int N, int K, int accumulate) {
    constexpr int NW = ROWS_WARPS, CB = 4, CH = CB * 32;  // a chunk: 4 blocks of 32 k
    // float4s of a chunk of X each thread loads, in two halves.
    constexpr int XV = ROWS_TOKENS * CH / 4 / (32 * NW), XH = XV / 2;
    static_assert(XV * 32 * NW * 4 == ROWS_TOKENS * CH && XH * 2 == XV, "the chunk's loads");
    static_assert(ROWS_TOKENS == 32, "a lane per token in X's loader");
    __shared__ __align__(16) float Xs[2][CH][ROWS_TOKENS];
    typedef typename P::Planes Planes;
    typedef typename Planes::Item Item;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = (blockIdx.x * NW + warp) * 32 + lane;
    const int nb = K >> 5, n_groups = (N + 3) >> 2;
    const bool live = g < n_groups;
    // Split over K: this block's blocks of 32 k, whole chunks.
    const int per = (nb + gridDim.z - 1) / gridDim.z;
    const int per_c = (per + CB - 1) / CB * CB;
    const int b_lo = blockIdx.z * per_c, b_hi = min(nb, b_lo + per_c);
    const long long part = gridDim.z > 1 ? (long long)blockIdx.z * M * N : 0;

    float acc[4][ROWS_TOKENS];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int t = 0; t < ROWS_TOKENS; ++t) acc[j][t] = 0.0f;

    float4 xr[XH];
    auto x_load = [&](int c0, int h) {
#pragma unroll
        for (int v = 0; v < XH; ++v) {
            const int idx = threadIdx.x + (v + XH * h) * 32 * NW, t = idx & 31, k = c0 * 32 + 4 * (idx >> 5);
            xr[v] = t < M && k < b_hi * 32 ? ld_x4(X + (long long)t * K + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    auto x_store = [&](int s, int h) {
#pragma unroll
        for (int v = 0; v < XH; ++v) {
            const int idx = threadIdx.x + (v + XH * h) * 32 * NW, t = idx & 31, k = 4 * (idx >> 5);
            Xs[s][k][t] = xr[v].x, Xs[s][k + 1][t] = xr[v].y, Xs[s][k + 2][t] = xr[v].z, Xs[s][k + 3][t] = xr[v].w;
        }
    };

    // A lane's items: eighth e of block b is item l = 4 (b - b_lo) + e;
    // items l + 1 and l + 2 are in flight while item l is decoded (the loop
    // over items is kept rolled: unrolled, ptxas decoded a block's four
    // eighths together and spilled).
    const int gl = live ? g : 0;
    auto w_load = [&](int l) {
        const int b = b_lo + (l >> 2);
        return live && b < b_hi ? Planes(W, gl, nb, n_groups, l & 3).load(b) : Item{};
    };
    Item i0 = w_load(0), i1 = w_load(1);
    if (b_lo < b_hi) {
        x_load(b_lo, 0);
        x_store(0, 0);
        x_load(b_lo, 1);
        x_store(0, 1);
    }
    __syncthreads();
    for (int c0 = b_lo, cur = 0; c0 < b_hi; c0 += CB, cur ^= 1) {
        const bool next = c0 + CB < b_hi;
        const int n_items = 4 * min(CB, b_hi - c0);
        // The next chunk's X, half after a quarter and half after three
        // quarters of the items (16 registers, not 32).
        const int h0 = n_items / 4, h1 = 3 * n_items / 4;
#pragma unroll 1
        for (int i = 0; i < n_items; ++i) {
            const int e = i & 3;
            if (next && (i == 0 || i == n_items / 2)) x_load(c0 + CB, i == 0 ? 0 : 1);
            float w[4][8];
            P::weights(i0, e, w);
            i0 = i1;
            i1 = w_load(4 * (c0 - b_lo) + i + 2);
            const float* xs = &Xs[cur][(i >> 2) * 32][0];
#pragma unroll
            for (int i2 = 0; i2 < 8; ++i2) {
                const float* xk = xs + P::x8k(e, i2) * ROWS_TOKENS;
#pragma unroll
                for (int t4 = 0; t4 < ROWS_TOKENS / 4; ++t4) {
                    const float4 x = *(const float4*)(xk + 4 * t4);
#pragma unroll
                    for (int j2 = 0; j2 < 4; ++j2) {
                        acc[j2][4 * t4] = fmaf(w[j2][i2], x.x, acc[j2][4 * t4]);
                        acc[j2][4 * t4 + 1] = fmaf(w[j2][i2], x.y, acc[j2][4 * t4 + 1]);
                        acc[j2][4 * t4 + 2] = fmaf(w[j2][i2], x.z, acc[j2][4 * t4 + 2]);
                        acc[j2][4 * t4 + 3] = fmaf(w[j2][i2], x.w, acc[j2][4 * t4 + 3]);
                    }
                }
            }
            if (next && (i == h0 || i == h1)) x_store(cur ^ 1, i == h0 ? 0 : 1);
        }
        __syncthreads();
    }

    if (!live) return;
#pragma unroll
    for (int t = 0; t < ROWS_TOKENS; ++t) {
        if (t >= M) break;
        const float v[4] = {acc[0][t], acc[1][t], acc[2][t], acc[3][t]};
        store_row4(Y, part, t, 4 * g, N, v, accumulate);
    }
}
