//! The tracked pass: only the directories a [`crate::ChangeWatch`] saw
//! change are looked at again, and the result is a list of edits to the
//! baseline's sorted entries, so the cost follows what changed rather than
//! what exists.
//!
//! A changed directory is listed and each of its names compared with the
//! baseline (by inode, ctime, mtime and size, as the full walk does); a
//! name that is new, or a directory replaced by another inode, is walked
//! whole. A directory is found in the baseline by binary search and its
//! children by skipping over their subtrees, which are contiguous because
//! entries are sorted component-wise.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::CString;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{Frame, Pass};
use crate::manifest::{Entry, EntryKind, LayerTree, Manifest};
use crate::meta;
use crate::sys::{self, XattrAt};
use crate::watch::Changed;
use crate::{Error, LayerSpec, Result};

/// Replace `range` of a layer's entries with `with` (an empty range inserts).
#[derive(Debug)]
pub(crate) struct Edit {
    range: Range<usize>,
    with: Vec<Entry>,
}

/// What became of one layer.
#[derive(Debug)]
pub(crate) enum LayerChange {
    /// Its upper directory is gone: left out, as the full walk does.
    Absent,
    /// The baseline's entries with these edits.
    Edited(Vec<Edit>),
    /// Not in the baseline: walked whole.
    Walked(Vec<Entry>),
}

/// Files to read: (edit, entry) pairs.
type ToRead = Vec<(usize, usize)>;

/// One layer's files to read once every layer was looked at: the layer's
/// place in the output, its upper's descriptor and path.
struct LayerReads {
    layer: usize,
    root: OwnedFd,
    upper: PathBuf,
    files: ToRead,
}

const VANISHED: [i32; 3] = [libc::ENOENT, libc::ENOTDIR, libc::ELOOP];

