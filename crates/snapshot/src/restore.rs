//! Restore: makes each layer's upper directory exactly a manifest's tree
//! (rollback, fork, wake).
//!
//! Everything happens relative to directory descriptors and nothing on the
//! disk is followed: the trees were written by untrusted sandbox code. With
//! a baseline (the manifest whose inodes and ctimes describe the disk now), a
//! regular file still as the baseline recorded it and whose contents the
//! target does not change is kept; anything else that differs is removed and
//! made again.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use cairn_blob::{ObjectId, Repository};
use serde::{Deserialize, Serialize};

use crate::manifest::{Entry, EntryKind, Index, LayerTree, Manifest};
use crate::meta::{self, IdShift, Known};
use crate::progress::{Progress, Reporter};
use crate::sys;
use crate::{Error, Result};

/// What a restore did (a rollback answers with it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RestoreStats {
    pub files_written: u64,
    pub bytes_written: u64,
    /// Regular files left in place (only their metadata fixed).
    pub files_kept: u64,
    /// Entries removed from the uppers (each file and directory counts).
    pub entries_removed: u64,
    pub duration_ms: f64,
}

/// Makes the uppers on the task disk mounted at `disk` exactly `target`'s
/// layers; layers on the disk that `target` lacks get an empty upper, and
/// every restored layer an empty overlayfs work directory. Owners are shifted
/// into `ids`. Without `baseline`, each upper is emptied and written in full.
///
/// The sandbox must not be running: its disk is written directly.
///
/// Returns `target` with the inodes and ctimes the entries now have (the
/// baseline for the next capture or restore). A chunk that is missing or
/// does not match its id fails the restore, naming it.
pub fn restore(
    repo: &Repository,
    target: &Manifest,
    disk: &Path,
    baseline: Option<&Manifest>,
    ids: IdShift,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Manifest, RestoreStats)> {
    target.validate()?;
    let started = Instant::now();
    let mut report = Reporter::new(progress);
    let mut stats = RestoreStats::default();
    let disk_fd = sys::open_dir(disk).map_err(|e| Error::Read(disk.into(), e))?;

    for name in sys::read_dir(disk_fd.as_fd()).map_err(|e| Error::Read(disk.into(), e))? {
        let layer = OsStr::from_bytes(name.to_bytes());
        if target.layer(&layer.to_string_lossy()).is_some() {
            continue;
        }
        // Only directories holding an `upper` are layers (not `lost+found`).
        let Ok(layer_fd) = sys::open_dir_at(disk_fd.as_fd(), &name) else { continue };
        let Ok(upper) = sys::open_dir_at(layer_fd.as_fd(), c"upper") else { continue };
        let dir = disk.join(layer);
        stats.entries_removed += clear(upper.as_fd(), &dir.join("upper"))?;
        if let Ok(work) = sys::open_dir_at(layer_fd.as_fd(), c"work") {
            clear(work.as_fd(), &dir.join("work"))?;
        }
    }

    let bytes_total =
        target.layers.iter().flat_map(|l| &l.entries).map(|e| extents_len(&e.kind)).sum();
    report.phase("restore", target.file_count(), bytes_total);
    let base = baseline.map(Index::new);
    // The packs of the chunks to write, fetched several at once up front
    // when the store is remote (and cached); a local store has nothing to
    // fetch. Files the baseline already holds as the target wants them are
    // left out: they are most likely kept.
    repo.prefetch(chunks_to_write(target, base.as_ref()).iter());
    for layer in &target.layers {
        let dir = disk.join(&layer.name);
        let layer_fd = ensure_dir(disk_fd.as_fd(), &sys::cstr(layer.name.as_ref()).map_err(|e| Error::Write(dir.clone(), e))?, 0o755, &dir)?;
        let work = ensure_dir(layer_fd.as_fd(), c"work", 0o700, &dir.join("work"))?;
        clear(work.as_fd(), &dir.join("work"))?;
        let upper_path = dir.join("upper");
        let upper = ensure_dir(layer_fd.as_fd(), c"upper", 0o755, &upper_path)?;
        let prev = base.as_ref().and_then(|b| b.layer(&layer.name));
        if prev.is_none() {
            stats.entries_removed += clear(upper.as_fd(), &upper_path)?;
        }
        let mut w = Writer { repo, ids, layer, prev, upper: &upper_path, stats: &mut stats, report: &mut report };
        w.layer(layer_fd.as_fd(), upper)?;
    }

    report.phase("stat", 0, 0);
    // Let the kernel's coarse clock move past the last change, so the ctimes
    // read below can be trusted by the next capture (see meta::RACY). With no
    // file touched (a fork's empty branch) only the layer directories would
    // be looked at again, which costs less than the wait.
    if stats.files_written + stats.files_kept > 0 {
        std::thread::sleep(meta::RACY + std::time::Duration::from_millis(2));
    }
    let looked_at = SystemTime::now();
    let mut refreshed = target.clone();
    for layer in &mut refreshed.layers {
        let upper = disk.join(&layer.name).join("upper");
        refresh(&upper, layer, looked_at)?;
    }
    // Nothing but the layer directories written (a fork's empty branch):
    // after a crash the disk is restored again anyway, so the flush can go.
    if stats.files_written + stats.files_kept + stats.entries_removed > 0 {
        sys::syncfs(disk_fd.as_fd()).map_err(|e| Error::Write(disk.into(), e))?;
    }
    stats.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    report.phase("done", stats.files_written, stats.bytes_written);
    Ok((refreshed, stats))
}

