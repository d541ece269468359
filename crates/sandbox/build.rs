//! Builds `libcairn-statx.so` (see `shim/statx.rs`) with the same `rustc`,
//! for the gvisor driver to bind into its sandboxes: it is embedded in the
//! `cairn` binary.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "shim/statx.rs";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts")).join("libcairn-statx.so");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let status = Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", "cairn_statx", "-C", "panic=abort", "-C", "opt-level=2", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("run rustc for shim/statx.rs");
    assert!(status.success(), "building shim/statx.rs failed");
}
