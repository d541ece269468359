//! Reading and writing files inside a sandbox from the daemon (host root),
//! for `cairn cp`, without ever touching a host path.
//!
//! Paths are resolved one component at a time from a descriptor of the
//! sandbox's root, with `O_NOFOLLOW`: a symlink is read and its target
//! resolved with the sandbox's root as `/`, and a `..` that would climb above
//! that root is refused rather than clamped, so a link that "points out" is
//! an error, never a host path. The kernel filesystems (`/proc`, `/sys`,
//! `/dev/pts`) and device nodes are refused: through them the daemon's
//! privileges would reach the host.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use crate::{Error, Result};

const MAX_SYMLINKS: usize = 40;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;
const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;
const CGROUP_SUPER_MAGIC: i64 = 0x27e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Owner given to everything the daemon creates in a sandbox.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The sandbox's root directory, opened from `/proc/PID/root`.
#[derive(Debug)]
pub struct SandboxRoot {
    root: OwnedFd,
}

/// Splits a user-given absolute in-sandbox path into normal components.
/// `..` is refused outright: a cp target is named from the root.
pub fn components(path: &str) -> Result<Vec<OsString>> {
    let p = Path::new(path);
    if !p.is_absolute() || path.contains('\0') {
        return Err(Error::PathEscape(path.to_owned()));
    }
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n.to_owned()),
            Component::ParentDir | Component::Prefix(_) => return Err(Error::PathEscape(path.to_owned())),
        }
    }
    Ok(out)
}

fn cstr(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| Error::PathEscape(name.to_string_lossy().into_owned()))
}

