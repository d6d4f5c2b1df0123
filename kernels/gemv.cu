// Quantized GEMV: y[r] = sum_c W[r, c] * x[c], weights in any GGML format,
// x and y FP32, accumulation FP32.
//
// Layout: W (nrows, row_bytes) in its GGUF format, rows back to back (the
// buffer has >= 15 bytes of slack after the last row: TAIL_SLACK in
// m40-device); x (ncols) FP32, 16-byte aligned; y (nrows) FP32.
// Launch: block 32 * GEMV_WARPS; any grid: warp g of n takes row groups
// g, g + n, ... of GEMV_ROWS rows (the launcher picks n so every warp gets
// the same number of groups and the GPU is filled about once). No block-wide
// barriers.
//
// Why this shape: decode is bound by the bytes of W, so each warp streams its
// rows in chunks with 16-byte coalesced loads (whatever the block size: 18-,
// 34- or 210-byte blocks are not 16-byte aligned) into its own shared-memory
// slice, and issues the next chunk's loads before it decodes the current one.
// Lanes then take 8 weights of a 32-weight sub-block each (4 lanes per
// sub-block) and dot them with x in registers (quant.cuh `dot8`). A warp
// works on GEMV_ROWS rows at once so that each load of x serves them all:
// with one row, x (4 bytes per weight) was the larger part of the L1 traffic
// and the kernel was bound by it (ncu on an H100: L1 84% busy, DRAM 30%).
// Nothing is expanded in global memory. On sm_52 a 4-warp block stages
// ~16 KB, so 5-6 blocks share an SM's 96 KB.
#include "common.cuh"
#include "quant.cuh"

#define GEMV_WARPS 4
#define GEMV_ROWS 4

// Bytes a warp stages per row and chunk (at most), with room for the
// misalignment: GEMV_ROWS of these are in flight per warp.
#define GEMV_CHUNK_BYTES 1008

// Blocks per chunk: as many as fit (at least 8 sub-blocks), and a whole
// number of 32-lane rounds of (sub-block, eighth) items.
template <class F>
struct GemvChunk {
    static constexpr int FIT = GEMV_CHUNK_BYTES / F::BYTES;
    static constexpr int BLOCKS = F::SUBS == 8 ? (FIT > 0 ? FIT : 1) : ((FIT & ~7) > 0 ? (FIT & ~7) : 8);
    static constexpr int BYTES = BLOCKS * F::BYTES;
    static constexpr int VECS = (BYTES + 15 + 15) / 16;  // + up to 15 bytes of misalignment
    static constexpr int VPL = (VECS + 31) / 32;         // 16-byte vectors per lane and row
};

// Which item loop a format uses (same work, different code; which one the
// compiler schedules better was measured per format on an H100: BENCHMARKS.md
// v13): strided pointers, or indices recomputed per item.
template <class F> struct GemvStrided { static constexpr bool value = true; };
template <> struct GemvStrided<FmtF16> { static constexpr bool value = false; };
template <> struct GemvStrided<FmtBF16> { static constexpr bool value = false; };
template <> struct GemvStrided<FmtQ4_0> { static constexpr bool value = false; };
template <> struct GemvStrided<FmtQ4_1> { static constexpr bool value = false; };
template <> struct GemvStrided<FmtQ5_1> { static constexpr bool value = false; };
template <> struct GemvStrided<FmtIQ4_NL> { static constexpr bool value = false; };

// Sum over eighth q of sub-block s of block gb, for a float format's partial
// last pseudo-block: masked by column, through `part`.
template <class F>
__device__ __forceinline__ float masked_dot8(const u8* blk, int s, int q, int gb, const float* __restrict__ x,
                                             int ncols) {
    float acc = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float v[4];
        F::part(blk, s, 2 * q + h, v);
        const int c = gb * F::QK + s * 32 + 8 * q + 4 * h;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc += c + i < ncols ? v[i] * x[c + i] : 0.0f;
    }
    return acc;
}

