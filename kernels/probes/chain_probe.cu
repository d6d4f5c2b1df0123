// A probe, not a kernel of the engine (cargo xtask ptx compiles kernels/*.cu
// only; this folder is not read): the best share of the read ceiling that a
// decode step run as one kernel per dependent op can reach on the GPU it runs
// on, whatever the kernels compute. Written to bound issue 7's tg128 goals
// on the device tool's H100 (BENCHMARKS.md, "What a launch per op allows").
//
// Build and run on the device machine (its CUDA 13 nvcc, Hopper code):
//   nvcc -O3 -arch=sm_90 -o /tmp/chain kernels/probes/chain_probe.cu && /tmp/chain
//
// For each model shape (the bytes of `m40-llm synth`'s weights, GGUF sizes)
// it captures one decode token as a CUDA graph of the same dependent chain
// the engine runs: per layer the Q/K/V stack, attention, o, gate/up, down;
// then the output matrix and the selection. Each matrix op is a pure
// streaming read of exactly that matrix's bytes (read_probe's loop: 16-byte
// loads, several in flight per thread, grid-stride, nothing computed), from
// its own region of one allocation laid out like the model, so no token
// finds a byte in the L2. Attention and the selection are the smallest
// possible kernel (one 16-byte load per thread, 32 blocks). A GEMV must also
// read x, reduce and write, and attention reads the cache, so the engine
// cannot beat these figures with a launch per op; the share printed is an
// upper bound for that schedule.
//
// Streaming configurations, each tried for the whole chain and printed:
// - "BxU": read_probe's grid-stride loop, B blocks of 256 threads a SM, U
//   16-byte loads in flight a thread;
// - "0xU": the packed GEMV's memory schedule (`chunked`): one warp per row
//   group (two where that fits one wave of 924 blocks of 4 warps, as the
//   launcher's ksplit), each warp its own contiguous bytes in rounds of U
//   loads a lane with a __syncwarp after them;
// - "0x40" / "0x20": the same with U = 4 / 2 and ~40 instructions of
//   arithmetic per loaded vector (about what the Q4_0 GEMV decodes per 16
//   bytes), "0x41" / "0x21" with the next round's loads issued before that
//   arithmetic (double-buffered registers); "0x80" / "0x81": ~160.
// The ceiling is read_probe's (8 blocks per SM, 4 loads, 2 GiB), measured in
// the same run. Each figure: one replay to warm up, then the median of 15
// graph replays timed with events.
//
// Then each of issue 5's GEMV shapes and formats alone: 40 pure streaming
// reads of its bytes in a graph (the GEMV bench's method), the best
// configuration's time against the bytes at the ceiling.
//
// PROBE_PREFETCH=1 adds chains whose attention stand-in also pulls the
// first 1, 1/2 or 1/4 of the o matrix into the L2 (prefetch.global.L2);
// PROBE_FUSED=1 adds chains without the attention stand-in (as if attention
// ran inside the Q/K/V kernel: a node a layer fewer); PROBE_SINGLE=1 only launches each variant once on the 8B Q4_0 matrices
// (for `ncu --metrics gpu__time_duration.sum`).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#define CK(x)                                                                  \
    do {                                                                       \
        cudaError_t e = (x);                                                   \
        if (e != cudaSuccess) {                                                \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

typedef unsigned int u32;

template <int UNR>
__global__ void stream(const uint4* __restrict__ p, long long n_vec, u32* out) {
    u32 acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNR - 1) * stride < n_vec; i += UNR * stride) {
        uint4 v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNR; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n_vec; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc == 0x12345678u) out[blockIdx.x] = acc;  // keeps the loads
}

