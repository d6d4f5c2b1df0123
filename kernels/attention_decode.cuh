// Decode attention (attn_dec_f32_*: one query token a sequence) over the
// paged KV cache of attention.cuh, whose layout, arguments and helpers it
// shares.
#pragma once
#include "attention.cuh"

// Decode attention (one query token) for head dimensions hd = 32 DPT (DPT
// 2, 4 or 8: hd 64, 128 or 256) and up to G (1, 2, 4 or 8; 1 or 2 for hd
// 256, whose lanes already hold 64 loaded registers of K and of V a pass)
// query heads per KV head: attn_dec_f32_d<DPT>_g<G>. Grid (n_head_kv, splits, head parts), blocks
// of 1 to ATT_DEC_MAX_WARPS warps; block (g, z, p) takes query heads h0 =
// p G .. min(h0 + G, group) - 1 of KV head g and its keys [z * split_len,
// min((z + 1) * split_len, pos[0] + 1)) in passes of ATT_DEC_KEYS (half a
// page), warp w the passes w, w + warps, ... (Several head parts, each
// block reading the same K and V, where there are too few (KV head, split)
// blocks to keep the GPU's latency hidden: short contexts.) A pass:
// - lane l scores key l % 16 over half of the dimensions (l / 16) for every
//   query head of the block: all of the pass's K (hd / 16 16-byte loads a
//   lane) and V (16 keys x DPT dimensions a lane) are loaded first (plain
//   loads, a __syncwarp after them so ptxas keeps them together), so a
//   pass is one memory round trip; each FP16 value is converted once and
//   serves every head (the warp kernel's head warps each convert the page);
// - the halves' sums meet by one shuffle, the online softmax in base 2 per
//   head (max over 16 lanes), P through shared memory;
// - O += P V, lane l holding dimensions DPT l .. +DPT-1 of every head.
// At the end the warps' (max, sum, O) meet in shared memory: the block
// writes out (one split) or its split's partials for attn_combine_f32.
// Where the warps cover every key (short contexts) there is no split and
// no combine launch. Shared memory: attn_dec_shared_bytes.
#define ATT_DEC_KEYS 16
#define ATT_DEC_MAX_WARPS 8

