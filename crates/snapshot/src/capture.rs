//! Capture: a task's upper directories into a manifest whose file contents
//! are chunks in the repository.
//!
//! Two passes keep the sandbox's freeze short. The first runs while the
//! sandbox works and reads everything changed since the baseline; the second
//! runs frozen, with the first's result as its baseline, so it only re-reads
//! what changed during the first. Reading is incremental by (inode, ctime,
//! mtime, size): any write, chmod, chown or xattr change moves the ctime.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use cairn_blob::{chunker, ObjectId, PackWriter, Repository};
use serde::Serialize;

use crate::freeze::{Freezer, Frozen};
use crate::manifest::{Entry, EntryKind, Extent, Index, LayerTree, Manifest, Timestamp};
use crate::meta::{self, IdShift};
use crate::progress::{Progress, Reporter};
use crate::sys::{self, XattrAt};
use crate::watch::ChangeWatch;
use crate::{Error, Result};

/// One writable layer of the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Its directory on the task disk (`root`, `at_usr`): the upper is
    /// `<disk>/<name>/upper`, overlayfs's work directory `<disk>/<name>/work`
    /// (never captured).
    pub name: String,
    /// Where it appears in the sandbox (`/`, `/usr`).
    pub at: PathBuf,
}

/// What a capture found and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CaptureStats {
    /// Regular files, directories and all entries in the manifest.
    pub files: u64,
    pub dirs: u64,
    pub entries: u64,
    /// Logical bytes of the regular files.
    pub bytes: u64,
    /// Files read (the rest were unchanged since the baseline) and their bytes,
    /// over both passes.
    pub files_read: u64,
    pub bytes_read: u64,
    /// From the repository: chunks that were new, bytes written to it.
    pub new_chunks: u64,
    pub stored_bytes: u64,
    /// How long the sandbox was frozen.
    pub freeze_ms: f64,
    /// Both passes looked only where the change tracking saw changes.
    pub tracked: bool,
    /// Entries the first pass could not take as they were (they changed or
    /// vanished while it looked): the frozen pass then walks everything,
    /// since no event may point at them again.
    pub unsettled: u64,
    pub duration_ms: f64,
}

