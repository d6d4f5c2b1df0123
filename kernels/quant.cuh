// GGML weight formats as device building blocks. Each format is a struct with
// its block geometry and two functions over 32-weight sub-block s of the
// block at `blk`:
// - `part(blk, s, p, v)` dequantizes weights 4p .. 4p+3 (p < 8) into
//   registers (the embedding gather, and the reference path);
// - `x8(xs, q, x, y)` loads the 8 values of x that eighth q (< 4) of a
//   sub-block needs (in whatever order the layout makes cheapest; xs is x at
//   the sub-block's first column, 16-byte aligned), and `dot8(blk, s, q, x,
//   y)` returns the dot product of those 8 weights with them, so one load of
//   x serves several rows. Scales multiply the sum, not each weight, and
//   quantized values become floats with one byte_perm (no conversion
//   instruction; no per-weight bias add for the 4-6 bit formats, see
//   `unit_byte`): decode on the M40 is close to issue-bound, so
//   instructions per weight decide speed.
// Formats where that saves nothing build dot8 from part.
//
// Layouts are ggml's (crates/m40-gguf/src/quant/blocks.rs holds the same as
// Rust structs; the CPU dequantization there is the reference). Every block
// size but MXFP4's is even and rows start at even byte offsets, so block
// starts are 2-byte aligned: loads are u16 or pairs of u16, never wider
// (MXFP4's 17-byte blocks load bytes).
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

// 8388608 + byte i of w, as a float (byte_perm puts the byte under the
// exponent of 2^23).
__device__ __forceinline__ float magic_byte(u32 w, int i) {
    return __int_as_float(__byte_perm(w, 0x4b000000u, 0x7440 + i));
}

// sum_i (byte_i(w) - c) * x_i over the 4 bytes of w.
__device__ __forceinline__ float dot4_bytes(u32 w, float4 x, float c) {
    const float k = 8388608.0f + c;
    return (magic_byte(w, 0) - k) * x.x + (magic_byte(w, 1) - k) * x.y + (magic_byte(w, 2) - k) * x.z +
           (magic_byte(w, 3) - k) * x.w;
}

// Bias-free decode for values of up to 6 bits (v < 2^k, k <= 7): a byte
// holding 0x80 | v << (7 - k) under the exponent byte 0x3f is the float
// 1 + v / 2^k, exact. A sum over weights of (1 + v/2^k) * x_i is then
// S = X + (sum v x) / 2^k with X = sum x_i, so sum (v - c) x = 2^k S - (2^k + c) X:
// one byte_perm and one FMA per weight, no per-weight bias subtraction (X is
// computed once per eighth and shared by every row). The leading 1 costs
// precision only in proportion to sum |x|, and the test tolerance covers it.
//
// Float from byte i of t (t's bytes already hold 0x80 | v << (7 - k)).
__device__ __forceinline__ float unit_byte(u32 t, int i) {
    return __int_as_float(__byte_perm(t, 0x3f000000u, 0x7044 | (i << 8)));
}

// acc + sum_i unit_byte(t, i) * x_i.
__device__ __forceinline__ float fma4_units(u32 t, float4 x, float acc) {
    acc = fmaf(unit_byte(t, 0), x.x, acc);
    acc = fmaf(unit_byte(t, 1), x.y, acc);
    acc = fmaf(unit_byte(t, 2), x.z, acc);
    return fmaf(unit_byte(t, 3), x.w, acc);
}

// S over 8 weights: t0's bytes against x, t1's against y.
__device__ __forceinline__ float units8(u32 t0, u32 t1, float4 x, float4 y) {
    return fma4_units(t1, y, fma4_units(t0, x, 0.0f));
}

