// What NVIDIA's own FP32 GEMM reaches at decode-batch shapes: cuBLAS
// SGEMM (pedantic math: FP32 FMAs, no TF32 or tensor cores) of Y (M, N) =
// X (M, K) W^T for an 8B's matrices, against the FP32 FMA rate measured by
// this probe (independent FMA chains in every thread). Not part of the
// build: the device machine compiles it with its own nvcc,
//   nvcc -O3 -arch=sm_90 -o /tmp/sgemm_probe kernels/probes/sgemm_probe.cu -lcublas
// and it prints one line a shape: tokens, rows x cols, us (median of 9
// batches of 20 launches, CUDA events), TFLOP/s and % of the FMA rate.
// Weights are FP32 (4 bytes a weight, where the engine's Q4_0 reads 0.56):
// the 8B's shapes stream them from memory; 2048 x 4096 (32 MB) stays in
// the H100's 50 MB L2, so only the arithmetic limits it there.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                       \
    do {                                                                            \
        auto e = (x);                                                               \
        if (e != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e); \
            return 1;                                                               \
        }                                                                           \
    } while (0)

// 8 independent chains a thread, 4096 rounds: 2 x 8 x 4096 FLOP a thread.
__global__ void fma_peak(float* out, float a, float b) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = threadIdx.x + i;
    for (int r = 0; r < 4096; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = fmaf(v[i], a, b);
    }
    float s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += v[i];
    if (s == 12345.0f) out[0] = s;
}

template <class F>
static float median_us(F launch, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    launch();  // warm-up
    cudaDeviceSynchronize();
    std::vector<float> t;
    for (int i = 0; i < 9; ++i) {
        cudaEventRecord(a);
        for (int r = 0; r < reps; ++r) launch();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(1000.0f * ms / reps);
    }
    std::sort(t.begin(), t.end());
    return t[4];
}

int main() {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device: %s, %d SMs\n", p.name, p.multiProcessorCount);
    float* out;
    CK(cudaMalloc(&out, 4));
    const int blocks = p.multiProcessorCount * 16, threads = 256;
    const float peak_us = median_us([&] { fma_peak<<<blocks, threads>>>(out, 0.999f, 0.001f); }, 5);
    const double peak = 2.0 * 8 * 4096 * (double)blocks * threads / (peak_us * 1e-6) / 1e12;
    printf("FP32 FMA rate: %.1f TFLOP/s\n", peak);

    cublasHandle_t h;
    CK(cublasCreate(&h));
    CK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {2048, 4096}};
    const int tokens[] = {4, 32, 64, 128};
    size_t most = 0;
    for (auto& s : shapes) most = std::max(most, (size_t)s[0] * s[1]);
    float *w, *x, *y;
    CK(cudaMalloc(&w, most * 4));
    CK(cudaMalloc(&x, (size_t)128 * 14336 * 4));
    CK(cudaMalloc(&y, (size_t)128 * 28672 * 4));
    CK(cudaMemset(w, 0, most * 4));
    CK(cudaMemset(x, 0, (size_t)128 * 14336 * 4));
    printf("| tokens | rows x cols | us | TFLOP/s | %% of FMA rate |\n|---|---|---|---|---|\n");
    for (int m : tokens) {
        for (auto& s : shapes) {
            const int n = s[0], k = s[1];
            const float one = 1.0f, zero = 0.0f;
            cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
            // Y^T (n x m, column-major) = W (k x n stored: op T) X^T (k x m).
            const float us = median_us(
                [&] {
                    st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, k, x, k, &zero, y, n);
                },
                20);
            CK(st);
            CK(cudaGetLastError());
            const double tf = 2.0 * m * n * (double)k / (us * 1e-6) / 1e12;
            printf("| %d | %dx%d | %.1f | %.1f | %.1f%% |\n", m, n, k, us, tf, 100.0 * tf / peak);
        }
    }
    return 0;
}
