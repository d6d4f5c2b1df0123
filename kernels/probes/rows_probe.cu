// A probe, not a kernel of the engine: the rows tile (gemm_rows.cuh)
// against the narrow GEMM tile (gemm.cu) at 32
// tokens, over random packed weights (several copies, so each launch reads
// from DRAM), each with its splits over K, the reduce included. Q4_0: the
// 8B's four layer shapes; -DPROBE_Q6K: the 8B's output matrix (Q6_K in a
// Q4_0 model) and gate/up's shape.
//   nvcc -O3 -arch=sm_90 -o /tmp/rows kernels/probes/rows_probe.cu && /tmp/rows
//   nvcc -O3 -arch=sm_90 -DPROBE_Q6K -o /tmp/rows6 kernels/probes/rows_probe.cu && /tmp/rows6
// PROBE_NCU=1: one launch of each kernel on the second shape, for ncu.
#ifdef PROBE_Q6K
#define M40_PART q6_k
#define PACK PackQ6_K
#define NARROW gemm_narrow_packed_q6_k_f32
#define GB_BYTES 105  // bytes a group and block of 32
#define F16_AT 104    // its f16 plane (the super-blocks' d) at ng nb F16_AT
#define F16_LEN 1
#else
#define M40_PART q4_0
#define PACK PackQ4_0
#define NARROW gemm_narrow_packed_q4_0_f32
#define GB_BYTES 72
#define F16_AT 64
#define F16_LEN 8
#endif
#include "../gemm.cu"
#include "../gemm_rows.cuh"
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

extern "C" __global__ void __launch_bounds__(32 * ROWS_WARPS, 2) rows(const u8* W, const float* X, float* Y, int M, int N, int K) {
    gemm_rows<PACK>(W, X, RowParts{Y, Y, Y, N, N, N}, M, N, K, 0); }

__global__ void reduce(const float* P, int S, float* Y, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        float s = P[i];
        for (int z = 1; z < S; ++z) s += P[z * total + i];
        Y[i] = s;
    }
}

// The engine's narrow_split (crates/m40-kernels/src/gemm.rs).
static int narrow_split(int tiles, int steps, int sms, int per_sm) {
    auto rate = [&](int b) { return b >= per_sm ? 1.0 : b == 1 ? 1.18 : b == 2 ? 1.05 : 1.0; };
    auto cost = [&](int s) {
        int on_sm = (tiles * s + sms - 1) / sms, full = on_sm / per_sm, last = on_sm % per_sm;
        return (full * per_sm + last * rate(last)) * ((steps + s - 1) / s);
    };
    int best = 1;
    for (int s = 2; s <= 16 && steps / s >= 8; ++s) if (cost(s) < 0.98 * cost(best)) best = s;
    return cost(best) <= 0.9 * cost(1) ? best : 1;
}

