//! For tests (feature `test-util`): layer tars, OCI image layout
//! directories and `docker save` archives written by hand, so tests
//! control every byte (a layer with `..` or a hard link out, a blob that
//! does not match its digest).

#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::Digest;
use tar::{Builder, EntryType, Header};

pub const MT_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MT_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MT_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MT_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MT_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MT_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// This host's architecture as OCI names it.
pub fn host_arch() -> &'static str {
    super::oci::host_arch()
}

/// A layer's tar stream, entry by entry.
pub struct LayerTar(Builder<Vec<u8>>);

impl std::fmt::Debug for LayerTar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LayerTar")
    }
}

impl Default for LayerTar {
    fn default() -> Self {
        LayerTar(Builder::new(Vec::new()))
    }
}

impl LayerTar {
    pub fn new() -> Self {
        Self::default()
    }

    fn header(kind: EntryType, size: u64, mode: u32) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(mode);
        h.set_mtime(1_600_000_000);
        h
    }

    pub fn dir(mut self, path: &str) -> Self {
        let mut h = Self::header(EntryType::Directory, 0, 0o755);
        self.0.append_data(&mut h, path, io::empty()).unwrap();
        self
    }

    pub fn file(mut self, path: &str, data: &[u8]) -> Self {
        let mut h = Self::header(EntryType::Regular, data.len() as u64, 0o644);
        self.0.append_data(&mut h, path, data).unwrap();
        self
    }

    /// An executable regular file (mode 0755).
    pub fn executable(mut self, path: &str, data: &[u8]) -> Self {
        let mut h = Self::header(EntryType::Regular, data.len() as u64, 0o755);
        self.0.append_data(&mut h, path, data).unwrap();
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(EntryType::Symlink, 0, 0o777);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    pub fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(EntryType::Link, 0, 0o644);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    /// A whiteout of `dir/name`: the entry `dir/.wh.name`.
    pub fn whiteout(self, dir: &str, name: &str) -> Self {
        let path = if dir.is_empty() { format!(".wh.{name}") } else { format!("{dir}/.wh.{name}") };
        self.file(&path, b"")
    }

    /// Marks `dir` opaque: the entry `dir/.wh..wh..opq`.
    pub fn opaque(self, dir: &str) -> Self {
        self.file(&format!("{dir}/.wh..wh..opq"), b"")
    }

    /// A character device entry.
    pub fn device(mut self, path: &str) -> Self {
        let mut h = Self::header(EntryType::Char, 0, 0o666);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        self.0.append_data(&mut h, path, io::empty()).unwrap();
        self
    }

    /// A regular file whose name is written as raw header bytes, which the
    /// builder would refuse (absolute, `..`).
    pub fn raw_file(mut self, path: &[u8], data: &[u8]) -> Self {
        let mut h = Self::header(EntryType::Regular, data.len() as u64, 0o644);
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    /// A hard link whose target is written as raw header bytes.
    pub fn raw_hardlink(mut self, path: &[u8], target: &[u8]) -> Self {
        let mut h = Self::header(EntryType::Link, 0, 0o644);
        h.as_old_mut().name[..path.len()].copy_from_slice(path);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        h.set_cksum();
        self.0.append(&h, &[][..]).unwrap();
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

/// One layer as stored: its blob, media type and diffid.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub diff_id: String,
}

impl LayerBlob {
    pub fn tar(tar: &[u8]) -> Self {
        LayerBlob { bytes: tar.to_vec(), media_type: MT_TAR.into(), diff_id: sha256(tar) }
    }

    pub fn gzip(tar: &[u8]) -> Self {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(tar).unwrap();
        LayerBlob { bytes: enc.finish().unwrap(), media_type: MT_GZIP.into(), diff_id: sha256(tar) }
    }

    pub fn zstd(tar: &[u8]) -> Self {
        LayerBlob { bytes: zstd::encode_all(tar, 3).unwrap(), media_type: MT_ZSTD.into(), diff_id: sha256(tar) }
    }

    pub fn digest(&self) -> String {
        sha256(&self.bytes)
    }
}

/// An OCI image layout directory being written.
#[derive(Debug)]
pub struct OciLayout {
    pub dir: PathBuf,
}

impl OciLayout {
    /// Makes `dir` (and `oci-layout`, `blobs/sha256/`) with an empty index.
    pub fn create(dir: &Path) -> OciLayout {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let layout = OciLayout { dir: dir.to_owned() };
        layout.write_index(&[]);
        layout
    }

    /// A layout holding one image of `layers` (bottom first), tagged
    /// `latest`.
    pub fn single(dir: &Path, layers: &[LayerBlob]) -> OciLayout {
        let layout = OciLayout::create(dir);
        let m = layout.add_image(layers, host_arch(), json!({"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]}));
        layout.write_index(&[tagged(m, "latest")]);
        layout
    }

    /// Stores `bytes` as a blob; returns its descriptor (no media type).
    pub fn add_blob(&self, bytes: &[u8]) -> Value {
        let digest = sha256(bytes);
        fs::write(self.blob_path(&digest), bytes).unwrap();
        json!({"digest": digest, "size": bytes.len()})
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(digest.trim_start_matches("sha256:"))
    }

    /// Stores an image's layers, config and manifest; returns the
    /// manifest's descriptor. `run` is the config's `config` object.
    pub fn add_image(&self, layers: &[LayerBlob], arch: &str, run: Value) -> Value {
        let mut descs = Vec::new();
        for l in layers {
            let mut d = self.add_blob(&l.bytes);
            d["mediaType"] = json!(l.media_type);
            descs.push(d);
        }
        let config = json!({
            "architecture": arch,
            "os": "linux",
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
        });
        let mut config_desc = self.add_blob(&serde_json::to_vec(&config).unwrap());
        config_desc["mediaType"] = json!(MT_CONFIG);
        let manifest = json!({"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": config_desc, "layers": descs});
        let mut m = self.add_blob(&serde_json::to_vec(&manifest).unwrap());
        m["mediaType"] = json!(MT_MANIFEST);
        m
    }

    /// Stores an index of `manifests`; returns its descriptor.
    pub fn add_index(&self, manifests: &[Value]) -> Value {
        let index = json!({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests});
        let mut d = self.add_blob(&serde_json::to_vec(&index).unwrap());
        d["mediaType"] = json!(MT_INDEX);
        d
    }

    /// Writes `index.json` listing `manifests`.
    pub fn write_index(&self, manifests: &[Value]) {
        let index = json!({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": manifests});
        fs::write(self.dir.join("index.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    }
}

/// `desc` with the ref name annotation `tag`.
pub fn tagged(mut desc: Value, tag: &str) -> Value {
    desc["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    desc
}

/// `desc` with a platform.
pub fn for_platform(mut desc: Value, os: &str, arch: &str) -> Value {
    desc["platform"] = json!({"os": os, "architecture": arch});
    desc
}

/// `bytes`, gzip-compressed.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Where a [`DockerArchive`] puts layers and configs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DockerLayout {
    /// Docker before 25: each layer in `<id>/layer.tar` (one saved before
    /// is a symlink to the first copy), configs as `<hex>.json`.
    Legacy,
    /// Docker 25 and later: layers and configs as `blobs/sha256/<hex>`,
    /// with the OCI layout's `index.json` and `oci-layout` beside them.
    Blobs,
}

/// A `docker save` archive being written: members in the order docker
/// writes them (layers, each image's config, then `manifest.json`).
pub struct DockerArchive {
    layout: DockerLayout,
    tar: Builder<Vec<u8>>,
    manifest: Vec<Value>,
    /// Member names written, and the layer member written for each diffid.
    names: Vec<String>,
    layers: HashMap<String, String>,
}

impl std::fmt::Debug for DockerArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DockerArchive({:?})", self.layout)
    }
}

impl DockerArchive {
    pub fn new(layout: DockerLayout) -> Self {
        let mut archive =
            DockerArchive { layout, tar: Builder::new(Vec::new()), manifest: Vec::new(), names: Vec::new(), layers: HashMap::new() };
        if layout == DockerLayout::Blobs {
            archive.dir("blobs");
            archive.dir("blobs/sha256");
        }
        archive
    }

    fn dir(&mut self, name: &str) {
        let mut h = LayerTar::header(EntryType::Directory, 0, 0o755);
        self.tar.append_data(&mut h, name, io::empty()).unwrap();
        self.names.push(name.to_owned());
    }

    /// Appends a regular file member.
    pub fn file(mut self, name: &str, bytes: &[u8]) -> Self {
        self.add_file(name, bytes);
        self
    }

    fn add_file(&mut self, name: &str, bytes: &[u8]) {
        let mut h = LayerTar::header(EntryType::Regular, bytes.len() as u64, 0o444);
        self.tar.append_data(&mut h, name, bytes).unwrap();
        self.names.push(name.to_owned());
    }

    /// Adds an image of `layers` (bottom first, each stored as its blob's
    /// bytes, compressed or not) tagged `tags`, its config saying their
    /// diffids.
    pub fn image(mut self, layers: &[LayerBlob], tags: &[&str]) -> Self {
        let mut listed = Vec::new();
        let mut id = String::new();
        for l in layers {
            // Docker's legacy ids chain each layer to its parent.
            id = hex::encode(sha2::Sha256::digest(format!("{id}{}", l.diff_id)));
            let name = match self.layout {
                DockerLayout::Legacy => format!("{id}/layer.tar"),
                DockerLayout::Blobs => format!("blobs/sha256/{}", l.digest().trim_start_matches("sha256:")),
            };
            if !self.names.contains(&name) {
                match (self.layout, self.layers.get(&l.diff_id).cloned()) {
                    (DockerLayout::Legacy, Some(first)) => {
                        self.dir(&id);
                        let mut h = LayerTar::header(EntryType::Symlink, 0, 0o777);
                        self.tar.append_link(&mut h, &name, format!("../{first}")).unwrap();
                        self.names.push(name.clone());
                    }
                    _ => {
                        if self.layout == DockerLayout::Legacy {
                            self.dir(&id);
                        }
                        self.add_file(&name, &l.bytes);
                        self.layers.insert(l.diff_id.clone(), name.clone());
                    }
                }
            }
            listed.push(name);
        }
        let config = json!({
            "architecture": host_arch(),
            "os": "linux",
            "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
        });
        let config = serde_json::to_vec(&config).unwrap();
        let hex = sha256(&config).trim_start_matches("sha256:").to_owned();
        let name = match self.layout {
            DockerLayout::Legacy => format!("{hex}.json"),
            DockerLayout::Blobs => format!("blobs/sha256/{hex}"),
        };
        self.add_file(&name, &config);
        self.manifest.push(json!({"Config": name, "RepoTags": tags, "Layers": listed}));
        self
    }

    /// The archive's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.finish_with(|_| {})
    }

    /// The archive's bytes, with `manifest.json` as `edit` leaves it.
    pub fn finish_with(mut self, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut manifest = Value::Array(std::mem::take(&mut self.manifest));
        edit(&mut manifest);
        if self.layout == DockerLayout::Blobs {
            self.add_file("index.json", br#"{"schemaVersion":2,"manifests":[]}"#);
        }
        self.add_file("manifest.json", &serde_json::to_vec(&manifest).unwrap());
        match self.layout {
            DockerLayout::Legacy => self.add_file("repositories", b"{}"),
            DockerLayout::Blobs => self.add_file("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#),
        }
        self.tar.into_inner().unwrap()
    }
}