// One warp computes row groups gw, gw + n_warps, ...: GEMV_ROWS rows each
// (rows past nrows are read as the last row and not written). It walks the
// chunks of its groups in order and issues the next chunk's loads before it
// decodes the current one. `stage` is the warp's GEMV_ROWS * VECS vectors
// of shared memory.
template <class F>
__device__ __forceinline__ void gemv_rows(const u8* __restrict__ W, long long row_bytes, const float* __restrict__ x,
                                          float* __restrict__ y, int nrows, int ncols, int gw, int n_warps,
                                          uint4* stage) {
    typedef GemvChunk<F> C;
    const int lane = threadIdx.x & 31, q = lane & 3;
    const int nb = (ncols + F::QK - 1) / F::QK;
    const int n_chunks = (nb + C::BLOCKS - 1) / C::BLOCKS;
    const int n_groups = (nrows + GEMV_ROWS - 1) / GEMV_ROWS;

    uint4 regs[GEMV_ROWS][C::VPL];
    // Chunk c of row r: bytes [c * C::BYTES, min(row_bytes, (c + 1) * C::BYTES))
    // of the row, as the 16-byte vectors that cover them.
    auto span = [&](int r, int c, const uint4*& base, int& nvec, int& skew) {
        const u8* row_ptr = W + (long long)min(r, nrows - 1) * row_bytes;
        const u8* a0 = row_ptr + (long long)c * C::BYTES;
        const u8* a1 = row_ptr + min((long long)(c + 1) * C::BYTES, row_bytes);
        base = (const uint4*)((unsigned long long)a0 & ~15ull);
        skew = (int)(a0 - (const u8*)base);
        nvec = (int)((a1 - (const u8*)base + 15) >> 4);
    };
    auto load = [&](int g, int c) {
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) {
            const uint4* base;
            int nvec, skew;
            span(g * GEMV_ROWS + j, c, base, nvec, skew);
#pragma unroll
            for (int k = 0; k < C::VPL; ++k) {
                const int i = lane + 32 * k;
                if (i < nvec) regs[j][k] = __ldcs(base + i);  // streamed: keep L1 for x
            }
        }
    };

    int g = gw, c = 0;
    if (g >= n_groups) return;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; ++j) acc[j] = 0.0f;
    load(g, c);
    for (;;) {
        int skew[GEMV_ROWS];
        __syncwarp();  // the previous chunk's readers are done with `stage`
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) {
            const uint4* base;
            int nvec;
            span(g * GEMV_ROWS + j, c, base, nvec, skew[j]);
#pragma unroll
            for (int k = 0; k < C::VPL; ++k) {
                const int i = lane + 32 * k;
                if (i < nvec) stage[j * C::VECS + i] = regs[j][k];
            }
        }
        __syncwarp();
        int ng = g, nc = c + 1;
        if (nc == n_chunks) ng += n_warps, nc = 0;
        if (ng < n_groups) load(ng, nc);
        const int first = c * C::BLOCKS;
        const int nblk = min(C::BLOCKS, nb - first);
        // Items are (sub-block, eighth): 4 consecutive lanes share a
        // sub-block, each lane keeps one eighth q, and one load of x serves
        // all GEMV_ROWS rows.
        if (GemvStrided<F>::value) {
            // With 8 sub-blocks per block a lane keeps its sub-block index s
            // and steps one block at a time; with 1 it steps 8 blocks. Either
            // way its weights and x advance by a fixed stride.
            const int s = F::SUBS == 8 ? lane >> 2 : 0;
            const int b0 = F::SUBS == 8 ? 0 : lane >> 2;
            constexpr int BSTEP = F::SUBS == 8 ? 1 : 8;
            const u8* wp[GEMV_ROWS];
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; ++j) wp[j] = (const u8*)(stage + j * C::VECS) + skew[j] + b0 * F::BYTES;
            const float* xp = x + (long long)(first + b0) * F::QK + s * 32;
#pragma unroll 2
            for (int b = b0; b < nblk; b += BSTEP) {
                if (F::FLOAT && (first + b) * F::QK + s * 32 + 32 > ncols) {
#pragma unroll
                    for (int j = 0; j < GEMV_ROWS; ++j) acc[j] += masked_dot8<F>(wp[j], s, q, first + b, x, ncols);
                } else {
                    float4 xa, xb;
                    F::x8(xp, q, xa, xb);
#pragma unroll
                    for (int j = 0; j < GEMV_ROWS; ++j) acc[j] += F::dot8(wp[j], s, q, xa, xb);
                }
#pragma unroll
                for (int j = 0; j < GEMV_ROWS; ++j) wp[j] += BSTEP * F::BYTES;
                xp += BSTEP * F::QK;
            }
        } else {
#pragma unroll 2
            for (int sb = lane >> 2; sb < nblk * F::SUBS; sb += 8) {
                const int b = sb / F::SUBS, s = sb % F::SUBS;
                const int off = b * F::BYTES;
                const int c0 = (first + b) * F::QK + s * 32;
                if (F::FLOAT && c0 + 32 > ncols) {
#pragma unroll
                    for (int j = 0; j < GEMV_ROWS; ++j)
                        acc[j] += masked_dot8<F>((const u8*)(stage + j * C::VECS) + skew[j] + off, s, q, first + b, x,
                                                 ncols);
                } else {
                    float4 xa, xb;
                    F::x8(x + c0, q, xa, xb);
#pragma unroll
                    for (int j = 0; j < GEMV_ROWS; ++j)
                        acc[j] += F::dot8((const u8*)(stage + j * C::VECS) + skew[j] + off, s, q, xa, xb);
                }
            }
        }
        if (c == n_chunks - 1) {
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; ++j) {
                const float sum = warp_sum(acc[j]);
                const int r = g * GEMV_ROWS + j;
                if (lane == 0 && r < nrows) y[r] = sum;
                acc[j] = 0.0f;
            }
        }
        if (ng >= n_groups) return;
        g = ng, c = nc;
    }
}

template <class F>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                     int nrows, int ncols, long long row_bytes) {
    __shared__ uint4 stage[GEMV_WARPS][GEMV_ROWS * GemvChunk<F>::VECS];
    const int warp = threadIdx.x >> 5;
    gemv_rows<F>(W, row_bytes, x, y, nrows, ncols, blockIdx.x * GEMV_WARPS + warp, gridDim.x * GEMV_WARPS,
                 stage[warp]);
}

#define GEMV_KERNEL(name, F)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                                                 \
        gemv_##name##_f32(const u8* W, const float* x, float* y, int nrows, int ncols, long long row_bytes) { \
        gemv<F>(W, x, y, nrows, ncols, row_bytes);                                                               \
    }
M40_FORMATS(GEMV_KERNEL)
