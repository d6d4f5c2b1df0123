// Rotary position embedding: for each token t, head h and pair i < n_rot /
// 2, rotate (x[a], x[b]) by theta = pos[t] * pos_scale * inv_freq[i], where
// (a, b) = (2i, 2i+1) for the normal style (llama) and (i, i + n_rot/2) for
// NeoX (qwen2), and multiply it by m = inv_freq[n_rot / 2] (llama.cpp's
// scale of cos and sin: YaRN's magnitude, rope.scaling.attn_factor; 1
// without). Dimensions from n_rot up pass through. inv_freq (n_rot / 2 + 1)
// FP32: base^(-2i/n_rot), divided by any per-dimension factors, then m. The queries
// are rotated in place and the keys on their way into the KV cache
// (rope_kv_*_f32 below, one launch with the values beside them). Each block
// first computes the sin/cos of its token's pairs into shared memory (once
// per block, not per head), then each thread takes one (head, pair): every
// load of the block is independent, so a decode step (one token, a few
// dozen heads) is one memory round trip over a few blocks.
//
// The angles come from common.cuh's rope_sin_cos (double-precision sincos:
// see there); one per (token, pair, block) is cheap even at sm_52's FP64
// rate. gemv_packed.cu's folded RoPE uses the same helpers.
#include "common.cuh"
#include "quant.cuh"
#include "kvq.cuh"

#define ROPE_THREADS 256
#define ROPE_MAX_HALF 128  // head_dim <= 256

// The sin/cos of token position p's pairs, times the magnitude scale
// inv_freq[half], into the block's table cs, then a barrier.
__device__ __forceinline__ void rope_table(float (*cs)[ROPE_MAX_HALF], int pos, const float* inv_freq, int half,
                                           float pos_scale) {
    const float p = (float)pos * pos_scale, m = inv_freq[half];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, c;
        rope_sin_cos(p, inv_freq[i], &sn, &c);
        cs[0][i] = sn * m;
        cs[1][i] = c * m;
    }
    __syncthreads();
}

// The dimensions (a, b) of pair i < n_rot / 2.
template <bool NEOX>
__device__ __forceinline__ void rope_pair(int i, int half, int* a, int* b) {
    *a = NEOX ? i : 2 * i;
    *b = NEOX ? i + half : 2 * i + 1;
}

// RoPE of the queries in place and of the keys on their way into the paged
// KV cache (attention.cuh's layout, in page format F: kvq.cuh), with the
// values beside them. q
// (n_tok, n_head, head_dim) FP32,
// roped in place; k, v (n_tok, n_head_kv, head_dim) FP32, read only; token
// t goes to row pos[t] of its block table. Grid (n_tok, ceil((n_head +
// n_head_kv) / hpb)), block ROPE_THREADS, hpb = max(1, ROPE_THREADS /
// (head_dim / 2)): each thread takes one pair of dimensions of one head
// (the rotated pairs first, then the pass-through dimensions from n_rot
// up, two by two); a K head's thread also moves the same two dimensions of
// V. With `tab` (the batched kernels: tokens of different sequences), token
// t's block table starts at table[tab[t]]. With `bias` ((n_head + 2
// n_head_kv) head_dim: Q's, K's, then V's; qwen2, gpt-oss), each value is
// biased first (the queries' pass-through dimensions too).
//
// A quantized format (F != KV_F16; head_dim a multiple of 64) needs whole
// heads: the pairs go to shared memory instead (the block holds whole
// heads: hpb head_dim / 2 <= ROPE_THREADS), and then a warp a head rotates
// it (kvq.cuh) and writes the query back or quantizes the key or value
// into its row (rope_kv_quant_tail).
#define ROPE_STAGE (2 * ROPE_THREADS)
template <int F>
__device__ __forceinline__ void rope_kv_quant_tail(const float* sh, const float* shv, float* q, int n_head,
                                                   int n_head_kv, int head_dim, int t, u16* kpool, u16* vpool,
                                                   const int* table, int p, int hpb) {
    __syncthreads();  // the block's heads are staged
    const int h0 = blockIdx.y * hpb, nh = min(hpb, n_head + n_head_kv - h0);
    const int R = head_dim / 32, k_run = head_dim & -head_dim, kv_dim = n_head_kv * head_dim;
    const long long page = table[p / KV_PAGE];
    const KvRowPtr kr = kv_row_ptr<F>(kpool, page, p % KV_PAGE, kv_dim);
    const KvRowPtr vr = kv_row_ptr<F>(vpool, page, p % KV_PAGE, kv_dim);
    const int warps = blockDim.x >> 5;
    for (int task = threadIdx.x >> 5; task < 2 * nh; task += warps) {
        const int lh = task % nh, h = h0 + lh;
        const bool second = task >= nh;  // a K head's V
        if (h < n_head) {
            if (!second) kvq_head<F>(sh + lh * head_dim, R, k_run, q + ((long long)t * n_head + h) * head_dim,
                                     nullptr, nullptr, 0);
            continue;
        }
        const int d0 = (h - n_head) * head_dim;
        if (second) {
            kvq_head<F>(shv + lh * head_dim, R, 64, nullptr, (u8*)vr.q, (u16*)vr.s, d0);
        } else {
            kvq_head<F>(sh + lh * head_dim, R, k_run, nullptr, (u8*)kr.q, (u16*)kr.s, d0);
        }
    }
}

