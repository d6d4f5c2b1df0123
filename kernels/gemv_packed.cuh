// GEMV over weights repacked at upload: y[r] = sum_c W[r, c] * x[c], x and y
// FP32, accumulation FP32.
//
// The packed layout (crates/m40-kernels/src/pack.rs writes it, same bytes as
// the GGUF rows): rows in groups of 4 (a partial last group is padded with
// zero rows), and for each group and 32-weight block b:
// - the quants of the block's four eighths (q = 0..3, the 8 weights that
//   quant.cuh's `x8` pairs with x), each eighth the 4 rows' bytes side by
//   side: one lane loads a whole eighth of all 4 rows with 16-byte loads,
//   straight into the registers it decodes from;
// - the block's scales, 4 rows side by side, in a second plane after all
//   the quants (one load serves the 4 lanes of a block).
// quants: [group][block][eighth][row][QB bytes], QB = 16 (F16), 8 (Q8_0),
// 4 (Q4_0, Q4_1, MXFP4); scales: [group][block][row][SB bytes], SB = 0
// (F16), 2 (f16 d; MXFP4: its E8M0 byte, then 0), 4 (f16 d, m). Q6_K splits its quants over two planes and its
// scales over two more (`Q6KPlanes`); Q4_K has Q4_0's quant plane and two
// scale planes (`Q4KPlanes`).
//
// Why: the GGUF blocks (18, 34, 210 bytes) are not 16-byte aligned, so the
// row-major kernels (gemv.cu) stage chunks through shared memory and decode
// from there; on an H100 they stay latency-bound at ~50% of the read
// bandwidth for Q4_0 (BENCHMARKS.md). Here nothing is staged: every weight
// byte is loaded once into the register that decodes it, x is loaded once
// per 4 rows, and a warp keeps U items of loads in flight.
//
// Launch: blocks of w warps (w = PGEMV_WARPS, ksplit 1, 2 or 4; one token
// of a SPLIT3 format with a 3-way split: PGEMV_MAX_WARPS); grid
// ceil(groups / (w / ksplit)).
// Warp i of (virtual) block vb takes group vb * (w / ksplit) + i / ksplit
// and every ksplit-th run of 8 blocks of it (lane: eighth lane & 3 of block
// lane >> 2 of the run); the ksplit partial sums of a group meet in shared
// memory, added in a fixed order.
#pragma once
#include "common.cuh"
#include "quant.cuh"

#define PGEMV_WARPS 4
// One token only: a 3-way split runs in blocks of 2 groups (6 warps).
#define PGEMV_MAX_WARPS 6

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

// A lane's view of the quant and scale planes (Q4_0, Q4_1, Q8_0, F16):
// QV vectors of quants (eighth q of block b, 4 rows) and the block's scales.
template <int QV, int SB>
struct QuantScalePlanes {
    struct Item {
        uint4 q[QV];
        typename Scales<SB>::T s;
    };
    const uint4* qp;
    const u8* sp;
    long long s0;
    __device__ QuantScalePlanes(const u8* W, int g, int nb, int n_groups, int q)
        : qp((const uint4*)W + ((long long)g * nb * 4 + q) * QV),
          sp(W + (long long)n_groups * nb * 64 * QV),
          s0((long long)g * nb) {}
    __device__ Item load(int b) const {
        Item it;
#pragma unroll
        for (int v = 0; v < QV; ++v) it.q[v] = __ldcs(qp + (long long)b * 4 * QV + v);
        it.s = Scales<SB>::load(sp, s0 + b);
        return it;
    }
};

__device__ __forceinline__ float lo_half(u32 w) { return h2f((u16)w); }
__device__ __forceinline__ float hi_half(u32 w) { return h2f((u16)(w >> 16)); }

