//! Suspend, wake and recovery: a task's compute goes away while its state
//! stays, and comes back into a fresh sandbox.
//!
//! - Suspend: `suspending`, a `suspend` snapshot fully stored, the sandbox
//!   destroyed (no process, cgroup, mount or loop device left), `suspended`.
//!   The task's disk image stays on local disk as a cache of the snapshot.
//! - Wake: `waking`, a fresh sandbox on the cached disk when it is exactly
//!   the suspend snapshot and the uid range is the same (nothing to copy, so
//!   the time does not grow with the workspace), else restored from the blob
//!   store; services started; `running`.
//! - Recovery: a task whose sandbox is gone (daemon or host died) is restored
//!   from its latest snapshot into a fresh sandbox, with a note of what was
//!   lost since.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{EventKind, NewEvent, SandboxState, SnapshotKind, Task, TaskId, TaskState, Transition, WaitId};
use cairn_store::now_ms;
use serde_json::json;

use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::tasks::{Runtime, TaskView};
use crate::Error;

impl Runtime {
    /// `cairn suspend`.
    pub async fn suspend(self: &Arc<Self>, id_or_name: &str, actor: &str) -> Result<TaskView, Error> {
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        if task.state != TaskState::Running {
            return Err(Error::conflict(format!("task {} is {}; only a running task can be suspended", task.id, task.state)));
        }
        self.suspend_locked(&task, None, "manual", actor).await?;
        Ok(self.view(self.find(task.id.as_str()).await?))
    }

