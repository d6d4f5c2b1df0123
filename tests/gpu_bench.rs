//! `m40-llm bench` on the GPU, side by side with llama-bench: a stand-in
//! `llama-bench` on PATH prints llama-bench's JSON, and the table must show
//! its figures against the matching tests (and the run must go on without
//! them when llama-bench fails). The GPU tests are ignored without
//! `--include-ignored` and fail with it where there is no GPU.

use std::path::PathBuf;
use std::process::Command;

use m40_device::testing::gpu_device;

/// The CLI: beside the test in a GPU pack (bin/m40-llm), else Cargo's.
fn m40_llm() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let packed = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("bin/m40-llm"));
    match packed {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from(env!("CARGO_BIN_EXE_m40-llm")),
    }
}

/// A `llama-bench` that logs its arguments and prints `json` (or fails).
fn fake_llama_bench(dir: &std::path::Path, json: Option<&str>) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("args.txt");
    let body = match json {
        Some(j) => format!("echo \"$@\" > '{}'\ncat <<'EOF'\n{j}\nEOF\n", log.display()),
        None => "echo 'error: failed to load model' >&2\nexit 1\n".to_string(),
    };
    let p = dir.join("llama-bench");
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn bench(dir: &std::path::Path, extra: &[&str]) -> (String, String) {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(m40_llm())
        .args(["bench", "--shape", "smollm2-135m", "--type", "Q4_0"])
        .args(["-p", "64", "-n", "8", "-d", "128", "-r", "1"])
        .args(extra)
        .env("PATH", path)
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "bench failed:\n{so}\n{se}");
    (so, se)
}

#[test]
#[ignore = "needs a GPU"]
fn bench_prints_llama_bench_side_by_side() {
    gpu_device("bench_prints_llama_bench_side_by_side");
    let dir = tempfile::tempdir().unwrap();
    fake_llama_bench(
        dir.path(),
        Some(
            r#"[{"n_prompt": 64, "n_gen": 0, "n_depth": 0, "avg_ts": 12345.6},
 {"n_prompt": 0, "n_gen": 8, "n_depth": 0, "avg_ts": 432.1},
 {"n_prompt": 64, "n_gen": 0, "n_depth": 128, "avg_ts": 999.9},
 {"n_prompt": 0, "n_gen": 8, "n_depth": 128, "avg_ts": 321.0}]"#,
        ),
    );
    let (table, _) = bench(dir.path(), &[]);
    println!("{table}");
    let args = std::fs::read_to_string(dir.path().join("args.txt")).unwrap();
    assert!(
        args.contains("-p 64 -n 8 -r 1 -ngl 99 -fa 1 -o json -d 0,128"),
        "llama-bench ran with {args}"
    );
    // Each test's row is printed as it finishes, then the comparison with
    // llama.cpp (test, ours, llama.cpp's, ratio): its row is the last.
    let row = |name: &str| -> Vec<String> {
        // The last row whose first cell is `name` exactly ("tg8" is not
        // "tg8 (no graph)").
        table
            .lines()
            .map(|l| -> Vec<String> {
                l.split('|')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .rfind(|cells| cells.first().is_some_and(|c| c == name))
            .unwrap_or_else(|| panic!("no row {name} in\n{table}"))
    };
    assert!(table.contains("llama.cpp t/s"), "{table}");
    for (name, theirs) in [
        ("pp64", "12345.6"),
        ("tg8", "432.1"),
        ("tg8 @ d128", "321.0"),
    ] {
        let r = row(name);
        assert_eq!(r[2], theirs, "{name}: {r:?}");
        let ours: f64 = r[1].parse().unwrap();
        let ratio: f64 = r[3].parse().unwrap();
        let want = ours / theirs.parse::<f64>().unwrap();
        assert!(
            (ratio - want).abs() <= 0.006 + 0.001 * want,
            "{name}: {r:?}"
        );
    }
    assert_eq!(row("tg8 (no graph)")[2], "-");
    // --json carries them too.
    let (json, _) = bench(dir.path(), &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let res = v["results"].as_array().unwrap();
    let theirs =
        |t: &str| res.iter().find(|r| r["test"] == t).unwrap()["llama_cpp_tokens_per_s"].clone();
    assert_eq!(theirs("tg8 @ d128"), serde_json::json!(321.0));
    assert_eq!(theirs("tg8 (no graph)"), serde_json::Value::Null);

    // llama-bench failing: our table alone, and why on stderr.
    fake_llama_bench(dir.path(), None);
    let (table, err) = bench(dir.path(), &[]);
    assert!(!table.contains("llama.cpp"), "{table}");
    assert!(
        err.contains("llama-bench failed") && err.contains("failed to load model"),
        "{err}"
    );
    // --no-llama-bench: not run at all.
    fake_llama_bench(dir.path(), Some("[]"));
    std::fs::remove_file(dir.path().join("args.txt")).ok();
    bench(dir.path(), &["--no-llama-bench"]);
    assert!(
        !dir.path().join("args.txt").exists(),
        "llama-bench ran with --no-llama-bench"
    );
}
