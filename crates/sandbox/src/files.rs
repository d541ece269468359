//! Reading and writing files inside a sandbox from the daemon (host root),
//! for `cairn cp` and deliveries, without ever touching a host path.
//!
//! Paths are resolved one component at a time from a descriptor of the
//! sandbox's root with `cairn_fsat` (`O_NOFOLLOW`, types from `fstat` on
//! what was opened): a symlink is read and its target resolved with the
//! sandbox's root as `/`, and a `..` that would climb above that root is
//! refused rather than clamped, so a link that "points out" is an error,
//! never a host path. The kernel filesystems (`/proc`, `/sys`, `/dev/pts`)
//! and device nodes are refused: through them the daemon's privileges would
//! reach the host.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use cairn_fsat::{self as fsat, OFlags};

use crate::{Error, Result};

const MAX_SYMLINKS: usize = 40;
/// Trees nested deeper are refused: the walk holds a descriptor per level.
const MAX_DEPTH: usize = 256;

fn too_deep(at: &Path) -> Error {
    Error::Io(at.display().to_string(), io::Error::other(format!("nested more than {MAX_DEPTH} directories deep")))
}

/// Owner given to everything the daemon creates in a sandbox.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// What copying a tree out of a sandbox does with the symlinks in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkPolicy {
    /// A link whose target is absolute or leaves the copied tree is refused:
    /// planted on the host, a later write there would follow it.
    #[default]
    Refuse,
    /// Links are copied as they are.
    Keep,
    /// What a link points to is copied instead, resolved inside the sandbox.
    Follow,
}

impl LinkPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkPolicy::Refuse => "refuse",
            LinkPolicy::Keep => "keep",
            LinkPolicy::Follow => "follow",
        }
    }

    pub fn parse(s: &str) -> Option<LinkPolicy> {
        match s {
            "refuse" => Some(LinkPolicy::Refuse),
            "keep" => Some(LinkPolicy::Keep),
            "follow" => Some(LinkPolicy::Follow),
            _ => None,
        }
    }
}

/// The sandbox's root directory, opened from `/proc/PID/root`.
#[derive(Debug)]
pub struct SandboxRoot {
    root: OwnedFd,
}

/// Splits a user-given absolute in-sandbox path into normal components.
/// `..` is refused outright: a cp target is named from the root. A path is
/// bytes, as a Linux name is; it need not be UTF-8.
pub fn components(path: impl AsRef<OsStr>) -> Result<Vec<OsString>> {
    let path = path.as_ref();
    let p = Path::new(path);
    if !p.is_absolute() || path.as_bytes().contains(&0) {
        return Err(Error::PathEscape(shown(path)));
    }
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n.to_owned()),
            Component::ParentDir | Component::Prefix(_) => return Err(Error::PathEscape(shown(path))),
        }
    }
    Ok(out)
}

/// A sandbox path as messages show it: bytes that are not UTF-8 as `\xNN`.
pub fn shown(path: &OsStr) -> String {
    cairn_core::name::escaped(path.as_bytes()).into_owned()
}

fn cstr(name: &OsStr) -> Result<CString> {
    fsat::cstr(name).map_err(|_| Error::PathEscape(name.to_string_lossy().into_owned()))
}

/// A resolved parent directory and the final name in it.
#[derive(Debug)]
pub struct Located {
    pub dir: OwnedFd,
    pub name: OsString,
    /// The path as resolved inside the sandbox (for messages).
    pub resolved: PathBuf,
}

impl SandboxRoot {
    pub fn new(root: OwnedFd) -> SandboxRoot {
        SandboxRoot { root }
    }

    fn dup_root(&self) -> Result<OwnedFd> {
        self.root.try_clone().map_err(|e| Error::Io("dup sandbox root".into(), e))
    }

    /// Resolves every component but the last, following symlinks inside the
    /// sandbox. The root itself (`/`) has no final name and is refused.
    pub fn locate(&self, path: impl AsRef<OsStr>) -> Result<Located> {
        let path = path.as_ref();
        let orig = shown(path);
        let mut comps = components(path)?;
        let name = comps.pop().ok_or_else(|| Error::PathEscape(orig.clone()))?;
        let (dir, resolved) = self.walk(&orig, comps, None)?;
        check_fs(&dir, &orig)?;
        Ok(Located { dir, resolved: resolved.join(&name), name })
    }

    /// Resolves the whole path, following a final symlink too, to a
    /// directory.
    pub fn resolve(&self, path: impl AsRef<OsStr>) -> Result<(OwnedFd, PathBuf)> {
        let path = path.as_ref();
        let orig = shown(path);
        let (fd, p) = self.walk(&orig, components(path)?, None)?;
        check_fs(&fd, &orig)?;
        Ok((fd, p))
    }