    /// Suspends a running task whose lock the caller holds; `waiting_for`
    /// is the wait it suspends for. Returns the state it ends in
    /// (`suspended`, or `waking` when that wait was satisfied meanwhile).
    pub(crate) async fn suspend_locked(
        self: &Arc<Self>,
        task: &Task,
        waiting_for: Option<&WaitId>,
        reason: &str,
        actor: &str,
    ) -> Result<TaskState, Error> {
        let live = self.live(&task.id).ok_or_else(|| Error::conflict(format!("task {} has no running sandbox", task.id)))?;
        let slot = self.store.sandbox(&task.id).await?.map(|r| r.uid_slot);
        let begun = Instant::now();
        self.store.transition(&task.id, task.state, Transition::Suspend).await?;
        self.log(&task.id, EventKind::Suspend, actor, json!({ "phase": "begin", "reason": reason, "wait": waiting_for }), None, None).await;
        let note = match waiting_for {
            Some(w) => format!("suspended for wait {w}"),
            None => format!("suspended ({reason})"),
        };
        let snap = match self.snapshot_locked(task, live, SnapshotKind::Suspend, note, true, None, actor).await {
            Ok(s) => s,
            Err(e) => {
                // Nothing was torn down: the task keeps running.
                self.store.transition(&task.id, TaskState::Suspending, Transition::CancelSuspend).await?;
                self.log(&task.id, EventKind::Suspend, actor, json!({ "phase": "end", "error": e.to_string() }), Some(1), None).await;
                return Err(e);
            }
        };
        fail::fail_point!("suspend.snapshot_taken");
        self.stop_sandbox_keep_disk(task).await?;
        // A suspended task holds no memory in the daemon either.
        self.forget_baseline(&task.id);
        self.store.set_last_uid_slot(&task.id, slot).await?;
        fail::fail_point!("suspend.sandbox_stopped");
        let end = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Suspend,
            actor: actor.to_owned(),
            args: json!({ "phase": "end", "snapshot": snap.id, "freeze_ms": snap.freeze_ms, "added_bytes": snap.added_bytes }),
            exit_code: Some(0),
            duration_ms: Some(begun.elapsed().as_millis() as u64),
        };
        let state = self.store.finish_suspend(&task.id, waiting_for, &end).await?;
        fail::fail_point!("suspend.recorded");
        if state == TaskState::Waking {
            self.schedule_wake(task.id.clone(), "an event that came while suspending".into(), None);
        }
        Ok(state)
    }

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
        Ok(self.view(self.find(task.id.as_str()).await?))
    }

    /// Brings a `waking` task back into a fresh sandbox.
    pub(crate) async fn wake(&self, id: &TaskId, trigger: &str, accepted: Option<Instant>) -> Result<(), Error> {
        let lock = self.lock_of(id);
        let _guard = lock.lock().await;
        let task = self.find(id.as_str()).await?;
        if task.state != TaskState::Waking {
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
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        let begun = Instant::now();
        let snap = self.store.snapshots(&task.id).await?.pop();
        let image = self.image(&task.config.image).await?;
        let previous = self.store.last_uid_slot(&task.id).await?;
        let slot = self.claim_slot_preferring(&task.id, previous).await?;
        let cached = self.driver.has_disk(task.id.as_str());
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
        let (restored_ms, ready_ms) = (made.restored_ms, made.ready_ms);
        let restore = json!(made.restore.map(|r| r.stats));
        fail::fail_point!("wake.sandbox_started");
        self.start_services(&task, "daemon").await?;
        let mut args = json!({
            "trigger": trigger, "snapshot": snap.as_ref().map(|s| &s.id), "from_cache": from_cache,
            "restore": restore, "restored_ms": restored_ms, "sandbox_ready_ms": ready_ms,
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
        let _no_gc = self.snaps.repo.gc_lock().read().await;
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
                let cached = self.driver.has_disk(task.id.as_str());
                DiskSource::Snapshot { manifest: m, base: if cached { self.baseline_manifest(&task.id).await } else { None } }
            }
            None => DiskSource::AsLeft,
        };
        self.materialise(&task, &image, slot, source, OnRestoreFailure::StayLost, None, "daemon", async |_| Ok(())).await?;
        let (note, step, memory) = match &snap {
            Some(s) => {
                let lost = if task.step > s.step {
                    format!("steps {} to {} and their changes to files were lost", s.step + 1, task.step)
                } else {
                    "nothing was lost".to_owned()
                };
                (format!("recovered from snapshot {} (step {}) after the sandbox was lost; {lost}", s.id, s.step), s.step, s.memory.clone())
            }
            None => (
                format!("the sandbox was lost and the task has no snapshot: restarted on its writable layer as it was left (step {})", task.step),
                task.step,
                task.memory.clone(),
            ),
        };
        self.start_services(&task, "daemon").await?;
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
                    self.recover(&t.id).await
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::error!(task = %t.id, "recovery failed: {}", e);
            }
        }
    }

    /// Suspends tasks idle for longer than their `idle_suspend`.
    pub fn spawn_idle_suspender(self: Arc<Self>) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Ok(tasks) = self.store.idle_tasks(now_ms()).await else { continue };
                for t in tasks {
                    let Some(idle) = t.config.idle_suspend_ms else { continue };
                    if self.busy(&t.id) {
                        continue;
                    }
                    let lock = self.lock_of(&t.id);
                    let Some(_guard) = lock.try_lock() else { continue };
                    let Ok(task) = self.find(t.id.as_str()).await else { continue };
                    if task.state != TaskState::Running || self.live(&task.id).is_none() || now_ms() - task.last_activity_ms < idle as i64 {
                        continue;
                    }
                    if let Err(e) = self.suspend_locked(&task, None, "idle", "daemon").await {
                        tracing::warn!(task = %task.id, "idle suspend: {}", e);
                    }
                }
            }
        });
    }

    /// Appends an event; a failure to log is reported, not returned (the
    /// step it records has happened either way).
    pub(crate) async fn log(&self, task: &TaskId, kind: EventKind, actor: &str, args: serde_json::Value, exit_code: Option<i32>, duration_ms: Option<u64>) {
        let ev = NewEvent { task: task.clone(), kind, actor: actor.to_owned(), args, exit_code, duration_ms };
        if let Err(e) = self.store.append_event(&ev).await {
            tracing::error!(task = %task, "cannot log {kind}: {e}");
        }
    }
}