/// The chunks of the target's regular files, in the order the restore
/// writes them, but for files the baseline records with the same contents.
fn chunks_to_write(target: &Manifest, base: Option<&Index<'_>>) -> Vec<ObjectId> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for layer in &target.layers {
        let prev = base.and_then(|b| b.layer(&layer.name));
        for e in &layer.entries {
            let EntryKind::File { extents, .. } = &e.kind else { continue };
            if prev.and_then(|p| p.get(e.path.as_path())).is_some_and(|p| p.kind == e.kind) {
                continue;
            }
            out.extend(extents.iter().flat_map(|x| &x.chunks).filter(|c| seen.insert(**c)));
        }
    }
    out
}

fn extents_len(kind: &EntryKind) -> u64 {
    match kind {
        EntryKind::File { extents, .. } => extents.iter().map(|x| x.len).sum(),
        _ => 0,
    }
}

fn name_of(p: &Path) -> io::Result<CString> {
    sys::cstr(p.file_name().unwrap_or(p.as_os_str()))
}

/// Opens the directory `name` in `dir`, making it if missing; anything else
/// in its place is an error (these are the daemon's directories).
fn ensure_dir(dir: BorrowedFd<'_>, name: &CStr, mode: u32, path: &Path) -> Result<OwnedFd> {
    match sys::mkdir_at(dir, name, mode) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(Error::Write(path.into(), e)),
    }
    sys::open_dir_at(dir, name).map_err(|e| Error::Write(path.into(), e))
}

/// A directory being emptied.
struct Doomed {
    fd: OwnedFd,
    names: std::vec::IntoIter<CString>,
    /// Its name in the directory below it on the stack (None for the root).
    name: Option<CString>,
    path: PathBuf,
}

