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
// pos[0] read from device memory) attends to keys 0 ..= start + i (with a
// sliding window, the `window` newest of them; every kernel here skips the
// pages before a window and masks the rest). Grid (ceil(n_tok / tpb), n_head_kv * hparts, splits),
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
#include "kvq.cuh"

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
    const float* sinks;  // null, or per query head a logit in each softmax's denominator (gpt-oss)
    int n_tok, n_head, n_head_kv, hd;
    int tpb, gw, hparts; // tokens per block, heads per block, blocks per KV head
    int split_len;       // keys per split (a multiple of KV_PAGE)
    float scale_log2;    // the score scale (1/sqrt(hd) unless the model says) * log2(e): scores in base 2
    int window;          // > 0: query position p sees keys p - window + 1 ..= p only (sliding window)
    float softcap_log2;  // > 0: scores soft-capped, c tanh(s / c), c = the cap * log2(e) (gemma2)
};

// The first key position query position p may see (0 without a window).
__device__ __forceinline__ int attn_first_key(const AttnArgs& a, int p) {
    return a.window > 0 ? max(0, p - a.window + 1) : 0;
}

// A base-2 score soft-capped as the model asks (c tanh(s / c) in base e is
// c' tanh(s' / c') in base 2, c' = c log2(e)).
__device__ __forceinline__ float attn_softcap(const AttnArgs& a, float s) {
    return a.softcap_log2 > 0.0f ? a.softcap_log2 * tanhf(s / a.softcap_log2) : s;
}

// The softmax's denominator l (base 2, relative to the running max m) of
// query head h, with its sink logit where the model has them: l + 2^(s
// log2(e) - m). A sink far above every score makes it infinite, the
// output 0: the limit.
__device__ __forceinline__ float attn_denom(const float* sinks, int h, float m, float l) {
    return sinks ? l + exp2f(sinks[h] * 1.4426950408889634f - m) : l;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Shared-memory loads of 16 and 8 bytes through inline PTX, for the tile
// and decode kernels' inner loops: NVRTC 11.8's vectorizer split and merged
// their plain float4/float2 shared loads differently from one compilation
// to the next (the same source gave different PTX about one time in ten,
// so the committed PTX could not be checked); an asm statement is one
// ld.shared.v4 / .v2 every time. Volatile with a memory clobber: each
// stays between the barriers and the stores around it.
__device__ __forceinline__ float4 attn_lds4(const float* p) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"((u32)__cvta_generic_to_shared(p))
                 : "memory");
    return v;
}

__device__ __forceinline__ float2 attn_lds2(const float* p) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"((u32)__cvta_generic_to_shared(p))
                 : "memory");
    return v;
}