    /// Makes the directories above `path`'s last component that are
    /// missing (all of its components when it ends in `/`), as `mkdir -p`
    /// does: mode 0755, owned by `owner`. Each is made with `mkdirat` in
    /// the directory the walk holds open and then walked into like any
    /// other step, so a name swapped for a link meanwhile is resolved
    /// inside the sandbox, never on the host.
    pub fn make_parents(&self, path: impl AsRef<OsStr>, owner: Owner) -> Result<()> {
        let path = path.as_ref();
        let mut comps = components(path)?;
        if !path.as_bytes().ends_with(b"/") {
            comps.pop();
        }
        self.walk(&shown(path), comps, Some(owner)).map(drop)
    }

    /// Like [`Self::locate`], but a final symlink is followed (inside the
    /// sandbox) until the name is not one.
    pub fn locate_following(&self, path: impl AsRef<OsStr>) -> Result<Located> {
        let mut path = PathBuf::from(path.as_ref());
        for _ in 0..MAX_SYMLINKS {
            let l = self.locate(&path)?;
            if kind_at(&l.dir, &l.name)? != Kind::Symlink {
                return Ok(l);
            }
            let orig = shown(path.as_os_str());
            let target = PathBuf::from(OsString::from_vec(fsat::readlink_at(&l.dir, &cstr(&l.name)?).map_err(|e| io_err(&orig, e))?));
            let parent = l.resolved.parent().unwrap_or(Path::new("/")).to_owned();
            path = lexical(&parent.join(target)).ok_or_else(|| Error::PathEscape(orig.clone()))?;
        }
        Err(io_err(&shown(path.as_os_str()), io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error())))
    }

    /// Walks `comps` from the root; each step is one `openat(O_NOFOLLOW)`.
    /// With `make`, a missing directory is made first (owned by it).
    fn walk(&self, orig: &str, comps: Vec<OsString>, make: Option<Owner>) -> Result<(OwnedFd, PathBuf)> {
        // A stack of pending components (reversed) so symlink targets can be
        // spliced in front.
        let mut pending: Vec<OsString> = comps.into_iter().rev().collect();
        let mut stack: Vec<(OwnedFd, OsString)> = Vec::new();
        let mut cur = self.dup_root()?;
        let mut links = 0;
        let escape = || Error::PathEscape(orig.to_owned());
        while let Some(c) = pending.pop() {
            if c == "." || c.is_empty() {
                continue;
            }
            if c == ".." {
                // Climbing above the sandbox root is an escape, not a clamp.
                let (parent, _) = stack.pop().ok_or_else(escape)?;
                cur = parent;
                continue;
            }
            let name = cstr(&c)?;
            let next = match (fsat::open_at(&cur, &name, OFlags::PATH, 0), make) {
                (Err(e), Some(owner)) if e.kind() == io::ErrorKind::NotFound => {
                    make_dir(&cur, &name, owner, orig)?;
                    fsat::open_at(&cur, &name, OFlags::PATH, 0).map_err(|e| io_err(orig, e))?
                }
                (opened, _) => opened.map_err(|e| io_err(orig, e))?,
            };
            let st = fsat::fstat(&next).map_err(|e| io_err(orig, e))?;
            match fsat::kind(&st) {
                fsat::Kind::Symlink => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(io_err(orig, io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error())));
                    }
                    // The link read is the one opened: readlink of an O_PATH
                    // descriptor with an empty name.
                    let target = fsat::readlink_fd(&next).map_err(|e| io_err(orig, e))?;
                    let tp = Path::new(OsStr::from_bytes(&target));
                    if tp.is_absolute() {
                        stack.clear();
                        cur = self.dup_root()?;
                    }
                    for comp in tp.components().rev() {
                        match comp {
                            Component::Normal(n) => pending.push(n.to_owned()),
                            Component::ParentDir => pending.push("..".into()),
                            _ => {}
                        }
                    }
                }
                fsat::Kind::Dir => {
                    let prev = std::mem::replace(&mut cur, next);
                    stack.push((prev, c));
                }
                _ => return Err(io_err(orig, io::Error::from_raw_os_error(rustix::io::Errno::NOTDIR.raw_os_error()))),
            }
        }
        let resolved: PathBuf = std::iter::once(OsString::from("/")).chain(stack.iter().map(|(_, n)| n.clone())).collect();
        Ok((cur, resolved))
    }
}

