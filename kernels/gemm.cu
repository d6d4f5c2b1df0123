// m40-parts: common f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs mxfp4
// Prefill matmul: Y = X W^T (+ Y), for weights in any GGML format,
// dequantized in the tile loader (never expanded in global memory).
//
// Layout: W (N rows, row_bytes each) in its GGUF format; X (M, K) FP32
// row-major, 16-byte aligned; Y (M, N) FP32 row-major, or for stacked
// matrices (fused Q/K/V, gate/up) one (M, rows) part per matrix (common.cuh
// RowParts: Y, Y1, Y2 split at rows r1, r2). K is a multiple of 32 (one
// sub-block per k-step).
// Launch: grid (ceil(N / BN), ceil(M / BM)), block Tile::THREADS, for the
// tile of the kernel's name: gemm_* 64 x 128 (BM tokens x BN weight rows,
// 128 threads), gemm_small_* 64 x 64 (256 threads; prompts of at most 64
// tokens, and matrices too small to fill the GPU with the large tile),
// gemm_narrow_packed_* 32 x 128 (128 threads; packed weights, at most 32
// tokens).
//
// Why this shape on Maxwell: a block computes a BM x BN tile of Y from
// k-steps of 32 (one quantized sub-block). Each thread holds a TM x TN
// register tile (8 x 8 in the large tile: every float4 read from shared
// memory feeds 32 FMAs, so the FMA units, not the shared-memory port, set
// the pace) as float4 groups, so the threads of a warp that read one k row
// of a tile read contiguous bytes (no bank conflicts); both tiles are
// stored k-major. Two shared stages (48 KB in the large tile, the most a
// block may have): the next k-step's weights and X are loaded into
// registers as a step starts and stored to the other stage halfway through
// its FMAs, so global latency, the decode and the stores hide behind the
// FMAs, with one barrier a step. Packed weights stay raw words (a few
// registers) until they are stored, and are dequantized then (packed.cuh
// fetch / decode: scales applied once per 4 weights); GGUF-layout weights
// are dequantized as they load. Each weight is dequantized once per block
// and used by BM tokens. The large tile's 128 threads (147-167 registers
// on sm_52) run 3 blocks per SM where shared memory allows (the H100;
// the M40's 96 KB a SM holds 2): a barrier stalls a third of an SM's
// warps, not all of them (an H100 profile of the 128 x 128 tile, one
// 256-thread block per SM, had them waiting at its two barriers a step).
//
// Split over K: with gridDim.z = S > 1, block z computes the k-steps of its
// S-th of K and writes its partial tile to plane z of Y (S planes (M, N),
// one part, accumulate 0); gemm_reduce_f32 then adds the planes in order
// into the real outputs. The launcher splits where the tiles would fill
// the GPU's block slots badly (gemm_k_splits).
//
// gemm_packed_<fmt>_f32: the same over weights in the packed layout of the
// decode GEMV (packed.cuh; row_bytes unused), so a model whose formats have
// a packed GEMV keeps only that copy of its weights.
#include "common.cuh"
#include "packed.cuh"

#define GEMM_BK 32  // k per step: one sub-block

// The weights of a GGUF row-major matrix: parts q and q + 4 of 32-weight
// sub-block sb of row n, dequantized when fetched (quant.cuh has no raw
// form of its formats).
template <class F>
struct RowMajor {
    struct Raw {
        float v[2][4];
    };
    __device__ static void fetch(const u8* W, long long row_bytes, int, int, int n, int sb, int q, Raw& r) {
        const u8* blk = W + (long long)n * row_bytes + (long long)(sb / F::SUBS) * F::BYTES;
        F::part(blk, sb % F::SUBS, q, r.v[0]);
        F::part(blk, sb % F::SUBS, q + 4, r.v[1]);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v0[j] = r.v[0][j], v1[j] = r.v[1][j];
    }
};