impl Pass<'_, '_> {
    /// Looks at the `changed` directories of each layer against `base`.
    /// None when a file with more than one link was seen: a full walk is
    /// needed (nothing was read then).
    pub(super) fn rescan<'s>(mut self, disk: &Path, layers: &'s [LayerSpec], base: &Manifest, changed: &Changed) -> Result<Option<Vec<(&'s LayerSpec, LayerChange)>>> {
        self.report.phase(if self.frozen { "frozen" } else { "scan" }, 0, 0);
        let none = BTreeSet::new();
        let mut out = Vec::with_capacity(layers.len());
        let mut reads: Vec<LayerReads> = Vec::new();
        for spec in layers {
            let upper = disk.join(&spec.name).join("upper");
            let root = match sys::open_dir(&upper) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    out.push((spec, LayerChange::Absent));
                    continue;
                }
                Err(e) => return Err(Error::Read(upper, e)),
            };
            match base.layer(&spec.name) {
                Some(old) => {
                    let dirs = changed.get(&spec.name).unwrap_or(&none);
                    let (edits, to_read) = self.rescan_layer(root.as_fd(), &upper, &old.entries, dirs)?;
                    reads.push(LayerReads { layer: out.len(), root, upper, files: to_read });
                    out.push((spec, LayerChange::Edited(edits)));
                }
                None => {
                    let (entries, to_read) = self.walk(root.as_fd(), &upper, None)?;
                    reads.push(LayerReads { layer: out.len(), root, upper, files: to_read.into_iter().map(|i| (0, i)).collect() });
                    out.push((spec, LayerChange::Walked(entries)));
                }
            }
        }
        if self.hard_links_seen {
            return Ok(None);
        }
        let files_total = reads.iter().map(|r| r.files.len() as u64).sum();
        if !self.frozen {
            self.report.phase("read", files_total, 0);
        }
        for LayerReads { layer, root, upper, files } in reads {
            for (edit, i) in files {
                let entry = match &mut out[layer].1 {
                    LayerChange::Edited(edits) => &mut edits[edit].with[i],
                    LayerChange::Walked(entries) => &mut entries[i],
                    LayerChange::Absent => continue,
                };
                self.read_file(root.as_fd(), &upper, entry)?;
            }
        }
        self.report.force();
        Ok(Some(out))
    }

    /// The edits that bring `old` (one layer's sorted entries) up to date
    /// for the directories `dirs`, and the files among them to read (edit,
    /// entry).
    fn rescan_layer(
        &mut self,
        root: BorrowedFd<'_>,
        upper: &Path,
        old: &[Entry],
        dirs: &BTreeSet<PathBuf>,
    ) -> Result<(Vec<Edit>, ToRead)> {
        let dev = sys::fstat(root).map_err(|e| Error::Read(upper.to_owned(), e))?.st_dev;
        let mut edits = Vec::new();
        let mut to_read = Vec::new();
        // Subtrees walked afresh or removed: changed directories inside
        // them are already accounted for.
        let mut settled: HashSet<PathBuf> = HashSet::new();
        let mut rescanned: HashSet<&Path> = HashSet::new();
        // Sorted, so a directory comes before the directories inside it.
        for d in dirs {
            if d.ancestors().any(|a| settled.contains(a)) {
                continue;
            }
            // A directory new since the baseline is walked by its parent's rescan.
            let Ok(at) = old.binary_search_by(|e| e.path.as_path().cmp(d)) else { continue };
            if old[at].kind != EntryKind::Dir {
                continue;
            }
            let opened = if d.as_os_str().is_empty() {
                root.try_clone_to_owned()
            } else {
                sys::open_beneath_same_fs(root, d.as_path(), sys::OFlags::RDONLY | sys::OFlags::DIRECTORY, 0)
            };
            let fd = match opened {
                Ok(fd) => fd,
                // Gone or moved: the rescan of its parent says where.
                Err(e) if e.raw_os_error().is_some_and(|n| VANISHED.contains(&n)) => {
                    self.stats.unsettled += 1;
                    continue;
                }
                Err(e) => return Err(Error::Read(upper.join(d), e)),
            };
            let read_err = |e| Error::Read(upper.join(d), e);
            let st = sys::fstat(fd.as_fd()).map_err(read_err)?;
            let end = subtree_end(old, at);
            let names = sys::read_dir(fd.as_fd()).map_err(read_err)?;
            let xattrs_now = |fd: &OwnedFd| meta::read_xattrs(&XattrAt::Fd(fd.as_fd())).map_err(|e| Error::Read(upper.join(d), e));
            if st.st_ino != old[at].ino {
                // Another directory at this path, unseen by its parent's rescan.
                let own = self.entry(d.clone(), EntryKind::Dir, &st, xattrs_now(&fd)?);
                let top = Frame { fd, path: d.clone(), names: names.into_iter() };
                let (with, reads) = self.walked(own, Some(top), upper, dev)?;
                push(&mut edits, &mut to_read, at..end, with, reads);
                settled.insert(d.clone());
                continue;
            }
            if !d.parent().is_some_and(|p| rescanned.contains(p)) {
                // Its own entry (a parent that was rescanned did it already).
                let own = if meta::unchanged(&old[at], &st, libc::S_IFDIR) {
                    old[at].clone()
                } else {
                    self.entry(d.clone(), EntryKind::Dir, &st, xattrs_now(&fd)?)
                };
                if own != old[at] {
                    push(&mut edits, &mut to_read, at..at + 1, vec![own], Vec::new());
                }
            }
            self.rescan_children(fd.as_fd(), d, names, upper, dev, old, at + 1..end, &mut edits, &mut to_read, &mut settled)?;
            rescanned.insert(d.as_path());
        }
        Ok((edits, to_read))
    }

    /// Compares the names now in directory `d` with its children in
    /// `old[within]` and records the edits.
    #[allow(clippy::too_many_arguments)]
    fn rescan_children(
        &mut self,
        fd: BorrowedFd<'_>,
        d: &Path,
        names: Vec<CString>,
        upper: &Path,
        dev: u64,
        old: &[Entry],
        within: Range<usize>,
        edits: &mut Vec<Edit>,
        to_read: &mut ToRead,
        settled: &mut HashSet<PathBuf>,
    ) -> Result<()> {
        let mut children = Vec::new();
        let mut i = within.start;
        while i < within.end {
            let end = if old[i].kind == EntryKind::Dir { subtree_end(old, i) } else { i + 1 };
            children.push(i..end);
            i = end;
        }
        let mut links = HashMap::new();
        let mut before = children.into_iter().peekable();
        let mut now = names.into_iter().peekable();
        loop {
            let old_name = before.peek().map(|r| old[r.start].path.file_name().map_or(&[][..], |n| n.as_bytes()));
            let order = match (old_name, now.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(o), Some(n)) => o.cmp(n.to_bytes()),
            };
            let (range, name) = match order {
                std::cmp::Ordering::Less => (before.next(), None),
                std::cmp::Ordering::Greater => (None, now.next()),
                std::cmp::Ordering::Equal => (before.next(), now.next()),
            };
            let prev = range.as_ref().map(|r| &old[r.start]);
            let looked = match &name {
                Some(name) => {
                    let path = d.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
                    self.look(fd, name, path, upper, dev, prev, &mut links, false)?
                }
                None => None,
            };
            let Some(looked) = looked else {
                // Removed (or vanished while it ran: the next pass looks again).
                if let Some(r) = range {
                    settled.insert(old[r.start].path.clone());
                    push(edits, to_read, r, Vec::new(), Vec::new());
                }
                continue;
            };
            let range = match range {
                Some(r) => r,
                None => {
                    let at = old.partition_point(|e| e.path < looked.entry.path);
                    at..at
                }
            };
            // The same node: a directory whose subtree stays as it was, or a
            // non-directory where one was. Only its own entry may change.
            let kept_dir = looked.entry.kind == EntryKind::Dir && looked.below.is_none();
            let same_node = kept_dir || (looked.entry.kind != EntryKind::Dir && prev.is_some_and(|p| p.kind != EntryKind::Dir));
            if same_node {
                if looked.read || prev != Some(&looked.entry) {
                    let reads = if looked.read { vec![0] } else { Vec::new() };
                    push(edits, to_read, range.start..range.start + 1, vec![looked.entry], reads);
                }
                continue;
            }
            if prev.is_some_and(|p| p.kind == EntryKind::Dir) || looked.below.is_some() {
                settled.insert(looked.entry.path.clone());
            }
            let read = looked.read;
            let (with, mut reads) = self.walked(looked.entry, looked.below, upper, dev)?;
            if read {
                reads.insert(0, 0);
            }
            push(edits, to_read, range, with, reads);
        }
        Ok(())
    }

    /// `own` and, for a directory, everything below it, walked with no
    /// baseline; and the indexes of the files to read among them.
    fn walked(&mut self, own: Entry, below: Option<Frame>, upper: &Path, dev: u64) -> Result<(Vec<Entry>, Vec<usize>)> {
        let mut entries = vec![own];
        let mut reads = Vec::new();
        if let Some(top) = below {
            self.walk_below(top, upper, dev, &|_| None, &mut entries, &mut reads)?;
        }
        Ok((entries, reads))
    }
}

