//! The engine on the GPU: `Auto` picks it, `Gpu` insists on it, and greedy
//! generation gives the CPU engine's tokens on the SmolLM2-shaped zoo model
//! and the quant zoo. The GPU tests are ignored without
//! `--include-ignored` and fail with it where there is no GPU.

#[path = "../../m40-gguf/tests/common/mod.rs"]
mod common;

use m40_device::testing::gpu_device;
use m40_runtime::{
    BackendChoice, CancelToken, CpuMath, Engine, EngineOptions, Prompt, Request, SamplingParams,
};

fn engine(path: &std::path::Path, backend: BackendChoice) -> Engine {
    Engine::from_path(path, {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(256);
        o.backend = backend;
        // The GPU computes in FP32: compare with the exact CPU.
        o.cpu_math = CpuMath::Exact;
        o
    })
    .unwrap()
}

/// Each prompt's 40 greedy tokens, all generated at once from threads
/// (batched steps).
fn greedy_answers(e: &Engine, prompts: &[&str]) -> Vec<Vec<u32>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let mut req = Request::new(Prompt::Text(p.to_string()));
                    req.sampling = SamplingParams::greedy();
                    req.max_tokens = Some(40);
                    e.generate(&req, &CancelToken::new(), |_| {})
                        .unwrap()
                        .token_ids
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_engine_generates_what_the_cpu_engine_does() {
    gpu_device("gpu_engine_generates_what_the_cpu_engine_does");
    let td = common::testdata().expect("the quant zoo is needed (M40_TESTDATA)");
    let mut differ = Vec::new();
    for ty in ["F32", "F16", "Q8_0", "Q4_0", "Q4_K_S", "Q6_K"] {
        let path = td.join(format!("quant-zoo/zoo-{ty}.gguf"));
        let auto = engine(&path, BackendChoice::Auto);
        assert!(
            auto.backend_name().starts_with("GPU 0"),
            "{}",
            auto.backend_name()
        );
        assert!(auto.backend_note().is_none());
        let cpu = engine(&path, BackendChoice::Cpu);
        assert_eq!(cpu.backend_name(), "CPU");
        let mut req = Request::new(Prompt::Text("hello world, this is a test".into()));
        req.sampling = SamplingParams::greedy();
        req.max_tokens = Some(48);
        let run = |e: &Engine, req: &Request| e.generate(req, &CancelToken::new(), |_| {}).unwrap();
        let (g, c) = (run(&auto, &req), run(&cpu, &req));
        println!(
            "zoo-{ty}: GPU {:.0} tok/s, CPU {:.0} tok/s; {} tokens; same: {}",
            g.timings.generation_tokens_per_s(),
            c.timings.generation_tokens_per_s(),
            g.token_ids.len(),
            g.token_ids == c.token_ids
        );
        if g.token_ids != c.token_ids {
            differ.push(ty);
        }
        // Seeded sampling matches too (the same logits, the same draws).
        req.sampling = {
            let mut o = SamplingParams::default();
            o.seed = Some(5);
            o
        };
        let (g, c) = (run(&auto, &req), run(&cpu, &req));
        if g.token_ids != c.token_ids {
            differ.push(ty);
        }
    }
    // Random tiny models have near ties; allow one format to wander.
    assert!(
        differ.len() <= 1,
        "GPU and CPU generations differ for {differ:?}"
    );
}

