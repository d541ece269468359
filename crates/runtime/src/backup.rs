//! `backup` and `restore`: a node's durable state (its store, its blob
//! store and the keys that open and sign them) as one tar stream, made
//! while the daemon runs; and such a stream put into a new home while no
//! daemon runs on it.
//!
//! Consistent while the daemon runs: the database is copied first, in one
//! read transaction (SQLite's `VACUUM INTO`); the blob store is then read
//! under the shared blob hold that snapshots take, so gc cannot remove an
//! object the copied database references (objects are only ever added
//! under that hold, never changed). Objects added after the copy are
//! carried too; nothing references them, and a later gc frees them.
//!
//! The last entry, [`MANIFEST`], lists every other entry with its size and
//! SHA-256: a stream cut short has none, and `restore` refuses it, as it
//! refuses any entry the manifest does not list as it is.
//!
//! Not in a backup: images (their names are listed; import or pull them
//! on the new host), live sandboxes (a restored node recovers its running
//! tasks from their latest snapshots, as after a reboot), and a
//! PostgreSQL store, which PostgreSQL's own tools back up.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cairn_blob::{Kind, WriteBackend};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::home::Home;
use crate::runtime::Runtime;
use crate::Error;

/// The manifest's name in the tar stream: its last entry.
pub const MANIFEST: &str = "cairn-backup.json";
/// The manifest format this build writes and reads.
const FORMAT: u32 = 1;
/// The copied database's name in the stream and in a home.
const DATABASE: &str = "cairn.db";
/// The home's files that hold keys, carried as they are: the API token, the
/// approval links' key, the secrets' key and the ledger's signing keys.
const KEY_FILES: [&str; 3] = ["token", "approval.key", "secrets.key"];
const KEY_DIR: &str = "keys";
/// Where blob objects go in the stream: `blobs/<kind>/<id>`.
const BLOBS: &str = "blobs";
/// The kinds of blob objects, in the order they are listed: each before
/// the kinds it refers to (a manifest to chunks an index places in packs),
/// since a writer stores them the other way round. Every object listed
/// then finds what it refers to listed after it, even while snapshots go on.
const KINDS: [Kind; 5] = [Kind::Manifest, Kind::Index, Kind::Pack, Kind::Deliverable, Kind::Record];
/// Largest single entry `restore` reads (a pack or the database may be
/// large; a name or key file is small).
const MAX_ENTRY: u64 = 64 << 30;

