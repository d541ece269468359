//! Everything about an entry but its contents: owners shifted between the
//! host and the sandbox's id range, timestamps, extended attributes, and
//! the data regions of sparse files.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::bytes::ByteBuf;
use crate::manifest::{Entry, EntryKind, Timestamp};
use crate::sys::{self, XattrAt};

/// The sandbox's id range on the host: host id = `base` + relative id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdShift {
    pub base: u32,
    pub len: u32,
}

/// The overflow id (`nobody`), relative.
pub const NOBODY: u32 = 65534;

impl IdShift {
    /// The relative id of a host id. Ids outside `[base, base + len)` cannot
    /// be set from inside the sandbox (only the host put them there) and are
    /// recorded as [`NOBODY`], which is what the sandbox sees them as.
    pub fn to_relative(self, host: u32) -> u32 {
        match host.checked_sub(self.base) {
            Some(rel) if rel < self.len => rel,
            _ => NOBODY,
        }
    }

    /// The host id of a relative id; one beyond the range becomes the
    /// range's `nobody` (or its last id, for a range shorter than 65535).
    pub fn to_host(self, rel: u32) -> u32 {
        let rel = if rel < self.len { rel } else { NOBODY.min(self.len.saturating_sub(1)) };
        self.base.saturating_add(rel)
    }
}

pub(crate) fn mtime(st: &sys::Stat) -> Timestamp {
    Timestamp { sec: st.st_mtime, nsec: st.st_mtime_nsec as u32 }
}

pub(crate) fn ctime(st: &sys::Stat) -> Timestamp {
    Timestamp { sec: st.st_ctime, nsec: st.st_ctime_nsec as u32 }
}

pub(crate) fn file_type(st: &sys::Stat) -> u32 {
    st.st_mode & libc::S_IFMT
}

/// True when the entry on disk is still what `prev` describes: same inode,
/// ctime, mtime and type (and size or device). Every change of contents,
/// mode, owner, attributes or links moves the ctime, which cannot be set
/// from user space; an UNKNOWN ctime matches nothing.
pub(crate) fn unchanged(prev: &Entry, st: &sys::Stat, file_type: u32) -> bool {
    prev.ino == st.st_ino
        && prev.ctime != Timestamp::UNKNOWN
        && prev.ctime == ctime(st)
        && prev.mtime == mtime(st)
        && prev.kind.file_type() == file_type
        && match prev.kind {
            EntryKind::File { size, .. } => size == st.st_size as u64,
            EntryKind::Whiteout => st.st_rdev == 0,
            EntryKind::CharDev { rdev } | EntryKind::BlockDev { rdev } => rdev == st.st_rdev,
            _ => true,
        }
}

/// The kernel stamps ctimes from a clock that may advance only once per
/// tick (up to 10 ms): a second change within the tick of the first leaves
/// the ctime as it was. A ctime this close to the moment the entry was
/// looked at is not trusted to reveal later changes.
pub(crate) const RACY: Duration = Duration::from_millis(20);

