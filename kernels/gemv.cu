// m40-parts: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs mxfp4
// Quantized GEMV: y[r] = sum_c W[r, c] * x[c], weights in any GGML format,
// x and y FP32, accumulation FP32.
//
// Layout: W (nrows, row_bytes) in its GGUF format, rows back to back (the
// buffer has >= 15 bytes of slack after the last row: TAIL_SLACK in
// m40-device); x (ncols) FP32, 16-byte aligned; y (nrows) FP32.
// Launch: block 32 * GEMV_WARPS; any grid (the launcher's GemvPlan, ops.rs,
// fills the GPU's resident blocks about once). Rows come in groups of
// GEMV_ROWS; each group is done by 1, 2 or 4 warps of a block (`ksplit`,
// each taking every ksplit-th chunk of the rows), so that shapes with few
// row groups (4096 rows on a 132-SM GPU) still keep every SM busy.
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

// acc[j] += eighth q of sub-block s of row j's block at wp[j], j < GEMV_ROWS.
template <class F>
struct GemvRows {
    __device__ static void dot(const u8* const* wp, int s, int q, float4 xa, float4 xb, float* acc) {
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) acc[j] += F::dot8(wp[j], s, q, xa, xb);
    }
};

// Q4_K / Q5_K: the 4 lanes of a sub-block share its scale in every row, and
// unpacking it costs about as much as the 8 weights' arithmetic; so lane q
// unpacks row q's and the lanes exchange them with shuffles.
template <class F>
struct GemvRowsSharedScale {
    __device__ static void dot(const u8* const* wp, int s, int q, float4 xa, float4 xb, float* acc) {
        static_assert(GEMV_ROWS == 4, "one row's scale per lane of a sub-block");
        const u8* mine = q == 0 ? wp[0] : q == 1 ? wp[1] : q == 2 ? wp[2] : wp[3];
        float dl, ml;
        F::scale(mine, s, dl, ml);
        const int base = (threadIdx.x & 31) & ~3;
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; ++j) {
            const float dj = __shfl_sync(0xffffffffu, dl, base | j), mj = __shfl_sync(0xffffffffu, ml, base | j);
            acc[j] += F::dot8_scaled(wp[j], s, q, xa, xb, dj, mj);
        }
    }
};
template <> struct GemvRows<FmtQ4_K> : GemvRowsSharedScale<FmtQ4_K> {};
template <> struct GemvRows<FmtQ5_K> : GemvRowsSharedScale<FmtQ5_K> {};

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

// The block's warps work on sets of GEMV_WARPS / ksplit row groups (of
// GEMV_ROWS rows; rows past nrows are read as the last row and not written):
// warp w takes group w / ksplit of the set and chunks c = w % ksplit,
// c + ksplit, ... of its rows (chunks of `cb` blocks). With ksplit > 1 the
// ksplit partial sums of a group meet in shared memory, added in a fixed
// order (results do not depend on timing). Blocks take sets blockIdx.x,
// blockIdx.x + gridDim.x, ...; every warp of a block finishes every set
// of the block once, in order, so the barriers match. A warp walks its
// (set, chunk) sequence and issues the next chunk's loads before it decodes
// the current one. `stage` is the warp's GEMV_ROWS * VECS vectors of shared
// memory; requires ksplit | GEMV_WARPS and ksplit <= the chunks per row.
// GLU: W's rows are a gate and an up matrix interleaved (interleave_glu:
// per group of 4 rows, gate 2i, 2i + 1, up 2i, 2i + 1; nrows a multiple
// of 4), and y (nrows / 2)[c] = glu_act(act, gate c + gb[c], up c + ub[c])
// (`epi`; biases where not null).
struct GluEpi {
    const float *gb, *ub;
    int act;
};