template <bool NEOX, int F>
__device__ __forceinline__ void rope_kv(float* q, int n_head, const float* k, const float* v, int n_head_kv,
                                        const int* pos, const float* inv_freq, int head_dim, int n_rot,
                                        float pos_scale, u16* kpool, u16* vpool, const int* table, const int* tab,
                                        const float* bias) {
    __shared__ float cs[2][ROPE_MAX_HALF];
    __shared__ float stage[F == KV_F16 ? 1 : 2 * ROPE_STAGE];
    const int t = blockIdx.x;
    if (tab != nullptr) table += tab[t];
    const int half = n_rot / 2, slots = head_dim / 2;
    const int hpb = max(1, ROPE_THREADS / slots);
    const int p = pos[t];
    rope_table(cs, p, inv_freq, half, pos_scale);
    const long long row = kv_row(table, p) * n_head_kv * head_dim;
    const int h_end = min(n_head + n_head_kv, (blockIdx.y + 1) * hpb);
    for (int e = blockIdx.y * hpb * slots + threadIdx.x; e < h_end * slots; e += blockDim.x) {
        const int h = e / slots, i = e % slots;
        int a, b;
        if (i < half) {
            rope_pair<NEOX>(i, half, &a, &b);
        } else {
            a = n_rot + 2 * (i - half), b = a + 1;
        }
        // This head's bias (Q heads, then K heads; V's after them).
        const float* bh = bias ? bias + (long long)h * head_dim : nullptr;
        // Where a quantized format stages the head.
        float* sh = stage + (h - blockIdx.y * hpb) * head_dim;
        if (h < n_head) {
            float* xh = q + ((long long)t * n_head + h) * head_dim;
            if (F == KV_F16 && i >= half) {  // pass-through: biased only
                if (bh) xh[a] += bh[a], xh[b] += bh[b];
                continue;
            }
            float x0 = xh[a], x1 = xh[b];
            if (bh) x0 += bh[a], x1 += bh[b];
            if (i < half) {
                const float s = cs[0][i], c = cs[1][i];
                const float r0 = rope_rot0(x0, x1, s, c), r1 = rope_rot1(x0, x1, s, c);
                x0 = r0, x1 = r1;
            }
            float* dst = F == KV_F16 ? xh : sh;
            dst[a] = x0;
            dst[b] = x1;
        } else {
            const int kh = h - n_head;
            const long long src = ((long long)t * n_head_kv + kh) * head_dim;
            float x0 = k[src + a], x1 = k[src + b];
            float v0 = v[src + a], v1 = v[src + b];
            if (bh) {
                const float* bv = bh + (long long)n_head_kv * head_dim;
                x0 += bh[a], x1 += bh[b], v0 += bv[a], v1 += bv[b];
            }
            if (i < half) {
                const float s = cs[0][i], c = cs[1][i];
                const float r0 = rope_rot0(x0, x1, s, c), r1 = rope_rot1(x0, x1, s, c);
                x0 = r0, x1 = r1;
            }
            if (F == KV_F16) {
                const long long dst = row + (long long)kh * head_dim;
                kpool[dst + a] = f2h(x0);
                kpool[dst + b] = f2h(x1);
                vpool[dst + a] = f2h(v0);
                vpool[dst + b] = f2h(v1);
            } else {
                sh[a] = x0, sh[b] = x1;
                sh[ROPE_STAGE + a] = v0, sh[ROPE_STAGE + b] = v1;
            }
        }
    }
    if (F != KV_F16)
        rope_kv_quant_tail<F>(stage, stage + ROPE_STAGE, q, n_head, n_head_kv, head_dim, t, kpool, vpool, table, p,
                              hpb);
}

