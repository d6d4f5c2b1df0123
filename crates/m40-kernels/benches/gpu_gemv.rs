//! GEMV bandwidth per weight format on the GPU, against the read bandwidth
//! measured in the same run (kernels/bench.cu `read_probe`).
//!
//! `cargo bench -p m40-kernels --bench gpu_gemv` (or the binary in the GPU
//! pack). Shapes (rows x cols): 4096x4096, 14336x4096, 4096x14336 — an 8B
//! model's attention, gate/up and down projections. Weights are random bytes
//! filled on the device (never zeros), rotated among enough copies that the
//! set is at least 4x the L2 cache. `us`: 20 launches captured in a CUDA graph
//! and replayed, the median over 30 replays timed with device events, per
//! launch (no launch gaps: the kernel itself). `us (stream)`: the same 20
//! launches queued on the stream one by one, median over 30 batches (what a
//! caller that launches kernels one at a time sees). Bytes counted: weights,
//! x and y. `split`: warps per row group the launcher chose; `us k=N`: the
//! graph time with N forced (3: the formats with a 3-way split, in blocks of
//! 6 warps; "-" where the launcher lowered it). A second table times the packed layout
//! (`Kernels::gemv_packed`) on the same shapes plus 4x4096 (a launch's fixed
//! cost) and 57344x4096 (closer to the streaming rate);
//! `M40_BENCH_PACKED_ONLY=1` runs only that one. A third table times
//! several tokens at once (1 to 16: several sequences decoding, a short
//! prompt) through the batched packed GEMV (`Kernels::gemv_packed_batch`,
//! each weight loaded once for all of them) against the packed GEMM
//! (`Kernels::gemm_packed`); `M40_BENCH_BATCH_ONLY=1` runs only that one,
//! `M40_BENCH_BATCH_TOKENS=16,32,64` and `M40_BENCH_BATCH_SHAPES=576x576`
//! (a small model's) replace its token counts and shapes, and
//! `M40_BENCH_FORMAT=T` narrows it to one format.
//! A fourth table times the prefill GEMM (`Kernels::gemm_packed`, 512 tokens
//! and the 8B model's Q/K/V, o, gate/up and down shapes) in TFLOP/s against
//! the FP32 FMA rate measured in the same run (`fma_probe`);
//! `M40_BENCH_GEMM_ONLY=1` runs only that one, `M40_BENCH_GEMM_TOKENS=32`
//! at 32 tokens instead; `M40_BENCH_GEMM_SHAPE=28672x4096` (any
//! ROWSxCOLS) and `M40_BENCH_FORMAT=Q4_0` narrow it to one shape and
//! format; `M40_BENCH_GEMM_SPLITS=1,2,4,8` and
//! `M40_BENCH_GEMM_TILES=narrow,rows` time each split over K and
//! tile forced (`GemmOpts::splits`, `GemmOpts::tile`) instead of the plan's.
//! `M40_BENCH_JSON=path` also writes the first two tables as JSON.
//!
//! Without a GPU it prints why and exits 0 (1 with M40_REQUIRE_GPU=1).

use m40_device::testing::test_device;
use m40_device::{DeviceBuffer, DeviceView, Stream};
use m40_kernels::{
    gemv_shared_bytes, GemmTile, KernelFormat, Kernels, PackFormat, PackedMatrix, QMatrix,
};

const WARMUP_BATCHES: usize = 2;
const RUNS: usize = 30;
/// Launches queued between two events: the GPU never waits for the host, so
/// small kernels are timed, not the launch path.
const BATCH: usize = 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Milliseconds per launch of a batch: `batch()` queues BATCH launches (a graph
/// replay); the median over RUNS batches, each timed with events on `s`.
fn time_batches(s: &Stream, mut batch: impl FnMut()) -> f64 {
    for _ in 0..WARMUP_BATCHES {
        batch();
    }
    s.synchronize().expect("warm-up");
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let a = s.record().expect("event");
        batch();
        let b = s.record().expect("event");
        b.synchronize().expect("sync");
        times.push(a.elapsed_ms(&b).expect("elapsed") as f64 / BATCH as f64);
    }
    median(times)
}

