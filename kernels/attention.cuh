// Attention over the paged FP16 KV cache: causal attention with an online
// softmax (prefill and decode), and the combine step of split-K ("flash
// decoding"). Tokens enter the cache through rope_kv_*_f32 (rope.cu).
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
// block stages the chunk's K and V once (coalesced loads) and every
// warp uses it, so a page is read once per block, not per head or token
// (the prefill tiling). In a chunk, lane l scores key l (K rows padded to an
// odd number of words: conflict-free), the warp updates its running max and
// sum, and each lane accumulates the dimensions d = lane + 32 r of the
// output. Split z of `splits` takes keys [z * split_len, (z+1) * split_len):
// with splits > 1 the block writes unnormalized partials (acc, max, sum) and
// attn_combine_f32 merges them; decode uses that to spread a long context
// over the SMs when there are few heads.
#pragma once
#include "common.cuh"
#include "quant.cuh"

#define ATT_NEG_INF __int_as_float(0xff800000)
#define ATT_MAX_WARPS 8

struct AttnArgs {  // the kernels' parameters, in their order
    const float* q;      // (n_tok, n_head, hd)
    const u16* kpool;    // pages of (KV_PAGE, kv_dim)
    const u16* vpool;
    const int* table;    // the sequence's pages
    float* out;          // (n_tok, n_head, hd), or partial sums when splits > 1
    float* part_ml;      // (n_tok, n_head, splits, 2): running max and sum per split
    const int* pos;      // pos[0]: position of query token 0
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
// (rows of hd/2 words). When hd is a multiple of 8 (16-byte rows), each
// thread issues all of its 16-byte loads (up to ATT_STAGE_U of K and of V)
// before it stores any: one memory round trip per page, where a loop of
// 4-byte loads and stores was one per iteration (8B decode at depth 4096
// spent most of its attention time there).
#define ATT_STAGE_U 4
__device__ __forceinline__ void attn_stage(const AttnArgs& a, int g, int j0, int end, u32* Ks, u32* Vs) {
    const int hw = a.hd >> 1, kv_dim = a.n_head_kv * a.hd;
    const long long page = a.table[j0 / KV_PAGE];
    const u32* kp = (const u32*)(a.kpool + page * KV_PAGE * kv_dim + (long long)g * a.hd);
    const u32* vp = (const u32*)(a.vpool + page * KV_PAGE * kv_dim + (long long)g * a.hd);
    const int row_words = kv_dim >> 1;
    if ((a.hd & 7) == 0) {
        const int hq = a.hd >> 3, n = KV_PAGE * hq;  // 16-byte vectors per row, per page
        for (int e0 = threadIdx.x; e0 < n; e0 += ATT_STAGE_U * blockDim.x) {
            uint4 kv[ATT_STAGE_U], vv[ATT_STAGE_U];
#pragma unroll
            for (int u = 0; u < ATT_STAGE_U; ++u) {
                const int e = e0 + u * blockDim.x, jj = e / hq, w = e % hq;
                const bool ok = e < n && j0 + jj < end;
                kv[u] = ok ? *(const uint4*)(kp + jj * row_words + 4 * w) : make_uint4(0, 0, 0, 0);
                vv[u] = ok ? *(const uint4*)(vp + jj * row_words + 4 * w) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < ATT_STAGE_U; ++u) {
                const int e = e0 + u * blockDim.x, jj = e / hq, w = e % hq;
                if (e < n) {
                    u32* kr = Ks + jj * (hw + 1) + 4 * w;
                    kr[0] = kv[u].x, kr[1] = kv[u].y, kr[2] = kv[u].z, kr[3] = kv[u].w;
                    *(uint4*)(Vs + jj * hw + 4 * w) = vv[u];
                }
            }
        }
        return;
    }
    for (int e = threadIdx.x; e < KV_PAGE * hw; e += blockDim.x) {
        const int jj = e / hw, w = e % hw;
        const bool ok = j0 + jj < end;
        Ks[jj * (hw + 1) + w] = ok ? kp[jj * row_words + w] : 0u;
        Vs[jj * hw + w] = ok ? vp[jj * row_words + w] : 0u;
    }
}

// Block (bx, by, z) of a grid (_, _, splits): bx the token block, by the
// (KV head, head part), z the key split.
template <int R>
__device__ __forceinline__ void attn_block(const AttnArgs& a, float* smem, int bx, int by, int z, int splits) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = a.hd, hw = hd >> 1, group = a.n_head / a.n_head_kv;
    const int g = by / a.hparts, hp = by % a.hparts;
    const int tok0 = bx * a.tpb;
    const int i = tok0 + warp / a.gw, hg = hp * a.gw + warp % a.gw;
    const bool active = i < a.n_tok && hg < group;
    const int h = g * group + hg;

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
    const int start = a.pos[0];
    const int block_end = min(start + last_tok + 1, (z + 1) * a.split_len);
    const int my_end = active ? min(start + i + 1, (z + 1) * a.split_len) : 0;
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

// Merge the partials of `splits` splits: out[row] = sum_z acc_z 2^(m_z - M) /
// sum_z l_z 2^(m_z - M), M = max m_z (splits with no keys have m = -inf, l = 0).
// part: (rows, splits, hd); part_ml: (rows, splits, 2); out: (rows, hd).
// Grid (rows), block ATT_COMBINE_THREADS; splits <= ATT_MAX_SPLITS. The
// threads first turn the (m, l) pairs into weights in shared memory, then
// thread (c, d) sums dimension d over the splits c, c + nc, ... (nc =
// blockDim / hd column groups, independent loads in flight), and the groups'
// sums meet in shared memory in a fixed order.
#define ATT_COMBINE_THREADS 512
#define ATT_MAX_SPLITS 1024
// Row `row`; wz: splits floats, red: blockDim floats, scratch: 32 floats of
// shared memory.
__device__ __forceinline__ void attn_combine_row(const float* part, const float* part_ml, float* out, int splits,
                                                 int hd, long long row, float* wz, float* red, float* scratch) {
    const float* ml = part_ml + row * splits * 2;
    float M = ATT_NEG_INF;
    for (int z = threadIdx.x; z < splits; z += blockDim.x) M = fmaxf(M, ml[2 * z]);
    M = warp_max(M);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = M;
    __syncthreads();
    M = ATT_NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) M = fmaxf(M, scratch[w]);
    __syncthreads();
    float L = 0.0f;
    for (int z = threadIdx.x; z < splits; z += blockDim.x) {
        const float l = ml[2 * z + 1];
        const float w = l > 0.0f ? exp2f(ml[2 * z] - M) : 0.0f;
        wz[z] = w;
        L += l > 0.0f ? l * w : 0.0f;
    }
    L = block_sum(L, scratch);  // (its barriers also publish wz)
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    const int nc = max(1, (int)blockDim.x / hd);
    const int c = threadIdx.x / hd, d0 = threadIdx.x % hd;
    for (int d = d0; d < hd; d += blockDim.x) {
        // One dimension per thread when hd <= blockDim; groups c < nc.
        float s = 0.0f;
        if (c < nc) {
#pragma unroll 8
            for (int z = c; z < splits; z += nc) s += part[(row * splits + z) * hd + d] * wz[z];
        }
        if (c < nc) red[threadIdx.x] = s;
        __syncthreads();
        if (c == 0) {
            float t = 0.0f;
            for (int k = 0; k < nc; ++k) t += red[k * hd + d0];
            out[row * hd + d] = t * inv;
        }
        __syncthreads();
    }
}
