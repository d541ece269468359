//! The built-in `host` image: the host's own userland, without copying it.
//!
//! The image holds only a skeleton: an empty `usr/` onto which the sandbox
//! bind-mounts the host's `/usr` read-only (recorded as a [`Projection`]),
//! the top-level links of a merged-/usr system (`bin -> usr/bin`, ...), the
//! usual empty directories, and of the host's `/etc` only what programs
//! need to run ([`ETC_ALLOWLIST`]): whatever else an operator keeps there,
//! now or later, stays out. Everything is owned by root.

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

/// What of the host's `/etc` the image has: these paths (relative to
/// `/etc`; a `*` ends a name prefix) and all beneath them, if the host has
/// them, and the directories on the way. Chosen by what the shell,
/// coreutils, git, curl (TLS), python3 and pip, perl and java open there
/// on Debian. Left out on purpose: `ld.so.preload` (it would load a host
/// library into every sandbox process), `environment`, `pip.conf`,
/// `gitconfig` and `apt` (settings, and sometimes credentials, of the
/// host's own).
pub(super) const ETC_ALLOWLIST: &[&str] = &[
    // Users and groups (a fallback is written when the host has none).
    "passwd",
    "group",
    // Name service, hosts and network databases (`resolv.conf` and
    // `hostname` are written, not copied).
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "gai.conf",
    "networks",
    "protocols",
    "services",
    "rpc",
    "ethertypes",
    // The dynamic loader.
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    // Time and locale.
    "localtime",
    "timezone",
    "locale.alias",
    "default/locale",
    // TLS trust: certificates (links into /usr/share) and library settings.
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "gnutls",
    "pki/tls/certs",
    "pki/ca-trust",
    // The links `/usr/bin/awk`, `editor`, `java`... go through.
    "alternatives",
    // What the system is.
    "os-release",
    "debian_version",
    "lsb-release",
    // Shells and user tools.
    "profile",
    "profile.d",
    "bash.bashrc",
    "shells",
    "inputrc",
    "login.defs",
    "adduser.conf",
    "deluser.conf",
    "default/useradd",
    "skel",
    // File types.
    "mime.types",
    "magic",
    "magic.mime",
    // Language runtimes' configuration (Debian keeps java's `conf` here).
    "python3",
    "python3.*",
    "perl",
    "java-*",
    // Terminals and fonts.
    "terminfo",
    "fonts",
    // A link to /proc/self/mounts, which df and mount read.
    "mtab",
    // ssh client defaults.
    "ssh/ssh_config",
    "ssh/ssh_config.d",
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
/// relative to `/etc`. What is on the allowlist is still checked for what
/// looks secret, in case a host keeps it there.
fn etc_skip(rel: &RelPath, st: &FileStat) -> Option<&'static str> {
    if !on_allowlist(rel, file_type(st) == SFlag::S_IFDIR) {
        return Some("not on the host image's /etc allowlist");
    }
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

/// True when `rel` (relative to `/etc`) is on [`ETC_ALLOWLIST`] or beneath
/// an entry of it, or is a directory on the way to one.
fn on_allowlist(rel: &RelPath, is_dir: bool) -> bool {
    let parts: Vec<&[u8]> = rel.parts().iter().map(|p| p.to_bytes()).collect();
    ETC_ALLOWLIST.iter().any(|entry| {
        let want: Vec<&str> = entry.split('/').collect();
        let n = parts.len().min(want.len());
        let same = parts[..n].iter().zip(&want[..n]).all(|(name, pattern)| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix.as_bytes()),
            None => *name == pattern.as_bytes(),
        });
        same && (parts.len() >= want.len() || is_dir)
    })
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
