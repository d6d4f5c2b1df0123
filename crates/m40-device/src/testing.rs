//! For GPU tests and benches: the device to run on.
//!
//! A GPU test is `#[ignore = "needs a GPU"]`, so that without a GPU the
//! harness reports it as ignored, never as passed; the device runs (and
//! anyone with a GPU) pass `--include-ignored`, and [`gpu_device`] then
//! fails the test when there is no GPU after all. Benches, which cannot be
//! ignored, skip with a printed reason ([`test_device`]).

use std::sync::Arc;

use crate::device::Device;

/// `M40_REQUIRE_GPU=1` turns a skip into a failure (the device runs set it).
pub const REQUIRE_GPU_VAR: &str = "M40_REQUIRE_GPU";

/// Whether GPU tests must run (`M40_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v == "1")
}

/// GPU `M40_GPU` (default 0) for a `#[ignore = "needs a GPU"]` test: it
/// panics, failing the test, when there is none.
pub fn gpu_device(test: &str) -> Arc<Device> {
    Device::open(ordinal()).unwrap_or_else(|e| panic!("{test}: needs a GPU: {e}"))
}

fn ordinal() -> usize {
    std::env::var("M40_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// GPU `M40_GPU` (default 0) for a bench. Without a usable GPU this prints
/// `skipped: <test>: <why>` and returns None, unless `M40_REQUIRE_GPU=1`,
/// where it panics with the reason so the test fails.
pub fn test_device(test: &str) -> Option<Arc<Device>> {
    match Device::open(ordinal()) {
        Ok(d) => Some(d),
        Err(e) if gpu_required() => panic!("{test}: {REQUIRE_GPU_VAR}=1 but no GPU: {e}"),
        Err(e) => {
            eprintln!("skipped: {test}: {e}");
            None
        }
    }
}
