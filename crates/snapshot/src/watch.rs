//! Change tracking: which directories of a task's layers changed since the
//! last capture, from a fanotify mark on the task disk's own filesystem, so
//! that the next capture looks at those directories only.
//!
//! The mark covers the whole filesystem (`FAN_MARK_FILESYSTEM`) and reports
//! each event as the directory it happened in plus a name
//! (`FAN_REPORT_DFID_NAME`): a file written, created, removed, renamed or
//! changed in its attributes marks its directory; a directory whose own
//! attributes change marks itself. The kernel queues events synchronously
//! with the call that caused them, so once the sandbox is frozen every change
//! it made is in the queue.
//!
//! What this cannot see, and how the capture copes:
//! - a lost event (the kernel's queue of 16,384 overflowed, or more than
//!   [`MAX_DIRS`] directories changed): [`ChangeWatch::take`] says so and
//!   the capture walks everything;
//! - a new name for a file that has others (a hard link): the other names'
//!   directories are not marked, so the capture walks everything whenever a
//!   marked directory holds a file with more than one link;
//! - writes through a shared memory mapping: they mark the file's directory
//!   when the file is closed (`FAN_CLOSE_WRITE`), not before.
//!
//! Event directories come back as handles; a handle is turned into a path
//! only as a hint of where to look: the capture opens that path from the
//! layer's upper directory without following symlinks, like every other.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Distinct directories remembered between two captures; more and the next
/// capture walks everything (memory stays bounded whatever the sandbox does).
pub const MAX_DIRS: usize = 65_536;

const EVENTS: u64 = libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_ONDIR;

/// The directories that changed, per layer name, relative to the layer's
/// upper directory (the empty path is the upper itself).
pub type Changed = HashMap<String, BTreeSet<PathBuf>>;

/// A fanotify group watching one task disk.
#[derive(Debug)]
pub struct ChangeWatch {
    fan: OwnedFd,
    /// The disk's mount point, as the kernel prints paths under it.
    disk: PathBuf,
    /// Directory handles (`struct file_handle` bytes) seen since the last take.
    handles: HashSet<Vec<u8>>,
    /// An event was lost since the last take.
    lost: bool,
    /// Taken from before: a watch cannot vouch for what changed before it
    /// started, so its first take says "walk everything".
    taken: bool,
    /// The mount watched: a mark ends with its filesystem's unmount, so a
    /// disk mounted again is not watched by this group.
    mount: u64,
}

