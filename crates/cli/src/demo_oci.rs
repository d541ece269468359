//! A small two-layer OCI image layout for `cairn demo`, written by hand
//! from the host's busybox, so the demo needs no registry: the bottom layer
//! holds the shell and `/etc/{release,motd}`; the top one replaces
//! `/etc/release` and deletes `/etc/motd` with a whiteout.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const MT_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
const APPLETS: &[&str] = &["sh", "cat", "ls", "test", "echo", "pwd", "head", "mkdir", "rm"];

/// Writes the layout into `dir` (created).
pub fn write_layout(dir: &Path, busybox: &Path) -> Result<()> {
    let shell = fs::read(busybox).with_context(|| format!("cannot read {}", busybox.display()))?;
    let mut bottom = Layer::new();
    for d in ["bin", "etc", "proc", "dev", "tmp", "workspace", "srv"] {
        bottom.dir(d)?;
    }
    bottom.file("bin/busybox", &shell, 0o755)?;
    for applet in APPLETS {
        bottom.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    bottom.file("etc/release", b"layer one\n", 0o644)?;
    bottom.file("etc/motd", b"hello\n", 0o644)?;
    let mut top = Layer::new();
    top.dir("etc")?;
    top.file("etc/release", b"layer two\n", 0o644)?;
    top.file("etc/.wh.motd", b"", 0o644)?;

    fs::create_dir_all(dir.join("blobs/sha256")).with_context(|| format!("cannot create {}", dir.display()))?;
    let blob = |bytes: &[u8], media_type: &str| -> Result<Value> {
        let digest = hex(&Sha256::digest(bytes));
        fs::write(dir.join("blobs/sha256").join(&digest), bytes)?;
        Ok(json!({ "mediaType": media_type, "digest": format!("sha256:{digest}"), "size": bytes.len() }))
    };
    let layers = [bottom.finish()?, top.finish()?];
    let diff_ids: Vec<String> = layers.iter().map(|l| format!("sha256:{}", hex(&Sha256::digest(l)))).collect();
    let descs = layers.iter().map(|l| blob(l, MT_LAYER)).collect::<Result<Vec<_>>>()?;
    let config = json!({
        "architecture": cairn_image::host_arch(),
        "os": "linux",
        "config": { "Env": ["PATH=/bin", "FROM_IMAGE=yes"], "WorkingDir": "/srv" },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let config = blob(&serde_json::to_vec(&config)?, "application/vnd.oci.image.config.v1+json")?;
    let manifest = json!({ "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config, "layers": descs });
    let manifest = blob(&serde_json::to_vec(&manifest)?, "application/vnd.oci.image.manifest.v1+json")?;
    let index = json!({ "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest] });
    fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One uncompressed layer tar, built in memory.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    fn dir(&mut self, path: &str) -> Result<()> {
        let mut h = Self::header(tar::EntryType::Directory, 0o755, 0);
        Ok(self.0.append_data(&mut h, path, std::io::empty())?)
    }

    fn file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        Ok(self.0.append_data(&mut h, path, data)?)
    }

    fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        Ok(self.0.append_link(&mut h, path, target)?)
    }

    fn finish(self) -> Result<Vec<u8>> {
        Ok(self.0.into_inner()?)
    }
}