/// Makes directory `name` in `dir` for [`SandboxRoot::make_parents`]
/// (one made meanwhile by someone else is fine) and gives it to `owner`.
/// Only a directory this call made is chowned: it is opened without
/// following a link, and must still be owned by the daemon's uid, which
/// nothing in the sandbox can make; a name swapped meanwhile is left as
/// it is, and the walk resolves it as any other.
fn make_dir(dir: &OwnedFd, name: &CStr, owner: Owner, orig: &str) -> Result<()> {
    check_fs(dir, orig)?;
    match fsat::mkdir_at(dir, name, 0o755) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(io_err(orig, e)),
    }
    let Ok(made) = fsat::open_dir_at(dir, name) else { return Ok(()) };
    let ours = fsat::fstat(&made).map_err(|e| io_err(orig, e))?.st_uid == rustix::process::geteuid().as_raw();
    if ours {
        fsat::fchown(&made, owner.uid, owner.gid).map_err(|e| io_err(orig, e))?;
    }
    Ok(())
}

/// `path` with `.` and `..` applied lexically; `None` when `..` climbs
/// above `/`.
fn lexical(path: &Path) -> Option<PathBuf> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop()?;
            }
            _ => {}
        }
    }
    Some(std::iter::once(OsStr::new("/")).chain(out).collect())
}

fn io_err(path: &str, e: io::Error) -> Error {
    Error::Io(format!("sandbox path {path}"), in_the_sandbox(e))
}

/// A missing path, said as such: not `entity not found` nor `os error 2`,
/// which read as if something on this host were missing.
pub fn in_the_sandbox(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound {
        io::Error::new(io::ErrorKind::NotFound, "no such file or directory in the sandbox")
    } else {
        e
    }
}

/// Refuses the kernel's pseudo filesystems.
fn check_fs(fd: &OwnedFd, path: &str) -> Result<()> {
    if fsat::is_kernel_fs(fd).map_err(|e| io_err(path, e))? {
        return Err(Error::Io(
            format!("sandbox path {path}"),
            io::Error::new(io::ErrorKind::PermissionDenied, "kernel filesystems cannot be copied to or from"),
        ));
    }
    Ok(())
}

/// What a path in the sandbox is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Missing,
    File,
    Dir,
    Symlink,
    Other,
}

/// The kind of `name` in `dir`, without following a symlink.
pub fn kind_at(dir: &OwnedFd, name: &OsStr) -> Result<Kind> {
    let c = cstr(name)?;
    match fsat::lstat_at(dir, &c) {
        Ok(st) => Ok(match fsat::kind(&st) {
            fsat::Kind::File => Kind::File,
            fsat::Kind::Dir => Kind::Dir,
            fsat::Kind::Symlink => Kind::Symlink,
            _ => Kind::Other,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(e) => Err(Error::Io(format!("stat {}", name.to_string_lossy()), e)),
    }
}

/// One entry of a directory listing, as `lstat` saw it: a symlink is listed
/// with its target, never followed.
#[derive(Debug)]
pub struct Listed {
    pub name: OsString,
    pub kind: Kind,
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub mtime_ms: i64,
    pub link_target: Option<OsString>,
}

/// The entries of the directory `dir` (a descriptor, `O_PATH` or not, that
/// the caller resolved beneath the sandbox root), sorted by name: at most
/// `limit`, and whether some were left out. An entry that vanishes while it
/// is read is skipped.
pub fn list_dir(dir: &OwnedFd, limit: usize) -> Result<(Vec<Listed>, bool)> {
    // Reopened for reading: `.` of the descriptor itself, nothing to follow.
    let dir = fsat::open_beneath(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, 0).map_err(|e| Error::Io("open the directory".into(), e))?;
    let names = fsat::read_dir(&dir).map_err(|e| Error::Io("read the directory".into(), e))?;
    let truncated = names.len() > limit;
    let mut out = Vec::with_capacity(names.len().min(limit));
    for name in names.into_iter().take(limit) {
        let st = match fsat::lstat_at(&dir, &name) {
            Ok(st) => st,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::Io(format!("stat {}", name.to_string_lossy()), e)),
        };
        let kind = match fsat::kind(&st) {
            fsat::Kind::File => Kind::File,
            fsat::Kind::Dir => Kind::Dir,
            fsat::Kind::Symlink => Kind::Symlink,
            _ => Kind::Other,
        };
        let link_target = match kind {
            Kind::Symlink => fsat::readlink_at(&dir, &name).ok().map(OsString::from_vec),
            _ => None,
        };
        out.push(Listed {
            name: OsString::from_vec(name.into_bytes()),
            kind,
            size: st.st_size as u64,
            mode: st.st_mode as u32 & 0o7777,
            mtime_ms: st.st_mtime as i64 * 1000 + st.st_mtime_nsec as i64 / 1_000_000,
            link_target,
        });
    }
    Ok((out, truncated))
}

/// Reads the regular file `name` in `dir` (a final symlink is refused, not
/// followed), at most `limit` bytes.
pub fn read_file(dir: &OwnedFd, name: &OsStr, limit: u64) -> Result<Vec<u8>> {
    let c = cstr(name)?;
    fsat::read_regular_at(dir, &c, limit).map_err(|e| Error::Io(name.to_string_lossy().into_owned(), e))
}

/// How a sandbox subtree is written as a tar stream.
struct TarOut<'a> {
    root: &'a SandboxRoot,
    links: LinkPolicy,
    /// Directories being copied (device, inode), so a followed link back to
    /// one of them is refused instead of copied forever.
    open_dirs: HashSet<(u64, u64)>,
    count: u64,
}