// The 8 weights a * u + c of an eighth whose unit floats u (quant.cuh
// unit_byte) are t0's bytes (paired with x8's x) then t1's (with y).
__device__ __forceinline__ void units8_weights(u32 t0, u32 t1, float a, float c, float (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = fmaf(unit_byte(t0, i), a, c), w[4 + i] = fmaf(unit_byte(t1, i), a, c);
}

// Each format: Planes (its lane's loads of one block: an Item), U blocks of
// loads in flight per lane, SPLIT3 (see gemv_packed below), x8 (quant.cuh),
// dot(), which adds the 4 rows' sums over eighth q of the item's block to
// acc, and weights(), the same eighth's 4 x 8 weights as floats, which
// launches of DQ tokens or more use instead (measured per format on an
// H200: BENCHMARKS.md, "Several tokens, weights decoded once").

// Q4_0: eighth q is the low and high nibbles of qs[4q .. 4q+3] (weights
// 4q .. 4q+3 and 16+4q .. 16+4q+3), one 32-bit word per row.
struct PackQ4_0 {
    typedef QuantScalePlanes<1, 2> Planes;
    static constexpr int U = 4;
    static constexpr bool SPLIT3 = false;
    static constexpr int DQ = 4;
    X8_NIBBLE_SPLIT
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        const uint4 qv = it.q[0];
        const uint2 sv = it.s;
        const float X24 = -24.0f * hsum8(x, y);
        const u32 w[4] = {qv.x, qv.y, qv.z, qv.w};
        const float d[4] = {lo_half(sv.x), hi_half(sv.x), lo_half(sv.y), hi_half(sv.y)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(units_lo4(w[j]), units_hi4(w[j]), x, y);
            acc[j] = fmaf(d[j], fmaf(16.0f, S, X24), acc[j]);
        }
    }
    // w = d (v - 8) = 16 d u - 24 d with u = 1 + v / 16 (exact: one rounding
    // of an exact product).
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
        const uint4 qv = it.q[0];
        const uint2 sv = it.s;
        const u32 v[4] = {qv.x, qv.y, qv.z, qv.w};
        const float d[4] = {lo_half(sv.x), hi_half(sv.x), lo_half(sv.y), hi_half(sv.y)};
#pragma unroll
        for (int j = 0; j < 4; ++j) units8_weights(units_lo4_op3(v[j]), units_hi4_op3(v[j]), 16.0f * d[j], -24.0f * d[j], w[j]);
    }
};

// MXFP4: Q4_0's planes (its scale slot holds the E8M0 byte, the high byte
// zero), the nibbles indices into the FP4 levels: as quant.cuh's FmtMXFP4,
// level = 32 u - 44 over the unit floats u of fp4_units.
struct PackMXFP4 {
    typedef QuantScalePlanes<1, 2> Planes;
    static constexpr int U = 4;
    static constexpr bool SPLIT3 = false;
    static constexpr int DQ = 4;
    X8_NIBBLE_SPLIT
    __device__ static void scales(const uint2 sv, float (&d)[4]) {
        d[0] = e8m0_half(sv.x & 0xff), d[1] = e8m0_half((sv.x >> 16) & 0xff);
        d[2] = e8m0_half(sv.y & 0xff), d[3] = e8m0_half((sv.y >> 16) & 0xff);
    }
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        const uint4 qv = it.q[0];
        const float X44 = -44.0f * hsum8(x, y);
        const u32 w[4] = {qv.x, qv.y, qv.z, qv.w};
        float d[4];
        scales(it.s, d);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(fp4_units(w[j] & 0x0f0f0f0fu), fp4_units((w[j] >> 4) & 0x0f0f0f0fu), x, y);
            acc[j] = fmaf(d[j], fmaf(32.0f, S, X44), acc[j]);
        }
    }
    // w = d level = 32 d u - 44 d.
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
        const uint4 qv = it.q[0];
        const u32 v[4] = {qv.x, qv.y, qv.z, qv.w};
        float d[4];
        scales(it.s, d);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            units8_weights(fp4_units(v[j] & 0x0f0f0f0fu), fp4_units((v[j] >> 4) & 0x0f0f0f0fu), 32.0f * d[j],
                           -44.0f * d[j], w[j]);
    }
};

// Q4_1: as Q4_0, w = d v + m.
struct PackQ4_1 {
    typedef QuantScalePlanes<1, 4> Planes;
    static constexpr int U = 4;
    static constexpr bool SPLIT3 = false;
    static constexpr int DQ = 4;
    X8_NIBBLE_SPLIT
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        const uint4 qv = it.q[0], sv = it.s;
        const float X = hsum8(x, y);
        const u32 w[4] = {qv.x, qv.y, qv.z, qv.w};
        const u32 s[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(units_lo4(w[j]), units_hi4(w[j]), x, y);
            const float d = lo_half(s[j]);
            acc[j] = fmaf(16.0f * d, S, fmaf(hi_half(s[j]) - 16.0f * d, X, acc[j]));
        }
    }
    // w = d v + m = 16 d u + (m - 16 d).
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
        const uint4 qv = it.q[0], sv = it.s;
        const u32 v[4] = {qv.x, qv.y, qv.z, qv.w};
        const u32 s[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float d = lo_half(s[j]);
            units8_weights(units_lo4_op3(v[j]), units_hi4_op3(v[j]), 16.0f * d, hi_half(s[j]) - 16.0f * d, w[j]);
        }
    }
};