fn push(edits: &mut Vec<Edit>, to_read: &mut ToRead, range: Range<usize>, with: Vec<Entry>, reads: Vec<usize>) {
    to_read.extend(reads.into_iter().map(|i| (edits.len(), i)));
    edits.push(Edit { range, with });
}

/// The end of the subtree of `old[at]`: its entries are the ones after it
/// whose paths start with its path.
fn subtree_end(old: &[Entry], at: usize) -> usize {
    let top = old[at].path.as_path();
    at + 1 + old[at + 1..].partition_point(|e| e.path.starts_with(top))
}

/// The baseline with `changes` (one per layer the capture looked at) made.
pub(crate) fn apply(base: Manifest, changes: Vec<(&LayerSpec, LayerChange)>) -> Result<Manifest> {
    let mut old: HashMap<String, LayerTree> = base.layers.into_iter().map(|l| (l.name.clone(), l)).collect();
    let mut trees = Vec::with_capacity(changes.len());
    for (spec, change) in changes {
        let entries = match change {
            LayerChange::Absent => continue,
            LayerChange::Walked(entries) => entries,
            LayerChange::Edited(mut edits) => {
                let prev = old.remove(&spec.name).ok_or_else(|| Error::Invalid(spec.name.clone(), PathBuf::new(), "edits of a layer the baseline lacks"))?;
                sort(&mut edits);
                let segments = prev.segments.edited(edits.iter().map(|e| (e.range.clone(), e.with.len())));
                let entries = edited(&spec.name, prev.entries, edits)?;
                trees.push(LayerTree { name: spec.name.clone(), at: spec.at.clone(), entries, segments });
                continue;
            }
        };
        trees.push(LayerTree::new(spec.name.clone(), spec.at.clone(), entries));
    }
    Ok(Manifest::new(trees))
}

/// Puts edits in the order they apply: inserts before a replacement at the
/// same place, two inserts at one place by path.
fn sort(edits: &mut [Edit]) {
    edits.sort_by(|a, b| (a.range.start, a.range.end).cmp(&(b.range.start, b.range.end)).then_with(|| first_path(a).cmp(first_path(b))));
}

/// `old` with `edits` (sorted) made: in place when every edit replaces as
/// many entries as it removes (files and directories changed, none added
/// or removed: the common case, and no cost for the entries around them),
/// else in one pass that moves every entry.
fn edited(layer: &str, mut old: Vec<Entry>, edits: Vec<Edit>) -> Result<Vec<Entry>> {
    let overlapping = |edit: &Edit| {
        let at = edit.with.first().map(|e| e.path.clone()).unwrap_or_default();
        Error::Invalid(layer.to_owned(), at, "overlapping edits of a tracked capture")
    };
    if edits.iter().all(|e| e.range.len() == e.with.len()) {
        let mut next = 0;
        for edit in edits {
            if edit.range.start < next || edit.range.end > old.len() {
                return Err(overlapping(&edit));
            }
            next = edit.range.end;
            for (slot, entry) in old[edit.range].iter_mut().zip(edit.with) {
                *slot = entry;
            }
        }
        return Ok(old);
    }
    let grows: usize = edits.iter().map(|e| e.with.len()).sum();
    let mut out = Vec::with_capacity(old.len() + grows);
    let len = old.len();
    let mut old = old.into_iter();
    let mut next = 0;
    for edit in edits {
        if edit.range.start < next || edit.range.end > len {
            return Err(overlapping(&edit));
        }
        out.extend(old.by_ref().take(edit.range.start - next));
        old.by_ref().take(edit.range.len()).for_each(drop);
        next = edit.range.end;
        out.extend(edit.with);
    }
    out.extend(old);
    Ok(out)
}

fn first_path(e: &Edit) -> &Path {
    e.with.first().map_or(Path::new(""), |e| e.path.as_path())
}
