//! Capture: a task's upper directories into a manifest whose file contents
//! are chunks in the repository.
//!
//! Two passes keep the sandbox's freeze short. The first runs while the
//! sandbox works and reads everything changed since the baseline; the second
//! runs frozen, with the first's result as its baseline, so it only re-reads
//! what changed during the first. Reading is incremental by (inode, ctime,
//! mtime, size): any write, chmod, chown or xattr change moves the ctime.

use std::collections::HashMap;
use std::ffi::OsStr;
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
use crate::manifest::{encode, Entry, EntryKind, Extent, Index, LayerTree, Manifest, Timestamp};
use crate::meta::{self, IdShift};
use crate::progress::{Progress, Reporter};
use crate::sys::{self, XattrAt};
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
    let started = Instant::now();
    let mut report = Reporter::new(progress);
    let mut stats = CaptureStats::default();
    let mut writer = repo.writer();

    let mut pass = |writer: &mut PackWriter, frozen: bool, base: Option<&Index<'_>>| {
        let looked_at = SystemTime::now();
        Pass { writer, ids, stats: &mut stats, report: &mut report, frozen, looked_at }.run(disk, layers, base)
    };
    let base = baseline.map(Index::new);
    let draft = pass(&mut writer, false, base.as_ref())?;
    let draft_base = Index::new(&draft);

    // Compression of what pass 1 read must not share the CPU with the
    // frozen pass.
    writer.settle()?;
    let freeze_start = Instant::now();
    let frozen = Frozen::new(freezer)?;
    let result = pass(&mut writer, true, Some(&draft_base));
    fail::fail_point!("snapshot.frozen");
    let thawed = frozen.thaw();
    stats.freeze_ms = ms(freeze_start);
    let manifest = result?;
    thawed?;

    report.phase("store", 0, 0);
    // Encode the manifest on another core while the packs and the index are
    // made durable; it is written only after them.
    let (written, encoded) = std::thread::scope(|scope| {
        let encoding = scope.spawn(|| -> Result<cairn_blob::PreparedManifest> { Ok(cairn_blob::prepare_manifest(&encode(&manifest)?)?) });
        let written = writer.finish();
        (written, encoding.join())
    });
    let written = written?;
    fail::fail_point!("snapshot.packs_written");
    let prepared = encoded.map_err(|_| Error::Encode("the manifest encoder panicked".into()))??;
    let id = repo.put_prepared_manifest(prepared)?;

    for e in manifest.layers.iter().flat_map(|l| &l.entries) {
        stats.entries += 1;
        match e.kind {
            EntryKind::Dir => stats.dirs += 1,
            EntryKind::File { .. } => stats.files += 1,
            _ => {}
        }
    }
    stats.bytes = manifest.total_bytes();
    stats.new_chunks = written.new_chunks;
    stats.stored_bytes = written.stored_bytes;
    stats.duration_ms = ms(started);
    report.phase("done", stats.files_read, stats.bytes_read);
    Ok((id, manifest, stats))
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

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
            trees.push(LayerTree { name: spec.name.clone(), at: spec.at.clone(), entries });
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
        let dev = st.st_dev;
        let mut entries = Vec::with_capacity(prev.map_or(64, HashMap::len));
        let mut to_read = Vec::new();
        let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();

        let root_prev = prev.and_then(|p| p.get(Path::new(""))).copied();
        let xattrs = match root_prev.filter(|p| meta::unchanged(p, &st, libc::S_IFDIR)) {
            Some(p) => p.xattrs.clone(),
            None => meta::read_xattrs(&XattrAt::Fd(root)).map_err(|e| read_err(Path::new(""), e))?,
        };
        entries.push(self.entry(PathBuf::new(), EntryKind::Dir, &st, xattrs));
        let names = sys::read_dir(root).map_err(|e| read_err(Path::new(""), e))?;
        let root_fd = root.try_clone_to_owned().map_err(|e| read_err(Path::new(""), e))?;
        let mut stack = vec![Frame { fd: root_fd, path: PathBuf::new(), names: names.into_iter() }];

        while let Some(top) = stack.last_mut() {
            let Some(name) = top.names.next() else {
                stack.pop();
                continue;
            };
            let dir = top.fd.as_fd();
            let path = top.path.join(OsStr::from_bytes(name.to_bytes()));
            let Some(st) = self.vanished_is_ok(sys::lstat_at(dir, &name), upper, &path)? else { continue };
            let ft = meta::file_type(&st);
            if ft == libc::S_IFDIR && st.st_dev != dev {
                tracing::warn!(path = %upper.join(&path).display(), "mount point in a layer left out of the snapshot");
                continue;
            }
            let whiteout = ft == libc::S_IFCHR && st.st_rdev == 0;
            let linked = ft != libc::S_IFDIR && !whiteout && st.st_nlink > 1;
            if let Some(first) = links.get(&(st.st_dev, st.st_ino)).filter(|_| linked) {
                let kind = EntryKind::HardLink { to: first.clone() };
                let xattrs = XattrAt::name_in(dir, &name).and_then(|at| meta::read_xattrs(&at));
                let Some(xattrs) = self.vanished_is_ok(xattrs, upper, &path)? else { continue };
                entries.push(self.entry(path, kind, &st, xattrs));
                continue;
            }

            // A file is reused only while all its chunks are still stored: a
            // lost pack must not be carried silently into every later snapshot.
            let same = prev
                .and_then(|p| p.get(path.as_path()))
                .copied()
                .filter(|p| meta::unchanged(p, &st, ft))
                .filter(|p| match &p.kind {
                    EntryKind::File { extents, .. } => extents.iter().flat_map(|e| &e.chunks).all(|c| self.writer.knows(c)),
                    _ => true,
                });
            let mut child = None;
            let mut read = false;
            let kind = match (ft, same) {
                (libc::S_IFDIR, _) => {
                    let Some(fd) = self.vanished_is_ok(sys::open_dir_at(dir, &name), upper, &path)? else { continue };
                    child = Some(fd);
                    EntryKind::Dir
                }
                (libc::S_IFREG | libc::S_IFLNK, Some(p)) => p.kind.clone(),
                (libc::S_IFREG, None) => {
                    read = true;
                    EntryKind::File { size: st.st_size as u64, extents: Vec::new() }
                }
                (libc::S_IFLNK, None) => {
                    let Some(target) = self.vanished_is_ok(sys::readlink_at(dir, &name), upper, &path)? else { continue };
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
                (None, None) => XattrAt::name_in(dir, &name).and_then(|at| meta::read_xattrs(&at)),
            };
            let Some(xattrs) = self.vanished_is_ok(xattrs, upper, &path)? else { continue };
            let names = match &child {
                Some(fd) => match self.vanished_is_ok(sys::read_dir(fd.as_fd()), upper, &path)? {
                    Some(names) => names,
                    None => continue,
                },
                None => Vec::new(),
            };
            if linked {
                links.insert((st.st_dev, st.st_ino), path.clone());
            }
            if read {
                to_read.push(entries.len());
            }
            let mut entry = self.entry(path, kind, &st, xattrs);
            if let Some(fd) = child {
                // Replaced between the stat and the open: look again next pass.
                if sys::fstat(fd.as_fd()).map_or(true, |s| s.st_ino != st.st_ino) {
                    entry.ctime = Timestamp::UNKNOWN;
                }
                stack.push(Frame { fd, path: entry.path.clone(), names: names.into_iter() });
            }
            entries.push(entry);
        }
        Ok((entries, to_read))
    }

    /// While the sandbox runs, an entry may vanish or change type between
    /// two calls: the first pass leaves it to the second (None). Frozen,
    /// every error is one.
    fn vanished_is_ok<T>(&self, r: io::Result<T>, upper: &Path, path: &Path) -> Result<Option<T>> {
        const VANISHED: [i32; 5] = [libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::EINVAL, libc::ENODATA];
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if !self.frozen && e.raw_os_error().is_some_and(|n| VANISHED.contains(&n)) => Ok(None),
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
