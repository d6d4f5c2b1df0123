// Element access to weights in the packed layout (crates/m40-kernels/src/
// pack.rs writes it; kernels/gemv_packed.cu documents it and streams it for
// decode). The prefill GEMM's tile loader and the embedding gather read the
// same copy of the weights through these, so a model keeps one copy.
//
// Each format: `parts(W, N, K, n, b, q, v0, v1)` (= `fetch` + `decode`,
// see PartsOf) dequantizes weights
// 4q .. 4q+3 (v0) and 16+4q .. 16+4q+3 (v1), q < 4, of 32-weight block b of
// row n < N, in a matrix of N rows and K columns (K / 32 blocks per row,
// ceil(N / 4) groups of 4 rows). These two parts are what one 32-bit word
// of nibbles holds in the 4-bit formats, and the split `part(q)`,
// `part(q + 4)` of quant.cuh, so the GEMM loader takes them together.
//
// Plane offsets (bytes), with ng groups, nb blocks per row, gb = g * nb + b
// the group-block of row n = 4 g + j:
// - Q4_0 / Q4_1 / Q4_K / MXFP4 quants: ((gb * 4 + e) * 4 + j) * 4, eighth e = q
//   (low nibbles: weights 4e.., high: 16+4e..);
// - Q8_0 quants: ((gb * 4 + e) * 4 + j) * 8, e = weight / 8 (biased by 128);
//   F16 values: ((gb * 4 + e) * 4 + j) * 16;
// - simple scales after ng * nb * 64 * QV bytes: (gb * 4 + j) * SB
//   (QV = 16-byte vectors per eighth: 1 Q4_x, 2 Q8_0, 4 F16);
// - Q4_K: sm at ng*nb*64 + gb*8 + 2j (scale, min bytes), d at
//   ng*nb*72 + ((g * nb/8 + b/8) * 4 + j) * 4 (f16 d | f16 dmin << 16);
// - Q6_K: lo at ((gb*4 + e)*4 + j)*4 (byte k: low 4 bits of weight 8e+k in
//   its low nibble, of 8e+4+k in its high one), hi at ng*nb*64 +
//   (gb*4 + e)*8 + (j/2)*4 (bits 2m.. of byte k: top 2 bits of weight
//   8e+4t+k of row j, m = 2 (j%2) + t), sc at ng*nb*96 + gb*8 + 2j + (16-weight
//   half), d at ng*nb*104 + ((g * nb/8 + b/8) * 4 + j) * 2.
#pragma once
#include "quant.cuh"

// Where row n's group-block b starts: g, j, gb, and the group count.
struct PackAt {
    long long gb, ng, nb, g;
    int j;
    __device__ PackAt(int N, int K, int n, int b)
        : gb((long long)(n >> 2) * (K >> 5) + b), ng((N + 3) >> 2), nb(K >> 5), g(n >> 2), j(n & 3) {}
};

__device__ __forceinline__ u32 ldw(const u8* p) { return *(const u32*)p; }