/// `ct`, or [`Timestamp::UNKNOWN`] when `ct` is within [`RACY`] of
/// `looked_at` (a time taken before the stat), so that the next capture or
/// restore looks at the entry again.
pub(crate) fn trusted_ctime(ct: Timestamp, looked_at: SystemTime) -> Timestamp {
    let limit = looked_at.checked_sub(RACY).and_then(|t| t.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
    let limit = Timestamp { sec: limit.as_secs() as i64, nsec: limit.subsec_nanos() };
    if ct >= limit {
        Timestamp::UNKNOWN
    } else {
        ct
    }
}

/// All extended attributes, sorted by name. An attribute removed between
/// listing and reading is left out.
pub(crate) fn read_xattrs(at: &XattrAt<'_>) -> io::Result<Vec<(ByteBuf, ByteBuf)>> {
    let mut out = Vec::new();
    for name in at.list()? {
        match at.get(&name) {
            Ok(value) => out.push((ByteBuf(name), ByteBuf(value))),
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Makes the attributes exactly `want`: removes others, sets what differs.
pub(crate) fn write_xattrs(at: &XattrAt<'_>, want: &[(ByteBuf, ByteBuf)]) -> io::Result<()> {
    let have = read_xattrs(at)?;
    for (name, _) in &have {
        if !want.iter().any(|(n, _)| n == name) {
            at.remove(name)?;
        }
    }
    for (name, value) in want {
        if !have.iter().any(|(n, v)| n == name && v == value) {
            at.set(name, value)?;
        }
    }
    Ok(())
}

/// The data regions `(offset, len)` of a file of `size` bytes, in order;
/// the rest are holes. A filesystem without `SEEK_DATA` gives one region.
pub(crate) fn data_regions(fd: BorrowedFd<'_>, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match sys::seek(fd, sys::SeekFrom::Data(pos)) {
            Ok(Some(d)) => d,
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && pos == 0 => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = sys::seek(fd, sys::SeekFrom::Hole(data))?.unwrap_or(size).min(size);
        if hole <= data {
            // Cannot happen on a sane filesystem; read the rest densely.
            out.push((data, size - data));
            break;
        }
        out.push((data, hole - data));
        pos = hole;
    }
    Ok(out)
}

/// What [`apply`] may skip.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Known<'a> {
    /// The entry's current stat, to skip chown/chmod/utimes that would not
    /// change anything.
    pub stat: Option<&'a sys::Stat>,
    /// The current attributes are already the entry's.
    pub xattrs_equal: bool,
    /// Leave the mtime (directories get theirs after their children).
    pub skip_mtime: bool,
}

/// Sets owner, mode, attributes and mtime of `name` in `dir` to the entry's,
/// in the order that keeps each: chown clears setuid/setgid and file
/// capabilities, so it goes first and the attributes after it; mode and
/// attributes do not touch the mtime, which goes last.
pub(crate) fn apply(dir: BorrowedFd<'_>, name: &CStr, e: &Entry, ids: IdShift, known: Known<'_>) -> io::Result<()> {
    let (uid, gid) = (ids.to_host(e.uid), ids.to_host(e.gid));
    let is_link = matches!(e.kind, EntryKind::Symlink { .. });
    let mut xattrs_equal = known.xattrs_equal;
    if known.stat.is_none_or(|st| st.st_uid != uid || st.st_gid != gid) {
        sys::chown_at(dir, name, uid, gid)?;
        xattrs_equal = false;
    }
    if !is_link && known.stat.is_none_or(|st| st.st_mode & 0o7777 != e.mode || st.st_uid != uid || st.st_gid != gid) {
        sys::chmod_at(dir, name, e.mode & 0o7777)?;
    }
    if !xattrs_equal {
        write_xattrs(&XattrAt::name_in(dir, name)?, &e.xattrs)?;
    }
    if !known.skip_mtime && known.stat.is_none_or(|st| mtime(st) != e.mtime) {
        sys::set_mtime_at(dir, name, e.mtime.sec, e.mtime.nsec)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_shift_and_outsiders_become_nobody() {
        let ids = IdShift { base: 1_000_000_000, len: 65536 };
        assert_eq!(ids.to_relative(1_000_000_000), 0);
        assert_eq!(ids.to_relative(1_000_001_000), 1000);
        assert_eq!(ids.to_relative(0), NOBODY);
        assert_eq!(ids.to_relative(1_000_065_536), NOBODY);
        assert_eq!(ids.to_host(1000), 1_000_001_000);
        assert_eq!(ids.to_host(70_000), 1_000_065_534);
        assert_eq!(IdShift { base: 10, len: 100 }.to_host(200), 109);
    }

    #[test]
    fn recent_ctimes_are_not_trusted() {
        let now = SystemTime::now();
        let d = now.duration_since(UNIX_EPOCH).unwrap();
        let at = |back: Duration| {
            let t = d - back;
            Timestamp { sec: t.as_secs() as i64, nsec: t.subsec_nanos() }
        };
        assert_eq!(trusted_ctime(at(Duration::from_millis(5)), now), Timestamp::UNKNOWN);
        assert_eq!(trusted_ctime(at(Duration::ZERO), now), Timestamp::UNKNOWN);
        let old = at(Duration::from_millis(100));
        assert_eq!(trusted_ctime(old, now), old);
    }
}
