//! The stored form of a manifest's entries (format 2): each layer's sorted
//! entries are cut into segments, about [`AVERAGE`] entries each, and each
//! segment is stored as one chunk of the repository (packed, compressed,
//! deduplicated like file contents, in packs of their own). The manifest
//! object lists the segments.
//!
//! A segment ends after an entry whose path hashes to a boundary, so where
//! the cuts fall depends on the paths near them only: a change to a few
//! entries changes the segments that hold them and no others. The
//! in-memory manifest remembers each segment's length and id
//! ([`Segments`]); an edit forgets the ids of the segments it touches, and
//! storing encodes only those, so a capture that changed ten files writes
//! about ten segments however many entries the layer has.

use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use cairn_blob::ObjectId;

use crate::manifest::Entry;
use crate::{Error, Result};

/// Entries per segment, on average.
pub const AVERAGE: u64 = 64;

/// Where a layer's entries were cut, and the id each segment was stored
/// under (None: changed since, to be stored again). A cache of the stored
/// form: two layers with the same entries are equal whatever it holds.
#[derive(Clone, Debug, Default)]
pub struct Segments(Vec<Segment>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    len: usize,
    id: Option<ObjectId>,
}

impl PartialEq for Segments {
    fn eq(&self, _: &Segments) -> bool {
        true
    }
}

impl Eq for Segments {}

/// Whether a segment ends after the entry at `path`.
fn ends_segment(path: &Path) -> bool {
    let h = ObjectId::of(path.as_os_str().as_bytes());
    u64::from_le_bytes([h.0[0], h.0[1], h.0[2], h.0[3], h.0[4], h.0[5], h.0[6], h.0[7]]).is_multiple_of(AVERAGE)
}

impl Segments {
    /// Segments as they were stored (a manifest just loaded).
    pub(crate) fn stored(segments: impl IntoIterator<Item = (usize, ObjectId)>) -> Segments {
        Segments(segments.into_iter().map(|(len, id)| Segment { len, id: Some(id) }).collect())
    }

    /// Forgets everything: every segment is encoded again at the next store.
    pub fn forget(&mut self) {
        self.0.clear();
    }

    /// The ids of the segments as stored (the ones not changed since).
    pub fn ids(&self) -> impl Iterator<Item = ObjectId> + '_ {
        self.0.iter().filter_map(|s| s.id)
    }

    /// The segments after `edits` (sorted, not overlapping: each replaces
    /// `range` of the entries with `inserted` new ones): every segment an
    /// edit touches loses its id and takes the new entries.
    pub(crate) fn edited(&self, edits: impl IntoIterator<Item = (Range<usize>, usize)>) -> Segments {
        let mut segs = self.0.clone();
        if segs.is_empty() {
            return Segments::default();
        }
        let mut starts = Vec::with_capacity(segs.len());
        let mut at = 0;
        for s in &segs {
            starts.push(at);
            at += s.len;
        }
        let total = at;
        let mut delta: Vec<isize> = vec![0; segs.len()];
        // The segment holding entry `i` (the last one past the end).
        let holding = |i: usize| starts.partition_point(|&s| s <= i).saturating_sub(1);
        for (range, inserted) in edits {
            if range.end > total {
                return Segments::default();
            }
            let first = holding(range.start.min(total.saturating_sub(1)));
            delta[first] += inserted as isize;
            segs[first].id = None;
            let mut k = first;
            while k < segs.len() && starts[k] < range.end {
                let overlap = range.end.min(starts[k] + segs[k].len).saturating_sub(range.start.max(starts[k]));
                delta[k] -= overlap as isize;
                segs[k].id = None;
                k += 1;
            }
        }
        Segments(
            segs.into_iter()
                .zip(delta)
                .filter_map(|(s, d)| {
                    let len = s.len as isize + d;
                    (len > 0).then_some(Segment { len: len as usize, id: s.id })
                })
                .collect(),
        )
    }

    /// Cuts `entries` into segments and stores the ones not stored yet with
    /// `put` (which gets a segment's encoding and returns its id); returns
    /// every segment's entry count and id, in order.
    pub(crate) fn store(&mut self, entries: &[Entry], put: &mut dyn FnMut(&[u8]) -> Result<ObjectId>) -> Result<Vec<(usize, ObjectId)>> {
        if self.0.iter().map(|s| s.len).sum::<usize>() != entries.len() {
            // Out of step with the entries (changed by hand): cut again.
            self.0.clear();
        }
        let old = std::mem::take(&mut self.0);
        let mut out: Vec<Segment> = Vec::with_capacity(old.len().max(entries.len() / AVERAGE as usize + 1));
        // Where each old segment starts, to resume at one that is unchanged.
        let mut old_at = 0;
        let mut k = 0;
        let mut i = 0;
        while i < entries.len() {
            while k < old.len() && old_at < i {
                old_at += old[k].len;
                k += 1;
            }
            if let Some(Segment { len, id: Some(id) }) = old.get(k).copied().filter(|_| old_at == i) {
                out.push(Segment { len, id: Some(id) });
                i += len;
                continue;
            }
            // Changed: cut from here at the natural boundaries until one
            // lands where an unchanged segment starts (or the end).
            let start = i;
            let mut end = i;
            while end < entries.len() {
                end += 1;
                if ends_segment(&entries[end - 1].path) {
                    break;
                }
            }
            let id = put(&encode_segment(&entries[start..end])?)?;
            out.push(Segment { len: end - start, id: Some(id) });
            i = end;
        }
        self.0 = out;
        Ok(self.0.iter().map(|s| (s.len, s.id.unwrap_or(ObjectId([0; 32])))).collect())
    }

    /// Checks the cache against `entries` by encoding every segment again
    /// (tests: a stale cache would store a manifest that is not the one in
    /// memory).
    #[cfg(test)]
    pub(crate) fn verify(&self, entries: &[Entry]) -> bool {
        let mut at = 0;
        for s in &self.0 {
            let Some(id) = s.id else { return false };
            let Some(part) = entries.get(at..at + s.len) else { return false };
            if encode_segment(part).map(|b| ObjectId::of(&b)).ok() != Some(id) {
                return false;
            }
            at += s.len;
        }
        at == entries.len()
    }
}