fn openat(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid C string and `dir` a descriptor we hold; the
    // result, when valid, is a new descriptor we take ownership of.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NOFOLLOW, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; fstat fills it for a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn fs_magic(fd: RawFd) -> io::Result<i64> {
    // SAFETY: statfs is plain old data.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer.
    if unsafe { libc::fstatfs(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

fn is_type(st: &libc::stat, t: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == t
}

fn readlinkat(dir: RawFd, name: &OsStr) -> io::Result<OsString> {
    let c = CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` has room for PATH_MAX bytes, as passed.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
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
    pub fn locate(&self, path: &str) -> Result<Located> {
        let mut comps = components(path)?;
        let name = comps.pop().ok_or_else(|| Error::PathEscape(path.to_owned()))?;
        let (dir, resolved) = self.walk(path, comps)?;
        check_fs(&dir, path)?;
        Ok(Located { dir, resolved: resolved.join(&name), name })
    }

    /// Resolves the whole path, following a final symlink too.
    pub fn resolve(&self, path: &str) -> Result<(OwnedFd, PathBuf)> {
        let (fd, p) = self.walk(path, components(path)?)?;
        check_fs(&fd, path)?;
        Ok((fd, p))
    }

    /// Walks `comps` from the root; each step is one `openat(O_NOFOLLOW)`.
    fn walk(&self, orig: &str, comps: Vec<OsString>) -> Result<(OwnedFd, PathBuf)> {
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
            let next = openat(cur.as_raw_fd(), &c, libc::O_PATH, 0).map_err(|e| io_err(orig, e))?;
            let st = fstat(next.as_raw_fd()).map_err(|e| io_err(orig, e))?;
            if is_type(&st, libc::S_IFLNK) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io_err(orig, io::Error::from_raw_os_error(libc::ELOOP)));
                }
                let target = readlinkat(cur.as_raw_fd(), &c).map_err(|e| io_err(orig, e))?;
                let tp = Path::new(&target);
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
                continue;
            }
            if !is_type(&st, libc::S_IFDIR) {
                return Err(io_err(orig, io::Error::from_raw_os_error(libc::ENOTDIR)));
            }
            let prev = std::mem::replace(&mut cur, next);
            stack.push((prev, c));
        }
        let resolved: PathBuf = std::iter::once(OsString::from("/")).chain(stack.iter().map(|(_, n)| n.clone())).collect();
        Ok((cur, resolved))
    }
}

fn io_err(path: &str, e: io::Error) -> Error {
    Error::Io(format!("sandbox path {path}"), e)
}

/// Refuses the kernel's pseudo filesystems.
fn check_fs(fd: &OwnedFd, path: &str) -> Result<()> {
    let magic = fs_magic(fd.as_raw_fd()).map_err(|e| io_err(path, e))?;
    if [PROC_SUPER_MAGIC, SYSFS_MAGIC, DEVPTS_SUPER_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC].contains(&magic) {
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
    // SAFETY: stat is plain old data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dir fd, C string and out pointer.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(Kind::Missing);
        }
        return Err(Error::Io(format!("stat {}", name.to_string_lossy()), e));
    }
    Ok(match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    })
}

/// Reads the regular file `name` in `dir` (a final symlink is refused, not
/// followed), at most `limit` bytes.
pub fn read_file(dir: &OwnedFd, name: &OsStr, limit: u64) -> Result<Vec<u8>> {
    let c = cstr(name)?;
    let what = || name.to_string_lossy().into_owned();
    // SAFETY: valid dir fd and C string; the returned fd is owned below.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(Error::Io(format!("open {}", what()), io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = file.metadata().map_err(|e| Error::Io(format!("stat {}", what()), e))?;
    if !meta.is_file() {
        return Err(Error::Io(what(), io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")));
    }
    if meta.len() > limit {
        return Err(Error::Io(what(), io::Error::new(io::ErrorKind::FileTooLarge, format!("{} bytes is over the {limit}-byte limit", meta.len()))));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut data).map_err(|e| Error::Io(format!("read {}", what()), e))?;
    Ok(data)
}

/// Writes a sandbox subtree as a tar stream: `name` becomes the top entry.
pub fn write_tar(dir: &OwnedFd, name: &OsStr, top: &Path, out: impl Write) -> Result<u64> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let mut count = 0;
    add_entry(&mut builder, dir, name, top, &mut count)?;
    builder.into_inner().map_err(|e| Error::Io("finish tar".into(), e))?.flush().map_err(|e| Error::Io("flush tar".into(), e))?;
    Ok(count)
}

fn add_entry<W: Write>(b: &mut tar::Builder<W>, dir: &OwnedFd, name: &OsStr, at: &Path, count: &mut u64) -> Result<()> {
    let io = |e: io::Error| Error::Io(format!("read {}", at.display()), e);
    let kind = kind_at(dir, name)?;
    let mut header = tar::Header::new_gnu();
    match kind {
        Kind::Missing => return Err(io(io::Error::from_raw_os_error(libc::ENOENT))),
        Kind::Other => return Ok(()), // device nodes, fifos, sockets: skipped
        Kind::Symlink => {
            let target = readlinkat(dir.as_raw_fd(), name).map_err(io)?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            header.set_mode(0o777);
            b.append_link(&mut header, at, Path::new(&target)).map_err(io)?;
        }
        Kind::File => {
            let fd = openat(dir.as_raw_fd(), name, libc::O_RDONLY, 0).map_err(io)?;
            let st = fstat(fd.as_raw_fd()).map_err(io)?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(st.st_size as u64);
            header.set_mode(st.st_mode & 0o7777);
            header.set_mtime(st.st_mtime.max(0) as u64);
            b.append_data(&mut header, at, File::from(fd).take(st.st_size as u64)).map_err(io)?;
        }
        Kind::Dir => {
            let fd = openat(dir.as_raw_fd(), name, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(io)?;
            check_fs(&fd, &at.to_string_lossy())?;
            let st = fstat(fd.as_raw_fd()).map_err(io)?;
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            header.set_mode(st.st_mode & 0o7777);
            header.set_mtime(st.st_mtime.max(0) as u64);
            b.append_data(&mut header, at, io::empty()).map_err(io)?;
            for child in list_dir(&fd).map_err(io)? {
                add_entry(b, &fd, &child, &at.join(&child), count)?;
            }
        }
    }
    *count += 1;
    Ok(())
}

/// Names in a directory (without `.` and `..`), sorted.
fn list_dir(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let dup = openat(dir.as_raw_fd(), OsStr::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    use std::os::fd::IntoRawFd;
    // Dir takes ownership of the raw descriptor and closes it.
    let mut d = nix::dir::Dir::from_fd(dup.into_raw_fd()).map_err(io::Error::from)?;
    let mut names: Vec<OsString> = d
        .iter()
        .flatten()
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    names.sort();
    Ok(names)
}

/// Unpacks a tar stream into `dir`: its top entry is renamed to `name`.
/// Every entry is created relative to descriptors opened under `dir`, with
/// `O_NOFOLLOW`; entries with absolute paths or `..` are refused; device
/// nodes are skipped; everything created is owned by `owner`.
pub fn read_tar(dir: &OwnedFd, name: &OsStr, input: impl Read, owner: Owner) -> Result<u64> {
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
        // Parents must be real directories created by this copy or already there.
        let mut cur = dir.try_clone().map_err(|e| Error::Io("dup dir".into(), e))?;
        for c in &comps {
            cur = openat(cur.as_raw_fd(), c, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .map_err(|e| Error::Io(format!("open parent of {path_str}"), e))?;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let ioe = |e: io::Error| Error::Io(format!("write {path_str}"), e);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                let c = cstr(&leaf)?;
                // SAFETY: valid dir fd and C string.
                let rc = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), mode) };
                if rc < 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EEXIST) || kind_at(&cur, &leaf)? != Kind::Dir {
                        return Err(ioe(e));
                    }
                }
                let d = openat(cur.as_raw_fd(), &leaf, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(ioe)?;
                fchown(&d, owner).map_err(ioe)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if kind_at(&cur, &leaf)? == Kind::Symlink {
                    return Err(Error::PathEscape(format!("{path_str} (is a symlink in the sandbox)")));
                }
                let f = openat(cur.as_raw_fd(), &leaf, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode).map_err(ioe)?;
                let st = fstat(f.as_raw_fd()).map_err(ioe)?;
                if !is_type(&st, libc::S_IFREG) {
                    return Err(ioe(io::Error::other("not a regular file")));
                }
                fchown(&f, owner).map_err(ioe)?;
                let mut file = File::from(f);
                io::copy(&mut entry, &mut file).map_err(ioe)?;
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| ioe(io::Error::other("symlink without target")))?;
                let t = CString::new(target.into_owned()).map_err(|_| ioe(io::Error::other("NUL in link")))?;
                let c = cstr(&leaf)?;
                // SAFETY: valid C strings and dir fd.
                if unsafe { libc::symlinkat(t.as_ptr(), cur.as_raw_fd(), c.as_ptr()) } < 0 {
                    return Err(ioe(io::Error::last_os_error()));
                }
                // SAFETY: valid dir fd and C string; AT_SYMLINK_NOFOLLOW changes the link itself.
                unsafe { libc::fchownat(cur.as_raw_fd(), c.as_ptr(), owner.uid, owner.gid, libc::AT_SYMLINK_NOFOLLOW) };
            }
            _ => continue, // hard links, devices, fifos: not copied
        }
        count += 1;
    }
    Ok(count)
}

fn fchown(fd: &impl AsFd, owner: Owner) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we hold.
    if unsafe { libc::fchown(fd.as_fd().as_raw_fd(), owner.uid, owner.gid) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
        assert!(err.contains("No such file"), "{err}");
        assert!(matches!(root.locate("/up/etc/passwd"), Err(Error::PathEscape(_))));
        assert!(matches!(root.locate("/../etc/passwd"), Err(Error::PathEscape(_))));
        assert!(matches!(root.locate("relative"), Err(Error::PathEscape(_))));
        // Positive control: a plain path resolves.
        assert_eq!(root.locate("/etc/hosts").unwrap().resolved, Path::new("/etc/hosts"));
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
        assert_eq!(write_tar(&l.dir, &l.name, Path::new("src"), &mut buf).unwrap(), 5);
        let owner = Owner { uid: 4242, gid: 4243 };
        let dst = root.locate("/copy").unwrap();
        assert_eq!(read_tar(&dst.dir, &dst.name, &buf[..], owner).unwrap(), 5);
        assert_eq!(std::fs::read(r.join("copy/sub/b.txt")).unwrap(), b"beta");
        assert_eq!(std::fs::read_link(r.join("copy/link")).unwrap(), Path::new("a.txt"));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(r.join("copy/a.txt")).unwrap().uid(), 4242);

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
        assert!(read_tar(&trap.dir, &trap.name, &one[..], owner).is_err());
        assert!(!outside.path().join("victim").exists(), "nothing written outside");
        let ok = root.locate("/fine").unwrap();
        read_tar(&ok.dir, &ok.name, &one[..], owner).unwrap();
        assert_eq!(std::fs::read(r.join("fine")).unwrap(), b"bad");
    }

    #[test]
    fn kernel_filesystems_are_refused() {
        let root = SandboxRoot::new(File::open("/").unwrap().into());
        assert!(root.locate("/proc/sys/kernel/core_pattern").is_err());
        assert!(root.locate("/sys/kernel/x").is_err());
        assert!(root.locate("/etc/hostname").is_ok());
    }
}
