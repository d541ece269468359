//! Index files: which pack holds each chunk.
//!
//! An index file is zstd-compressed JSON,
//! `{"version":1,"packs":[{"id":…,"size":…,"chunks":[{"id":…,"offset":…,
//! "length":…,"raw_length":…,"compressed":…}, …]}, …]}`, named by the BLAKE3
//! hash of the uncompressed JSON. A writer adds one per snapshot, listing the
//! packs it wrote; gc replaces a file by a smaller one when it deletes packs
//! the file lists. The in-memory index is the union of all files.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::pack::{PackEntry, COMPRESSION_LEVEL};
use crate::{Error, Kind, ObjectId, Result};

const INDEX_VERSION: u32 = 1;

/// One pack as an index file lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedPack {
    pub id: ObjectId,
    /// The pack's size in bytes (what `check` expects the store to list).
    pub size: u64,
    pub chunks: Vec<PackEntry>,
}

#[derive(Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    packs: Vec<IndexedPack>,
}

/// Where a chunk is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub pack: ObjectId,
    pub entry: PackEntry,
}

/// Serializes an index file: its id and its stored (compressed) bytes.
pub fn encode(packs: &[IndexedPack]) -> Result<(ObjectId, Vec<u8>)> {
    let json = serde_json::to_vec(&IndexFile { version: INDEX_VERSION, packs: packs.to_vec() })
        .map_err(|e| Error::Compress("an index file".into(), e.to_string()))?;
    let id = ObjectId::of(&json);
    let stored = zstd::bulk::compress(&json, COMPRESSION_LEVEL).map_err(|e| Error::Compress(format!("index file {id}"), e.to_string()))?;
    Ok((id, stored))
}

/// Parses a stored index file, checking that it hashes to `id`.
pub fn decode(id: &ObjectId, stored: &[u8]) -> Result<Vec<IndexedPack>> {
    let corrupt = |why: String| Error::Corrupt(Kind::Index, id.to_hex(), why);
    let json = zstd::stream::decode_all(stored).map_err(|e| corrupt(format!("does not decompress: {e}")))?;
    let actual = ObjectId::of(&json);
    if actual != *id {
        return Err(corrupt(format!("content hashes to {actual}")));
    }
    let file: IndexFile = serde_json::from_slice(&json).map_err(|e| corrupt(format!("not an index file: {e}")))?;
    if file.version != INDEX_VERSION {
        return Err(corrupt(format!("version {} (this build reads {INDEX_VERSION})", file.version)));
    }
    Ok(file.packs)
}

/// What a pack looks like to the in-memory index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackSummary {
    pub size: u64,
    pub chunks: u64,
}

/// The in-memory index: every loaded index file merged.
#[derive(Debug, Default)]
pub(crate) struct MemIndex {
    /// One location per chunk; when two packs hold the same chunk (two
    /// writers raced), the first one loaded wins.
    pub chunks: HashMap<ObjectId, Location>,
    pub packs: HashMap<ObjectId, PackSummary>,
    /// Index file → the packs it lists.
    pub files: HashMap<ObjectId, Vec<ObjectId>>,
    /// Index files that could not be read: id → why. `check` reports them;
    /// `gc` refuses to run while there are any (their packs would look
    /// unreferenced).
    pub unreadable: HashMap<String, String>,
}

impl MemIndex {
    pub fn insert_file(&mut self, file: ObjectId, packs: &[IndexedPack]) {
        for pack in packs {
            for entry in &pack.chunks {
                self.chunks.entry(entry.id).or_insert(Location { pack: pack.id, entry: *entry });
            }
            self.packs.insert(pack.id, PackSummary { size: pack.size, chunks: pack.chunks.len() as u64 });
        }
        self.files.insert(file, packs.iter().map(|p| p.id).collect());
    }

    /// Forgets deleted packs and the chunk locations inside them.
    pub fn remove_packs(&mut self, gone: &std::collections::HashSet<ObjectId>) {
        self.chunks.retain(|_, loc| !gone.contains(&loc.pack));
        self.packs.retain(|id, _| !gone.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hash_check() {
        let entry = PackEntry { id: ObjectId::of(b"c"), offset: 0, length: 1, raw_length: 1, compressed: false };
        let packs = vec![IndexedPack { id: ObjectId::of(b"p"), size: 58, chunks: vec![entry] }];
        let (id, stored) = encode(&packs).unwrap();
        assert_eq!(decode(&id, &stored).unwrap(), packs);
        let other = ObjectId::of(b"other");
        assert!(matches!(decode(&other, &stored), Err(Error::Corrupt(Kind::Index, _, why)) if why.contains("hashes to")));
        assert!(decode(&id, b"garbage").is_err());
        assert!(decode(&id, &stored[..stored.len() / 2]).is_err());
    }

    #[test]
    fn removing_packs_forgets_them_and_their_chunks_only() {
        let entry = |c: &[u8]| PackEntry { id: ObjectId::of(c), offset: 0, length: 1, raw_length: 1, compressed: false };
        let (p1, p2) = (ObjectId::of(b"p1"), ObjectId::of(b"p2"));
        let mut index = MemIndex::default();
        let packs = [
            IndexedPack { id: p1, size: 58, chunks: vec![entry(b"a")] },
            IndexedPack { id: p2, size: 107, chunks: vec![entry(b"b"), entry(b"c")] },
        ];
        index.insert_file(ObjectId::of(b"file"), &packs);
        assert_eq!(index.packs.get(&p2), Some(&PackSummary { size: 107, chunks: 2 }));
        index.remove_packs(&[p1].into_iter().collect());
        assert_eq!(index.packs.keys().collect::<Vec<_>>(), [&p2]);
        let mut left: Vec<_> = index.chunks.iter().map(|(id, loc)| (*id, loc.pack)).collect();
        left.sort();
        let mut want = vec![(ObjectId::of(b"b"), p2), (ObjectId::of(b"c"), p2)];
        want.sort();
        assert_eq!(left, want);
    }
}
