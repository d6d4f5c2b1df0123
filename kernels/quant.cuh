// GGML weight formats as device building blocks: each format is a struct with
// its block geometry and `part(blk, s, p, v)`, which dequantizes weights
// 32s + 4p .. 32s + 4p + 3 (part p < 8 of 32-weight sub-block s) of the
// block at `blk` into registers. GEMV and the embedding gather are written
// once over these. Parts are 4 weights so that 8 lanes share a sub-block and
// a warp's x loads cover 4 whole sub-blocks: 512 contiguous bytes.
//
// Layouts are ggml's (crates/m40-gguf/src/quant/blocks.rs holds the same as
// Rust structs; the CPU dequantization there is the reference). Every block
// size is even and rows start at even byte offsets, so block starts are
// 2-byte aligned: loads are u16 or pairs of u16, never wider.
// `blk` may point to global or shared memory.
//
// Float formats (F32, F16, BF16) are cut into pseudo-blocks of 32 values; a
// row's last pseudo-block may be partial (callers mask by column).
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
// A little-endian u32 at a 2-byte aligned address.
__device__ __forceinline__ u32 ld32(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

// (float)n - c for integers 0 <= n < 2^23 and small c: one integer OR and
// one FP add instead of an I2F conversion (which runs at a quarter of the
// FP32 rate on Maxwell and on Hopper). Exact.
#define u2f_sub(n, c) (__int_as_float(0x4b000000u | (u32)(n)) - (8388608.0f + (float)(c)))

// The 16 non-uniform 4-bit levels of IQ4_NL / IQ4_XS, packed four to a word,
// selected with byte_perm (no table in memory, no divergent loads).
__device__ __forceinline__ float iq4_level(int q) {
    const u32 t0 = 0xbfad9881u, t1 = 0xf6eaddcfu;  // -127 -104 -83 -65 | -49 -35 -22 -10
    const u32 t2 = 0x26190d01u, t3 = 0x71594535u;  //    1   13  25  38 |  53  69  89 113
    const u32 b = q < 8 ? __byte_perm(t0, t1, q) : __byte_perm(t2, t3, q - 8);
    return u2f_sub((b & 0xff) ^ 0x80, 128);
}

// Byte i of w.
__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xff; }

struct FmtF32 {
    static constexpr int QK = 32, BYTES = 128, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float* f = (const float*)b + 4 * p;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = f[i];
    }
};

struct FmtF16 {
    static constexpr int QK = 32, BYTES = 64, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const u32 a = ld32(b + 8 * p), c = ld32(b + 8 * p + 4);
        v[0] = h2f((u16)a), v[1] = h2f((u16)(a >> 16)), v[2] = h2f((u16)c), v[3] = h2f((u16)(c >> 16));
    }
};

struct FmtBF16 {
    static constexpr int QK = 32, BYTES = 64, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const u32 a = ld32(b + 8 * p), c = ld32(b + 8 * p + 4);
        v[0] = __uint_as_float(a << 16), v[1] = __uint_as_float(a & 0xffff0000u);
        v[2] = __uint_as_float(c << 16), v[3] = __uint_as_float(c & 0xffff0000u);
    }
};

// d: f16 | qs[32]: i8
struct FmtQ8_0 {
    static constexpr int QK = 32, BYTES = 34, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 q = ld32(b + 2 + 4 * p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub(byte_of(q, i) ^ 0x80, 128) * d;
    }
};

// d: f16 | qs[16]: weight j in the low nibble of qs[j], j+16 in the high one.
// Part p: bytes 4(p%4) .. +3, low nibbles for p < 4, high ones after.
struct FmtQ4_0 {
    static constexpr int QK = 32, BYTES = 18, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 q = ld32(b + 2 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub((q >> (8 * i)) & 15, 8) * d;
    }
};

// d, m: f16 | qs[16]
struct FmtQ4_1 {
    static constexpr int QK = 32, BYTES = 20, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u32 q = ld32(b + 4 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub((q >> (8 * i)) & 15, 0) * d + m;
    }
};

// d: f16 | qh: u32, bit o = 5th bit of weight o | qs[16] as Q4_0
struct FmtQ5_0 {
    static constexpr int QK = 32, BYTES = 22, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 qh = ld32(b + 2) >> (4 * p);
        const u32 q = ld32(b + 6 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub(((q >> (8 * i)) & 15) | (((qh >> i) & 1) << 4), 16) * d;
    }
};

// d, m: f16 | qh: u32 | qs[16]
struct FmtQ5_1 {
    static constexpr int QK = 32, BYTES = 24, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u32 qh = ld32(b + 4) >> (4 * p);
        const u32 q = ld32(b + 8 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub(((q >> (8 * i)) & 15) | (((qh >> i) & 1) << 4), 0) * d + m;
    }
};

// d: f16 | qs[16]: 4-bit indices into the IQ4 levels, nibbles as Q4_0
struct FmtIQ4_NL {
    static constexpr int QK = 32, BYTES = 18, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 q = ld32(b + 2 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = d * iq4_level((q >> (8 * i)) & 15);
    }
};

// Super-blocks of 256 weights: sub-block s holds weights 32s .. 32s+31. Where
// scales are per 16 weights, weight o of a sub-block takes scale 2s + o/16,
// and o/16 = p/4.

// scales[16]: (min << 4 | scale) per 16 weights | qs[64]: 2-bit | d, dmin: f16
// Sub-block s: qs[32 * (s/4) + o] >> 2*(s%4).
struct FmtQ2_K {
    static constexpr int QK = 256, BYTES = 84, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        const float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        const u32 sc = b[2 * s + (p >> 2)];
        const float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
        const u32 q = ld32(b + 16 + 32 * (s >> 2) + 4 * p) >> (2 * (s & 3));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub((q >> (8 * i)) & 3, 0) - ml;
    }
};