template <class F, bool GLU = false>
__device__ __forceinline__ void gemv_rows(const u8* __restrict__ W, long long row_bytes, const float* __restrict__ x,
                                          float* __restrict__ y, int nrows, int ncols, int cb, int ksplit,
                                          uint4* stage, float (*red)[GEMV_ROWS], GluEpi epi) {
    typedef GemvChunk<F> C;
    const int lane = threadIdx.x & 31, q = lane & 3, warp = threadIdx.x >> 5;
    const int sub = warp % ksplit, per_set = GEMV_WARPS / ksplit, slot = warp / ksplit;
    const int nb = (ncols + F::QK - 1) / F::QK;
    const int n_chunks = (nb + cb - 1) / cb;
    const int chunk_bytes = cb * F::BYTES, rb = (int)row_bytes;  // the launcher keeps row_bytes < 2^31
    const int n_groups = (nrows + GEMV_ROWS - 1) / GEMV_ROWS;
    const int n_sets = (n_groups + per_set - 1) / per_set;

    uint4 regs[GEMV_ROWS][C::VPL];
    // Chunk c of row r: bytes [c * chunk_bytes, min(row_bytes, (c + 1) * chunk_bytes))
    // of the row, as the 16-byte vectors that cover them.
    auto span = [&](int r, int c, const uint4*& base, int& nvec, int& skew) {
        const u8* row_ptr = W + (long long)min(r, nrows - 1) * row_bytes;
        const u8* a0 = row_ptr + c * chunk_bytes;
        const u8* a1 = row_ptr + min(c * chunk_bytes + chunk_bytes, rb);
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

    int set = blockIdx.x, c = sub;
    if (set >= n_sets) return;  // the whole block
    float acc[GEMV_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; ++j) acc[j] = 0.0f;
    load(set * per_set + slot, c);
    for (;;) {
        const int g = set * per_set + slot;
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
        int nset = set, nc = c + ksplit;
        if (nc >= n_chunks) nset += gridDim.x, nc = sub;
        if (nset < n_sets) load(nset * per_set + slot, nc);
        const int first = c * cb;
        const int nblk = min(cb, nb - first);
        // Items are (sub-block, eighth): 4 consecutive lanes share a
        // sub-block, each lane keeps one eighth q, and one load of x serves
        // all GEMV_ROWS rows. With 8 sub-blocks per block a lane keeps its
        // sub-block index s and steps one block at a time; with 1 it steps 8
        // blocks. Either way its weights and x advance by a fixed stride.
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
                GemvRows<F>::dot(wp, s, q, xa, xb, acc);
            }
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; ++j) wp[j] += BSTEP * F::BYTES;
            xp += BSTEP * F::QK;
        }
        if (nset != set) {  // this warp's last chunk of the set
            if (GLU) {
                // The group's 4 sums (every lane: warp_sum's butterfly),
                // through the split's shared memory when there is one.
                float sums[GEMV_ROWS];
#pragma unroll
                for (int j = 0; j < GEMV_ROWS; ++j) sums[j] = warp_sum(acc[j]);
                if (ksplit > 1) {
                    if (lane == 0) {
#pragma unroll
                        for (int j = 0; j < GEMV_ROWS; ++j) red[warp][j] = sums[j];
                    }
                    __syncthreads();
                    if (sub == 0) {
#pragma unroll
                        for (int j = 0; j < GEMV_ROWS; ++j) {
                            float sum = red[warp][j];
                            for (int t = 1; t < ksplit; ++t) sum += red[warp + t][j];
                            sums[j] = sum;
                        }
                    }
                    __syncthreads();  // `red` is free for the next set
                }
                if (sub == 0 && lane < 2 && g * GEMV_ROWS < nrows) {
                    const int c = g * 2 + lane;
                    const float gv = epi.gb ? sums[lane] + epi.gb[c] : sums[lane];
                    const float uv = epi.ub ? sums[2 + lane] + epi.ub[c] : sums[2 + lane];
                    y[c] = glu_act(epi.act, gv, uv);
                }
            } else if (ksplit == 1) {
#pragma unroll
                for (int j = 0; j < GEMV_ROWS; ++j) {
                    const float sum = warp_sum(acc[j]);
                    const int r = g * GEMV_ROWS + j;
                    if (lane == 0 && r < nrows) y[r] = sum;
                }
            } else {
#pragma unroll
                for (int j = 0; j < GEMV_ROWS; ++j) {
                    const float sum = warp_sum(acc[j]);
                    if (lane == 0) red[warp][j] = sum;
                }
                __syncthreads();
                if (sub == 0 && lane < GEMV_ROWS) {
                    float sum = red[warp][lane];
                    for (int t = 1; t < ksplit; ++t) sum += red[warp + t][lane];
                    const int r = g * GEMV_ROWS + lane;
                    if (r < nrows) y[r] = sum;
                }
                __syncthreads();  // `red` is free for the next set
            }
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; ++j) acc[j] = 0.0f;
        }
        if (nset >= n_sets) return;
        set = nset, c = nc;
    }
}

