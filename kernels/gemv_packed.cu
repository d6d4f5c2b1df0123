// GEMV over weights repacked at upload: y[r] = sum_c W[r, c] * x[c], x and y
// FP32, accumulation FP32.
//
// The packed layout (crates/m40-kernels/src/pack.rs writes it, same bytes as
// the GGUF rows): rows in groups of 4 (a partial last group is padded with
// zero rows), and for each group and format block b:
// - the quants of the block's four eighths (q = 0..3, the 8 weights that
//   quant.cuh's `x8` pairs with x), each eighth the 4 rows' bytes side by
//   side: one lane loads a whole eighth of all 4 rows with 16-byte loads,
//   straight into the registers it decodes from;
// - the block's scales, 4 rows side by side, in a second plane after all
//   the quants (one 8-byte load serves the 4 lanes of a block).
// quants: [group][block][eighth][row][QB bytes], QB = 4 (Q4_0) or 8 (Q8_0);
// scales: [group][block][row][2 bytes].
//
// Why: the GGUF blocks (18, 34 bytes) are not 16-byte aligned, so the
// row-major kernels (gemv.cu) stage chunks through shared memory and decode
// from there; on an H100 they stay latency-bound at ~50% of the read
// bandwidth for Q4_0 (BENCHMARKS.md). Here nothing is staged: every weight
// byte is loaded once into the register that decodes it, x is loaded once
// per 4 rows, and a warp keeps U items of loads in flight.
//
// Launch: block 32 * PGEMV_WARPS; grid ceil(groups / (PGEMV_WARPS / ksplit)).
// Warp w of a block takes group blockIdx.x * (PGEMV_WARPS / ksplit) +
// w / ksplit and every ksplit-th run of 8 blocks of it (lane: eighth lane & 3
// of block lane >> 2 of the run); the ksplit partial sums of a group meet in
// shared memory, added in a fixed order.
#include "common.cuh"
#include "quant.cuh"

#ifndef PGEMV_U4
#define PGEMV_U4 8
#endif

#define PGEMV_WARPS 4

// A block's scales for the 4 rows of a group: SB bytes per row (0: none).
template <int SB> struct Scales;
template <> struct Scales<0> {
    struct T {};
    __device__ static T load(const u8*, long long) { return T{}; }
};
template <> struct Scales<2> {
    typedef uint2 T;  // row j: f16 d in half j
    __device__ static T load(const u8* p, long long i) { return __ldcs((const uint2*)p + i); }
};
template <> struct Scales<4> {
    typedef uint4 T;  // row j: word j, f16 d | f16 m << 16
    __device__ static T load(const u8* p, long long i) { return __ldcs((const uint4*)p + i); }
};

__device__ __forceinline__ float lo_half(u32 w) { return h2f((u16)w); }
__device__ __forceinline__ float hi_half(u32 w) { return h2f((u16)(w >> 16)); }

// Each format: QV 16-byte vectors of quants per lane and block (an eighth
// of 4 rows), SB scale bytes per row and block, U blocks of loads in flight
// per lane, and dot(), which adds the 4 rows' sums over the eighth to acc.

// Q4_0: eighth q is the low and high nibbles of qs[4q .. 4q+3] (weights
// 4q .. 4q+3 and 16+4q .. 16+4q+3), one 32-bit word per row.
struct PackQ4_0 {
    static constexpr int QV = 1, SB = 2, U = PGEMV_U4;
    X8_NIBBLE_SPLIT
    __device__ static void dot(const uint4* qv, uint2 sv, float4 x, float4 y, float* acc) {
        const float X24 = -24.0f * hsum8(x, y);
        const u32 w[4] = {qv[0].x, qv[0].y, qv[0].z, qv[0].w};
        const float d[4] = {lo_half(sv.x), hi_half(sv.x), lo_half(sv.y), hi_half(sv.y)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(units_lo4(w[j]), units_hi4(w[j]), x, y);
            acc[j] = fmaf(d[j], fmaf(16.0f, S, X24), acc[j]);
        }
    }
};

// Q4_1: as Q4_0, w = d v + m.
struct PackQ4_1 {
    static constexpr int QV = 1, SB = 4, U = PGEMV_U4;
    X8_NIBBLE_SPLIT
    __device__ static void dot(const uint4* qv, uint4 sv, float4 x, float4 y, float* acc) {
        const float X = hsum8(x, y);
        const u32 w[4] = {qv[0].x, qv[0].y, qv[0].z, qv[0].w};
        const u32 s[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(units_lo4(w[j]), units_hi4(w[j]), x, y);
            const float d = lo_half(s[j]);
            acc[j] = fmaf(16.0f * d, S, fmaf(hi_half(s[j]) - 16.0f * d, X, acc[j]));
        }
    }
};

