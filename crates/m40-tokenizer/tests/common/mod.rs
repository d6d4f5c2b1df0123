//! Shared test helpers: locating ../shared/testdata.

use std::path::PathBuf;

/// `../shared/testdata` beside the project root (or `M40_TESTDATA`), or `None`
/// with a printed reason when it is absent.
pub fn testdata() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("M40_TESTDATA") {
        return Some(PathBuf::from(p));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("../shared/testdata");
    if p.is_dir() {
        Some(p)
    } else {
        eprintln!(
            "SKIP: {} not found (set M40_TESTDATA to the shared testdata folder)",
            p.display()
        );
        None
    }
}