// The quad interface (the prefill GEMM's quad loader: Q6_K's in the large
// and narrow tiles, Q4_0's in the narrow one, the tiles and formats it
// measured faster for: BENCHMARKS.md): eighth e < 4
// of block b of group g (rows 4g .. 4g+3), the packed layout's own unit.
// `fetch_quad` loads its raw words (16-byte loads of the 4 rows side by
// side, the scales of the 4 rows in one load); `decode_quad(r, e, v)`
// gives v[i] = the 4 rows' weights at column `quad_k(e, i)` of the block,
// i < 8. A zeroed Quad decodes to zeros. Group-block gb = g * nb + b.
struct QuadAt {
    long long gb, ng, nb;
    __device__ QuadAt(int N, int K, int g, int b)
        : gb((long long)g * (K >> 5) + b), ng((N + 3) >> 2), nb(K >> 5) {}
};
// The eighth e of a format whose eighths are runs: weights 8e .. 8e+7.
__device__ __forceinline__ int run_k(int e, int i) { return 8 * e + i; }
__device__ __forceinline__ u32 word_of(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
__device__ __forceinline__ float half_of(const uint2& v, int j) {
    return h2f((u16)((j < 2 ? v.x : v.y) >> (16 * (j & 1))));
}

// v = ((w >> shift) & 15) * d + c for the 4 bytes of w.
__device__ __forceinline__ void nibbles4(u32 w, int shift, float d, float c, float v[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = fmaf(u2f_sub((w >> (8 * i + shift)) & 15, 0), d, c);
}

// The raw words behind one `parts` call, loaded by `fetch` and turned into
// weights by `decode`, so a loader can issue its loads, do other work while
// they are in flight, and decode them afterwards (the GEMM's tile loader).
// A zeroed Raw decodes to zeros (every scale is 0). `parts` is the two
// together.
template <class Self>
struct PartsOf {
    __device__ static void parts(const u8* W, int N, int K, int n, int b, int q, float v0[4], float v1[4]) {
        typename Self::Raw r;
        Self::fetch(W, N, K, n, b, q, r);
        Self::decode(r, v0, v1);
    }
};

struct PartsQ4_0 : PartsOf<PartsQ4_0> {
    struct Raw {
        u32 w, d;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        r.w = ldw(W + ((a.gb * 4 + q) * 4 + a.j) * 4);
        r.d = ld16(W + a.ng * a.nb * 64 + (a.gb * 4 + a.j) * 2);
    }
    // d (v - 8) = 16 d u - 24 d for u = unit_byte (1 + v / 16): one
    // byte_perm and one FMA a weight, the same bits as fmaf(v, d, -8 d)
    // (16 d and 24 d are exact for an f16 d, and so is the result).
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = h2f((u16)r.d), a = 16.0f * d, c = -24.0f * d;
        const u32 lo = units_lo4(r.w), hi = units_hi4(r.w);
#pragma unroll
        for (int i = 0; i < 4; ++i) v0[i] = fmaf(unit_byte(lo, i), a, c), v1[i] = fmaf(unit_byte(hi, i), a, c);
    }
    // Eighth e: the 4 rows' words (weights 4e .. 4e+3 in the low nibbles,
    // 16+4e .. in the high ones) and their 4 scales.
    struct Quad {
        uint4 w;
        uint2 d;
    };
    __device__ static void fetch_quad(const u8* W, int N, int K, int g, int b, int e, Quad& r) {
        const QuadAt a(N, K, g, b);
        r.w = *(const uint4*)(W + (a.gb * 4 + e) * 16);
        r.d = *(const uint2*)(W + a.ng * a.nb * 64 + a.gb * 8);
    }
    __device__ static void decode_quad(const Quad& r, int, float4 v[8]) {
        float o[8][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float d = half_of(r.d, j), a = 16.0f * d, c = -24.0f * d;
            const u32 w = word_of(r.w, j), lo = units_lo4(w), hi = units_hi4(w);
#pragma unroll
            for (int i = 0; i < 4; ++i) o[i][j] = fmaf(unit_byte(lo, i), a, c), o[4 + i][j] = fmaf(unit_byte(hi, i), a, c);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
    }
    __device__ static int quad_k(int e, int i) { return (i < 4 ? 0 : 12) + 4 * e + i; }
};

// MXFP4: Q4_0's planes, the scale slot holding the E8M0 byte (low byte of
// its 16 bits), the nibbles indices into the FP4 levels.
struct PartsMXFP4 : PartsOf<PartsMXFP4> {
    typedef PartsQ4_0::Raw Raw;
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        PartsQ4_0::fetch(W, N, K, n, b, q, r);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = e8m0_half(r.d & 0xff);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v0[i] = d * fp4_level((r.w >> (8 * i)) & 15);
            v1[i] = d * fp4_level((r.w >> (8 * i + 4)) & 15);
        }
    }
};

struct PartsQ4_1 : PartsOf<PartsQ4_1> {
    struct Raw {
        u32 w, s;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        r.w = ldw(W + ((a.gb * 4 + q) * 4 + a.j) * 4);
        r.s = ldw(W + a.ng * a.nb * 64 + (a.gb * 4 + a.j) * 4);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = h2f((u16)r.s), m = h2f((u16)(r.s >> 16));
        nibbles4(r.w, 0, d, m, v0);
        nibbles4(r.w, 4, d, m, v1);
    }
};

// w = d sc v - dmin m.
struct PartsQ4_K : PartsOf<PartsQ4_K> {
    struct Raw {
        u32 w, sm, dd;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        r.w = ldw(W + ((a.gb * 4 + q) * 4 + a.j) * 4);
        r.sm = ld16(W + a.ng * a.nb * 64 + a.gb * 8 + 2 * a.j);
        r.dd = ldw(W + a.ng * a.nb * 72 + ((a.g * (a.nb >> 3) + (b >> 3)) * 4 + a.j) * 4);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = h2f((u16)r.dd) * (float)(r.sm & 0xff), c = -h2f((u16)(r.dd >> 16)) * (float)(r.sm >> 8);
        nibbles4(r.w, 0, d, c, v0);
        nibbles4(r.w, 4, d, c, v1);
    }
};

struct PartsQ8_0 : PartsOf<PartsQ8_0> {
    struct Raw {
        u32 w0, w1, d;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        r.d = ld16(W + a.ng * a.nb * 128 + (a.gb * 4 + a.j) * 2);
        const u8* e0 = W + ((a.gb * 4 + (q >> 1)) * 4 + a.j) * 8 + 4 * (q & 1);
        r.w0 = ldw(e0), r.w1 = ldw(e0 + 2 * 4 * 8);  // eighth + 2: weights + 16
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = h2f((u16)r.d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v0[i] = u2f_sub(byte_of(r.w0, i), 128) * d;
            v1[i] = u2f_sub(byte_of(r.w1, i), 128) * d;
        }
    }
};

