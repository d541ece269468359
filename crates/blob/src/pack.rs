//! The pack format: many chunks in one object.
//!
//! ```text
//! pack    := blob* trailer trailer_len:u32le magic:[u8; 8]
//! blob    := a chunk, zstd-compressed (level 3), or raw when compressing
//!            does not make it smaller
//! trailer := count:u32le entry{count}
//! entry   := id:[u8; 32] offset:u64le length:u32le raw_length:u32le flags:u8
//!            (flags bit 0: the blob is zstd-compressed)
//! ```
//!
//! All integers are little-endian; `trailer_len` counts the trailer's bytes.
//! A pack's id is the BLAKE3 hash of all its bytes. The trailer repeats
//! what the index says about the pack, so the index can be rebuilt from the
//! packs and a pack can be verified on its own.

use std::io::Read;

use serde::{Deserialize, Serialize};

use crate::{Error, ObjectId, Result};

/// The last eight bytes of every pack: a magic and the format version.
pub const PACK_MAGIC: [u8; 8] = *b"CAIRNPK\x01";
/// Packs are written once they reach this size (the last one is smaller).
pub const TARGET_PACK_SIZE: usize = 16 * 1024 * 1024;
/// zstd level for chunks and manifests.
pub const COMPRESSION_LEVEL: i32 = 3;

const ENTRY_LEN: usize = 32 + 8 + 4 + 4 + 1;
const FOOTER_LEN: usize = 4 + PACK_MAGIC.len();
const FLAG_ZSTD: u8 = 1;
/// Above this claimed size a blob is decompressed as a stream, so a
/// corrupted length cannot make us allocate gigabytes up front.
const BULK_DECOMPRESS_LIMIT: usize = 64 * 1024 * 1024;

/// Where one chunk is inside its pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PackEntry {
    pub id: ObjectId,
    /// Byte offset of the stored blob in the pack.
    pub offset: u64,
    /// Stored (possibly compressed) length.
    pub length: u32,
    /// Length of the chunk itself.
    pub raw_length: u32,
    pub compressed: bool,
}

/// A complete pack, ready to write.
#[derive(Debug)]
pub struct FinishedPack {
    pub id: ObjectId,
    pub data: Vec<u8>,
    pub entries: Vec<PackEntry>,
}

/// How much of a large chunk is compressed first to tell whether the rest is
/// worth compressing.
const SAMPLE: usize = 16 * 1024;

/// Assembles a pack from chunks.
pub struct PackBuilder {
    data: Vec<u8>,
    entries: Vec<PackEntry>,
    compressor: zstd::bulk::Compressor<'static>,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for PackBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackBuilder").field("bytes", &self.data.len()).field("chunks", &self.entries.len()).finish()
    }
}

impl PackBuilder {
    pub fn new() -> Result<PackBuilder> {
        let compressor = zstd::bulk::Compressor::new(COMPRESSION_LEVEL).map_err(|e| Error::Compress("a pack".into(), e.to_string()))?;
        Ok(PackBuilder { data: Vec::new(), entries: Vec::new(), compressor, scratch: Vec::new() })
    }

    /// Appends a chunk whose id is `id` (the caller hashed it).
    pub fn add(&mut self, id: ObjectId, chunk: &[u8]) -> Result<()> {
        let raw_length = u32::try_from(chunk.len()).map_err(|_| Error::ChunkTooLarge(chunk.len(), u32::MAX.into()))?;
        let compressed = !self.incompressible(id, chunk)? && {
            self.scratch.clear();
            self.scratch.reserve(zstd::zstd_safe::compress_bound(chunk.len()));
            self.compressor.compress_to_buffer(chunk, &mut self.scratch).map_err(|e| Error::Compress(format!("chunk {id}"), e.to_string()))?;
            self.scratch.len() < chunk.len()
        };
        let stored: &[u8] = if compressed { &self.scratch } else { chunk };
        self.entries.push(PackEntry { id, offset: self.data.len() as u64, length: stored.len() as u32, raw_length, compressed });
        self.data.extend_from_slice(stored);
        Ok(())
    }

