// Rotary position embedding, in place: for each token t, head h and pair i <
// n_rot / 2, rotate (x[a], x[b]) by theta = pos[t] * pos_scale * inv_freq[i],
// where (a, b) = (2i, 2i+1) for the normal style (llama) and (i, i + n_rot/2)
// for NeoX (qwen2). Dimensions from n_rot up pass through.
//
// Layout: x (n_tok, n_head, head_dim) FP32; pos (n_tok) int32; inv_freq
// (n_rot / 2) FP32 (base^(-2i/n_rot), divided by any per-dimension factors).
// Launch: grid (n_tok), block ROPE_THREADS; threads take pairs i and loop over
// the heads, so each sin/cos is computed once per token and reused by every head.
//
// Why double-precision sincos: theta reaches thousands of radians at long
// positions, where the fast single-precision __sinf (which --use_fast_math
// would pick) is off by ~1e-3; sincos on the double of the same FP32 theta
// matches the CPU reference's sin_cos. One per (token, pair) is cheap even at
// sm_52's FP64 rate.
#define ROPE_THREADS 128

template <bool NEOX>
__device__ __forceinline__ void rope(float* x, const int* pos, const float* inv_freq, int n_head, int head_dim,
                                     int n_rot, float pos_scale) {
    const int t = blockIdx.x;
    const float p = (float)pos[t] * pos_scale;
    const int half = n_rot / 2;
    float* xt = x + (long long)t * n_head * head_dim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float theta = p * inv_freq[i];
        double sd, cd;
        sincos((double)theta, &sd, &cd);
        const float s = (float)sd, c = (float)cd;
        const int a = NEOX ? i : 2 * i, b = NEOX ? i + half : 2 * i + 1;
        for (int h = 0; h < n_head; ++h) {
            float* xh = xt + h * head_dim;
            const float x0 = xh[a], x1 = xh[b];
            xh[a] = x0 * c - x1 * s;
            xh[b] = x0 * s + x1 * c;
        }
    }
}

extern "C" __global__ void rope_norm_f32(float* x, const int* pos, const float* inv_freq, int n_head, int head_dim,
                                         int n_rot, float pos_scale) {
    rope<false>(x, pos, inv_freq, n_head, head_dim, n_rot, pos_scale);
}

extern "C" __global__ void rope_neox_f32(float* x, const int* pos, const float* inv_freq, int n_head, int head_dim,
                                         int n_rot, float pos_scale) {
    rope<true>(x, pos, inv_freq, n_head, head_dim, n_rot, pos_scale);
}