// The packed GEMV's memory schedule: warp w streams its own contiguous
// `per` vectors (a row group's bytes, or a ksplit-th of them) in rounds of U
// 16-byte loads a lane, a __syncwarp after them, blocks of 4 warps. C: FMAs
// a loaded vector (4 chains, as a GEMV's decode; C = 0: the vector's words
// XORed, so the loads are kept). DB: the next round's loads issued before
// this round's arithmetic (two rounds of registers).
template <int U, int C, bool DB>
__global__ void chunked(const uint4* __restrict__ p, long long per, long long n_vec, u32* out) {
    const int lane = threadIdx.x & 31;
    const long long w = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    const long long b0 = w * per, e = min(b0 + per, n_vec);
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    u32 bits = 0;
    const float xs = 1.0f + lane * 1e-3f;
    auto work = [&](const uint4& v) {
        if (C == 0) bits ^= v.x ^ v.y ^ v.z ^ v.w;
        float f0 = __uint_as_float(v.x & 0x3fffffffu), f1 = __uint_as_float(v.y & 0x3fffffffu);
        float f2 = __uint_as_float(v.z & 0x3fffffffu), f3 = __uint_as_float(v.w & 0x3fffffffu);
#pragma unroll
        for (int c = 0; c < C / 4; ++c) {
            a0 = fmaf(f0, xs, a0), a1 = fmaf(f1, xs, a1), a2 = fmaf(f2, xs, a2), a3 = fmaf(f3, xs, a3);
            f0 = f0 * 0.999f, f1 = f1 * 0.999f, f2 = f2 * 0.999f, f3 = f3 * 0.999f;
        }
    };
    // A round: U loads a lane from `at`, then (works) the arithmetic on them.
    auto load = [&](uint4* v, long long at) {
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = __ldcs(p + at + lane + 32 * u);
    };
    auto works = [&](const uint4* v) {
#pragma unroll
        for (int u = 0; u < U; ++u) work(v[u]);
    };
    long long base = b0;
    if (!DB) {
        for (; base + 32 * U <= e; base += 32 * U) {
            uint4 v[U];
            load(v, base);
            __syncwarp();
            works(v);
        }
    } else if (base + 32 * U <= e) {
        uint4 v[U];
        load(v, base);
        base += 32 * U;
        for (; base + 32 * U <= e; base += 32 * U) {
            uint4 nx[U];
            load(nx, base);
            __syncwarp();
            works(v);
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = nx[u];
        }
        works(v);
    }
    for (long long i = base + lane; i < e; i += 32) work(__ldcs(p + i));
    float acc = a0 + a1 + a2 + a3;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    for (int o = 16; o > 0; o >>= 1) bits ^= __shfl_xor_sync(0xffffffffu, bits, o);
    if (lane == 0 && (acc == 1234.5f || bits == 0x12345678u)) out[blockIdx.x] = 1;  // keeps the loads
}

__global__ void tiny(const uint4* __restrict__ p, u32* out) {
    const uint4 a = p[blockIdx.x * blockDim.x + threadIdx.x];
    const u32 v = a.x ^ a.y ^ a.z ^ a.w;
    if (v == 0x12345678u) out[blockIdx.x] = v;
}

// The tiny kernel, with extra blocks pulling the next op's first `pf` bytes
// into the L2 (prefetch.global.L2, one per 128-byte line): attention leaves
// DRAM idle, so the o matrix could be on chip when its GEMV starts.
__global__ void tiny_pf(const uint4* __restrict__ p, u32* out, const char* next, long long pf) {
    if (blockIdx.x < 32) {
        const uint4 a = p[blockIdx.x * blockDim.x + threadIdx.x];
        const u32 v = a.x ^ a.y ^ a.z ^ a.w;
        if (v == 0x12345678u) out[blockIdx.x] = v;
        return;
    }
    const long long stride = (long long)(gridDim.x - 32) * blockDim.x * 128;
    for (long long i = ((long long)(blockIdx.x - 32) * blockDim.x + threadIdx.x) * 128; i < pf; i += stride)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(next + i));
}

struct Op {
    long long bytes;  // 0: the tiny kernel
    long long warps;  // the GEMV's warps: row groups x ksplit
};

struct Model {
    const char* name;
    std::vector<Op> ops;
    long long total;
};

// The packed GEMV's warps for rows x cols (gemv_packed's planner, roughly):
// one a group of 4 rows, 2 a group where that still fits one wave of 924
// blocks of 4 warps.
static Op mat(long long rows, long long cols, double bpw) {
    long long b = (long long)(rows * cols * bpw);
    const long long groups = rows / 4;
    const long long warps = groups * 2 <= 924 * 4 ? groups * 2 : groups;
    return Op{(b + 255) / 256 * 256, warps};  // 16-byte aligned regions
}

// Llama shapes: hidden, kv dim, ffn, layers; bytes per weight of each matrix.
static Model llama(const char* name, int L, long long d, long long kv, long long ff, double q, double v_down_hi,
                   int hi_layers) {
    Model m{name, {}, 0};
    const long long vocab = 128256;
    for (int l = 0; l < L; ++l) {
        // llama-quantize's Q4_K_M mix: attn_v and ffn_down in Q6_K in some layers
        // (spread over the depth), the rest Q4_K.
        const bool hi = hi_layers > 0 && (l * hi_layers) / L != ((l + 1) * hi_layers) / L;
        if (hi) {
            m.ops.push_back({mat(d + kv, d, q)});
            m.ops.push_back({mat(kv, d, v_down_hi)});
        } else {
            m.ops.push_back({mat(d + 2 * kv, d, q)});
        }
        m.ops.push_back({0, 0});
        m.ops.push_back({mat(d, d, q)});
        m.ops.push_back({mat(2 * ff, d, q)});
        m.ops.push_back({mat(d, ff, hi ? v_down_hi : q)});
    }
    m.ops.push_back({mat(vocab, d, hi_layers > 0 ? v_down_hi : q)});
    m.ops.push_back({0, 0});
    for (const Op& o : m.ops) m.total += o.bytes;
    return m;
}

