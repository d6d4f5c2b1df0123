// Quantized GEMV: y[r] = sum_c W[r, c] * x[c], weights in any GGML format,
// x and y FP32, accumulation FP32.
//
// Layout: W (nrows, row_bytes) in its GGUF format, rows back to back (the
// buffer has >= 15 bytes of slack after the last row: TAIL_SLACK in
// m40-device); x (ncols) FP32, 16-byte aligned; y (nrows) FP32.
// Launch: block 32 * GEMV_WARPS; any grid: warp g of n computes rows g,
// g + n, ... (the launcher picks n so every warp gets the same number of rows
// and the GPU is filled about once). No block-wide barriers.
//
// Why this shape: decode is bound by the bytes of W, so each warp streams its
// row in chunks with 16-byte coalesced loads (whatever the block size: 18-,
// 34- or 210-byte blocks are not 16-byte aligned) into its own shared-memory
// slice, and the next chunk's loads are issued before the current chunk is
// decoded, so a chunk's worth of bytes is always in flight per warp. Lanes
// then take 8 weights of a sub-block each from shared memory and dot them
// with x in registers (quant.cuh `dot8`); x is read by every row and stays in
// L1/L2; 4 lanes per 32-weight sub-block keep a warp's x loads contiguous.
// Nothing is expanded in global memory. On sm_52 a 4-warp block stages
// ~16 KB, so 5 blocks (20 warps, ~80 KB in flight) share an SM's 96 KB.
#include "common.cuh"
#include "quant.cuh"

#define GEMV_WARPS 4

// Bytes a warp stages per chunk (at most): 8 16-byte vectors per lane with
// room for the misalignment. Bytes in flight per warp decide how close a
// memory-bound kernel gets to the bandwidth; ~4 KB per warp at ~30 warps per
// SM covers the latency on both the M40 and Hopper.
#define GEMV_CHUNK_BYTES 4064

// Blocks per chunk: as many as fit, and a whole number of 32-lane rounds of
// (sub-block, eighth) items (4 lanes per sub-block).
template <class F>
struct GemvChunk {
    static constexpr int FIT = GEMV_CHUNK_BYTES / F::BYTES;
    static constexpr int BLOCKS = F::SUBS == 8 ? FIT : FIT & ~7;
    static constexpr int BYTES = BLOCKS * F::BYTES;
    static constexpr int VECS = (BYTES + 15 + 15) / 16;  // + up to 15 bytes of misalignment
    static constexpr int VPL = (VECS + 31) / 32;         // 16-byte vectors per lane
};

// The dot product of eighth q of sub-block s of block `gb` (staged at `blk`)
// with x; a partial float pseudo-block at the row's end goes through `part`,
// masked by column.
template <class F>
__device__ __forceinline__ float item_dot(const u8* blk, int s, int q, int gb, const float* __restrict__ x, int ncols) {
    const int c0 = gb * F::QK + s * 32;
    if (F::FLOAT && c0 + 32 > ncols) {
        float acc = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v[4];
            F::part(blk, s, 2 * q + h, v);
            const int c = c0 + 8 * q + 4 * h;
#pragma unroll
            for (int i = 0; i < 4; ++i) acc += c + i < ncols ? v[i] * x[c + i] : 0.0f;
        }
        return acc;
    }
    return F::dot8(blk, s, q, x + c0);
}

// One warp computes rows gw, gw + n_warps, gw + 2 n_warps, ... of y, where
// gw is its index in the grid: it walks the chunks of its rows in order and
// issues the next chunk's loads (of the same row or the next one) before it
// decodes the current one, so loads and decode overlap inside every warp and
// all warps have the same number of rows (the launcher sizes the grid so).
// `stage` is the warp's VECS * 16 bytes of shared memory.
template <class F>
__device__ __forceinline__ void gemv_rows(const u8* __restrict__ W, long long row_bytes, const float* __restrict__ x,
                                          float* __restrict__ y, int nrows, int ncols, int gw, int n_warps,
                                          uint4* stage) {
    typedef GemvChunk<F> C;
    const int lane = threadIdx.x & 31, q = lane & 3;
    const int nb = (ncols + F::QK - 1) / F::QK;
    const int n_chunks = (nb + C::BLOCKS - 1) / C::BLOCKS;

    uint4 regs[C::VPL];
    // Chunk c of row r: bytes [c * C::BYTES, min(row_bytes, (c + 1) * C::BYTES))
    // of the row, as the 16-byte vectors that cover them.
    auto span = [&](int r, int c, const uint4*& base, int& nvec, int& skew) {
        const u8* row_ptr = W + (long long)r * row_bytes;
        const u8* a0 = row_ptr + (long long)c * C::BYTES;
        const u8* a1 = row_ptr + min((long long)(c + 1) * C::BYTES, row_bytes);
        base = (const uint4*)((unsigned long long)a0 & ~15ull);
        skew = (int)(a0 - (const u8*)base);
        nvec = (int)((a1 - (const u8*)base + 15) >> 4);
    };
    auto load = [&](int r, int c) {
        const uint4* base;
        int nvec, skew;
        span(r, c, base, nvec, skew);
#pragma unroll
        for (int k = 0; k < C::VPL; ++k) {
            const int i = lane + 32 * k;
            if (i < nvec) regs[k] = __ldcs(base + i);  // streamed: keep L1 for x
        }
    };

    int r = gw, c = 0;
    if (r >= nrows) return;
    float acc = 0.0f;
    load(r, c);
    for (;;) {
        const uint4* base;
        int nvec, skew;
        span(r, c, base, nvec, skew);
        __syncwarp();  // the previous chunk's readers are done with `stage`
#pragma unroll
        for (int k = 0; k < C::VPL; ++k) {
            const int i = lane + 32 * k;
            if (i < nvec) stage[i] = regs[k];
        }
        __syncwarp();
        int nr = r, nc = c + 1;
        if (nc == n_chunks) nr += n_warps, nc = 0;
        if (nr < nrows) load(nr, nc);
        const u8* chunk = (const u8*)stage + skew;
        const int first = c * C::BLOCKS;
        // Items are (sub-block, eighth): 4 consecutive lanes share a
        // sub-block, so a warp's x loads cover 8 whole sub-blocks, and each
        // lane keeps one eighth q throughout.
        if (first + C::BLOCKS <= nb) {
#pragma unroll 4
            for (int sb = lane >> 2; sb < C::BLOCKS * F::SUBS; sb += 8)
                acc += item_dot<F>(chunk + (sb / F::SUBS) * F::BYTES, sb % F::SUBS, q, first + sb / F::SUBS, x, ncols);
        } else {
            for (int sb = lane >> 2; sb < (nb - first) * F::SUBS; sb += 8)
                acc += item_dot<F>(chunk + (sb / F::SUBS) * F::BYTES, sb % F::SUBS, q, first + sb / F::SUBS, x, ncols);
        }
        if (c == n_chunks - 1) {
            const float sum = warp_sum(acc);
            if (lane == 0) y[r] = sum;
            acc = 0.0f;
        }
        if (nr >= nrows) return;
        r = nr, c = nc;
    }
}

template <class F>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                     int nrows, int ncols, long long row_bytes) {
    __shared__ uint4 stage[GEMV_WARPS][GemvChunk<F>::VECS];
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
