//! Where the operations of a [`super::Mounter`] land, and how the real
//! kernel reaches a place inside a sandbox root.
//!
//! A sandbox root's contents come from its image and from what the sandbox
//! itself wrote in an earlier life: its writable layer survives restarts,
//! rollbacks, suspends and forks. Any name in it may be a symlink to
//! anywhere, and the root is built by host root (and then by the sandbox's
//! root before it pivots, while `/` is still the host's). Looked up by path,
//! a planted `workspace -> /etc/x` would have host root create and chown a
//! host directory, and `proc -> /tmp/x` would put mounts on host paths.
//!
//! So a [`Place::Inside`] is reached from a descriptor of the root, one
//! component at a time with `O_NOFOLLOW`, each opened directory checked by
//! `fstat`, missing ones made with `mkdirat`; a mount goes onto the opened
//! entry through its `/proc/self/fd/N` link, which names exactly that
//! dentry. A symlink on the way is [`Error::RootSymlink`], naming it.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use cairn_fsat as fsat;
use fsat::{Kind, OFlags};

use crate::{Error, Result};

/// Where an operation of a [`super::Mounter`] lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// A host path the daemon owns (the run directory, the task disk), used
    /// as it is.
    Host(PathBuf),
    /// `rel` beneath the sandbox root `root` (itself a path the daemon owns,
    /// or `.`): looked up one component at a time, never through a symlink.
    Inside { root: PathBuf, rel: PathBuf },
}

impl Place {
    /// `path`, absolute in the sandbox, under the sandbox root `root`.
    pub fn inside(root: impl Into<PathBuf>, path: impl AsRef<Path>) -> Place {
        let path = path.as_ref();
        Place::Inside { root: root.into(), rel: path.strip_prefix("/").unwrap_or(path).to_owned() }
    }

    /// The place `name` within this one.
    pub fn join(&self, name: impl AsRef<Path>) -> Place {
        match self {
            Place::Host(p) => Place::Host(p.join(name)),
            Place::Inside { root, rel } => Place::Inside { root: root.clone(), rel: rel.join(name) },
        }
    }
}

/// A host path as it is, a place inside a sandbox root as the sandbox sees it.
impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Host(p) => write!(f, "{}", p.display()),
            Place::Inside { rel, .. } => write!(f, "{}", Path::new("/").join(rel).display()),
        }
    }
}

/// `/proc/self/fd/N` of an open descriptor: handed to `mount(2)` or
/// `chown(2)`, it reaches exactly the inode the descriptor holds.
pub fn fd_path(fd: impl AsFd) -> String {
    format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())
}

/// What [`walk`] does about a missing directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    Fail,
    /// Make it, with this mode.
    Create(u32),
}

/// Opens the directory `rel` beneath `root`. Returns it and whether its last
/// component was made here. `op` says what for, for the errors.
pub fn walk(root: &Path, rel: &Path, missing: Missing, op: &'static str) -> Result<(OwnedFd, bool)> {
    let target = in_sandbox(rel);
    let mut dir = open_root(root)?;
    let mut made = false;
    let mut seen = PathBuf::from("/");
    for name in names(rel, op, &target)? {
        seen.push(&name);
        made = false;
        let cname = cname(&name, op, &target)?;
        let opened = match (fsat::open_dir_at(&dir, &cname), missing) {
            (Err(e), Missing::Create(mode)) if e.kind() == io::ErrorKind::NotFound => {
                match fsat::mkdir_at(&dir, &cname, mode) {
                    Ok(()) => made = true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(Error::Io(format!("{op} {target}: create {}", seen.display()), e)),
                }
                fsat::open_dir_at(&dir, &cname)
            }
            (r, _) => r,
        };
        let next = opened.map_err(|e| blocked(&dir, &cname, e, op, &target, &seen))?;
        expect_kind(&next, Kind::Dir, op, &target, &seen)?;
        dir = next;
    }
    Ok((dir, made))
}

/// The directory holding `rel` beneath `root` (which must all exist), and
/// the last name of `rel`. What that name is has not been looked at.
pub fn parent(root: &Path, rel: &Path, op: &'static str) -> Result<(OwnedFd, CString, PathBuf)> {
    let target = in_sandbox(rel);
    let mut names = names(rel, op, &target)?;
    let last = names.pop().ok_or_else(|| Error::Io(format!("{op} {target}"), io::Error::from(io::ErrorKind::InvalidInput)))?;
    let dir_rel: PathBuf = names.iter().collect();
    let (dir, _) = walk(root, &dir_rel, Missing::Fail, op)?;
    let cname = cname(&last, op, &target)?;
    Ok((dir, cname, Path::new("/").join(rel)))
}

