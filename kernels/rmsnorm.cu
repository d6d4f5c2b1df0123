// RMSNorm: y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]^2) + eps) * w[i], and the
// fused residual form: x[r, i] += d[r, i] first (x updated in place), then
// the norm of the sum. LayerNorm without bias (command-r) likewise:
// y[r, i] = (x[r, i] - m) / sqrt(mean_i((x[r, i] - m)^2) + eps) * w[i], m
// the row's mean (two passes over the row before the write, as ggml_norm).
//
// Layout: x, d, y (n_rows, n) row-major FP32; w (n) FP32.
// Launch: grid (n_rows), block RMSNORM_THREADS; one block per row.
//
// Why this shape: a decode step normalizes one row of a few thousand floats,
// so the whole kernel is one block and its time is its chain of memory round
// trips, not bandwidth. Each thread issues RMSNORM_U independent loads
// before it uses any (16-byte loads when n is a multiple of 4), so a row of
// 4096 floats costs one round trip per pass instead of one per 256 floats;
// the second pass re-reads x (its own lanes' values, from L1/L2) and w. The
// residual add rides along: the same thread adds, writes x back, and reads
// its own write in the second pass, so the fused form needs no extra sync.
#include "common.cuh"

#define RMSNORM_U 4

__device__ __forceinline__ float sq(float v) { return v * v; }
__device__ __forceinline__ float sq(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float hsum(float v) { return v; }
__device__ __forceinline__ float hsum(float4 v) { return v.x + v.y + v.z + v.w; }
__device__ __forceinline__ float sub(float a, float m) { return a - m; }
__device__ __forceinline__ float4 sub(float4 a, float m) { return make_float4(a.x - m, a.y - m, a.z - m, a.w - m); }
template <class V> __device__ __forceinline__ V zero();
template <> __device__ __forceinline__ float zero<float>() { return 0.0f; }
template <> __device__ __forceinline__ float4 zero<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// The block's sum of (p[i] - c)^2 over a row of m elements of V, each
// thread's RMSNORM_U loads issued before it uses any.
template <class V>
__device__ __forceinline__ float row_sq(const V* p, float c, int m, float* scratch) {
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < m; i0 += RMSNORM_U * blockDim.x) {
        V v[RMSNORM_U];
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < m ? sub(p[i], c) : zero<V>();
        }
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) ss += sq(v[u]);
    }
    return block_sum(ss, scratch);
}

// A row that fits the block's loads (m <= RMSNORM_U * blockDim.x: every
// row of a model up to 4096 wide, in float4): every load (x, d, pw, w) is
// issued at once, before the first sum, and the values stay in registers,
// so the row costs one memory round trip where rmsnorm_row's loop costs
// one per pass (two, or three with pw; gemma3-12b's add_post_rmsnorm got
// ~1.3 us faster a launch on an H100, BENCHMARKS.md: its weights come from
// DRAM). The same sums in the same order as the loop's, so the same bits.
template <class V, bool CENTER>
__device__ __forceinline__ void norm_row_held(V* x, const V* d, const V* pw, float ps, const V* w, V* y, int m, int n,
                                              float eps, float* scratch) {
    V xv[RMSNORM_U], dv[RMSNORM_U], pv[RMSNORM_U], wv[RMSNORM_U];
#pragma unroll
    for (int u = 0; u < RMSNORM_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        const bool in = i < m;
        xv[u] = in ? x[i] : zero<V>();
        dv[u] = in && d ? d[i] : zero<V>();
        pv[u] = in && pw ? pw[i] : zero<V>();
        wv[u] = in ? w[i] : zero<V>();
    }
    if (d) {
        float ds = 0.0f;
        if (pw) {
            float sd = 0.0f;
#pragma unroll
            for (int u = 0; u < RMSNORM_U; ++u) sd += sq(dv[u]);
            ds = rsqrtf(block_sum(sd, scratch) / (float)n + eps) * ps;
        }
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) {
            const int i = threadIdx.x + u * blockDim.x;
            if (i < m) {
                xv[u] = add(xv[u], pw ? scale_mul(dv[u], ds, pv[u]) : dv[u]);
                x[i] = xv[u];
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < RMSNORM_U; ++u) ss += CENTER ? hsum(xv[u]) : sq(xv[u]);
    ss = block_sum(ss, scratch);
    float mean = 0.0f;
    if (CENTER) {
        mean = ss / (float)n;
        ss = 0.0f;
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u)
            if (threadIdx.x + u * blockDim.x < m) ss += sq(sub(xv[u], mean));
        ss = block_sum(ss, scratch);
    }
    const float s = rsqrtf(ss / (float)n + eps);
#pragma unroll
    for (int u = 0; u < RMSNORM_U; ++u) {
        const int i = threadIdx.x + u * blockDim.x;
        if (i < m) y[i] = scale_mul(CENTER ? sub(xv[u], mean) : xv[u], s, wv[u]);
    }
}