// Stage keys j0 .. j0 + KV_PAGE - 1 of KV head g (page table[j0 / KV_PAGE];
// keys at or past `end` are zeros) into Ks (rows of hd/2 + 1 words) and Vs
// (rows of hd/2 words), as FP16. When hd is a multiple of 8 (16-byte rows), each
// thread issues all of its 16-byte loads (up to ATT_STAGE_U of K and of V)
// before it stores any: one memory round trip per page, where a loop of
// 4-byte loads and stores was one per iteration (8B decode at depth 4096
// spent most of its attention time there). A quantized page (F: kvq.cuh;
// hd a multiple of 64) is staged as its quants (K rows padded by a word)
// and its scales in FP32 (rows of hd / 32 + 1), which attn_block
// dequantizes as it reads them (FP32 rows of hd 256 would not fit 48 KB).
#define ATT_STAGE_U 4
template <int F>
__device__ __forceinline__ void attn_stage(const AttnArgs& a, int g, int j0, int end, u32* Ks, u32* Vs) {
    const int hw = a.hd >> 1, kv_dim = a.n_head_kv * a.hd;
    const long long page = a.table[j0 / KV_PAGE];
    if (F != KV_F16) {
        // Quantized: the rows' quants as they are (attn_qrows), their
        // scales as FP32, each at most ATT_STAGE_U words a thread in
        // flight; attn_block dequantizes as it reads.
        const int words = a.hd * KvBits<F>::v / 32, sb = a.hd / 32 + 1, n = KV_PAGE * words;
        u32* Kq = Ks;
        u32* Vq = Kq + KV_PAGE * (words + 1);
        float* Ksc = (float*)(Vq + KV_PAGE * words);
        float* Vsc = Ksc + KV_PAGE * sb;
        for (int e0 = threadIdx.x; e0 < n; e0 += ATT_STAGE_U * blockDim.x) {
            u32 kq[ATT_STAGE_U], vq[ATT_STAGE_U];
#pragma unroll
            for (int u = 0; u < ATT_STAGE_U; ++u) {
                const int e = e0 + u * blockDim.x, jj = e / words, w = e % words;
                const bool ok = e < n && j0 + jj < end;
                const KvRowPtr kr = kv_row_ptr<F>(a.kpool, page, jj % KV_PAGE, kv_dim);
                const KvRowPtr vr = kv_row_ptr<F>(a.vpool, page, jj % KV_PAGE, kv_dim);
                const int off = g * a.hd * KvBits<F>::v / 8 + 4 * w;
                kq[u] = ok ? *(const u32*)(kr.q + off) : 0u;
                vq[u] = ok ? *(const u32*)(vr.q + off) : 0u;
            }
#pragma unroll
            for (int u = 0; u < ATT_STAGE_U; ++u) {
                const int e = e0 + u * blockDim.x, jj = e / words, w = e % words;
                if (e < n) Kq[jj * (words + 1) + w] = kq[u], Vq[jj * words + w] = vq[u];
            }
        }
        const int nb = a.hd / 32;
        for (int e = threadIdx.x; e < KV_PAGE * nb; e += blockDim.x) {
            const int jj = e / nb, b = e % nb;
            const bool ok = j0 + jj < end;
            const KvRowPtr kr = kv_row_ptr<F>(a.kpool, page, jj, kv_dim);
            const KvRowPtr vr = kv_row_ptr<F>(a.vpool, page, jj, kv_dim);
            Ksc[jj * sb + b] = ok ? h2f(kr.s[g * nb + b]) : 0.0f;
            Vsc[jj * sb + b] = ok ? h2f(vr.s[g * nb + b]) : 0.0f;
        }
        return;
    }
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

// The staged quantized page (attn_stage's layout): q.k of key `key`
// (queries scaled, FP32; each block's sum times its scale).
template <int F>
__device__ __forceinline__ float attn_qscore(const float* qs, const u32* Ks, int key, int hd) {
    const int words = hd * KvBits<F>::v / 32, sb = hd / 32 + 1, wb = words / (hd / 32);
    const u32* kr = Ks + key * (words + 1);
    const float* sc = (const float*)(Ks + KV_PAGE * (2 * words + 1)) + key * sb;
    float s = 0.0f;
    for (int b = 0; b < hd / 32; ++b) {
        float t = 0.0f;
        for (int w = 0; w < wb; ++w) {
            const u32 kk = kr[b * wb + w];
            const float* q = qs + 32 * b + (32 / wb) * w;
            if (F == KV_Q8_0) {
#pragma unroll
                for (int c = 0; c < 4; ++c) t = fmaf(q[c], (float)(signed char)(kk >> (8 * c)), t);
            } else {
#pragma unroll
                for (int c = 0; c < 8; ++c) t = fmaf(q[c], (float)((int)((kk >> (4 * c)) & 15) - 8), t);
            }
        }
        s = fmaf(t, sc[b], s);
    }
    return s;
}

// The staged quantized page: value d of key `key`'s V row, FP32.
template <int F>
__device__ __forceinline__ float attn_qvalue(const u32* Ks, int key, int d, int hd) {
    const int words = hd * KvBits<F>::v / 32, sb = hd / 32 + 1;
    const u8* vq = (const u8*)(Ks + KV_PAGE * (words + 1)) + key * words * 4;
    const float* vsc = (const float*)(Ks + KV_PAGE * (2 * words + 1)) + KV_PAGE * sb + key * sb;
    const float x = F == KV_Q8_0 ? (float)(signed char)vq[d] : (float)((int)((vq[d / 2] >> (4 * (d & 1))) & 15) - 8);
    return x * vsc[d / 32];
}

// Block (bx, by, z) of a grid (_, _, splits): bx the token block, by the
// (KV head, head part), z the key split.
template <int R, int F = KV_F16>
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
    // With a window, keys before the block's first token's first key are
    // skipped whole pages at a time, and each warp masks its own.
    const int block_lo = attn_first_key(a, start + tok0) / KV_PAGE * KV_PAGE;
    const int my_lo = active ? attn_first_key(a, start + i) : 0;
    float m = ATT_NEG_INF, l = 0.0f, acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;

    for (int j0 = max(z * a.split_len, block_lo); j0 < block_end; j0 += KV_PAGE) {
        __syncthreads();  // the previous chunk is consumed (and q is written)
        attn_stage<F>(a, g, j0, block_end, Ks, Vs);
        __syncthreads();
        // (A chunk the warp does not skip holds one of its keys.)
        if (!active || j0 >= my_end || j0 + KV_PAGE <= my_lo) continue;
        // Lane l scores key j0 + l.
        float s = 0.0f;
        if (F == KV_F16) {
            const u32* kr = Ks + lane * (hw + 1);
            for (int w = 0; w < hw; ++w) {
                const u32 kk = kr[w];
                s = fmaf(qs[2 * w], h2f((u16)(kk & 0xffff)), s);
                s = fmaf(qs[2 * w + 1], h2f((u16)(kk >> 16)), s);
            }
        } else {
            s = attn_qscore<F>(qs, Ks, lane, hd);
        }
        s = attn_softcap(a, s);
        if (j0 + lane >= my_end || j0 + lane < my_lo) s = ATT_NEG_INF;
        const float m_new = fmaxf(m, warp_max(s));  // finite: the chunk holds one of the warp's keys
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
                if (d < hd) acc[r] = fmaf(pj, F == KV_F16 ? h2f(vr[d]) : attn_qvalue<F>(Ks, jj, d, hd), acc[r]);
            }
        }
    }
    if (!active) return;
    if (F != KV_F16) {
        // Over quantized pages: the output (or this split's part of it:
        // the combine is linear) back from the values' rotation.
        float x[KVQ_MAX_R];
#pragma unroll
        for (int r = 0; r < KVQ_MAX_R; ++r) x[r] = r < R ? acc[r % R] : 0.0f;
        kvq_rotate(x, hd / 32, 64);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = x[r];
    }
    const long long row = (long long)i * a.n_head + h;
    if (splits == 1) {
        l = attn_denom(a.sinks, h, m, l);
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
// sum_z l_z 2^(m_z - M), M = max m_z (splits with no keys have m = -inf, l = 0),
// the denominator with row's sink where `sinks` (row = token * n_head + head).
// part: (rows, splits, hd); part_ml: (rows, splits, 2); out: (rows, hd).
// Grid (rows, parts), block ATT_COMBINE_THREADS; splits <= ATT_MAX_SPLITS.
// Block (row, y) merges dimensions [d_lo, d_hi) of its row, the y-th of
// `parts` even slices (more blocks read a long context's partials at once).
// The threads first turn the (m, l) pairs into weights in shared memory,
// then thread (c, d) sums dimension d over the splits c, c + nc, ... (nc =
// blockDim / (d_hi - d_lo) column groups, independent loads in flight), and
// the groups' sums meet in shared memory in a fixed order.
#define ATT_COMBINE_THREADS 512
#define ATT_MAX_SPLITS 1024
// Row `row`, dimensions [d_lo, d_hi); wz: splits floats, red: blockDim
// floats, scratch: 32 floats of shared memory.
__device__ __forceinline__ void attn_combine_row(const float* part, const float* part_ml, float* out, int splits,
                                                 int hd, long long row, int d_lo, int d_hi, float* wz, float* red,
                                                 float* scratch, const float* sinks, int n_head) {
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
    L = attn_denom(sinks, (int)(row % n_head), M, L);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    const int nd = d_hi - d_lo, nc = max(1, (int)blockDim.x / nd);
    const int c = threadIdx.x / nd, d0 = threadIdx.x % nd;
    for (int d = d_lo + d0; d < d_hi; d += blockDim.x) {
        // One dimension per thread when nd <= blockDim; groups c < nc.
        float s = 0.0f;
        if (c < nc) {
#pragma unroll 8
            for (int z = c; z < splits; z += nc) s += part[(row * splits + z) * hd + d] * wz[z];
        }
        if (c < nc) red[threadIdx.x] = s;
        __syncthreads();
        if (c == 0) {
            float t = 0.0f;
            for (int k = 0; k < nc; ++k) t += red[k * nd + d0];
            out[row * hd + d] = t * inv;
        }
        __syncthreads();
    }
}

// Prefill attention in register tiles (attn_tile_f32_d<DPT>, head
// dimensions hd = 16 DPT, DPT 4 or 8: hd 64 or 128). A block of
// ATT_TILE_THREADS threads takes 32 query rows, row r = (token tok0 + r /
// group, query head r % group of KV head g), tpb = 32 / group tokens (rows
// past tpb * group idle), and walks the keys a page (KV_PAGE = 32 keys) at a
// time up to its last token's position:
// - S = Q K^T over the page: thread t holds rows 4 (t / 16) .. +3 and keys
//   2 (t % 16), +1 (8 scores), from Qs (hd x 32, Q transposed, scaled by
//   scale_log2) and Ks (hd x 32, the page's K transposed, FP32): per
//   dimension one 16-byte and one 8-byte shared load for 8 FMAs;
// - the online softmax in base 2 (row max and sum over the 16 threads of a
//   row group: shuffles inside a half-warp), P to Ps (32 keys x 32 rows);
// - O += P V: the same thread holds the same 4 rows and DPT dimensions
//   (chunks of 4 at 64 c + 4 (t % 16)), from Ps and Vs (32 x hd, the page's
//   V, FP32, in the buffer K used): per key one 16-byte P load and DPT / 4
//   V loads for 4 DPT FMAs.
// The next page's K and this page's V are loaded into registers before the
// FMAs that precede their stores (their latency hides under them). Blocks
// run last tokens first (the causal mask gives them the most keys). Shared
// memory: attn_tile_shared_bytes (Qs, the K/V buffer, Ps).
#define ATT_TILE_THREADS 128
#define ATT_TILE_ROWS 32
// 16-byte vectors of one page's K (or V) per thread: 32 keys x hd / 8.
#define ATT_TILE_VECS(DPT) (KV_PAGE * 2 * (DPT) / ATT_TILE_THREADS)

template <int DPT, int F>
struct AttnTilePage {
    KvVals<F, 8> v[ATT_TILE_VECS(DPT)];
};

// Load page j0 / KV_PAGE of KV head g from `pool` (keys at or past `end`:
// zeros). Vector e (thread t, e = t + 128 u): key e % 32, dimensions 8 (e /
// 32) .. +7 (`transposed`: the store is Ks[d][key], conflict-free across a
// warp's 32 keys) or key e / (hd / 8), dimensions 8 (e % (hd / 8)) .. +7.
template <int DPT, int F>
__device__ __forceinline__ void attn_tile_load(const AttnArgs& a, const u16* pool, int g, int j0, int end,
                                               bool transposed, AttnTilePage<DPT, F>& p) {
    constexpr int HD = 16 * DPT, HV = HD / 8;
    const int kv_dim = a.n_head_kv * HD;
    const long long page = a.table[j0 / KV_PAGE];
#pragma unroll
    for (int u = 0; u < ATT_TILE_VECS(DPT); ++u) {
        const int e = threadIdx.x + u * ATT_TILE_THREADS;
        const int key = transposed ? e % KV_PAGE : e / HV, w = transposed ? e / KV_PAGE : e % HV;
        kv_load(p.v[u], kv_row_ptr<F>(pool, page, key, kv_dim), g * HD + 8 * w, j0 + key < end);
    }
}

__device__ __forceinline__ void attn_tile_h8(uint4 v, float f[8]) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = h2f((u16)(w[i] & 0xffff)), f[2 * i + 1] = h2f((u16)(w[i] >> 16));
}

