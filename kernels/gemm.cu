// Prefill matmul: Y = X W^T (+ Y), for weights in any GGML format,
// dequantized in the tile loader (never expanded in global memory).
//
// Layout: W (N rows, row_bytes each) in its GGUF format; X (M, K) FP32
// row-major, 16-byte aligned; Y (M, N) FP32 row-major, or for stacked
// matrices (fused Q/K/V, gate/up) one (M, rows) part per matrix (common.cuh
// RowParts: Y, Y1, Y2 split at rows r1, r2). K is a multiple of 32 (one
// sub-block per k-step).
// Launch: grid (ceil(N / GEMM_BN), ceil(M / GEMM_BM)), block GEMM_THREADS.
//
// Why this shape on Maxwell: a block computes a GEMM_BM x GEMM_BN tile of Y
// from k-steps of 32 (one quantized sub-block). Each thread holds a
// GEMM_TM x GEMM_TN register tile and reads its operands from shared memory
// as float4 (two 16-byte loads feed 32 FMAs); both tiles are stored k-major
// so those loads are conflict-free. The next k-step's weights are
// dequantized into registers (quant.cuh `part`: 4 weights per call, scales
// applied once per 4) while the current step is computed, so global latency
// hides behind the FMAs (double buffering through registers: the 2 x 16 KB
// of shared memory of a second stage would halve the blocks an SM holds).
// Each weight is dequantized once per block and used by GEMM_BM tokens.
//
// gemm_packed_<fmt>_f32: the same over weights in the packed layout of the
// decode GEMV (packed.cuh; row_bytes unused), so a model whose formats have
// a packed GEMV keeps only that copy of its weights.
#include "common.cuh"
#include "packed.cuh"

#define GEMM_BM 64       // tokens (rows of X and Y) per block tile
#define GEMM_BN 64       // weight rows (columns of Y) per block tile
#define GEMM_BK 32       // k per step: one sub-block
#define GEMM_THREADS 256
#define GEMM_TM 4        // tokens per thread
#define GEMM_TN 4        // weight rows per thread
#define GEMM_PAD 4       // floats of padding per shared row (keeps float4 alignment)

// The register half of the double buffer: 2 parts of 4 weights and 2 float4 of X.
struct GemmStage {
    float w[2][4];
    float4 x[2];
};

// The weights of a GGUF row-major matrix: parts q and q + 4 of 32-weight
// sub-block sb of row n.
template <class F>
struct RowMajor {
    __device__ static void parts(const u8* W, long long row_bytes, int, int, int n, int sb, int q, float v0[4],
                                 float v1[4]) {
        const u8* blk = W + (long long)n * row_bytes + (long long)(sb / F::SUBS) * F::BYTES;
        F::part(blk, sb % F::SUBS, q, v0);
        F::part(blk, sb % F::SUBS, q + 4, v1);
    }
};

// The weights of a packed matrix (packed.cuh).
template <class P>
struct Packed {
    __device__ static void parts(const u8* W, long long, int N, int K, int n, int sb, int q, float v0[4],
                                 float v1[4]) {
        P::parts(W, N, K, n, sb, q, v0, v1);
    }
};

