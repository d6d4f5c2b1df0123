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
    } else if std::env::var("M40_REQUIRE_TESTDATA").is_ok_and(|v| !v.is_empty() && v != "0") {
        // CI sets this: a test that cannot read its reference data must
        // fail there, not pass without checking anything.
        panic!("{} not found and M40_REQUIRE_TESTDATA is set", p.display());
    } else {
        eprintln!(
            "SKIP: {} not found (set M40_TESTDATA to the shared testdata folder)",
            p.display()
        );
        None
    }
}
