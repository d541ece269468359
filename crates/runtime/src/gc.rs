//! `gc` (retention, then mark and sweep of the blob store) and `check`
//! (everything the snapshots reference is stored, optionally every byte).

use std::collections::{HashMap, HashSet};

use cairn_core::{SnapshotId, parse_duration};

use crate::Error;
use crate::runtime::Runtime;
use crate::snapshot::{GcRequest, blob_error, manifest_id};

impl Runtime {
    /// Distinct manifests that snapshots and baselines reference, each with
    /// who references it.
    pub(crate) async fn live_manifests(&self, skip: &HashSet<SnapshotId>) -> Result<HashMap<String, String>, Error> {
        let mut live = HashMap::new();
        for s in self.store.all_snapshots().await? {
            if !skip.contains(&s.id) {
                live.entry(s.manifest.clone()).or_insert_with(|| format!("snapshot {} of task {}", s.id, s.task));
            }
        }
        for b in self.store.baselines().await? {
            live.entry(b).or_insert_with(|| "a task's baseline".to_owned());
        }
        Ok(live)
    }

    /// Applies every task's retention policy, then removes objects no
    /// snapshot or baseline references, fork bases no task uses and image
    /// layers no image uses.
    pub async fn gc(&self, req: GcRequest, actor: &str) -> Result<cairn_api::snapshots::GcAnswer, Error> {
        let grace = match req.grace.as_deref() {
            Some(g) => parse_duration(g)?,
            None => self.snaps.gc_grace,
        };
        let _exclusive = self.hold_blobs_for_gc().await?;
        let mut expired = Vec::new();
        for t in self.store.list_tasks().await? {
            expired.extend(self.apply_retention(&t.id, req.dry_run).await?);
        }
        let skip: HashSet<SnapshotId> = expired.iter().map(|s| s.id.clone()).collect();
        let live = self.live_manifests(&skip).await?;
        let mut live_manifests = HashSet::new();
        let mut live_chunks = HashSet::new();
        for (hex, who) in &live {
            let m = self.load_manifest(hex).await.map_err(|e| {
                Error::internal_with(format!("gc stopped, nothing deleted: manifest of {who} is unreadable ({e}); run `cairn check`"), e)
            })?;
            live_manifests.insert(manifest_id(hex)?);
            live_chunks.extend(cairn_snapshot::referenced_chunks(&m));
        }
        let dry = req.dry_run;
        let report = self.snaps.run(move |repo| repo.gc(&live_manifests, &live_chunks, grace, dry)).await?.map_err(blob_error)?;
        let orphans = self.gc_deliverables(grace, dry).await?;
        let (mut fork_bases_removed, mut layers_removed) = (Vec::new(), Vec::new());
        if !dry {
            fork_bases_removed = self.remove_unused_fork_bases().await?;
            layers_removed = self.images.gc_layers().await?;
        }
        tracing::info!(actor, dry_run = dry, freed = report.bytes_freed, orphan_deliverables = orphans.len(), "gc");
        Ok(cairn_api::snapshots::GcAnswer {
            dry_run: dry,
            grace_ms: grace.as_millis() as u64,
            expired_snapshots: expired
                .iter()
                .map(|s| cairn_api::snapshots::ExpiredSnapshot { id: s.id.clone(), task: s.task.clone(), kind: s.kind })
                .collect(),
            report,
            orphan_deliverables: orphans,
            fork_bases_removed,
            layers_removed,
        })
    }

    /// Verifies that everything the snapshots reference is stored, and with
    /// `read_data` that every byte hashes to its id.
    pub async fn check(&self, read_data: bool) -> Result<cairn_blob::CheckReport, Error> {
        let _no_gc = self.hold_blobs().await?;
        let live = self.live_manifests(&HashSet::new()).await?;
        let mut problems = Vec::new();
        let mut manifests = Vec::new();
        let mut chunks = Vec::new();
        for (hex, who) in &live {
            let id = manifest_id(hex)?;
            // A manifest that cannot be read is reported here, once; the
            // store checks the ones that load, and every chunk they name.
            match self.load_manifest(hex).await {
                Ok(m) => {
                    manifests.push(id);
                    chunks.extend(cairn_snapshot::referenced_chunks(&m).into_iter().map(|c| (c, id)));
                }
                Err(e) => problems.push(format!("manifest {hex} ({who}): {}", e)),
            }
        }
        let mut report = self.snaps.check(manifests, chunks, read_data).await?;
        problems.append(&mut report.problems);
        report.problems = problems;
        Ok(report)
    }
}