// Q8_0: eighth q is qs[8q .. 8q+7], two words per row, stored biased by 128
// (unsigned) so the magic conversion needs no XOR.
struct PackQ8_0 {
    static constexpr int QV = 2, SB = 2, U = 4;
    X8_CONSECUTIVE
    __device__ static void dot(const uint4* qv, uint2 sv, float4 x, float4 y, float* acc) {
        const u32 w[8] = {qv[0].x, qv[0].y, qv[0].z, qv[0].w, qv[1].x, qv[1].y, qv[1].z, qv[1].w};
        const float d[4] = {lo_half(sv.x), hi_half(sv.x), lo_half(sv.y), hi_half(sv.y)};
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[j] = fmaf(d[j], dot4_bytes(w[2 * j], x, 128.0f) + dot4_bytes(w[2 * j + 1], y, 128.0f), acc[j]);
    }
};

// F16 (pseudo-blocks of 32 values): eighth q is values 8q .. 8q+7, one
// 16-byte vector per row.
struct PackF16 {
    static constexpr int QV = 4, SB = 0, U = 2;
    X8_CONSECUTIVE
    __device__ static void dot(const uint4* qv, Scales<0>::T, float4 x, float4 y, float* acc) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint4 h = qv[j];
            float a = acc[j];
            a = fmaf(lo_half(h.x), x.x, a), a = fmaf(hi_half(h.x), x.y, a);
            a = fmaf(lo_half(h.y), x.z, a), a = fmaf(hi_half(h.y), x.w, a);
            a = fmaf(lo_half(h.z), y.x, a), a = fmaf(hi_half(h.z), y.y, a);
            a = fmaf(lo_half(h.w), y.z, a), a = fmaf(hi_half(h.w), y.w, a);
            acc[j] = a;
        }
    }
};

template <class P>
__device__ __forceinline__ void gemv_packed(const u8* __restrict__ W, const float* __restrict__ x,
                                            float* __restrict__ y, int nrows, int nb, int ksplit) {
    __shared__ float red[PGEMV_WARPS][4];
    const int lane = threadIdx.x & 31, q = lane & 3, warp = threadIdx.x >> 5;
    const int sub = warp % ksplit, per_block = PGEMV_WARPS / ksplit;
    const int g = blockIdx.x * per_block + warp / ksplit;
    const int n_groups = (nrows + 3) >> 2;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (g < n_groups) {
        // Vectors of quants per group and block: 4 eighths x QV.
        const uint4* qp = (const uint4*)W + (long long)g * nb * 4 * P::QV + q * P::QV;
        const u8* sp = W + (long long)n_groups * nb * 64 * P::QV;
        const long long s0 = (long long)g * nb;
        typedef typename Scales<P::SB>::T S;
        const int step = 8 * ksplit;
        int b = (lane >> 2) + 8 * sub;
        for (; b + (P::U - 1) * step < nb; b += P::U * step) {
            uint4 qv[P::U][P::QV];
            S sv[P::U];
            float4 xa[P::U], xb[P::U];
#pragma unroll
            for (int u = 0; u < P::U; ++u) {
                const int bu = b + u * step;
#pragma unroll
                for (int v = 0; v < P::QV; ++v) qv[u][v] = __ldcs(qp + (long long)bu * 4 * P::QV + v);
                sv[u] = Scales<P::SB>::load(sp, s0 + bu);
                P::x8(x + bu * 32, q, xa[u], xb[u]);
            }
#pragma unroll
            for (int u = 0; u < P::U; ++u) P::dot(qv[u], sv[u], xa[u], xb[u], acc);
        }
        for (; b < nb; b += step) {
            uint4 qv[P::QV];
#pragma unroll
            for (int v = 0; v < P::QV; ++v) qv[v] = __ldcs(qp + (long long)b * 4 * P::QV + v);
            float4 xa, xb;
            P::x8(x + b * 32, q, xa, xb);
            P::dot(qv, Scales<P::SB>::load(sp, s0 + b), xa, xb, acc);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = warp_sum(acc[j]);
    // Lane j < 4 holds row j's sum (selects, not an indexed array: registers).
    const float mine = lane == 0 ? acc[0] : lane == 1 ? acc[1] : lane == 2 ? acc[2] : acc[3];
    if (ksplit == 1) {
        if (lane < 4 && g < n_groups && 4 * g + lane < nrows) y[4 * g + lane] = mine;
        return;
    }
    if (lane < 4) red[warp][lane] = mine;
    __syncthreads();
    if (sub == 0 && lane < 4 && g < n_groups && 4 * g + lane < nrows) {
        float sum = red[warp][lane];
        for (int t = 1; t < ksplit; ++t) sum += red[warp + t][lane];
        y[4 * g + lane] = sum;
    }
}

// W: the packed layout above; x (nb * 32) FP32, 16-byte aligned; y (nrows).
#define PGEMV_KERNEL(name, P)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * PGEMV_WARPS)                                \
        gemv_packed_##name##_f32(const u8* W, const float* x, float* y, int nrows, int nb, int ksplit) { \
        gemv_packed<P>(W, x, y, nrows, nb, ksplit);                                               \
    }
PGEMV_KERNEL(f16, PackF16)
PGEMV_KERNEL(q8_0, PackQ8_0)
PGEMV_KERNEL(q4_0, PackQ4_0)
PGEMV_KERNEL(q4_1, PackQ4_1)
