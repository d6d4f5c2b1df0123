// A probe, not a kernel of the engine (cargo xtask ptx compiles kernels/*.cu
// only; this folder is not read): what a grid barrier costs on the GPU it
// runs on, against a CUDA-graph kernel node doing the same work. Written to
// explain why the persistent decode kernel (decode.cu) lost to a launch per
// kernel on an H100 (BENCHMARKS.md, "The persistent decode kernel").
//
// Build and run on the device machine (its CUDA 13 nvcc, Hopper code):
//   nvcc -O3 -arch=sm_90 -o /tmp/barrier kernels/probes/barrier_probe.cu && /tmp/barrier
// It prints, per grid (1, 2, 5 blocks of 128 threads per SM) and bytes read
// between barriers (0, 4 KB, 16 KB per block, streamed), the time per step of
// a persistent kernel with decode.cu's barrier, fenced by membar.gl (what the
// compute_52 PTX has), by fence.acq_rel.gpu, or not fenced at all (not a
// correct barrier: the fences' share of the cost), and of a graph of kernel
// nodes doing the same reads.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
#define LINE 32
template <int F> __device__ __forceinline__ void fence() {
    if (F == 0) asm volatile("membar.gl;" ::: "memory");
    else if (F == 1) asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
template <int F>
__device__ __forceinline__ void gsync(unsigned* sync, unsigned k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        fence<F>();
        if (atomicAdd(sync, 1u) == gridDim.x - 1) {
            sync[0] = 0;
            fence<F>();
            atomicExch(sync + LINE, k);
        } else {
            while (*(volatile unsigned*)(sync + LINE) < k) {}
        }
        fence<F>();
    }
    __syncthreads();
}
// W bytes read per block between barriers (streamed), to see barrier+ramp.
template <int F>
__global__ void persist(unsigned* sync, int n, const uint4* buf, long long per, float* out) {
    float acc = 0;
    for (int i = 1; i <= n; ++i) {
        if (per) {
            const uint4* p = buf + ((long long)(i % 8) * gridDim.x + blockIdx.x) * per;
            for (long long j = threadIdx.x; j < per; j += blockDim.x) { uint4 v = __ldcs(p + j); acc += __int_as_float(v.x ^ v.w); }
        }
        gsync<F>(sync, i);
    }
    if (threadIdx.x == 0) {
        if (atomicAdd(sync + 2 * LINE, 1u) == gridDim.x - 1) { sync[LINE] = 0; sync[2 * LINE] = 0; }
    }
    if (acc == 1.2345f) out[0] = acc;
}
__global__ void node(const uint4* buf, long long per, int i, float* out) {
    float acc = 0;
    if (per) {
        const uint4* p = buf + ((long long)(i % 8) * gridDim.x + blockIdx.x) * per;
        for (long long j = threadIdx.x; j < per; j += blockDim.x) { uint4 v = __ldcs(p + j); acc += __int_as_float(v.x ^ v.w); }
    }
    if (acc == 1.2345f) out[0] = acc;
}
int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned* sync; CK(cudaMalloc(&sync, 3 * LINE * 4)); CK(cudaMemset(sync, 0, 3 * LINE * 4));
    float* out; CK(cudaMalloc(&out, 4));
    size_t bufbytes = 1ull << 30; uint4* buf; CK(cudaMalloc(&buf, bufbytes)); CK(cudaMemset(buf, 1, bufbytes));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaStream_t s; cudaStreamCreate(&s);
    const int N = 500;
    int bps[] = {1, 2, 5};
    long long pers[] = {0, 256, 1024}; // uint4 per block per step: 0, 4 KB, 16 KB
    for (long long per : pers) for (int bp : bps) {
        int grid = sms * bp;
        if ((long long)grid * per * 16 * 8 > (long long)bufbytes) continue;
        float t[3] = {0, 0, 0};
        for (int F = 0; F < 3; ++F) {
            float best = 1e30f;
            for (int r = 0; r < 5; ++r) {
                cudaEventRecord(a, s);
                if (F == 0) persist<0><<<grid, 128, 0, s>>>(sync, N, buf, per, out);
                if (F == 1) persist<1><<<grid, 128, 0, s>>>(sync, N, buf, per, out);
                if (F == 2) persist<2><<<grid, 128, 0, s>>>(sync, N, buf, per, out);
                cudaEventRecord(b, s); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
                float ms; cudaEventElapsedTime(&ms, a, b); if (r && ms < best) best = ms;
            }
            t[F] = best * 1000 / N;
        }
        // graph of N nodes
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < N; ++i) node<<<grid, 128, 0, s>>>(buf, per, i, out);
        CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
        float best = 1e30f;
        for (int r = 0; r < 5; ++r) {
            cudaEventRecord(a, s); cudaGraphLaunch(ge, s); cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
            float ms; cudaEventElapsedTime(&ms, a, b); if (r && ms < best) best = ms;
        }
        printf("grid %4d (%d/SM) bytes/step %8lld KB: barrier membar.gl %.2f us, fence.acq_rel %.2f us, no fence %.2f us | graph node %.2f us\n",
               grid, bp, grid * per * 16 / 1024, t[0], t[1], t[2], best * 1000 / N);
    }
    return 0;
}