struct PartsF16 : PartsOf<PartsF16> {
    struct Raw {
        uint2 h0, h1;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        const u8* e0 = W + ((a.gb * 4 + (q >> 1)) * 4 + a.j) * 16 + 8 * (q & 1);
        r.h0 = *(const uint2*)e0, r.h1 = *(const uint2*)(e0 + 2 * 4 * 16);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        v0[0] = h2f((u16)r.h0.x), v0[1] = h2f((u16)(r.h0.x >> 16));
        v0[2] = h2f((u16)r.h0.y), v0[3] = h2f((u16)(r.h0.y >> 16));
        v1[0] = h2f((u16)r.h1.x), v1[1] = h2f((u16)(r.h1.x >> 16));
        v1[2] = h2f((u16)r.h1.y), v1[3] = h2f((u16)(r.h1.y >> 16));
    }
};

// Weights 8e + 4t .. +3 of row j: 6-bit values (low nibble | top 2 bits << 4),
// e = q / 2 (v0) and 2 + q / 2 (v1), t = q % 2.
struct PartsQ6_K : PartsOf<PartsQ6_K> {
    struct Raw {
        u32 lo0, lo1, hi0, hi1, sc, d;
    };
    __device__ static void fetch(const u8* W, int N, int K, int n, int b, int q, Raw& r) {
        const PackAt a(N, K, n, b);
        const int e = q >> 1, t = q & 1;
        const u32 hs = 2 * (2 * (a.j & 1) + t);
        r.lo0 = ldw(W + ((a.gb * 4 + e) * 4 + a.j) * 4) >> (4 * t);
        r.lo1 = ldw(W + ((a.gb * 4 + e + 2) * 4 + a.j) * 4) >> (4 * t);
        r.hi0 = ldw(W + a.ng * a.nb * 64 + (a.gb * 4 + e) * 8 + (a.j >> 1) * 4) >> hs;
        r.hi1 = ldw(W + a.ng * a.nb * 64 + (a.gb * 4 + e + 2) * 8 + (a.j >> 1) * 4) >> hs;
        r.sc = ld16(W + a.ng * a.nb * 96 + a.gb * 8 + 2 * a.j);
        r.d = ld16(W + a.ng * a.nb * 104 + ((a.g * (a.nb >> 3) + (b >> 3)) * 4 + a.j) * 2);
    }
    __device__ static void q6(u32 lo, u32 hi, float ds, float v[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            v[i] = u2f_sub(((lo >> (8 * i)) & 15) | (((hi >> (8 * i)) & 3) << 4), 32) * ds;
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
        const float d = h2f((u16)r.d);
        q6(r.lo0, r.hi0, d * (float)(signed char)(r.sc & 0xff), v0);
        q6(r.lo1, r.hi1, d * (float)(signed char)(r.sc >> 8), v1);
    }
    // Eighth e (weights 8e .. 8e+7, in 16-weight half e / 2): lo the 4
    // rows' words, hi words for rows (0, 1) and (2, 3), sc the 4 rows'
    // scale pairs, d their f16 super-block scales.
    struct Quad {
        uint4 lo;
        uint2 hi, sc, d;
    };
    __device__ static void fetch_quad(const u8* W, int N, int K, int g, int b, int e, Quad& r) {
        const QuadAt a(N, K, g, b);
        r.lo = *(const uint4*)(W + (a.gb * 4 + e) * 16);
        r.hi = *(const uint2*)(W + a.ng * a.nb * 64 + (a.gb * 4 + e) * 8);
        r.sc = *(const uint2*)(W + a.ng * a.nb * 96 + a.gb * 8);
        r.d = *(const uint2*)(W + a.ng * a.nb * 104 + ((long long)g * (a.nb >> 3) + (b >> 3)) * 8);
    }
    __device__ static void decode_quad(const Quad& r, int e, float4 v[8]) {
        float o[8][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 lo = word_of(r.lo, j), hi = (j < 2 ? r.hi.x : r.hi.y) >> (4 * (j & 1));
            const u32 scw = (j < 2 ? r.sc.x : r.sc.y) >> (16 * (j & 1) + 8 * (e >> 1));
            const float ds = half_of(r.d, j) * (float)(signed char)(scw & 0xff);
            // Weight 4t + k: low bits at lo >> (8k + 4t), top bits at
            // hi >> (8k + 2t) (m = 2 (j % 2) + t, the j part shifted above).
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int t = i >> 2, k = i & 3;
                o[i][j] = u2f_sub(((lo >> (8 * k + 4 * t)) & 15) | (((hi >> (8 * k + 2 * t)) & 3) << 4), 32) * ds;
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
    }
    __device__ static int quad_k(int e, int i) { return run_k(e, i); }
};