// Q8_0: eighth q is qs[8q .. 8q+7], two words per row, stored biased by 128
// (unsigned) so the magic conversion needs no XOR.
struct PackQ8_0 {
    typedef QuantScalePlanes<2, 2> Planes;
    static constexpr int U = 2;
    static constexpr bool SPLIT3 = true;
    static constexpr int DQ = 8;
    X8_CONSECUTIVE
    // The item's 8 quant words (row j: 2j, 2j + 1) and 4 row scales.
    __device__ static void unpack(const Planes::Item& it, u32 (&w)[8], float (&d)[4]) {
        const uint4* qv = it.q;
        const uint2 sv = it.s;
        w[0] = qv[0].x, w[1] = qv[0].y, w[2] = qv[0].z, w[3] = qv[0].w;
        w[4] = qv[1].x, w[5] = qv[1].y, w[6] = qv[1].z, w[7] = qv[1].w;
        d[0] = lo_half(sv.x), d[1] = hi_half(sv.x), d[2] = lo_half(sv.y), d[3] = hi_half(sv.y);
    }
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        u32 w[8];
        float d[4];
        unpack(it, w, d);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[j] = fmaf(d[j], dot4_bytes(w[2 * j], x, 128.0f) + dot4_bytes(w[2 * j + 1], y, 128.0f), acc[j]);
    }
    // w = d (byte - 128): the magic float less 2^23 + 128 is exact.
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
        u32 v[8];
        float d[4];
        unpack(it, v, d);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) w[j][i] = (magic_byte(v[2 * j + (i >> 2)], i & 3) - 8388736.0f) * d[j];
    }
};

// F16 (pseudo-blocks of 32 values): eighth q is values 8q .. 8q+7, one
// 16-byte vector per row.
struct PackF16 {
    typedef QuantScalePlanes<4, 0> Planes;
    static constexpr int U = 1;
    static constexpr bool SPLIT3 = true;
    static constexpr int DQ = 4;
    X8_CONSECUTIVE
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        const uint4* qv = it.q;
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
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 h[4] = {it.q[j].x, it.q[j].y, it.q[j].z, it.q[j].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) w[j][2 * i] = lo_half(h[i]), w[j][2 * i + 1] = hi_half(h[i]);
        }
    }
};

// Q6_K, as blocks of 32 weights (8 per super-block): four planes,
// - lo: [group][block][eighth][row] 4 bytes: byte k's low nibble holds the
//   low 4 bits of weight 8q+k, its high nibble those of weight 8q+4+k;
// - hi: [group][block][eighth] 2 words, word w for rows 2w and 2w+1: bits
//   2m, 2m+1 of byte k are the top 2 bits of weight 8q+4t+k of row 2w+r,
//   m = 2r + t (ggml's qh trick: one shift and mask gives 4 weights' bits);
// - sc: [group][block] 8 bytes: row j's two int8 scales (16 weights each)
//   at bytes 2j, 2j+1;
// - d: [group][super-block] 4 f16, one per row.
// 210 bytes per row and super-block, as in GGUF.
struct Q6KPlanes {
    struct Item {
        uint4 lo;
        uint2 hi, sc, d;
    };
    const uint4* lo;
    const uint2 *hi, *sc, *d;
    __device__ Q6KPlanes(const u8* W, int g, int nb, int n_groups, int q)
        : lo((const uint4*)W + (long long)g * nb * 4 + q),
          hi((const uint2*)(W + (long long)n_groups * nb * 64) + (long long)g * nb * 4 + q),
          sc((const uint2*)(W + (long long)n_groups * nb * 96) + (long long)g * nb),
          d((const uint2*)(W + (long long)n_groups * nb * 104) + (long long)g * (nb >> 3)) {}
    __device__ Item load(int b) const {
        Item it;
        it.lo = __ldcs(lo + (long long)b * 4);
        it.hi = __ldcs(hi + (long long)b * 4);
        it.sc = __ldcs(sc + b);
        it.d = __ldcs(d + (b >> 3));
        return it;
    }
};