template <class F, bool GLU = false>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                     int nrows, int ncols, long long row_bytes, int cb, int ksplit,
                                     GluEpi epi = {nullptr, nullptr, 0}) {
    __shared__ uint4 stage[GEMV_WARPS][GEMV_ROWS * GemvChunk<F>::VECS];
    __shared__ float red[GEMV_WARPS][GEMV_ROWS];
    gemv_rows<F, GLU>(W, row_bytes, x, y, nrows, ncols, cb, ksplit, stage[threadIdx.x >> 5], red, epi);
}

// Blocks per SM the compiler must fit (register cap): 5 (96 registers on
// sm_52, 20 warps) where that does not spill, 4 where it does.
template <class F> struct GemvOccupancy { static constexpr int value = 5; };
template <> struct GemvOccupancy<FmtF32> { static constexpr int value = 4; };
template <> struct GemvOccupancy<FmtQ3_K> { static constexpr int value = 4; };
template <> struct GemvOccupancy<FmtMXFP4> { static constexpr int value = 4; };

// cb: blocks per chunk (1 .. GemvChunk<F>::BLOCKS); ksplit: 1, 2 or 4 warps
// per row group, at most the chunks per row.
#define GEMV_KERNEL(name, F)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, GemvOccupancy<F>::value)                                               \
        gemv_##name##_f32(const u8* W, const float* x, float* y, int nrows, int ncols, long long row_bytes, int cb, \
                          int ksplit) {                                                                          \
        gemv<F>(W, x, y, nrows, ncols, row_bytes, cb, ksplit);                                                   \
    }
M40_PART_FORMATS(GEMV_KERNEL)

// Mixture-of-experts GEMVs: gemv_id_<fmt>_f32 runs, for each slot j =
// blockIdx.y (a token's j-th chosen expert, slot j of the step), the GEMV
// of expert ids[j] (clamped to the n_mat matrices) of a 3-D tensor of
// n_mat matrices of mat_bytes each: y[j] (nrows) = W[ids[j]] x[j / x_per]
// (x_per = the experts a token takes where every slot of a token reads
// the token's row, 1 where each slot has its own). Otherwise as
// gemv_<fmt>_f32, each slot over the grid's x. gemv_idglu_<fmt>_f32: the
// experts' gate and up interleaved (gemv_rows' GLU), y[j] (nrows / 2) =
// glu_act(act, gate + gb[e], up + ub[e]), gb and ub (n_mat, nrows / 2)
// biases of the experts or null.
#define GEMV_ID_KERNEL(name, F)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, GemvOccupancy<F>::value)                      \
        gemv_id_##name##_f32(const u8* W, const float* x, float* y, int nrows, int ncols, long long row_bytes,   \
                             int cb, int ksplit, const int* ids, int n_mat, long long mat_bytes, int x_per) {   \
        const int j = blockIdx.y, e = min(max(ids[j], 0), n_mat - 1);                                            \
        gemv<F>(W + e * mat_bytes, x + (long long)(j / x_per) * ncols, y + (long long)j * nrows, nrows, ncols, \
                row_bytes, cb, ksplit);                                                                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, GemvOccupancy<F>::value)                      \
        gemv_idglu_##name##_f32(const u8* W, const float* x, float* y, int nrows, int ncols, long long row_bytes, \
                                int cb, int ksplit, const int* ids, int n_mat, long long mat_bytes, int x_per,   \
                                const float* gb, const float* ub, int act) {                                     \
        const int j = blockIdx.y, e = min(max(ids[j], 0), n_mat - 1), ff = nrows / 2;                           \
        const GluEpi epi = {gb ? gb + (long long)e * ff : nullptr, ub ? ub + (long long)e * ff : nullptr, act};  \
        gemv<F, true>(W + e * mat_bytes, x + (long long)(j / x_per) * ncols, y + (long long)j * ff, nrows, ncols, \
                      row_bytes, cb, ksplit, epi);                                                               \
    }
M40_PART_FORMATS(GEMV_ID_KERNEL)