/// Writes a sandbox subtree as a tar stream: `name` in `dir` becomes the top
/// entry `top`; `at` is where it is in the sandbox (to resolve links).
pub fn write_tar(root: &SandboxRoot, l: &Located, top: &Path, links: LinkPolicy, out: impl Write) -> Result<u64> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut t = TarOut { root, links, open_dirs: HashSet::new(), count: 0 };
    t.add(&mut builder, &l.dir, &l.name, top, &l.resolved, 0)?;
    builder.into_inner().map_err(|e| Error::Io("finish tar".into(), e))?.flush().map_err(|e| Error::Io("flush tar".into(), e))?;
    Ok(t.count)
}

/// The first symlink under `l` that the copy would fail on, as its error:
/// with [`LinkPolicy::Refuse`] one that leads out of the tree, with
/// [`LinkPolicy::Follow`] one whose target does not resolve in the sandbox.
/// Checked before a copy starts so the refusal is a clean answer, not a
/// broken stream (the copy checks each link again as it goes).
pub fn check_links(root: &SandboxRoot, l: &Located, top: &Path, links: LinkPolicy) -> Result<()> {
    fn visit(root: &SandboxRoot, dir: &OwnedFd, name: &OsStr, at: &Path, in_sandbox: &Path, depth: usize, links: LinkPolicy) -> Result<()> {
        match kind_at(dir, name)? {
            Kind::Symlink => match links {
                LinkPolicy::Keep => Ok(()),
                LinkPolicy::Refuse => {
                    let target = fsat::readlink_at(dir, &cstr(name)?).map_err(|e| io_err(&at.to_string_lossy(), e))?;
                    refuse_escaping(at, &target, depth)
                }
                LinkPolicy::Follow => root.locate_following(in_sandbox).map(drop),
            },
            Kind::Dir => {
                if depth > MAX_DEPTH {
                    return Err(too_deep(at));
                }
                let Ok(fd) = fsat::open_dir_at(dir, &cstr(name)?) else { return Ok(()) };
                for child in fsat::read_dir(&fd).map_err(|e| io_err(&at.to_string_lossy(), e))? {
                    let child = OsString::from_vec(child.into_bytes());
                    visit(root, &fd, &child, &at.join(&child), &in_sandbox.join(&child), depth + 1, links)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
    visit(root, &l.dir, &l.name, top, &l.resolved, 0, links)
}

/// Refuses a link at depth `depth` below the copied tree's top whose target
/// is absolute or climbs out of the tree.
fn refuse_escaping(at: &Path, target: &[u8], depth: usize) -> Result<()> {
    let tp = Path::new(OsStr::from_bytes(target));
    // The link's own directory is level depth - 1 (the top's parent is -1).
    let mut level = depth as isize - 1;
    let mut leaves = tp.is_absolute() || level < 0;
    for c in tp.components() {
        match c {
            Component::ParentDir => {
                level -= 1;
                leaves |= level < 0;
            }
            Component::Normal(_) => level += 1,
            _ => {}
        }
    }
    if leaves {
        return Err(Error::LinkOut(at.display().to_string(), String::from_utf8_lossy(target).into_owned()));
    }
    Ok(())
}

impl TarOut<'_> {
    fn add<W: Write>(&mut self, b: &mut tar::Builder<W>, dir: &OwnedFd, name: &OsStr, at: &Path, in_sandbox: &Path, depth: usize) -> Result<()> {
        let io = |e: io::Error| Error::Io(format!("read {}", at.display()), e);
        let c = cstr(name)?;
        let st = match fsat::lstat_at(dir, &c) {
            Ok(st) => st,
            Err(e) => return Err(io(e)),
        };
        let mut header = tar::Header::new_gnu();
        match fsat::kind(&st) {
            fsat::Kind::Symlink => {
                let target = fsat::readlink_at(dir, &c).map_err(io)?;
                match self.links {
                    LinkPolicy::Keep => {}
                    LinkPolicy::Refuse => refuse_escaping(at, &target, depth)?,
                    LinkPolicy::Follow => {
                        let to = self.root.locate_following(in_sandbox)?;
                        return self.add(b, &to.dir, &to.name, at, &to.resolved, depth);
                    }
                }
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                header.set_mode(0o777);
                b.append_link(&mut header, at, Path::new(OsStr::from_bytes(&target))).map_err(io)?;
            }
            fsat::Kind::File => {
                // Opened without following and checked again on the
                // descriptor: the name may have been swapped since the lstat.
                let file = fsat::open_regular_at(dir, &c).map_err(io)?;
                let st = fsat::fstat(&file).map_err(io)?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(st.st_size as u64);
                header.set_mode(st.st_mode & 0o7777);
                header.set_mtime(st.st_mtime.max(0) as u64);
                b.append_data(&mut header, at, file.take(st.st_size as u64)).map_err(io)?;
            }
            fsat::Kind::Dir => {
                if depth > MAX_DEPTH {
                    return Err(too_deep(at));
                }
                let fd = fsat::open_dir_at(dir, &c).map_err(io)?;
                check_fs(&fd, &at.to_string_lossy())?;
                let st = fsat::fstat(&fd).map_err(io)?;
                let key = (st.st_dev, st.st_ino);
                if !self.open_dirs.insert(key) {
                    return Err(Error::Io(at.display().to_string(), io::Error::other("a followed link leads back into a directory being copied")));
                }
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                header.set_mode(st.st_mode & 0o7777);
                header.set_mtime(st.st_mtime.max(0) as u64);
                b.append_data(&mut header, at, io::empty()).map_err(io)?;
                for child in fsat::read_dir(&fd).map_err(io)? {
                    let child = OsString::from_vec(child.into_bytes());
                    self.add(b, &fd, &child, &at.join(&child), &in_sandbox.join(&child), depth + 1)?;
                }
                self.open_dirs.remove(&key);
            }
            _ => return Ok(()), // device nodes, fifos, sockets: skipped
        }
        self.count += 1;
        Ok(())
    }
}

/// `cp` in: unpacks a tar whose top entry is `name` at sandbox path `path`,
/// into `path/name` when `path` is a directory (a final link resolved inside
/// the sandbox), else as `path`. Missing directories on the way are made
/// (all of `path` when it ends in `/`, which must then be a directory).
/// The directory is opened once and written through that descriptor, so a
/// swap after the check cannot redirect the copy. Returns the entries
/// written and where, as resolved in the sandbox.
pub fn copy_in(root: &SandboxRoot, path: impl AsRef<OsStr>, name: &OsStr, input: impl Read, owner: Owner) -> Result<(u64, PathBuf)> {
    let path = path.as_ref();
    root.make_parents(path, owner)?;
    let l = root.locate_following(path)?;
    let orig = shown(path);
    let path_err = |e: io::Error| io_err(&orig, e);
    let not_there = |e: &io::Error| e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error());
    match fsat::open_dir_at(&l.dir, &cstr(&l.name)?) {
        Ok(dir) => Ok((read_tar(&dir, name, input, owner, &l.resolved)?, l.resolved.join(name))),
        Err(e) if not_there(&e) && path.as_bytes().ends_with(b"/") => {
            Err(path_err(io::Error::new(io::ErrorKind::NotADirectory, "not a directory (the path ends in /)")))
        }
        Err(e) if not_there(&e) => {
            let parent = l.resolved.parent().unwrap_or(Path::new("/")).to_owned();
            Ok((read_tar(&l.dir, &l.name, input, owner, &parent)?, l.resolved))
        }
        Err(e) => Err(path_err(e)),
    }
}

/// Unpacks a tar stream into `dir` (sandbox path `at`, for messages): its
/// top entry is renamed to `name`. Every entry is created relative to
/// descriptors opened under `dir`, with `O_NOFOLLOW`; entries with absolute
/// paths or `..` are refused; device nodes are skipped; everything created
/// is owned by `owner`. A file whose content cannot be written whole (a
/// full disk) is removed again, and the error names it as the sandbox
/// sees it.
pub fn read_tar(dir: &OwnedFd, name: &OsStr, input: impl Read, owner: Owner, at: &Path) -> Result<u64> {
    let mut archive = tar::Archive::new(input);
    let mut count = 0;
    let mut top: Option<OsString> = None;
    let entries = archive.entries().map_err(|e| Error::Io("read tar".into(), e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| Error::Io("read tar".into(), e))?;
        let raw = entry.path_bytes().into_owned();
        let path_str = String::from_utf8_lossy(&raw).into_owned();
        let rel = Path::new(OsStr::from_bytes(&raw));
        let mut comps: Vec<OsString> = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => comps.push(n.to_owned()),
                Component::CurDir => {}
                _ => return Err(Error::PathEscape(path_str)),
            }
        }
        let Some(first) = comps.first().cloned() else { continue };
        match &top {
            None => top = Some(first.clone()),
            Some(t) if *t != first => return Err(Error::Protocol(format!("tar entry {path_str:?} is outside the copied tree"))),
            _ => {}
        }
        comps[0] = name.to_owned();
        let leaf = comps.pop().ok_or_else(|| Error::PathEscape(path_str.clone()))?;
        let leaf_c = cstr(&leaf)?;
        // Parents must be real directories created by this copy or already there.
        let mut cur = dir.try_clone().map_err(|e| Error::Io("dup dir".into(), e))?;
        for c in &comps {
            cur = fsat::open_dir_at(&cur, &cstr(c)?).map_err(|e| Error::Io(format!("open parent of {path_str}"), e))?;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let shown = comps.iter().fold(at.to_owned(), |p, c| p.join(c)).join(&leaf);
        let ioe = |e: io::Error| Error::Io(format!("write {} in the sandbox", shown.display()), e);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                if let Err(e) = fsat::mkdir_at(&cur, &leaf_c, mode) {
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(ioe(e));
                    }
                }
                // An existing symlink of that name fails here (ELOOP/ENOTDIR).
                let d = fsat::open_dir_at(&cur, &leaf_c).map_err(ioe)?;
                fsat::fchown(&d, owner.uid, owner.gid).map_err(ioe)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if kind_at(&cur, &leaf)? == Kind::Symlink {
                    return Err(Error::PathEscape(format!("{path_str} (is a symlink in the sandbox)")));
                }
                // Truncated only once fstat says it is a regular file.
                let f = fsat::open_at(&cur, &leaf_c, OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK, mode).map_err(ioe)?;
                if fsat::kind(&fsat::fstat(&f).map_err(ioe)?) != fsat::Kind::File {
                    return Err(ioe(io::Error::other("not a regular file")));
                }
                fsat::fchown(&f, owner.uid, owner.gid).map_err(ioe)?;
                let mut file = File::from(f);
                file.set_len(0).map_err(ioe)?;
                if let Err(e) = io::copy(&mut entry, &mut file) {
                    remove_partial(&cur, &leaf_c, &file);
                    return Err(ioe(e));
                }
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| ioe(io::Error::other("symlink without target")))?;
                let t = CString::new(target.into_owned()).map_err(|_| ioe(io::Error::other("NUL in link")))?;
                fsat::symlink_at(&t, &cur, &leaf_c).map_err(ioe)?;
                fsat::chown_at(&cur, &leaf_c, owner.uid, owner.gid).map_err(ioe)?;
            }
            _ => continue, // hard links, devices, fifos: not copied
        }
        count += 1;
    }
    Ok(count)
}

