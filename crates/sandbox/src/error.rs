use std::io;
use std::path::PathBuf;

use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building, using or tearing down a
/// sandbox. Variants carry the path or object they concern.
#[derive(Debug, Error)]
pub enum Error {
    // --- images (the image crate's own) ---
    #[error(transparent)]
    Image(#[from] cairn_image::Error),

    // --- cgroups ---
    #[error("no usable cgroup hierarchy: {0}")]
    CgroupDetect(String),
    #[error("cgroup {0}: {1}")]
    Cgroup(PathBuf, io::Error),
    #[error("cannot move pid {1} into cgroup {0}: {2}")]
    CgroupMove(PathBuf, i32, io::Error),
    #[error("cgroup {0} still has processes after kill")]
    CgroupBusy(PathBuf),
    #[error("invalid cgroup name {0:?}: expected a single path component")]
    CgroupName(String),
    #[error("cgroup {0}: timed out waiting to {1}")]
    CgroupTimeout(PathBuf, &'static str),
    #[error("cgroup {0}: cannot {1}: no hierarchy on this host supports it")]
    CgroupUnsupported(PathBuf, &'static str),

    // --- seccomp / capabilities ---
    #[error("seccomp filter: {0}")]
    Seccomp(String),
    #[error("cannot install seccomp filter: {0}")]
    SeccompInstall(io::Error),
    #[error("capabilities: {0}")]
    Caps(String),

    // --- disk ---
    #[error("disk image {0}: {1}")]
    Disk(PathBuf, io::Error),
    #[error("mkfs.ext4 for {0} failed: {1}")]
    Mkfs(PathBuf, String),
    /// A new task disk does not fit the space its filesystem can promise.
    #[error("{0}")]
    DiskSpace(String),
    #[error("loop device for {0}: {1}")]
    Loop(PathBuf, io::Error),

    // --- rootfs and processes ---
    #[error("mount {target}: {err}")]
    Mount { target: PathBuf, err: io::Error },
    #[error("unmount {0}: {1}")]
    Umount(PathBuf, io::Error),
    #[error("{what}: {err}")]
    Sys { what: &'static str, err: io::Error },
    #[error("sandbox helper failed: {0}")]
    Helper(String),
    /// A name the helper had to create or mount on inside a sandbox root is
    /// a symlink, or lies under one (the image or the sandbox put it there).
    #[error("cannot {op} {target} in the sandbox root: {link} is a symlink (links in a sandbox's files are never followed while its root is built)")]
    RootSymlink { op: &'static str, target: String, link: String },
    #[error("no free uid range for a new sandbox")]
    NoUidRange,

    // --- exec and files ---
    #[error("sandbox of task {0} is not running")]
    NotRunning(String),
    #[error("sandbox control: {0}")]
    Control(io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("path {0:?} is outside the sandbox or goes through a symlink that points out")]
    PathEscape(String),
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error("symlink {0} -> {1} leads out of the copied tree")]
    LinkOut(String, String),

    /// A failure a test asked the fake driver for.
    #[cfg(any(test, feature = "test-util"))]
    #[error("{0} failed (injected by the fake driver)")]
    Injected(&'static str),
}

impl Error {
    /// Wraps the current `errno` of a failed syscall.
    pub fn sys(what: &'static str, err: impl Into<io::Error>) -> Error {
        Error::Sys { what, err: err.into() }
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::Sys { what: "syscall", err: io::Error::from(e) }
    }
}