// hmask[32] | qs[64] | scales[12]: 16 packed signed 6-bit | d: f16
// Sub-block s: low bits qs[32*(s/4) + o] >> 2*(s%4), high bit hmask[o] bit s
// (set means no -4).
struct FmtQ3_K {
    static constexpr int QK = 256, BYTES = 110, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        const float d = h2f(ld16(b + 108));
        const int w = s >> 1;  // the unpacked scale word holding scales 2s, 2s+1
        const u32 a = ld32(b + 96 + 4 * (w & 1)) >> (4 * (w >> 1));
        const u32 aux = (a & 0x0f0f0f0fu) | (((ld32(b + 104) >> (2 * w)) & 0x03030303u) << 4);
        const float dl = d * (float)((int)byte_of(aux, 2 * (s & 1) + (p >> 2)) - 32);
        const u32 q = ld32(b + 32 + 32 * (s >> 2) + 4 * p) >> (2 * (s & 3));
        const u32 hm = ld32(b + 4 * p) >> s;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub(((q >> (8 * i)) & 3) | (((hm >> (8 * i)) & 1) << 2), 4);
    }
};

// (scale, min) of sub-block j from the 12 packed bytes at q (Q4_K, Q5_K).
__device__ __forceinline__ void scale_min_k4(const u8* q, int j, float& sc, float& m) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        m = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 15) | ((q[j - 4] >> 6) << 4));
        m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// d, dmin: f16 | scales[12] | qs[128]: sub-block s in the low (s even) or
// high (s odd) nibbles of qs[32*(s/2) ..]
struct FmtQ4_K {
    static constexpr int QK = 256, BYTES = 144, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        float sc, m;
        scale_min_k4(b + 4, s, sc, m);
        const float dl = h2f(ld16(b)) * sc, ml = h2f(ld16(b + 2)) * m;
        const u32 q = ld32(b + 16 + 32 * (s >> 1) + 4 * p) >> (4 * (s & 1));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub((q >> (8 * i)) & 15, 0) - ml;
    }
};

// d, dmin: f16 | scales[12] | qh[32]: bit s of qh[o] is the 5th bit | qs[128] as Q4_K
struct FmtQ5_K {
    static constexpr int QK = 256, BYTES = 176, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        float sc, m;
        scale_min_k4(b + 4, s, sc, m);
        const float dl = h2f(ld16(b)) * sc, ml = h2f(ld16(b + 2)) * m;
        const u32 q = ld32(b + 48 + 32 * (s >> 1) + 4 * p) >> (4 * (s & 1));
        const u32 qh = ld32(b + 16 + 4 * p) >> s;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub(((q >> (8 * i)) & 15) | (((qh >> (8 * i)) & 1) << 4), 0) - ml;
    }
};

// ql[128]: low 4 bits | qh[64]: high 2 bits | scales[16]: i8 | d: f16
// Sub-block s (n = s/4, k = s%4): ql[64n + 32(k&1) + o] >> 4(k>>1),
// qh[32n + o] >> 2k, scale 8n + 2k + o/16.
struct FmtQ6_K {
    static constexpr int QK = 256, BYTES = 210, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        const int n = s >> 2, k = s & 3;
        const float dl = h2f(ld16(b + 208)) * (float)(signed char)b[192 + 8 * n + 2 * k + (p >> 2)];
        const u32 ql = ld32(b + 64 * n + 32 * (k & 1) + 4 * p) >> (4 * (k >> 1));
        const u32 qh = ld32(b + 128 + 32 * n + 4 * p) >> (2 * k);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub(((ql >> (8 * i)) & 15) | (((qh >> (8 * i)) & 3) << 4), 32);
    }
};

// d: f16 | scales_h: u16 | scales_l[4] | qs[128]: sub-block s has 6-bit scale
// (scales_l nibble s) | (scales_h bits 2s, 2s+1) << 4, minus 32; its weights
// are the nibbles of qs[16s ..] as in IQ4_NL.
struct FmtIQ4_XS {
    static constexpr int QK = 256, BYTES = 136, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        const u32 sh = ld16(b + 2);
        const u32 sl = ld32(b + 4);
        const int ls = (int)(((sl >> (4 * s)) & 15) | (((sh >> (2 * s)) & 3) << 4));
        const float dl = h2f(ld16(b)) * (float)(ls - 32);
        const u32 q = ld32(b + 8 + 16 * s + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * iq4_level((q >> (8 * i)) & 15);
    }
};

// X(name, struct) for every format, in the order of KernelFormat::ALL; the
// kernel files instantiate their templates for each.
#define M40_FORMATS(X)   \
    X(f32, FmtF32)       \
    X(f16, FmtF16)       \
    X(bf16, FmtBF16)     \
    X(q8_0, FmtQ8_0)     \
    X(q4_0, FmtQ4_0)     \
    X(q4_1, FmtQ4_1)     \
    X(q5_0, FmtQ5_0)     \
    X(q5_1, FmtQ5_1)     \
    X(q2_k, FmtQ2_K)     \
    X(q3_k, FmtQ3_K)     \
    X(q4_k, FmtQ4_K)     \
    X(q5_k, FmtQ5_K)     \
    X(q6_k, FmtQ6_K)     \
    X(iq4_nl, FmtIQ4_NL) \
    X(iq4_xs, FmtIQ4_XS)