// Store a page loaded by attn_tile_load as FP32: Ks[d * 32 + key]
// (transposed) or Vs[key * hd + d].
template <int DPT, int F>
__device__ __forceinline__ void attn_tile_store(const AttnTilePage<DPT, F>& p, bool transposed, float* buf) {
    constexpr int HD = 16 * DPT, HV = HD / 8;
#pragma unroll
    for (int u = 0; u < ATT_TILE_VECS(DPT); ++u) {
        const int e = threadIdx.x + u * ATT_TILE_THREADS;
        float f[8];
        kv_f32(p.v[u], f);
        if (transposed) {
            const int key = e % KV_PAGE, d0 = 8 * (e / KV_PAGE);
#pragma unroll
            for (int i = 0; i < 8; ++i) buf[(d0 + i) * KV_PAGE + key] = f[i];
        } else {
            float* o = buf + (e / HV) * HD + 8 * (e % HV);
            *(float4*)o = make_float4(f[0], f[1], f[2], f[3]);
            *(float4*)(o + 4) = make_float4(f[4], f[5], f[6], f[7]);
        }
    }
}

template <int DPT, int F = KV_F16>
__device__ __forceinline__ void attn_tile_block(const AttnArgs& a, float* smem, int bx, int g) {
    constexpr int HD = 16 * DPT, NC = DPT / 4;
    const int t = threadIdx.x, rg = t >> 4, kg = t & 15;
    const int group = a.n_head / a.n_head_kv, tpb = ATT_TILE_ROWS / group;
    const int tok0 = bx * tpb, start = a.pos[0];
    float* Qs = smem;                      // [HD][32]
    float* KV = Qs + HD * ATT_TILE_ROWS;   // [HD][32] (K) or [32][HD] (V)
    float* Ps = KV + HD * KV_PAGE;         // [32 keys][32 rows]

    // Q, transposed and scaled: lane = row (conflict-free stores; the rows'
    // loads meet in L1 across the dimension loop).
    for (int e = t; e < HD * ATT_TILE_ROWS; e += ATT_TILE_THREADS) {
        const int r = e % ATT_TILE_ROWS, d = e / ATT_TILE_ROWS;
        const int i = tok0 + r / group;
        float v = 0.0f;
        if (r < tpb * group && i < a.n_tok) v = a.q[((long long)i * a.n_head + g * group + r % group) * HD + d] * a.scale_log2;
        Qs[d * ATT_TILE_ROWS + r] = v;
    }
    // This thread's rows: the first and last key each may see (last -1:
    // no row).
    int lo[4], lim[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = 4 * rg + i, tok = tok0 + r / group;
        lim[i] = r < tpb * group && tok < a.n_tok ? start + tok : -1;
        lo[i] = attn_first_key(a, start + tok);
    }
    // Keys of the block: [first, end), first at a page start.
    const int first = attn_first_key(a, start + tok0) / KV_PAGE * KV_PAGE;
    const int end = start + min(tok0 + tpb, a.n_tok);
    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = ATT_NEG_INF, l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; ++d) o[i][d] = 0.0f;
    }
    AttnTilePage<DPT, F> kn, vn;
    attn_tile_load<DPT, F>(a, a.kpool, g, first, end, true, kn);
    for (int j0 = first; j0 < end; j0 += KV_PAGE) {
        __syncthreads();  // the previous page's V and P are consumed (and Qs is written)
        attn_tile_store<DPT, F>(kn, true, KV);
        attn_tile_load<DPT, F>(a, a.vpool, g, j0, end, false, vn);
        __syncthreads();
        float s[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < HD; ++d) {
            const float4 q = attn_lds4(Qs + d * ATT_TILE_ROWS + 4 * rg);
            const float2 k = attn_lds2(KV + d * KV_PAGE + 2 * kg);
            s[0][0] = fmaf(q.x, k.x, s[0][0]), s[0][1] = fmaf(q.x, k.y, s[0][1]);
            s[1][0] = fmaf(q.y, k.x, s[1][0]), s[1][1] = fmaf(q.y, k.y, s[1][1]);
            s[2][0] = fmaf(q.z, k.x, s[2][0]), s[2][1] = fmaf(q.z, k.y, s[2][1]);
            s[3][0] = fmaf(q.w, k.x, s[3][0]), s[3][1] = fmaf(q.w, k.y, s[3][1]);
        }
        float p[4][2], corr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int key = j0 + 2 * kg + c;
                s[i][c] = key > lim[i] || key < lo[i] ? ATT_NEG_INF : attn_softcap(a, s[i][c]);
            }
            float mx = fmaxf(s[i][0], s[i][1]);
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mn = fmaxf(m[i], mx);
            corr[i] = mn == ATT_NEG_INF ? 1.0f : exp2f(m[i] - mn);
