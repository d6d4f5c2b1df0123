//! `cargo xtask <task>`: project automation in Rust (matklad's cargo-xtask).
//!
//! - `ci`: what CI runs (`.ci/run`): fmt check, clippy with warnings denied,
//!   the test suite. If `cargo xtask ci` passes locally, CI passes.

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
    cargo(&["fmt", "--all", "--check"])
        && cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        && cargo(&["test", "--workspace"])
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let ok = match task.as_deref() {
        Some("ci") => ci(),
        _ => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  ci    fmt check, clippy -D warnings, tests (what .ci/run does)");
            return ExitCode::from(2);
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
