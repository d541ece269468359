//! Forks: new tasks from a snapshot of another. The snapshot is restored
//! once into a hidden template (see `template.rs`), which every fork of it
//! shares as a read-only layer; each new task starts on it with an empty
//! writable layer, so a fork copies nothing however large the snapshot.
//! Each gets a `branch` snapshot as its first: no change over that base.

use std::time::Instant;

use cairn_core::{EventKind, NewEvent, Snapshot, SnapshotId, SnapshotKind, Task, TaskId, TaskState};
use cairn_snapshot::{LayerTree, Manifest};
use futures_util::{StreamExt, TryStreamExt};
use cairn_store::now_ms;
use serde_json::json;

use crate::Error;
use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::runtime::Runtime;
use crate::snapshot::ForkRequest;

/// Most forks made by one request.
pub(crate) const MAX_FORKS: u32 = 128;

/// Forks started at once: sandbox starts are mostly waiting on the kernel
/// and the store.
const FORKS_AT_ONCE: usize = 8;

impl Runtime {
    /// Creates `count` tasks starting from a snapshot of another, sharing its
    /// stored data; each gets a `branch` snapshot as its first.
    pub async fn fork(&self, id_or_name: &str, req: ForkRequest, actor: &str) -> Result<Vec<crate::runtime::TaskView>, Error> {
        let count = req.count.unwrap_or(1);
        if count == 0 || count > MAX_FORKS {
            return Err(Error::invalid(format!("--count must be 1 to {MAX_FORKS}, not {count}")));
        }
        let src = self.find(id_or_name).await?;
        if src.state == TaskState::Destroyed {
            return Err(Error::conflict(format!("task {} is destroyed; its snapshots are gone", src.id)));
        }
        let snap = match req.from.as_deref() {
            Some(from) => self.snapshot_of(&src, from).await?,
            None => self.store.snapshots(&src.id).await?.pop().ok_or_else(|| {
                Error::conflict(format!("task {} has no snapshot to fork from; take one with `cairn snapshot {}`", src.id, src.id))
            })?,
        };
        self.admit_disks(src.config.limits.disk_bytes.saturating_mul(count as u64)).await?;
        let _no_gc = self.hold_blobs().await?;
        let manifest = self.load_manifest(&snap.manifest).await?;
        self.precheck(&snap, &manifest).await?;
        let _base_kept = self.images.keep_fork_bases().await;
        let base = self.fork_base(&src, &snap, &manifest).await?;
        let empty = self.empty_manifest(&manifest).await?;
        let children: Vec<_> = futures_util::stream::iter(0..count)
            .map(|_| self.fork_one(&src, &snap, &empty, &base, actor))
            .buffer_unordered(FORKS_AT_ONCE)
            .try_collect()
            .await?;
        self.log(
            &src.id,
            EventKind::Fork,
            actor,
            json!({ "snapshot": snap.id, "children": children.iter().map(|c| c.task.id.clone()).collect::<Vec<_>>() }),
            Some(0),
            None,
        )
        .await;
        Ok(children)
    }

    /// A manifest of `like`'s layers with nothing in them: what a fork's
    /// branch snapshot holds over its base; but the memory layer (a
    /// checkpoint of the processes) whole, since the base has no memory.
    /// Stored and returned with its id.
    async fn empty_manifest(&self, like: &Manifest) -> Result<(String, Manifest), Error> {
        let layers = like
            .layers
            .iter()
            .map(|l| match l.name.as_str() {
                cairn_core::MEMORY_LAYER => l.clone(),
                _ => LayerTree::new(l.name.clone(), l.at.clone(), l.entries.iter().take(1).cloned().collect()),
            })
            .collect();
        let (id, empty) = self.snaps.store_manifest(Manifest::new(layers), "branch manifest").await?;
        Ok((id.to_hex(), empty))
    }

    /// One fork: a task on `base` (the snapshot's shared fork base) with
    /// `empty` (id, manifest) as its branch snapshot.
    pub(crate) async fn fork_one(
        &self,
        src: &Task,
        snap: &Snapshot,
        empty: &(String, Manifest),
        base: &cairn_image::Image,
        actor: &str,
    ) -> Result<crate::runtime::TaskView, Error> {
        let begun = Instant::now();
        let ahead = self.driver.take_prestarted();
        let id = ahead.as_ref().and_then(|p| p.task.parse().ok()).unwrap_or_else(TaskId::random);
        let mut config = snap.config.clone();
        config.image = base.name.clone();
        let mut task = Task::new(id, None, config, now_ms());
        task.step = snap.step;
        task.memory = snap.memory.clone();
        task.webhook_secret = Some(crate::gateway::webhook::new_secret());
        // Running without a sandbox until its disk is restored: nothing starts
        // it on an empty disk, and a daemon that dies meanwhile recovers it
        // from its branch snapshot.
        task.state = TaskState::Running;
        task.sandbox = cairn_core::SandboxState::Lost;
        task.sandbox_note = Some(format!("being restored from snapshot {} (fork)", snap.id));
        let created = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Create,
            actor: actor.to_owned(),
            args: json!({ "fork_of": src.id, "snapshot": snap.id }),
            exit_code: Some(0),
            duration_ms: None,
        };
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let branch = Snapshot {
            id: SnapshotId::random(),
            task: task.id.clone(),
            parent: Some(snap.id.clone()),
            kind: SnapshotKind::Branch,
            note: format!("fork of {} at {}", src.id, snap.id),
            healthy: true,
            step: snap.step,
            memory: snap.memory.clone(),
            with_memory: snap.with_memory,
            config: task.config.clone(),
            manifest: empty.0.clone(),
            files: 0,
            bytes: 0,
            added_bytes: 0,
            freeze_ms: 0.0,
            duration_ms: begun.elapsed().as_secs_f64() * 1000.0,
            created_ms: now_ms(),
        };
        let snapshotted = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Snapshot,
            actor: actor.to_owned(),
            args: json!({ "snapshot": branch.id, "kind": "branch", "parent": snap.id }),
            exit_code: Some(0),
            duration_ms: None,
        };
        // The task with its branch snapshot, in one step; the disk is made
        // from the branch next.
        self.store.insert_fork(&task, &created, &branch, &snapshotted).await?;
        // Running without a node until now: taken before another node's
        // heartbeat could take it over as lost.
        if !self.take_lease(&task.id).await? {
            return Err(Error::conflict(format!("fork {} was taken over by another node", task.id)));
        }
        fail::fail_point!("fork.recorded");
        let slot = self.claim_slot(&task.id).await?;
        let source = DiskSource::Snapshot { manifest: &empty.1, base: None };
        let made = self
            .materialise(&task, base, slot, source, OnRestoreFailure::FailNewTask, ahead, actor, async |_| {
                fail::fail_point!("fork.disk_restored");
                Ok(())
            })
            .await?;
        if !made.resumed {
            self.start_services(&task, actor).await?;
        }
        Ok(self.view(self.find(task.id.as_str()).await?))
    }
}
