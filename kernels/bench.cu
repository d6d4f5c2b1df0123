// Kernels for benchmarks only: the read-bandwidth probe that gives the
// ceiling GEMV results are compared with, and a device-side random fill so
// large inputs need not cross the bus.
//
// read_probe: XOR of every 16-byte vector of p (n_vec of them), one word per
// block to out (so the loads cannot be dropped). Launch: grid-stride, block
// 256, grid a few blocks per SM; 4 independent loads in flight per thread.
// fill_random: p[i] = hash(seed, i) for n words; grid-stride.
// fma_probe: the FP32 FMA ceiling prefill is compared with. Each thread runs
// FMA_CHAINS independent chains of `iters` FMAs (enough in flight to cover
// the FMA latency at any occupancy) and writes one float, so nothing is
// dropped: 2 * FMA_CHAINS * iters FLOPs per thread. Launch: block 256, a few
// blocks per SM.
typedef unsigned int u32;

extern "C" __global__ void read_probe(const uint4* __restrict__ p, long long n_vec, u32* out) {
    u32 acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n_vec; i += 4 * stride) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                    d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n_vec; i += stride) {
        const uint4 a = __ldg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    __shared__ u32 s[32];
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) acc ^= s[w];
        out[blockIdx.x] = acc;
    }
}

extern "C" __global__ void fill_random(u32* p, long long n, u32 seed) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        u32 x = (u32)i * 0x9E3779B1u ^ seed ^ (u32)(i >> 32) * 0x85EBCA77u;
        x ^= x >> 16;
        x *= 0x7FEB352Du;
        x ^= x >> 15;
        x *= 0x846CA68Bu;
        x ^= x >> 16;
        p[i] = x;
    }
}

#define FMA_CHAINS 8

extern "C" __global__ void fma_probe(float* out, int iters, float a, float b) {
    float x[FMA_CHAINS];
#pragma unroll
    for (int j = 0; j < FMA_CHAINS; ++j) x[j] = (float)(threadIdx.x + j);
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < FMA_CHAINS; ++j) x[j] = fmaf(x[j], a, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < FMA_CHAINS; ++j) s += x[j];
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = s;
}
