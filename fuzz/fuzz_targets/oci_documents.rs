#![no_main]

use libfuzzer_sys::fuzz_target;

/// Separates the manifest from the config in an input: never in JSON.
const SEP: u8 = 0xff;

fuzz_target!(|data: &[u8]| {
    // The first byte says which document the rest is.
    let Some((&kind, doc)) = data.split_first() else { return };
    match kind % 3 {
        0 => index(doc),
        1 => config(doc),
        _ => manifest_and_config(doc),
    }
});

/// An image index, as a layout import reads it and as the registry client
/// (whose entries `pull` chooses from) reads it.
fn index(doc: &[u8]) {
    if let Ok(entries) = cairn_image::parse_index(doc) {
        let platforms: Vec<(&str, &str, &str)> = entries
            .iter()
            .filter_map(|(_, digest, p)| p.as_ref().map(|(os, arch)| (os.as_str(), arch.as_str(), digest.as_str())))
            .collect();
        if let Some(chosen) = cairn_image::choose_host_platform(platforms.iter().copied()) {
            assert!(platforms.iter().any(|&(os, arch, d)| d == chosen && os == "linux" && arch == cairn_image::host_arch()));
        }
    }
    if let Ok(index) = serde_json::from_slice::<oci_client::manifest::OciImageIndex>(doc) {
        if let Some(chosen) = cairn_runtime::pull::resolve_platform(&index.manifests) {
            assert!(index.manifests.iter().any(|e| e.digest == chosen && e.platform.is_some()));
        }
    }
}

/// An image config alone.
fn config(doc: &[u8]) {
    if let Ok((diff_ids, run)) = cairn_image::parse_config_document(doc) {
        for d in &diff_ids {
            assert!(is_sha256(d), "diffid {d:?} accepted");
        }
        round_trip(&run);
    }
}

/// A manifest and its config (split at the first 0xff byte), as a registry
/// serves them; then the same manifest naming the config's real digest and
/// size, so the checks past the digest are reached too.
fn manifest_and_config(doc: &[u8]) {
    let (manifest, config) = match doc.iter().position(|&b| b == SEP) {
        Some(at) => (&doc[..at], &doc[at + 1..]),
        None => (doc, &[][..]),
    };
    let digest = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    check_image(manifest, config, digest);
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(manifest) else { return };
    let Some(desc) = value.get_mut("config").and_then(|c| c.as_object_mut()) else { return };
    desc.insert("digest".into(), format!("sha256:{}", cairn_ledger::sha256_hex(config)).into());
    desc.insert("size".into(), config.len().into());
    let patched = serde_json::to_vec(&value).expect("a JSON value serialises");
    let image = check_image(&patched, config, digest);
    // The config's own checks decide, whatever the manifest says.
    if image.is_some() {
        assert!(cairn_image::parse_config_document(config).is_ok());
    }
}

fn check_image(manifest: &[u8], config: &[u8], digest: &str) -> Option<cairn_image::OciImage> {
    let image = cairn_image::image_from_documents(digest, manifest, config).ok()?;
    assert_eq!(image.manifest_digest, digest);
    // (serde skips the fields it ignores without checking their UTF-8, so
    // an accepted manifest need not read as a JSON value.)
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(manifest) {
        let layers = value.get("layers").and_then(|l| l.as_array()).map_or(0, Vec::len);
        assert_eq!(image.layers.len(), layers);
    }
    for l in &image.layers {
        assert!(is_sha256(&l.blob_digest), "layer digest {:?} accepted", l.blob_digest);
        assert!(is_sha256(&l.diff_id), "diffid {:?} accepted", l.diff_id);
    }
    round_trip(&image.config);
    Some(image)
}

fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn round_trip(run: &cairn_image::RunConfig) {
    let json = serde_json::to_vec(run).expect("a run config serialises");
    let back: cairn_image::RunConfig = serde_json::from_slice(&json).expect("a run config parses back");
    assert_eq!(&back, run);
}