// The weights of a packed matrix (packed.cuh): the raw words are fetched
// into the stage and decoded only when it is stored, so the loads are in
// flight during the k-step's FMAs.
template <class P>
struct Packed {
    typedef typename P::Raw Raw;
    __device__ static void fetch(const u8* W, long long, int N, int K, int n, int sb, int q, Raw& r) {
        P::fetch(W, N, K, n, sb, q, r);
    }
    __device__ static void decode(const Raw& r, float v0[4], float v1[4]) { P::decode(r, v0, v1); }
};

// A BM x BN tile: TM x TN outputs per thread, as TM/4 x TN/4 float4 groups;
// (BM / TM) x (BN / TN) threads, thread t at tx = t % (BN / TN) along the
// weight rows and ty = t / (BN / TN) along the tokens. UNROLL: the k
// loops' unrolling (8: whole). VSTORE: a thread's 4 consecutive rows are
// stored as one float4 where they can be (see gemm_tile; the narrow tile
// only: the others spilled on sm_52 with it). XPAIR: X's loader puts two
// lanes on each token's row (x_token below).
template <int BM_, int BN_, int TM_, int TN_, int UNROLL_ = 4, bool VSTORE_ = false, bool XPAIR_ = false>
struct Tile {
    static constexpr int BM = BM_, BN = BN_, TM = TM_, TN = TN_, UNROLL = UNROLL_;
    static constexpr bool VSTORE = VSTORE_, XPAIR = XPAIR_;
    static constexpr int NX = BN / TN, NY = BM / TM, THREADS = NX * NY;
    // Loaders: ByRow's thread t takes weight row t % BN, parts q = t / BN +
    // c * QW (and q + 4), c < WC; X: token t % BM, float4s f = t / BM + c *
    // QX, c < XC.
    static constexpr int QW = THREADS / BN, WC = 4 / QW;
    static constexpr int QX = THREADS / BM, XC = 8 / QX;
    static_assert(TM % 4 == 0 && TN % 4 == 0 && QW * WC == 4 && QX * XC == 8, "tile shape");
    static_assert(!XPAIR || (BM == 32 && THREADS == 128), "paired X loads: the narrow tile");
};

// X's loader: thread t loads float4 x_quad(t, c) (k 4f .. 4f + 3 of the
// k-step), c < XC, of token x_token(t). With T::XPAIR lane pairs take two
// adjacent float4s of 16 tokens (whole 32-byte sectors; their shared stores
// then meet 2 a bank); by default a warp takes one float4 of each of 32
// tokens (16 bytes of each sector): the second arms below. gemm_load and
// gemm_store call these only with XPAIR and spell the default out, so the
// other tiles' PTX stays what was measured (through these, their sm_52
// registers and spills moved). H100: the narrow tile's Q4_0 at 32 tokens
// 4-8% faster, Q6_K within 2% (BENCHMARKS.md, issue 33).
template <class T>
__device__ __forceinline__ int x_token(int t) {
    return T::XPAIR ? ((t & 31) >> 1) + 16 * ((t >> 5) & 1) : t % T::BM;
}
template <class T>
__device__ __forceinline__ int x_quad(int t, int c) {
    return T::XPAIR ? 2 * ((t >> 6) + 2 * c) + (t & 1) : t / T::BM + c * T::QX;
}

// Row loaders (RowMajor, Packed): thread t takes weight row t % BN, parts
// q = t / BN + c * QW (and q + 4), c < WC, of the k-step's sub-block, and
// stores them to Ws[k][n] (consecutive threads write consecutive n of one
// k row: no bank conflicts). Rows past the matrix load zeros.
template <class L>
struct ByRow {
    template <class T>
    struct Stage {
        typename L::Raw w[T::WC];
    };
    template <class T>
    __device__ static void load(const u8* __restrict__ W, long long row_bytes, int N, int K, int n0, int k0,
                                Stage<T>& st) {
        const int t = threadIdx.x;
        const int n = n0 + t % T::BN;
#pragma unroll
        for (int c = 0; c < T::WC; ++c) {
            if (n < N) {
                L::fetch(W, row_bytes, N, K, n, k0 >> 5, t / T::BN + c * T::QW, st.w[c]);
            } else {
                st.w[c] = typename L::Raw{};
            }
        }
    }
    template <class T>
    __device__ static void store(const Stage<T>& st, float (*Ws)[T::BN]) {
        const int t = threadIdx.x, r = t % T::BN;
#pragma unroll
        for (int c = 0; c < T::WC; ++c) {
            const int q = t / T::BN + c * T::QW;
            float v0[4], v1[4];
            L::decode(st.w[c], v0, v1);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                Ws[4 * q + j][r] = v0[j];
                Ws[16 + 4 * q + j][r] = v1[j];
            }
        }
    }
};