/// A segment's stored form: its entries as a JSON array.
pub(crate) fn encode_segment(entries: &[Entry]) -> Result<Vec<u8>> {
    serde_json::to_vec(entries).map_err(|e| Error::Encode(e.to_string()))
}

/// Decodes segment `id` of a manifest.
pub fn decode_segment(id: &ObjectId, data: &[u8]) -> Result<Vec<Entry>> {
    serde_json::from_slice(data).map_err(|e| Error::Decode(*id, format!("segment: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::EntryKind;

    fn entry(path: &str) -> Entry {
        crate::manifest::tests::entry(path, EntryKind::Fifo)
    }

    fn entries(n: usize) -> Vec<Entry> {
        let mut v: Vec<Entry> = (0..n).map(|i| entry(&format!("f{i:06}"))).collect();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    /// Stores with a `put` that counts what it was given.
    fn store(segs: &mut Segments, e: &[Entry]) -> (Vec<(usize, ObjectId)>, usize) {
        let mut puts = 0;
        let ids = segs
            .store(e, &mut |b| {
                puts += 1;
                Ok(ObjectId::of(b))
            })
            .unwrap();
        (ids, puts)
    }

    #[test]
    fn a_few_edits_store_a_few_segments_and_the_same_cut_as_from_nothing() {
        let mut e = entries(10_000);
        let mut segs = Segments::default();
        let (first, puts) = store(&mut segs, &e);
        assert_eq!(puts, first.len());
        assert!(first.len() > 10_000 / AVERAGE as usize / 2 && first.len() < 10_000 / AVERAGE as usize * 2, "{}", first.len());
        assert!(segs.verify(&e));

        // Change one entry in place, remove three, insert two.
        e[5000].mode = 0o600;
        let removed: Vec<Entry> = e.drain(7000..7003).collect();
        let mut added = vec![entry("f007000a"), entry("f007000b")];
        added.sort_by(|a, b| a.path.cmp(&b.path));
        assert!(removed[0].path < added[0].path);
        e.splice(7000..7000, added);
        let mut edited = segs.edited([(5000..5001, 1), (7000..7003, 2)]);
        let (again, puts) = store(&mut edited, &e);
        assert!(puts <= 4, "{puts} segments stored again");
        assert!(edited.verify(&e));

        let (fresh, _) = store(&mut Segments::default(), &e);
        assert_eq!(again, fresh, "the cut does not depend on the history");
        assert_ne!(again, first);
    }

    #[test]
    fn a_cache_out_of_step_is_cut_again() {
        let e = entries(500);
        let mut segs = Segments::default();
        store(&mut segs, &e);
        let shorter = &e[..400];
        let (ids, puts) = store(&mut segs, shorter);
        assert_eq!(puts, ids.len(), "everything encoded again");
        assert!(segs.verify(shorter));
    }

    #[test]
    fn edits_at_the_ends_and_of_everything() {
        let mut e = entries(300);
        let mut segs = Segments::default();
        store(&mut segs, &e);
        e.push(entry("g"));
        let mut appended = segs.edited([(300..300, 1)]);
        store(&mut appended, &e);
        assert!(appended.verify(&e));
        let mut cleared = appended.edited([(0..301, 0)]);
        let (ids, _) = store(&mut cleared, &[]);
        assert!(ids.is_empty());
        assert!(Segments::default().edited([(0..0, 5)]).0.is_empty(), "nothing known stays nothing known");
    }
}