template <int DPT, int G, int F = KV_F16>
__device__ __forceinline__ void attn_dec_block(const AttnArgs& a, float* smem, int g, int z, int splits, int h0) {
    constexpr int HD = 32 * DPT, KC = HD / 16;  // 16-byte K loads a lane: half a row
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int group = a.n_head / a.n_head_kv, kv_dim = a.n_head_kv * HD;
    const int heads = min(group - h0, G);  // this block's: h0 .. h0 + heads - 1
    float* Qs = smem;                              // [G][HD], scaled by scale_log2
    float* Ps = Qs + G * HD;                       // [warps][16 keys][G]
    float* Ms = Ps + ATT_DEC_MAX_WARPS * ATT_DEC_KEYS * G;  // [warps][G] maxima, then sums
    float* Ls = Ms + ATT_DEC_MAX_WARPS * G;
    float* Os = Ls + ATT_DEC_MAX_WARPS * G;        // [warps][G][HD]
    const int k0 = z * a.split_len, end = min(a.pos[0] + 1, k0 + a.split_len);
    // The first key (a window's, in this split), and the first pass at
    // the multiple of ATT_DEC_KEYS below it: every pass holds a key of
    // [lo, end) (k0 and a split's end are multiples of KV_PAGE).
    const int lo = max(k0, attn_first_key(a, a.pos[0]));
    // q of the G heads (16-byte aligned rows), all of a thread's loads
    // before its stores: one round trip for up to 4 float4s a thread.
    {
        constexpr int QV = G * HD / 4;
        const float4* q4 = (const float4*)(a.q + ((long long)g * group + h0) * HD);
        for (int e0 = threadIdx.x; e0 < QV; e0 += 4 * blockDim.x) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int e = e0 + u * blockDim.x;
                v[u] = e < QV && 4 * e / HD < heads ? q4[e] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int e = e0 + u * blockDim.x;
                const float c = a.scale_log2;
                if (e < QV) *(float4*)(Qs + 4 * e) = make_float4(v[u].x * c, v[u].y * c, v[u].z * c, v[u].w * c);
            }
        }
    }
    const int kl = lane & 15, half = lane >> 4;
    float m[G], l[G], acc[G][DPT];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = ATT_NEG_INF, l[h] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPT; ++d) acc[h][d] = 0.0f;
    }
    // The first pass's page, read under the barrier; each pass reads the
    // next one's with its own loads.
    const int jstep = ATT_DEC_KEYS * nw;
    int j0 = lo / ATT_DEC_KEYS * ATT_DEC_KEYS + ATT_DEC_KEYS * warp;
    int page = j0 < end ? a.table[j0 / KV_PAGE] : 0;
    __syncthreads();  // Qs is written
    float* ps = Ps + warp * ATT_DEC_KEYS * G;
    for (; j0 < end; j0 += jstep) {
        // Rows of the pass's 16 keys: consecutive slots of one page.
        const long long row0 = (long long)page * KV_PAGE + j0 % KV_PAGE;
        const bool ok = j0 + kl < end && j0 + kl >= lo;
        // FP16 pages: plain 16-byte loads (kv, vv); quantized ones: a
        // block's quants and its scale (kq, vq: kvq.cuh).
        uint4 kv[KC];
        KvVals<F, 8> kq[KC];
        if (F == KV_F16) {
            const uint4* kp = (const uint4*)(a.kpool + (row0 + kl) * kv_dim + g * HD + half * (HD / 2));
#pragma unroll
            for (int c = 0; c < KC; ++c) kv[c] = ok ? kp[c] : make_uint4(0, 0, 0, 0);
        } else {
            const KvRowPtr kr = kv_row_ptr<F>(a.kpool, page, j0 % KV_PAGE + kl, kv_dim);
#pragma unroll
            for (int c = 0; c < KC; ++c) kv_load(kq[c], kr, g * HD + half * (HD / 2) + 8 * c, ok);
        }
        const u16* vp = a.vpool + row0 * kv_dim + g * HD + DPT * lane;
        u32 vv[ATT_DEC_KEYS][DPT / 2];
        KvVals<F, DPT> vq[ATT_DEC_KEYS];
#pragma unroll
        for (int j = 0; j < ATT_DEC_KEYS; ++j) {
            const bool vok = j0 + j < end;
            if (F != KV_F16) {
                kv_load(vq[j], kv_row_ptr<F>(a.vpool, page, j0 % KV_PAGE + j, kv_dim), g * HD + DPT * lane, vok);
            } else if (DPT == 8) {
                const uint4 v = vok ? *(const uint4*)(vp + (long long)j * kv_dim) : make_uint4(0, 0, 0, 0);
                vv[j][0] = v.x, vv[j][1 % (DPT / 2)] = v.y, vv[j][2 % (DPT / 2)] = v.z, vv[j][DPT / 2 - 1] = v.w;
            } else if (DPT == 4) {
                const uint2 v = vok ? *(const uint2*)(vp + (long long)j * kv_dim) : make_uint2(0, 0);
                vv[j][0] = v.x, vv[j][DPT / 2 - 1] = v.y;
            } else {
                vv[j][0] = vok ? *(const u32*)(vp + (long long)j * kv_dim) : 0u;
            }
        }
        if (j0 + jstep < end) page = a.table[(j0 + jstep) / KV_PAGE];
        // The loop condition is warp-uniform: the whole warp reaches this,
        // which keeps ptxas from sinking each load to its first use (one
        // round trip per load; as in gemv_packed.cuh).
        __syncwarp();
        float s[G];
#pragma unroll
        for (int h = 0; h < G; ++h) s[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
            float f[8];
            if (F == KV_F16) {
                attn_tile_h8(kv[c], f);
            } else {
                kv_f32(kq[c], f);
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float* qh = Qs + h * HD + half * (HD / 2) + 8 * c;
                const float4 q0 = attn_lds4(qh), q1 = attn_lds4(qh + 4);
                s[h] = fmaf(q0.x, f[0], s[h]), s[h] = fmaf(q0.y, f[1], s[h]);
                s[h] = fmaf(q0.z, f[2], s[h]), s[h] = fmaf(q0.w, f[3], s[h]);
                s[h] = fmaf(q1.x, f[4], s[h]), s[h] = fmaf(q1.y, f[5], s[h]);
                s[h] = fmaf(q1.z, f[6], s[h]), s[h] = fmaf(q1.w, f[7], s[h]);
            }
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float sh = attn_softcap(a, s[h] + __shfl_xor_sync(0xffffffffu, s[h], 16));
            if (!ok) sh = ATT_NEG_INF;
            float mx = sh;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mn = fmaxf(m[h], mx);  // finite: the pass holds a key of [lo, end)
            const float corr = exp2f(m[h] - mn), p = exp2f(sh - mn);
            l[h] = l[h] * corr + p;
            m[h] = mn;
#pragma unroll
            for (int d = 0; d < DPT; ++d) acc[h][d] *= corr;
            if (half == 0) ps[kl * G + h] = p;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < ATT_DEC_KEYS; ++j) {
            float pj[G];
            if (G % 4 == 0) {
#pragma unroll
                for (int h4 = 0; h4 < G; h4 += 4) {
                    const float4 p4 = attn_lds4(ps + j * G + h4);
                    pj[h4] = p4.x, pj[h4 + 1] = p4.y, pj[h4 + 2] = p4.z, pj[h4 + 3] = p4.w;
                }
            } else {
#pragma unroll
                for (int h = 0; h < G; ++h) pj[h] = ps[j * G + h];
            }
            float vf[DPT];
            if (F == KV_F16) {
#pragma unroll
                for (int i = 0; i < DPT / 2; ++i)
                    vf[2 * i] = h2f((u16)(vv[j][i] & 0xffff)), vf[2 * i + 1] = h2f((u16)(vv[j][i] >> 16));
            } else {
                kv_f32(vq[j], vf);
            }
#pragma unroll
            for (int h = 0; h < G; ++h)
#pragma unroll
                for (int d = 0; d < DPT; ++d) acc[h][d] = fmaf(pj[h], vf[d], acc[h][d]);
        }
        __syncwarp();  // ps is read before the next pass writes it
    }
    // The warps meet: each lane's sum holds its key's p (both halves the
    // same), so the sum over 16 lanes is the warp's.
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float t = l[h];
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) Ms[warp * G + h] = m[h], Ls[warp * G + h] = t;
#pragma unroll
        for (int d = 0; d < DPT; ++d) Os[(warp * G + h) * HD + DPT * lane + d] = acc[h][d];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < heads * HD; e += blockDim.x) {
        const int h = e / HD, d = e % HD;
        float M = ATT_NEG_INF;
        for (int w = 0; w < nw; ++w) M = fmaxf(M, Ms[w * G + h]);
        float o = 0.0f, L = 0.0f;
        if (M != ATT_NEG_INF) {
            for (int w = 0; w < nw; ++w) {
                const float mw = Ms[w * G + h];
                if (mw == ATT_NEG_INF) continue;
                const float wt = exp2f(mw - M);
                o = fmaf(Os[(w * G + h) * HD + d], wt, o);
                L = fmaf(Ls[w * G + h], wt, L);
            }
        }
        const long long row = g * group + h0 + h;
        // Over quantized pages the values wait in Qs (free: every warp is
        // past its scores) to be turned back from the values' rotation.
        float* dst = F == KV_F16 ? (splits == 1 ? a.out + row * HD : a.out + (row * splits + z) * HD) : Qs + h * HD;
        if (splits == 1) {
            L = attn_denom(a.sinks, (int)row, M, L);
            dst[d] = L > 0.0f ? o / L : 0.0f;
        } else {
            dst[d] = o;
            if (d == 0) a.part_ml[(row * splits + z) * 2] = M, a.part_ml[(row * splits + z) * 2 + 1] = L;
        }
    }
    if (F != KV_F16) {
        __syncthreads();
        for (int run = warp; run < heads * HD / 64; run += nw) {
            const int h = run / (HD / 64), c = run % (HD / 64);
            float x[KVQ_MAX_R] = {Qs[h * HD + 64 * c + lane], Qs[h * HD + 64 * c + 32 + lane]};
            kvq_rotate(x, 2, 64);
            const long long row = g * group + h0 + h;
            float* out = (splits == 1 ? a.out + row * HD : a.out + (row * splits + z) * HD) + 64 * c;
            out[lane] = x[0], out[32 + lane] = x[1];
        }
    }
}
