//! Templates: images made from a task's writable layer (`image commit`),
//! and the hidden base a fork's tasks share.
//!
//! Both restore a snapshot's manifest once into the layer store, with the
//! owners as the sandbox saw them (image contents are idmapped into each
//! sandbox), and publish an image that stacks those layers on the task's
//! own image. A task on a template starts with an empty writable layer: it
//! copies nothing, however large the template.

use std::path::PathBuf;

use cairn_core::{Snapshot, SnapshotKind, Task, TaskState};
use cairn_image::{fork_base_name, Image};
use cairn_sandbox::{HostLayers, LayerAccess};
use cairn_snapshot::{IdShift, Manifest};
use sha2::{Digest, Sha256};

use crate::runtime::Runtime;
use crate::snapshot::{snapshot_error, SnapshotRequest};
use crate::Error;

pub use cairn_api::images::CommitRequest;

impl Runtime {
    /// Makes image `req.name` from a task: its snapshot `req.from`, or by
    /// default a new snapshot of the running task (its latest one when it
    /// is not running).
    pub async fn commit_image(&self, req: CommitRequest, actor: &str) -> Result<Image, Error> {
        cairn_core::check_image_name(&req.name)?;
        if self.image(&req.name).await.is_ok() {
            return Err(Error::conflict(format!("image {:?} already exists", req.name)));
        }
        let task = self.find(&req.task).await?;
        if task.state == TaskState::Destroyed {
            return Err(Error::conflict(format!("task {} is destroyed; its snapshots are gone", task.id)));
        }
        let snap = match req.from.as_deref() {
            Some(from) => self.snapshot_of(&task, from).await?,
            None => self.current_snapshot(&task, &req.name, actor).await?,
        };
        let _no_gc = self.hold_blobs().await?;
        let _base_kept = self.images.keep_fork_bases().await;
        let manifest = self.load_manifest(&snap.manifest).await?;
        self.precheck(&snap, &manifest).await?;
        let source = format!("task {} at snapshot {}", task.id, snap.id);
        self.build_template(&task, req.name, &snap, &manifest, None, source).await
    }

    /// A new snapshot of a running task, else its latest.
    async fn current_snapshot(&self, task: &Task, name: &str, actor: &str) -> Result<Snapshot, Error> {
        if task.state == TaskState::Running && self.live(&task.id).is_some() {
            let req = SnapshotRequest { kind: Some(SnapshotKind::Manual.to_string()), note: Some(format!("image commit {name}")), ..Default::default() };
            return self.snapshot(task.id.as_str(), req, actor).await;
        }
        self.head_snapshot(task).await?.ok_or_else(|| {
            Error::conflict(format!("task {} is not running and has no snapshot to commit; start it or pass --from", task.id))
        })
    }

    /// The hidden template the forks of `snap` share, made on first use.
    /// The caller keeps the fork bases (`Images::keep_fork_bases`) until
    /// its tasks are recorded.
    pub(crate) async fn fork_base(&self, src: &Task, snap: &Snapshot, manifest: &Manifest) -> Result<Image, Error> {
        let name = fork_base_name(snap.id.as_str());
        match self.image(&name).await {
            Ok(image) => return Ok(image),
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let source = format!("fork of task {} at snapshot {}", src.id, snap.id);
        match self.build_template(src, name.clone(), snap, manifest, Some(snap.id.to_string()), source).await {
            // Made by a fork of the same snapshot meanwhile.
            Err(Error::Conflict(_)) => self.image(&name).await,
            made => made,
        }
    }

    /// Restores `manifest` (the snapshot's) into the layer store and
    /// publishes template `name` over the snapshot's image. Overlays the
    /// task never wrote to get no layer.
    async fn build_template(
        &self,
        task: &Task,
        name: String,
        snap: &Snapshot,
        manifest: &Manifest,
        fork_of: Option<String>,
        source: String,
    ) -> Result<Image, Error> {
        let repo = self.snaps.repo.clone();
        let parent = snap.config.image.clone();
        let manifest_id = snap.manifest.clone();
        // A checkpoint of processes is no part of an image.
        let mut manifest = manifest.clone();
        manifest.layers.retain(|l| l.name != cairn_core::MEMORY_LAYER);
        let sink = self.progress_sink(&task.id, "commit");
        // Owned as image contents are (see `SandboxDriver::image_ids`).
        let ids = self.driver.image_ids();
        let ids = IdShift { base: ids.host_base, len: ids.count };
        self.images.run(move |images| -> Result<Image, Error> {
            let scratch = images.layer_store().scratch()?;
            let disk = HostLayers::new(scratch.path());
            cairn_snapshot::restore(&repo, &manifest, disk.root(), None, ids, &mut |p| sink.update(p))
                .map_err(|e| snapshot_error("cannot restore the snapshot for the template", e))?;
            fail::fail_point!("image.commit_restored");
            let layers = manifest
                .layers
                .iter()
                // The upper itself is always an entry; nothing else means untouched.
                .filter(|l| l.entries.len() > 1)
                .map(|l| (l.at.clone(), committed_layer_key(&manifest_id, &l.name), disk.upper(&l.name)))
                .collect::<Vec<(PathBuf, String, PathBuf)>>();
            let image = images.commit(&name, &parent, source, fork_of, layers)?;
            fail::fail_point!("image.committed");
            Ok(image)
        })
        .await?
    }

    /// Removes the hidden fork bases no task, snapshot or template uses any
    /// more (a base's parent may be one, freed in turn). Returns their names.
    pub(crate) async fn remove_unused_fork_bases(&self) -> Result<Vec<String>, Error> {
        let _exclusive = self.images.fork_bases_alone().await;
        let mut removed = Vec::new();
        loop {
            let bases = self.images.run(|images| images.fork_bases()).await??;
            let in_use = self.images_in_use().await?;
            let mut progress = false;
            for base in bases.into_iter().filter(|b| !in_use.contains(b)) {
                match self.images.remove(&base).await? {
                    Ok(()) => {
                        removed.push(base);
                        progress = true;
                    }
                    // Another template is made from it: kept.
                    Err(cairn_image::Error::ImageInUse(..) | cairn_image::Error::UnknownImage(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !progress {
                return Ok(removed);
            }
        }
    }

    /// The images tasks that are not destroyed use, their snapshots' too.
    pub(crate) async fn images_in_use(&self) -> Result<std::collections::HashSet<String>, Error> {
        let mut used = std::collections::HashSet::new();
        for t in self.store.list_tasks().await? {
            if t.state.is_terminal() {
                continue;
            }
            for s in self.store.snapshots(&t.id).await? {
                used.insert(s.config.image);
            }
            used.insert(t.config.image);
        }
        Ok(used)
    }
}

/// The layer store key of the tree a manifest's layer `disk_name` restores
/// to: the same snapshot always makes the same layer, stored once.
fn committed_layer_key(manifest_id: &str, disk_name: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"cairn committed layer\n");
    h.update(manifest_id.as_bytes());
    h.update(b"\n");
    h.update(disk_name.as_bytes());
    format!("sha256:{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_committed_layer_key_is_a_sha256_of_its_snapshot_and_overlay() {
        let a = committed_layer_key("ab12", "root");
        assert!(a.starts_with("sha256:") && a.len() == 71, "{a}");
        assert_eq!(a, committed_layer_key("ab12", "root"));
        assert_ne!(a, committed_layer_key("ab12", "at_usr"));
        assert_ne!(a, committed_layer_key("ab13", "root"));
    }
}