impl ChangeWatch {
    /// Starts watching the filesystem mounted at `disk`, which must be its
    /// own mount (a task disk): a mark on a shared filesystem would report
    /// the host's changes too. Needs `CAP_SYS_ADMIN`.
    pub fn start(disk: &Path) -> io::Result<ChangeWatch> {
        let disk = disk.canonicalize()?;
        let parent = disk.parent().ok_or_else(|| io::Error::other("the disk is the root directory"))?;
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&disk)?.dev() == std::fs::metadata(parent)?.dev() {
            return Err(io::Error::other(format!("{} is not a mount of its own", disk.display())));
        }
        let flags = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_DFID_NAME;
        // SAFETY: plain syscall with constant arguments; the result is checked.
        let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_CLOEXEC) as u32) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by fanotify_init and is owned by nothing else.
        let fan = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = CString::new(disk.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: `fan` is a fanotify descriptor and `path` a NUL-terminated string that outlives the call.
        let marked = unsafe {
            libc::fanotify_mark(fan.as_raw_fd(), libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM, EVENTS, libc::AT_FDCWD, path.as_ptr())
        };
        if marked < 0 {
            return Err(io::Error::last_os_error());
        }
        let mount = mount_id(&disk)?;
        Ok(ChangeWatch { fan, disk, handles: HashSet::new(), lost: false, taken: false, mount })
    }

    /// Whether this group still watches the filesystem mounted at `disk`
    /// (false once it was unmounted, even if mounted again since).
    pub fn watches(&self, disk: &Path) -> bool {
        disk.canonicalize().is_ok_and(|d| d == self.disk) && mount_id(disk).is_ok_and(|m| m == self.mount)
    }

    /// Reads every queued event (without blocking) and remembers the
    /// directories they name. Cheap: call it as often as convenient, so the
    /// kernel's queue does not overflow between captures.
    pub fn drain(&mut self) -> io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::read(self.fan.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            if n == 0 {
                return Ok(());
            }
            parse_events(&buf[..n as usize], &mut |event| match event {
                Event::Overflow => self.lost = true,
                Event::Dir(handle) => {
                    if self.lost || self.handles.contains(handle) {
                    } else if self.handles.len() < MAX_DIRS {
                        self.handles.insert(handle.to_vec());
                    } else {
                        self.lost = true;
                    }
                }
            })?;
            if self.lost {
                self.handles.clear();
            }
        }
    }

    /// The directories of `layers` changed since the last take, and forgets
    /// them; `None` at the first take (what changed before the watch
    /// started is unknown) and when some change may have been lost, so that
    /// everything must be walked.
    pub fn take(&mut self, layers: &[&str]) -> io::Result<Option<Changed>> {
        self.drain()?;
        let handles = std::mem::take(&mut self.handles);
        let first = !std::mem::replace(&mut self.taken, true);
        if std::mem::take(&mut self.lost) || first {
            return Ok(None);
        }
        let mut changed = Changed::new();
        if handles.is_empty() {
            return Ok(Some(changed));
        }
        let mount = std::fs::File::open(&self.disk)?;
        for handle in handles {
            let Some(path) = self.path_of(&mount, &handle)? else { continue };
            let Ok(rel) = path.strip_prefix(&self.disk) else { continue };
            let mut parts = rel.components();
            let Some(Component::Normal(layer)) = parts.next() else { continue };
            let Some(layer) = layer.to_str().filter(|l| layers.contains(l)) else { continue };
            let dir = match parts.next() {
                // The layer's own directory: its `upper` entry changed.
                None => PathBuf::new(),
                Some(Component::Normal(upper)) if upper == "upper" => parts.as_path().to_owned(),
                // overlayfs's work directory, or anything else.
                _ => continue,
            };
            changed.entry(layer.to_owned()).or_default().insert(dir);
        }
        Ok(Some(changed))
    }

    /// Where the directory of `handle` is now, or None if it is gone.
    fn path_of(&self, mount: &std::fs::File, handle: &[u8]) -> io::Result<Option<PathBuf>> {
        // A `struct file_handle` must be aligned as its u32 fields are.
        let mut aligned = vec![0u64; handle.len().div_ceil(8)];
        // SAFETY: `aligned` has at least `handle.len()` bytes, the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(handle.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), handle.len()) };
        // SAFETY: `aligned` holds a complete file_handle as the kernel reported it
        // (its handle_bytes match the copied length, checked in parse_events).
        let fd = unsafe {
            libc::open_by_handle_at(mount.as_raw_fd(), aligned.as_mut_ptr().cast(), libc::O_PATH | libc::O_CLOEXEC)
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ESTALE | libc::ENOENT) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: `fd` was just returned by open_by_handle_at and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        Ok(Some(link))
    }
}

/// The unique id of the mount at `path` (never reused while the system runs).
fn mount_id(path: &Path) -> io::Result<u64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: an all-zero statx is a valid value to be filled in.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `stx` is valid for writes; both outlive the call.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, libc::STATX_MNT_ID_UNIQUE, &mut stx) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Err(io::Error::other("the kernel gives no unique mount ids (Linux 6.8 or later)"));
    }
    Ok(stx.stx_mnt_id)
}

enum Event<'a> {
    Overflow,
    /// The handle of the directory an event happened in.
    Dir(&'a [u8]),
}