/// Opens `rel` beneath `root` with `O_PATH`, for a mount to go onto: a
/// directory or a regular file, never a symlink.
pub fn mount_target(root: &Path, rel: &Path, op: &'static str) -> Result<OwnedFd> {
    if names(rel, op, &in_sandbox(rel))?.is_empty() {
        return open_root(root);
    }
    let (dir, name, seen) = parent(root, rel, op)?;
    let target = seen.display().to_string();
    let fd = fsat::open_at(&dir, &name, OFlags::PATH, 0).map_err(|e| blocked(&dir, &name, e, op, &target, &seen))?;
    let st = fsat::fstat(&fd).map_err(|e| Error::Io(format!("{op} {target}"), e))?;
    match fsat::kind(&st) {
        Kind::Dir | Kind::File => Ok(fd),
        other => Err(wrong_kind(other, op, &target, &seen)),
    }
}

/// Creates (or opens) the regular file `rel` beneath `root`, without
/// following a symlink in its place; a FIFO there does not block the open.
pub fn touch(root: &Path, rel: &Path, op: &'static str) -> Result<OwnedFd> {
    let (dir, name, seen) = parent(root, rel, op)?;
    let target = seen.display().to_string();
    let fd = fsat::open_at(&dir, &name, OFlags::CREATE | OFlags::RDONLY | OFlags::NONBLOCK, 0o644)
        .map_err(|e| blocked(&dir, &name, e, op, &target, &seen))?;
    expect_kind(&fd, Kind::File, op, &target, &seen)?;
    Ok(fd)
}

/// The root is a path the daemon owns (or `.`); only its last component
/// must not be a link.
fn open_root(root: &Path) -> Result<OwnedFd> {
    fsat::open_dir(root).map_err(|e| Error::Io(format!("open sandbox root {}", root.display()), e))
}

/// The plain names of `rel`; `..` or a root is refused (nothing the daemon
/// asks for has one).
fn names(rel: &Path, op: &'static str, target: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(PathBuf::from(n)),
            Component::CurDir => {}
            _ => {
                let e = io::Error::new(io::ErrorKind::InvalidInput, "only plain names below the sandbox root");
                return Err(Error::Io(format!("{op} {target}"), e));
            }
        }
    }
    Ok(out)
}

fn cname(name: &Path, op: &'static str, target: &str) -> Result<CString> {
    fsat::cstr(name.as_os_str()).map_err(|e| Error::Io(format!("{op} {target}"), e))
}

fn in_sandbox(rel: &Path) -> String {
    Path::new("/").join(rel).display().to_string()
}

fn expect_kind(fd: &OwnedFd, want: Kind, op: &'static str, target: &str, seen: &Path) -> Result<()> {
    let st = fsat::fstat(fd).map_err(|e| Error::Io(format!("{op} {target}"), e))?;
    match fsat::kind(&st) {
        k if k == want => Ok(()),
        other => Err(wrong_kind(other, op, target, seen)),
    }
}

/// Why opening `name` in `dir` failed: a symlink or another wrong kind of
/// entry is named as such; anything else is passed on.
fn blocked(dir: &OwnedFd, name: &CString, err: io::Error, op: &'static str, target: &str, seen: &Path) -> Error {
    let wrong_type = [rustix::io::Errno::LOOP, rustix::io::Errno::NOTDIR].iter().any(|n| err.raw_os_error() == Some(n.raw_os_error()));
    if wrong_type {
        if let Ok(st) = fsat::lstat_at(dir, name) {
            return wrong_kind(fsat::kind(&st), op, target, seen);
        }
    }
    Error::Io(format!("{op} {target}: {}", seen.display()), err)
}