/// What a backup holds, written as its last entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct BackupManifest {
    pub format: u32,
    /// When the database was copied (ms since the epoch).
    pub made_ms: i64,
    pub node: String,
    pub tasks: usize,
    pub snapshots: usize,
    /// Images the tasks were made from, which a backup does not carry.
    pub images: Vec<String>,
    /// Every other entry: path in the stream, size, SHA-256.
    pub entries: Vec<BackupEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupEntry {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// What `restore` put into a home.
#[derive(Debug, Serialize)]
pub struct RestoreReport {
    pub home: PathBuf,
    pub made_ms: i64,
    pub node: String,
    pub tasks: usize,
    pub snapshots: usize,
    pub objects: usize,
    pub bytes: u64,
    /// Images the tasks use that the home does not have.
    pub missing_images: Vec<String>,
}

impl Runtime {
    /// Starts a backup: the tar stream's chunks come through the returned
    /// receiver, an error as the last item (the stream then has no
    /// manifest). Refused at once for a store or blob store this node does
    /// not own alone.
    pub async fn backup(self: &Arc<Self>) -> Result<tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>, Error> {
        if self.store.shared() {
            return Err(Error::conflict(
                "this node's store is a database server several nodes share: back it up with its own tools, and the blob store with the object store's (docs/operations.md, \"Backup and restore\")",
            ));
        }
        let scratch = tempfile::Builder::new().prefix("backup-").tempdir_in(&self.home).map_err(|e| Error::internal_with(format!("a scratch directory in {}: {e}", self.home.display()), e))?;
        let db_copy = scratch.path().join(DATABASE);
        self.store.copy_to(&db_copy).await?;
        let tasks = self.store.list_tasks().await?;
        let snapshots = self.store.all_snapshots().await?.len();
        // The host image is every daemon's own, made at its start.
        let mut images: Vec<String> = tasks.iter().map(|t| t.config.image.clone()).filter(|i| i != cairn_image::HOST_IMAGE).collect();
        images.sort();
        images.dedup();
        let head = Head { made_ms: cairn_store::now_ms(), node: self.cluster.name.clone(), tasks: tasks.len(), snapshots, images };
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let rt = self.clone();
        tokio::spawn(async move {
            let hold = match rt.hold_blobs().await {
                Ok(h) => h,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            let backend = rt.snaps.repo.backend().clone();
            let home = rt.home.clone();
            let errors = tx.clone();
            let written = tokio::task::spawn_blocking(move || {
                let out = std::io::BufWriter::with_capacity(256 << 10, ChannelWriter(tx));
                write_backup(out, &home, &db_copy, backend.as_ref(), head)
            })
            .await;
            drop(hold);
            drop(scratch);
            let failed = match written {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(e) => Some(std::io::Error::other(e.to_string())),
            };
            if let Some(e) = failed {
                tracing::warn!("backup failed: {e}");
                let _ = errors.send(Err(e)).await;
            }
        });
        Ok(rx)
    }
}

/// What the manifest says besides its entries.
struct Head {
    made_ms: i64,
    node: String,
    tasks: usize,
    snapshots: usize,
    images: Vec<String>,
}

/// Hashes and counts what is read through it.
struct Hashing<'a> {
    inner: &'a mut dyn Read,
    hash: Sha256,
    read: u64,
}

impl Read for Hashing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// Sends what is written as chunks; fails once the reader is gone.
struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.blocking_send(Ok(Bytes::copy_from_slice(buf))).map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the backup's reader went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_backup(out: impl Write, home: &Path, db_copy: &Path, blobs: &dyn WriteBackend, head: Head) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(out);
    let mut entries = Vec::new();
    // Each entry is hashed as it is written; the database copy is streamed
    // from its file (it may be large), the rest are small or one object.
    let mut add_from = |tar: &mut tar::Builder<_>, path: String, size: u64, data: &mut dyn Read| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mtime(u64::try_from(head.made_ms / 1000).unwrap_or(0));
        let mut hashing = Hashing { inner: data, hash: Sha256::new(), read: 0 };
        tar.append_data(&mut header, &path, &mut hashing)?;
        if hashing.read != size {
            return Err(std::io::Error::other(format!("{path} changed while it was read ({size} bytes, then {})", hashing.read)));
        }
        entries.push(BackupEntry { path, size, sha256: hex::encode(hashing.hash.finalize()) });
        Ok(())
    };
    let db = std::fs::File::open(db_copy)?;
    let db_size = db.metadata()?.len();
    add_from(&mut tar, DATABASE.to_owned(), db_size, &mut std::io::BufReader::with_capacity(1 << 20, db))?;
    let mut add = |tar: &mut tar::Builder<_>, path: String, data: &[u8]| add_from(tar, path, data.len() as u64, &mut &data[..]);
    for name in KEY_FILES {
        match std::fs::read(home.join(name)) {
            Ok(data) => add(&mut tar, name.to_owned(), &data)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("{}: {e}", home.join(name).display()))),
        }
    }
    let mut keys: Vec<_> = std::fs::read_dir(home.join(KEY_DIR))?.collect::<std::io::Result<_>>()?;
    keys.sort_by_key(std::fs::DirEntry::file_name);
    for key in keys {
        if key.file_type()?.is_file() {
            let name = key.file_name().into_string().map_err(|n| std::io::Error::other(format!("a key file named {n:?} is not UTF-8")))?;
            add(&mut tar, format!("{KEY_DIR}/{name}"), &std::fs::read(key.path())?)?;
        }
    }
    let mut listed = Vec::new();
    for kind in KINDS {
        let mut objects = blobs.list(kind).map_err(|e| std::io::Error::other(format!("listing the blob store's {}: {e}", kind.dir())))?;
        objects.sort_by(|a, b| a.id.cmp(&b.id));
        listed.push((kind, objects));
    }
    for (kind, objects) in listed {
        for o in objects {
            let data = blobs.read(kind, &o.id).map_err(|e| std::io::Error::other(format!("reading {} {}: {e}", kind.dir(), o.id)))?;
            add(&mut tar, format!("{BLOBS}/{}/{}", kind.dir(), o.id), &data)?;
        }
    }
    let manifest = BackupManifest { format: FORMAT, made_ms: head.made_ms, node: head.node, tasks: head.tasks, snapshots: head.snapshots, images: head.images, entries };
    let json = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o600);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mtime(u64::try_from(manifest.made_ms / 1000).unwrap_or(0));
    tar.append_data(&mut header, MANIFEST, json.as_slice())?;
    tar.into_inner()?.flush()
}

