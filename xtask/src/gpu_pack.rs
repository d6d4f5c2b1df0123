//! `cargo xtask gpu-pack`: build the GPU test and bench binaries (release,
//! x86-64, stripped) into `target/gpu-pack/` with `run.sh`, which runs them
//! all with `M40_REQUIRE_GPU=1` and ends with the line `N passed, N failed`.
//!
//! GPU binaries are the integration tests and benches whose target name
//! starts with `gpu` (e.g. crates/m40-kernels/tests/gpu_kernels/), and the
//! tests whose bodies run on both backends (`on_both!` in `tests/*.rs`: they need
//! SmolLM2 at `M40_SMOLLM2` there: carry it separately, it does not fit
//! in the pack). The
//! device tool carries at most 64 MiB: the pack is also written as
//! `target/gpu-pack.tar.xz` (xz -9: its 64 MiB window also finds the
//! kernels' PTX, embedded in every binary, repeated: about a seventh of the
//! size, where gzip's third no longer fit), which must fit.
//!
//! `bin/m40-llm` is the release CLI, for `bin/m40-llm bench` there.
//!
//! The quant zoo and the chat templates from ../shared/testdata are copied
//! into the pack (`testdata/`; run.sh points M40_TESTDATA at it).
//!
//! On the device machine: `target/gpu-pack/run.sh` (with `--no-bench` to skip
//! the benches). See CONTRIBUTING.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

type Result<T> = std::result::Result<T, String>;