struct PackQ6_K {
    typedef Q6KPlanes Planes;
    static constexpr int U = 2;
    static constexpr bool SPLIT3 = true;
    static constexpr int DQ = 8;
    X8_CONSECUTIVE
    __device__ static void dot(const Planes::Item& it, int q, float4 x, float4 y, float* acc) {
        const float X96 = -96.0f * hsum8(x, y);
        const u32 w[4] = {it.lo.x, it.lo.y, it.lo.z, it.lo.w};
        const float d[4] = {lo_half(it.d.x), hi_half(it.d.x), lo_half(it.d.y), hi_half(it.d.y)};
        const int sh = 8 * (q >> 1);  // this eighth's scale within a row's pair
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 H = (j < 2 ? it.hi.x : it.hi.y) >> (4 * (j & 1));
            // The 6-bit values as 0x80 | v << 1 (unit_byte with k = 6).
            const u32 t0 = ((w[j] << 1) & 0x1e1e1e1eu) | ((H << 5) & 0x60606060u) | 0x80808080u;
            const u32 t1 = ((w[j] >> 3) & 0x1e1e1e1eu) | ((H << 3) & 0x60606060u) | 0x80808080u;
            const float S = units8(t0, t1, x, y);
            const u32 scw = (j < 2 ? it.sc.x : it.sc.y) >> (16 * (j & 1) + sh);
            const float sc = (float)(int)(signed char)(scw & 0xff);
            acc[j] = fmaf(d[j] * sc, fmaf(64.0f, S, X96), acc[j]);
        }
    }
    // w = d sc (v - 32) = 64 d sc u - 96 d sc with u = 1 + v / 64.
    __device__ static void weights(const Planes::Item& it, int q, float (&w)[4][8]) {
        const u32 v[4] = {it.lo.x, it.lo.y, it.lo.z, it.lo.w};
        const float d[4] = {lo_half(it.d.x), hi_half(it.d.x), lo_half(it.d.y), hi_half(it.d.y)};
        const int sh = 8 * (q >> 1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 H = (j < 2 ? it.hi.x : it.hi.y) >> (4 * (j & 1));
            const u32 t0 = ((v[j] << 1) & 0x1e1e1e1eu) | ((H << 5) & 0x60606060u) | 0x80808080u;
            const u32 t1 = ((v[j] >> 3) & 0x1e1e1e1eu) | ((H << 3) & 0x60606060u) | 0x80808080u;
            const u32 scw = (j < 2 ? it.sc.x : it.sc.y) >> (16 * (j & 1) + sh);
            const float ds = d[j] * (float)(int)(signed char)(scw & 0xff);
            units8_weights(t0, t1, 64.0f * ds, -96.0f * ds, w[j]);
        }
    }
};

// Q4_K, as blocks of 32 weights (8 per super-block): three planes,
// - q: [group][block][eighth][row] 4 bytes, as Q4_0's quants;
// - sm: [group][block] 8 bytes: row j's 6-bit scale and min at bytes 2j,
//   2j+1 (unpacked from ggml's 12 scale bytes at upload);
// - d: [group][super-block] 4 words: row j's f16 d | f16 dmin << 16.
// 148 bytes per row and super-block (GGUF: 144).
struct Q4KPlanes {
    struct Item {
        uint4 q, d;
        uint2 sm;
    };
    const uint4 *q, *d;
    const uint2* sm;
    __device__ Q4KPlanes(const u8* W, int g, int nb, int n_groups, int e)
        : q((const uint4*)W + (long long)g * nb * 4 + e),
          d((const uint4*)(W + (long long)n_groups * nb * 72) + (long long)g * (nb >> 3)),
          sm((const uint2*)(W + (long long)n_groups * nb * 64) + (long long)g * nb) {}
    __device__ Item load(int b) const {
        Item it;
        it.q = __ldcs(q + (long long)b * 4);
        it.sm = __ldcs(sm + b);
        it.d = __ldcs(d + (b >> 3));
        return it;
    }
};

// w = d sc v - dmin m: with S = sum (1 + v/16) x (units8) and X = sum x,
// sum w x = 16 d sc (S - X) - dmin m X.
struct PackQ4_K {
    typedef Q4KPlanes Planes;
    static constexpr int U = 2;
    static constexpr bool SPLIT3 = true;
    static constexpr int DQ = 4;
    X8_NIBBLE_SPLIT
    __device__ static void dot(const Planes::Item& it, int, float4 x, float4 y, float* acc) {
        const float X = hsum8(x, y);
        const u32 w[4] = {it.q.x, it.q.y, it.q.z, it.q.w};
        const u32 dd[4] = {it.d.x, it.d.y, it.d.z, it.d.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float S = units8(units_lo4(w[j]), units_hi4(w[j]), x, y);
            const u32 sm = (j < 2 ? it.sm.x : it.sm.y) >> (16 * (j & 1));
            const float a = 16.0f * lo_half(dd[j]) * (float)(sm & 0xff);
            const float c = hi_half(dd[j]) * (float)((sm >> 8) & 0xff);
            acc[j] = fmaf(a, S, fmaf(-(a + c), X, acc[j]));
        }
    }
    // w = 16 d sc (u - 1) - dmin m.
    __device__ static void weights(const Planes::Item& it, int, float (&w)[4][8]) {
        const u32 v[4] = {it.q.x, it.q.y, it.q.z, it.q.w};
        const u32 dd[4] = {it.d.x, it.d.y, it.d.z, it.d.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 sm = (j < 2 ? it.sm.x : it.sm.y) >> (16 * (j & 1));
            const float a = 16.0f * lo_half(dd[j]) * (float)(sm & 0xff);
            const float c = hi_half(dd[j]) * (float)((sm >> 8) & 0xff);
            units8_weights(units_lo4_op3(v[j]), units_hi4_op3(v[j]), a, -(a + c), w[j]);
        }
    }
};