// Low / high nibbles of each byte of w, placed as 0x80 | v << 3 (k = 4).
__device__ __forceinline__ u32 units_lo4(u32 w) { return ((w << 3) & 0x78787878u) | 0x80808080u; }
__device__ __forceinline__ u32 units_hi4(u32 w) { return ((w >> 1) & 0x78787878u) | 0x80808080u; }
// The same, each in one LOP3: with both constants immediates ptxas emits an
// AND and an OR (a SASS LOP3 takes one immediate), so here they come in
// registers. For the several-token packed GEMV's weights(), whose loop it
// shortens (BENCHMARKS.md, issue 33); in the one-token kernels it removed
// no SASS instruction and made gemv_idglu_q4_1_f32 spill on sm_52.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 units_lo4_op3(u32 w) { return and_or(w << 3, 0x78787878u, 0x80808080u); }
__device__ __forceinline__ u32 units_hi4_op3(u32 w) { return and_or(w >> 1, 0x78787878u, 0x80808080u); }

__device__ __forceinline__ float4 ld_x4(const float* p) { return *(const float4*)p; }

__device__ __forceinline__ float hsum4(float4 x) { return (x.x + x.y) + (x.z + x.w); }
__device__ __forceinline__ float hsum8(float4 x, float4 y) { return hsum4(x) + hsum4(y); }

// Eighth q is weights 8q .. 8q+7 of the sub-block (most formats). x8k: the
// k within the sub-block of the eighth's i-th weight (the order of x8's x, y).
#define X8_CONSECUTIVE                                                                      \
    __device__ static void x8(const float* xs, int q, float4& x, float4& y) {               \
        x = ld_x4(xs + 8 * q), y = ld_x4(xs + 8 * q + 4);                                   \
    }                                                                                       \
    __device__ static int x8k(int q, int i) { return 8 * q + i; }

// Eighth q is weights 4q .. 4q+3 and 16+4q .. 16+4q+3: the low and high
// nibbles of qs[4q .. 4q+3] (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL).
#define X8_NIBBLE_SPLIT                                                                     \
    __device__ static void x8(const float* xs, int q, float4& x, float4& y) {               \
        x = ld_x4(xs + 4 * q), y = ld_x4(xs + 16 + 4 * q);                                  \
    }                                                                                       \
    __device__ static int x8k(int q, int i) { return 4 * q + (i & 3) + 16 * (i >> 2); }

__device__ __forceinline__ float dot4(const float v[4], float4 x) {
    return v[0] * x.x + v[1] * x.y + v[2] * x.z + v[3] * x.w;
}

// dot8 from two parts, for X8_CONSECUTIVE formats.
template <class F>
__device__ __forceinline__ float dot8_via_parts(const u8* b, int s, int q, float4 x, float4 y) {
    float v[4], w[4];
    F::part(b, s, 2 * q, v);
    F::part(b, s, 2 * q + 1, w);
    return dot4(v, x) + dot4(w, y);
}

// dot8 from two parts, for X8_NIBBLE_SPLIT formats (parts q and q + 4).
template <class F>
__device__ __forceinline__ float dot8_via_split_parts(const u8* b, int s, int q, float4 x, float4 y) {
    float v[4], w[4];
    F::part(b, s, q, v);
    F::part(b, s, q + 4, w);
    return dot4(v, x) + dot4(w, y);
}

#define DOT8_VIA_PARTS(F)                                                                   \
    X8_CONSECUTIVE                                                                          \
    __device__ static float dot8(const u8* b, int s, int q, float4 x, float4 y) {           \
        return dot8_via_parts<F>(b, s, q, x, y);                                            \
    }

#define DOT8_VIA_SPLIT_PARTS(F)                                                             \
    X8_NIBBLE_SPLIT                                                                         \
    __device__ static float dot8(const u8* b, int s, int q, float4 x, float4 y) {           \
        return dot8_via_split_parts<F>(b, s, q, x, y);                                      \
    }

// Part p of 16 bytes of packed nibbles at qs (weight j in the low nibble of
// qs[j], j+16 in the high one): the 4 nibbles of weights 4p .. 4p+3, in the
// low 4 bits of each byte of the result (upper bits still to be masked).
__device__ __forceinline__ u32 nibble_part(const u8* qs, int p) { return ld32(qs + 4 * (p & 3)) >> (4 * (p >> 2)); }

// Byte i of w.
__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xff; }

struct FmtF32 {
    static constexpr int QK = 32, BYTES = 128, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float* f = (const float*)b + 4 * p;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = f[i];
    }
    DOT8_VIA_PARTS(FmtF32)
};