/// Why a restore was refused. The database goes into the home last, so a
/// home a restore failed on still holds no store and can be restored into
/// again (blob objects already put there are the same ones again).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Home(#[from] crate::home::HomeError),
    #[error("{0} already holds a store (cairn.db): restore into a new, empty home (set CAIRN_HOME), or move that one away")]
    HomeInUse(PathBuf),
    #[error("cannot read backup {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("backup {0} is not whole: {1}")]
    Damaged(PathBuf, String),
    #[error("restoring into {0}: {1}")]
    Write(PathBuf, String),
}

/// Puts the backup read from `source` (named `name` in messages) into
/// `home`, which no daemon may be running on and which must hold no store.
/// The backup is checked whole against its manifest in a staging directory
/// before anything is moved into the home.
pub async fn restore(home: &Home, source: impl Read + Send + 'static, name: &Path) -> Result<RestoreReport, RestoreError> {
    let _lock = home.lock()?;
    let root = home.root().to_owned();
    if std::fs::symlink_metadata(home.db()).is_ok() {
        return Err(RestoreError::HomeInUse(root));
    }
    let staging = tempfile::Builder::new().prefix("restore-").tempdir_in(&root).map_err(|e| RestoreError::Write(root.clone(), e.to_string()))?;
    let (dir, name_owned) = (staging.path().to_owned(), name.to_owned());
    let manifest = tokio::task::spawn_blocking(move || unpack_checked(source, &dir, &name_owned))
        .await
        .map_err(|e| RestoreError::Write(root.clone(), e.to_string()))??;
    let write = |e: String| RestoreError::Write(root.clone(), e);
    // The database must open as a store (this build's migrations run on it).
    let staged_db = staging.path().join(DATABASE);
    let store = cairn_store::SqliteStore::open(&staged_db).await.map_err(|e| RestoreError::Damaged(name.to_owned(), e.to_string()))?;
    cairn_store::Store::close(&store).await;
    // Blob objects go in through the home's own blob store.
    let blobs = cairn_blob::BlobUrl::Local(home.blobs()).open(&home.blob_cache(), 0).map_err(|e| write(e.to_string()))?;
    let (mut objects, mut bytes) = (0, 0);
    for entry in &manifest.entries {
        let Some(rest) = entry.path.strip_prefix("blobs/") else { continue };
        let (dir, id) = rest.split_once('/').ok_or_else(|| RestoreError::Damaged(name.to_owned(), format!("entry {} names no object", entry.path)))?;
        let kind = KINDS.into_iter().find(|k| k.dir() == dir).ok_or_else(|| RestoreError::Damaged(name.to_owned(), format!("entry {} is of no kind Cairn stores", entry.path)))?;
        let data = std::fs::read(staging.path().join(&entry.path)).map_err(|e| write(e.to_string()))?;
        blobs.write(kind, id, Bytes::from(data)).map_err(|e| write(format!("blob {}: {e}", entry.path)))?;
        objects += 1;
        bytes += entry.size;
    }
    // Keys, then the database last: a home with a store is a restored one.
    std::fs::DirBuilder::new().recursive(true).create(root.join(KEY_DIR)).map_err(|e| write(e.to_string()))?;
    for entry in &manifest.entries {
        let is_key = KEY_FILES.contains(&entry.path.as_str()) || entry.path.starts_with("keys/");
        if is_key {
            std::fs::rename(staging.path().join(&entry.path), root.join(&entry.path)).map_err(|e| write(format!("{}: {e}", entry.path)))?;
        }
    }
    std::fs::rename(&staged_db, home.db()).map_err(|e| write(format!("{DATABASE}: {e}")))?;
    let missing_images = manifest.images.iter().filter(|i| !home.images().join(i.as_str()).is_dir()).cloned().collect();
    Ok(RestoreReport { home: root, made_ms: manifest.made_ms, node: manifest.node, tasks: manifest.tasks, snapshots: manifest.snapshots, objects, bytes, missing_images })
}

/// Reads a backup whole and checks it against its manifest without
/// keeping it (`cairn backup` reads back what it wrote).
pub fn verify(source: impl Read, name: &Path) -> Result<BackupManifest, RestoreError> {
    read_checked(source, None, name)
}

/// Unpacks a backup into `dir`, refusing any entry that is not a plain
/// file at a name a backup holds, and checking each against the manifest.
fn unpack_checked(source: impl Read, dir: &Path, name: &Path) -> Result<BackupManifest, RestoreError> {
    read_checked(source, Some(dir), name)
}

