//! Wake and recovery: a task's compute comes back into a fresh sandbox.
//!
//! - Wake: `waking`, a fresh sandbox on the cached disk when it is exactly
//!   the suspend snapshot and the uid range is the same (nothing to copy, so
//!   the time does not grow with the workspace), else restored from the blob
//!   store; services started; `running`. Queued by the wake scheduler.
//! - Recovery: a task whose sandbox is gone (daemon or host died) is restored
//!   from its head snapshot into a fresh sandbox, with a note of what was
//!   lost since.

use std::sync::Arc;
use std::time::Instant;

use cairn_core::{EventKind, NewEvent, SandboxState, TaskId, TaskState, Transition};
use serde_json::json;

use crate::Error;
use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::runtime::{Runtime, TaskView};

impl Runtime {
    /// `cairn resume` (and the first exec or cp of a suspended task).
    pub async fn resume(&self, id_or_name: &str, actor: &str) -> Result<TaskView, Error> {
        let task = self.find(id_or_name).await?;
        match task.state {
            TaskState::Suspended => {
                self.store.begin_wake(&task.id).await?;
                self.wake(&task.id, &format!("resume by {actor}"), None).await?;
            }
            TaskState::Waking | TaskState::Suspending => {
                // Another request is on it: wait for its outcome under the lock.
                let lock = self.lock_of(&task.id);
                drop(lock.lock().await);
                let now = self.find(task.id.as_str()).await?;
                if now.state == TaskState::Waking {
                    self.wake(&task.id, &format!("resume by {actor}"), None).await?;
                } else if now.state == TaskState::Suspended {
                    return Box::pin(self.resume(id_or_name, actor)).await;
                }
            }
            TaskState::Running => {}
            other => return Err(Error::conflict(format!("task {} is {other}; it cannot be resumed", task.id))),
        }
        // With its pending wait: a resume does not cancel it (that is
        // `DELETE /v1/tasks/{id}/waits`), and the answer says it stands.
        self.view_with_wait(self.find(task.id.as_str()).await?).await
    }