#define ROPE_KV_ARGS                                                                                         \
    float *q, int n_head, const float *k, const float *v, int n_head_kv, const int *pos, const float *inv_freq, \
        int head_dim, int n_rot, float pos_scale, u16 *kpool, u16 *vpool, const int *table
#define ROPE_KV_PASS q, n_head, k, v, n_head_kv, pos, inv_freq, head_dim, n_rot, pos_scale, kpool, vpool, table
// rope_kv_<style>_<format> (FP16 pages: _f32); bias: Q/K/V's biases or
// null (last). rope_kv_b_*: the same over tokens of different sequences:
// token t's block table starts at table[tab[t]] (a batched decode step).
#define ROPE_KV_KERNELS(SUFFIX, F)                                                                      \
    extern "C" __global__ void rope_kv_norm_##SUFFIX(ROPE_KV_ARGS, const float* bias) {                 \
        rope_kv<false, F>(ROPE_KV_PASS, nullptr, bias);                                                 \
    }                                                                                                   \
    extern "C" __global__ void rope_kv_neox_##SUFFIX(ROPE_KV_ARGS, const float* bias) {                 \
        rope_kv<true, F>(ROPE_KV_PASS, nullptr, bias);                                                  \
    }                                                                                                   \
    extern "C" __global__ void rope_kv_b_norm_##SUFFIX(ROPE_KV_ARGS, const int* tab, const float* bias) { \
        rope_kv<false, F>(ROPE_KV_PASS, tab, bias);                                                     \
    }                                                                                                   \
    extern "C" __global__ void rope_kv_b_neox_##SUFFIX(ROPE_KV_ARGS, const int* tab, const float* bias) { \
        rope_kv<true, F>(ROPE_KV_PASS, tab, bias);                                                      \
    }
ROPE_KV_KERNELS(f32, KV_F16)
ROPE_KV_KERNELS(q8_0, KV_Q8_0)
ROPE_KV_KERNELS(q4_0, KV_Q4_0)

