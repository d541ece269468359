//! Restore a snapshot into a fresh sandbox and start it: a wake, a
//! recovery, a rollback and a fork all end this way. They differ in where
//! the disk comes from ([`DiskSource`]), what they record between the
//! restore and the start, and what a failed restore leaves behind
//! ([`OnRestoreFailure`], named per operation).

use std::sync::Arc;
use std::time::Instant;

use cairn_core::{SandboxState, Task, TaskState, Transition};
use cairn_image::Image;
use cairn_sandbox::Prestarted;
use cairn_snapshot::{Manifest, RestoreStats};

use crate::runtime::Runtime;
use crate::Error;

/// Where the new sandbox's disk comes from.
pub(crate) enum DiskSource<'a> {
    /// The task's disk as it was left: a wake from the local cache, or a
    /// task that never took a snapshot.
    AsLeft,
    /// `manifest`'s writable layer, written over the disk (files that match
    /// `base`, the manifest the disk holds now, are kept as they are).
    Snapshot { manifest: &'a Manifest, base: Option<Arc<Manifest>> },
}

/// What a failed restore leaves behind. The uid slot is always given back;
/// the sandbox was not started, so nothing else of it exists.
#[derive(Debug)]
pub(crate) enum OnRestoreFailure {
    /// Wake: back to `suspended`; the snapshot is intact and a later wake
    /// may succeed.
    BackToSuspended,
    /// Recovery: nothing changes; the task stays without a sandbox and its
    /// next use tries again.
    StayLost,
    /// Rollback: the old sandbox is gone, so the task is marked lost with
    /// `why` and the error; its next use recovers it from its head snapshot.
    MarkLost { why: String },
    /// Fork: the new task has failed; its disk is removed.
    FailNewTask,
}

/// A disk restored from a snapshot.
#[derive(Debug)]
pub(crate) struct Restored {
    /// The id of the manifest the disk now holds, stored as its baseline.
    pub baseline: String,
    pub stats: RestoreStats,
}

/// A started sandbox and how it came to be.
#[derive(Debug)]
pub(crate) struct Materialised {
    /// The restore, when a snapshot was restored.
    pub restore: Option<Restored>,
    /// Milliseconds from the call to the restored disk, and to the started
    /// sandbox.
    pub restored_ms: f64,
    pub ready_ms: f64,
    /// The sandbox continued the processes of a checkpoint on the disk
    /// (gvisor) instead of booting: its services run already.
    pub resumed: bool,
}

impl Runtime {
    /// Refuses, before anything is recorded, new task disks of `disk_bytes`
    /// in all that the host's disk space cannot promise (the start checks
    /// again when it makes each disk).
    pub(crate) async fn admit_disks(&self, disk_bytes: u64) -> Result<(), Error> {
        self.driver.admit_disks(disk_bytes).await
    }

    /// Makes the task's disk from `source` on uid `slot` (claimed by the
    /// caller), stores the manifest it now holds as its baseline, runs
    /// `restored` (what the operation records before the sandbox starts),
    /// then starts the sandbox. The caller holds the task's lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn materialise(
        &self,
        task: &Task,
        image: &Image,
        slot: u32,
        source: DiskSource<'_>,
        on_failure: OnRestoreFailure,
        ahead: Option<Prestarted>,
        actor: &str,
        restored: impl AsyncFnOnce(Option<&Restored>) -> Result<(), Error>,
    ) -> Result<Materialised, Error> {
        let begun = Instant::now();
        let ids = self.driver.uid_range(slot, task.config.isolation)?;
        let restore = match source {
            DiskSource::AsLeft => None,
            DiskSource::Snapshot { manifest, base } => match self.restore_disk(task, manifest, base, ids).await {
                Ok((fresh, stats)) => Some(Restored { baseline: self.store_baseline(&task.id, fresh).await?, stats }),
                Err(e) => {
                    self.after_failed_restore(task, on_failure, &e).await?;
                    return Err(e);
                }
            },
        };
        restored(restore.as_ref()).await?;
        let restored_ms = begun.elapsed().as_secs_f64() * 1000.0;
        // Whether the start continues a checkpoint the disk holds (looked at
        // with the disk in place: a wake on the cached disk mounts it here).
        let resumed = task.config.isolation.keeps_memory() && {
            self.driver.prepare_disk(task.id.as_str(), task.config.isolation, task.config.limits.disk_bytes).await?;
            self.driver.has_checkpoint(task.id.as_str()).await?
        };
        self.start(task, image, actor, ahead, Some(slot)).await?;
        let ready_ms = begun.elapsed().as_secs_f64() * 1000.0;
        Ok(Materialised { restore, restored_ms, ready_ms, resumed })
    }

    async fn after_failed_restore(&self, task: &Task, policy: OnRestoreFailure, e: &Error) -> Result<(), Error> {
        self.release_slot(&task.id).await?;
        match policy {
            OnRestoreFailure::BackToSuspended => {
                self.store.transition(&task.id, TaskState::Waking, Transition::WakeFailed).await?;
            }
            OnRestoreFailure::StayLost => {}
            OnRestoreFailure::MarkLost { why } => {
                self.store.set_sandbox_state(&task.id, SandboxState::Lost, Some(&format!("{why}: {e}"))).await?;
            }
            OnRestoreFailure::FailNewTask => {
                self.store.transition(&task.id, TaskState::Running, Transition::Fail).await?;
                if let Err(e) = self.driver.destroy(task.id.as_str(), None).await? {
                    tracing::warn!(task = %task.id, "removing the disk of a failed fork: {e}");
                }
            }
        }
        Ok(())
    }
}