// The quad loader (one thread per quad: BN threads; Q6_K's in the large
// tile, Q4_0's and Q6_K's in the narrow one):
// each thread takes a group of the tile's rows (4 rows) and an eighth of
// the k-step's block, the packed layout's own unit (packed.cuh Quad:
// 16-byte loads of the 4 rows side by side, their scales in one load), and
// stores each of its 8 columns' 4 rows with one 16-byte store. For Q6_K a
// thread issues 4 loads and 8 stores a k-step, against 24 loads and 32
// stores fetching rows (LargeLoader below: the other formats measured
// faster by rows). Groups past the matrix load zeros.
// Thread t's group and eighth: the 8 threads of a quarter-warp take 8
// consecutive groups of one eighth, so each 16-byte store of theirs is 128
// contiguous bytes of a k row (one shared-memory wavefront; with the four
// eighths of 2 groups they hit the same banks 4 times and this loader ran
// 9% slower than the row loader on an H100).
__device__ __forceinline__ int quad_group(int t) { return 8 * (t >> 5) + (t & 7); }
__device__ __forceinline__ int quad_eighth(int t) { return (t >> 3) & 3; }

template <class P>
struct ByQuad {
    template <class T>
    struct Stage {
        typename P::Quad w;
    };
    template <class T>
    __device__ static void load(const u8* __restrict__ W, long long, int N, int K, int n0, int k0, Stage<T>& st) {
        static_assert(T::THREADS == T::BN, "one quad (4 rows x an eighth of a block) per thread");
        const int g = (n0 >> 2) + quad_group(threadIdx.x);
        if (4 * g < N) {
            P::fetch_quad(W, N, K, g, k0 >> 5, quad_eighth(threadIdx.x), st.w);
        } else {
            st.w = typename P::Quad{};
        }
    }
    template <class T>
    __device__ static void store(const Stage<T>& st, float (*Ws)[T::BN]) {
        const int r = 4 * quad_group(threadIdx.x), e = quad_eighth(threadIdx.x);
        float4 v[8];
        P::decode_quad(st.w, e, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) *(float4*)&Ws[P::quad_k(e, i)][r] = v[i];
    }
};

// The register half of the double buffer: the loader's raw weight words
// and the float4s of X.
template <class T, class L>
struct GemmStage {
    typename L::template Stage<T> w;
    float4 x[T::XC];
};

