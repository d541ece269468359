//! Forks: new tasks from a snapshot of another, sharing its stored data;
//! each gets a `branch` snapshot as its first.

use std::time::Instant;

use cairn_core::{EventKind, NewEvent, Snapshot, SnapshotId, SnapshotKind, Task, TaskId, TaskState};
use cairn_snapshot::Manifest;
use cairn_store::now_ms;
use serde_json::json;

use crate::Error;
use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::runtime::Runtime;
use crate::snapshot::ForkRequest;

/// Most forks made by one request.
pub(crate) const MAX_FORKS: u32 = 32;

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
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        let manifest = self.load_manifest(&snap.manifest).await?;
        self.precheck(&snap, &manifest).await?;
        let image = self.image(&snap.config.image).await?;
        let mut children = Vec::new();
        for _ in 0..count {
            let child = self.fork_one(&src, &snap, &manifest, &image, actor).await?;
            children.push(child);
        }
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

    pub(crate) async fn fork_one(
        &self,
        src: &Task,
        snap: &Snapshot,
        manifest: &Manifest,
        image: &cairn_sandbox::image::Image,
        actor: &str,
    ) -> Result<crate::runtime::TaskView, Error> {
        let begun = Instant::now();
        let ahead = self.driver.take_prestarted();
        let id = ahead.as_ref().and_then(|p| p.task.parse().ok()).unwrap_or_else(TaskId::random);
        let mut task = Task::new(id, None, snap.config.clone(), now_ms());
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
            config: snap.config.clone(),
            manifest: snap.manifest.clone(),
            files: snap.files,
            bytes: snap.bytes,
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
        fail::fail_point!("fork.recorded");
        let slot = self.claim_slot(&task.id).await?;
        let source = DiskSource::Snapshot { manifest, base: None };
        self.materialise(&task, image, slot, source, OnRestoreFailure::FailNewTask, ahead, actor, async |_| {
            fail::fail_point!("fork.disk_restored");
            Ok(())
        })
        .await?;
        self.start_services(&task, actor).await?;
        Ok(self.view(self.find(task.id.as_str()).await?))
    }
}
