// Token selection on the device: the sampling penalties, then the k highest
// logits of one row (sorted: logit descending, token id ascending on ties;
// k = 1 is argmax), so a decode step sends k candidates to the host instead
// of the whole vocabulary. The host finishes top-p, min-p, temperature and
// the seeded draw on those k (crates/m40-runtime/src/sampling.rs), in the
// same f64 arithmetic as the CPU path, so both pick the same token.
//
// Layout: logits (n_vocab) FP32, masked and penalized in place; args
// (SAMPLE_ARGS + 2 pen_cap) int32: n_pen, k, the bits of the FP32 repeat,
// frequency and presence penalties, masked (nonzero: the row's token mask
// applies), padding, then n_pen (id, count) pairs: distinct token ids and
// their counts in the penalty window. masks (mask_words a row, u32; none
// when mask_words is 0): a structured output's allowed tokens, bit i % 32
// of word i / 32; every other logit becomes -inf before anything else
// (the greedy path's blocks each mask their own slice). The arguments live in device
// memory so that a captured decode step selects with each step's own; the
// kernel clamps n_pen to 0 ..= pen_cap and k to 1 ..= k_cap (k_cap <=
// SAMPLE_MAX_K, n_vocab and out's length / 2, checked by the launcher).
// out (2k): the k ids, then the bits of their logits (one buffer: one copy
// to the host). Launch: grid (G, rows), G blocks a row (1 ..= SAMPLE_MAX_BLOCKS,
// the rows' blocks at most what the GPU holds at once), block
// SAMPLE_THREADS; scratch (SAMPLE_SCRATCH ints a row) zero before the first
// launch and left zero after each.
//
// Greedy without penalties (k = 1, n_pen = 0; what a benchmark and a
// temperature-0 request run): every block takes the argmax of its slice of
// the row, and the last block to finish (an arrival counter in scratch)
// takes the argmax of theirs: a row of 128k logits is one round trip per
// SM instead of 128 loads in a row by one block. Otherwise block 0 alone
// does the work below and the others return at once.
//
// How: the logits map to unsigned keys that order like floats (IEEE total
// order, as Rust's total_cmp). A radix select (4 passes of 8 bits, each a
// shared-memory histogram over the row) finds the key T of the k-th
// largest; when more tokens share T than are still needed, 3 more passes
// over the token ids of the ties find the lowest ids (the CPU's tie order).
// The k winners are gathered with a shared atomic counter and put in order
// by a bitonic sort in shared memory. One block: the row (512 KB for 128k
// tokens) stays in L2, and a few passes cost far less than copying it to
// the host.
//
// Penalties (llama.cpp's, as the CPU sampler): l > 0 ? l / repeat : l *
// repeat, then l -= count * freq + presence, with round-to-nearest
// intrinsics so the fast-math build does not fuse or approximate them.
//
// sample_draw_f32: the host's draw among a selection's candidates on the
// device (crates/m40-runtime/src/sampling `Sampler::sample_selected`, the
// reference), so a step's output can be a token id a row. Row r (a block
// of SAMPLE_THREADS) reads its DRAW_ARGS ints at r args_stride: k (clamped
// to 1 ..= k_cap), then the bits of the temperature, top-p and min-p
// (FP32); its candidates from sel at r 2 k_cap (select_top_k_rows's out:
// k ids, then the bits of their logits, best first); its SplitMix64 state
// from rng[r], advanced once a draw and written back. Temperature <= 0:
// the first candidate, the state untouched. Else, as the host: tokens a
// mask made -inf dropped while any other is left; top-p (< 1), then min-p
// (> 0) on the softmax of the logits; the logits divided by the
// temperature; a uniform u of the state's next 53 bits; the first
// candidate whose cumulative probability exceeds u (else the last). The
// same arithmetic as the host's: FP32 subtractions and divisions of the
// logits, their exponentials and every sum, quotient and comparison in
// FP64, the sums in candidate order by one thread (round-to-nearest
// intrinsics: the fast-math build neither fuses nor approximates them).
// Only the FP64 exponential may differ from the host's libm in its last
// bit, which moves a draw only where u or a cutoff lands that close to a
// boundary. tokens[r] gets the id.
#include "common.cuh"
#include "quant.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_MAX_K 1024
#define SAMPLE_ARGS 8
#define SAMPLE_MAX_BLOCKS 256
// scratch: SAMPLE_MAX_BLOCKS (logit bits, id) pairs, then the arrival
// counter on a line of its own.
#define SAMPLE_SCRATCH (2 * SAMPLE_MAX_BLOCKS + 32)

