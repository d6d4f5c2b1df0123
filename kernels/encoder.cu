// What an encoder's forward (bert, nomic-bert) adds to the decoder's kernels:
// attention over every key of a token's sequence (not causal), and the
// ungated GELU of bert's FFN.
#include "common.cuh"
#include "quant.cuh"

#define ENC_THREADS 128
// Keys a sequence may have: the scores live in shared memory (8 KB).
#define ENC_MAX_KEYS 2048

// attn_enc_f32: out (n_tok, n_head * hd) = softmax(scale q k^T) v, each
// token attending to every key of its own sequence, from the paged FP16
// pools (attention.cu describes them). The step's rows are whole
// sequences, each at positions 0, 1, ... in order: row r's sequence starts
// at row r - pos[r] and ends before the next row at position 0 (or n_tok);
// its block table starts at table[tab[r]]. Grid (n_tok, n_head), block
// ENC_THREADS; query head h reads KV head h / (n_head / n_head_kv).
extern "C" __global__ void __launch_bounds__(ENC_THREADS)
    attn_enc_f32(const float* q, const u16* kpool, const u16* vpool, const int* table, const int* tab,
                 const int* pos, float* out, int n_tok, int n_head, int n_head_kv, int hd, float scale) {
    __shared__ float qs[256];
    __shared__ float p[ENC_MAX_KEYS];
    __shared__ float scratch[32];
    const int r = blockIdx.x, h = blockIdx.y, g = h / (n_head / n_head_kv);
    const int first = r - pos[r];
    int len = pos[r] + 1;
    while (first + len < n_tok && pos[first + len] != 0) len++;
    const int* tb = table + tab[r];
    const long long kv_dim = (long long)n_head_kv * hd;
    const float* qr = q + ((long long)r * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qr[d] * scale;
    __syncthreads();
    float m = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const u16* k = kpool + kv_row(tb, j) * kv_dim + (long long)g * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += qs[d] * h2f(k[d]);
        p[j] = s;
        m = fmaxf(m, s);
    }
    // The block's maximum (as block_sum, with max).
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) scratch[warp] = m;
        __syncthreads();
        m = lane < (int)(blockDim.x >> 5) ? scratch[lane] : __int_as_float(0xff800000);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        __syncthreads();
    }
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float e = expf(p[j] - m);
        p[j] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    const float inv = 1.0f / sum;
    float* o = out + ((long long)r * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < len; j++) acc += p[j] * h2f(vpool[kv_row(tb, j) * kv_dim + (long long)g * hd + d]);
        o[d] = acc * inv;
    }
}

// x[i] = gelu(x[i]) (tanh approximation: bert's FFN). x (n) FP32. Grid
// ceil(n / ENC_THREADS) (capped; grid-stride), block ENC_THREADS.
extern "C" __global__ void gelu_f32(float* x, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = geglu1(x[i], 1.0f);
}