// The packed formats' Pack* structs by the names of M40_PACKED_FORMATS.
#define PGEMV_PACK_f16 PackF16
#define PGEMV_PACK_q8_0 PackQ8_0
#define PGEMV_PACK_q4_0 PackQ4_0
#define PGEMV_PACK_q4_1 PackQ4_1
#define PGEMV_PACK_q4_k PackQ4_K
#define PGEMV_PACK_q6_k PackQ6_K
#define PGEMV_PACK_mxfp4 PackMXFP4

// Blocks of loads in flight per lane: the format's U for one token; with
// B tokens each block feeds B times the arithmetic, so fewer are needed.
template <class P, int B> struct InFlight {
    static constexpr int value = B == 1 ? P::U : (P::U / B > 1 ? P::U / B : 1);
};

// Where a GEMV's sums go (`mode`): stored, added to y (the residual
// connection: each element is read and written by the one lane that owns
// it), or the gate of gate/up pairs: PGEMV_GLU + the activation (common.cuh
// glu_act: SwiGLU, GeGLU, gpt-oss's).
#define PGEMV_STORE 0
#define PGEMV_ADD 2
#define PGEMV_GLU 3

// The RMSNorm between a residual GEMV and the GEMVs that read its result,
// folded into both (one token; `fold`):
// - FOLD_EMIT (the o and down projections, mode PGEMV_ADD): as each lane
//   adds its row to the residual x, it also writes h[r] = x[r] * nw[r] (nw:
//   the next norm's weight), and the block writes the sum of its rows' x^2
//   to part[vb];
// - FOLD_TAKE (Q/K/V, gate/up, the output: x = that h): the block adds the
//   producer's n_part partial sums in a fixed order (no atomics: the same
//   bits every run) and scales its sums by 1 / sqrt(sum / n + eps) (a dot
//   product is linear in x). The partials are loaded before the weights, so
//   their latency hides under the main loop.
// This removes the norm's launch and its dependent round trips, and no
// block reads more than n_part floats for it.
//
// RoPE and the KV append folded into a one-token Q/K/V stack (parts y0 = q,
// rows [0, r1); K rows [r1, r2); V rows [r2, n); a stack of some of them:
// r1 = 0 without Q, r2 = r1 without K, n = r2 without V), for the normal
// (llama) style, whose pairs (2i, 2i+1) are rows 4g, 4g+1 and 4g+2, 4g+3 of
// one group: the two lanes of a pair swap sums (one shuffle), rotate, and
// write q (FP32, rotated), K (FP16, rotated) and V (FP16) straight to q and
// the KV pools at token row kv_row(table, pos[0]), with rope.cu's angles
// and rotation (common.cuh rope_sin_cos, rope_rot0/1) and its table's
// magnitude scale, inv_freq[n_rot / 2]. With nw non-null (no FOLD_EMIT
// here) each row's sum is biased by nw[row] first (gpt-oss, qwen2; a NeoX
// model's Q/K heads are uploaded with their pairs' rows adjacent, so that
// they rotate as llama's do). Off (kpool null) for everything else.
//
// The arguments, in the order of the kernels' parameters (gemv_packed.cu;
// decode.cu reads them from memory in this layout). Read where they are
// used, not copied up front: in decode.cu they live in shared memory, and
// values held across the main loop would cost its registers.
struct GemvArgs {
    const u8* W;
    const float* x;
    float *y, *y1, *y2;  // RowParts
    int r1, r2, nrows, nb, ksplit, t0, m, mode;  // t0: the first token (CHUNKED: a chunk's tokens)
    const float* nw;  // FOLD_EMIT: the next norm's weight (nrows); RoPE fold, FOLD_BIAS: the rows' biases
    float* h;         // FOLD_EMIT: x * nw (nrows)
    float* part;      // FOLD_EMIT: out, one per block; FOLD_TAKE: in
    int n_part;       // FOLD_TAKE: partial sums to add
    float eps;        // FOLD_TAKE
    const int* pos;   // RoPE and KV append (kpool non-null)
    const float* inv_freq;  // n_rot / 2
    const int* table;
    u16* kpool;
    u16* vpool;
    int head_dim, n_rot;
    float pos_scale;
};

