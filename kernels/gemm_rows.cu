// m40-parts: f16 q8_0 q4_0 q4_1 q4_k q6_k mxfp4
// The rows tile's kernels (gemm_rows.cuh, which describes the tile), one
// per packed format, with gemm.cu's signature: gemm_rows_packed_<fmt>_f32(W,
// X, Y, Y1, Y2, r1, r2, M, N, K, row_bytes (unused), accumulate); a split
// over K (gridDim.z) ends with gemm.cu's gemm_reduce_f32. Their own module,
// not gemm.cu's: the driver JIT-compiles a module whole, on a first run
// 1.7-3.8 s more for these (BENCHMARKS.md, issue 33), and a model loads
// this one only where its plan takes the tile (m40-model's GPU backend).
#include "gemm_rows.cuh"

#define GEMM_ROWS_FORMAT(name, Parts)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * ROWS_WARPS, 2) gemm_rows_packed_##name##_f32(          \
        const u8* W, const float* X, float* Y, float* Y1, float* Y2, int r1, int r2, int M, int N, int K,    \
        long long row_bytes, int accumulate) {                                                               \
        gemm_rows<PGEMV_PACK_##name>(W, X, RowParts{Y, Y1, Y2, r1, r2, N}, M, N, K, accumulate);             \
    }
M40_PART_PACKED(GEMM_ROWS_FORMAT)
