//! The layer store: the unpacked layers of OCI images, each stored once
//! and shared by every image that has it.
//!
//! A layer is keyed by its diffid, the sha256 of its uncompressed tar
//! stream, and lives in `<root>/sha256/<hex>/`: the tree in `tree/`, ready
//! to be an overlayfs lower directory (whiteouts as character devices 0/0,
//! opaque directories marked with `trusted.overlay.opaque=y`), and its
//! description in `layer.json`. Layers are unpacked in a `.tmp-*`
//! directory and renamed into place complete, as images are (`staging`).
//!
//! A template's own layers (a task's writable layer, committed) are stored
//! the same way, keyed by a sha256 of what they were made from (see
//! [`LayerStore::adopt`]): they have no blob.
//!
//! `<root>/.lock` orders imports and garbage collection: an import holds it
//! shared from its first layer until its image is published, and
//! [`LayerStore::gc`] exclusive while it decides which layers no image uses
//! and removes them, so it never removes a layer an import is about to
//! reference.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::archive::{self, Format};
use super::limits::Budget;
use super::path::short;
use super::staging::{discard, fsync_dir, temp_path, Staging};
use super::writer::TreeWriter;
use super::{measure, now_ms, Dropped, TMP_PREFIX};
use crate::{Error, Result};

const LAYER_JSON: &str = "layer.json";
const TREE: &str = "tree";
const SHA256: &str = "sha256";
const LOCK: &str = ".lock";
/// The media type recorded for a layer committed from a task.
pub const COMMITTED: &str = "application/vnd.cairn.committed-layer";

/// A stored layer, as recorded in its `layer.json`: one layer shared by
/// every image that has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct LayerInfo {
    /// `sha256:<hex>` of the uncompressed tar stream.
    pub diff_id: String,
    /// `sha256:<hex>` of the blob it was unpacked from.
    pub blob_digest: String,
    pub media_type: String,
    /// Size of the blob.
    pub bytes: u64,
    /// Total size of the unpacked regular files.
    pub size_bytes: u64,
    /// Entries in the unpacked tree.
    pub files: u64,
    pub created_ms: i64,
    #[serde(default)]
    pub dropped: Dropped,
    /// Whiteout-prefixed metadata entries skipped.
    #[serde(default)]
    pub skipped: u64,
}

/// What an image says one of its layers is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerWant {
    pub diff_id: String,
    pub blob_digest: String,
    pub blob_size: u64,
    pub media_type: String,
}

/// How a layer not stored yet is read and checked.
#[derive(Debug)]
pub(super) struct Blob<'a> {
    /// Names the layer in errors: its blob digest, or its file in an archive.
    pub label: &'a str,
    /// How it is compressed; `None` to tell by its first bytes.
    pub format: Option<Format>,
    /// Recorded in `layer.json`; `None` for docker's media type of the
    /// compression found.
    pub media_type: Option<&'a str>,
    pub check: BlobCheck<'a>,
}

/// What the blob itself must be, once read to its end.
#[derive(Debug)]
pub(super) enum BlobCheck<'a> {
    /// A blob named by its digest (a layout's or a registry's): its sha256
    /// and size must be these.
    Digest { digest: &'a str, size: u64 },
    /// A file of an archive, of this size: fewer bytes read mean it was
    /// cut short.
    Size(u64),
}

/// Names the layer in an error about one of its entries or its stream.
fn in_layer(label: &str, e: Error) -> Error {
    match e {
        Error::UnsafeEntry { entry, reason } => Error::UnsafeLayerEntry { layer: label.to_owned(), entry, reason },
        Error::ImageSource(src, msg) => Error::ImageSource(src, format!("layer {}: {msg}", short(label))),
        e => e,
    }
}

/// A directory in the layer store's filesystem to build layer trees in by
/// other means (a snapshot restored into it), so that
/// [`LayerStore::adopt`] can move them in by rename. Removed on drop, and
/// by [`LayerStore::cleanup`] after a crash.
#[derive(Debug)]
pub struct Scratch(Staging);

impl Scratch {
    pub fn path(&self) -> PathBuf {
        self.0.rootfs()
    }
}