__device__ __forceinline__ u32 order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Warp 0: the bin where the running count, over bins in the order bin(0),
// bin(1), ..., reaches `need`; returns it and leaves in *need what is still
// needed inside it. order(i) maps step i to a bin (descending or ascending).
template <bool DESC>
__device__ __forceinline__ void find_bin(const u32* hist, u32* need, u32* bin, u32* bin_count) {
    const int lane = threadIdx.x & 31;
    u32 c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int b = DESC ? 255 - 8 * lane - j : 8 * lane + j;
        c[j] = hist[b];
        sum += c[j];
    }
    u32 incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    const u32 excl = incl - sum, n = *need;
    const u32 hit = __ballot_sync(0xffffffffu, excl < n && incl >= n);
    if (lane == __ffs(hit) - 1) {
        u32 cum = excl;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (cum + c[j] >= n) {
                *bin = DESC ? 255 - 8 * lane - j : 8 * lane + j;
                *need = n - cum;
                *bin_count = c[j];
                break;
            }
            cum += c[j];
        }
    }
}

// f(i, logits[i]) for the block's share of logits[..n], SAMPLE_U loads
// issued before any is used (one block walks the whole row: latency, not
// bandwidth, is its cost), each thread's indices in ascending order.
#define SAMPLE_U 8
template <class F>
__device__ __forceinline__ void for_each_logit(const float* logits, int n, F f) {
    for (int i0 = threadIdx.x; i0 < n; i0 += SAMPLE_U * blockDim.x) {
        float v[SAMPLE_U];
#pragma unroll
        for (int u = 0; u < SAMPLE_U; ++u) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < n ? logits[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < SAMPLE_U; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < n) f(i, v[u]);
        }
    }
}

// The better of two (logit, id) candidates: the larger logit, the smaller
// id on ties (NaN never wins: it compares false).
__device__ __forceinline__ void argmax_merge(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

// The block's best (bv, bi) over its threads' candidates; the result in
// thread 0. red_v, red_i: 32 each.
__device__ __forceinline__ void argmax_block(float& bv, int& bi, float* red_v, int* red_i) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if ((tid & 31) == 0) red_v[tid >> 5] = bv, red_i[tid >> 5] = bi;
    __syncthreads();
    if (tid < 32) {
        const int nw = blockDim.x >> 5;
        bv = tid < nw ? red_v[tid] : __int_as_float(0xff800000);
        bi = tid < nw ? red_i[tid] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            argmax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    }
}

// out[0] = the argmax id (0 when no logit beats -inf: bi = n_vocab), out[1]
// its logit's bits.
__device__ __forceinline__ void argmax_out(const float* logits, int n_vocab, int bi, int* out) {
    const int id = bi >= n_vocab ? 0 : bi;
    out[0] = id;
    out[1] = __float_as_int(logits[id]);
}

// logits[lo..hi) of the tokens `mask` does not allow become -inf (the
// block's threads; a warp's 32 tokens share one mask word).
__device__ __forceinline__ void mask_logits(float* logits, const u32* mask, int lo, int hi) {
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
        if (!((mask[i >> 5] >> (i & 31)) & 1u)) logits[i] = __int_as_float(0xff800000);
    __syncthreads();
}

