//! Tells the tests whether the shared trace samples (`../shared/traces`
//! beside the repository, present in CI but not in a user's clone) are
//! there: tests that read them are compiled as ignored, with the reason,
//! when they are not, so a run without them reports them as ignored rather
//! than passed. Evaluated when this crate is first built: after adding the samples
//! to a clone, `touch build.rs` (or `cargo clean`) to run those tests.
//!
//! iocache-sim's tests read the samples too, and this is its build script
//! as well (its Cargo.toml's `build`): paths here are right from both
//! crates' directories.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(shared_traces)");
    println!("cargo::rerun-if-changed=../iocache-trace/build.rs");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"))
        .join("../../../shared/traces");
    if dir.join("README.md").is_file() {
        println!("cargo::rerun-if-changed={}", dir.join("README.md").display());
        println!("cargo::rustc-cfg=shared_traces");
    }
}
