// m40-parts: f16 q8_0 q4_0 q4_1 q4_k q6_k mxfp4
// The packed GEMV kernels: thin wrappers over gemv_packed.cuh (the layout
// and the device code are described there).
#include "gemv_packed.cuh"

// Blocks an SM for the 3- and 4-token kernels: 5 (96 registers on sm_52),
// or 4 (128) where an H100 measured it faster: Q4_K and Q6_K, whose
// 4-token loop then issues all its loads at the top of a round (at 96
// ptxas interleaves them with the FMAs); Q4_0 ran 5% slower at 4
// (BENCHMARKS.md, issue 33, twelfth session).
template <class P> struct FewTokenBlocks {
    static constexpr int value = 5;
};
template <> struct FewTokenBlocks<PackQ4_K> {
    static constexpr int value = 4;
};
template <> struct FewTokenBlocks<PackQ6_K> {
    static constexpr int value = 4;
};

// The launch bounds by format and tokens per launch: threads per block at
// most, and blocks per SM the register cap must allow. One token of a
// SPLIT3 format: blocks of up to 6 warps (a 3-way split) at the register
// cap of 7 blocks of 4 warps (28 warps an SM: 72 registers).
template <class P, int B> struct PgemvBounds {
    static constexpr bool s3 = B == 1 && P::SPLIT3;
    static constexpr int threads = s3 ? 224 : 32 * PGEMV_WARPS;
    static constexpr int blocks = s3 ? 4 : B == 1 ? 7 : B <= 2 ? 5 : B <= 4 ? FewTokenBlocks<P>::value : 4;
    static_assert(!s3 || threads >= 32 * PGEMV_MAX_WARPS, "a 3-way split's block fits");
    static_assert(!s3 || threads * blocks == 32 * PGEMV_WARPS * 7, "the register cap of 7 blocks of 4 warps");
};

// W: the packed layout above (nb: blocks of 32 weights per row; a multiple
// of 8 for Q4_K and Q6_K); x (m, nb * 32) FP32, 16-byte aligned; y (m,
// nrows), or for stacked matrices y, y1, y2 split at rows r1, r2 (common.cuh
// RowParts; one matrix: r1 = r2 = nrows). mode: PGEMV_STORE; PGEMV_ADD (y
// += W x); PGEMV_GLU + act: W is an interleaved gate/up stack (rows g0, g1,
// u0, u1, g2, ...; nrows a multiple of 4) and y (m, nrows / 2) gets
// act(gate) * up (common.cuh glu_act). gemv_packed_<fmt>_f32 takes one
// token, gemv_packed_<fmt>_f32_x<B> up to B: tokens t0 .. t0 + m - 1;
// gemv_packed_<fmt>_f32_x8c more: tokens 0 .. m - 1 in chunks of t0 <= 8,
// grid row y taking tokens y t0 .. min(m, (y + 1) t0) - 1. (A 16-token
// variant ran 3.4x slower than the 8-token one on an H100: its accumulators
// cap occupancy at 2 blocks.) gemv_packed_<fmt>_f32_take and _emit: one
// token, the two halves of a folded RMSNorm (`Fold`; the other kernels
// ignore nw, h, part, n_part and eps). With kpool non-null (one token, a
// Q/K/V stack, mode PGEMV_STORE), RoPE and the KV append ride along
// (`RopeKvFold`): q gets the rotated queries, y1 and y2 are not written.
#define PGEMV_KERNEL_B(name, P, B, FOLD, suffix) PGEMV_KERNEL_BC(name, P, B, FOLD, false, suffix)
#define PGEMV_KERNEL_BC(name, P, B, FOLD, CHUNKED, suffix)                                                \
    extern "C" __global__ void __launch_bounds__(PgemvBounds<P, B>::threads, PgemvBounds<P, B>::blocks)     \
        gemv_packed_##name##_f32##suffix(const u8* W, const float* x, float* y, float* y1, float* y2,      \
                                         int r1, int r2, int nrows, int nb, int ksplit, int t0, int m,     \
                                         int mode, const float* nw, float* h, float* part, int n_part,     \
                                         float eps, const int* pos, const float* inv_freq,                 \
                                         const int* table, u16* kpool, u16* vpool, int head_dim,           \
                                         int n_rot, float pos_scale) {                                     \
        const GemvArgs a = {W,    x,    y,     y1,       y2,    r1,    r2,    nrows,   nb,                   \
                            ksplit, t0, m,     mode,     nw,    h,     part,  n_part,  eps,                  \
                            pos,  inv_freq, table, kpool, vpool, head_dim, n_rot, pos_scale};                 \
        gemv_packed<P, B, FOLD, B == 1 && P::SPLIT3, CHUNKED>(a, blockIdx.x);                              \
    }