// rope_kv with each query and key head RMS-normed first (qwen3, gemma3's
// attn_q_norm / attn_k_norm: x = x / sqrt(mean(x^2) + eps) * w over the
// head, then RoPE), in one launch instead of two norms and a RoPE. As
// rope_kv, each thread takes one pair of one head; a head's head_dim / 2
// threads are whole warps (head_dim a multiple of 64, at most 256: the
// launcher checks), so its sum of squares meets in shared memory. qn, kn:
// the query and key norm weights (head_dim each).
template <bool NEOX, int F>
__device__ __forceinline__ void rope_kv_qk_norm(float* q, int n_head, const float* k, const float* v, int n_head_kv,
                                                const int* pos, const float* inv_freq, int head_dim, int n_rot,
                                                float pos_scale, u16* kpool, u16* vpool, const int* table,
                                                const int* tab, const float* qn, const float* kn, float eps) {
    __shared__ float cs[2][ROPE_MAX_HALF];
    __shared__ float wsum[ROPE_THREADS / 32];
    __shared__ float stage[F == KV_F16 ? 1 : 2 * ROPE_STAGE];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (tab != nullptr) table += tab[t];
    const int half = n_rot / 2, slots = head_dim / 2;
    const int hpb = ROPE_THREADS / slots;  // slots: 32, 64 or 128
    const int p = pos[t];
    const int h = blockIdx.y * hpb + threadIdx.x / slots, i = threadIdx.x % slots;
    const bool active = h < n_head + n_head_kv;
    int a, b;
    if (i < half) {
        rope_pair<NEOX>(i, half, &a, &b);
    } else {
        a = n_rot + 2 * (i - half), b = a + 1;
    }
    const bool is_q = h < n_head;
    const int kh = h - n_head;
    float* xq = q + ((long long)t * n_head + h) * head_dim;
    const long long src = ((long long)t * n_head_kv + kh) * head_dim;
    // The pair (and a K head's pair of V) and the pool row are loaded
    // before the sin/cos table is computed: the two latencies overlap
    // (a decode step's launch is one round trip of each).
    float x0 = 0.0f, x1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
    if (active) {
        x0 = is_q ? xq[a] : k[src + a];
        x1 = is_q ? xq[b] : k[src + b];
        if (!is_q) v0 = v[src + a], v1 = v[src + b];
    }
    const long long row = kv_row(table, p) * n_head_kv * head_dim;
    rope_table(cs, p, inv_freq, half, pos_scale);
    const float ss = warp_sum(x0 * x0 + x1 * x1);
    if (lane == 0) wsum[warp] = ss;
    __syncthreads();
    if (active) {
        const int w0 = (threadIdx.x / slots) * (slots / 32);
        float tot = 0.0f;
        for (int w = 0; w < slots / 32; ++w) tot += wsum[w0 + w];
        const float sc = rsqrtf(tot / (float)head_dim + eps);
        const float* nw = is_q ? qn : kn;
        x0 = x0 * sc * nw[a];
        x1 = x1 * sc * nw[b];
        if (i < half) {
            const float s = cs[0][i], c = cs[1][i];
            const float r0 = rope_rot0(x0, x1, s, c), r1 = rope_rot1(x0, x1, s, c);
            x0 = r0, x1 = r1;
        }
        if (F != KV_F16) {
            float* sh = stage + (threadIdx.x / slots) * head_dim;
            sh[a] = x0, sh[b] = x1;
            if (!is_q) sh[ROPE_STAGE + a] = v0, sh[ROPE_STAGE + b] = v1;
        } else if (is_q) {
            xq[a] = x0;
            xq[b] = x1;
        } else {
            const long long dst = row + (long long)kh * head_dim;
            kpool[dst + a] = f2h(x0);
            kpool[dst + b] = f2h(x1);
            vpool[dst + a] = f2h(v0);
            vpool[dst + b] = f2h(v1);
        }
    }
    if (F != KV_F16)
        rope_kv_quant_tail<F>(stage, stage + ROPE_STAGE, q, n_head, n_head_kv, head_dim, t, kpool, vpool, table, p,
                              hpb);
}

#define ROPE_QKN_ARGS const float *qn, const float *kn, float eps
#define ROPE_QKN_KERNELS(SUFFIX, F)                                                                            \
    extern "C" __global__ void rope_kv_qkn_norm_##SUFFIX(ROPE_KV_ARGS, ROPE_QKN_ARGS) {                        \
        rope_kv_qk_norm<false, F>(ROPE_KV_PASS, nullptr, qn, kn, eps);                                         \
    }                                                                                                          \
    extern "C" __global__ void rope_kv_qkn_neox_##SUFFIX(ROPE_KV_ARGS, ROPE_QKN_ARGS) {                        \
        rope_kv_qk_norm<true, F>(ROPE_KV_PASS, nullptr, qn, kn, eps);                                          \
    }                                                                                                          \
    extern "C" __global__ void rope_kv_b_qkn_norm_##SUFFIX(ROPE_KV_ARGS, const int* tab, ROPE_QKN_ARGS) {      \
        rope_kv_qk_norm<false, F>(ROPE_KV_PASS, tab, qn, kn, eps);                                             \
    }                                                                                                          \
    extern "C" __global__ void rope_kv_b_qkn_neox_##SUFFIX(ROPE_KV_ARGS, const int* tab, ROPE_QKN_ARGS) {      \
        rope_kv_qk_norm<true, F>(ROPE_KV_PASS, tab, qn, kn, eps);                                              \
    }
ROPE_QKN_KERNELS(f32, KV_F16)
ROPE_QKN_KERNELS(q8_0, KV_Q8_0)
ROPE_QKN_KERNELS(q4_0, KV_Q4_0)