int main() {
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("%s, %d SMs\n", prop.name, sms);
#ifdef PROBE_Q6K
    const int shapes[][2] = {{128256, 4096}, {28672, 4096}};
    const char* names[] = {"output", "gate/up"};
#else
    const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    const char* names[] = {"Q/K/V", "o", "gate/up", "down"};
#endif
    const int n_shapes = sizeof(shapes) / sizeof(shapes[0]);
    const int COPIES = 4, REPS = 20, M = 32;
    for (int si = 0; si < n_shapes; ++si) {
        const int N = shapes[si][0], K = shapes[si][1], ng = N / 4, nb = K / 32;
        const size_t bytes = (size_t)ng * nb * GB_BYTES;
        std::vector<unsigned char> h(bytes);
        srand(si + 1);
        for (auto& b : h) b = rand() & 0xff;
        for (size_t i = (size_t)ng * nb * F16_AT; i < (size_t)ng * nb * (F16_AT + F16_LEN); i += 2) {
            unsigned short v = 0x1c00 | (rand() & 0x3ff) | ((rand() & 1) << 15);
            h[i] = v & 0xff, h[i + 1] = v >> 8;
        }
        const int copies = bytes > (200u << 20) ? 2 : COPIES;
        unsigned char* W; CK(cudaMalloc(&W, bytes * copies));
        for (int c = 0; c < copies; ++c) CK(cudaMemcpy(W + c * bytes, h.data(), bytes, cudaMemcpyHostToDevice));
        std::vector<float> hx(32 * (size_t)K);
        for (auto& v : hx) v = (rand() / (float)RAND_MAX) * 2 - 1;
        float *X, *Y, *Yr, *P;
        CK(cudaMalloc(&X, hx.size() * 4)); CK(cudaMemcpy(X, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&Y, 32 * (size_t)N * 4)); CK(cudaMalloc(&Yr, 32 * (size_t)N * 4));
        CK(cudaMalloc(&P, 16 * 32 * (size_t)N * 4));
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        const long long total = (long long)M * N;
        const int strips = (ng + 31) / 32;
        // kind 0: narrow; 4: rows (4 strips a block).
        auto launch = [&](int kind, int S, const unsigned char* w, float* out) {
            float* dst = S > 1 ? P : out;
            if (kind == 0) {
                dim3 grid((N + 127) / 128, (M + 31) / 32, S);
                NARROW<<<grid, 128>>>(w, X, dst, dst, dst, N, N, M, N, K, 0, 0);
            } else {
                dim3 grid((strips + 3) / 4, 1, S);
                rows<<<grid, 128>>>(w, X, dst, M, N, K);
            }
            if (S > 1) reduce<<<sms * 4, 256>>>(P, S, out, total);
        };
        auto time = [&](int kind, int S) {
            launch(kind, S, W, Y);
            CK(cudaDeviceSynchronize());
            cudaEventRecord(a);
            for (int r = 0; r < REPS; ++r) launch(kind, S, W + (r % copies) * bytes, Y);
            cudaEventRecord(b);
            CK(cudaEventSynchronize(b));
            float ms; cudaEventElapsedTime(&ms, a, b);
            return ms * 1000 / REPS;
        };
        const int ns = narrow_split((N + 127) / 128, nb, sms, 4);
        if (getenv("PROBE_NCU")) {
            if (si != 1) continue;
            launch(0, ns, W, Y);
            launch(4, 1, W, Y);
            CK(cudaDeviceSynchronize());
            continue;
        }
        launch(0, ns, W, Yr);
        CK(cudaDeviceSynchronize());
        std::vector<float> ref(total), got(total);
        CK(cudaMemcpy(ref.data(), Yr, total * 4, cudaMemcpyDeviceToHost));
        const double flops = 2.0 * total * K;
        const float tn = time(0, ns);
        printf("%-8s narrow s=%d %7.1f us (%.1f TFLOP/s)\n", names[si], ns, tn, flops / tn / 1e6);
        for (int kind : {4}) {
            for (int S : {1, 2, 4, 8, 12, 16}) {
                if (nb / S < 8 || (long long)strips / kind * S > 8 * sms) continue;
                CK(cudaMemset(Y, 0xff, total * 4));
                launch(kind, S, W, Y);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(got.data(), Y, total * 4, cudaMemcpyDeviceToHost));
                double md = 0, mr = 0;
                for (long long i = 0; i < total; ++i) { md = std::max(md, (double)fabsf(got[i] - ref[i])); mr = std::max(mr, (double)fabsf(ref[i])); }
                const float tr = time(kind, S);
                printf("%-8s rows (%d strips) s=%d %7.1f us (%.1f TFLOP/s) max|d| %.2e of %.2e%s\n", names[si], kind, S, tr, flops / tr / 1e6, md, mr, md > 1e-4 * mr || md != md ? "  MISMATCH" : "");
            }
        }
        cudaFree(W); cudaFree(X); cudaFree(Y); cudaFree(Yr); cudaFree(P);
    }
    return 0;
}
