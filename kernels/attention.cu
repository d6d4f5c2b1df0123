// Attention over the paged FP16 KV cache: KV append, causal attention with
// an online softmax (prefill and decode), and the combine step of split-K
// ("flash decoding").
//
// The cache of one layer is two pools, K and V, of pages of KV_PAGE tokens:
// pool[(page * KV_PAGE + slot) * kv_dim + head * hd + d], FP16. A sequence's
// block table lists its pages in order: position p lives in page
// table[p / KV_PAGE], slot p % KV_PAGE.
//
// attn_f32_r<R>: query token i (of n_tok, at position start + i, start =
// pos[0] read from device memory) attends to keys 0 ..= start + i. Grid (ceil(n_tok / tpb), n_head_kv * hparts, splits),
// block 32 * tpb * gw threads, dynamic shared memory attn_shared_bytes(hd,
// warps). A block serves tpb consecutive query tokens and gw of the query
// heads that share one KV head (GQA); warp w takes token w / gw and head
// w % gw. Keys go through shared memory in chunks of KV_PAGE (one page): the
// block stages the chunk's K and V once (coalesced 4-byte loads) and every
// warp uses it, so a page is read once per block, not per head or token
// (the prefill tiling). In a chunk, lane l scores key l (K rows padded to an
// odd number of words: conflict-free), the warp updates its running max and
// sum, and each lane accumulates the dimensions d = lane + 32 r of the
// output. Split z of `splits` takes keys [z * split_len, (z+1) * split_len):
// with splits > 1 the block writes unnormalized partials (acc, max, sum) and
// attn_combine_f32 merges them; decode uses that to spread a long context
// over the SMs when there are few heads.
#include "common.cuh"
#include "quant.cuh"

#define ATT_NEG_INF __int_as_float(0xff800000)
#define ATT_MAX_WARPS 8

// k, v (n_tok, kv_dim) FP32 -> pools at positions pos[0] .. pos[0] + n_tok - 1
// (positions come from device memory, so a captured decode step replays at
// every position).
extern "C" __global__ void kv_append_f32(const float* k, const float* v, u16* kpool, u16* vpool, const int* table,
                                         const int* pos, int n_tok, int kv_dim) {
    const long long n = (long long)n_tok * kv_dim;
    const int start = pos[0];
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(e / kv_dim), c = (int)(e % kv_dim);
        const int p = start + i;
        const long long at = kv_row(table, p) * kv_dim + c;
        kpool[at] = f2h(k[e]);
        vpool[at] = f2h(v[e]);
    }
}

