#![no_main]

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;
use sha2::Digest;

/// The most a fuzzed layer may write (an import's bound, made small).
const MAX_BYTES: u64 = 8 << 20;

/// Unpacks `blob` with the import's own code into a fresh directory beside
/// an empty sentinel one, checks that nothing landed outside its directory
/// and that no device node came out of it, and removes both.
fn unpack(blob: &[u8]) -> Result<cairn_image::FuzzedLayer, String> {
    static CASE: AtomicU64 = AtomicU64::new(0);
    // scripts/fuzz.sh points TMPDIR at a directory it empties.
    let case = std::env::temp_dir()
        .join(format!("cairn-fuzz-layer-{}-{}", std::process::id(), CASE.fetch_add(1, Ordering::Relaxed)));
    let into = case.join("into");
    let outside = case.join("outside");
    fs::create_dir_all(&into).expect("make the case's directory");
    fs::create_dir(&outside).expect("make the sentinel directory");
    let got = cairn_image::unpack_layer_for_fuzzing(blob, &into, MAX_BYTES).map_err(|e| e.to_string());
    let mut beside: Vec<_> = fs::read_dir(&case).expect("list the case").map(|e| e.expect("entry").file_name()).collect();
    beside.sort();
    assert_eq!(beside, ["into", "outside"], "the layer wrote beside its directory");
    assert_eq!(fs::read_dir(&outside).expect("list the sentinel").count(), 0, "the layer wrote outside its directory");
    check_tree(&into);
    fs::remove_dir_all(&case).expect("remove the case");
    got
}

/// No entry of an unpacked tree is a device node (imports drop them),
/// except the character device 0:0 that marks a whiteout on overlayfs.
fn check_tree(dir: &Path) {
    for entry in fs::read_dir(dir).expect("list an unpacked directory") {
        let entry = entry.expect("entry");
        let meta = fs::symlink_metadata(entry.path()).expect("stat an unpacked entry");
        let kind = meta.mode() & 0o170000;
        let whiteout = kind == 0o020000 && meta.rdev() == 0;
        assert!(whiteout || (kind != 0o020000 && kind != 0o060000), "a device node came out of a layer: {:?}", entry.path());
        if meta.is_dir() {
            check_tree(&entry.path());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // An OCI layer blob: a tar stream, plain, gzip or zstd, as a pull or a
    // layout import unpacks it. Any input gives a layer or an error, never
    // a panic or a write outside the layer.
    let plain = !data.starts_with(&[0x1f, 0x8b]) && !data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]);
    let got = unpack(data);
    if !plain {
        return;
    }
    // A plain layer's diffid is the sha256 of all its bytes (trailing ones
    // too), and the same layer gzip-compressed unpacks to the same answer.
    if let Ok(layer) = &got {
        assert_eq!(layer.diff_id, format!("sha256:{}", hex::encode(sha2::Sha256::digest(data))));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip into memory");
    let gz = gz.finish().expect("gzip into memory");
    // (Errors are compared as errors: their text names the stream.)
    assert_eq!(unpack(&gz).ok(), got.ok(), "gzip changed what the layer holds");
});
