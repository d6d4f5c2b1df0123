// The persistent decode kernel: one launch runs a program of ops (the
// one-token GEMVs, attention and its split combine of every layer) that
// would otherwise be one launch each. Every block of a grid that fits on
// the GPU at once (the launcher sizes it by the occupancy calculator) walks
// the program: an op is a set of virtual blocks, the same work a launch of
// the op's own kernel gives one block, taken round-robin (vb = blockIdx.x,
// blockIdx.x + gridDim.x, ...) and run by the same __device__ code as that
// kernel (gemv_packed.cuh, attention.cuh); between two ops every block
// waits at a grid barrier (a counter in global memory), which orders the
// ops as the launches did, without a launch's start, first round trip and
// drain between them. Measured on an H100, a barrier costs more than the
// launch it replaces (8B Q4_0: 353 against 451 tokens/s, BENCHMARKS.md),
// so the backend uses it only when asked (GpuOptions::persistent).
//
// Program: n_ops records of DEC_OP_BYTES in device memory (written by the
// host, crates/m40-kernels/src/decode.rs), each a DecOpHead and the op's
// arguments right after it, in the order and C layout of the parameters of
// the kernel the op stands for.
//
// sync: DEC_SYNC_WORDS counters (dec_grid_sync), zero before a launch and
// left zero after it: the last block to finish zeroes them, so the next
// launch (stream-ordered after this one) starts from zero.
//
// Memory: a block's writes in one op reach the blocks reading them in the
// next through the barrier: each block's thread 0 fences (gpu scope) before
// it arrives and after it has seen every arrival, and __syncthreads orders
// the rest of its block around that (the scheme of cooperative groups'
// grid sync). Data written by the program is read with ordinary loads
// (never the non-coherent read-only path).
#include "attention.cuh"
#include "gemv_packed.cuh"

#define DEC_THREADS 128
// Blocks per SM the register cap must allow: 5 (96 registers on sm_52,
// a few bytes spilled) measured faster on an H100 than 6 or 7 (80 and 72
// registers: attention and the GEMVs spill more) and than grids capped at
// 1 to 3 blocks per SM (BENCHMARKS.md).
#define DEC_MIN_BLOCKS 5
#define DEC_OP_BYTES 256
#define DEC_OP_GEMV 1
#define DEC_OP_ATTN 2
#define DEC_OP_COMBINE 3

// kind: DEC_OP_*; blocks: virtual blocks; variant: GEMV the format
// (DEC_FMT_*), attention R (head dims up to 32 R); fold: GEMV FOLD_*; grid:
// attention's (token blocks, head blocks, splits).
struct DecOpHead {
    int kind, blocks, variant, fold;
    int gx, gy, gz, pad;
};

// GEMV ops: GemvArgs (gemv_packed.cuh); attention ops: AttnArgs
// (attention.cuh): the parameters of those kernels.

// The parameters of attn_combine_f32 (attention.cu).
struct DecCombine {
    const float *part, *part_ml;
    float* out;
    const float* sinks;
    int splits, hd, n_head;
};

#define DEC_FMT_F16 0
#define DEC_FMT_Q8_0 1
#define DEC_FMT_Q4_0 2
#define DEC_FMT_Q4_1 3
#define DEC_FMT_Q4_K 4
#define DEC_FMT_Q6_K 5
#define DEC_FMT_MXFP4 6

template <int FOLD>
__device__ __forceinline__ void dec_gemv(const GemvArgs& a, int fmt, int vb) {
    switch (fmt) {
        case DEC_FMT_F16: gemv_packed<PackF16, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_Q8_0: gemv_packed<PackQ8_0, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_Q4_0: gemv_packed<PackQ4_0, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_Q4_1: gemv_packed<PackQ4_1, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_Q4_K: gemv_packed<PackQ4_K, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_Q6_K: gemv_packed<PackQ6_K, 1, FOLD, false>(a, vb); break;
        case DEC_FMT_MXFP4: gemv_packed<PackMXFP4, 1, FOLD, false>(a, vb); break;
    }
}