// One row of m elements of V (m = n / 4 for float4). d (may be null): added
// to x first, and the sum written back to x. y may alias x when d is null.
// pw (may be null; then d is not): d is RMS-normed by the weights pw and
// scaled by ps before it joins x (gemma's post-norms: a pass over d first,
// for its sum of squares). CENTER: LayerNorm (the first pass sums x for the
// mean, a second the squares about it).
template <class V, bool CENTER>
__device__ __forceinline__ void rmsnorm_row(V* x, const V* d, const V* pw, float ps, const V* w, V* y, int m, int n,
                                            float eps, float* scratch) {
    if (m <= RMSNORM_U * (int)blockDim.x) {
        norm_row_held<V, CENTER>(x, d, pw, ps, w, y, m, n, eps, scratch);
        return;
    }
    // d's factor: pw's RMS scale times ps.
    const float ds = pw ? rsqrtf(row_sq(d, 0.0f, m, scratch) / (float)n + eps) * ps : 0.0f;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < m; i0 += RMSNORM_U * blockDim.x) {
        V v[RMSNORM_U];
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < m ? x[i] : zero<V>();
        }
        if (d) {
#pragma unroll
            for (int u = 0; u < RMSNORM_U; ++u) {
                const int i = i0 + u * blockDim.x;
                if (i < m) {
                    v[u] = add(v[u], pw ? scale_mul(d[i], ds, pw[i]) : d[i]);
                    x[i] = v[u];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) ss += CENTER ? hsum(v[u]) : sq(v[u]);
    }
    ss = block_sum(ss, scratch);
    float mean = 0.0f;
    if (CENTER) {
        mean = ss / (float)n;
        ss = row_sq(x, mean, m, scratch);
    }
    const float s = rsqrtf(ss / (float)n + eps);
    for (int i0 = threadIdx.x; i0 < m; i0 += RMSNORM_U * blockDim.x) {
        V v[RMSNORM_U], g[RMSNORM_U];
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < m ? (CENTER ? sub(x[i], mean) : x[i]) : zero<V>();
            g[u] = i < m ? w[i] : zero<V>();
        }
#pragma unroll
        for (int u = 0; u < RMSNORM_U; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < m) y[i] = scale_mul(v[u], s, g[u]);
        }
    }
}

// The row of block blockIdx.x; 16-byte accesses when n is a multiple of 4
// (the launcher passes 16-byte aligned buffers).
template <bool CENTER>
__device__ __forceinline__ void norm_block(float* x, const float* d, const float* w, float* y, int n, float eps,
                                           const float* pw = nullptr, float ps = 1.0f) {
    __shared__ float scratch[32];
    const long long o = (long long)blockIdx.x * n;
    if ((n & 3) == 0)
        rmsnorm_row<float4, CENTER>((float4*)(x + o), d ? (const float4*)(d + o) : nullptr, (const float4*)pw, ps,
                                    (const float4*)w, (float4*)(y + o), n >> 2, n, eps, scratch);
    else
        rmsnorm_row<float, CENTER>(x + o, d ? d + o : nullptr, pw, ps, w, y + o, n, n, eps, scratch);
}
__device__ __forceinline__ void rmsnorm_block(float* x, const float* d, const float* w, float* y, int n, float eps) {
    norm_block<false>(x, d, w, y, n, eps);
}

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps) {
    rmsnorm_block(const_cast<float*>(x), nullptr, w, y, n, eps);
}

// x += d, then y = rmsnorm(x) * w (the residual connection and the next norm).
extern "C" __global__ void add_rmsnorm_f32(float* x, const float* d, const float* w, float* y, int n, float eps) {
    rmsnorm_block(x, d, w, y, n, eps);
}

// x += rmsnorm(d) * pw * ps, then y = rmsnorm(x) * w: a branch's post-norm
// (gemma2/3, scaled by ps), the residual connection and the next norm in
// one launch (two before).
extern "C" __global__ void add_post_rmsnorm_f32(float* x, const float* d, const float* pw, float ps, const float* w,
                                                float* y, int n, float eps) {
    norm_block<false>(x, d, w, y, n, eps, pw, ps);
}

// x = rmsnorm(x) * w in place, row by row (the per-head query and key
// norms: rows of head_dim), row r with the weights w[(r % w_rows) * n..]
// (qwen3's heads share one row, w_rows = 1; command-r+'s have one each).
// Each element is read before the same thread writes it, and after the
// whole row's sum.
extern "C" __global__ void rmsnorm_inplace_f32(float* x, const float* w, int n, int w_rows, float eps) {
    rmsnorm_block(x, nullptr, w + (long long)(blockIdx.x % w_rows) * n, x, n, eps);
}

// The LayerNorm forms of the three above.
extern "C" __global__ void layernorm_f32(const float* x, const float* w, float* y, int n, float eps) {
    norm_block<true>(const_cast<float*>(x), nullptr, w, y, n, eps);
}

extern "C" __global__ void add_layernorm_f32(float* x, const float* d, const float* w, float* y, int n, float eps) {
    norm_block<true>(x, d, w, y, n, eps);
}

extern "C" __global__ void add_post_layernorm_f32(float* x, const float* d, const float* pw, float ps, const float* w,
                                                  float* y, int n, float eps) {
    norm_block<true>(x, d, w, y, n, eps, pw, ps);
}

extern "C" __global__ void layernorm_inplace_f32(float* x, const float* w, int n, int w_rows, float eps) {
    norm_block<true>(x, nullptr, w + (long long)(blockIdx.x % w_rows) * n, x, n, eps);
}