// Load k-step `k0` of the tile at (m0, n0) into registers. Thread t takes
// weight row n0 + (t & 63), parts (t >> 6) and (t >> 6) + 4 of the sub-block,
// and token m0 + (t & 63), floats k0 + 4 (t >> 6) .. +3 and k0 + 16 + 4 (t >> 6) .. +3;
// rows and tokens past the matrix load zeros.
template <class L>
__device__ __forceinline__ void gemm_load(const u8* __restrict__ W, const float* __restrict__ X, int M, int N,
                                          int K, long long row_bytes, int m0, int n0, int k0, GemmStage& st) {
    const int t = threadIdx.x, r = t & 63, q = t >> 6;
    const int n = n0 + r;
    if (n < N) {
        L::parts(W, row_bytes, N, K, n, k0 >> 5, q, st.w[0], st.w[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) st.w[0][j] = st.w[1][j] = 0.0f;
    }
    const int m = m0 + r;
    if (m < M) {
        const float* xr = X + (long long)m * K + k0;
        st.x[0] = ld_x4(xr + 4 * q);
        st.x[1] = ld_x4(xr + 16 + 4 * q);
    } else {
        st.x[0] = st.x[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Store a stage k-major: Ws[k][n], Xs[k][m] (consecutive threads write
// consecutive n / m of one k row: no bank conflicts).
__device__ __forceinline__ void gemm_store(const GemmStage& st, float (*Ws)[GEMM_BN + GEMM_PAD],
                                           float (*Xs)[GEMM_BM + GEMM_PAD]) {
    const int t = threadIdx.x, r = t & 63, q = t >> 6;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        Ws[4 * q + j][r] = st.w[0][j];
        Ws[16 + 4 * q + j][r] = st.w[1][j];
    }
    const float a[4] = {st.x[0].x, st.x[0].y, st.x[0].z, st.x[0].w};
    const float c[4] = {st.x[1].x, st.x[1].y, st.x[1].z, st.x[1].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        Xs[4 * q + j][r] = a[j];
        Xs[16 + 4 * q + j][r] = c[j];
    }
}

// One block's tile of Y = X W^T (+ Y when `accumulate`).
template <class L>
__device__ __forceinline__ void gemm_tile(const u8* __restrict__ W, const float* __restrict__ X, const RowParts Y,
                                          int M, int N, int K, long long row_bytes, int accumulate, int m0, int n0) {
    __shared__ __align__(16) float Ws[GEMM_BK][GEMM_BN + GEMM_PAD];
    __shared__ __align__(16) float Xs[GEMM_BK][GEMM_BM + GEMM_PAD];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[GEMM_TM][GEMM_TN];
#pragma unroll
    for (int i = 0; i < GEMM_TM; ++i)
#pragma unroll
        for (int j = 0; j < GEMM_TN; ++j) acc[i][j] = 0.0f;

    GemmStage st;
    gemm_load<L>(W, X, M, N, K, row_bytes, m0, n0, 0, st);
    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        gemm_store(st, Ws, Xs);
        __syncthreads();
        if (k0 + GEMM_BK < K) gemm_load<L>(W, X, M, N, K, row_bytes, m0, n0, k0 + GEMM_BK, st);
#pragma unroll 8
        for (int k = 0; k < GEMM_BK; ++k) {
            const float4 a = *(const float4*)&Xs[k][ty * GEMM_TM];
            const float4 b = *(const float4*)&Ws[k][tx * GEMM_TN];
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < GEMM_TM; ++i)
#pragma unroll
                for (int j = 0; j < GEMM_TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }

    const int n = n0 + tx * GEMM_TN;
#pragma unroll
    for (int i = 0; i < GEMM_TM; ++i) {
        const int m = m0 + ty * GEMM_TM + i;
        if (m >= M) break;
#pragma unroll
        for (int j = 0; j < GEMM_TN; ++j) {
            if (n + j >= N) break;
            float* y = Y.at(m, n + j);
            *y = accumulate ? *y + acc[i][j] : acc[i][j];
        }
    }
}

#define GEMM_KERNEL(name, F)                                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) gemm_##name##_f32(                            \
        const u8* W, const float* X, float* Y, float* Y1, float* Y2, int r1, int r2, int M, int N, int K,    \
        long long row_bytes, int accumulate) {                                                               \
        gemm_tile<RowMajor<F>>(W, X, RowParts{Y, Y1, Y2, r1, r2, N}, M, N, K, row_bytes, accumulate,       \
                               blockIdx.y * GEMM_BM, blockIdx.x * GEMM_BN);                                  \
    }
M40_FORMATS(GEMM_KERNEL)

#define GEMM_PACKED_KERNEL(name, P)                                                                          \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) gemm_packed_##name##_f32(                     \
        const u8* W, const float* X, float* Y, float* Y1, float* Y2, int r1, int r2, int M, int N, int K,    \
        long long row_bytes, int accumulate) {                                                               \
        gemm_tile<Packed<P>>(W, X, RowParts{Y, Y1, Y2, r1, r2, N}, M, N, K, row_bytes, accumulate,         \
                             blockIdx.y * GEMM_BM, blockIdx.x * GEMM_BN);                                    \
    }
M40_PACKED_FORMATS(GEMM_PACKED_KERNEL)
