// Mixture-of-experts routing and combining (qwen3moe, Mixtral), as
// llama.cpp's build_moe_ffn computes them; the experts' GEMVs are
// gemv_id_<fmt>_f32 (gemv.cu).
//
// moe_route_f32: one warp per token of n: softmax over the E router
// logits (row t of logits, plus bias where not null: gpt-oss), the K most probable experts (ties: the lower
// index) into ids (n, K) in that order, and their probabilities divided by
// their sum (at least 6.1035e-5, as llama.cpp clamps) into w (n, K). Lane l
// holds experts l, l + 32, ... (E <= 32 * MOE_MAX_PER_LANE). Block 32 *
// MOE_WARPS threads, grid ceil(n / MOE_WARPS).
//
// moe_router_f32: y (rows) = W x for one token through an F32 router of
// few rows (W (rows, ncols) row-major, ncols a multiple of 4, W and x
// 16-byte aligned): a block of MOE_ROUTER_THREADS per row, every thread's
// float4 loads of W and x issued before its first FMA, a fixed-order block
// sum. The GEMV of GGUF rows gives such a matrix 8 blocks walking each row
// in 3 rounds of chunks (qwen3moe's 128 x 2048, gpt-oss's 32 x 2880).
// Where nw is not null, x is the residual and the router reads the FFN
// norm's h = rmsnorm(x) * nw (epsilon eps), computed by every block (a pass
// over x for the sum of squares first) and written to h by block 0 for the
// experts (one launch fewer). Where done is not null (a counter, zero
// before the launch and left zero), the block that finishes last routes the
// token as moe_route_f32 does (bias, ids, wts, K; E = rows): another launch
// fewer.
//
// moe_router_n_f32: y (n, rows) = x W^T for n tokens through such a router
// (no norm, no routing: a step of several tokens norms before and routes
// after, moe_route_f32): block (r, c) row r for tokens c T .. min(n, (c +
// 1) T) - 1, T = MOE_ROUTER_TOKENS, each of its float4s of W loaded once for
// them; each token's sum in moe_router_f32's order of float4s and block
// sum. The GEMM of GGUF rows gives a router of 128 rows and 4 tokens two
// blocks that walk all of it (61% of a qwen3moe step of 4 tokens, H100).
//
// moe_glu_f32: g (rows, width) = glu_act(act, g + gb[e], u + ub[e]), e =
// ids[r] the expert of row r (a (token, slot) of n K): gpt-oss's gate and
// up biases (gb, ub (E, width)) and its activation, where the experts'
// gate and up are not interleaved. Grid-stride over rows * width.
//
// moe_glu_pairs_f32: out (rows, 2 half) = glu_act(act, gate + gb, up + ub)
// of gu (rows, 4 half) in the packed gate/up stack's order (per 4 columns
// gate 2i, 2i + 1, up 2i, 2i + 1: elementwise.cu glu_pairs_f32), the
// biases b (E, 4 half) of row r's expert ids[r] (clamped into 0 .. E - 1)
// in the same order: gpt-oss
// after the grouped GEMMs (gemm.cu gemm_grp). Grid-stride over the n =
// rows half pairs.
//
// moe_combine_f32: out (n, d) = sum over j < K of w[t, j] y[t K + j] (y:
// (n K, d), a slot's expert output, plus b[ids[t K + j]] where b (E, d) is
// not null: gpt-oss's down biases), in slot order, each product rounded
// and added (no contraction): the CPU's arithmetic. Grid-stride over n d.
//
// moe_combine_fold_f32: one token's moe_combine_f32 (the same sums, slots
// 0 .. K - 1) added to the residual row x (d) in place, and the RMSNorm
// that follows folded into the GEMVs after it (gemv_packed.cuh's FOLD_EMIT
// half): h = x * nw and, per block, the sum of its elements' x^2 to
// part[blockIdx.x]. The next layer's attention norm then runs no launch of
// its own. An element a thread, MOE_FOLD_THREADS a block.
//
// moe_gather_f32: y (rows, d) row r = x row idx[r] / div (clamped into
// x's src_rows rows): a prefill's slots gathered by expert (div K: each
// slot reads its token's row) and their outputs put back in slot order
// (div 1, the inverse order). Grid-stride over rows d.
//
// moe_tiles_i32: a step's slots grouped by expert on the device for the
// grouped GEMVs (gemv_packed.cu gemv_packed_grp, cap 8) and GEMMs (gemm.cu
// gemm_grp, cap 32 or 64): ids (slots) the slots'
// experts (clamped into 0 .. E - 1); order (slots) gets the slots sorted by
// expert, stable (slot order within an expert, so the same routing gives
// the same tiles); tiles[0] the number of tiles, tile i at tiles[1 + 2 i]
// (its first sorted position) and tiles[2 + 2 i] (its slots): each
// expert's c slots in ceil(c / cap) tiles as equal as can be (cap 8, 9
// slots: 5 and 4), the tiles of two or more slots first, then the experts
// of one.
// Where seen is not null, the number of experts with a slot is added to
// *seen (how many experts' weights the step reads: `m40-llm bench`).
// One block of MOE_TILES_THREADS, E <= MOE_TILES_THREADS: thread (e, p)
// counts and places expert e's slots in part p of the slots (P =
// MOE_TILES_THREADS / E parts, each ceil(slots / P) long), so a
// thread reads slots / P ids twice.
#include "common.cuh"

