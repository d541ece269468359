//! Describes `proto/*.proto` (the wire schema of E2B's in-sandbox API) as a
//! file descriptor set, which `src/codec.rs` uses to translate the binary
//! codec. protox is a protobuf compiler in Rust: no protoc needed.

use prost::Message as _;

fn main() {
    let files = ["proto/process.proto", "proto/filesystem.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let set = match protox::compile(files, ["proto"]) {
        Ok(set) => set,
        Err(e) => panic!("cannot describe the E2B wire schema: {e}"),
    };
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("envd.bin");
    if let Err(e) = std::fs::write(&out, set.encode_to_vec()) {
        panic!("cannot write {}: {e}", out.display());
    }
}