/// Splits a read of the fanotify descriptor into events (see
/// `fanotify(7)`: a metadata header, then info records).
fn parse_events(mut buf: &[u8], f: &mut dyn FnMut(Event<'_>)) -> io::Result<()> {
    let bad = |why: &str| io::Error::other(format!("malformed fanotify event: {why}"));
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    while !buf.is_empty() {
        // struct fanotify_event_metadata: event_len u32, vers u8, reserved u8,
        // metadata_len u16, mask u64, fd i32, pid i32.
        if buf.len() < 24 {
            return Err(bad("short header"));
        }
        let event_len = u32_at(buf, 0) as usize;
        let vers = buf[4];
        let metadata_len = u16_at(buf, 6) as usize;
        let mask = u64::from_ne_bytes(buf[8..16].try_into().map_err(|_| bad("mask"))?);
        if vers != libc::FANOTIFY_METADATA_VERSION {
            return Err(bad("unknown version"));
        }
        if event_len < metadata_len || metadata_len < 24 || event_len > buf.len() {
            return Err(bad("lengths"));
        }
        let (event, rest) = buf.split_at(event_len);
        buf = rest;
        if mask & libc::FAN_Q_OVERFLOW != 0 {
            f(Event::Overflow);
            continue;
        }
        let mut info = &event[metadata_len..];
        while info.len() >= 4 {
            // struct fanotify_event_info_header: info_type u8, pad u8, len u16;
            // then (fid records) fsid (8 bytes) and a struct file_handle:
            // handle_bytes u32, handle_type i32, f_handle[handle_bytes].
            let (kind, len) = (info[0], u16_at(info, 2) as usize);
            if len < 4 || len > info.len() {
                return Err(bad("info length"));
            }
            let record = &info[..len];
            info = &info[len..];
            if kind != libc::FAN_EVENT_INFO_TYPE_DFID_NAME && kind != libc::FAN_EVENT_INFO_TYPE_DFID {
                continue;
            }
            let handle = record.get(12..).ok_or_else(|| bad("fid record"))?;
            if handle.len() < 8 {
                return Err(bad("file handle"));
            }
            let handle_len = 8 + u32_at(handle, 0) as usize;
            let handle = handle.get(..handle_len).ok_or_else(|| bad("file handle length"))?;
            f(Event::Dir(handle));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(mask: u64, records: &[(u8, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, handle) in records {
            let mut fid = vec![*kind, 0, 0, 0];
            fid.extend_from_slice(&[7; 8]); // fsid
            fid.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
            fid.extend_from_slice(&1i32.to_ne_bytes());
            fid.extend_from_slice(handle);
            fid.extend_from_slice(b"name\0");
            let len = fid.len() as u16;
            fid[2..4].copy_from_slice(&len.to_ne_bytes());
            body.extend(fid);
        }
        let mut e = Vec::new();
        e.extend_from_slice(&((24 + body.len()) as u32).to_ne_bytes());
        e.extend_from_slice(&[libc::FANOTIFY_METADATA_VERSION, 0]);
        e.extend_from_slice(&24u16.to_ne_bytes());
        e.extend_from_slice(&mask.to_ne_bytes());
        e.extend_from_slice(&(-1i32).to_ne_bytes());
        e.extend_from_slice(&42i32.to_ne_bytes());
        e.extend(body);
        e
    }

    fn parsed(buf: &[u8]) -> io::Result<Vec<Option<Vec<u8>>>> {
        let mut seen = Vec::new();
        parse_events(buf, &mut |e| {
            seen.push(match e {
                Event::Overflow => None,
                Event::Dir(h) => Some(h.to_vec()),
            })
        })?;
        Ok(seen)
    }

    #[test]
    fn events_give_their_directory_handles_and_overflows() {
        let mut buf = event(libc::FAN_CREATE, &[(libc::FAN_EVENT_INFO_TYPE_DFID_NAME, b"abcd")]);
        buf.extend(event(libc::FAN_Q_OVERFLOW, &[]));
        buf.extend(event(libc::FAN_MODIFY, &[(9, b"zz"), (libc::FAN_EVENT_INFO_TYPE_DFID, b"efgh1234")]));
        let seen = parsed(&buf).unwrap();
        let handle = |len: u32, h: &[u8]| [&len.to_ne_bytes()[..], &1i32.to_ne_bytes(), h].concat();
        assert_eq!(seen, vec![Some(handle(4, b"abcd")), None, Some(handle(8, b"efgh1234"))]);
    }

    #[test]
    fn malformed_events_are_refused() {
        let good = event(libc::FAN_CREATE, &[(libc::FAN_EVENT_INFO_TYPE_DFID_NAME, b"abcd")]);
        assert!(parsed(&good[..20]).is_err(), "short header");
        assert!(parsed(&good[..good.len() - 1]).is_err(), "event longer than the read");
        let mut wrong_version = good.clone();
        wrong_version[4] = 99;
        assert!(parsed(&wrong_version).is_err());
        let mut long_handle = good.clone();
        long_handle[24 + 12..24 + 16].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parsed(&long_handle).is_err(), "a handle past its record");
        assert_eq!(parsed(&good).unwrap().len(), 1, "the positive control");
    }
}