/// Removes `name` from `dir` if it is still the file `written` (a name the
/// agent swapped meanwhile is left alone): a copy cut short leaves no
/// partial file.
fn remove_partial(dir: &OwnedFd, name: &CStr, written: &File) {
    let (Ok(now), Ok(ours)) = (fsat::lstat_at(dir, name), fsat::fstat(written)) else { return };
    if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino) {
        let _ = fsat::unlink_at(dir, name, false);
    }
}

/// Whether `fd` is the daemon's own root directory: a sandbox root must
/// never be (a recycled pid would make `/proc/PID/root` the host's).
pub fn is_host_root(fd: impl AsFd) -> io::Result<bool> {
    let host = fsat::fstat(fsat::open_dir(Path::new("/"))?)?;
    let st = fsat::fstat(fd)?;
    Ok((st.st_dev, st.st_ino) == (host.st_dev, host.st_ino))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn root_of(dir: &Path) -> SandboxRoot {
        SandboxRoot::new(File::open(dir).unwrap().into())
    }

    #[test]
    fn symlinks_resolve_inside_and_escapes_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::create_dir_all(r.join("run")).unwrap();
        std::fs::create_dir_all(r.join("var")).unwrap();
        symlink("/run", r.join("var/run")).unwrap(); // absolute, like Debian's
        symlink(outside.path(), r.join("out")).unwrap(); // points at a host dir
        symlink("../../../../../../..", r.join("up")).unwrap();
        let root = root_of(r);
        // Absolute targets are taken relative to the sandbox root.
        let l = root.locate("/var/run/x").unwrap();
        assert_eq!(l.resolved, Path::new("/run/x"));
        // A host path named by a link is looked up inside the sandbox (and
        // is not there), never on the host.
        let err = root.locate("/out/x").unwrap_err().to_string();
        assert!(err.contains("no such file or directory in the sandbox"), "{err}");
        assert!(matches!(root.locate("/up/etc/passwd"), Err(Error::PathEscape(_))));
        assert!(matches!(root.locate("/../etc/passwd"), Err(Error::PathEscape(_))));
        assert!(matches!(root.locate("relative"), Err(Error::PathEscape(_))));
        // Positive control: a plain path resolves.
        assert_eq!(root.locate("/etc/hosts").unwrap().resolved, Path::new("/etc/hosts"));
    }

    #[test]
    fn missing_parents_are_made_inside_the_root_and_a_link_on_the_way_stays_inside() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir(r.join("w")).unwrap();
        std::fs::write(r.join("w/file"), b"x").unwrap();
        symlink(outside.path(), r.join("w/out")).unwrap(); // names a host directory
        let root = root_of(r);
        let me = Owner { uid: rustix::process::geteuid().as_raw(), gid: rustix::process::getegid().as_raw() };
        // Made as mkdir -p would; the last component is left to the write.
        root.make_parents("/w/a/b/c.txt", me).unwrap();
        let made = std::fs::metadata(r.join("w/a/b")).unwrap();
        assert!(made.is_dir() && made.permissions().mode() & 0o777 == 0o755, "{made:?}");
        assert_eq!((made.uid(), made.gid()), (me.uid, me.gid));
        assert!(!r.join("w/a/b/c.txt").exists());
        // A trailing / makes the whole path; a second call finds it there.
        root.make_parents("/w/d/e/", me).unwrap();
        root.make_parents("/w/d/e/", me).unwrap();
        assert!(r.join("w/d/e").is_dir());
        // Through a link naming a host path: made inside the sandbox, at
        // the link's target there, and nothing on the host.
        root.make_parents("/w/out/made/f.txt", me).unwrap();
        assert!(r.join(outside.path().strip_prefix("/").unwrap()).join("made").is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "the host directory is untouched");
        // A file on the way is no directory: refused, nothing made below it.
        let err = root.make_parents("/w/file/g/h.txt", me).unwrap_err().to_string();
        assert!(err.contains("sandbox path /w/file/g/h.txt"), "{err}");
        assert!(matches!(root.make_parents("/w/../../x/y", me), Err(Error::PathEscape(_))));
    }

    fn tar_names(buf: &[u8]) -> Vec<(String, Option<String>)> {
        tar::Archive::new(buf)
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.link_name().unwrap().map(|l| l.display().to_string()))
            })
            .collect()
    }

    #[test]
    fn tar_round_trip_and_refusals() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("src/sub")).unwrap();
        std::fs::write(r.join("src/a.txt"), b"alpha").unwrap();
        std::fs::write(r.join("src/sub/b.txt"), b"beta").unwrap();
        symlink("a.txt", r.join("src/link")).unwrap();
        let root = root_of(r);
        let l = root.locate("/src").unwrap();
        let mut buf = Vec::new();
        assert_eq!(write_tar(&root, &l, Path::new("src"), LinkPolicy::Refuse, &mut buf).unwrap(), 5);
        let owner = Owner { uid: 4242, gid: 4243 };
        let dst = root.locate("/copy").unwrap();
        assert_eq!(read_tar(&dst.dir, &dst.name, &buf[..], owner, Path::new("/")).unwrap(), 5);
        assert_eq!(std::fs::read(r.join("copy/sub/b.txt")).unwrap(), b"beta");
        assert_eq!(std::fs::read_link(r.join("copy/link")).unwrap(), Path::new("a.txt"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(r.join("copy/a.txt")).unwrap().uid(), 4242);
        assert_eq!(std::fs::symlink_metadata(r.join("copy/link")).unwrap().uid(), 4242);

        // A file written through an existing symlink is refused.
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path().join("victim"), r.join("trap")).unwrap();
        let mut one = Vec::new();
        {
            let mut b = tar::Builder::new(&mut one);
            let mut h = tar::Header::new_gnu();
            h.set_size(3);
            h.set_mode(0o644);
            b.append_data(&mut h, "f", &b"bad"[..]).unwrap();
            b.finish().unwrap();
        }
        let trap = root.locate("/trap").unwrap();
        assert!(matches!(read_tar(&trap.dir, &trap.name, &one[..], owner, Path::new("/")), Err(Error::PathEscape(_))));
        assert!(!outside.path().join("victim").exists(), "nothing written outside");
        let ok = root.locate("/fine").unwrap();
        read_tar(&ok.dir, &ok.name, &one[..], owner, Path::new("/")).unwrap();
        assert_eq!(std::fs::read(r.join("fine")).unwrap(), b"bad");
    }

    #[test]
    fn links_out_of_the_copied_tree_are_refused_kept_or_followed() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("w/tree/sub")).unwrap();
        std::fs::create_dir_all(r.join("w/elsewhere")).unwrap();
        std::fs::write(r.join("w/tree/a"), b"in tree").unwrap();
        std::fs::write(r.join("w/elsewhere/b"), b"in sandbox").unwrap();
        symlink("../a", r.join("w/tree/sub/up-inside")).unwrap();
        let root = root_of(r);
        let l = root.locate("/w/tree").unwrap();
        // Positive control: a link that stays inside the tree is copied.
        let mut buf = Vec::new();
        write_tar(&root, &l, Path::new("tree"), LinkPolicy::Refuse, &mut buf).unwrap();
        check_links(&root, &l, Path::new("tree"), LinkPolicy::Refuse).unwrap();
        assert!(tar_names(&buf).contains(&("tree/sub/up-inside".into(), Some("../a".into()))));

        for (target, name) in [("/etc/passwd", "abs"), ("../../elsewhere/b", "out")] {
            symlink(target, r.join("w/tree/sub").join(name)).unwrap();
            let err = write_tar(&root, &l, Path::new("tree"), LinkPolicy::Refuse, &mut Vec::new()).unwrap_err().to_string();
            assert!(err.contains(&format!("tree/sub/{name}")) && err.contains(target), "{err}");
            assert!(check_links(&root, &l, Path::new("tree"), LinkPolicy::Refuse).is_err());
            std::fs::remove_file(r.join("w/tree/sub").join(name)).unwrap();
        }

        symlink("../../elsewhere/b", r.join("w/tree/sub/out")).unwrap();
        let mut kept = Vec::new();
        write_tar(&root, &l, Path::new("tree"), LinkPolicy::Keep, &mut kept).unwrap();
        assert!(tar_names(&kept).contains(&("tree/sub/out".into(), Some("../../elsewhere/b".into()))));
        let mut followed = Vec::new();
        write_tar(&root, &l, Path::new("tree"), LinkPolicy::Follow, &mut followed).unwrap();
        let mut a = tar::Archive::new(&followed[..]);
        let mut e = a.entries().unwrap().map(|e| e.unwrap()).find(|e| e.path().unwrap() == Path::new("tree/sub/out")).unwrap();
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        assert_eq!(s, "in sandbox");

        // Followed, a link to a host path is looked up inside the sandbox.
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"host").unwrap();
        std::fs::remove_file(r.join("w/tree/sub/out")).unwrap();
        symlink(host.path().join("secret"), r.join("w/tree/sub/out")).unwrap();
        assert!(write_tar(&root, &l, Path::new("tree"), LinkPolicy::Follow, &mut Vec::new()).is_err());
        // And a link back to an enclosing directory is refused, not looped.
        std::fs::remove_file(r.join("w/tree/sub/out")).unwrap();
        symlink("..", r.join("w/tree/sub/loop")).unwrap();
        let err = write_tar(&root, &l, Path::new("tree"), LinkPolicy::Follow, &mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("leads back"), "{err}");
    }

    #[test]
    fn the_host_root_is_recognised() {
        assert!(is_host_root(File::open("/").unwrap()).unwrap());
        let t = tempfile::tempdir().unwrap();
        assert!(!is_host_root(File::open(t.path()).unwrap()).unwrap());
    }

    #[test]
    fn kernel_filesystems_are_refused() {
        let root = SandboxRoot::new(File::open("/").unwrap().into());
        assert!(root.locate("/proc/sys/kernel/core_pattern").is_err());
        assert!(root.locate("/sys/kernel/x").is_err());
        assert!(root.locate("/etc/hostname").is_ok());
    }
}