const LIMIT: u64 = 64 << 20;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs every GPU test binary of this pack, ignored (needs-a-GPU) tests
# included, and the benches unless --no-bench, with M40_REQUIRE_GPU=1; the
# minutes-long 1B/8B shape checks only with M40_GPU_LARGE=1. The last line
# is "N passed, N failed". Logs go to $OUT/gpu-pack/ when OUT is set.
cd "$(dirname "$0")"
export M40_REQUIRE_GPU=1
# The quant zoo, when the pack carries it (tests that need it fail without it).
if [ -d testdata/quant-zoo ]; then export M40_TESTDATA="$PWD/testdata"; fi
log=${OUT:-/tmp}/gpu-pack
mkdir -p "$log"
skip=(--skip synth_1b_shape_gpu_matches_cpu --skip synth_8b_shape_gpu_matches_cpu)
if [ "${M40_GPU_LARGE:-}" = 1 ]; then skip=(); fi
passed=0
failed=0
for t in tests/*; do
    name=$(basename "$t")
    echo "== $name"
    "$t" --include-ignored "${skip[@]}" --test-threads=1 --nocapture >"$log/$name.log" 2>&1
    rc=$?
    grep -E '^test |test result|panicked|skipped|differ|gpu |cpu |rel err' "$log/$name.log" | head -200
    p=$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed; [0-9]* failed' "$log/$name.log" | awk '{s+=$4} END {print s+0}')
    f=$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed; [0-9]* failed' "$log/$name.log" | awk '{s+=$6} END {print s+0}')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
done
if [ "${1:-}" != "--no-bench" ]; then
    for b in benches/*; do
        name=$(basename "$b")
        echo "== bench $name"
        if "$b" --bench 2>&1 | tee "$log/$name.log"; then
            passed=$((passed + 1))
        else
            echo "bench $name failed"
            failed=$((failed + 1))
        fi
    done
fi
echo "$passed passed, $failed failed"
"#;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Build with cargo (`args`), returning the executables of GPU targets.
fn build(args: &[&str], target_dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("== cargo {}", args.join(" "));
    let out = Command::new(cargo)
        .args(args)
        .args([
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_BENCH_DEBUG", "0")
        .env("CARGO_PROFILE_BENCH_STRIP", "symbols")
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    let both = both_backends(&root());
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        let kind = &msg["target"]["kind"][0];
        let exe = msg["executable"].as_str();
        let wanted = (name.starts_with("gpu") && (kind == "test" || kind == "bench"))
            || (both.iter().any(|b| b == name) && kind == "test")
            || (name == "m40-llm" && kind == "bin" && msg["profile"]["test"] == false);
        if let (true, Some(exe)) = (wanted, exe) {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    Ok(found)
}

/// Test targets whose bodies run on both backends (`NAME::gpu` ignored
/// without a GPU): the root's `tests/*.rs` that use `on_both!`. The pack
/// runs their GPU half too.
fn both_backends(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("tests"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|s| s.contains("\non_both!(")))
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    names
}

pub fn run() -> Result<()> {
    let root = root();
    let target_dir = root.join("target/gpu-build");
    let pack = root.join("target/gpu-pack");
    let _ = std::fs::remove_dir_all(&pack);
    for sub in ["tests", "benches"] {
        std::fs::create_dir_all(pack.join(sub)).map_err(|e| e.to_string())?;
    }
    let mut tests = build(&["test", "--release", "--tests"], &target_dir)?;
    let mut benches = build(&["bench", "--benches"], &target_dir)?;
    benches.retain(|(n, _)| n.starts_with("gpu"));
    // The CLI (for `bin/m40-llm bench` on the device) comes with the tests.
    let bins: Vec<_> = tests
        .iter()
        .filter(|(n, _)| n == "m40-llm")
        .cloned()
        .collect();
    tests.retain(|(n, _)| n != "m40-llm");
    std::fs::create_dir_all(pack.join("bin")).map_err(|e| e.to_string())?;
    let mut total = 0;
    for (dir, list) in [("tests", &tests), ("benches", &benches), ("bin", &bins)] {
        for (name, exe) in list.iter() {
            let dest = pack.join(dir).join(name);
            std::fs::copy(exe, &dest).map_err(|e| format!("{}: {e}", exe.display()))?;
            total += std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
            eprintln!("  {dir}/{name}");
        }
    }
    // The quant zoo's models (../shared/testdata/quant-zoo/*.gguf) travel
    // with the pack: ../shared does not reach the device machine. Its JSON
    // (llama.cpp's logits, for the CPU tests) stays behind: the device's
    // 64 MiB carry limit is close.
    let zoo = root.join("../shared/testdata/quant-zoo");
    if zoo.is_dir() {
        let dest = pack.join("testdata/quant-zoo");
        std::fs::create_dir_all(&dest).map_err(|e| e.to_string())?;
        for e in std::fs::read_dir(&zoo).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            if e.path().extension().is_none_or(|x| x != "gguf") {
                continue;
            }
            let to = dest.join(e.file_name());
            std::fs::copy(e.path(), &to).map_err(|err| format!("{}: {err}", e.path().display()))?;
            total += std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        }
        eprintln!("  testdata/quant-zoo");
        // The chat templates (a few hundred KB), for the tool and
        // thinking tests that load SmolLM2 under other models' templates.
        let tdir = root.join("../shared/testdata/templates");
        let tdest = pack.join("testdata/templates");
        std::fs::create_dir_all(&tdest).map_err(|e| e.to_string())?;
        for e in std::fs::read_dir(&tdir).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            let to = tdest.join(e.file_name());
            std::fs::copy(e.path(), &to).map_err(|err| format!("{}: {err}", e.path().display()))?;
            total += std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        }
        eprintln!("  testdata/templates");
    } else {
        eprintln!(
            "  (no {}: tests that need the zoo will fail on the device)",
            zoo.display()
        );
    }
    // llama.cpp's embeddings (tests/data/llamacpp-embed-*.json) for the
    // embeddings test, which looks in ./embed-refs (run.sh runs from here).
    let edest = pack.join("embed-refs");
    std::fs::create_dir_all(&edest).map_err(|e| e.to_string())?;
    for e in std::fs::read_dir(root.join("tests/data")).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        if e.file_name()
            .to_string_lossy()
            .starts_with("llamacpp-embed-")
        {
            let to = edest.join(e.file_name());
            std::fs::copy(e.path(), &to).map_err(|err| format!("{}: {err}", e.path().display()))?;
            total += std::fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        }
    }
    eprintln!("  embed-refs");
    let script = pack.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(|e| e.to_string())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    eprintln!(
        "{}: {} tests, {} benches, {:.1} MiB",
        pack.display(),
        tests.len(),
        benches.len(),
        total as f64 / (1 << 20) as f64
    );
    // The same pack as one xz'd tar: what the device tool carries once the
    // folder itself is over its limit.
    let txz = pack.with_extension("tar.xz");
    let status = Command::new("tar")
        .arg("cJf")
        .arg(&txz)
        .arg("-C")
        .arg(pack.parent().ok_or("pack has no parent")?)
        .arg("gpu-pack")
        .env("XZ_OPT", "-9")
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar exited with {status}"));
    }
    let packed = std::fs::metadata(&txz).map_err(|e| e.to_string())?.len();
    eprintln!(
        "{}: {:.1} MiB (carry it and run `tar xJf target/gpu-pack.tar.xz -C target && target/gpu-pack/run.sh`)",
        txz.display(),
        packed as f64 / (1 << 20) as f64
    );
    if total.min(packed) > LIMIT {
        return Err(format!(
            "the pack is {total} bytes ({packed} xz'd); the device tool carries at most {LIMIT}"
        ));
    }
    Ok(())
}