/// Captures `layers` of the task disk mounted at `disk` (each layer's upper
/// read directly, as host root). Returns the stored manifest's id, the
/// manifest (the baseline for the next capture) and statistics.
///
/// `baseline` is the manifest of the last capture or restore of this disk:
/// files whose inode, ctime, mtime and size are unchanged are not read.
/// Owners are recorded relative to `ids`. The manifest is stored only after
/// every chunk it names is durable.
pub fn capture(
    repo: &Arc<Repository>,
    disk: &Path,
    layers: &[LayerSpec],
    baseline: Option<&Manifest>,
    ids: IdShift,
    freezer: &dyn Freezer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(ObjectId, Manifest, CaptureStats)> {
    run(repo, disk, layers, baseline.map(Cow::Borrowed), None, ids, freezer, progress)
}

/// [`capture`] that looks only at the directories `watch` saw change since
/// `baseline` was made, in both passes. `watch` must have been watching the
/// disk since then (started before the capture that made `baseline`, or
/// before this one, whose first pass then walks everything). Falls back to
/// walking everything when the watch lost an event or the layers hold a
/// file with more than one link.
#[allow(clippy::too_many_arguments)]
pub fn capture_tracked(
    repo: &Arc<Repository>,
    disk: &Path,
    layers: &[LayerSpec],
    baseline: Option<Manifest>,
    watch: &mut ChangeWatch,
    ids: IdShift,
    freezer: &dyn Freezer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(ObjectId, Manifest, CaptureStats)> {
    run(repo, disk, layers, baseline.map(Cow::Owned), Some(watch), ids, freezer, progress)
}

#[allow(clippy::too_many_arguments)]
fn run(
    repo: &Arc<Repository>,
    disk: &Path,
    layers: &[LayerSpec],
    baseline: Option<Cow<'_, Manifest>>,
    mut watch: Option<&mut ChangeWatch>,
    ids: IdShift,
    freezer: &dyn Freezer,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(ObjectId, Manifest, CaptureStats)> {
    let started = Instant::now();
    let mut report = Reporter::new(progress);
    let mut stats = CaptureStats::default();
    let mut writer = repo.writer();
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    let changed_since = |watch: &mut Option<&mut ChangeWatch>| match watch.as_deref_mut().map(|w| w.take(&names)) {
        Some(Ok(changed)) => changed,
        Some(Err(e)) => {
            tracing::warn!(disk = %disk.display(), "change tracking failed, walking everything: {e}");
            None
        }
        None => None,
    };

    // A pass borrows the writer, statistics and progress for its duration.
    macro_rules! pass {
        ($frozen:expr) => {
            Pass {
                writer: &mut writer,
                ids,
                stats: &mut stats,
                report: &mut report,
                frozen: $frozen,
                looked_at: SystemTime::now(),
                hard_links_seen: false,
            }
        };
    }
    // Taken even when the baseline cannot use it: what it held is walked now.
    let changed = changed_since(&mut watch);
    let mut first_tracked = false;
    let draft = match (baseline, changed) {
        (Some(base), Some(changed)) if !base.has_hard_links() => match pass!(false).rescan(disk, layers, &base, &changed)? {
            Some(changes) => {
                first_tracked = true;
                rescan::apply(base.into_owned(), changes)?
            }
            None => pass!(false).run(disk, layers, Some(&Index::new(&base)))?,
        },
        (base, _) => pass!(false).run(disk, layers, base.as_deref().map(Index::new).as_ref())?,
    };
    // Tracked, the frozen pass looks only where events point; an entry the
    // first pass left unsettled may have none, so then it walks everything.
    let tracked = watch.is_some() && !draft.has_hard_links() && stats.unsettled == 0;
    let draft_base = if tracked { None } else { Some(Index::new(&draft)) };

    // Compression of what pass 1 read must not share the CPU with the
    // frozen pass.
    writer.settle()?;
    let freeze_start = Instant::now();
    let frozen = Frozen::new(freezer)?;
    // Tracked, the frozen pass only finds what to change; the change is
    // made once the sandbox runs again.
    let result: Result<Second<'_>> = 'frozen: {
        if tracked {
            if let Some(changed) = changed_since(&mut watch) {
                match pass!(true).rescan(disk, layers, &draft, &changed) {
                    Ok(Some(changes)) => break 'frozen Ok(Second::Edits(changes)),
                    // A file with more links appeared meanwhile.
                    Ok(None) => {}
                    Err(e) => break 'frozen Err(e),
                }
            }
        }
        let built;
        let index = match &draft_base {
            Some(index) => index,
            None => {
                built = Index::new(&draft);
                &built
            }
        };
        pass!(true).run(disk, layers, Some(index)).map(Second::Whole)
    };
    fail::fail_point!("snapshot.frozen");
    let thawed = frozen.thaw();
    stats.freeze_ms = ms(freeze_start);
    drop(draft_base);
    let manifest = match result? {
        Second::Edits(changes) => {
            stats.tracked = first_tracked;
            rescan::apply(draft, changes)?
        }
        Second::Whole(manifest) => manifest,
    };
    thawed?;

    report.phase("store", 0, 0);
    // Only the segments of the manifest that changed are encoded. They go
    // into packs of their own: a pack of file contents then dies with
    // them, not kept whole by a segment that later snapshots still share.
    // The manifest object that lists them is written once every pack is
    // durable.
    let mut manifest = manifest;
    let mut segments = repo.writer();
    let root = crate::manifest::encode_root(&mut manifest, &mut |data| Ok(segments.add_chunk(data)?.0))?;
    let written = writer.finish()?;
    let segments = segments.finish()?;
    fail::fail_point!("snapshot.packs_written");
    let id = repo.put_manifest(&root)?;

    for e in manifest.layers.iter().flat_map(|l| &l.entries) {
        stats.entries += 1;
        match e.kind {
            EntryKind::Dir => stats.dirs += 1,
            EntryKind::File { .. } => stats.files += 1,
            _ => {}
        }
    }
    stats.bytes = manifest.total_bytes();
    stats.new_chunks = written.new_chunks + segments.new_chunks;
    stats.stored_bytes = written.stored_bytes + segments.stored_bytes;
    stats.duration_ms = ms(started);
    report.phase("done", stats.files_read, stats.bytes_read);
    Ok((id, manifest, stats))
}

/// What the frozen pass found: changes to the first pass's manifest, or a
/// whole new one.
enum Second<'s> {
    Edits(Vec<(&'s LayerSpec, rescan::LayerChange)>),
    Whole(Manifest),
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

mod rescan;

struct Pass<'a, 'r> {
    writer: &'a mut PackWriter,
    ids: IdShift,
    stats: &'a mut CaptureStats,
    report: &'a mut Reporter<'r>,
    /// The second pass: nothing may change under it, so a file that does is
    /// an error rather than something to look at again.
    frozen: bool,
    /// Taken before the pass looks at anything (see [`meta::trusted_ctime`]).
    looked_at: SystemTime,
    /// A file with more than one link was looked at: the other names'
    /// directories may have changed unseen, so a partial pass cannot be
    /// trusted (see [`crate::watch`]).
    hard_links_seen: bool,
}

/// What [`Pass::look`] found at one name.
struct Looked {
    entry: Entry,
    /// A regular file whose contents must be read.
    read: bool,
    /// A directory, to walk below.
    below: Option<Frame>,
}

/// A directory being walked: its descriptor, path and sorted names.
struct Frame {
    fd: OwnedFd,
    path: PathBuf,
    names: std::vec::IntoIter<std::ffi::CString>,
}

impl Pass<'_, '_> {
    fn run(mut self, disk: &Path, layers: &[LayerSpec], base: Option<&Index<'_>>) -> Result<Manifest> {
        self.report.phase(if self.frozen { "frozen" } else { "scan" }, 0, 0);
        let mut walked = Vec::new();
        for spec in layers {
            let upper = disk.join(&spec.name).join("upper");
            let root = match sys::open_dir(&upper) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(Error::Read(upper, e)),
            };
            let prev = base.and_then(|b| b.layer(&spec.name));
            let (entries, to_read) = self.walk(root.as_fd(), &upper, prev)?;
            walked.push((spec, upper, root, entries, to_read));
        }

        let files_total = walked.iter().map(|w| w.4.len() as u64).sum();
        let bytes_total = walked
            .iter()
            .flat_map(|w| w.4.iter().map(|&i| if let EntryKind::File { size, .. } = w.3[i].kind { size } else { 0 }))
            .sum();
        if !self.frozen {
            self.report.phase("read", files_total, bytes_total);
        } else {
            self.report.now.files_total = files_total;
            self.report.now.bytes_total = bytes_total;
        }
        let mut trees = Vec::with_capacity(walked.len());
        for (spec, upper, root, mut entries, to_read) in walked {
            for i in to_read {
                self.read_file(root.as_fd(), &upper, &mut entries[i])?;
            }
            trees.push(LayerTree::new(spec.name.clone(), spec.at.clone(), entries));
        }
        self.report.force();
        Ok(Manifest::new(trees))
    }

    /// Lists the layer depth first, names sorted (which is path order),
    /// staying on the layer's filesystem. Returns the entries and the indexes
    /// of the regular files whose contents must be read.
    fn walk(
        &mut self,
        root: BorrowedFd<'_>,
        upper: &Path,
        prev: Option<&HashMap<&Path, &Entry>>,
    ) -> Result<(Vec<Entry>, Vec<usize>)> {
        let read_err = |p: &Path, e| Error::Read(upper.join(p), e);
        let st = sys::fstat(root).map_err(|e| read_err(Path::new(""), e))?;
        let mut entries = Vec::with_capacity(prev.map_or(64, HashMap::len));
        let mut to_read = Vec::new();

        let root_prev = prev.and_then(|p| p.get(Path::new(""))).copied();
        let xattrs = match root_prev.filter(|p| meta::unchanged(p, &st, libc::S_IFDIR)) {
            Some(p) => p.xattrs.clone(),
            None => meta::read_xattrs(&XattrAt::Fd(root)).map_err(|e| read_err(Path::new(""), e))?,
        };
        entries.push(self.entry(PathBuf::new(), EntryKind::Dir, &st, xattrs));
        let names = sys::read_dir(root).map_err(|e| read_err(Path::new(""), e))?;
        let root_fd = root.try_clone_to_owned().map_err(|e| read_err(Path::new(""), e))?;
        let dir = Frame { fd: root_fd, path: PathBuf::new(), names: names.into_iter() };
        let lookup = |p: &Path| prev.and_then(|m| m.get(p).copied());
        self.walk_below(dir, upper, st.st_dev, &lookup, &mut entries, &mut to_read)?;
        Ok((entries, to_read))
    }

    /// Appends everything below the directory `top` to `entries` (depth
    /// first, in path order) and the indexes of the files to read to
    /// `to_read`; `prev` gives the baseline's entry at a path.
    fn walk_below<'p>(
        &mut self,
        top: Frame,
        upper: &Path,
        dev: u64,
        prev: &dyn Fn(&Path) -> Option<&'p Entry>,
        entries: &mut Vec<Entry>,
        to_read: &mut Vec<usize>,
    ) -> Result<()> {
        let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
        let mut stack = vec![top];
        while let Some(top) = stack.last_mut() {
            let Some(name) = top.names.next() else {
                stack.pop();
                continue;
            };
            let path = top.path.join(OsStr::from_bytes(name.to_bytes()));
            let dir = top.fd.as_fd();
            let old = prev(&path);
            let Some(looked) = self.look(dir, &name, path, upper, dev, old, &mut links, true)? else { continue };
            if looked.read {
                to_read.push(entries.len());
            }
            if let Some(frame) = looked.below {
                stack.push(frame);
            }
            entries.push(looked.entry);
        }
        Ok(())
    }

    /// Looks at `name` in `dir` (at `path` in the layer): its entry, reusing
    /// `prev`'s when the stat says it is unchanged, and for a directory an
    /// open descriptor and its names, to walk below (unless it is the
    /// directory `prev` describes and `open_known_dirs` is false). None: it vanished while
    /// the sandbox ran (or is a mount point, left out).
    #[allow(clippy::too_many_arguments)]
    fn look(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        path: PathBuf,
        upper: &Path,
        dev: u64,
        prev: Option<&Entry>,
        links: &mut HashMap<(u64, u64), PathBuf>,
        open_known_dirs: bool,
    ) -> Result<Option<Looked>> {
        let Some(st) = self.vanished_is_ok(sys::lstat_at(dir, name), upper, &path)? else { return Ok(None) };
        let ft = meta::file_type(&st);
        if ft == libc::S_IFDIR && st.st_dev != dev {
            tracing::warn!(path = %upper.join(&path).display(), "mount point in a layer left out of the snapshot");
            return Ok(None);
        }
        let whiteout = ft == libc::S_IFCHR && st.st_rdev == 0;
        let linked = ft != libc::S_IFDIR && !whiteout && st.st_nlink > 1;
        if linked {
            self.hard_links_seen = true;
        }
        if let Some(first) = links.get(&(st.st_dev, st.st_ino)).filter(|_| linked) {
            let kind = EntryKind::HardLink { to: first.clone() };
            let xattrs = XattrAt::name_in(dir, name).and_then(|at| meta::read_xattrs(&at));
            let Some(xattrs) = self.vanished_is_ok(xattrs, upper, &path)? else { return Ok(None) };
            return Ok(Some(Looked { entry: self.entry(path, kind, &st, xattrs), read: false, below: None }));
        }

        // A file is reused only while all its chunks are still stored: a
        // lost pack must not be carried silently into every later snapshot.
        let same = prev.filter(|p| meta::unchanged(p, &st, ft)).filter(|p| match &p.kind {
            EntryKind::File { extents, .. } => extents.iter().flat_map(|e| &e.chunks).all(|c| self.writer.knows(c)),
            _ => true,
        });
        let mut child = None;
        let mut read = false;
        let kind = match (ft, same) {
            // The same directory as before: the caller keeps what is below.
            (libc::S_IFDIR, _) if !open_known_dirs && prev.is_some_and(|p| p.kind == EntryKind::Dir && p.ino == st.st_ino) => EntryKind::Dir,
            (libc::S_IFDIR, _) => {
                let Some(fd) = self.vanished_is_ok(sys::open_dir_at(dir, name), upper, &path)? else { return Ok(None) };
                child = Some(fd);
                EntryKind::Dir
            }
            (libc::S_IFREG | libc::S_IFLNK, Some(p)) => p.kind.clone(),
            (libc::S_IFREG, None) => {
                read = true;
                EntryKind::File { size: st.st_size as u64, extents: Vec::new() }
            }
            (libc::S_IFLNK, None) => {
                let Some(target) = self.vanished_is_ok(sys::readlink_at(dir, name), upper, &path)? else { return Ok(None) };
                EntryKind::Symlink { target: PathBuf::from(std::ffi::OsString::from_vec(target)) }
            }
            (libc::S_IFCHR, _) if whiteout => EntryKind::Whiteout,
            (libc::S_IFCHR, _) => EntryKind::CharDev { rdev: st.st_rdev },
            (libc::S_IFBLK, _) => EntryKind::BlockDev { rdev: st.st_rdev },
            (libc::S_IFIFO, _) => EntryKind::Fifo,
            _ => EntryKind::Socket,
        };
        let xattrs = match (same, &child) {
            (Some(p), _) => Ok(p.xattrs.clone()),
            (None, Some(fd)) => meta::read_xattrs(&XattrAt::Fd(fd.as_fd())),
            (None, None) => XattrAt::name_in(dir, name).and_then(|at| meta::read_xattrs(&at)),
        };
        let Some(xattrs) = self.vanished_is_ok(xattrs, upper, &path)? else { return Ok(None) };
        let names = match &child {
            Some(fd) => match self.vanished_is_ok(sys::read_dir(fd.as_fd()), upper, &path)? {
                Some(names) => names,
                None => return Ok(None),
            },
            None => Vec::new(),
        };
        if linked {
            links.insert((st.st_dev, st.st_ino), path.clone());
        }
        let mut entry = self.entry(path, kind, &st, xattrs);
        let below = match child {
            Some(fd) => {
                // Replaced between the stat and the open: look again next pass.
                if sys::fstat(fd.as_fd()).map_or(true, |s| s.st_ino != st.st_ino) {
                    entry.ctime = Timestamp::UNKNOWN;
                    self.stats.unsettled += 1;
                }
                Some(Frame { fd, path: entry.path.clone(), names: names.into_iter() })
            }
            None => None,
        };
        Ok(Some(Looked { entry, read, below }))
    }

    /// While the sandbox runs, an entry may vanish or change type between
    /// two calls: the first pass leaves it to the second (None). Frozen,
    /// every error is one.
    fn vanished_is_ok<T>(&mut self, r: io::Result<T>, upper: &Path, path: &Path) -> Result<Option<T>> {
        const VANISHED: [i32; 5] = [libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::EINVAL, libc::ENODATA];
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if !self.frozen && e.raw_os_error().is_some_and(|n| VANISHED.contains(&n)) => {
                self.stats.unsettled += 1;
                Ok(None)
            }
            Err(e) => Err(Error::Read(upper.join(path), e)),
        }
    }

    fn entry(
        &self,
        path: PathBuf,
        kind: EntryKind,
        st: &sys::Stat,
        xattrs: Vec<(crate::ByteBuf, crate::ByteBuf)>,
    ) -> Entry {
        Entry {
            path,
            kind,
            mode: st.st_mode & 0o7777,
            uid: self.ids.to_relative(st.st_uid),
            gid: self.ids.to_relative(st.st_gid),
            mtime: meta::mtime(st),
            xattrs,
            ino: st.st_ino,
            ctime: meta::trusted_ctime(meta::ctime(st), self.looked_at),
        }
    }

    /// Reads a regular file's data regions into chunks and fills in its
    /// extents. The file is opened beneath the upper without following any
    /// symlink; if it changed since the walk, its ctime is recorded as
    /// unknown so that the next pass reads it again.
    fn read_file(&mut self, root: BorrowedFd<'_>, upper: &Path, e: &mut Entry) -> Result<()> {
        let full = upper.join(&e.path);
        let open = sys::cstr(e.path.as_os_str())
            .and_then(|c| sys::open_beneath_same_fs(root, c.as_c_str(), sys::OFlags::RDONLY | sys::OFlags::NONBLOCK | sys::OFlags::NOCTTY, 0));
        let fd = match open {
            Ok(fd) => fd,
            Err(_) if !self.frozen => {
                e.ctime = Timestamp::UNKNOWN;
                self.stats.unsettled += 1;
                return Ok(());
            }
            Err(err) => return Err(Error::Read(full, err)),
        };
        let looked_at = SystemTime::now();
        let before = sys::fstat(fd.as_fd()).map_err(|err| Error::Read(full.clone(), err))?;
        if meta::file_type(&before) != libc::S_IFREG || before.st_ino != e.ino {
            if self.frozen {
                return Err(Error::Read(full, io::Error::other("replaced while the sandbox was frozen")));
            }
            e.ctime = Timestamp::UNKNOWN;
            self.stats.unsettled += 1;
            return Ok(());
        }
        let size = before.st_size as u64;
        let regions = meta::data_regions(fd.as_fd(), size).map_err(|err| Error::Read(full.clone(), err))?;
        let file = std::fs::File::from(fd);
        let mut extents = Vec::with_capacity(regions.len());
        let mut read = 0;
        for (offset, len) in regions {
            let mut chunks = Vec::new();
            let mut reader = ReadAt { file: &file, pos: offset, end: offset + len, err: None };
            let writer = &mut *self.writer;
            let report = &mut *self.report;
            let n = chunker::for_each_chunk(&mut reader, &mut |data: &[u8]| {
                chunks.push(writer.add_chunk(data)?.0);
                report.add(0, data.len() as u64);
                Ok(())
            });
            let n = match (n, reader.err.take()) {
                (Ok(n), _) => n,
                (Err(_), Some(io)) => return Err(Error::Read(full, io)),
                (Err(blob), None) => return Err(blob.into()),
            };
            read += n;
            if n > 0 {
                extents.push(Extent { offset, len: n, chunks });
            }
        }
        let after = sys::fstat(file.as_fd()).map_err(|err| Error::Read(full.clone(), err))?;
        let stable = meta::ctime(&after) == meta::ctime(&before) && after.st_size == before.st_size;
        if !stable {
            self.stats.unsettled += 1;
        }
        e.kind = EntryKind::File { size, extents };
        // The descriptor's stat is what the contents read correspond to.
        e.mode = before.st_mode & 0o7777;
        e.uid = self.ids.to_relative(before.st_uid);
        e.gid = self.ids.to_relative(before.st_gid);
        e.mtime = meta::mtime(&before);
        e.ctime = if stable { meta::trusted_ctime(meta::ctime(&before), looked_at) } else { Timestamp::UNKNOWN };
        self.stats.files_read += 1;
        self.stats.bytes_read += read;
        self.report.add(1, 0);
        Ok(())
    }
}

/// Reads `pos..end` of a file with `pread`, keeping the I/O error (the
/// chunker reports only its own error type).
struct ReadAt<'f> {
    file: &'f std::fs::File,
    pos: u64,
    end: u64,
    err: Option<io::Error>,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min((self.end - self.pos) as usize);
        if want == 0 {
            return Ok(0);
        }
        match self.file.read_at(&mut buf[..want], self.pos) {
            Ok(n) => {
                self.pos += n as u64;
                Ok(n)
            }
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.err = Some(e);
                Err(copy)
            }
        }
    }
}
