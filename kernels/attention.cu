// Attention kernels: thin wrappers over attention.cuh (the cache layout
// and the device code are described there).
#include "attention.cuh"
#include "attention_decode.cuh"

// Every attention kernel's parameters (AttnArgs' fields, in order; the
// launcher's push_attn), and the AttnArgs and dynamic shared memory they
// make.
#define ATTN_PARAMS                                                                                               \
    const float *q, const u16 *kpool, const u16 *vpool, const int *table, float *out, float *part_ml,             \
        const int *pos, const float *sinks, int n_tok, int n_head, int n_head_kv, int hd, int tpb, int gw, int hparts, int split_len, \
        float scale_log2, int window, float softcap_log2
#define ATTN_ARGS                                                                                                 \
    extern __shared__ __align__(16) float att_smem[];                                                             \
    const AttnArgs a = {q,     kpool,     vpool, table, out, part_ml, pos, sinks, n_tok, n_head, n_head_kv, hd, \
                        tpb, gw, hparts, split_len, scale_log2, window, softcap_log2}

// attn_f32_r<R>: head dimensions up to 32 R (each lane holds R of the output).
// Each kernel of this file reads FP16 pages; the same name with _q8_0 or
// _q4_0 after it reads pages of that format (kvq.cuh; head dimensions
// that are multiples of 64).
#define ATTN_KERNEL_F(R, SUFFIX, F)                                                \
    extern "C" __global__ void attn_f32_r##R##SUFFIX(ATTN_PARAMS) {                \
        ATTN_ARGS;                                                                 \
        attn_block<R, F>(a, att_smem, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z); \
    }
#define ATTN_KERNEL(R) ATTN_KERNEL_F(R, , KV_F16)
#define ATTN_KERNEL_Q(R) ATTN_KERNEL_F(R, _q8_0, KV_Q8_0) ATTN_KERNEL_F(R, _q4_0, KV_Q4_0)
ATTN_KERNEL(1)
ATTN_KERNEL(2)
ATTN_KERNEL(3)
ATTN_KERNEL(4)
ATTN_KERNEL(5)
ATTN_KERNEL(6)
ATTN_KERNEL(7)
ATTN_KERNEL(8)
ATTN_KERNEL_Q(2)
ATTN_KERNEL_Q(4)
ATTN_KERNEL_Q(6)
ATTN_KERNEL_Q(8)

extern "C" __global__ void __launch_bounds__(ATT_COMBINE_THREADS)
    attn_combine_f32(const float* part, const float* part_ml, float* out, const float* sinks, int splits, int hd,
                     int n_head) {
    __shared__ float wz[ATT_MAX_SPLITS];
    __shared__ float red[ATT_COMBINE_THREADS];
    __shared__ float scratch[32];
    const int per = (hd + gridDim.y - 1) / gridDim.y, d_lo = blockIdx.y * per;
    attn_combine_row(part, part_ml, out, splits, hd, blockIdx.x, d_lo, min(hd, d_lo + per), wz, red, scratch, sinks,
                     n_head);
}

// attn_tile_f32_d<DPT>: prefill in register tiles, head dimension 16 DPT
// (attention.cuh). Grid (ceil(n_tok / (32 / group)), n_head_kv), block
// ATT_TILE_THREADS, dynamic shared memory attn_tile_shared_bytes(hd); the
// parameters of attn_f32_r<R> (tpb, gw, hparts and split_len unused: one
// split). Blocks per SM the registers must allow: 4 (hd 64), 3 (hd 128:
// at 4, 128 registers spill 36 bytes on sm_52); on the M40 shared memory
// allows 2 of hd 128 (36 KB each of 96 KB).
#define ATTN_TILE_KERNEL_F(DPT, MIN_BLOCKS, SUFFIX, F)                                                    \
    extern "C" __global__ void __launch_bounds__(ATT_TILE_THREADS, MIN_BLOCKS)                            \
        attn_tile_f32_d##DPT##SUFFIX(ATTN_PARAMS) {                                                       \
        ATTN_ARGS;                                                                                        \
        attn_tile_block<DPT, F>(a, att_smem, gridDim.x - 1 - blockIdx.x, blockIdx.y);                     \
    }