__device__ __forceinline__ void dec_attn(const AttnArgs& a, const DecOpHead& hd, float* smem, int vb) {
    const int bx = vb % hd.gx, by = (vb / hd.gx) % hd.gy, bz = vb / (hd.gx * hd.gy);
    switch (hd.variant) {
        case 1: attn_block<1>(a, smem, bx, by, bz, hd.gz); break;
        case 2: attn_block<2>(a, smem, bx, by, bz, hd.gz); break;
        case 3: attn_block<3>(a, smem, bx, by, bz, hd.gz); break;
        case 4: attn_block<4>(a, smem, bx, by, bz, hd.gz); break;
    }
}

// The barrier's counters, each on its own 128-byte line: the arrivals at
// the current barrier, the barriers passed (the generation), and the
// blocks done. Every block's thread 0 adds itself to the arrivals; the
// last one to arrive resets them and publishes the generation, which the
// others poll (reads only: their polling does not slow the arrivals).
#define DEC_LINE 32
#define DEC_SYNC_WORDS (3 * DEC_LINE)

// Barrier k (1, 2, ...): every block of the grid arrives; returns when all
// have.
__device__ __forceinline__ void dec_grid_sync(unsigned* sync, unsigned k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(sync, 1u) == gridDim.x - 1) {
            sync[0] = 0;  // no block arrives again before the generation moves
            __threadfence();
            atomicExch(sync + DEC_LINE, k);
        } else {
            while (*(volatile unsigned*)(sync + DEC_LINE) < k) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// Dynamic shared memory: attention's (attn_shared_bytes of the largest head
// dimension) and at least the combine's (splits + DEC_THREADS floats).
extern "C" __global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS)
    decode_program(const u8* ops, int n_ops, unsigned* sync) {
    extern __shared__ __align__(16) float dec_smem[];
    __shared__ float scratch[32];
    // The current op's head and arguments (read where used: see GemvArgs).
    __shared__ __align__(16) u32 op_s[DEC_OP_BYTES / 4];
    const DecOpHead& hd = *(const DecOpHead*)op_s;
    const u8* args = (const u8*)op_s + sizeof(DecOpHead);
    for (int i = 0; i < n_ops; ++i) {
        const u8* op = ops + (long long)i * DEC_OP_BYTES;
        if (threadIdx.x < DEC_OP_BYTES / 16) ((uint4*)op_s)[threadIdx.x] = ((const uint4*)op)[threadIdx.x];
        __syncthreads();
        for (int vb = blockIdx.x; vb < hd.blocks; vb += gridDim.x) {
            if (hd.kind == DEC_OP_GEMV) {
                const GemvArgs& a = *(const GemvArgs*)args;
                if (hd.fold == FOLD_TAKE)
                    dec_gemv<FOLD_TAKE>(a, hd.variant, vb);
                else if (hd.fold == FOLD_EMIT)
                    dec_gemv<FOLD_EMIT>(a, hd.variant, vb);
                else
                    dec_gemv<FOLD_NONE>(a, hd.variant, vb);
            } else if (hd.kind == DEC_OP_ATTN) {
                dec_attn(*(const AttnArgs*)args, hd, dec_smem, vb);
            } else if (hd.kind == DEC_OP_COMBINE) {
                const DecCombine& c = *(const DecCombine*)args;
                attn_combine_row(c.part, c.part_ml, c.out, c.splits, c.hd, vb, 0, c.hd, dec_smem + DEC_THREADS, dec_smem,
                                 scratch, c.sinks, c.n_head);
            }
            __syncthreads();  // shared memory is free for the next virtual block
        }
        if (i + 1 < n_ops) dec_grid_sync(sync, i + 1);
    }
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned* done = sync + 2 * DEC_LINE;
        if (atomicAdd(done, 1u) == gridDim.x - 1) {
            // Every block is past the last barrier: nothing reads the
            // generation any more (the arrivals are back at zero).
            sync[DEC_LINE] = 0;
            *done = 0;
            __threadfence();
        }
    }
}