#define MOE_WARPS 4
#define MOE_MAX_PER_LANE 32

// Router logit e of a token (row l), biased where the model has one.
#define MOE_LOGIT(e) (bias ? __fadd_rn(l[e], bias[e]) : l[e])

// One token's routing by one warp (lane: its lane): its E logits l (global
// or shared memory), the K chosen experts' ids and weights to ids[..K] and
// w[..K] (moe_route_f32 above).
__device__ __forceinline__ void moe_route_token(const float* l, const float* bias, int* ids, float* w, int E, int K,
                                                int lane) {
    float mx = __int_as_float(0xff800000);  // -inf
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, MOE_LOGIT(e));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(MOE_LOGIT(e) - mx);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    unsigned taken = 0u;  // bit i: expert lane + 32 i is chosen
    float chosen = 0.0f;  // lane 0: the sum of the chosen probabilities
    for (int k = 0; k < K; ++k) {
        float best = -1.0f;
        int bi = 0x7fffffff;
        for (int i = 0, e = lane; e < E; ++i, e += 32) {
            const float p = expf(MOE_LOGIT(e) - mx) * inv;
            if (!(taken >> i & 1u) && p > best) best = p, bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[k] = bi;
            w[k] = best;
            chosen += best;
        }
    }
    __syncwarp();
    if (lane == 0) {
        const float s = fmaxf(chosen, 6.103515625e-5f);
        for (int k = 0; k < K; ++k) w[k] /= s;
    }
}

extern "C" __global__ void moe_route_f32(const float* logits, const float* bias, int* ids, float* w, int n, int E,
                                         int K) {
    const int lane = threadIdx.x & 31, t = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (t >= n) return;
    moe_route_token(logits + (long long)t * E, bias, ids + (long long)t * K, w + (long long)t * K, E, K, lane);
}

extern "C" __global__ void moe_combine_f32(const float* y, const float* w, const int* ids, const float* b, float* out,
                                           long long nd, int d, int K) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nd; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / d, c = i % d;
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) {
            const long long s = t * K + j;
            const float v = b ? __fadd_rn(y[s * d + c], b[(long long)ids[s] * d + c]) : y[s * d + c];
            acc = __fadd_rn(acc, __fmul_rn(w[s], v));
        }
        out[i] = acc;
    }
}

extern "C" __global__ void moe_gather_f32(const float* x, const int* idx, float* y, long long nd, int d, int div,
                                          int src_rows) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nd; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / d, c = i % d;
        const int s = min(max(idx[r] / div, 0), src_rows - 1);
        y[i] = x[(long long)s * d + c];
    }
}

extern "C" __global__ void moe_glu_f32(float* g, const float* u, const int* ids, const float* gb, const float* ub,
                                       long long n, int width, int act) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long o = (long long)ids[i / width] * width + i % width;
        g[i] = glu_act(act, __fadd_rn(g[i], gb[o]), __fadd_rn(u[i], ub[o]));
    }
}

extern "C" __global__ void moe_glu_pairs_f32(const float* gu, float* out, const int* ids, const float* b, int E,
                                             long long n, int half, int act) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int e = min(max(ids[i / half], 0), E - 1);
        const float4 bb = ((const float4*)b)[(long long)e * half + i % half];
        const float2 g = ((const float2*)gu)[2 * i], u = ((const float2*)gu)[2 * i + 1];
        ((float2*)out)[i] = make_float2(glu_act(act, __fadd_rn(g.x, bb.x), __fadd_rn(u.x, bb.z)),
                                        glu_act(act, __fadd_rn(g.y, bb.y), __fadd_rn(u.y, bb.w)));
    }
}

#define MOE_FOLD_THREADS 256

extern "C" __global__ void __launch_bounds__(MOE_FOLD_THREADS)
    moe_combine_fold_f32(const float* y, const float* w, const int* ids, const float* b, float* x, const float* nw,
                         float* h, float* part, int d, int K) {
    __shared__ float scratch[32];
    const int c = blockIdx.x * MOE_FOLD_THREADS + threadIdx.x;
    float sq = 0.0f;
    if (c < d) {
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) {
            const float v = b ? __fadd_rn(y[(long long)j * d + c], b[(long long)ids[j] * d + c]) : y[(long long)j * d + c];
            acc = __fadd_rn(acc, __fmul_rn(w[j], v));
        }
        const float xn = __fadd_rn(x[c], acc);
        x[c] = xn;
        h[c] = __fmul_rn(xn, nw[c]);
        sq = __fmul_rn(xn, xn);
    }
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) part[blockIdx.x] = sq;
}

