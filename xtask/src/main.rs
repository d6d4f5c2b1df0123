//! `cargo xtask <task>`: project automation in Rust (matklad's cargo-xtask).
//!
//! - `ci`: what CI runs (`.ci/run` installs the toolchain's parts and calls
//!   it): the Python clients and llama.cpp's test vocabularies fetched into
//!   target/, fmt check, clippy with warnings denied, the committed PTX
//!   checked against its sources, the test suite with every input it reads
//!   required. If `cargo xtask ci` passes locally, CI passes.
//! - `ptx [--check]`: kernels/*.cu -> crates/m40-kernels/ptx/*.ptx.zst, its index and the sm_52 reports.
//! - `bench [ARGS]`: `m40-llm bench ARGS` from a release build: the
//!   llama-bench-like table (pp512, tg128, tg128 at depth 4096) against the
//!   measured ceilings, for a model file or `--shape NAME --type TYPE`.
//! - `package`: every crate packaged and verified, and a program outside
//!   the workspace built against the packaged m40-runtime and run.
//! - `gpu-pack`: the GPU test and bench binaries with a run script, for the
//!   device machine (see CONTRIBUTING.md).

mod gpu_pack;
mod package;
mod ptx;

use std::process::{Command, ExitCode};

fn cargo(args: &[&str]) -> bool {
    eprintln!("== cargo {}", args.join(" "));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Command::new(cargo)
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn ci() -> bool {
    // As .ci/run: the tests must read ../shared/testdata, not skip it.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let testdata = root.join("../shared/testdata");
    if !testdata.is_dir() {
        eprintln!("error: ../shared/testdata is missing (CI runs with ../shared beside the clone)");
        return false;
    }
    let Some((clients, vocab)) = ci_inputs(&root) else {
        return false;
    };
    // Inherited by the cargo commands below (no other thread runs yet):
    // the tests that read these fail without them rather than skip.
    std::env::set_var("M40_REQUIRE_TESTDATA", "1");
    std::env::set_var("M40_PY_CLIENTS", &clients);
    std::env::set_var("M40_REQUIRE_PY_CLIENTS", "1");
    // The chat page's browser test: Debian's Chromium and ChromeDriver
    // (.ci/run installs them).
    std::env::set_var("M40_REQUIRE_BROWSER", "1");
    std::env::set_var("M40_LLAMACPP_VOCAB", &vocab);
    std::env::set_var("M40_REQUIRE_LLAMACPP_VOCAB", "1");
    cargo(&["fmt", "--all", "--check"])
        && cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        && ptx_check()
        && cargo(&["test", "--workspace"])
        && package::run(&root)
}

/// What the tests read beyond ../shared, fetched once into target/: the
/// official Python clients (and jsonschema, and Selenium for the chat
/// page's browser test) from PyPI, for the server's client tests; llama.cpp's tokenizer test vocabularies, from the PyPI
/// sdist of llama-cpp-python (scripts/llamacpp-vocab.sh). Their folders.
fn ci_inputs(root: &std::path::Path) -> Option<(std::path::PathBuf, String)> {
    let clients = root.join("target/pyclients");
    let have = Command::new("python3")
        .args(["-c", "import openai, ollama, jsonschema, selenium"])
        .env("PYTHONPATH", &clients)
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!(
            "== openai and ollama Python clients, Selenium (pip install --target target/pyclients)"
        );
        let pip = |extra: &[&str]| {
            Command::new("python3")
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .args(["--upgrade", "--target"])
                .arg(&clients)
                .args(["openai", "ollama", "jsonschema", "selenium"])
                .args(extra)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !pip(&[]) && !pip(&["--break-system-packages"]) {
            eprintln!("error: could not install the Python clients");
            return None;
        }
    }
    eprintln!("== llama.cpp's test vocabularies (scripts/llamacpp-vocab.sh)");
    let out = Command::new(root.join("scripts/llamacpp-vocab.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(out) = out else {
        eprintln!("error: scripts/llamacpp-vocab.sh failed");
        return None;
    };
    let vocab = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Some((clients, vocab))
}

fn ptx_check() -> bool {
    eprintln!("== cargo xtask ptx --check");
    match ptx::run(true) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("error: {e}");
            false
        }
    }
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let ok = match task.as_deref() {
        Some("ci") => ci(),
        Some("ptx") => match ptx::run(std::env::args().any(|a| a == "--check")) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("error: {e}");
                false
            }
        },
        Some("bench") => {
            let rest: Vec<String> = std::env::args().skip(2).collect();
            let mut args = vec![
                "run",
                "--release",
                "--quiet",
                "--bin",
                "m40-llm",
                "--",
                "bench",
            ];
            args.extend(rest.iter().map(String::as_str));
            cargo(&args)
        }
        Some("package") => {
            package::run(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        }
        Some("gpu-pack") => match gpu_pack::run() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("error: {e}");
                false
            }
        },
        _ => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  ci            fmt check, clippy -D warnings, PTX check, tests, package (what .ci/run does)\n  package       cargo package --workspace, then a program outside it built on the packaged m40-runtime\n  ptx [--check] compile kernels/*.cu for compute_52 (NVRTC from PyPI) and write the sm_52 reports\n  bench [ARGS]  m40-llm bench ARGS (release): pp512/tg128 tables vs the measured ceilings (--help for ARGS)\n  gpu-pack      build the GPU tests and benches into target/gpu-pack with run.sh");
            return ExitCode::from(2);
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