/// The engine over a model split by the planner: two stages on one GPU
/// (`gpus` 0,0, the code of two GPUs: rows through the host), and the
/// first layers on the CPU (`gpu_layers`), each running requests from
/// several threads at once (batched steps through every stage, one step
/// at a time or two in flight): greedy
/// tokens as the whole model's on one GPU (the CPU stage's exact FP32
/// aside: allowed to wander at one near tie, as CPU against GPU above).
#[test]
#[ignore = "needs a GPU"]
fn a_split_engine_generates_what_one_gpu_does() {
    gpu_device("a_split_engine_generates_what_one_gpu_does");
    let td = common::testdata().expect("the quant zoo is needed (M40_TESTDATA)");
    let path = td.join("quant-zoo/zoo-Q8_0.gguf");
    let with = |f: &dyn Fn(&mut EngineOptions)| {
        Engine::from_path(&path, {
            let mut o = EngineOptions::default();
            o.n_ctx = Some(256);
            o.cpu_math = CpuMath::Exact;
            f(&mut o);
            o
        })
        .unwrap()
    };
    let whole = with(&|_| {});
    let prompts = [
        "hello world, this is a test",
        "one two three",
        "the quick brown fox",
    ];
    let answers = |e: &Engine| greedy_answers(e, &prompts);
    let want = answers(&whole);
    let n_layer = whole.model().hparams().n_layer;
    let two = with(&|o| o.gpus = Some(vec![0, 0]));
    let p = two.placement().expect("planned");
    println!("{p}");
    assert_eq!(p.stages.len(), 2, "{p}");
    assert_eq!(answers(&two), want, "two stages on one GPU");
    // Two steps in flight over the same stages, each its own sequences and
    // half of the pool.
    let in_flight = with(&|o| {
        o.gpus = Some(vec![0, 0]);
        o.steps_in_flight = Some(2);
    });
    assert_eq!(in_flight.activity().steps_in_flight, 2);
    assert_eq!(answers(&in_flight), want, "two steps in flight");
    let cpu_first = with(&|o| o.gpu_layers = Some(n_layer - 1));
    let p = cpu_first.placement().expect("planned");
    println!("{p}");
    assert_eq!(p.gpu_layers(), n_layer - 1, "{p}");
    let got = answers(&cpu_first);
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert!(differ <= 1, "CPU + GPU: {got:?} against {want:?}");
}

/// Replicas (`EngineOptions::replicas`, two copies on one GPU here: each
/// its own backend, step loop and KV pool, as on two cards): new
/// sequences go to the least loaded copy, and every request gets the
/// greedy tokens one GPU gives it.
#[test]
#[ignore = "needs a GPU"]
fn replicas_share_the_sequences_and_generate_what_one_gpu_does() {
    gpu_device("replicas_share_the_sequences_and_generate_what_one_gpu_does");
    let td = common::testdata().expect("the quant zoo is needed (M40_TESTDATA)");
    let path = td.join("quant-zoo/zoo-Q8_0.gguf");
    let with = |replicas: bool| {
        Engine::from_path(&path, {
            let mut o = EngineOptions::default();
            o.n_ctx = Some(256);
            o.gpus = Some(vec![0, 0]);
            o.replicas = replicas;
            o
        })
        .unwrap()
    };
    let one = engine(&path, BackendChoice::Gpu);
    let two = with(true);
    assert!(
        two.backend_name().starts_with("2 replicas: GPU 0"),
        "{}",
        two.backend_name()
    );
    assert!(two.placement().is_none());
    let load = two.activity();
    assert_eq!(load.replicas, 2);
    assert_eq!(load.kv_pages, 2 * (load.kv_pages / 2), "{load:?}");
    // Two long generations started one after the other: one on each copy.
    let cancel = CancelToken::new();
    let long = |p: &str| {
        let mut req = Request::new(Prompt::Text(p.to_string()));
        req.max_tokens = Some(200);
        req.ignore_eos = true;
        two.prepare(req).unwrap()
    };
    let (a, b) = (long("one"), long("two"));
    let ga = two.start(&a, &cancel);
    assert_eq!(two.replica_loads(), [1, 0]);
    let gb = two.start(&b, &cancel);
    assert_eq!(two.replica_loads(), [1, 1]);
    cancel.cancel();
    drop((ga, gb));
    let prompts = [
        "hello world, this is a test",
        "one two three",
        "the quick brown fox",
        "a fourth prompt, longer than the others are",
        "five",
    ];
    let answers = |e: &Engine| greedy_answers(e, &prompts);
    assert_eq!(answers(&two), answers(&one));
    let load = two.activity();
    assert_eq!((load.running, load.waiting), (0, 0), "{load:?}");
}

/// Replicas are copies on GPUs: the CPU, or a split's options beside them,
/// are refused with the reason.
#[test]
fn replicas_on_the_cpu_or_with_a_split_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = m40_gguf::synth::SynthOptions {
        shape: m40_gguf::synth::Shape::find("tiny").unwrap(),
        ty: m40_gguf::synth::FileType::All(m40_gguf::GgmlType::Q8_0),
        seed: 3,
    };
    m40_gguf::synth::write_model(f, &opts, |_, _| {}).unwrap();
    for (backend, gpu_layers, want) in [
        (BackendChoice::Cpu, None, "not on the CPU"),
        (BackendChoice::Auto, Some(1), "--gpu-layers"),
    ] {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(64);
        o.backend = backend;
        o.replicas = true;
        o.gpu_layers = gpu_layers;
        let e = Engine::from_path(&path, o).err().expect("refused");
        assert!(e.to_string().contains(want), "{e}");
    }
}