#define MOE_ROUTER_THREADS 128
#define MOE_ROUTER_U 8
#define MOE_ROUTER_MAX_ROWS 1024

extern "C" __global__ void __launch_bounds__(MOE_ROUTER_THREADS)
    moe_router_f32(const float* W, const float* x, float* y, int ncols, const float* nw, float eps, float* h,
                   unsigned* done, const float* bias, int* ids, float* wts, int K) {
    __shared__ float scratch[32];
    __shared__ float sl[MOE_ROUTER_MAX_ROWS];
    __shared__ int last;
    const float4* w4 = (const float4*)(W + (long long)blockIdx.x * ncols);
    const float4* x4 = (const float4*)x;
    const float4* n4 = (const float4*)nw;
    const int m = ncols / 4;
    // With nw, x is the residual: the RMS scale of the norm first.
    float s = 1.0f;
    if (nw) {
        float ss = 0.0f;
        for (int i0 = threadIdx.x; i0 < m; i0 += MOE_ROUTER_U * MOE_ROUTER_THREADS) {
            float4 b[MOE_ROUTER_U];
#pragma unroll
            for (int u = 0; u < MOE_ROUTER_U; ++u) {
                const int i = i0 + u * MOE_ROUTER_THREADS;
                b[u] = i < m ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < MOE_ROUTER_U; ++u)
                ss += b[u].x * b[u].x + b[u].y * b[u].y + b[u].z * b[u].z + b[u].w * b[u].w;
        }
        s = rsqrtf(block_sum(ss, scratch) / (float)ncols + eps);
    }
    float acc = 0.0f;
    for (int i0 = threadIdx.x; i0 < m; i0 += MOE_ROUTER_U * MOE_ROUTER_THREADS) {
        float4 a[MOE_ROUTER_U], b[MOE_ROUTER_U];
#pragma unroll
        for (int u = 0; u < MOE_ROUTER_U; ++u) {
            const int i = i0 + u * MOE_ROUTER_THREADS;
            a[u] = i < m ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            b[u] = i < m ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        if (nw) {
#pragma unroll
            for (int u = 0; u < MOE_ROUTER_U; ++u) {
                const int i = i0 + u * MOE_ROUTER_THREADS;
                if (i < m) {
                    b[u] = scale_mul(b[u], s, n4[i]);
                    if (blockIdx.x == 0) ((float4*)h)[i] = b[u];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < MOE_ROUTER_U; ++u)
            acc += a[u].x * b[u].x + a[u].y * b[u].y + a[u].z * b[u].z + a[u].w * b[u].w;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) y[blockIdx.x] = acc;
    if (done == nullptr) return;
    // The last block to finish routes (its logits from L2: other blocks'
    // writes, fenced before their count) and leaves the counter at zero.
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = threadIdx.x; e < (int)gridDim.x; e += blockDim.x) sl[e] = __ldcg(y + e);
    __syncthreads();
    if (threadIdx.x < 32) moe_route_token(sl, bias, ids, wts, gridDim.x, K, threadIdx.x);
    if (threadIdx.x == 0) *done = 0u;
}

#define MOE_ROUTER_TOKENS 8

extern "C" __global__ void __launch_bounds__(MOE_ROUTER_THREADS)
    moe_router_n_f32(const float* W, const float* x, float* y, int ncols, int n) {
    constexpr int T = MOE_ROUTER_TOKENS, WARPS = MOE_ROUTER_THREADS / 32;
    __shared__ float part[T][WARPS];
    const int t0 = blockIdx.y * T, mt = min(T, n - t0), m = ncols / 4;
    const float4* w4 = (const float4*)(W + (long long)blockIdx.x * ncols);
    const float4* x4 = (const float4*)(x + (long long)t0 * ncols);
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; ++t) acc[t] = 0.0f;
    for (int i0 = threadIdx.x; i0 < m; i0 += MOE_ROUTER_U * MOE_ROUTER_THREADS) {
        float4 a[MOE_ROUTER_U];
#pragma unroll
        for (int u = 0; u < MOE_ROUTER_U; ++u) {
            const int i = i0 + u * MOE_ROUTER_THREADS;
            a[u] = i < m ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t >= mt) break;
            float4 b[MOE_ROUTER_U];
#pragma unroll
            for (int u = 0; u < MOE_ROUTER_U; ++u) {
                const int i = i0 + u * MOE_ROUTER_THREADS;
                b[u] = i < m ? x4[(long long)t * m + i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < MOE_ROUTER_U; ++u)
                acc[t] += a[u].x * b[u].x + a[u].y * b[u].y + a[u].z * b[u].z + a[u].w * b[u].w;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) part[t][warp] = v;
    }
    __syncthreads();
    // Warp t sums token t's warps as block_sum does (lanes past WARPS 0).
    for (int t = warp; t < mt; t += WARPS) {
        const float v = warp_sum(lane < WARPS ? part[t][lane] : 0.0f);
        if (lane == 0) y[(long long)(t0 + t) * gridDim.x + blockIdx.x] = v;
    }
}

#define MOE_TILES_THREADS 1024

// Inclusive sums over v[0 .. n - 1] in place by warp 0 (lane: its lane),
// two counts a value (x: tiles of two or more slots, y: single slots).
__device__ __forceinline__ void moe_scan2(int2* v, int n, int lane) {
    int2 carry = make_int2(0, 0);
    for (int b = 0; b < n; b += 32) {
        int2 a = b + lane < n ? v[b + lane] : make_int2(0, 0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int ox = __shfl_up_sync(0xffffffffu, a.x, o), oy = __shfl_up_sync(0xffffffffu, a.y, o);
            if (lane >= o) a.x += ox, a.y += oy;
        }
        a.x += carry.x, a.y += carry.y;
        if (b + lane < n) v[b + lane] = a;
        carry.x = __shfl_sync(0xffffffffu, a.x, 31), carry.y = __shfl_sync(0xffffffffu, a.y, 31);
    }
}

extern "C" __global__ void __launch_bounds__(MOE_TILES_THREADS)
    moe_tiles_i32(const int* ids, int* order, int* tiles, int slots, int E, int cap, unsigned long long* seen) {
    __shared__ int cnt[MOE_TILES_THREADS];  // [part][expert]: counts, then where each part starts
    __shared__ int off[MOE_TILES_THREADS + 1];  // each expert's first sorted position
    __shared__ int2 nt[MOE_TILES_THREADS];      // each expert's tiles (of 2+, of 1), then their inclusive sums
    const int parts = MOE_TILES_THREADS / E, tid = threadIdx.x;
    __shared__ int active;  // experts with a slot
    if (tid == 0) active = 0;
    const int e = tid % E, p = tid / E, len = (slots + parts - 1) / parts;
    const int lo = min(p * len, slots), hi = min(lo + len, slots);
    const bool mine = p < parts;
    int c = 0;
    if (mine)
        for (int j = lo; j < hi; ++j) c += min(max(ids[j], 0), E - 1) == e;
    if (mine) cnt[p * E + e] = c;
    __syncthreads();
    // Thread e < E: its expert's parts' starts (relative), total and tiles.
    if (tid < E) {
        int t = 0;
        for (int q = 0; q < parts; ++q) {
            const int v = cnt[q * E + tid];
            cnt[q * E + tid] = t;
            t += v;
        }
        off[tid + 1] = t;
        if (t > 0) atomicAdd(&active, 1);
        const int n = (t + cap - 1) / cap;
        nt[tid] = t >= 2 ? make_int2(n, 0) : make_int2(0, t);
    }
    __syncthreads();
    if (tid < 32) {
        // The experts' first positions (off: counts to inclusive sums) and
        // their tiles' indices.
        int carry = 0;
        for (int b = 0; b < E; b += 32) {
            int a = b + tid < E ? off[b + tid + 1] : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, a, o);
                if (tid >= o) a += v;
            }
            a += carry;
            if (b + tid < E) off[b + tid + 1] = a;
            carry = __shfl_sync(0xffffffffu, a, 31);
        }
        if (tid == 0) off[0] = 0;
        moe_scan2(nt, E, tid);
    }
    __syncthreads();
    if (mine) {
        int at = off[e] + cnt[p * E + e];
        for (int j = lo; j < hi; ++j)
            if (min(max(ids[j], 0), E - 1) == e) order[at++] = j;
    }
    if (tid < E) {
        const int2 last = nt[E - 1], incl = nt[tid];
        const int first = off[tid], total = off[tid + 1] - first;
        if (tid == 0) tiles[0] = last.x + last.y;
        if (tid == 0 && seen != nullptr) atomicAdd(seen, (unsigned long long)active);
        if (total == 1) {
            const int i = last.x + incl.y - 1;  // after every tile of two or more
            tiles[1 + 2 * i] = first, tiles[2 + 2 * i] = 1;
        } else if (total >= 2) {
            const int n = (total + cap - 1) / cap, base = total / n, extra = total % n;
            int i = incl.x - n, at = first;
            for (int k = 0; k < n; ++k, ++i) {
                const int m = base + (k < extra);
                tiles[1 + 2 * i] = at, tiles[2 + 2 * i] = m;
                at += m;
            }
        }
    }
}