// gemv_packed_id_<fmt>_f32: a mixture's experts' GEMVs over packed
// matrices, one token a slot. W: n_mat experts' packed matrices of nrows x
// nb * 32, mat_bytes apart; block (_, j) runs the one-token GEMV for slot j
// over expert ids[j] (clamped into 0 .. n_mat - 1: a bad id reads a wrong
// expert, never out of bounds) on x row j / x_per (x (slots / x_per, nb *
// 32)), into y row j: nrows sums (PGEMV_STORE), or with a GLU mode the
// nrows / 2 gates of an interleaved gate/up matrix, bias (n_mat, nrows: each
// expert's rows' biases in the matrix's row order, added before the
// activation) where not null.
// Slot j's one-token GEMV over expert e's matrix (gemv_packed_id, and a
// grouped tile of one slot): x row j / x_per into y row j, with the
// expert's biases where a GLU has them.
template <class P>
__device__ __forceinline__ void gemv_packed_slot(const u8* W, const float* x, float* y, int nrows, int nb,
                                                 int ksplit, int mode, int e, int j, long long mat_bytes, int x_per,
                                                 const float* bias) {
    float* yj = y + (long long)j * (mode >= PGEMV_GLU ? nrows >> 1 : nrows);
    const float* bj = bias != nullptr && mode >= PGEMV_GLU ? bias + (long long)e * nrows : nullptr;
    const GemvArgs a = {W + e * mat_bytes, x + (long long)(j / x_per) * nb * 32, yj, yj, yj, nrows, nrows,
                        nrows, nb, ksplit, 0, 1, mode, bj, nullptr, nullptr, 0, 0.0f, nullptr, nullptr,
                        nullptr, nullptr, nullptr, 0, 0, 0.0f};
    gemv_packed<P, 1, FOLD_BIAS>(a, blockIdx.x);
}
#define PGEMV_ID_KERNEL(name, P)                                                                               \
    extern "C" __global__ void __launch_bounds__(PgemvBounds<P, 1>::threads, PgemvBounds<P, 1>::blocks)         \
        gemv_packed_id_##name##_f32(const u8* W, const float* x, float* y, int nrows, int nb, int ksplit,      \
                                    int mode, const int* ids, int n_mat, long long mat_bytes, int x_per,       \
                                    const float* bias) {                                                       \
        const int j = blockIdx.y, e = min(max(ids[j], 0), n_mat - 1);                                          \
        gemv_packed_slot<P>(W, x, y, nrows, nb, ksplit, mode, e, j, mat_bytes, x_per, bias);                   \
    }
// gemv_packed_grp_<fmt>_f32: the same GEMVs with a step's slots grouped by
// expert (moe.cu moe_tiles_i32: order, the slots sorted by expert; tiles,
// their count then each tile's first sorted position and slots, 1 to 8, of
// one expert), so that each expert's weights are read once for the slots
// of a tile: block (_, i) runs tile i (none past tiles[0]), through the
// one-token GEMV for a tile of one slot (gemv_packed_id's code and sums),
// else the 2-, 4- or 8-token one (its sums: DQ and up decode each weight
// once). Launch bounds of the 8-token kernels.
#define PGEMV_GRP_KERNEL(name, P)                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * PGEMV_WARPS, PgemvBounds<P, 8>::blocks)                     \
        gemv_packed_grp_##name##_f32(const u8* W, const float* x, float* y, int nrows, int nb, int mode,            \
                                     const int* ids, const int* order, const int* tiles, int n_mat,               \
                                     long long mat_bytes, int x_per, const float* bias) {                         \
        const int i = blockIdx.y;                                                                                \
        if (i >= tiles[0]) return;                                                                               \
        const int start = tiles[1 + 2 * i], m = tiles[2 + 2 * i], j = order[start];                               \
        const int e = min(max(ids[j], 0), n_mat - 1);                                                            \
        if (m == 1) return gemv_packed_slot<P>(W, x, y, nrows, nb, 1, mode, e, j, mat_bytes, x_per, bias);        \
        const float* be = bias != nullptr && mode >= PGEMV_GLU ? bias + (long long)e * nrows : nullptr;          \
        const GemvArgs a = {W + e * mat_bytes, x, y, y, y, nrows, nrows, nrows, nb, 1, 0, m, mode, be, nullptr,   \
                            nullptr, 0, 0.0f, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0, 0.0f};               \
        const GatheredRows r = {order + start, x_per};                                                            \
        if (m == 2)                                                                                               \
            gemv_packed<P, 2, FOLD_BIAS, false, false, GatheredRows>(a, blockIdx.x, r);                            \
        else if (m <= 4)                                                                                          \
            gemv_packed<P, 4, FOLD_BIAS, false, false, GatheredRows>(a, blockIdx.x, r);                            \
        else                                                                                                      \
            gemv_packed<P, 8, FOLD_BIAS, false, false, GatheredRows>(a, blockIdx.x, r);                            \
    }
#define PGEMV_KERNEL(name, P)                       \
    PGEMV_ID_KERNEL(name, P)                        \
    PGEMV_GRP_KERNEL(name, P)                       \
    PGEMV_KERNEL_B(name, P, 1, FOLD_NONE, )         \
    PGEMV_KERNEL_B(name, P, 1, FOLD_TAKE, _take)    \
    PGEMV_KERNEL_B(name, P, 1, FOLD_EMIT, _emit)    \
    PGEMV_KERNEL_B(name, P, 2, FOLD_NONE, _x2)      \
    PGEMV_KERNEL_B(name, P, 4, FOLD_NONE, _x4)      \
    PGEMV_KERNEL_B(name, P, 8, FOLD_NONE, _x8)      \
    PGEMV_KERNEL_BC(name, P, 8, FOLD_NONE, true, _x8c)
#define PGEMV_FORMAT(name, Parts) PGEMV_KERNEL(name, PGEMV_PACK_##name)
M40_PART_PACKED(PGEMV_FORMAT)
