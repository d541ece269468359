//! The built-in `host` image: the host's own userland, without copying it.
//!
//! The image holds only a skeleton: an empty `usr/` onto which the sandbox
//! bind-mounts the host's `/usr` read-only (recorded as a [`Projection`]),
//! the top-level links of a merged-/usr system (`bin -> usr/bin`, ...), the
//! usual empty directories, and a copy of the host's `/etc` with everything
//! secret left out. Everything is owned by root.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{FileStat, SFlag};

use super::copy::{copy_tree, CopyPolicy};
use super::path::RelPath;
use super::writer::{file_type, Content, Meta, TreeWriter};
use super::Projection;
use crate::{Error, Result};

/// Top-level names that merged-/usr hosts make links into `/usr`.
const TOP_LEVEL_LINKS: [&str; 6] = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The empty directories of the skeleton, parents first, with their modes.
const SKELETON: [(&str, u32); 15] = [
    ("usr", 0o755),
    ("dev", 0o755),
    ("proc", 0o755),
    ("sys", 0o755),
    ("tmp", 0o1777),
    ("run", 0o755),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("var/lib", 0o755),
    ("home", 0o755),
    ("mnt", 0o755),
    ("opt", 0o755),
    ("srv", 0o755),
    ("workspace", 0o755),
    ("root", 0o700),
];

/// Files in `/etc` (by name, at any depth) that hold password hashes or
/// identify this particular host, whatever their mode says.
const NEVER_COPIED: [&str; 5] = ["shadow", "shadow-", "gshadow", "gshadow-", "machine-id"];

/// Bigger files in `/etc` are databases or caches no sandbox needs.
const MAX_ETC_FILE: i64 = 1 << 20;

const RESOLV_CONF: &str = "# This sandbox has no network access, so it has no DNS servers.\n";
const HOSTNAME: &str = "cairn\n";
/// Used only when the host's own file was not copied.
const FALLBACK_PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const FALLBACK_GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Builds the host image's tree from the host whose root is `host_root`
/// (`/` except in tests) and returns the projections the sandbox must mount.
pub(super) fn build(host_root: &Path, w: &mut TreeWriter) -> Result<Vec<Projection>> {
    let now = super::now_ms() / 1000;
    w.dir(&RelPath::root(), Meta::root(0o755, now))?;
    for (dir, mode) in SKELETON {
        w.dir(&known(dir), Meta::root(mode, now))?;
    }
    link_top_level(host_root, w, now)?;
    let policy = CopyPolicy { owner: Some((0, 0)), skip: Some(&etc_skip) };
    copy_tree(&host_root.join("etc"), &known("etc"), w, policy)?;
    write_etc_files(w, now)?;
    Ok(vec![Projection { host_path: host_root.join("usr"), at: PathBuf::from("/usr") }])
}

/// Mirrors the host's top-level links. A real directory there (a host
/// without merged /usr) cannot be projected through `/usr`, so it is left
/// out rather than copied.
fn link_top_level(host_root: &Path, w: &mut TreeWriter, now: i64) -> Result<()> {
    for name in TOP_LEVEL_LINKS {
        let host = host_root.join(name);
        let meta = match fs::symlink_metadata(&host) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::ImageIo(host, e)),
        };
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&host).map_err(|e| Error::ImageIo(host.clone(), e))?;
            w.symlink(&known(name), target.as_os_str().as_bytes(), Meta::root(0o777, now))?;
        } else {
            tracing::warn!(
                path = %host.display(),
                "not a symlink into /usr (is this host's /usr not merged?); the host image leaves it out"
            );
        }
    }
    Ok(())
}

/// Why an entry of the host's `/etc` stays out of the image. `rel` is
/// relative to `/etc`.
fn etc_skip(rel: &RelPath, st: &FileStat) -> Option<&'static str> {
    let name = rel.file_name()?.to_string_lossy().to_lowercase();
    let path = rel.to_string();
    if NEVER_COPIED.contains(&name.as_str()) {
        return Some("password hashes or host identity");
    }
    if path.starts_with("/ssh/ssh_host_") {
        return Some("ssh host key");
    }
    if path == "/ssl/private" {
        return Some("TLS private keys");
    }
    if name.ends_with(".key") || name.contains("secret") {
        return Some("named like a key or secret");
    }
    // Secrets are stored unreadable by others; that is the one signal that
    // works for files nobody thought to list.
    if st.st_mode & 0o004 == 0 {
        return Some("not world-readable");
    }
    if file_type(st) == SFlag::S_IFREG && st.st_size > MAX_ETC_FILE {
        return Some("larger than 1 MiB");
    }
    None
}

/// The files the sandbox needs to differ from the host's, and the ones it
/// cannot do without.
fn write_etc_files(w: &mut TreeWriter, now: i64) -> Result<()> {
    let meta = Meta::root(0o644, now);
    w.file(&known("etc/resolv.conf"), meta, Content::dense(RESOLV_CONF.len() as u64), &mut RESOLV_CONF.as_bytes())?;
    w.file(&known("etc/hostname"), meta, Content::dense(HOSTNAME.len() as u64), &mut HOSTNAME.as_bytes())?;
    for (path, fallback) in [("etc/passwd", FALLBACK_PASSWD), ("etc/group", FALLBACK_GROUP)] {
        let path = known(path);
        if !w.exists(&path)? {
            w.file(&path, meta, Content::dense(fallback.len() as u64), &mut fallback.as_bytes())?;
        }
    }
    Ok(())
}

/// A path written in this file, which is always valid.
fn known(path: &'static str) -> RelPath {
    RelPath::parse(path.as_bytes()).unwrap_or_else(|_| unreachable!("constant path {path:?} is relative"))
}