/// Removes everything in `dir` (not `dir`) without following symlinks or
/// crossing mounts; returns how many entries it removed.
fn clear(dir: BorrowedFd<'_>, path: &Path) -> Result<u64> {
    let fd = dir.try_clone_to_owned().map_err(|e| Error::Remove(path.into(), e))?;
    let names = sys::read_dir(dir).map_err(|e| Error::Remove(path.into(), e))?;
    let dev = sys::fstat(dir).map_err(|e| Error::Remove(path.into(), e))?.st_dev;
    let mut stack = vec![Doomed { fd, names: names.into_iter(), name: None, path: path.into() }];
    let mut removed = 0;
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.names.next() else {
            let done = stack.pop();
            if let (Some(done), Some(parent)) = (done, stack.last()) {
                let name = done.name.unwrap_or_default();
                sys::unlink_at(parent.fd.as_fd(), &name, true).map_err(|e| Error::Remove(done.path.clone(), e))?;
                removed += 1;
            }
            continue;
        };
        let child = top.path.join(OsStr::from_bytes(name.to_bytes()));
        let st = match sys::lstat_at(top.fd.as_fd(), &name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(Error::Remove(child, e)),
        };
        if meta::file_type(&st) == libc::S_IFDIR {
            if st.st_dev != dev {
                return Err(Error::Remove(child, io::Error::other("a mount point")));
            }
            let fd = sys::open_dir_at(top.fd.as_fd(), &name).map_err(|e| Error::Remove(child.clone(), e))?;
            let names = sys::read_dir(fd.as_fd()).map_err(|e| Error::Remove(child.clone(), e))?;
            stack.push(Doomed { fd, names: names.into_iter(), name: Some(name), path: child });
        } else {
            sys::unlink_at(top.fd.as_fd(), &name, false).map_err(|e| Error::Remove(child, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Removes `name` in `dir`, a whole tree if it is a directory.
fn remove(dir: BorrowedFd<'_>, name: &CStr, st: &sys::Stat, path: &Path) -> Result<u64> {
    if meta::file_type(st) != libc::S_IFDIR {
        sys::unlink_at(dir, name, false).map_err(|e| Error::Remove(path.into(), e))?;
        return Ok(1);
    }
    let fd = sys::open_dir_at(dir, name).map_err(|e| Error::Remove(path.into(), e))?;
    let n = clear(fd.as_fd(), path)?;
    sys::unlink_at(dir, name, true).map_err(|e| Error::Remove(path.into(), e))?;
    Ok(n + 1)
}

/// A directory of the target being restored: its descriptor, its entry and
/// the entries of its children still to do.
struct Frame {
    fd: OwnedFd,
    entry: usize,
    children: std::vec::IntoIter<usize>,
}

struct Writer<'a, 'r> {
    repo: &'a Repository,
    ids: IdShift,
    layer: &'a LayerTree,
    /// The baseline's entries of this layer: what the disk holds now.
    prev: Option<&'a HashMap<&'a Path, &'a Entry>>,
    upper: &'a Path,
    stats: &'a mut RestoreStats,
    report: &'a mut Reporter<'r>,
}

impl Writer<'_, '_> {
    /// Restores the layer into `upper` (a directory of `layer_dir`).
    fn layer(&mut self, layer_dir: BorrowedFd<'_>, upper: OwnedFd) -> Result<()> {
        let layer = self.layer;
        let entries = &layer.entries;
        // The children of each directory entry (the last slot: the upper's,
        // for a manifest without an entry for the upper itself).
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); entries.len() + 1];
        let mut dirs: HashMap<&Path, usize> = HashMap::new();
        let has_root = entries.first().is_some_and(|e| e.path.as_os_str().is_empty());
        let root_slot = if has_root { 0 } else { entries.len() };
        let mut link_targets = HashSet::new();
        for (i, e) in entries.iter().enumerate() {
            if e.path.as_os_str().is_empty() {
                continue;
            }
            let parent = e.path.parent().unwrap_or(Path::new(""));
            let slot = if parent.as_os_str().is_empty() { root_slot } else { dirs.get(parent).copied().unwrap_or(root_slot) };
            children[slot].push(i);
            match &e.kind {
                EntryKind::Dir => {
                    dirs.insert(e.path.as_path(), i);
                }
                EntryKind::HardLink { to } => {
                    link_targets.insert(to.as_path());
                }
                _ => {}
            }
        }

        if has_root {
            let st = sys::lstat_at(layer_dir, c"upper").map_err(|e| Error::Read(self.upper.into(), e))?;
            let known = Known { stat: Some(&st), xattrs_equal: self.xattrs_equal(&entries[0], &st), skip_mtime: true };
            meta::apply(layer_dir, c"upper", &entries[0], self.ids, known).map_err(|e| Error::Write(self.upper.into(), e))?;
        }

        let mut inos: HashMap<&Path, u64> = HashMap::new();
        let mut kept_inos: HashSet<u64> = HashSet::new();
        let first = std::mem::take(&mut children[root_slot]);
        self.remove_extras(upper.as_fd(), Path::new(""), &first)?;
        let root_fd = upper.try_clone().map_err(|e| Error::Read(self.upper.into(), e))?;
        let mut stack = vec![Frame { fd: upper, entry: root_slot, children: first.into_iter() }];
        while let Some(top) = stack.last_mut() {
            let Some(i) = top.children.next() else {
                let done = stack.pop();
                if let Some(done) = done.filter(|d| d.entry < entries.len()) {
                    let e = &entries[done.entry];
                    sys::set_mtime_fd(done.fd.as_fd(), e.mtime.sec, e.mtime.nsec)
                        .map_err(|err| Error::Write(self.upper.join(&e.path), err))?;
                }
                continue;
            };
            let e = &entries[i];
            let dir = top.fd.as_fd();
            let full = self.upper.join(&e.path);
            let name = name_of(&e.path).map_err(|err| Error::Write(full.clone(), err))?;
            let st = match sys::lstat_at(dir, &name) {
                Ok(st) => Some(st),
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => None,
                Err(err) => return Err(Error::Read(full, err)),
            };
            let keep = st.as_ref().is_some_and(|st| self.keep(dir, &name, e, st, &inos, &kept_inos));
            let st = match st {
                Some(st) if !keep => {
                    self.stats.entries_removed += remove(dir, &name, &st, &full)?;
                    None
                }
                st => st,
            };
            let wr = |err| Error::Write(full.clone(), err);
            match (&e.kind, &st) {
                (EntryKind::Dir, _) => {
                    if st.is_none() {
                        sys::mkdir_at(dir, &name, 0o700).map_err(wr)?;
                    }
                    let xattrs_equal = st.as_ref().is_some_and(|s| self.xattrs_equal(e, s));
                    meta::apply(dir, &name, e, self.ids, Known { stat: st.as_ref(), xattrs_equal, skip_mtime: true })
                        .map_err(wr)?;
                    let fd = sys::open_dir_at(dir, &name).map_err(wr)?;
                    let kids = std::mem::take(&mut children[i]);
                    self.remove_extras(fd.as_fd(), &e.path, &kids)?;
                    stack.push(Frame { fd, entry: i, children: kids.into_iter() });
                    continue;
                }
                (EntryKind::HardLink { .. }, Some(_)) => {}
                (EntryKind::HardLink { to }, None) => {
                    let (to_dir, to_name) = self.open_parent(root_fd.as_fd(), to)?;
                    sys::link_at(to_dir.as_ref().map_or(root_fd.as_fd(), |d| d.as_fd()), &to_name, dir, &name)
                        .map_err(wr)?;
                }
                (EntryKind::File { .. }, Some(st)) => {
                    self.stats.files_kept += 1;
                    kept_inos.insert(st.st_ino);
                    self.report.add(1, extents_len(&e.kind));
                    let known = Known { stat: Some(st), xattrs_equal: self.xattrs_equal(e, st), skip_mtime: false };
                    meta::apply(dir, &name, e, self.ids, known).map_err(wr)?;
                }
                (EntryKind::File { size, extents }, None) => {
                    let fd = sys::open_at(dir, &name, sys::OFlags::WRONLY | sys::OFlags::CREATE | sys::OFlags::EXCL, 0o600).map_err(wr)?;
                    let file = File::from(fd);
                    file.set_len(*size).map_err(wr)?;
                    for x in extents {
                        let mut pos = x.offset;
                        for id in &x.chunks {
                            let data = self.repo.read_chunk(id).map_err(|err| Error::Chunk(*id, full.clone(), err))?;
                            file.write_all_at(&data, pos).map_err(wr)?;
                            pos += data.len() as u64;
                            self.report.add(0, data.len() as u64);
                        }
                        if pos != x.offset + x.len {
                            return Err(Error::Invalid(self.layer.name.clone(), e.path.clone(), "chunks do not add up to the extent"));
                        }
                        self.stats.bytes_written += x.len;
                    }
                    drop(file);
                    self.stats.files_written += 1;
                    self.report.add(1, 0);
                    meta::apply(dir, &name, e, self.ids, Known::default()).map_err(wr)?;
                }
                (_, Some(st)) => {
                    let known = Known { stat: Some(st), xattrs_equal: self.xattrs_equal(e, st), skip_mtime: false };
                    meta::apply(dir, &name, e, self.ids, known).map_err(wr)?;
                }
                (kind, None) => {
                    match kind {
                        EntryKind::Symlink { target } => {
                            let t = sys::cstr(target.as_os_str()).map_err(wr)?;
                            sys::symlink_at(&t, dir, &name).map_err(wr)?;
                        }
                        EntryKind::CharDev { rdev } | EntryKind::BlockDev { rdev } => {
                            sys::mknod_at(dir, &name, kind.file_type(), *rdev).map_err(wr)?;
                        }
                        // Whiteout (a 0/0 character device), fifo, socket.
                        _ => sys::mknod_at(dir, &name, kind.file_type(), 0).map_err(wr)?,
                    }
                    meta::apply(dir, &name, e, self.ids, Known::default()).map_err(wr)?;
                }
            }
            if link_targets.contains(e.path.as_path()) {
                let st = sys::lstat_at(dir, &name).map_err(|err| Error::Read(full.clone(), err))?;
                inos.insert(e.path.as_path(), st.st_ino);
            }
        }
        Ok(())
    }

    /// Removes what `dir` holds beyond the target's `children` of it.
    fn remove_extras(&mut self, dir: BorrowedFd<'_>, path: &Path, children: &[usize]) -> Result<()> {
        let full = self.upper.join(path);
        let want: HashSet<&[u8]> = children
            .iter()
            .filter_map(|&i| self.layer.entries[i].path.file_name().map(OsStrExt::as_bytes))
            .collect();
        for name in sys::read_dir(dir).map_err(|e| Error::Read(full.clone(), e))? {
            if want.contains(name.to_bytes()) {
                continue;
            }
            let child = full.join(OsStr::from_bytes(name.to_bytes()));
            let st = sys::lstat_at(dir, &name).map_err(|e| Error::Read(child.clone(), e))?;
            self.stats.entries_removed += remove(dir, &name, &st, &child)?;
        }
        Ok(())
    }

    /// Whether what is on disk at `name` can stay for entry `e`.
    fn keep(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        e: &Entry,
        st: &sys::Stat,
        inos: &HashMap<&Path, u64>,
        kept_inos: &HashSet<u64>,
    ) -> bool {
        let ft = meta::file_type(st);
        match &e.kind {
            EntryKind::Dir => ft == libc::S_IFDIR,
            // Contents are only trusted as the baseline recorded them, and an
            // inode kept once is not kept again under a second name.
            EntryKind::File { .. } => {
                ft == libc::S_IFREG
                    && !kept_inos.contains(&st.st_ino)
                    && self
                        .prev_entry(e)
                        .is_some_and(|p| p.kind == e.kind && meta::unchanged(p, st, libc::S_IFREG))
            }
            EntryKind::Symlink { target } => {
                ft == libc::S_IFLNK
                    && sys::readlink_at(dir, name).is_ok_and(|t| t == target.as_os_str().as_bytes())
            }
            EntryKind::HardLink { to } => ft != libc::S_IFDIR && inos.get(to.as_path()) == Some(&st.st_ino),
            EntryKind::Whiteout => ft == libc::S_IFCHR && st.st_rdev == 0,
            EntryKind::CharDev { rdev } | EntryKind::BlockDev { rdev } => {
                ft == e.kind.file_type() && st.st_rdev == *rdev
            }
            EntryKind::Fifo | EntryKind::Socket => ft == e.kind.file_type(),
        }
    }

    fn prev_entry(&self, e: &Entry) -> Option<&Entry> {
        self.prev.and_then(|p| p.get(e.path.as_path())).copied()
    }

    /// The attributes on disk are known to be the entry's: the baseline has
    /// the same ones and the entry has not changed since.
    fn xattrs_equal(&self, e: &Entry, st: &sys::Stat) -> bool {
        self.prev_entry(e).is_some_and(|p| p.xattrs == e.xattrs && meta::unchanged(p, st, meta::file_type(st)))
    }

    /// The directory holding `path` (None: the upper itself) and its name.
    fn open_parent(&self, root: BorrowedFd<'_>, path: &Path) -> Result<(Option<OwnedFd>, CString)> {
        let err = |e| Error::Write(self.upper.join(path), e);
        let name = name_of(path).map_err(err)?;
        let parent = path.parent().unwrap_or(Path::new(""));
        if parent.as_os_str().is_empty() {
            return Ok((None, name));
        }
        let c = sys::cstr(parent.as_os_str()).map_err(err)?;
        let fd = sys::open_beneath_same_fs(root, c.as_c_str(), sys::OFlags::PATH | sys::OFlags::DIRECTORY, 0).map_err(err)?;
        Ok((Some(fd), name))
    }
}

/// Stats every entry of `layer` in `upper` again: new inodes and ctimes.
fn refresh(upper: &Path, layer: &mut LayerTree, looked_at: SystemTime) -> Result<()> {
    let root = sys::open_dir(upper).map_err(|e| Error::Read(upper.into(), e))?;
    let mut stack: Vec<(PathBuf, OwnedFd)> = Vec::new();
    // Entries whose inode or ctime moved: only their segments are stored again.
    let mut moved = Vec::new();
    for (i, e) in layer.entries.iter_mut().enumerate() {
        let full = upper.join(&e.path);
        let st = if e.path.as_os_str().is_empty() {
            sys::fstat(root.as_fd())
        } else {
            let parent = e.path.parent().unwrap_or(Path::new(""));
            while stack.last().is_some_and(|(p, _)| p != parent) {
                stack.pop();
            }
            let dir = stack.last().map_or(root.as_fd(), |(_, fd)| fd.as_fd());
            let name = name_of(&e.path).map_err(|err| Error::Read(full.clone(), err))?;
            let st = sys::lstat_at(dir, &name);
            if e.kind == EntryKind::Dir {
                let fd = sys::open_dir_at(dir, &name).map_err(|err| Error::Read(full.clone(), err))?;
                stack.push((e.path.clone(), fd));
            }
            st
        }
        .map_err(|err| Error::Read(full, err))?;
        let (ino, ctime) = (st.st_ino, meta::trusted_ctime(meta::ctime(&st), looked_at));
        if (e.ino, e.ctime) != (ino, ctime) {
            (e.ino, e.ctime) = (ino, ctime);
            moved.push(i);
        }
    }
    layer.segments = layer.segments.edited(moved.into_iter().map(|i| (i..i + 1, 1)));
    Ok(())
}
