//! `gc`: mark and sweep of packs and manifests no live snapshot names.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Repository;
use crate::index::{self, IndexedPack};
use crate::parallel::try_map_bounded;
use crate::{Error, Kind, ObjectId, ObjectInfo, Result};

/// The outcome of `gc` (or what it would do, with `dry_run`): what the blob
/// store's mark and sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct GcReport {
    pub packs_deleted: u64,
    pub manifests_deleted: u64,
    /// Index files replaced by one without the deleted packs (or deleted,
    /// when they listed nothing else).
    pub index_files_rewritten: u64,
    /// Bytes of the deleted packs and manifests.
    pub bytes_freed: u64,
    /// Unreferenced objects kept because they are younger than the grace period.
    pub kept_young: u64,
    /// Packs kept whole because some of their chunks are still referenced.
    pub packs_partly_live: u64,
    pub dry_run: bool,
}

impl Repository {
    /// Mark and sweep: deletes packs none of whose chunks are in `live_chunks`
    /// and manifests not in `live_manifests`, except objects younger than
    /// `grace`; rewrites index files to drop entries of deleted packs.
    ///
    /// Packs no index file mentions (left by a writer that crashed or was
    /// dropped) are deleted once older than `grace`. Order, for crash
    /// safety: index files are rewritten (new file durable, then the old one
    /// deleted) before any pack goes, so an index never names a deleted
    /// pack. Refuses to run while an index file is unreadable, since the
    /// packs it lists would look unreferenced. Take [`Repository::gc_lock`]
    /// for writing around it.
    pub fn gc(&self, live_manifests: &HashSet<ObjectId>, live_chunks: &HashSet<ObjectId>, grace: Duration, dry_run: bool) -> Result<GcReport> {
        self.refresh_index()?;
        if let Some((id, why)) = self.read_index().unreadable.iter().next() {
            return Err(Error::Corrupt(Kind::Index, id.clone(), format!("{why}; gc will not run until it is repaired or removed")));
        }
        let mut report = GcReport { dry_run, ..GcReport::default() };
        let now = SystemTime::now();
        // A clock step backwards makes objects look young: keep them.
        let young = |info: &ObjectInfo| now.duration_since(info.modified).map_or(true, |age| age < grace);

        // What each index file lists is the truth (the in-memory index keeps
        // one location per chunk, and other processes may have added files).
        let listed: Vec<(ObjectId, String)> =
            self.backend.list(Kind::Index)?.into_iter().filter_map(|info| Some((info.id.parse::<ObjectId>().ok()?, info.id))).collect();
        let conc = self.backend.concurrency();
        let read = try_map_bounded(listed, conc, |(id, name)| match self.backend.read(Kind::Index, &name) {
            Ok(stored) => Ok(Some((id, index::decode(&id, &stored)?))),
            Err(Error::Missing(..)) => Ok(None),
            Err(e) => Err(e),
        })?;
        let files: Vec<(ObjectId, Vec<IndexedPack>)> = read.into_iter().flatten().collect();
        let mut pack_chunks: HashMap<ObjectId, HashSet<ObjectId>> = HashMap::new();
        for (_, packs) in &files {
            for p in packs {
                pack_chunks.entry(p.id).or_default().extend(p.chunks.iter().map(|c| c.id));
            }
        }

        let stored_packs: HashMap<ObjectId, ObjectInfo> = self
            .backend
            .list(Kind::Pack)?
            .into_iter()
            .filter_map(|info| Some((info.id.parse::<ObjectId>().ok()?, info)))
            .collect();
        // Packs to drop from the index (deleted, or already gone) and packs
        // to delete from the store.
        let mut dropped: HashSet<ObjectId> = HashSet::new();
        let mut delete_packs: Vec<(ObjectId, u64)> = Vec::new();
        for (pack, chunks) in &pack_chunks {
            let live = chunks.iter().filter(|c| live_chunks.contains(c)).count();
            if live > 0 {
                if live < chunks.len() {
                    report.packs_partly_live += 1;
                }
                continue;
            }
            match stored_packs.get(pack) {
                None => {
                    dropped.insert(*pack);
                }
                Some(info) if young(info) => report.kept_young += 1,
                Some(info) => {
                    dropped.insert(*pack);
                    delete_packs.push((*pack, info.size));
                }
            }
        }
        for (pack, info) in &stored_packs {
            if pack_chunks.contains_key(pack) {
                continue;
            }
            if young(info) {
                report.kept_young += 1;
            } else {
                delete_packs.push((*pack, info.size));
            }
        }

        let mut delete_manifests: Vec<(ObjectId, u64)> = Vec::new();
        for info in self.backend.list(Kind::Manifest)? {
            let Ok(id) = info.id.parse::<ObjectId>() else { continue };
            if live_manifests.contains(&id) {
                continue;
            }
            if young(&info) {
                report.kept_young += 1;
            } else {
                delete_manifests.push((id, info.size));
            }
        }

        let rewrites: Vec<(ObjectId, Vec<IndexedPack>)> = files
            .into_iter()
            .filter(|(_, packs)| packs.iter().any(|p| dropped.contains(&p.id)))
            .map(|(id, packs)| (id, packs.into_iter().filter(|p| !dropped.contains(&p.id)).collect()))
            .collect();

        report.packs_deleted = delete_packs.len() as u64;
        report.manifests_deleted = delete_manifests.len() as u64;
        report.index_files_rewritten = rewrites.len() as u64;
        report.bytes_freed = delete_packs.iter().chain(&delete_manifests).map(|(_, size)| size).sum();
        if dry_run {
            return Ok(report);
        }

        // Forget the packs first, so nothing in this process deduplicates
        // against or reads from them any more.
        self.write_index().remove_packs(&dropped);
        for (old, remaining) in rewrites {
            let new = if remaining.is_empty() {
                None
            } else {
                let (new_id, stored) = index::encode(&remaining)?;
                self.backend.write(Kind::Index, &new_id.to_hex(), Bytes::from(stored))?;
                Some(new_id)
            };
            self.backend.delete(Kind::Index, &old.to_hex())?;
            let mut idx = self.write_index();
            idx.files.remove(&old);
            if let Some(new_id) = new {
                idx.files.insert(new_id, remaining.iter().map(|p| p.id).collect());
            }
        }
        fail::fail_point!("gc.index_rewritten");
        // Deletes of one kind go together, several at once; the order
        // between the phases is kept.
        try_map_bounded(delete_packs, conc, |(pack, _)| self.backend.delete(Kind::Pack, &pack.to_hex()))?;
        fail::fail_point!("gc.packs_deleted");
        try_map_bounded(delete_manifests, conc, |(manifest, _)| self.backend.delete(Kind::Manifest, &manifest.to_hex()))?;
        tracing::info!(
            packs = report.packs_deleted,
            manifests = report.manifests_deleted,
            index_files = report.index_files_rewritten,
            bytes = report.bytes_freed,
            "gc done"
        );
        Ok(report)
    }
}
