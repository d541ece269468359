//! `check`: every object the caller's snapshots reference exists and is
//! indexed; with `read_data`, every pack and manifest is read and hashed.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::{one_line, Repository};
use crate::index::Location;
use crate::pack;
use crate::parallel::map_bounded;
use crate::{Error, Kind, ObjectId, ObjectInfo, Result};

/// The outcome of `check`; the answer of `POST /v1/check`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct CheckReport {
    pub packs: u64,
    pub chunks: u64,
    pub manifests: u64,
    /// Bytes read and verified (with `read_data`).
    pub bytes_read: u64,
    /// Chunks read back from their packs, decompressed and hashed (with
    /// `read_data`).
    pub chunks_verified: u64,
    /// One line per problem, naming the object: e.g.
    /// `pack 3fa2…: chunk 91bc… hashes to 77de… (corrupted)`,
    /// `manifest 12ab…: missing`, `chunk 55ef… (in manifest 12ab…): not in the index`.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Repository {
    /// Checks that every manifest in `manifests` and every chunk in
    /// `chunks` (the ones the caller's snapshots reference, with the manifest
    /// that names each) exists and is indexed in an existing pack; with
    /// `read_data`, also reads every pack and manifest and checks every
    /// chunk's hash.
    ///
    /// Problems with single objects are lines in the report; only failing
    /// to list the backend (or to read a new index file) is an error.
    pub fn check(&self, manifests: &[ObjectId], chunks: &[(ObjectId, ObjectId)], read_data: bool) -> Result<CheckReport> {
        self.refresh_index()?;
        let mut report = CheckReport::default();
        let stored_packs: HashMap<String, ObjectInfo> = self.backend.list(Kind::Pack)?.into_iter().map(|o| (o.id.clone(), o)).collect();
        let stored_manifests: HashMap<String, ObjectInfo> = self.backend.list(Kind::Manifest)?.into_iter().map(|o| (o.id.clone(), o)).collect();

        let idx = self.read_index();
        let mut unreadable: Vec<_> = idx.unreadable.iter().map(|(id, why)| format!("index {id}: unreadable: {why}")).collect();
        unreadable.sort();
        report.problems.extend(unreadable);

        // Referenced chunks, and how many of them each missing pack takes
        // along (one line per pack rather than one per chunk).
        let mut chunk_problems = Vec::new();
        let mut referenced_in: HashMap<ObjectId, u64> = HashMap::new();
        let mut seen = HashSet::new();
        for (chunk, manifest) in chunks {
            if !seen.insert(*chunk) {
                continue;
            }
            match idx.chunks.get(chunk) {
                None => chunk_problems.push(format!("chunk {chunk} (in manifest {manifest}): not in the index")),
                Some(loc) => *referenced_in.entry(loc.pack).or_default() += 1,
            }
        }
        report.chunks = seen.len() as u64;

        let mut packs: Vec<_> = idx.packs.iter().map(|(id, summary)| (*id, *summary)).collect();
        packs.sort_by_key(|(id, _)| *id);
        report.packs = packs.len() as u64;
        let mut present = Vec::new();
        for (pack, summary) in &packs {
            match stored_packs.get(&pack.to_hex()) {
                None => {
                    let refs = referenced_in.get(pack).copied().unwrap_or(0);
                    report.problems.push(format!("pack {pack}: missing ({} chunks indexed in it, {refs} of them referenced)", summary.chunks));
                }
                Some(info) if info.size != summary.size => {
                    report.problems.push(format!("pack {pack}: {} bytes, the index says {} (truncated or replaced)", info.size, summary.size));
                    present.push(*pack);
                }
                Some(_) => present.push(*pack),
            }
        }

        let mut distinct = HashSet::new();
        let manifests: Vec<ObjectId> = manifests.iter().copied().filter(|m| distinct.insert(*m)).collect();
        report.manifests = manifests.len() as u64;
        for m in &manifests {
            if !stored_manifests.contains_key(&m.to_hex()) {
                report.problems.push(format!("manifest {m}: missing"));
            }
        }
        report.problems.extend(chunk_problems);

        if !read_data {
            return Ok(report);
        }
        let mut indexed_in: HashMap<ObjectId, Vec<Location>> = HashMap::new();
        for loc in idx.chunks.values() {
            indexed_in.entry(loc.pack).or_default().push(*loc);
        }
        // Reading takes long: do not hold the index meanwhile.
        drop(idx);
        // Several packs are read and verified at once; each one's findings
        // go into the report in the packs' order.
        let conc = self.backend.concurrency();
        let jobs: Vec<(ObjectId, Vec<Location>)> = present.into_iter().map(|p| (p, indexed_in.remove(&p).unwrap_or_default())).collect();
        let verified = map_bounded(jobs, conc, |(pack, expected)| {
            let mut part = CheckReport::default();
            match self.backend.read(Kind::Pack, &pack.to_hex()) {
                Ok(data) => {
                    part.bytes_read += data.len() as u64;
                    verify_pack(&pack, &data, &expected, &mut part);
                }
                Err(Error::Missing(..)) => part.problems.push(format!("pack {pack}: missing")),
                Err(e) => part.problems.push(format!("pack {pack}: unreadable: {}", one_line(&e.to_string()))),
            }
            part
        });
        for part in verified {
            report.bytes_read += part.bytes_read;
            report.chunks_verified += part.chunks_verified;
            report.problems.extend(part.problems);
        }
        let stored: Vec<(ObjectId, u64)> = manifests.iter().filter_map(|m| Some((*m, stored_manifests.get(&m.to_hex())?.size))).collect();
        let verified = map_bounded(stored, conc, |(m, size)| match self.get_manifest(&m) {
            Ok(_) => Ok(size),
            Err(Error::Corrupt(_, _, why)) => Err(format!("manifest {m}: {} (corrupted)", one_line(&why))),
            Err(Error::Missing(..)) => Err(format!("manifest {m}: missing")),
            Err(e) => Err(format!("manifest {m}: unreadable: {}", one_line(&e.to_string()))),
        });
        for v in verified {
            match v {
                Ok(size) => report.bytes_read += size,
                Err(line) => report.problems.push(line),
            }
        }
        Ok(report)
    }
}

/// Verifies one pack read whole: its hash, its trailer, every chunk in it,
/// and that the index's entries for it match the trailer.
fn verify_pack(pack: &ObjectId, data: &[u8], indexed: &[Location], report: &mut CheckReport) {
    let problems_before = report.problems.len();
    let entries = match pack::parse_trailer(data) {
        Ok(entries) => entries,
        Err(why) => {
            report.problems.push(format!("pack {pack}: {why}"));
            return;
        }
    };
    for entry in &entries {
        // parse_trailer checked that every entry lies inside the pack.
        let start = entry.offset as usize;
        let stored = &data[start..start + entry.length as usize];
        match pack::decode_chunk(entry, stored) {
            Ok(_) => report.chunks_verified += 1,
            Err(why) => report.problems.push(format!("pack {pack}: {} (corrupted)", one_line(&why))),
        }
    }
    let in_trailer: HashSet<_> = entries.iter().collect();
    for loc in indexed {
        if !in_trailer.contains(&loc.entry) {
            let (id, offset, length) = (loc.entry.id, loc.entry.offset, loc.entry.length);
            report.problems.push(format!("pack {pack}: chunk {id} is indexed at {offset}+{length} but the pack does not hold it there"));
        }
    }
    let actual = ObjectId::of(data);
    if actual != *pack && report.problems.len() == problems_before {
        report.problems.push(format!("pack {pack}: content hashes to {actual} (corrupted)"));
    }
}