/// A held lock on the layer store (see the module docs).
#[derive(Debug)]
pub struct LayerLock(#[allow(dead_code)] Flock<File>);

/// The layers under one directory, normally `$CAIRN_HOME/layers`.
#[derive(Clone, Debug)]
pub struct LayerStore {
    root: PathBuf,
}

impl LayerStore {
    pub fn new(root: impl Into<PathBuf>) -> LayerStore {
        LayerStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The unpacked tree of layer `diff_id` (which may not exist).
    pub fn tree(&self, diff_id: &str) -> Result<PathBuf> {
        Ok(self.layer_dir(diff_id)?.join(TREE))
    }

    /// Layer `diff_id`'s description, if it is stored.
    pub fn get(&self, diff_id: &str) -> Result<Option<LayerInfo>> {
        let json = self.layer_dir(diff_id)?.join(LAYER_JSON);
        match fs::read(&json) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::ImageIo(json, io::Error::new(io::ErrorKind::InvalidData, e))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::ImageIo(json, e)),
        }
    }

    /// The diffids of every stored layer.
    pub fn list(&self) -> Result<Vec<String>> {
        let dir = self.root.join(SHA256);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::ImageIo(dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let name = entry.map_err(|e| Error::ImageIo(dir.clone(), e))?.file_name();
            let name = name.to_string_lossy();
            if is_hex64(&name) {
                out.push(format!("sha256:{name}"));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Takes the store's lock shared (for an import) or exclusive (for gc),
    /// waiting for it.
    pub fn lock(&self, exclusive: bool) -> Result<LayerLock> {
        fs::create_dir_all(&self.root).map_err(|e| Error::ImageIo(self.root.clone(), e))?;
        let path = self.root.join(LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::ImageIo(path.clone(), e))?;
        let arg = if exclusive { FlockArg::LockExclusive } else { FlockArg::LockShared };
        Flock::lock(file, arg).map(LayerLock).map_err(|(_, e)| Error::ImageIo(path, e.into()))
    }

    /// Returns layer `want.diff_id`, unpacking it within `budget` from the
    /// blob `open` gives if it is not stored yet. The blob's digest and
    /// size and the unpacked stream's digest must be what `want` says, or
    /// nothing is kept. The caller holds [`LayerStore::lock`] (shared).
    pub(super) fn ensure<R: Read>(
        &self,
        want: &LayerWant,
        source: &Path,
        budget: &Budget,
        open: impl FnOnce() -> Result<R>,
    ) -> Result<LayerInfo> {
        if let Some(info) = self.get(&want.diff_id)? {
            return Ok(info);
        }
        let format = layer_format(&want.media_type).ok_or_else(|| {
            Error::ImageSource(
                source.to_owned(),
                format!("layer {} has the unsupported media type {:?}", want.blob_digest, want.media_type),
            )
        })?;
        let blob = Blob {
            label: &want.blob_digest,
            format: Some(format),
            media_type: Some(&want.media_type),
            check: BlobCheck::Digest { digest: &want.blob_digest, size: want.blob_size },
        };
        self.ensure_from(&want.diff_id, blob, source, budget, open)
    }

    /// Returns layer `diff_id`, unpacking it from what `open` gives, read
    /// as `blob` says, if it is not stored yet. The unpacked stream's
    /// digest must be `diff_id` and the blob pass `blob.check`, or nothing
    /// is kept. The caller holds [`LayerStore::lock`] (shared).
    pub(super) fn ensure_from<R: Read>(
        &self,
        diff_id: &str,
        blob: Blob<'_>,
        source: &Path,
        budget: &Budget,
        open: impl FnOnce() -> Result<R>,
    ) -> Result<LayerInfo> {
        if let Some(info) = self.get(diff_id)? {
            return Ok(info);
        }
        let label = blob.label;
        let dest = self.layer_dir(diff_id)?;
        let staging = Staging::with_tree(&self.root.join(SHA256), TREE)?;
        let mut w = TreeWriter::for_layer(&staging.rootfs(), source, budget.clone())?;
        let got = archive::unpack_layer(source, open()?, blob.format, &mut w).map_err(|e| in_layer(label, e))?;
        let skipped = w.skipped();
        let dropped = w.finish().map_err(|e| in_layer(label, e))?;
        let bad = |msg: String| Error::ImageSource(source.to_owned(), msg);
        match blob.check {
            BlobCheck::Digest { digest, size } => {
                if got.blob != digest {
                    return Err(bad(format!(
                        "layer blob {digest} has the digest {} (corrupt or tampered with)",
                        got.blob
                    )));
                }
                if got.blob_bytes != size {
                    return Err(bad(format!(
                        "layer blob {digest} is {} bytes, not the {size} its manifest says",
                        got.blob_bytes
                    )));
                }
            }
            BlobCheck::Size(size) if got.blob_bytes != size => {
                return Err(bad(format!(
                    "layer {} is truncated: {} of its {size} bytes",
                    short(label),
                    got.blob_bytes
                )));
            }
            BlobCheck::Size(_) => {}
        }
        if got.diff_id != diff_id {
            return Err(bad(format!(
                "layer {} unpacks to {}, not the diffid {diff_id} the image config says",
                short(label),
                got.diff_id
            )));
        }
        let (size_bytes, files) = measure(&staging.rootfs()).map_err(|e| Error::ImageIo(staging.rootfs(), e))?;
        let info = LayerInfo {
            diff_id: diff_id.to_owned(),
            blob_digest: got.blob,
            media_type: blob.media_type.map_or_else(|| docker_media_type(got.format).to_owned(), str::to_owned),
            bytes: got.blob_bytes,
            size_bytes,
            files,
            created_ms: now_ms(),
            dropped,
            skipped,
        };
        if !staging.publish_with(&dest, LAYER_JSON, &info)? {
            // Unpacked by another import meanwhile: theirs is the same.
            return self.get(diff_id)?.ok_or_else(|| Error::ImageIo(dest, io::ErrorKind::NotFound.into()));
        }
        tracing::info!(layer = diff_id, files, bytes = size_bytes, "unpacked layer");
        Ok(info)
    }

    /// A fresh scratch directory (see [`Scratch`]).
    pub fn scratch(&self) -> Result<Scratch> {
        Staging::with_tree(&self.root.join(SHA256), "scratch").map(Scratch)
    }

    /// Stores the directory `tree` (in a [`Scratch`] of this store; moved,
    /// not copied) as layer `key`, unless a layer of that key is stored
    /// already. `origin` says what it was made from. The caller holds
    /// [`LayerStore::lock`] (shared) until an image names the layer.
    pub fn adopt(&self, key: &str, tree: &Path, origin: &str) -> Result<LayerInfo> {
        if let Some(info) = self.get(key)? {
            return Ok(info);
        }
        let dest = self.layer_dir(key)?;
        let staging = Staging::with_tree(&self.root.join(SHA256), TREE)?;
        let into = staging.rootfs();
        fs::remove_dir(&into).and_then(|()| fs::rename(tree, &into)).map_err(|e| Error::ImageIo(tree.to_owned(), e))?;
        let (size_bytes, files) = measure(&into).map_err(|e| Error::ImageIo(into.clone(), e))?;
        let info = LayerInfo {
            diff_id: key.to_owned(),
            blob_digest: origin.to_owned(),
            media_type: COMMITTED.to_owned(),
            bytes: 0,
            size_bytes,
            files,
            created_ms: now_ms(),
            dropped: Dropped::default(),
            skipped: 0,
        };
        if !staging.publish_with(&dest, LAYER_JSON, &info)? {
            return self.get(key)?.ok_or_else(|| Error::ImageIo(dest, io::ErrorKind::NotFound.into()));
        }
        tracing::info!(layer = key, files, bytes = size_bytes, origin, "stored committed layer");
        Ok(info)
    }

    /// A fresh path for a blob being downloaded, `<root>/sha256/.tmp-*`:
    /// removed by [`LayerStore::cleanup`] should its download never finish.
    pub fn staging_blob(&self) -> Result<PathBuf> {
        let dir = self.root.join(SHA256);
        fs::create_dir_all(&dir).map_err(|e| Error::ImageIo(dir.clone(), e))?;
        Ok(temp_path(&dir))
    }

    /// Removes every layer not in the set `in_use` returns, which is asked
    /// for under the exclusive lock. Returns the diffids removed.
    pub fn gc(&self, in_use: impl FnOnce() -> Result<HashSet<String>>) -> Result<Vec<String>> {
        if !self.root.exists() {
            return Ok(Vec::new());
        }
        let _lock = self.lock(true)?;
        let keep = in_use()?;
        let mut removed = Vec::new();
        for diff_id in self.list()? {
            if keep.contains(&diff_id) {
                continue;
            }
            let dir = self.layer_dir(&diff_id)?;
            let trash = temp_path(&self.root.join(SHA256));
            match fs::rename(&dir, &trash) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::ImageIo(dir, e)),
            }
            fsync_dir(&self.root.join(SHA256)).map_err(|e| Error::ImageIo(self.root.clone(), e))?;
            if let Err(e) = discard(&trash) {
                tracing::warn!(path = %trash.display(), "cannot delete removed layer: {e}");
            }
            tracing::info!(layer = diff_id, "removed unused layer");
            removed.push(diff_id);
        }
        Ok(removed)
    }

    /// Deletes what interrupted unpacks and removals left behind.
    pub fn cleanup(&self) -> Result<usize> {
        let dir = self.root.join(SHA256);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::ImageIo(dir, e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| Error::ImageIo(dir.clone(), e))?;
            if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                continue;
            }
            let path = entry.path();
            match discard(&path) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => return Err(Error::ImageIo(path, e)),
            }
        }
        Ok(removed)
    }

    fn layer_dir(&self, diff_id: &str) -> Result<PathBuf> {
        let hex = sha256_hex(diff_id)
            .ok_or_else(|| Error::ImageSource(self.root.clone(), format!("{diff_id:?} is not a sha256 digest")))?;
        Ok(self.root.join(SHA256).join(hex))
    }
}

/// The hex part of `sha256:<64 lowercase hex digits>`.
pub(super) fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|h| is_hex64(h))
}

pub(super) fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// How a layer of this media type is compressed; `None` for a type that is
/// no layer this store can unpack.
pub(super) fn layer_format(media_type: &str) -> Option<Format> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Format::Tar),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Format::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Format::Zstd),
        _ => None,
    }
}

/// The media type docker gives a layer compressed as `format`.
fn docker_media_type(format: Format) -> &'static str {
    match format {
        Format::Gzip => "application/vnd.docker.image.rootfs.diff.tar.gzip",
        Format::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        Format::Tar | Format::Directory => "application/vnd.docker.image.rootfs.diff.tar",
    }
}

/// Reads `r` to its end into `out`, failing past `limit` bytes.
pub(super) fn read_limited(r: impl Read, limit: u64, out: &mut Vec<u8>) -> io::Result<()> {
    r.take(limit + 1).read_to_end(out)?;
    if out.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("over the {limit}-byte limit")));
    }
    Ok(())
}