typedef void (*StreamFn)(const uint4*, long long, u32*);

static float time_graph(cudaGraphExec_t g, cudaStream_t s) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaGraphLaunch(g, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> t;
    for (int i = 0; i < 15; ++i) {
        CK(cudaEventRecord(a, s));
        CK(cudaGraphLaunch(g, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return t[t.size() / 2];
}

int main() {
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    u32* out;
    CK(cudaMalloc(&out, 1 << 20));
    const double q4_0 = 18.0 / 32, q8_0 = 34.0 / 32, f16 = 2.0, q4_k = 144.0 / 256, q6_k = 210.0 / 256;
    std::vector<Model> models = {
        llama("llama-8b Q4_0", 32, 4096, 1024, 14336, q4_0, 0, 0),
        llama("llama-8b Q4_K_M", 32, 4096, 1024, 14336, q4_k, q6_k, 12),
        llama("llama-8b Q8_0", 32, 4096, 1024, 14336, q8_0, 0, 0),
        llama("llama-8b F16", 32, 4096, 1024, 14336, f16, 0, 0),
        llama("llama-1b Q4_0", 16, 2048, 512, 8192, q4_0, 0, 0),
    };
    long long most = 0;
    for (const Model& m : models) most = std::max(most, m.total);
    const long long ceil_bytes = 2LL << 30;
    most = std::max(most, ceil_bytes);
    uint4* buf;
    CK(cudaMalloc(&buf, most + (1 << 20)));
    CK(cudaMemset(buf, 0x5a, most + (1 << 20)));

    // The ceiling: read_probe's configuration over 2 GiB, as a one-node graph.
    auto ceiling = [&]() {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        stream<4><<<8 * sms, 256, 0, s>>>(buf, ceil_bytes / 16, out);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const float ms = time_graph(ge, s);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return ceil_bytes / (ms * 1e-3) / 1e9;
    };
    if (getenv("PROBE_SINGLE")) {
        // One plain launch of each streaming variant on the 8B Q4_0 matrices,
        // for a profiler (ncu) to time in isolation.
        const Op ops[] = {mat(6144, 4096, q4_0), mat(4096, 4096, q4_0), mat(28672, 4096, q4_0), mat(4096, 14336, q4_0)};
        long long off = 0;
        for (const Op& o : ops) {
            const long long nv = o.bytes / 16, per = (nv + o.warps - 1) / o.warps;
            const int cg = (int)((o.warps + 3) / 4);
            stream<2><<<8 * sms, 256, 0, s>>>(buf + off / 16, nv, out);
            off += o.bytes;
            chunked<4, 0, false><<<cg, 128, 0, s>>>(buf + off / 16, per, nv, out);
            off += o.bytes;
            chunked<4, 20, false><<<cg, 128, 0, s>>>(buf + off / 16, per, nv, out);
            off += o.bytes;
            tiny<<<32, 128, 0, s>>>(buf, out);
        }
        CK(cudaStreamSynchronize(s));
        return 0;
    }
    const double read_gbs = ceiling();
    printf("read ceiling: %.0f GB/s\n\n", read_gbs);

    typedef void (*ChunkFn)(const uint4*, long long, long long, u32*);
    struct Cfg {
        int bps, unr;  // bps 0: the GEMV's schedule (chunked), unr: the label
        StreamFn fn;
        ChunkFn cfn;
    };
    const std::vector<Cfg> cfgs = {{2, 4, stream<4>, 0},  {4, 4, stream<4>, 0},  {8, 4, stream<4>, 0},
                                   {2, 8, stream<8>, 0},  {4, 8, stream<8>, 0},  {8, 2, stream<2>, 0},
                                   {0, 2, 0, chunked<2, 0, false>}, {0, 4, 0, chunked<4, 0, false>}, {0, 8, 0, chunked<8, 0, false>},
                                   {0, 40, 0, chunked<4, 20, false>}, {0, 41, 0, chunked<4, 20, true>},
                                   {0, 20, 0, chunked<2, 20, false>}, {0, 21, 0, chunked<2, 20, true>},
                                   {0, 80, 0, chunked<4, 80, false>}, {0, 81, 0, chunked<4, 80, true>}};
    printf("| model | GB a token | bound t/s (blocks/SM x loads) | bound share of read | others |\n");
    printf("|---|---|---|---|---|\n");
    const int pf_modes = getenv("PROBE_PREFETCH") ? 4 : 1;
    // PROBE_FUSED=1: also chains without the attention stand-in (attention
    // run inside the Q/K/V kernel: a node a layer fewer), mode pf_modes.
    const int modes = pf_modes + (getenv("PROBE_FUSED") ? 1 : 0);
    for (int pfm = 0; pfm < modes; ++pfm)
    for (const Model& m : models) {
        // pfm: 0 no prefetch; 1, 2, 3: attention prefetches all of o, half, a quarter
        double best = 0;
        int best_i = 0;
        std::vector<double> tps;
        for (size_t ci = 0; ci < cfgs.size(); ++ci) {
            const Cfg& c = cfgs[ci];
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            long long off = 0;
            for (size_t oi = 0; oi < m.ops.size(); ++oi) {
                const Op& o = m.ops[oi];
                if (o.bytes == 0 && pfm == pf_modes && oi + 1 < m.ops.size()) {
                    continue;
                } else if (o.bytes == 0 && pfm > 0 && oi + 1 < m.ops.size()) {
                    const long long pf = m.ops[oi + 1].bytes >> (pfm - 1);
                    tiny_pf<<<32 + 2 * sms, 256, 0, s>>>(buf, out, (const char*)(buf + off / 16), pf);
                } else if (o.bytes == 0) {
                    tiny<<<32, 128, 0, s>>>(buf, out);
                } else if (c.bps == 0) {
                    const long long nv = o.bytes / 16, per = (nv + o.warps - 1) / o.warps;
                    c.cfn<<<(int)((o.warps + 3) / 4), 128, 0, s>>>(buf + off / 16, per, nv, out);
                    off += o.bytes;
                } else {
                    const long long nv = o.bytes / 16;
                    long long blocks = std::min<long long>((long long)c.bps * sms, (nv + 255) / 256);
                    c.fn<<<(int)blocks, 256, 0, s>>>(buf + off / 16, nv, out);
                    off += o.bytes;
                }
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            const float ms = time_graph(ge, s);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            const double t = 1e3 / ms;
            tps.push_back(t);
            if (t > best) best = t, best_i = (int)ci;
        }
        const double share = best * m.total / 1e9 / read_gbs;
        printf("| %s%s | %.3f |", m.name, pfm == 0 ? "" : pfm == pf_modes ? " no attention node" : pfm == 1 ? " pf all" : pfm == 2 ? " pf half" : " pf quarter",
               m.total / 1e9);
        printf(" %.1f (%d x %d) | %.1f%% |", best, cfgs[best_i].bps,
               cfgs[best_i].unr, 100 * share);
        for (size_t ci = 0; ci < cfgs.size(); ++ci)
            printf(" %dx%d %.1f%s", cfgs[ci].bps, cfgs[ci].unr, tps[ci], ci + 1 < cfgs.size() ? "," : "");
        printf(" |\n");
    }
    // One matrix alone (issue 5's GEMV shapes, each format's GGUF bytes),
    // 40 launches in a graph over rotating regions: the fastest streaming
    // kernel of that size against its bytes at the ceiling. No GEMV of the
    // shape can take less time than reading its weights.
    printf("\n| format | rows x cols | MB | us a kernel (best config) | us at the ceiling | share of read | issue 5 goal |\n");
    printf("|---|---|---|---|---|---|---|\n");
    struct Fmt {
        const char* name;
        double bpw;
        int goal;
    };
    const Fmt fmts[] = {{"F16", f16, 85},   {"Q8_0", q8_0, 85},        {"Q6_K", q6_k, 80},
                        {"Q4_1", 20.0 / 32, 80}, {"Q4_0, Q4_K", q4_0, 80}};
    const long long shapes[][2] = {{4096, 4096}, {14336, 4096}};
    for (const Fmt& f : fmts)
        for (const auto& sh : shapes) {
            const long long b = mat(sh[0], sh[1], f.bpw).bytes;
            double best_us = 1e30;
            for (const Cfg& c : cfgs) {
                if (c.bps == 0) continue;
                cudaGraph_t g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
                const int reps = 40;
                for (int r = 0; r < reps; ++r) {
                    const long long nv = b / 16;
                    const long long off = (long long)r * ((b + 4095) / 4096 * 4096) % (most - b);
                    long long blocks = std::min<long long>((long long)c.bps * sms, (nv + 255) / 256);
                    c.fn<<<(int)blocks, 256, 0, s>>>(buf + off / 16, nv, out);
                }
                CK(cudaStreamEndCapture(s, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                const float ms = time_graph(ge, s);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
                best_us = std::min(best_us, ms * 1e3 / reps);
            }
            const double ideal = b / (read_gbs * 1e3);
            printf("| %s | %lldx%lld (and transposed) | %.1f | %.2f | %.2f | %.1f%% | %d%% |\n", f.name, sh[0], sh[1],
                   b / 1e6, best_us, ideal, 100 * ideal / best_us, f.goal);
        }
    return 0;
}