#define ATTN_TILE_KERNEL(DPT, MIN_BLOCKS)                 \
    ATTN_TILE_KERNEL_F(DPT, MIN_BLOCKS, , KV_F16)         \
    ATTN_TILE_KERNEL_F(DPT, MIN_BLOCKS, _q8_0, KV_Q8_0)   \
    ATTN_TILE_KERNEL_F(DPT, MIN_BLOCKS, _q4_0, KV_Q4_0)
ATTN_TILE_KERNEL(4, 4)
ATTN_TILE_KERNEL(8, 3)

// attn_dec_f32_d<DPT>_g<G>: decode (one query token), head dimension 32
// DPT, G query heads a block (attention.cuh). Grid (n_head_kv, splits,
// ceil(query heads per KV head / G)), 32 to 32 ATT_DEC_MAX_WARPS threads,
// dynamic shared memory attn_dec_shared_bytes(hd, G); the parameters of
// attn_f32_r<R> (tpb, gw, hparts unused).
#define ATTN_DEC_KERNEL_F(DPT, G, SUFFIX, F)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * ATT_DEC_MAX_WARPS)                                  \
        attn_dec_f32_d##DPT##_g##G##SUFFIX(ATTN_PARAMS) {                                                 \
        ATTN_ARGS;                                                                                        \
        attn_dec_block<DPT, G, F>(a, att_smem, blockIdx.x, blockIdx.y, gridDim.y, G * blockIdx.z);        \
    }
#define ATTN_DEC_KERNEL(DPT, G)                   \
    ATTN_DEC_KERNEL_F(DPT, G, , KV_F16)           \
    ATTN_DEC_KERNEL_F(DPT, G, _q8_0, KV_Q8_0)     \
    ATTN_DEC_KERNEL_F(DPT, G, _q4_0, KV_Q4_0)
ATTN_DEC_KERNEL(2, 1)
ATTN_DEC_KERNEL(2, 2)
ATTN_DEC_KERNEL(2, 4)
ATTN_DEC_KERNEL(2, 8)
ATTN_DEC_KERNEL(4, 1)
ATTN_DEC_KERNEL(4, 2)
ATTN_DEC_KERNEL(4, 4)
ATTN_DEC_KERNEL(4, 8)
ATTN_DEC_KERNEL(8, 1)
ATTN_DEC_KERNEL(8, 2)

// attn_dec_b_f32_d<DPT>_g<G>: the decode kernel over a batch of sequences,
// one query token each (a batched decode step): token s (q and out row s,
// position pos[s]) attends to its own sequence's keys 0 ..= pos[s], whose
// block table starts at table[tab[s]]. Grid (n_head_kv, 1, n_tok *
// zparts): block z takes token z / zparts and head part z % zparts; no key
// splits (the batch gives the blocks), part_ml unused. The parameters of
// attn_f32_r<R>, then tab and zparts.
#define ATTN_DEC_B_KERNEL_F(DPT, G, SUFFIX, F)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * ATT_DEC_MAX_WARPS)                              \
        attn_dec_b_f32_d##DPT##_g##G##SUFFIX(ATTN_PARAMS, const int* tab, int zparts) {               \
        ATTN_ARGS;                                                                                    \
        const int s = blockIdx.z / zparts;                                                            \
        AttnArgs b = a;                                                                               \
        const long long row = (long long)s * n_head * hd;                                             \
        b.q = q + row, b.out = out + row, b.pos = pos + s, b.table = table + tab[s], b.n_tok = 1;     \
        attn_dec_block<DPT, G, F>(b, att_smem, blockIdx.x, 0, 1, G * (blockIdx.z % zparts));         \
    }
#define ATTN_DEC_B_KERNEL(DPT, G)                   \
    ATTN_DEC_B_KERNEL_F(DPT, G, , KV_F16)           \
    ATTN_DEC_B_KERNEL_F(DPT, G, _q8_0, KV_Q8_0)     \
    ATTN_DEC_B_KERNEL_F(DPT, G, _q4_0, KV_Q4_0)
ATTN_DEC_B_KERNEL(2, 1)
ATTN_DEC_B_KERNEL(2, 2)
ATTN_DEC_B_KERNEL(2, 4)
ATTN_DEC_B_KERNEL(2, 8)
ATTN_DEC_B_KERNEL(4, 1)
ATTN_DEC_B_KERNEL(4, 2)
ATTN_DEC_B_KERNEL(4, 4)
ATTN_DEC_B_KERNEL(4, 8)
ATTN_DEC_B_KERNEL(8, 1)
ATTN_DEC_B_KERNEL(8, 2)