    /// Whether a large chunk's first [`SAMPLE`] bytes barely compress:
    /// then it is random data (an archive, media, encrypted bytes) and is
    /// stored as it is without spending the time to compress it all, which
    /// on such data gains nothing.
    fn incompressible(&mut self, id: ObjectId, chunk: &[u8]) -> Result<bool> {
        if chunk.len() < 4 * SAMPLE {
            return Ok(false);
        }
        self.scratch.clear();
        self.scratch.reserve(zstd::zstd_safe::compress_bound(SAMPLE));
        self.compressor
            .compress_to_buffer(&chunk[..SAMPLE], &mut self.scratch)
            .map_err(|e| Error::Compress(format!("chunk {id}"), e.to_string()))?;
        Ok(self.scratch.len() >= SAMPLE - SAMPLE / 32)
    }

    /// Bytes so far (without the trailer).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends the trailer and hands out the pack; the builder is empty
    /// again afterwards. `None` when no chunk was added.
    pub fn finish(&mut self) -> Option<FinishedPack> {
        if self.entries.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        let entries = std::mem::take(&mut self.entries);
        let trailer_len = 4 + entries.len() * ENTRY_LEN;
        data.reserve(trailer_len + FOOTER_LEN);
        data.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for e in &entries {
            data.extend_from_slice(&e.id.0);
            data.extend_from_slice(&e.offset.to_le_bytes());
            data.extend_from_slice(&e.length.to_le_bytes());
            data.extend_from_slice(&e.raw_length.to_le_bytes());
            data.push(if e.compressed { FLAG_ZSTD } else { 0 });
        }
        data.extend_from_slice(&(trailer_len as u32).to_le_bytes());
        data.extend_from_slice(&PACK_MAGIC);
        Some(FinishedPack { id: ObjectId::of(&data), data, entries })
    }
}