#define FOLD_NONE 0
#define FOLD_TAKE 1
#define FOLD_EMIT 2
// No fold; a GLU's rows biased by nw first (the experts' GEMV,
// gemv_packed_id: compiled into that kernel only).
#define FOLD_BIAS 3
#define FOLD_PART_U 4

// y[t][r] = sum_c W[r, c] x[t][c] for tokens t0 .. t0 + m - 1 (m <= B) of
// x (tokens, nb * 32): each weight is loaded once and used by every token.
// CHUNKED: a launch takes tokens 0 .. a.m - 1 in chunks of a.t0 <= B (the
// last may be shorter), chunk blockIdx.y in the blocks of grid row y. Its
// own kernels (_x8c): t0 and m held in registers made the plain ones spill
// (ptxas, sm_52 and sm_90) and an 8B's 8-token steps 3.5% slower (H100).
// vb: the block's index in the launch's grid (the persistent decode kernel,
// decode.cu, runs several per block; its x is written by the same kernel's
// earlier phases, so x is not __restrict__: no non-coherent loads).
//
// S3 (one token, the formats with P::SPLIT3; decode.cu passes false): the
// launcher may split a group over 3 warps in blocks of PGEMV_MAX_WARPS, and
// a lane's last blocks (fewer than U) are loaded together, not one round
// trip each. Measured per format on an H100 (BENCHMARKS.md): faster for
// Q4_K, Q6_K and Q8_0 (U = 2), slower for Q4_0 (the same code compiles to
// a slower main loop there), so Q4_0 and Q4_1 keep the plain code.
// R: where the tokens' rows are (ContigRows; GatheredRows with t0 = 0 and
// B > 1).
template <class P, int B, int FOLD, bool S3 = B == 1 && P::SPLIT3, bool CHUNKED = false, class R = ContigRows>
__device__ __forceinline__ void gemv_packed(const GemvArgs& a, int vb, const R& rows = R()) {
    const u8* __restrict__ W = a.W;
    const float* x = a.x;
    const int nrows = a.nrows, nb = a.nb, ksplit = a.ksplit;
    static_assert(!CHUNKED || B > 1, "chunks of several tokens");
    int t0 = CHUNKED ? (int)blockIdx.y * a.t0 : a.t0;
    const int m = CHUNKED ? min(a.t0, a.m - t0) : a.m;
    static_assert(FOLD == FOLD_NONE || FOLD == FOLD_BIAS || B == 1, "the folded norm takes one token");
    static_assert(R::CONTIG || (B > 1 && !CHUNKED), "gathered rows: several tokens, unchunked");
    constexpr int U = InFlight<P, B>::value;
    constexpr int OUT = 4 * B;  // sums per group: 4 rows x B tokens
    static_assert(!S3 || B == 1, "a 3-way split takes one token");
    __shared__ float red[S3 ? PGEMV_MAX_WARPS : PGEMV_WARPS][OUT];
    const int lane = threadIdx.x & 31, q = lane & 3, warp = threadIdx.x >> 5;
    const int sub = warp % ksplit, per_block = (S3 ? (int)(blockDim.x >> 5) : PGEMV_WARPS) / ksplit;
    const int g = vb * per_block + warp / ksplit;  // the block's warps: a multiple of ksplit
    const int n_groups = (nrows + 3) >> 2;
    const long long ld = (long long)nb * 32;
    if (B == 1) t0 = 0;  // one token: the launcher passes 0 (a register saved)
    x += t0 * ld;
    float acc[B][4];
#pragma unroll
    for (int t = 0; t < B; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[t][j] = 0.0f;
    // FOLD_TAKE: this thread's share of the partial sums, loaded now and
    // added after the main loop (their latency hides under it).
    float pv[FOLD_PART_U];
    if (FOLD == FOLD_TAKE) {
#pragma unroll
        for (int u = 0; u < FOLD_PART_U; ++u) {
            const int i = threadIdx.x + u * blockDim.x;
            pv[u] = i < a.n_part ? a.part[i] : 0.0f;
        }
    }
    if (g < n_groups) {
        const typename P::Planes planes(W, g, nb, n_groups, q);
        typedef typename P::Planes::Item Item;
        const int step = 8 * ksplit, run = lane >> 2;
        int b = run + 8 * sub;
        if (B > 1) {
            // Several tokens: from P::DQ tokens each item's weights are
            // decoded once into floats (P::weights) and used by every
            // token, one FMA a weight and token; below it (and for B = 1)
            // P::dot decodes the quants' units and adds each token's x
            // sums, which costs fewer instructions for few tokens. The loop is software-pipelined (the next U
            // blocks' loads are issued before this U's arithmetic), and
            // tokens past m read token m - 1's x (their sums are not
            // written), so no branch separates the tokens' x loads. xb:
            // x at this lane's block b, advanced with b; xo: each token's
            // offset from it (32-bit: a register a token, not two).
            const float* xb = x + b * 32;
            int xo[B];
#pragma unroll
            for (int t = 0; t < B; ++t) xo[t] = (R::CONTIG ? (t < m ? t : m - 1) : rows.x_row(t < m ? t : m - 1)) * (int)ld;
            const int xs = step * 32;
            Item cur[U], nxt[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (b + u * step < nb) cur[u] = planes.load(b + u * step);
            for (; b < nb; b += U * step) {
                const int bn = b + U * step;
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (bn + u * step < nb) nxt[u] = planes.load(bn + u * step);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    if (b + u * step >= nb) break;
                    if (B >= P::DQ) {
                        float w[4][8];
                        P::weights(cur[u], q, w);
#pragma unroll
                        for (int t = 0; t < B; ++t) {
                            float4 xa, xc;
                            P::x8(xb + xo[t] + u * xs, q, xa, xc);
                            const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
#pragma unroll
                            for (int j = 0; j < 4; ++j)
#pragma unroll
                                for (int i = 0; i < 8; ++i) acc[t][j] = fmaf(w[j][i], xv[i], acc[t][j]);
                        }
                    } else {
                        float4 xa[B], xc[B];
#pragma unroll
                        for (int t = 0; t < B; ++t)
                            P::x8(R::CONTIG ? x + (t < m ? t : m - 1) * ld + (b + u * step) * 32 : xb + xo[t] + u * xs,
                                  q, xa[t], xc[t]);
#pragma unroll
                        for (int t = 0; t < B; ++t) P::dot(cur[u], q, xa[t], xc[t], acc[t]);
                    }
                }
                xb += U * xs;
#pragma unroll
                for (int u = 0; u < U; ++u) cur[u] = nxt[u];
            }
            // Nothing left for the loops below, which B = 1 runs. (Put in
            // an else branch, they made the several-token kernels' code
            // differ and some spill on sm_52; as they are, every kernel's
            // PTX is what was measured.)
            b = nb;
        }
        // While every lane of the warp has U blocks left (a warp-uniform
        // condition, so the whole warp reaches the __syncwarp).
        for (; b - run + 7 + (U - 1) * step < nb; b += U * step) {
            // The weights of U blocks in flight; x (an L1 hit after the
            // first warp) is loaded as each block is decoded. The
            // __syncwarp keeps ptxas from sinking each load to its block's
            // decode (it did, for sm_90: one block in flight per lane).
            Item it[U];
#pragma unroll
            for (int u = 0; u < U; ++u) it[u] = planes.load(b + u * step);
            __syncwarp();
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int t = 0; t < B; ++t) {
                    if (B > 1 && t >= m) break;
                    float4 xa, xb;
                    P::x8(x + t * ld + (b + u * step) * 32, q, xa, xb);
                    P::dot(it[u], q, xa, xb, acc[t]);
                }
        }
        if (S3) {
            // The rest (at most U blocks a lane, fewer for the lanes of
            // later runs) in flight together: one round trip.
            if (b - run < nb) {
                Item it[U];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (b + u * step < nb) it[u] = planes.load(b + u * step);
                __syncwarp();
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (b + u * step < nb) {
                        float4 xa, xb;
                        P::x8(x + (b + u * step) * 32, q, xa, xb);
                        P::dot(it[u], q, xa, xb, acc[0]);
                    }
            }
        } else {
            for (; b < nb; b += step) {
                const Item it = planes.load(b);
#pragma unroll
                for (int t = 0; t < B; ++t) {
                    if (B > 1 && t >= m) break;
                    float4 xa, xb;
                    P::x8(x + t * ld + b * 32, q, xa, xb);
                    P::dot(it, q, xa, xb, acc[t]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < B; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[t][j] = warp_sum(acc[t][j]);
    // Sum 4 t + j (token t, row j of the group) goes out through that lane
    // (selects, not an indexed array: registers).
    static_assert(OUT <= 32, "one lane per sum");
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < OUT; ++i)
        if (lane == i) mine = acc[i >> 2][i & 3];
    const int t = lane >> 2, row = 4 * g + (lane & 3);
    const bool out = lane < OUT && (B == 1 || t < m) && g < n_groups && row < nrows;
    // The group's sums: lane 4 t + j (< OUT) holds token t, row j, in every
    // warp when ksplit is 1, in the sub 0 warp after the reduction otherwise.
    if (ksplit > 1) {
        if (lane < OUT) red[warp][lane] = mine;
        __syncthreads();
        if (sub == 0 && lane < OUT)
            for (int k = 1; k < ksplit; ++k) mine += red[warp + k][lane];
    }
    const bool owns = ksplit == 1 || sub == 0;
    const RowParts y = {a.y, a.y1, a.y2, a.r1, a.r2, nrows};
    if (FOLD == FOLD_TAKE) {
        __shared__ float scratch[32];
        float pss = 0.0f;
#pragma unroll
        for (int u = 0; u < FOLD_PART_U; ++u) pss += pv[u];
        for (int i = threadIdx.x + FOLD_PART_U * blockDim.x; i < a.n_part; i += blockDim.x) pss += a.part[i];
        const float ss = block_sum(pss, scratch);
        mine *= rsqrtf(ss / (float)(nb * 32) + a.eps);
    }
    // With glu, group g is the rows (gate 2g, gate 2g+1, up 2g, up 2g+1) of
    // an interleaved gate/up stack: lanes 4t and 4t+1 take the up sums of
    // lanes 4t+2 and 4t+3 and write act(gate) * up to y (m, nrows / 2).
    // The whole warp takes part (the shuffle).
    float sq = 0.0f;
    if (B == 1 && a.kpool != nullptr) {
        if (a.nw != nullptr && out) mine += a.nw[row];  // the row's bias (RopeKv: nw)
        const float other = __shfl_xor_sync(0xffffffffu, mine, 1);  // the pair's other sum
        if (owns && out) {
            if (row < y.r2) {  // Q or K: rotate the pair
                const int e = row < y.r1 ? row : row - y.r1;
                const int d = e % a.head_dim, i = d >> 1;
                float v = mine;
                if (i < (a.n_rot >> 1)) {
                    float sn, cs;
                    rope_sin_cos((float)a.pos[0] * a.pos_scale, a.inv_freq[i], &sn, &cs);
                    // The magnitude scale after the frequencies (rope.cu).
                    const float ms = a.inv_freq[a.n_rot >> 1];
                    sn *= ms, cs *= ms;
                    const float x0 = (d & 1) ? other : mine, x1 = (d & 1) ? mine : other;
                    v = (d & 1) ? rope_rot1(x0, x1, sn, cs) : rope_rot0(x0, x1, sn, cs);
                }
                if (row < y.r1)
                    y.y0[row] = v;
                else
                    a.kpool[kv_row(a.table, a.pos[0]) * (y.r2 - y.r1) + e] = f2h(v);
            } else {
                a.vpool[kv_row(a.table, a.pos[0]) * (y.n - y.r2) + (row - y.r2)] = f2h(mine);
            }
        }
    } else if (a.mode >= PGEMV_GLU) {
        // The rows' biases (gemv_packed_id: nw, in the stack's row order).
        if (FOLD == FOLD_BIAS && a.nw != nullptr && out) mine += a.nw[row];
        const float u = __shfl_down_sync(0xffffffffu, mine, 2);
        if (owns && out && (lane & 2) == 0)
            y.y0[(long long)(R::CONTIG ? t0 + t : rows.y_row(t)) * (nrows >> 1) + 2 * g + (lane & 1)] = glu_act(a.mode - PGEMV_GLU, mine, u);
    } else if (owns && out) {
        float* p = y.at(R::CONTIG ? t0 + t : rows.y_row(t), row);
        const float v = a.mode == PGEMV_ADD ? *p + mine : mine;
        *p = v;
        if (FOLD == FOLD_EMIT) {
            a.h[row] = v * a.nw[row];
            sq = v * v;
        }
    }
    if (FOLD == FOLD_EMIT) {
        __shared__ float scratch[32];
        sq = block_sum(sq, scratch);
        if (threadIdx.x == 0) a.part[vb] = sq;
    }
}

