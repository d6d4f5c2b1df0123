// Quantized GEMV: y[r] = sum_c W[r, c] * x[c], weights in any GGML format,
// x and y FP32, accumulation FP32.
//
// Layout: W (nrows, row_bytes) in its GGUF format, rows back to back (the
// buffer has >= 15 bytes of slack after the last row: TAIL_SLACK in
// m40-device); x (ncols) FP32, 16-byte aligned; y (nrows) FP32.
// Launch: grid ceil(nrows / GEMV_WARPS), block 32 * GEMV_WARPS; one warp per
// row, no block-wide barriers.
//
// Why this shape: decode is bound by the bytes of W, so each warp streams its
// row in chunks with 16-byte coalesced loads (whatever the block size: 18-,
// 34- or 210-byte blocks are not 16-byte aligned) into its own shared-memory
// slice, and the next chunk's loads are issued before the current chunk is
// decoded, so a chunk's worth of bytes is always in flight per warp. Lanes
// then dequantize 4-weight parts of sub-blocks from shared memory in
// registers (quant.cuh) against x, which every row reads and so stays in
// L1/L2; 8 lanes per 32-weight sub-block keep a warp's x loads contiguous.
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
// (sub-block, part) items (8 parts per sub-block).
template <class F>
struct GemvChunk {
    static constexpr int FIT = GEMV_CHUNK_BYTES / F::BYTES;
    static constexpr int BLOCKS = F::SUBS == 8 ? FIT : FIT & ~3;
    static constexpr int BYTES = BLOCKS * F::BYTES;
    static constexpr int VECS = (BYTES + 15 + 15) / 16;  // + up to 15 bytes of misalignment
    static constexpr int VPL = (VECS + 31) / 32;         // 16-byte vectors per lane
};

// The dot product of part p of sub-block s of block `gb` (staged at `blk`) with x.
template <class F>
__device__ __forceinline__ float part_dot(const u8* blk, int s, int p, int gb, const float* __restrict__ x, int ncols) {
    float v[4];
    F::part(blk, s, p, v);
    const int c = gb * F::QK + s * 32 + 4 * p;
    if (F::FLOAT && c + 4 > ncols) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc += c + i < ncols ? v[i] * x[c + i] : 0.0f;
        return acc;
    }
    const float4 xv = *(const float4*)(x + c);
    return v[0] * xv.x + v[1] * xv.y + v[2] * xv.z + v[3] * xv.w;
}

// One warp computes the dot of row `row` with x; `stage` is the warp's
// VECS * 16 bytes of shared memory. Returns the total in every lane.
template <class F>
__device__ __forceinline__ float gemv_row(const u8* __restrict__ W, long long row_bytes, const float* __restrict__ x,
                                          int ncols, long long row, uint4* stage) {
    typedef GemvChunk<F> C;
    const int lane = threadIdx.x & 31, p = lane & 7;
    const u8* row_ptr = W + row * row_bytes;
    const int nb = (ncols + F::QK - 1) / F::QK;
    const int n_chunks = (nb + C::BLOCKS - 1) / C::BLOCKS;

    uint4 regs[C::VPL];
    // Chunk c: bytes [c * C::BYTES, min(row_bytes, (c + 1) * C::BYTES)) of the row,
    // loaded as the 16-byte vectors that cover them.
    auto span = [&](int c, const uint4*& base, int& nvec, int& skew) {
        const u8* a0 = row_ptr + (long long)c * C::BYTES;
        const long long end = min((long long)(c + 1) * C::BYTES, row_bytes);
        const u8* a1 = row_ptr + end;
        base = (const uint4*)((unsigned long long)a0 & ~15ull);
        skew = (int)(a0 - (const u8*)base);
        nvec = (int)((a1 - (const u8*)base + 15) >> 4);
    };
    auto load = [&](int c) {
        const uint4* base;
        int nvec, skew;
        span(c, base, nvec, skew);
#pragma unroll
        for (int k = 0; k < C::VPL; ++k) {
            const int i = lane + 32 * k;
            if (i < nvec) regs[k] = __ldcs(base + i);  // streamed: keep L1 for x
        }
    };

    float acc = 0.0f;
    load(0);
    for (int c = 0; c < n_chunks; ++c) {
        const uint4* base;
        int nvec, skew;
        span(c, base, nvec, skew);
        __syncwarp();  // the previous chunk's readers are done with `stage`
#pragma unroll
        for (int k = 0; k < C::VPL; ++k) {
            const int i = lane + 32 * k;
            if (i < nvec) stage[i] = regs[k];
        }
        __syncwarp();
        if (c + 1 < n_chunks) load(c + 1);
        const u8* chunk = (const u8*)stage + skew;
        const int first = c * C::BLOCKS;
        // Items are (sub-block, part): 8 consecutive lanes share a sub-block,
        // so a warp's x loads are 4 whole sub-blocks, 512 contiguous bytes,
        // and each lane keeps one part p throughout.
        if (first + C::BLOCKS <= nb) {
#pragma unroll 4
            for (int sb = lane >> 3; sb < C::BLOCKS * F::SUBS; sb += 4)
                acc += part_dot<F>(chunk + (sb / F::SUBS) * F::BYTES, sb % F::SUBS, p, first + sb / F::SUBS, x, ncols);
        } else {
            for (int sb = lane >> 3; sb < (nb - first) * F::SUBS; sb += 4)
                acc += part_dot<F>(chunk + (sb / F::SUBS) * F::BYTES, sb % F::SUBS, p, first + sb / F::SUBS, x, ncols);
        }
    }
    return warp_sum(acc);
}

template <class F>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                     int nrows, int ncols, long long row_bytes) {
    __shared__ uint4 stage[GEMV_WARPS][GemvChunk<F>::VECS];
    const int warp = threadIdx.x >> 5;
    const long long row = (long long)blockIdx.x * GEMV_WARPS + warp;
    if (row >= nrows) return;
    const float sum = gemv_row<F>(W, row_bytes, x, ncols, row, stage[warp]);
    if ((threadIdx.x & 31) == 0) y[row] = sum;
}

#define GEMV_KERNEL(name, F)                                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                                                 \
        gemv_##name##_f32(const u8* W, const float* x, float* y, int nrows, int ncols, long long row_bytes) { \
        gemv<F>(W, x, y, nrows, ncols, row_bytes);                                                               \
    }
M40_FORMATS(GEMV_KERNEL)