/// Milliseconds per launch of `launch(s, i)` for i in 0..BATCH captured in a
/// CUDA graph and replayed (no launch gaps: the kernels themselves).
fn replay_ms(
    s: &Stream,
    mut launch: impl FnMut(&Stream, usize) -> Result<(), m40_kernels::KernelError>,
) -> f64 {
    let graph = s
        .capture(|s| (0..BATCH).try_for_each(|i| launch(s, i)))
        .expect("capture");
    // SAFETY: what the graph reads and writes was borrowed by `launch` from
    // the caller, which outlives this function; the graph is dropped here.
    let ms = time_batches(s, || unsafe { graph.launch().expect("graph launch") });
    drop(graph);
    s.synchronize().expect("replay");
    ms
}

/// Milliseconds per call of `f` (`f(i)` for i = 0, 1, ...) queued one by one:
/// batches of BATCH calls timed as by `time_batches`.
fn time_ms(s: &Stream, mut f: impl FnMut(usize)) -> f64 {
    let mut i = 0;
    time_batches(s, || {
        for _ in 0..BATCH {
            f(i);
            i += 1;
        }
    })
}

fn main() {
    // `cargo bench` passes --bench; nothing else is accepted.
    let Some(dev) = test_device("gpu_gemv bench") else {
        return;
    };
    let info = dev.info().clone();
    // A stream of its own: graphs cannot be captured from the default stream.
    let s = dev.new_stream().expect("stream");
    let k = Kernels::new(dev.clone());
    k.load_all().expect("load kernels");
    println!(
        "device: {} (sm {}.{}, {} SMs, {:.1} GiB, L2 {} MB, driver API {})",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.l2_bytes >> 20,
        info.driver_version
    );

    // The ceiling: read-only bandwidth over 2 GiB (far beyond L2).
    let probe_bytes = 2usize << 30;
    let mut big = s.alloc::<u8>(probe_bytes, "probe buffer").expect("alloc");
    k.fill_random(&s, &mut big, 1).expect("fill");
    let mut sink = s
        .alloc::<u32>(k.probe_blocks(), "probe sink")
        .expect("alloc");
    let bv = big.view();
    let probe_ms = time_ms(&s, |_| k.read_probe(&s, &bv, &mut sink).expect("probe"));
    let ceiling = probe_bytes as f64 / (probe_ms * 1e-3) / 1e9;
    println!("read bandwidth (read_probe, 2 GiB, median of {RUNS} batches): {ceiling:.0} GB/s\n");

    let shapes = [(4096usize, 4096usize), (14336, 4096), (4096, 14336)];
    println!("| format | rows x cols | weights MB | us | GB/s | % of read | us (stream) | split | us k=1 | us k=2 | us k=4 | regs sm_52 | regs here | smem B |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let report = include_str!("../ptx/gemv.sm_52.txt");
    let mut json = Vec::new();
    let batch_only = std::env::var_os("M40_BENCH_BATCH_ONLY").is_some();
    let row_major = std::env::var_os("M40_BENCH_PACKED_ONLY").is_none() && !batch_only;
    if batch_only {
        batched(&s, &k, &big, info.l2_bytes, ceiling);
        return;
    }
    if std::env::var_os("M40_BENCH_GEMM_ONLY").is_some() {
        prefill(&s, &k, &big, info.l2_bytes);
        return;
    }
    for f in KernelFormat::ALL.into_iter().filter(|_| row_major) {
        let regs = sm52_registers(report, f.gemv);
        // What the driver's JIT made of the same PTX for this GPU.
        let regs_here = k
            .kernel("gemv", f.gemv)
            .and_then(|kn| Ok(kn.attributes()?.registers))
            .expect("kernel attributes");
        for &(rows, cols) in &shapes {
            let row_bytes = f.ty.row_bytes(cols as u64).expect("shape") as usize;
            let wbytes = rows * row_bytes;
            let views = weight_copies(&big, wbytes, info.l2_bytes);
            let copies = views.len();
            let x = activations(&s, cols);
            let xv = x.view();
            let mut y = s.alloc::<f32>(rows, "y").expect("alloc");
            let mut plan = None;
            let ms_stream = time_ms(&s, |i| {
                let m = QMatrix {
                    ty: f.ty,
                    data: &views[i % copies],
                    rows,
                    cols,
                };
                plan = Some(k.gemv_split(&s, &m, &xv, &mut y, None).expect("gemv"));
            });
            let plan = plan.expect("planned");
            // The same BATCH launches captured once and replayed: no launch
            // gaps. Each split forced (1, 2, 4 warps per row group; None where
            // a row has too few chunks for it); `us` is the launcher's own.
            let mut graph_ms = |ksplit: u32| {
                let mut plan = None;
                let ms = replay_ms(&s, |s, i| {
                    let m = QMatrix {
                        ty: f.ty,
                        data: &views[i % copies],
                        rows,
                        cols,
                    };
                    plan = Some(k.gemv_split(s, &m, &xv, &mut y, Some(ksplit))?);
                    Ok(())
                });
                let lowered = plan.expect("planned").ksplit != ksplit;
                (!lowered).then_some(ms)
            };
            const SPLITS: [u32; 3] = [1, 2, 4];
            let split_ms = SPLITS.map(&mut graph_ms);
            let ms = SPLITS
                .iter()
                .zip(split_ms)
                .find_map(|(&k, t)| if k == plan.ksplit { t } else { None })
                .expect("the plan's split is timed");
            let splits =
                split_ms.map(|t| t.map_or("-".to_string(), |ms| format!("{:.1}", ms * 1e3)));
            let bytes = (wbytes + cols * 4 + rows * 4) as f64;
            let gbs = bytes / (ms * 1e-3) / 1e9;
            println!(
                "| {} | {rows}x{cols} | {:.1} | {:.1} | {gbs:.0} | {:.1}% | {:.1} | {} | {} | {} | {} | {regs} | {regs_here} | {} |",
                f.ty,
                wbytes as f64 / 1e6,
                ms * 1e3,
                100.0 * gbs / ceiling,
                ms_stream * 1e3,
                plan.ksplit,
                splits[0],
                splits[1],
                splits[2],
                gemv_shared_bytes(&f)
            );
            json.push(format!(
                "{{\"format\":\"{}\",\"rows\":{rows},\"cols\":{cols},\"us\":{:.2},\"gbs\":{gbs:.1},\"share\":{:.4}}}",
                f.ty,
                ms * 1e3,
                gbs / ceiling
            ));
        }
    }

    // The packed layout (kernels/gemv_packed.cu): the same random bytes read
    // as packed groups (every shape's rows are a multiple of 4, so the byte
    // count is the GGUF one).
    println!("\npacked layout (weights repacked at upload):\n");
    println!("| format | rows x cols | us | GB/s | % of read | split | us k=1 | us k=2 | us k=3 | us k=4 | regs sm_52 | regs here |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let report = include_str!("../ptx/gemv_packed.sm_52.txt");
    // Two more shapes show what the launch costs: 4 rows (about the fixed
    // cost of a launch: start, first loads' latency, drain) and 57344x4096
    // (4x the gate/up bytes: closer to the streaming rate).
    let packed_shapes = [
        (4usize, 4096usize),
        (4096, 4096),
        (14336, 4096),
        (4096, 14336),
        (57344, 4096),
    ];
    for f in PackFormat::ALL {
        let regs = sm52_registers(report, f.gemv);
        let regs_here = k
            .kernel("gemv_packed", f.gemv)
            .and_then(|kn| Ok(kn.attributes()?.registers))
            .expect("kernel attributes");
        for &(rows, cols) in &packed_shapes {
            let wbytes = f.packed_bytes(rows, cols);
            let views = weight_copies(&big, wbytes, info.l2_bytes);
            let copies = views.len();
            let x = activations(&s, cols);
            let xv = x.view();
            let mut y = s.alloc::<f32>(rows, "y").expect("alloc");
            let mut graph_ms = |ksplit: Option<u32>| {
                let mut split = 0;
                let ms = replay_ms(&s, |s, i| {
                    let m = PackedMatrix {
                        ty: f.ty,
                        data: &views[i % copies],
                        rows,
                        cols,
                    };
                    split = k.gemv_packed(s, &m, &xv, &mut y, ksplit)?;
                    Ok(())
                });
                (ms, split)
            };
            let (ms, split) = graph_ms(None);
            let splits = [1, 2, 3, 4].map(|ks| {
                let (t, got) = graph_ms(Some(ks));
                if got == ks {
                    format!("{:.1}", t * 1e3)
                } else {
                    "-".to_string()
                }
            });
            let bytes = (wbytes + cols * 4 + rows * 4) as f64;
            let gbs = bytes / (ms * 1e-3) / 1e9;
            println!(
                "| {} | {rows}x{cols} | {:.1} | {gbs:.0} | {:.1}% | {split} | {} | {} | {} | {} | {regs} | {regs_here} |",
                f.ty,
                ms * 1e3,
                100.0 * gbs / ceiling,
                splits[0],
                splits[1],
                splits[2],
                splits[3],
            );
            json.push(format!(
                "{{\"format\":\"{} packed\",\"rows\":{rows},\"cols\":{cols},\"us\":{:.2},\"gbs\":{gbs:.1},\"share\":{:.4}}}",
                f.ty,
                ms * 1e3,
                gbs / ceiling
            ));
        }
    }
    if let Ok(path) = std::env::var("M40_BENCH_JSON") {
        let text = format!(
            "{{\"device\":\"{}\",\"read_gbs\":{ceiling:.1},\"gemv\":[{}]}}\n",
            info.name,
            json.join(",")
        );
        std::fs::write(&path, text).expect("write json");
    }
}

/// The batched packed GEMV against the packed GEMM for 1 to 16 tokens (or
/// M40_BENCH_BATCH_TOKENS): us
/// per launch (graph replay, weights rotated past the L2), and the GEMV's
/// weight bytes per second as a share of the read ceiling.
fn batched(s: &Stream, k: &Kernels, big: &DeviceBuffer<u8>, l2_bytes: usize, ceiling: f64) {
    println!(
        "batched packed GEMV vs packed GEMM (us per launch; GEMV weight GB/s as % of read):\n"
    );
    println!(
        "| format | rows x cols | tokens | GEMV us | GEMV % of read | GEMM us | GEMV / GEMM time |"
    );
    println!("|---|---|---|---|---|---|---|");
    /// A comma-separated list from the environment, its items parsed.
    fn list<T>(key: &str, parse: impl Fn(&str) -> Option<T>) -> Option<Vec<T>> {
        let v = std::env::var(key).ok()?;
        Some(v.split(',').filter_map(parse).collect())
    }
    let tokens = list("M40_BENCH_BATCH_TOKENS", |t| {
        t.parse().ok().filter(|&m| m > 0)
    })
    .unwrap_or_else(|| vec![1usize, 2, 4, 8, 16]);
    let shapes = list("M40_BENCH_BATCH_SHAPES", |t| {
        let (r, c) = t.split_once('x')?;
        Some((r.parse().ok()?, c.parse().ok()?))
    })
    .unwrap_or_else(|| vec![(4096usize, 4096usize), (14336, 4096), (4096, 14336)]);
    let format = std::env::var("M40_BENCH_FORMAT").ok();
    for f in PackFormat::ALL {
        if format.as_ref().is_some_and(|t| *t != f.ty.to_string()) {
            continue;
        }
        for &(rows, cols) in &shapes {
            let wbytes = f.packed_bytes(rows, cols);
            let views = weight_copies(big, wbytes, l2_bytes);
            let copies = views.len();
            for &m in &tokens {
                let x = activations(s, m * cols);
                let xv = x.view();
                let mut y = s.alloc::<f32>(m * rows, "y").expect("alloc");
                let mut run = |gemv: bool| {
                    replay_ms(s, |s, i| {
                        let pm = PackedMatrix {
                            ty: f.ty,
                            data: &views[i % copies],
                            rows,
                            cols,
                        };
                        if gemv {
                            let out = m40_kernels::RowSplit {
                                bufs: &mut [&mut y],
                                rows: &[rows],
                            };
                            k.gemv_packed_batch(s, &pm, &xv, out, m, None).map(drop)
                        } else {
                            k.gemm_packed(s, &pm, &xv, &mut y, m, Default::default())
                        }
                    })
                };
                let (gv, gm) = (run(true), run(false));
                let gbs = wbytes as f64 / (gv * 1e-3) / 1e9;
                println!(
                    "| {} | {rows}x{cols} | {m} | {:.1} | {:.1}% | {:.1} | {:.2} |",
                    f.ty,
                    gv * 1e3,
                    100.0 * gbs / ceiling,
                    gm * 1e3,
                    gv / gm
                );
            }
        }
    }
}

/// The packed GEMM at prefill sizes: TFLOP/s (2 per multiply-add of the
/// product) against the FMA ceiling (`fma_probe`, median of RUNS batches).
fn prefill(s: &Stream, k: &Kernels, big: &DeviceBuffer<u8>, l2_bytes: usize) {
    let mut out = s
        .alloc::<f32>(k.probe_blocks() * 256, "fma out")
        .expect("alloc");
    let mut flops = 0;
    let fma_ms = time_ms(s, |_| {
        flops = k.fma_probe(s, &mut out, 4096).expect("fma probe")
    });
    let ceiling = flops as f64 / (fma_ms * 1e-3) / 1e12;
    println!("FP32 FMA rate (fma_probe, median of {RUNS} batches): {ceiling:.1} TFLOP/s\n");
    println!(
        "| format | tokens | rows x cols | us | TFLOP/s | % of FMA rate | splits over K | us unsplit |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // `M40_BENCH_GEMM_TOKENS=M` times M tokens (a decode batch's tiles)
    // instead of 512; `M40_BENCH_GEMM_SHAPE=ROWSxCOLS` and
    // `M40_BENCH_FORMAT=T` narrow the table to one shape and format (a
    // profiler's run).
    let m = std::env::var("M40_BENCH_GEMM_TOKENS")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&m| m > 0)
        .unwrap_or(512);
    let shape = std::env::var("M40_BENCH_GEMM_SHAPE").ok();
    let format = std::env::var("M40_BENCH_FORMAT").ok();
    for f in PackFormat::ALL {
        if format.as_ref().is_some_and(|t| *t != f.ty.to_string()) {
            continue;
        }
        // `M40_BENCH_GEMM_SHAPE=ROWSxCOLS`: that shape alone (any, e.g. an
        // 8B's output matrix, 128256x4096).
        // `M40_BENCH_GEMM_SPLITS=1,2,4,...` and `M40_BENCH_GEMM_TILES=
        // narrow,rows,large,small`: each split and tile forced instead (a
        // sweep behind the planner's choice).
        let forced_splits: Option<Vec<usize>> = std::env::var("M40_BENCH_GEMM_SPLITS")
            .ok()
            .map(|l| l.split(',').filter_map(|v| v.parse().ok()).collect());
        let forced_tiles: Option<Vec<GemmTile>> = std::env::var("M40_BENCH_GEMM_TILES")
            .ok()
            .map(|l| l.split(',').map(tile_named).collect());
        let custom = shape
            .as_ref()
            .and_then(|s| s.split_once('x'))
            .and_then(|(r, c)| Some((r.parse::<usize>().ok()?, c.parse::<usize>().ok()?)));
        let shapes = match custom {
            Some(one) => vec![one],
            None => vec![
                (6144usize, 4096usize),
                (4096, 4096),
                (28672, 4096),
                (4096, 14336),
            ],
        };
        for (rows, cols) in shapes {
            let views = weight_copies(big, f.packed_bytes(rows, cols), l2_bytes);
            let copies = views.len();
            let x = activations(s, m * cols);
            let xv = x.view();
            let mut y = s.alloc::<f32>(m * rows, "y").expect("alloc");
            let gpu = k.gemm_slots().expect("occupancy");
            let forced_max = forced_splits.iter().flatten().max().copied().unwrap_or(1);
            let mut part = s
                .alloc::<f32>(
                    m40_kernels::gemm_scratch_len(m, rows, cols, gpu)
                        .max(forced_max * m * rows)
                        .max(1),
                    "scratch",
                )
                .expect("alloc");
            let mut run_with = |split: bool, forced: Option<usize>, tile: Option<GemmTile>| {
                replay_ms(s, |s, i| {
                    let pm = PackedMatrix {
                        ty: f.ty,
                        data: &views[i % copies],
                        rows,
                        cols,
                    };
                    let opts = m40_kernels::GemmOpts {
                        accumulate: false,
                        scratch: if split { Some(&mut part) } else { None },
                        splits: forced,
                        tile,
                    };
                    k.gemm_packed(s, &pm, &xv, &mut y, m, opts)
                })
            };
            if forced_splits.is_some() || forced_tiles.is_some() {
                let plan = m40_kernels::gemm_plan(
                    m,
                    rows,
                    cols,
                    k.gemm_slots_for(f.ty, true).expect("occupancy"),
                );
                let splits: Vec<Option<usize>> = match &forced_splits {
                    Some(l) => l.iter().copied().map(Some).collect(),
                    None => vec![None],
                };
                let tiles: Vec<Option<GemmTile>> = match &forced_tiles {
                    Some(l) => l.iter().copied().map(Some).collect(),
                    None => vec![None],
                };
                let mut cells = Vec::new();
                for &t in &tiles {
                    for &sp in &splits {
                        let ms = run_with(true, sp, t);
                        cells.push(format!("{t:?} s={sp:?} {:.1}", ms * 1e3));
                    }
                }
                println!(
                    "| {} | {m} | {rows}x{cols} | plan {:?} {} | {} |",
                    f.ty,
                    plan.tile,
                    plan.splits,
                    cells.join(" | ")
                );
                continue;
            }
            let mut run = |split: bool| run_with(split, None, None);
            let splits = k.gemm_splits(m, rows, cols).expect("occupancy");
            let (ms, unsplit) = if splits > 1 {
                (run(true), format!("{:.1}", run(false) * 1e3))
            } else {
                (run(false), "-".into())
            };
            let tflops = 2.0 * (m * rows * cols) as f64 / (ms * 1e-3) / 1e12;
            println!(
                "| {} | {m} | {rows}x{cols} | {:.1} | {tflops:.1} | {:.1}% | {splits} | {unsplit} |",
                f.ty,
                ms * 1e3,
                100.0 * tflops / ceiling
            );
        }
    }
}

/// A tile by its lowercase name (`M40_BENCH_GEMM_TILES`).
fn tile_named(name: &str) -> GemmTile {
    match name {
        "large" => GemmTile::Large,
        "small" => GemmTile::Small,
        "narrow" => GemmTile::Narrow,
        "rows" => GemmTile::Rows,
        other => panic!("M40_BENCH_GEMM_TILES: no tile {other}"),
    }
}

/// Views of `wbytes` in `big`, as many copies as fill at least 4x the L2
/// (at least 2), 256-byte aligned: each launch reads weights from DRAM.
fn weight_copies(
    big: &DeviceBuffer<u8>,
    wbytes: usize,
    l2_bytes: usize,
) -> Vec<DeviceView<'_, u8>> {
    let stride = wbytes.div_ceil(256) * 256;
    let copies = (4 * l2_bytes).div_ceil(stride).clamp(2, big.len() / stride);
    (0..copies)
        .map(|c| big.slice(c * stride..c * stride + wbytes).expect("view"))
        .collect()
}

/// Finite, varied activations, `n` floats (the weights are random bytes).
fn activations(s: &Stream, n: usize) -> DeviceBuffer<f32> {
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    s.upload(&v, "x").expect("upload")
}

/// Registers ptxas reported for `kernel` on sm_52 (ptx/gemv.sm_52.txt).
fn sm52_registers(report: &str, kernel: &str) -> String {
    report
        .split(&format!("Function properties for {kernel}\n"))
        .nth(1)
        .and_then(|r| r.lines().nth(1))
        .and_then(|l| l.split("Used ").nth(1))
        .and_then(|l| l.split(' ').next())
        .unwrap_or("?")
        .to_string()
}
