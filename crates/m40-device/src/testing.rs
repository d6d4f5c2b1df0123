//! For GPU tests: the device to test on, or a printed reason to skip.

use std::sync::Arc;

use crate::device::Device;

/// `M40_REQUIRE_GPU=1` turns a skip into a failure (the device runs set it).
pub const REQUIRE_GPU_VAR: &str = "M40_REQUIRE_GPU";

/// Whether GPU tests must run (`M40_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v == "1")
}

/// GPU `M40_GPU` (default 0) for a test. Without a usable GPU this prints
/// `skipped: <test>: <why>` and returns None, unless `M40_REQUIRE_GPU=1`,
/// where it panics with the reason so the test fails.
pub fn test_device(test: &str) -> Option<Arc<Device>> {
    let ordinal = std::env::var("M40_GPU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match Device::open(ordinal) {
        Ok(d) => Some(d),
        Err(e) if gpu_required() => panic!("{test}: {REQUIRE_GPU_VAR}=1 but no GPU: {e}"),
        Err(e) => {
            eprintln!("skipped: {test}: {e}");
            None
        }
    }
}