/// Reads a pack's trailer. Checks the framing and that every entry lies
/// within the pack's blob area; the message says what is wrong.
pub fn parse_trailer(pack: &[u8]) -> std::result::Result<Vec<PackEntry>, String> {
    let len = pack.len();
    if len < FOOTER_LEN + 4 {
        return Err(format!("{len} bytes is too short for a pack (truncated?)"));
    }
    if pack[len - PACK_MAGIC.len()..] != PACK_MAGIC {
        return Err("no pack magic at the end (truncated, or not a pack)".into());
    }
    let trailer_len = u32_at(pack, len - FOOTER_LEN) as usize;
    let blobs_end = (len - FOOTER_LEN).checked_sub(trailer_len).ok_or_else(|| format!("trailer length {trailer_len} exceeds the pack"))?;
    let trailer = &pack[blobs_end..len - FOOTER_LEN];
    if trailer.len() < 4 {
        return Err(format!("trailer length {trailer_len} is too short"));
    }
    let count = u32_at(trailer, 0) as usize;
    if count.checked_mul(ENTRY_LEN).and_then(|n| n.checked_add(4)) != Some(trailer.len()) {
        return Err(format!("trailer of {} bytes cannot hold {count} entries", trailer.len()));
    }
    let mut entries = Vec::with_capacity(count);
    for raw in trailer[4..].chunks_exact(ENTRY_LEN) {
        let mut id = [0u8; 32];
        id.copy_from_slice(&raw[..32]);
        let entry = PackEntry {
            id: ObjectId(id),
            offset: u64::from_le_bytes(raw[32..40].try_into().map_err(|_| "bad entry")?),
            length: u32_at(raw, 40),
            raw_length: u32_at(raw, 44),
            compressed: raw[48] & FLAG_ZSTD != 0,
        };
        if entry.offset.checked_add(entry.length.into()).is_none_or(|end| end > blobs_end as u64) {
            return Err(format!("chunk {} at {}+{} lies outside the pack's data", entry.id, entry.offset, entry.length));
        }
        entries.push(entry);
    }
    Ok(entries)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Turns a stored blob back into its chunk and checks its hash. The error
/// says what went wrong, naming the chunk (the caller names the pack).
pub fn decode_chunk(entry: &PackEntry, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let id = entry.id;
    if stored.len() != entry.length as usize {
        return Err(format!("chunk {id}: {} stored bytes, {} expected (truncated)", stored.len(), entry.length));
    }
    let raw_length = entry.raw_length as usize;
    let data = if entry.compressed {
        decompress(stored, raw_length).map_err(|e| format!("chunk {id} does not decompress: {e}"))?
    } else {
        stored.to_vec()
    };
    if data.len() != raw_length {
        return Err(format!("chunk {id} is {} bytes, {raw_length} expected", data.len()));
    }
    let actual = ObjectId::of(&data);
    if actual != id {
        return Err(format!("chunk {id} hashes to {actual}"));
    }
    Ok(data)
}

/// zstd-decompresses at most `expected` bytes (one more is read, so that a
/// longer output shows up as a length mismatch).
pub(crate) fn decompress(stored: &[u8], expected: usize) -> std::io::Result<Vec<u8>> {
    if expected <= BULK_DECOMPRESS_LIMIT {
        return zstd::bulk::decompress(stored, expected);
    }
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(stored)?.take(expected as u64 + 1).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(chunks: &[&[u8]]) -> FinishedPack {
        let mut b = PackBuilder::new().unwrap();
        for c in chunks {
            b.add(ObjectId::of(c), c).unwrap();
        }
        b.finish().unwrap()
    }

    #[test]
    fn round_trip_compressed_and_raw() {
        let text = b"abcabcabc".repeat(1000);
        let noise = crate::testutil::noise(1, 5000);
        let pack = build(&[&text, &noise, b""]);
        assert_eq!(pack.id, ObjectId::of(&pack.data));
        let entries = parse_trailer(&pack.data).unwrap();
        assert_eq!(entries, pack.entries);
        assert!(entries[0].compressed && entries[0].length < entries[0].raw_length);
        assert!(!entries[1].compressed);
        for (e, want) in entries.iter().zip([&text[..], &noise[..], b""]) {
            let stored = &pack.data[e.offset as usize..(e.offset + e.length as u64) as usize];
            assert_eq!(decode_chunk(e, stored).unwrap(), want);
        }
    }

    #[test]
    fn packs_are_cut_at_16_mib() {
        // The default of RepoOptions::pack_target; docs/architecture.md says ~16 MiB.
        assert_eq!(TARGET_PACK_SIZE, 16_777_216);
    }

    #[test]
    fn a_blob_longer_than_its_entry_says_does_not_decompress() {
        // Up to 64 MiB a blob is decompressed into a buffer of the claimed
        // size: more output than that is refused by zstd itself.
        let chunk = b"0123456789abcdef".repeat(128 * 1024);
        let pack = build(&[&chunk]);
        let e = pack.entries[0];
        let stored = &pack.data[e.offset as usize..(e.offset + u64::from(e.length)) as usize];
        let short = PackEntry { raw_length: 1_536 * 1024, ..e };
        let err = decode_chunk(&short, stored).unwrap_err();
        assert!(err.starts_with(&format!("chunk {} does not decompress: ", e.id)), "{err}");
        assert_eq!(decode_chunk(&e, stored).unwrap(), chunk);
    }

    #[test]
    fn the_smallest_pack_is_an_empty_trailer() {
        let mut empty = 0u32.to_le_bytes().to_vec();
        empty.extend_from_slice(&4u32.to_le_bytes());
        empty.extend_from_slice(&PACK_MAGIC);
        assert_eq!(parse_trailer(&empty), Ok(vec![]));
        assert_eq!(parse_trailer(&empty[1..]), Err("15 bytes is too short for a pack (truncated?)".to_owned()));
        let mut no_count = vec![0u8; 4];
        no_count.extend_from_slice(&3u32.to_le_bytes());
        no_count.extend_from_slice(&PACK_MAGIC);
        assert_eq!(parse_trailer(&no_count), Err("trailer length 3 is too short".to_owned()));
    }

    #[test]
    fn a_chunk_that_compresses_to_its_own_size_is_stored_raw() {
        // 64 random bytes and 17 zeros: zstd (level 3) makes 81 bytes of 81.
        let mut chunk = crate::testutil::noise(7, 64);
        chunk.extend_from_slice(&[0u8; 17]);
        assert_eq!(zstd::bulk::compress(&chunk, COMPRESSION_LEVEL).unwrap().len(), chunk.len(), "the premise");
        let pack = build(&[&chunk]);
        let e = pack.entries[0];
        assert_eq!((e.compressed, e.length, e.raw_length), (false, 81, 81));
        assert_eq!(&pack.data[..81], &chunk[..]);
    }

    #[test]
    fn a_large_chunk_that_starts_random_is_stored_raw_and_text_still_compresses() {
        let random = crate::testutil::noise(3, 256 * 1024);
        let text = b"2026-01-01T00:00:00Z INFO request took 12 ms\n".repeat(6000);
        // Random at the start, text after: the sample decides, stored raw.
        let mut mixed = random[..SAMPLE].to_vec();
        mixed.extend_from_slice(&text);
        let pack = build(&[&random, &text, &mixed]);
        let kinds: Vec<bool> = pack.entries.iter().map(|e| e.compressed).collect();
        assert_eq!(kinds, [false, true, false]);
        for (e, want) in pack.entries.iter().zip([&random[..], &text[..], &mixed[..]]) {
            let stored = &pack.data[e.offset as usize..(e.offset + u64::from(e.length)) as usize];
            assert_eq!(decode_chunk(e, stored).unwrap(), want);
        }
    }

    #[test]
    fn a_blob_claimed_over_64_mib_is_streamed_to_one_byte_past_its_size() {
        let big = BULK_DECOMPRESS_LIMIT + 1;
        let exact = zstd::bulk::compress(&vec![0u8; big], COMPRESSION_LEVEL).unwrap();
        assert_eq!(decompress(&exact, big).unwrap().len(), big);
        // One byte more than claimed is read, so the length check sees it.
        let longer = zstd::bulk::compress(&vec![0u8; big + 5], COMPRESSION_LEVEL).unwrap();
        assert_eq!(decompress(&longer, big).unwrap().len(), big + 1);
    }

    #[test]
    fn debug_shows_the_builder_size() {
        let mut b = PackBuilder::new().unwrap();
        b.add(ObjectId::of(b"x"), b"x").unwrap();
        assert_eq!(format!("{b:?}"), "PackBuilder { bytes: 1, chunks: 1 }");
    }

    #[test]
    fn builder_is_reusable_and_empty_finishes_to_none() {
        let mut b = PackBuilder::new().unwrap();
        assert!(b.finish().is_none());
        b.add(ObjectId::of(b"x"), b"x").unwrap();
        assert!(!b.is_empty());
        assert!(b.finish().is_some());
        assert!(b.is_empty());
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn corruption_is_reported_not_panicked() {
        let text = b"hello pack ".repeat(500);
        let pack = build(&[&text]);
        let e = pack.entries[0];
        let mut stored = pack.data[e.offset as usize..(e.offset + e.length as u64) as usize].to_vec();
        stored[e.length as usize / 2] ^= 0x55;
        assert!(decode_chunk(&e, &stored).is_err());
        let raw = PackEntry { compressed: false, length: e.raw_length, ..e };
        let mut plain = text.clone();
        plain[3] ^= 1;
        let err = decode_chunk(&raw, &plain).unwrap_err();
        assert!(err.contains("hashes to"), "{err}");
        assert!(decode_chunk(&e, &stored[..10]).unwrap_err().contains("truncated"));

        // Every truncation and a few garbage inputs parse to an error or
        // to entries within bounds, never a panic.
        for cut in 0..pack.data.len() {
            if let Ok(entries) = parse_trailer(&pack.data[..cut]) {
                for e in entries {
                    assert!(e.offset + u64::from(e.length) <= cut as u64, "entry {e:?} beyond a {cut}-byte pack");
                }
            }
        }
        assert!(parse_trailer(b"").is_err());
        let mut bad_len = pack.data.clone();
        let at = bad_len.len() - FOOTER_LEN;
        bad_len[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_trailer(&bad_len).is_err());
        let mut bad_offset = pack.data.clone();
        let entry_at = bad_offset.len() - FOOTER_LEN - ENTRY_LEN + 32;
        bad_offset[entry_at..entry_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_trailer(&bad_offset).is_err());
    }
}