struct FmtF16 {
    static constexpr int QK = 32, BYTES = 64, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const u32 a = ld32(b + 8 * p), c = ld32(b + 8 * p + 4);
        v[0] = h2f((u16)a), v[1] = h2f((u16)(a >> 16)), v[2] = h2f((u16)c), v[3] = h2f((u16)(c >> 16));
    }
    X8_CONSECUTIVE
    __device__ static float dot8(const u8* b, int, int q, float4 x, float4 y) {
        const u8* h = b + 16 * q;
        const u32 a0 = ld32(h), a1 = ld32(h + 4), a2 = ld32(h + 8), a3 = ld32(h + 12);
        return h2f((u16)a0) * x.x + h2f((u16)(a0 >> 16)) * x.y + h2f((u16)a1) * x.z + h2f((u16)(a1 >> 16)) * x.w +
               h2f((u16)a2) * y.x + h2f((u16)(a2 >> 16)) * y.y + h2f((u16)a3) * y.z + h2f((u16)(a3 >> 16)) * y.w;
    }
};

struct FmtBF16 {
    static constexpr int QK = 32, BYTES = 64, SUBS = 1, FLOAT = 1;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const u32 a = ld32(b + 8 * p), c = ld32(b + 8 * p + 4);
        v[0] = __uint_as_float(a << 16), v[1] = __uint_as_float(a & 0xffff0000u);
        v[2] = __uint_as_float(c << 16), v[3] = __uint_as_float(c & 0xffff0000u);
    }
    DOT8_VIA_PARTS(FmtBF16)
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
    // Weights 8q .. 8q+7; signed bytes biased by 128 for the magic conversion.
    X8_CONSECUTIVE
    __device__ static float dot8(const u8* b, int, int q, float4 x, float4 y) {
        const u32 w0 = ld32(b + 2 + 8 * q) ^ 0x80808080u, w1 = ld32(b + 6 + 8 * q) ^ 0x80808080u;
        const float sum = dot4_bytes(w0, x, 128.0f) + dot4_bytes(w1, y, 128.0f);
        return h2f(ld16(b)) * sum;
    }
};

// d: f16 | qs[16]: weight j in the low nibble of qs[j], j+16 in the high one.
// Part p: bytes 4(p%4) .. +3, low nibbles for p < 4, high ones after.
struct FmtQ4_0 {
    static constexpr int QK = 32, BYTES = 18, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 q = nibble_part(b + 2, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub((q >> (8 * i)) & 15, 8) * d;
    }
    // Weights 4q .. 4q+3 (low nibbles of qs[4q ..]) and 16+4q .. (high nibbles).
    X8_NIBBLE_SPLIT
    __device__ static float dot8(const u8* b, int, int q, float4 x, float4 y) {
        const u32 w = ld32(b + 2 + 4 * q);
        const float S = units8(units_lo4(w), units_hi4(w), x, y);
        return h2f(ld16(b)) * fmaf(16.0f, S, -24.0f * hsum8(x, y));
    }
};

// d, m: f16 | qs[16]
struct FmtQ4_1 {
    static constexpr int QK = 32, BYTES = 20, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u32 q = nibble_part(b + 4, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub((q >> (8 * i)) & 15, 0) * d + m;
    }
    // As Q4_0, plus m * sum(x).
    X8_NIBBLE_SPLIT
    __device__ static float dot8(const u8* b, int, int q, float4 x, float4 y) {
        const u32 w = ld32(b + 4 + 4 * q);
        const float S = units8(units_lo4(w), units_hi4(w), x, y);
        const float d = h2f(ld16(b)), X = hsum8(x, y);
        return fmaf(16.0f * d, S, (h2f(ld16(b + 2)) - 16.0f * d) * X);
    }
};

// d: f16 | qh: u32, bit o = 5th bit of weight o | qs[16] as Q4_0
struct FmtQ5_0 {
    static constexpr int QK = 32, BYTES = 22, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 qh = ld32(b + 2) >> (4 * p);
        const u32 q = nibble_part(b + 6, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub(((q >> (8 * i)) & 15) | (((qh >> i) & 1) << 4), 16) * d;
    }
    DOT8_VIA_SPLIT_PARTS(FmtQ5_0)
};