struct AttnArgs {
    const float* q;      // (n_tok, n_head, hd)
    const u16* kpool;    // pages of (KV_PAGE, kv_dim)
    const u16* vpool;
    const int* table;    // the sequence's pages
    float* out;          // (n_tok, n_head, hd), or partial sums when splits > 1
    float* part_ml;      // (n_tok, n_head, splits, 2): running max and sum per split
    int start;           // position of query token 0 (read from device memory)
    int n_tok, n_head, n_head_kv, hd;
    int tpb, gw, hparts; // tokens per block, heads per block, blocks per KV head
    int split_len;       // keys per split (a multiple of KV_PAGE)
    float scale_log2;    // 1/sqrt(hd) * log2(e): scores in base 2
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Stage keys j0 .. j0 + KV_PAGE - 1 of KV head g (page table[j0 / KV_PAGE];
// keys at or past `end` are zeros) into Ks (rows of hd/2 + 1 words) and Vs
// (rows of hd/2 words).
__device__ __forceinline__ void attn_stage(const AttnArgs& a, int g, int j0, int end, u32* Ks, u32* Vs) {
    const int hw = a.hd >> 1, kv_dim = a.n_head_kv * a.hd;
    const long long page = a.table[j0 / KV_PAGE];
    const u32* kp = (const u32*)(a.kpool + page * KV_PAGE * kv_dim + (long long)g * a.hd);
    const u32* vp = (const u32*)(a.vpool + page * KV_PAGE * kv_dim + (long long)g * a.hd);
    const int row_words = kv_dim >> 1;
    for (int e = threadIdx.x; e < KV_PAGE * hw; e += blockDim.x) {
        const int jj = e / hw, w = e % hw;
        const bool ok = j0 + jj < end;
        Ks[jj * (hw + 1) + w] = ok ? kp[jj * row_words + w] : 0u;
        Vs[jj * hw + w] = ok ? vp[jj * row_words + w] : 0u;
    }
}

template <int R>
__device__ __forceinline__ void attn_block(const AttnArgs& a, float* smem) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = a.hd, hw = hd >> 1, group = a.n_head / a.n_head_kv;
    const int g = blockIdx.y / a.hparts, hp = blockIdx.y % a.hparts;
    const int tok0 = blockIdx.x * a.tpb;
    const int i = tok0 + warp / a.gw, hg = hp * a.gw + warp % a.gw;
    const bool active = i < a.n_tok && hg < group;
    const int h = g * group + hg;
    const int splits = gridDim.z, z = blockIdx.z;

    // Shared: q of every warp (hd floats each), then the K and V chunk.
    float* Qs = smem;
    u32* Ks = (u32*)(smem + ATT_MAX_WARPS * hd);
    u32* Vs = Ks + KV_PAGE * (hw + 1);
    float* qs = Qs + warp * hd;
    if (active) {
        const float* q = a.q + ((long long)i * a.n_head + h) * hd;
        for (int d = lane; d < hd; d += 32) qs[d] = q[d] * a.scale_log2;
    }

    // Keys this block needs: up to the last token's position, within the split.
    const int last_tok = min(tok0 + a.tpb, a.n_tok) - 1;
    const int block_end = min(a.start + last_tok + 1, (z + 1) * a.split_len);
    const int my_end = active ? min(a.start + i + 1, (z + 1) * a.split_len) : 0;
    float m = ATT_NEG_INF, l = 0.0f, acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;

    for (int j0 = z * a.split_len; j0 < block_end; j0 += KV_PAGE) {
        __syncthreads();  // the previous chunk is consumed (and q is written)
        attn_stage(a, g, j0, block_end, Ks, Vs);
        __syncthreads();
        if (!active || j0 >= my_end) continue;
        // Lane l scores key j0 + l.
        const u32* kr = Ks + lane * (hw + 1);
        float s = 0.0f;
        for (int w = 0; w < hw; ++w) {
            const u32 kk = kr[w];
            s = fmaf(qs[2 * w], h2f((u16)(kk & 0xffff)), s);
            s = fmaf(qs[2 * w + 1], h2f((u16)(kk >> 16)), s);
        }
        if (j0 + lane >= my_end) s = ATT_NEG_INF;
        const float m_new = fmaxf(m, warp_max(s));  // finite: key j0 < my_end is valid
        const float corr = exp2f(m - m_new);
        const float p = exp2f(s - m_new);
        l = l * corr + warp_sum(p);
        m = m_new;
        const u16* vh = (const u16*)Vs;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] *= corr;
        const int n_keys = min(KV_PAGE, my_end - j0);
        for (int jj = 0; jj < n_keys; ++jj) {
            const float pj = __shfl_sync(0xffffffffu, p, jj);
            const u16* vr = vh + jj * hd;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int d = lane + 32 * r;
                if (d < hd) acc[r] = fmaf(pj, h2f(vr[d]), acc[r]);
            }
        }
    }
    if (!active) return;
    const long long row = (long long)i * a.n_head + h;
    if (splits == 1) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* o = a.out + row * hd;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int d = lane + 32 * r;
            if (d < hd) o[d] = acc[r] * inv;
        }
    } else {
        float* o = a.out + (row * splits + z) * hd;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int d = lane + 32 * r;
            if (d < hd) o[d] = acc[r];
        }
        if (lane == 0) {
            a.part_ml[(row * splits + z) * 2] = m;
            a.part_ml[(row * splits + z) * 2 + 1] = l;
        }
    }
}

// attn_f32_r<R>: head dimensions up to 32 R (each lane holds R of the output).
#define ATTN_KERNEL(R)                                                                                             \
    extern "C" __global__ void attn_f32_r##R(const float* q, const u16* kpool, const u16* vpool, const int* table, \
                                             float* out, float* part_ml, const int* pos, int n_tok, int n_head,    \
                                             int n_head_kv, int hd, int tpb, int gw, int hparts, int split_len,    \
                                             float scale_log2) {                                                   \
        extern __shared__ __align__(16) float att_smem[];                                                          \
        const AttnArgs a = {q,         kpool,  vpool,  table,     out, part_ml, pos[0], n_tok, n_head, n_head_kv, \
                            hd,        tpb,    gw,     hparts,    split_len, scale_log2};                         \
        attn_block<R>(a, att_smem);                                                                                \
    }
ATTN_KERNEL(1)
ATTN_KERNEL(2)
ATTN_KERNEL(3)
ATTN_KERNEL(4)
ATTN_KERNEL(5)
ATTN_KERNEL(6)
ATTN_KERNEL(7)
ATTN_KERNEL(8)

// Merge the partials of `splits` splits: out[row] = sum_z acc_z 2^(m_z - M) /
// sum_z l_z 2^(m_z - M), M = max m_z (splits with no keys have m = -inf, l = 0).
// part: (rows, splits, hd); part_ml: (rows, splits, 2); out: (rows, hd).
// Grid (rows), block 32.
extern "C" __global__ void attn_combine_f32(const float* part, const float* part_ml, float* out, int splits, int hd) {
    const long long row = blockIdx.x;
    const float* ml = part_ml + row * splits * 2;
    float M = ATT_NEG_INF;
    for (int z = 0; z < splits; ++z) M = fmaxf(M, ml[2 * z]);
    float L = 0.0f;
    for (int z = 0; z < splits; ++z)
        if (ml[2 * z + 1] > 0.0f) L += ml[2 * z + 1] * exp2f(ml[2 * z] - M);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < splits; ++z)
            if (ml[2 * z + 1] > 0.0f) s += part[(row * splits + z) * hd + d] * exp2f(ml[2 * z] - M);
        out[row * hd + d] = s * inv;
    }
}