#pragma unroll
            for (int c = 0; c < 2; ++c) p[i][c] = s[i][c] == ATT_NEG_INF ? 0.0f : exp2f(s[i][c] - mn);
            float sum = p[i][0] + p[i][1];
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            l[i] = l[i] * corr[i] + sum;
            m[i] = mn;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c)
            *(float4*)(Ps + (2 * kg + c) * ATT_TILE_ROWS + 4 * rg) = make_float4(p[0][c], p[1][c], p[2][c], p[3][c]);
        __syncthreads();  // K is consumed, P is written
        attn_tile_store<DPT, F>(vn, false, KV);
        if (j0 + KV_PAGE < end) attn_tile_load<DPT, F>(a, a.kpool, g, j0 + KV_PAGE, end, true, kn);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int d = 0; d < DPT; ++d) o[i][d] *= corr[i];
        const int n_keys = min(KV_PAGE, end - j0);
        for (int j = 0; j < n_keys; ++j) {
            const float4 pj = attn_lds4(Ps + j * ATT_TILE_ROWS + 4 * rg);
            const float pv[4] = {pj.x, pj.y, pj.z, pj.w};
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float4 v = attn_lds4(KV + j * HD + 64 * c + 4 * kg);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    o[i][4 * c] = fmaf(pv[i], v.x, o[i][4 * c]);
                    o[i][4 * c + 1] = fmaf(pv[i], v.y, o[i][4 * c + 1]);
                    o[i][4 * c + 2] = fmaf(pv[i], v.z, o[i][4 * c + 2]);
                    o[i][4 * c + 3] = fmaf(pv[i], v.w, o[i][4 * c + 3]);
                }
            }
        }
    }
    // Over quantized pages the rows go through shared memory (the K/V
    // buffer: 32 rows of HD), where a warp a (row, run of 64) turns them
    // back from the values' rotation.
    if (F != KV_F16) __syncthreads();  // the last page's V is consumed
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (lim[i] < 0) continue;
        const int r = 4 * rg + i, tok = tok0 + r / group;
        const float li = attn_denom(a.sinks, g * group + r % group, m[i], l[i]);
        const float inv = li > 0.0f ? 1.0f / li : 0.0f;
        float* out = F == KV_F16 ? a.out + ((long long)tok * a.n_head + g * group + r % group) * HD : KV + r * HD;
#pragma unroll
        for (int c = 0; c < NC; ++c)
            *(float4*)(out + 64 * c + 4 * kg) =
                make_float4(o[i][4 * c] * inv, o[i][4 * c + 1] * inv, o[i][4 * c + 2] * inv, o[i][4 * c + 3] * inv);
    }
    if (F != KV_F16) {
        __syncthreads();
        const int lane = t & 31;
        for (int task = t >> 5; task < ATT_TILE_ROWS * (HD / 64); task += ATT_TILE_THREADS / 32) {
            const int r = task / (HD / 64), c = task % (HD / 64), tok = tok0 + r / group;
            if (r >= tpb * group || tok >= a.n_tok) continue;  // warp-uniform
            float x[KVQ_MAX_R] = {KV[r * HD + 64 * c + lane], KV[r * HD + 64 * c + 32 + lane]};
            kvq_rotate(x, 2, 64);
            float* out = a.out + ((long long)tok * a.n_head + g * group + r % group) * HD + 64 * c;
            out[lane] = x[0], out[32 + lane] = x[1];
        }
    }
}
