// Mixture-of-experts routing and combining (qwen3moe, Mixtral), as
// llama.cpp's build_moe_ffn computes them; the experts' GEMVs are
// gemv_id_<fmt>_f32 (gemv.cu).
//
// moe_route_f32: one warp per token of n: softmax over the E router
// logits (row t of logits), the K most probable experts (ties: the lower
// index) into ids (n, K) in that order, and their probabilities divided by
// their sum (at least 6.1035e-5, as llama.cpp clamps) into w (n, K). Lane l
// holds experts l, l + 32, ... (E <= 32 * MOE_MAX_PER_LANE). Block 32 *
// MOE_WARPS threads, grid ceil(n / MOE_WARPS).
//
// moe_combine_f32: out (n, d) = sum over j < K of w[t, j] y[t K + j] (y:
// (n K, d), a slot's expert output), in slot order, each product rounded
// and added (no contraction): the CPU's arithmetic. Grid-stride over n d.
#include "common.cuh"

#define MOE_WARPS 4
#define MOE_MAX_PER_LANE 32

extern "C" __global__ void moe_route_f32(const float* logits, int* ids, float* w, int n, int E, int K) {
    const int lane = threadIdx.x & 31, t = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (t >= n) return;
    const float* l = logits + (long long)t * E;
    float mx = __int_as_float(0xff800000);  // -inf
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    unsigned taken = 0u;  // bit i: expert lane + 32 i is chosen
    float chosen = 0.0f;  // lane 0: the sum of the chosen probabilities
    for (int k = 0; k < K; ++k) {
        float best = -1.0f;
        int bi = 0x7fffffff;
        for (int i = 0, e = lane; e < E; ++i, e += 32) {
            const float p = expf(l[e] - mx) * inv;
            if (!(taken >> i & 1u) && p > best) best = p, bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            ids[(long long)t * K + k] = bi;
            w[(long long)t * K + k] = best;
            chosen += best;
        }
    }
    __syncwarp();
    if (lane == 0) {
        const float s = fmaxf(chosen, 6.103515625e-5f);
        for (int k = 0; k < K; ++k) w[(long long)t * K + k] /= s;
    }
}

extern "C" __global__ void moe_combine_f32(const float* y, const float* w, float* out, long long nd, int d, int K) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nd; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / d, c = i % d;
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) acc = __fadd_rn(acc, __fmul_rn(w[t * K + j], y[(t * K + j) * d + c]));
        out[i] = acc;
    }
}