// One row's selection (the kernel below): block bx of gx; mask null when
// the row has none.
__device__ __forceinline__ void select_row(float* logits, int n_vocab, const int* args, int pen_cap, int k_cap,
                                           const u32* mask, int* out, int* scratch, int bx, int gx) {
    __shared__ u32 hist[256];
    __shared__ u32 s_need, s_bin, s_count, s_n;
    __shared__ u32 cand_key[SAMPLE_MAX_K];
    __shared__ int cand_id[SAMPLE_MAX_K];
    __shared__ float red_v[32];
    __shared__ int red_i[32];
    const int tid = threadIdx.x;
    const int n_pen = min(max(args[0], 0), pen_cap), k = min(max(args[1], 1), k_cap);
    const float repeat = __int_as_float(args[2]), freq = __int_as_float(args[3]),
                presence = __int_as_float(args[4]);
    const int* pen = args + SAMPLE_ARGS;

    if (k == 1 && n_pen == 0) {
        // Block b's slice: logits [b * chunk, (b + 1) * chunk).
        const int chunk = (n_vocab + gx - 1) / gx, lo = bx * chunk;
        if (mask) mask_logits(logits, mask, lo, min(lo + chunk, n_vocab));
        float bv = __int_as_float(0xff800000);
        int bi = n_vocab;
        for_each_logit(logits + lo, max(min(n_vocab - lo, chunk), 0), [&](int i, float v) {
            if (v > bv) bv = v, bi = lo + i;
        });
        argmax_block(bv, bi, red_v, red_i);
        __shared__ bool last;
        if (tid == 0) {
            scratch[2 * bx] = __float_as_int(bv);
            scratch[2 * bx + 1] = bi;
            __threadfence();  // the pair is visible before the arrival
            last = atomicAdd((unsigned*)scratch + 2 * SAMPLE_MAX_BLOCKS, 1u) == gx - 1;
        }
        __syncthreads();
        if (!last) return;
        // The last block: every other block's pair is out (its fence came
        // before its arrival); volatile loads, never a stale line.
        __threadfence();
        bv = __int_as_float(0xff800000), bi = n_vocab;
        if (tid < gx)
            bv = __int_as_float(((volatile int*)scratch)[2 * tid]), bi = ((volatile int*)scratch)[2 * tid + 1];
        argmax_block(bv, bi, red_v, red_i);
        if (tid == 0) {
            argmax_out(logits, n_vocab, bi, out);
            scratch[2 * SAMPLE_MAX_BLOCKS] = 0;  // for the next launch (stream-ordered)
        }
        return;
    }
    if (bx > 0) return;
    if (mask) mask_logits(logits, mask, 0, n_vocab);

    for (int i = tid; i < n_pen; i += blockDim.x) {
        const int id = pen[2 * i], c = pen[2 * i + 1];
        if (id >= 0 && id < n_vocab) {
            float l = logits[id];
            l = l > 0.0f ? __fdiv_rn(l, repeat) : __fmul_rn(l, repeat);
            logits[id] = __fsub_rn(l, __fadd_rn(__fmul_rn((float)c, freq), presence));
        }
    }
    __syncthreads();

    if (k == 1) {
        // Argmax, the first index on ties; NaN never wins, all -inf gives 0.
        float bv = __int_as_float(0xff800000);
        int bi = n_vocab;
        for_each_logit(logits, n_vocab, [&](int i, float v) {
            if (v > bv) bv = v, bi = i;
        });
        argmax_block(bv, bi, red_v, red_i);
        if (tid == 0) argmax_out(logits, n_vocab, bi, out);
        return;
    }

    // The key T of the k-th largest logit.
    if (tid == 0) s_need = k;
    u32 prefix = 0, kmask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for_each_logit(logits, n_vocab, [&](int, float v) {
            const u32 key = order_key(v);
            if ((key & kmask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        });
        __syncthreads();
        if (tid < 32) find_bin<true>(hist, &s_need, &s_bin, &s_count);
        __syncthreads();
        prefix |= s_bin << shift;
        kmask |= 255u << shift;
        __syncthreads();
    }
    const u32 T = prefix;
    // Ties at T: take the s_need lowest ids (the need-th smallest id I).
    u32 I = 0xffffffffu;
    if (s_need < s_count) {
        u32 ip = 0, imask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for_each_logit(logits, n_vocab, [&](int i, float v) {
                if (order_key(v) == T && ((u32)i & imask) == ip) atomicAdd(&hist[((u32)i >> shift) & 255], 1u);
            });
            __syncthreads();
            if (tid < 32) find_bin<false>(hist, &s_need, &s_bin, &s_count);
            __syncthreads();
            ip |= s_bin << shift;
            imask |= 255u << shift;
            __syncthreads();
        }
        I = ip;
    }

    // Gather the k winners (any order), pad to SAMPLE_MAX_K, sort.
    if (tid == 0) s_n = 0;
    for (int i = tid; i < SAMPLE_MAX_K; i += blockDim.x) cand_key[i] = 0, cand_id[i] = 0x7fffffff;
    __syncthreads();
    for_each_logit(logits, n_vocab, [&](int i, float v) {
        const u32 key = order_key(v);
        if (key > T || (key == T && (u32)i <= I)) {
            const u32 slot = atomicAdd(&s_n, 1u);
            if (slot < SAMPLE_MAX_K) cand_key[slot] = key, cand_id[slot] = i;
        }
    });
    __syncthreads();
    // Bitonic sort: "before" = larger key, then smaller id.
    for (int size = 2; size <= SAMPLE_MAX_K; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < SAMPLE_MAX_K; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const u32 ki = cand_key[i], kj = cand_key[j];
                    const int ii = cand_id[i], ij = cand_id[j];
                    const bool j_first = kj > ki || (kj == ki && ij < ii);
                    // Blocks of `size` alternate direction; the last pass is all "before first".
                    const bool up = (i & size) == 0;
                    if (j_first == up) {
                        cand_key[i] = kj, cand_key[j] = ki;
                        cand_id[i] = ij, cand_id[j] = ii;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int t = tid; t < k; t += blockDim.x) {
        out[t] = cand_id[t];
        out[k + t] = __float_as_int(logits[cand_id[t]]);
    }
}

// select_top_k_rows_f32: the selection of rows at once (one: a decode
// step; a batched decode step's sequences, each with its own penalties and
// k): grid (G, rows), row r = blockIdx.y
// takes logits row r (r * n_vocab on), its arguments at r * args_stride,
// its out at r * 2 k_cap (its k ids, then their logits' bits), its
// scratch at r * SAMPLE_SCRATCH (zero before, left zero after) and, where
// its arguments say masked, its mask at r * mask_words.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
    select_top_k_rows_f32(float* logits, int n_vocab, const int* args, int args_stride, int pen_cap, int k_cap,
                          const u32* masks, int mask_words, int* out, int* scratch) {
    const long long r = blockIdx.y;
    const int* a = args + r * args_stride;
    const u32* mask = mask_words > 0 && a[5] != 0 ? masks + r * mask_words : nullptr;
    select_row(logits + r * n_vocab, n_vocab, a, pen_cap, k_cap, mask, out + r * 2 * k_cap,
               scratch + r * SAMPLE_SCRATCH, blockIdx.x, gridDim.x);
}

#define DRAW_ARGS 4

// SplitMix64: the host sampler's generator (its next_u64).
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long* state) {
    unsigned long long z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The sum of e[0 .. n - 1] in order (one thread).
__device__ __forceinline__ double draw_sum(const double* e, int n) {
    double s = 0.0;
    for (int j = 0; j < n; ++j) s = __dadd_rn(s, e[j]);
    return s;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
    sample_draw_f32(const int* sel, int k_cap, const int* args, int args_stride, unsigned long long* rng,
                    int* tokens) {
    __shared__ double e[SAMPLE_MAX_K];
    __shared__ int live;
    const int r = blockIdx.x, i = threadIdx.x;
    const int* a = args + (long long)r * args_stride;
    const int k = min(max(a[0], 1), k_cap);
    const float temp = __int_as_float(a[1]), top_p = __int_as_float(a[2]), min_p = __int_as_float(a[3]);
    const int* ids = sel + (long long)r * 2 * k_cap;
    const float* lg = (const float*)(ids + k);
    if (temp <= 0.0f) {
        if (i == 0) tokens[r] = ids[0];
        return;
    }
    const float neg_inf = __int_as_float(0xff800000);
    if (i == 0) live = k;
    __syncthreads();
    // Sorted best first: the one -inf after a finite logit ends the live ones.
    const float l = i < k ? lg[i] : 0.0f;
    if (k > 1 && lg[0] > neg_inf && i > 0 && i < k && !(l > neg_inf) && lg[i - 1] > neg_inf) live = i;
    __syncthreads();
    const float mx = lg[0];
    if (i < live) e[i] = exp((double)__fsub_rn(l, mx));
    __syncthreads();
    if (i == 0) {
        int n = live;
        if (top_p < 1.0f) {
            const double s = draw_sum(e, n);
            double cum = 0.0;
            int keep = n;
            for (int j = 0; j < n; ++j) {
                cum = __dadd_rn(cum, __ddiv_rn(e[j], s));
                if (cum >= (double)top_p) {
                    keep = j + 1;
                    break;
                }
            }
            n = max(keep, 1);
        }
        if (min_p > 0.0f) {
            const double s = draw_sum(e, n), bar = __dmul_rn(__ddiv_rn(e[0], s), (double)min_p);
            int keep = 0;
            while (keep < n && __ddiv_rn(e[keep], s) >= bar) ++keep;
            n = max(keep, 1);
        }
        live = n;
    }
    __syncthreads();
    const int n = live;
    if (i < n) e[i] = exp((double)__fsub_rn(__fdiv_rn(l, temp), __fdiv_rn(mx, temp)));
    __syncthreads();
    if (i == 0) {
        const double s = draw_sum(e, n);
        unsigned long long state = rng[r];
        const double u = __ddiv_rn((double)(splitmix64(&state) >> 11), 9007199254740992.0);
        rng[r] = state;
        double cum = 0.0;
        int pick = n - 1;
        for (int j = 0; j < n; ++j) {
            cum = __dadd_rn(cum, __ddiv_rn(e[j], s));
            if (u < cum) {
                pick = j;
                break;
            }
        }
        tokens[r] = ids[pick];
    }
}