/// What a server with several models relies on: two engines on one GPU
/// (each its own stream and step loop) generate at once what each does
/// alone; each takes about what its memory plan says; dropping one gives
/// that memory back to the driver, so the next load's plan sees it free.
#[test]
#[ignore = "needs a GPU"]
fn two_engines_share_a_gpu_and_dropping_one_frees_its_memory() {
    gpu_device("two_engines_share_a_gpu_and_dropping_one_frees_its_memory");
    let td = common::testdata().expect("the quant zoo is needed (M40_TESTDATA)");
    let path = td.join("quant-zoo/zoo-Q4_0.gguf");
    let dev = m40_device::Device::open(0).unwrap();
    // The driver's free memory once what was freed is given back (freed
    // buffers go back to it at a synchronize).
    let free = || {
        dev.synchronize().unwrap();
        dev.memory().unwrap().0 as i64
    };
    // KV pools of 1M tokens (a GiB each on this 2-layer model): far above the driver's
    // granularity.
    let big = || {
        Engine::from_path(&path, {
            let mut o = EngineOptions::default();
            o.n_ctx = Some(256);
            o.kv_tokens = Some(1 << 20);
            o.backend = BackendChoice::Gpu;
            o.cpu_math = CpuMath::Exact;
            o
        })
        .unwrap()
    };
    let a = big();
    let before = free();
    let b = big();
    let loaded = free();
    let planned = b.memory().total() as i64;
    let taken = before - loaded;
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    println!(
        "second engine: holds {:.1} MiB, the driver's free memory fell {:.1} MiB",
        mib(planned),
        mib(taken)
    );
    // What it holds, plus the driver's rounding and the kernel modules' code.
    assert!(
        taken >= planned - planned / 50 && taken <= planned + planned / 8 + (256 << 20),
        "holds {planned} bytes, took {taken}"
    );
    let mut req = Request::new(Prompt::Text("hello world, this is a test".into()));
    req.sampling = SamplingParams::greedy();
    req.max_tokens = Some(32);
    let run = |e: &Engine| e.generate(&req, &CancelToken::new(), |_| {}).unwrap();
    let alone = run(&a).token_ids;
    let (x, y) = std::thread::scope(|s| {
        let (ha, hb) = (s.spawn(|| run(&a)), s.spawn(|| run(&b)));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(x.token_ids, alone);
    assert_eq!(y.token_ids, alone);
    drop(b);
    let freed = free() - loaded;
    println!("dropping it freed {:.1} MiB", mib(freed));
    assert!(
        freed >= taken - (16 << 20),
        "took {taken} bytes, gave back {freed}"
    );
    assert_eq!(run(&a).token_ids, alone);
}

#[test]
fn asking_for_a_missing_gpu_is_an_error() {
    let Some(td) = common::testdata() else { return };
    let path = td.join("quant-zoo/zoo-Q8_0.gguf");
    let r = Engine::from_path(&path, {
        let mut o = EngineOptions::default();
        o.backend = BackendChoice::Gpu;
        o.gpu = 99;
        o
    });
    let err = r.err().expect("GPU 99 does not exist");
    assert!(err.to_string().contains("--cpu"), "{err}");
}

#[test]
fn a_split_over_missing_gpus_is_an_error_not_the_cpu() {
    let Some(td) = common::testdata() else { return };
    let path = td.join("quant-zoo/zoo-Q8_0.gguf");
    // Auto, but GPUs named: no quiet fallback to the CPU.
    for gpus in [vec![98, 99], vec![99]] {
        let r = Engine::from_path(&path, {
            let mut o = EngineOptions::default();
            o.gpus = Some(gpus.clone());
            o
        });
        let err = r.err().expect("GPUs 98 and 99 do not exist");
        assert!(err.to_string().contains("--cpu"), "{gpus:?}: {err}");
    }
    // The CPU asked for: the GPU options do not matter.
    let e = Engine::from_path(&path, {
        let mut o = EngineOptions::default();
        o.backend = BackendChoice::Cpu;
        o.gpus = Some(vec![99]);
        o.gpu_layers = Some(3);
        o
    })
    .unwrap();
    assert_eq!(e.backend_name(), "CPU");
    assert!(e.placement().is_none());
}