// d, m: f16 | qh: u32 | qs[16]
struct FmtQ5_1 {
    static constexpr int QK = 32, BYTES = 24, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        const u32 qh = ld32(b + 4) >> (4 * p);
        const u32 q = nibble_part(b + 8, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = u2f_sub(((q >> (8 * i)) & 15) | (((qh >> i) & 1) << 4), 0) * d + m;
    }
    DOT8_VIA_SPLIT_PARTS(FmtQ5_1)
};

// d: f16 | qs[16]: 4-bit indices into the IQ4 levels, nibbles as Q4_0
struct FmtIQ4_NL {
    static constexpr int QK = 32, BYTES = 18, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = h2f(ld16(b));
        const u32 q = nibble_part(b + 2, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = d * iq4_level((q >> (8 * i)) & 15);
    }
    DOT8_VIA_SPLIT_PARTS(FmtIQ4_NL)
};

// 4 bytes at any address (little-endian): two aligned words and a funnel
// shift. Reads up to 3 bytes past p + 3, within the same aligned word.
__device__ __forceinline__ u32 ld32_any(const u8* p) {
    const u32* a = (const u32*)((unsigned long long)p & ~3ull);
    return __funnelshift_r(a[0], a[1], ((u32)(unsigned long long)p & 3u) * 8u);
}

// MXFP4's E2M1 levels (doubled) of a 4-bit index, by byte_perm as
// iq4_level: 0 1 2 3 4 6 8 12, then their negatives.
__device__ __forceinline__ float fp4_level(int q) {
    const u32 t0 = 0x03020100u, t1 = 0x0c080604u;  // 0 1 2 3 | 4 6 8 12
    const u32 t2 = 0xfdfeff00u, t3 = 0xf4f8fafcu;  // 0 -1 -2 -3 | -4 -6 -8 -12
    const u32 b = q < 8 ? __byte_perm(t0, t1, q) : __byte_perm(t2, t3, q - 8);
    return u2f_sub((b & 0xff) ^ 0x80, 128);
}

// The unit bytes (see unit_byte: k = 5, v = level + 12 in 0 .. 24) of four
// FP4 indices, one in the low 4 bits of each byte of n (upper bits zero):
// the magnitude index (bits 0-2) of all four selects from an 8-byte table
// in one byte_perm, once from the positive levels' and once from the
// negative ones', and the sign bits pick per byte.
__device__ __forceinline__ u32 fp4_units(u32 n) {
    const u32 m3 = n & 0x07070707u, y = m3 | (m3 >> 4);
    const u32 sel = __byte_perm(y, 0u, 0x0020u);  // the four 3-bit indices as nibbles
    const u32 pos = __byte_perm(0xbcb8b4b0u, 0xe0d0c8c0u, sel);  // 0x80 | (12 + level) << 2
    const u32 neg = __byte_perm(0xa4a8acb0u, 0x809098a0u, sel);  // 0x80 | (12 - level) << 2
    u32 sign;  // 0xff where negative: prmt's sign-replicating selectors (8 + byte)
    asm("prmt.b32 %0, %1, 0, 0xba98;" : "=r"(sign) : "r"((n << 4) & 0x80808080u));
    return (pos & ~sign) | (neg & sign);
}

// e: E8M0 | qs[16]: 4-bit indices into the FP4 levels, nibbles as Q4_0;
// x = 2^(e - 128) * level (ggml's GGML_E8M0_TO_FP32_HALF; e = 0 and 1
// are denormal scales, flushed to zero as everything here is). 17-byte
// blocks start at any byte: loads are bytes or ld32_any.
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