// Load k-step `k0` of the tile at (m0, n0) into registers; rows and tokens
// past the matrix load zeros.
// R: where token m's row of X is (ContigRows: row m; GatheredRows, with m0
// = 0: a mixture's slots, gemm_grp below); order is read only below M.
template <class T, class L, class R = ContigRows>
__device__ __forceinline__ void gemm_load(const u8* __restrict__ W, const float* __restrict__ X, int M, int N,
                                          int K, long long row_bytes, int m0, int n0, int k0, GemmStage<T, L>& st,
                                          const R& rows = R()) {
    L::template load<T>(W, row_bytes, N, K, n0, k0, st.w);
    const int t = threadIdx.x;
    if (T::XPAIR) {
        const int m = m0 + x_token<T>(t);
        const float* xr = X + (long long)(R::CONTIG ? m : m < M ? rows.x_row(m) : 0) * K + k0;
#pragma unroll
        for (int c = 0; c < T::XC; ++c)
            st.x[c] = m < M ? ld_x4(xr + 4 * x_quad<T>(t, c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
        const int m = m0 + t % T::BM;
        const float* xr = X + (long long)(R::CONTIG ? m : m < M ? rows.x_row(m) : 0) * K + k0;
#pragma unroll
        for (int c = 0; c < T::XC; ++c)
            st.x[c] = m < M ? ld_x4(xr + 4 * (t / T::BM + c * T::QX)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Decode a stage and store it k-major: Ws[k][n], Xs[k][m] (consecutive
// threads write consecutive m of one k row: no bank conflicts).
template <class T, class L>
__device__ __forceinline__ void gemm_store(const GemmStage<T, L>& st, float (*Ws)[T::BN], float (*Xs)[T::BM]) {
    L::template store<T>(st.w, Ws);
    if (T::XPAIR) {
        const int m = x_token<T>(threadIdx.x);
#pragma unroll
        for (int c = 0; c < T::XC; ++c) {
            const int f = x_quad<T>(threadIdx.x, c);
            Xs[4 * f + 0][m] = st.x[c].x;
            Xs[4 * f + 1][m] = st.x[c].y;
            Xs[4 * f + 2][m] = st.x[c].z;
            Xs[4 * f + 3][m] = st.x[c].w;
        }
    } else {
        const int m = threadIdx.x % T::BM;
#pragma unroll
        for (int c = 0; c < T::XC; ++c) {
            const int f = threadIdx.x / T::BM + c * T::QX;
            Xs[4 * f + 0][m] = st.x[c].x;
            Xs[4 * f + 1][m] = st.x[c].y;
            Xs[4 * f + 2][m] = st.x[c].z;
            Xs[4 * f + 3][m] = st.x[c].w;
        }
    }
}

// Row k of the stored tiles: thread (tx, ty)'s TM tokens and TN weight
// rows, as float4 groups 4 NY (tokens) and 4 NX (rows) apart.
template <class T>
__device__ __forceinline__ void gemm_frag(const float (*Xs)[T::BM], const float (*Ws)[T::BN], int k, int tx, int ty,
                                          float* av, float* bv) {
#pragma unroll
    for (int g = 0; g < T::TM / 4; ++g) {
        const float4 a = *(const float4*)&Xs[k][(g * T::NY + ty) * 4];
        av[4 * g] = a.x, av[4 * g + 1] = a.y, av[4 * g + 2] = a.z, av[4 * g + 3] = a.w;
    }
#pragma unroll
    for (int g = 0; g < T::TN / 4; ++g) {
        const float4 b = *(const float4*)&Ws[k][(g * T::NX + tx) * 4];
        bv[4 * g] = b.x, bv[4 * g + 1] = b.y, bv[4 * g + 2] = b.z, bv[4 * g + 3] = b.w;
    }
}

template <class T>
__device__ __forceinline__ void gemm_fma(const float* av, const float* bv, float (*acc)[T::TN]) {
#pragma unroll
    for (int i = 0; i < T::TM; ++i)
#pragma unroll
        for (int j = 0; j < T::TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
}

// One block's tile of Y = X W^T (+ Y when `accumulate`). Thread (tx, ty)
// computes tokens 4 (g NY + ty) + i and weight rows 4 (g NX + tx) + j.
// R: where token m's rows of X and Y are (gemm_load; GatheredRows: Y row
// order[m], m0 = 0).
template <class T, class L, class R = ContigRows>
__device__ __forceinline__ void gemm_tile(const u8* __restrict__ W, const float* __restrict__ X, const RowParts Y,
                                          int M, int N, int K, long long row_bytes, int accumulate, int m0, int n0,
                                          const R& rows = R()) {
    // Two shared stages: step i computes from stage i & 1 while the next
    // step's tiles (loaded into registers as the step starts) are stored to
    // the other one halfway through it, so the loads' latency, the decode
    // and the stores hide behind the FMAs of the other warps, and a step
    // has one barrier.
    __shared__ __align__(16) float Ws[2][GEMM_BK][T::BN];
    __shared__ __align__(16) float Xs[2][GEMM_BK][T::BM];
    const int tx = threadIdx.x % T::NX, ty = threadIdx.x / T::NX;
    // Split over K: split z's partial tile goes to its own (M, N) plane
    // of Y (one part), summed by gemm_reduce_f32.
    const long long part = gridDim.z > 1 ? (long long)blockIdx.z * M * N : 0;
    float acc[T::TM][T::TN];
#pragma unroll
    for (int i = 0; i < T::TM; ++i)
#pragma unroll
        for (int j = 0; j < T::TN; ++j) acc[i][j] = 0.0f;

    // Split over K (gridDim.z > 1): this block's share of the k-steps.
    const int steps = K / GEMM_BK, per = (steps + gridDim.z - 1) / gridDim.z;
    const int k_lo = blockIdx.z * per * GEMM_BK, k_hi = min(K, k_lo + per * GEMM_BK);
    GemmStage<T, L> st;
    if (k_lo < k_hi) {
        gemm_load<T, L, R>(W, X, M, N, K, row_bytes, m0, n0, k_lo, st, rows);
        gemm_store<T, L>(st, Ws[0], Xs[0]);
    }
    __syncthreads();
    for (int k0 = k_lo, cur = 0; k0 < k_hi; k0 += GEMM_BK, cur ^= 1) {
        const bool next = k0 + GEMM_BK < k_hi;
        if (next) gemm_load<T, L, R>(W, X, M, N, K, row_bytes, m0, n0, k0 + GEMM_BK, st, rows);
        // The k-step's fragments double-buffered in registers: the
        // shared-memory loads of row k + 1 are issued before the FMAs of
        // row k (an H100 profile of the single-buffered loop had the warps
        // stalled mostly on these loads; this measured 3-6% faster there).
        float a0[T::TM], b0[T::TN], a1[T::TM], b1[T::TN];
        gemm_frag<T>(Xs[cur], Ws[cur], 0, tx, ty, a0, b0);
#pragma unroll T::UNROLL
        for (int k = 0; k < GEMM_BK / 2; k += 2) {
            gemm_frag<T>(Xs[cur], Ws[cur], k + 1, tx, ty, a1, b1);
            gemm_fma<T>(a0, b0, acc);
            gemm_frag<T>(Xs[cur], Ws[cur], k + 2, tx, ty, a0, b0);
            gemm_fma<T>(a1, b1, acc);
        }
        if (next) gemm_store<T, L>(st, Ws[cur ^ 1], Xs[cur ^ 1]);
#pragma unroll T::UNROLL
        for (int k = GEMM_BK / 2; k < GEMM_BK; k += 2) {
            gemm_frag<T>(Xs[cur], Ws[cur], k + 1, tx, ty, a1, b1);
            gemm_fma<T>(a0, b0, acc);
            if (k + 2 < GEMM_BK) gemm_frag<T>(Xs[cur], Ws[cur], k + 2, tx, ty, a0, b0);
            gemm_fma<T>(a1, b1, acc);
        }
        __syncthreads();
    }

    // With T::VSTORE a thread's 4 consecutive rows of a group go out as one
    // 16-byte store where they lie in one part of Y, 16-byte aligned (a
    // warp's scalar stores used 8 of each 32-byte sector: an H200 profile
    // of the narrow tile); else one by one. The sums are the same either way.
#pragma unroll
    for (int i = 0; i < T::TM; ++i) {
        const int m = m0 + ((i / 4) * T::NY + ty) * 4 + i % 4;
        if (m >= M) continue;
        const int ym = R::CONTIG ? m : rows.y_row(m);
        if (T::VSTORE) {
#pragma unroll
            for (int g = 0; g < T::TN / 4; ++g) {
                const int n = n0 + (g * T::NX + tx) * 4;
                if (n < N) store_row4(Y, part, ym, n, N, &acc[i][4 * g], accumulate);
            }
        } else {
#pragma unroll
            for (int j = 0; j < T::TN; ++j) {
                const int n = n0 + ((j / 4) * T::NX + tx) * 4 + j % 4;
                if (n >= N) continue;
                float* y = Y.at(ym, n) + part;
                *y = accumulate ? *y + acc[i][j] : acc[i][j];
            }
        }
    }
}

// The large tile is compiled for three blocks per SM (at most 170
// registers on sm_52; 128 x 64 ran 8-23% slower than 64 x 128 on an H100:
// BENCHMARKS.md, prefill GEMM); the small one for four (64 registers).
typedef Tile<64, 128, 8, 8> Large;
typedef Tile<64, 64, 4, 4> Small;
#define GEMM_LARGE_BLOCKS 3
// The narrow tile (packed weights): 32 tokens x 128 rows, for batched
// steps of up to 32 rows past the GEMV's (m40-model's GEMV_TOKENS, 24),
// which the 64-token tiles would half fill. 8 tokens x 4 rows a thread:
// the 32 threads of a warp share their tokens (ty is the warp), so its two
// X float4 reads a k are broadcasts of one address (a shared-memory
// wavefront each) and its W float4 read 4
// wavefronts: 6 a k for 32 FMAs a thread. 4 x 8 a thread took 10 (an
// H100's ncu: 4 for each W read, 2 for an X read of two addresses) and
// left the FMA pipe half idle (BENCHMARKS.md, issue 33); a warp over 32
// tokens x 32 rows (3 wavefronts a k) ran no faster, and neither did 5
// blocks an SM (95 registers) nor 8 x 8 a thread in 64-thread blocks
// (both slower: BENCHMARKS.md). 40 KB of shared memory and 115-127
// registers on sm_90: 4 blocks an SM on an H100, 2 (shared memory) on
// the M40. Its loader and unrolling per format: NarrowOf below.
#define GEMM_NARROW_BLOCKS 4

#define GEMM_ENTRY(entry, T, L, blocks)                                                                      \
    extern "C" __global__ void __launch_bounds__(T::THREADS, blocks)                                          \
        entry(const u8* W, const float* X, float* Y, float* Y1, float* Y2, int r1, int r2, int M, int N,     \
              int K, long long row_bytes, int accumulate) {                                                  \
        gemm_tile<T, L>(W, X, RowParts{Y, Y1, Y2, r1, r2, N}, M, N, K, row_bytes, accumulate,                \
                        blockIdx.y * T::BM, blockIdx.x * T::BN);                                             \
    }
#define GEMM_KERNEL(name, F)                                                \
    GEMM_ENTRY(gemm_##name##_f32, Large, ByRow<RowMajor<F>>, GEMM_LARGE_BLOCKS) \
    GEMM_ENTRY(gemm_small_##name##_f32, Small, ByRow<RowMajor<F>>, 4)
M40_PART_FORMATS(GEMM_KERNEL)

// The large tile's packed loader: by rows, but by quads for Q6_K (an H100,
// 28672x4096 at 512 tokens: Q6_K 3540 -> 3253 us by quads; Q4_0 2927 ->
// 3015, F16 2926 -> 3399, Q8_0 and Q4_K 2-5% slower by quads).
template <class P>
struct LargeLoader {
    typedef ByRow<Packed<P>> type;
};
template <>
struct LargeLoader<PartsQ6_K> {
    typedef ByQuad<PartsQ6_K> type;
};

// The narrow tile's loader and k loops: by rows, the k loops unrolled by
// 4 as in the other tiles; by quads for Q4_0 and Q6_K, the k loops
// unrolled whole. H200, 32 tokens, the 8B's four shapes (BENCHMARKS.md,
// issue 33): Q6_K 545 -> 504 us a layer, Q4_0 461 -> 458; unrolled
// whole, F16 and Q8_0 by rows ran 3-10% slower, Q4_1 and MXFP4 1%.
template <class P>
struct NarrowOf {
    typedef ByRow<Packed<P>> Loader;
    typedef Tile<32, 128, 8, 4, 4, true, true> T;
};
template <class P>
struct NarrowByQuad {
    typedef ByQuad<P> Loader;
    typedef Tile<32, 128, 8, 4, 8, true, true> T;
};
template <>
struct NarrowOf<PartsQ4_0> : NarrowByQuad<PartsQ4_0> {};
template <>
struct NarrowOf<PartsQ6_K> : NarrowByQuad<PartsQ6_K> {};

// gemm_grp_packed_<fmt>_f32, gemm_grp_narrow_packed_<fmt>_f32: a
// mixture's experts over a step's slots grouped by expert (moe.cu
// moe_tiles_i32 with tiles of at most BM slots: order, the slots sorted by
// expert; tiles, their count then each tile's first sorted position and
// slots), one launch for every expert of a matrix: block (x, i) computes
// weight rows x BN .. of tile i's expert e = ids[order[first]] (clamped
// below n_mat; its packed matrix mat_bytes from W's start, N x K) for the
// tile's slots, X row slot / x_per, Y (slots, N) row slot; blocks past
// tiles[0] return. The large tile (64 slots) and the narrow one (32): the
// launcher picks by the slots an expert has on average. Each weight is
// read once per tile instead of once per slot, with the dense GEMM's sums.
#define GEMM_GRP_ENTRY(entry, T, L, blocks)                                                                       \
    extern "C" __global__ void __launch_bounds__(T::THREADS, blocks)                                               \
        entry(const u8* W, long long mat_bytes, int n_mat, const int* ids, const int* order, const int* tiles,    \
              int x_per, const float* X, float* Y, int N, int K) {                                                \
        const int i = blockIdx.y;                                                                                 \
        if (i >= tiles[0]) return;                                                                                \
        const int first = tiles[1 + 2 * i], m = tiles[2 + 2 * i];                                                 \
        const int e = min(max(ids[order[first]], 0), n_mat - 1);                                                  \
        const GatheredRows rows = {order + first, x_per};                                                         \
        gemm_tile<T, L, GatheredRows>(W + e * mat_bytes, X, RowParts{Y, Y, Y, N, N, N}, m, N, K, 0, 0, 0,         \
                                      blockIdx.x * T::BN, rows);                                                  \
    }
#define GEMM_PACKED_KERNEL(name, P)                                                                      \
    GEMM_ENTRY(gemm_packed_##name##_f32, Large, LargeLoader<P>::type, GEMM_LARGE_BLOCKS)               \
    GEMM_ENTRY(gemm_small_packed_##name##_f32, Small, ByRow<Packed<P>>, 4)                             \
    GEMM_ENTRY(gemm_narrow_packed_##name##_f32, NarrowOf<P>::T, NarrowOf<P>::Loader, GEMM_NARROW_BLOCKS) \
    GEMM_GRP_ENTRY(gemm_grp_packed_##name##_f32, Large, LargeLoader<P>::type, GEMM_LARGE_BLOCKS)       \
    GEMM_GRP_ENTRY(gemm_grp_narrow_packed_##name##_f32, NarrowOf<P>::T, NarrowOf<P>::Loader, GEMM_NARROW_BLOCKS)
M40_PART_PACKED(GEMM_PACKED_KERNEL)

#ifdef M40_WITH_COMMON
// Y (+)= the sum of the S planes (M, N) of P, planes added in order (the
// same bits every run): the end of a GEMM split over K. Grid-stride over
// the M * N elements.
extern "C" __global__ void gemm_reduce_f32(const float* __restrict__ P, int S, float* Y, float* Y1, float* Y2, int r1,
                                           int r2, int M, int N, int accumulate) {
    const RowParts out{Y, Y1, Y2, r1, r2, N};
    const long long total = (long long)M * N;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float sum = P[i];
        for (int z = 1; z < S; ++z) sum += P[z * total + i];
        float* y = out.at((int)(i / N), (int)(i % N));
        *y = accumulate ? *y + sum : sum;
    }
}
#endif