fn wrong_kind(kind: Kind, op: &'static str, target: &str, seen: &Path) -> Error {
    let what = match kind {
        Kind::Symlink => return Error::RootSymlink { op, target: target.to_owned(), link: seen.display().to_string() },
        Kind::File => "a regular file",
        Kind::Dir => "a directory",
        Kind::CharDevice { .. } => "a character device",
        Kind::BlockDevice => "a block device",
        Kind::Fifo => "a FIFO",
        Kind::Socket => "a socket",
    };
    let e = io::Error::new(io::ErrorKind::InvalidInput, format!("{} is {what}", seen.display()));
    Error::Io(format!("{op} {target} in the sandbox root"), e)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::rootfs::fixture::tree;

    fn is_link_error(e: &Error, link: &str) -> bool {
        matches!(e, Error::RootSymlink { link: l, .. } if l == link)
    }

    #[test]
    fn walks_and_makes_plain_directories() {
        let t = tree();
        let (fd, made) = walk(&t.root, Path::new("d/x/y"), Missing::Create(0o750), "test").unwrap();
        assert!(made);
        let st = fsat::fstat(&fd).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o750);
        assert!(t.root.join("d/x/y").is_dir());
        let (_, made) = walk(&t.root, Path::new("d/x/y"), Missing::Create(0o750), "test").unwrap();
        assert!(!made, "an existing directory is not made again");
        assert!(walk(&t.root, Path::new("d/missing"), Missing::Fail, "test").is_err());
        walk(&t.root, Path::new(""), Missing::Fail, "test").unwrap();
    }

    #[test]
    fn never_walks_through_a_symlink() {
        let t = tree();
        let e = walk(&t.root, Path::new("l/sub"), Missing::Create(0o755), "test").unwrap_err();
        assert!(is_link_error(&e, "/l"), "{e}");
        assert!(e.to_string().contains("/l is a symlink"), "{e}");
        let e = walk(&t.root, Path::new("dangling"), Missing::Create(0o755), "test").unwrap_err();
        assert!(is_link_error(&e, "/dangling"), "{e}");
        let e = walk(&t.root, Path::new("f/sub"), Missing::Create(0o755), "test").unwrap_err();
        assert!(e.to_string().contains("/f is a regular file"), "{e}");
        assert!(walk(&t.root, Path::new("d/../l"), Missing::Create(0o755), "test").is_err(), "no ..");
        t.host_untouched();
    }

    #[test]
    fn a_leading_dot_is_a_plain_walk_and_errors_name_the_whole_target() {
        let t = tree();
        walk(&t.root, Path::new("./d"), Missing::Fail, "test").unwrap();
        let e = walk(&t.root, Path::new("l/sub"), Missing::Create(0o755), "test").unwrap_err();
        assert!(matches!(&e, Error::RootSymlink { op: "test", target, link } if target == "/l/sub" && link == "/l"), "{e:?}");
        t.host_untouched();
    }

    #[test]
    fn a_fifo_in_the_place_is_refused_without_blocking() {
        let t = tree();
        nix::unistd::mkfifo(&t.root.join("d/pipe"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        // Opened without O_NONBLOCK, the FIFO would wait for a writer.
        let e = touch(&t.root, Path::new("d/pipe"), "test").unwrap_err();
        assert!(e.to_string().contains("/d/pipe is a FIFO"), "{e}");
        // Positive control: a regular file in the same place is taken.
        std::fs::write(t.root.join("d/file"), "").unwrap();
        touch(&t.root, Path::new("d/file"), "test").unwrap();
        t.host_untouched();
    }

    #[test]
    fn touches_and_resolves_mount_targets_without_following() {
        let t = tree();
        touch(&t.root, Path::new("d/node"), "test").unwrap();
        assert!(t.root.join("d/node").is_file());
        assert!(is_link_error(&touch(&t.root, Path::new("dangling"), "test").unwrap_err(), "/dangling"));
        assert!(is_link_error(&touch(&t.root, Path::new("l/node"), "test").unwrap_err(), "/l"));
        assert!(touch(&t.root, Path::new("d"), "test").is_err(), "a directory is no file to bind onto");

        for ok in ["d", "f", "d/node", ""] {
            mount_target(&t.root, Path::new(ok), "test").unwrap();
        }
        assert!(is_link_error(&mount_target(&t.root, Path::new("l"), "test").unwrap_err(), "/l"));
        assert!(is_link_error(&mount_target(&t.root, Path::new("l/marker"), "test").unwrap_err(), "/l"));
        assert!(mount_target(&t.root, Path::new("missing"), "test").is_err());
        t.host_untouched();
    }
}