struct FmtMXFP4 {
    static constexpr int QK = 32, BYTES = 17, SUBS = 1, FLOAT = 0;
    __device__ static void part(const u8* b, int, int p, float v[4]) {
        const float d = e8m0_half(b[0]);
        const u32 q = ld32_any(b + 1 + 4 * (p & 3)) >> (4 * (p >> 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = d * fp4_level((q >> (8 * i)) & 15);
    }
    // As Q4_0's: sum level x = 32 S - 44 X over the unit floats 1 + v/32.
    X8_NIBBLE_SPLIT
    __device__ static float dot8(const u8* b, int, int q, float4 x, float4 y) {
        const u32 w = ld32_any(b + 1 + 4 * q);
        const float S = units8(fp4_units(w & 0x0f0f0f0fu), fp4_units((w >> 4) & 0x0f0f0f0fu), x, y);
        return e8m0_half(b[0]) * fmaf(32.0f, S, -44.0f * hsum8(x, y));
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
    DOT8_VIA_PARTS(FmtQ2_K)
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
    DOT8_VIA_PARTS(FmtQ3_K)
};

// (scale, min) of sub-block j from the 12 packed bytes at q (Q4_K, Q5_K),
// without branches (lanes of one warp ask for different j).
__device__ __forceinline__ void scale_min_k4(const u8* q, int j, float& sc, float& m) {
    const int i = j & 3;
    const u32 a = q[i], b = q[i + 4], c = q[i + 8];
    const u32 s = j < 4 ? a & 63 : (c & 15) | ((a >> 6) << 4);
    const u32 n = j < 4 ? b & 63 : (c >> 4) | ((b >> 6) << 4);
    sc = u2f_sub(s, 0);
    m = u2f_sub(n, 0);
}

// The scale and offset of sub-block s of a Q4_K / Q5_K block: weight = dl * q - ml.
__device__ __forceinline__ void k4_scale(const u8* b, int s, float& dl, float& ml) {
    float sc, m;
    scale_min_k4(b + 4, s, sc, m);
    dl = h2f(ld16(b)) * sc;
    ml = h2f(ld16(b + 2)) * m;
}

// Formats whose per-sub-block scale is costly to unpack (Q4_K, Q5_K) also
// offer `scale(blk, s, dl, ml)` and `dot8_scaled(blk, s, q, x, y, dl, ml)`,
// so that the 4 lanes sharing a sub-block can unpack one row's scale each and
// exchange them (gemv.cu `GemvRows`).
#define K4_SCALED_DOT8                                                                      \
    __device__ static void scale(const u8* b, int s, float& dl, float& ml) { k4_scale(b, s, dl, ml); } \
    __device__ static float dot8(const u8* b, int s, int q, float4 x, float4 y) {           \
        float dl, ml;                                                                       \
        k4_scale(b, s, dl, ml);                                                             \
        return dot8_scaled(b, s, q, x, y, dl, ml);                                          \
    }

// d, dmin: f16 | scales[12] | qs[128]: sub-block s in the low (s even) or
// high (s odd) nibbles of qs[32*(s/2) ..]
struct FmtQ4_K {
    static constexpr int QK = 256, BYTES = 144, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        float dl, ml;
        k4_scale(b, s, dl, ml);
        const u32 q = ld32(b + 16 + 32 * (s >> 1) + 4 * p) >> (4 * (s & 1));
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub((q >> (8 * i)) & 15, 0) - ml;
    }
    // Weights 8q .. 8q+7 of the sub-block: nibble s%2 of qs[32(s/2) + 8q ..].
    X8_CONSECUTIVE
    __device__ static float dot8_scaled(const u8* b, int s, int q, float4 x, float4 y, float dl, float ml) {
        const u8* qp = b + 16 + 32 * (s >> 1) + 8 * q;
        // Nibble s%2 of each byte to bits 3..6: a rotate right by 1 (high)
        // or left by 3 (low), then one mask-and-or.
        const int rot = s & 1 ? 1 : 29;
        const u32 w0 = ld32(qp), w1 = ld32(qp + 4);
        const u32 t0 = (__funnelshift_r(w0, w0, rot) & 0x78787878u) | 0x80808080u;
        const u32 t1 = (__funnelshift_r(w1, w1, rot) & 0x78787878u) | 0x80808080u;
        const float S = units8(t0, t1, x, y);
        return fmaf(16.0f * dl, S, -(16.0f * dl + ml) * hsum8(x, y));
    }
    K4_SCALED_DOT8
};

// d, dmin: f16 | scales[12] | qh[32]: bit s of qh[o] is the 5th bit | qs[128] as Q4_K
struct FmtQ5_K {
    static constexpr int QK = 256, BYTES = 176, SUBS = 8, FLOAT = 0;
    __device__ static void part(const u8* b, int s, int p, float v[4]) {
        float dl, ml;
        k4_scale(b, s, dl, ml);
        const u32 q = ld32(b + 48 + 32 * (s >> 1) + 4 * p) >> (4 * (s & 1));
        const u32 qh = ld32(b + 16 + 4 * p) >> s;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * u2f_sub(((q >> (8 * i)) & 15) | (((qh >> (8 * i)) & 1) << 4), 0) - ml;
    }
    // Weights 8q .. 8q+7: nibble s%2 of qs[32(s/2) + 8q ..], bit s of
    // qh[8q ..], as 0x80 | v << 2 (k = 5).
    X8_CONSECUTIVE
    __device__ static float dot8_scaled(const u8* b, int s, int q, float4 x, float4 y, float dl, float ml) {
        const u8* qp = b + 48 + 32 * (s >> 1) + 8 * q;
        const u8* hp = b + 16 + 8 * q;
        const int sh = 4 * (s & 1);
        const u32 t0 = (((ld32(qp) >> sh) & 0x0f0f0f0fu) << 2) | (((ld32(hp) >> s) & 0x01010101u) << 6) | 0x80808080u;
        const u32 t1 =
            (((ld32(qp + 4) >> sh) & 0x0f0f0f0fu) << 2) | (((ld32(hp + 4) >> s) & 0x01010101u) << 6) | 0x80808080u;
        const float S = units8(t0, t1, x, y);
        return fmaf(32.0f * dl, S, -(32.0f * dl + ml) * hsum8(x, y));
    }
    K4_SCALED_DOT8
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
    // Weights 8q .. 8q+7 of the sub-block (scale 8n + 2k + q/2).
    X8_CONSECUTIVE
    __device__ static float dot8(const u8* b, int s, int q, float4 x, float4 y) {
        const int n = s >> 2, k = s & 3;
        const float dl = h2f(ld16(b + 208)) * (float)(signed char)b[192 + 8 * n + 2 * k + (q >> 1)];
        const u8* ql = b + 64 * n + 32 * (k & 1) + 8 * q;
        const u8* qh = b + 128 + 32 * n + 8 * q;
        const int lsh = 4 * (k >> 1), hsh = 2 * k;
        // The 6-bit values as 0x80 | v << 1 (k = 6).
        const u32 t0 = (((ld32(ql) >> lsh) & 0x0f0f0f0fu) << 1) | (((ld32(qh) >> hsh) & 0x03030303u) << 5) | 0x80808080u;
        const u32 t1 =
            (((ld32(ql + 4) >> lsh) & 0x0f0f0f0fu) << 1) | (((ld32(qh + 4) >> hsh) & 0x03030303u) << 5) | 0x80808080u;
        const float S = units8(t0, t1, x, y);
        return dl * fmaf(64.0f, S, -96.0f * hsum8(x, y));
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
        const u32 q = nibble_part(b + 8 + 16 * s, p);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dl * iq4_level((q >> (8 * i)) & 15);
    }
    DOT8_VIA_PARTS(FmtIQ4_XS)
};

// X(name, struct) for one format (M40_FORMAT_<name>), and for every format in
// the order of KernelFormat::ALL (M40_FORMATS); the kernel files instantiate
// their templates for each (or, compiled in parts, for one: M40_PART_FORMATS).
#define M40_FORMAT_f32(X) X(f32, FmtF32)
#define M40_FORMAT_f16(X) X(f16, FmtF16)
#define M40_FORMAT_bf16(X) X(bf16, FmtBF16)
#define M40_FORMAT_q8_0(X) X(q8_0, FmtQ8_0)
#define M40_FORMAT_q4_0(X) X(q4_0, FmtQ4_0)
#define M40_FORMAT_q4_1(X) X(q4_1, FmtQ4_1)
#define M40_FORMAT_q5_0(X) X(q5_0, FmtQ5_0)
#define M40_FORMAT_q5_1(X) X(q5_1, FmtQ5_1)
#define M40_FORMAT_q2_k(X) X(q2_k, FmtQ2_K)
#define M40_FORMAT_q3_k(X) X(q3_k, FmtQ3_K)
#define M40_FORMAT_q4_k(X) X(q4_k, FmtQ4_K)
#define M40_FORMAT_q5_k(X) X(q5_k, FmtQ5_K)
#define M40_FORMAT_q6_k(X) X(q6_k, FmtQ6_K)
#define M40_FORMAT_iq4_nl(X) X(iq4_nl, FmtIQ4_NL)
#define M40_FORMAT_iq4_xs(X) X(iq4_xs, FmtIQ4_XS)
#define M40_FORMAT_mxfp4(X) X(mxfp4, FmtMXFP4)
#define M40_FORMATS(X) M40_FORMAT_f32(X) M40_FORMAT_f16(X) M40_FORMAT_bf16(X) M40_FORMAT_q8_0(X) M40_FORMAT_q4_0(X) M40_FORMAT_q4_1(X) M40_FORMAT_q5_0(X) M40_FORMAT_q5_1(X) M40_FORMAT_q2_k(X) M40_FORMAT_q3_k(X) M40_FORMAT_q4_k(X) M40_FORMAT_q5_k(X) M40_FORMAT_q6_k(X) M40_FORMAT_iq4_nl(X) M40_FORMAT_iq4_xs(X) M40_FORMAT_mxfp4(X)

// X(name, Parts*) (packed.cuh) for one format's packed layout (M40_PACKED_<name>: empty for
// formats without one), and for every packed format (M40_PACKED_FORMATS).
#define M40_PACKED_f32(X)
#define M40_PACKED_f16(X) X(f16, PartsF16)
#define M40_PACKED_bf16(X)
#define M40_PACKED_q8_0(X) X(q8_0, PartsQ8_0)
#define M40_PACKED_q4_0(X) X(q4_0, PartsQ4_0)
#define M40_PACKED_q4_1(X) X(q4_1, PartsQ4_1)
#define M40_PACKED_q5_0(X)
#define M40_PACKED_q5_1(X)
#define M40_PACKED_q2_k(X)
#define M40_PACKED_q3_k(X)
#define M40_PACKED_q4_k(X) X(q4_k, PartsQ4_K)
#define M40_PACKED_q5_k(X)
#define M40_PACKED_q6_k(X) X(q6_k, PartsQ6_K)
#define M40_PACKED_iq4_nl(X)
#define M40_PACKED_iq4_xs(X)
#define M40_PACKED_mxfp4(X) X(mxfp4, PartsMXFP4)
#define M40_PACKED_FORMATS(X) M40_PACKED_f16(X) M40_PACKED_q8_0(X) M40_PACKED_q4_0(X) M40_PACKED_q4_1(X) M40_PACKED_q4_k(X) M40_PACKED_q6_k(X) M40_PACKED_mxfp4(X)

// A source compiled in parts (its `// m40-parts:` line; cargo xtask ptx
// compiles it once a part into kernels/ptx/NAME.PART.ptx, so that a model
// JIT-compiles only the formats it holds) sees M40_PART defined as the
// format of the part, or M40_PART_COMMON for the part of its format-free
// kernels. M40_PART_FORMATS / M40_PART_PACKED list the formats to
// instantiate; M40_WITH_COMMON says whether the format-free kernels belong.
// A source compiled whole sees every format and the common kernels.
#define M40_CAT_(a, b) a##b
#define M40_CAT(a, b) M40_CAT_(a, b)
#if defined(M40_PART)
#define M40_PART_FORMATS(X) M40_CAT(M40_FORMAT_, M40_PART)(X)
#define M40_PART_PACKED(X) M40_CAT(M40_PACKED_, M40_PART)(X)
#elif defined(M40_PART_COMMON)
#define M40_PART_FORMATS(X)
#define M40_PART_PACKED(X)
#define M40_WITH_COMMON
#else
#define M40_PART_FORMATS(X) M40_FORMATS(X)
#define M40_PART_PACKED(X) M40_PACKED_FORMATS(X)
#define M40_WITH_COMMON
#endif