fn read_checked(source: impl Read, dir: Option<&Path>, name: &Path) -> Result<BackupManifest, RestoreError> {
    let damaged = |why: String| RestoreError::Damaged(name.to_owned(), why);
    let mut seen: BTreeMap<String, BackupEntry> = BTreeMap::new();
    let mut manifest = None;
    let mut archive = tar::Archive::new(source);
    for entry in archive.entries().map_err(|e| RestoreError::Read(name.to_owned(), e))? {
        let mut entry = entry.map_err(|e| damaged(format!("its tar stream breaks off or is malformed ({e})")))?;
        let path = entry.path().map_err(|e| damaged(e.to_string()))?.to_str().map(str::to_owned).ok_or_else(|| damaged("an entry's name is not UTF-8".into()))?;
        if manifest.is_some() {
            return Err(damaged(format!("entry {path} comes after the manifest")));
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(damaged(format!("entry {path} is not a plain file")));
        }
        if !allowed_path(&path) {
            return Err(damaged(format!("entry {path:?} is no file a backup holds")));
        }
        if entry.size() > MAX_ENTRY {
            return Err(damaged(format!("entry {path} is {} bytes, over the limit", entry.size())));
        }
        if path == MANIFEST {
            let mut json = Vec::new();
            entry.read_to_end(&mut json).map_err(|e| damaged(format!("its manifest breaks off ({e})")))?;
            manifest = Some(serde_json::from_slice::<BackupManifest>(&json).map_err(|e| damaged(format!("its manifest is malformed ({e})")))?);
            continue;
        }
        if seen.contains_key(&path) {
            return Err(damaged(format!("entry {path} is there twice")));
        }
        let mut file = match dir {
            Some(dir) => {
                let target = dir.join(&path);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| RestoreError::Write(dir.to_owned(), e.to_string()))?;
                }
                let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(|e| RestoreError::Write(target.clone(), e.to_string()))?;
                Some((file, target))
            }
            None => None,
        };
        let mut hash = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = entry.read(&mut buf).map_err(|e| damaged(format!("entry {path} breaks off ({e})")))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            size += n as u64;
            if let Some((file, target)) = file.as_mut() {
                file.write_all(&buf[..n]).map_err(|e| RestoreError::Write(target.clone(), e.to_string()))?;
            }
        }
        if let Some((file, target)) = file {
            file.sync_all().map_err(|e| RestoreError::Write(target, e.to_string()))?;
        }
        seen.insert(path.clone(), BackupEntry { path, size, sha256: hex::encode(hash.finalize()) });
    }
    let manifest = manifest.ok_or_else(|| damaged("it has no manifest (a backup cut short ends before it)".into()))?;
    if manifest.format != FORMAT {
        return Err(damaged(format!("its format is {}, this build reads {FORMAT}", manifest.format)));
    }
    for listed in &manifest.entries {
        match seen.remove(&listed.path) {
            Some(got) if got == *listed => {}
            Some(_) => return Err(damaged(format!("entry {} differs from its manifest (size or SHA-256)", listed.path))),
            None => return Err(damaged(format!("entry {} of its manifest is missing", listed.path))),
        }
    }
    if let Some(extra) = seen.keys().next() {
        return Err(damaged(format!("entry {extra} is not in its manifest")));
    }
    if !manifest.entries.iter().any(|e| e.path == DATABASE) {
        return Err(damaged("it holds no database".into()));
    }
    Ok(manifest)
}

/// The names a backup holds: the database, the key files, `keys/NAME`,
/// `blobs/KIND/ID` (each part plain: no `..`, no leading `/`), the manifest.
fn allowed_path(path: &str) -> bool {
    let plain = |part: &str| !part.is_empty() && part != "." && part != ".." && part.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match path.split('/').collect::<Vec<_>>().as_slice() {
        [one] => *one == DATABASE || *one == MANIFEST || KEY_FILES.contains(one),
        [KEY_DIR, file] => plain(file),
        [BLOBS, kind, id] => KINDS.iter().any(|k| k.dir() == *kind) && plain(id),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_a_backup_holds_are_allowed() {
        for ok in ["cairn.db", "cairn-backup.json", "token", "secrets.key", "keys/signing.key", "blobs/packs/ab12", "blobs/records/x.json"] {
            assert!(allowed_path(ok), "{ok}");
        }
        for bad in ["../cairn.db", "/etc/passwd", "keys/../token", "keys/..", "blobs/packs/../x", "blobs/other/ab", "blobs/packs/a/b", "run/x", "", "keys/", "daemon.lock", "keys/a b"] {
            assert!(!allowed_path(bad), "{bad}");
        }
    }
}