    /// Brings a `waking` task back into a fresh sandbox.
    pub(crate) async fn wake(&self, id: &TaskId, trigger: &str, accepted: Option<Instant>) -> Result<(), Error> {
        let lock = self.lock_of(id);
        let _guard = lock.lock().await;
        let task = self.find(id.as_str()).await?;
        if task.state != TaskState::Waking {
            return Ok(());
        }
        if self.live(&task.id).is_none() && (!self.has_room() || !self.can_run(&task.config.image).await) {
            // Left `waking` for a node with room (and the image) to take.
            tracing::info!(task = %task.id, node = %self.cluster.name, "no room or no image here: another node wakes it");
            return Ok(());
        }
        if !self.take_lease(&task.id).await? {
            tracing::info!(task = %task.id, "another node wakes it");
            return Ok(());
        }
        if self.live(&task.id).is_some() {
            // A daemon that died after the new sandbox started, before the
            // task was marked running: the sandbox survived the restart.
            let args = json!({ "trigger": trigger, "note": "the sandbox had started before the daemon restarted" });
            let ev = NewEvent { task: task.id.clone(), kind: EventKind::Wake, actor: "daemon".into(), args, exit_code: Some(0), duration_ms: None };
            self.store.finish_wake(&task.id, &ev).await?;
            return Ok(());
        }
        let _no_gc = self.hold_blobs().await?;
        let begun = Instant::now();
        let snap = self.store.snapshots(&task.id).await?.pop();
        let image = self.image(&task.config.image).await?;
        let previous = self.store.last_uid_slot(&task.id).await?;
        let slot = self.claim_slot_preferring(&task.id, previous).await?;
        let cached = self.driver.has_disk(task.id.as_str()).await?;
        let baseline = self.store.baseline(&task.id).await?;
        // The cached disk is used as it is only when it holds exactly the
        // suspend snapshot and keeps its uid range.
        let from_cache = match &snap {
            Some(s) => cached && previous == Some(slot) && baseline.as_deref() == Some(s.manifest.as_str()),
            None => cached,
        };
        let manifest = match (from_cache, &snap) {
            (false, Some(s)) => Some(self.load_manifest(&s.manifest).await?),
            _ => None,
        };
        let source = match &manifest {
            Some(m) => DiskSource::Snapshot { manifest: m, base: if cached { self.baseline_manifest(&task.id).await } else { None } },
            None => DiskSource::AsLeft,
        };
        let made = self
            .materialise(&task, &image, slot, source, OnRestoreFailure::BackToSuspended, None, "daemon", async |_| {
                fail::fail_point!("wake.disk_restored");
                Ok(())
            })
            .await;
        let made = match made {
            Ok(m) => m,
            Err(e) => {
                self.log(&task.id, EventKind::Wake, "daemon", json!({ "trigger": trigger, "error": e.to_string() }), Some(1), None).await;
                return Err(e);
            }
        };
        let (restored_ms, ready_ms, resumed) = (made.restored_ms, made.ready_ms, made.resumed);
        let restore = json!(made.restore.map(|r| r.stats));
        fail::fail_point!("wake.sandbox_started");
        if !resumed {
            self.start_services(&task, "daemon").await?;
        }
        let mut args = json!({
            "trigger": trigger, "snapshot": snap.as_ref().map(|s| &s.id), "from_cache": from_cache,
            "restore": restore, "restored_ms": restored_ms, "sandbox_ready_ms": ready_ms, "resumed_processes": resumed,
        });
        if let Some(a) = accepted {
            args["event_accepted_to_ready_ms"] = json!(a.elapsed().as_secs_f64() * 1000.0);
        }
        let ev = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Wake,
            actor: "daemon".into(),
            args,
            exit_code: Some(0),
            duration_ms: Some(begun.elapsed().as_millis() as u64),
        };
        self.store.finish_wake(&task.id, &ev).await?;
        fail::fail_point!("wake.recorded");
        self.metrics.wake_seconds.observe(begun.elapsed().as_secs_f64());
        Ok(())
    }

    /// Rebuilds the sandbox of a task whose sandbox is gone: from its head
    /// snapshot (the latest, or a later rollback's target; step and memory
    /// summary included) when it has one, else on
    /// its disk as it was left. Records what was lost in a recovery note.
    pub(crate) async fn recover(&self, id: &TaskId) -> Result<(), Error> {
        let lock = self.lock_of(id);
        let _guard = lock.lock().await;
        let task = self.find(id.as_str()).await?;
        if !matches!(task.state, TaskState::Running | TaskState::Suspending) || self.live(id).is_some() {
            return Ok(());
        }
        if !self.take_lease(id).await? {
            return Err(Error::conflict(format!("task {} runs on another node", task.id)));
        }
        let _no_gc = self.hold_blobs().await?;
        let begun = Instant::now();
        let image = self.image(&task.config.image).await?;
        // After a rollback, the target: the task's record says it is there.
        let snap = self.head_snapshot(&task).await?;
        let slot = self.claim_slot(&task.id).await?;
        let manifest = match &snap {
            Some(s) => Some(self.load_manifest(&s.manifest).await?),
            None => None,
        };
        let source = match &manifest {
            Some(m) => {
                let cached = self.driver.has_disk(task.id.as_str()).await?;
                DiskSource::Snapshot { manifest: m, base: if cached { self.baseline_manifest(&task.id).await } else { None } }
            }
            None => DiskSource::AsLeft,
        };
        let made = self.materialise(&task, &image, slot, source, OnRestoreFailure::StayLost, None, "daemon", async |_| Ok(())).await?;
        let (note, step, memory) = match &snap {
            Some(s) => {
                let lost = if task.step > s.step {
                    format!("steps {} to {} and their changes to files were lost", s.step + 1, task.step)
                } else {
                    "nothing was lost".to_owned()
                };
                let why = task.sandbox_note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
                (
                    format!("recovered from snapshot {} (step {}) on node {} after the sandbox was lost{why}; {lost}", s.id, s.step, self.cluster.name),
                    s.step,
                    s.memory.clone(),
                )
            }
            None => (
                format!("the sandbox was lost and the task has no snapshot: restarted on its writable layer as it was left (step {})", task.step),
                task.step,
                task.memory.clone(),
            ),
        };
        if !made.resumed {
            self.start_services(&task, "daemon").await?;
        }
        let ev = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Recovered,
            actor: "daemon".into(),
            args: json!({ "snapshot": snap.as_ref().map(|s| &s.id), "step": step, "lost_from_step": task.step, "note": note }),
            exit_code: Some(0),
            duration_ms: Some(begun.elapsed().as_millis() as u64),
        };
        self.store.record_recovery(&task.id, task.state, step, &memory, &note, &ev).await?;
        tracing::info!(task = %task.id, took = ?begun.elapsed(), "{note}");
        Ok(())
    }

    /// After a restart: wakes tasks left `waking`, recovers running (or
    /// half-suspended) tasks whose sandbox is gone.
    pub async fn recover_all(self: &Arc<Self>) {
        let tasks = match self.store.list_tasks().await {
            Ok(t) => t,
            Err(e) => return tracing::error!("recovery: {e}"),
        };
        for t in tasks {
            let result = match (t.state, t.sandbox) {
                (TaskState::Waking, _) => self.wake(&t.id, "restart of the daemon", None).await,
                (TaskState::Suspending, _) if self.live(&t.id).is_some() => {
                    // The sandbox survived a suspend cut short: it runs on.
                    self.store.transition(&t.id, TaskState::Suspending, Transition::CancelSuspend).await.map(drop).map_err(Error::from)
                }
                (TaskState::Running | TaskState::Suspending, SandboxState::Lost | SandboxState::None) if self.live(&t.id).is_none() => {
                    // Another node's lost sandbox is that node's to rebuild,
                    // or, once its lease runs out, any node's (`lease.rs`).
                    match self.ran_here(&t).await {
                        Ok(true) => self.recover(&t.id).await,
                        other => other.map(drop),
                    }
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(task = %t.id, "recovery failed: {}", e);
            }
        }
    }
}
