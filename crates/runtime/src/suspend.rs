//! Suspend: `suspending`, a `suspend` snapshot fully stored, the sandbox
//! destroyed (no process, cgroup, mount or loop device left), `suspended`.
//! The task's disk image stays on local disk as a cache of the snapshot.
//! Also the idle suspender.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{EventKind, NewEvent, SnapshotKind, Task, TaskState, Transition, WaitId};
use cairn_store::now_ms;
use serde_json::json;

use crate::Error;
use crate::runtime::{Runtime, TaskView};

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
        self.view_with_wait(self.find(task.id.as_str()).await?).await
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
        // A task that keeps its memory is checkpointed with its files.
        let with_memory = task.config.keep_memory.then_some(crate::snapshot::WithMemory::ThenStop);
        let snap = match self.snapshot_locked(task, live, SnapshotKind::Suspend, note, true, None, with_memory, actor).await {
            Ok(s) => s,
            Err(e) => {
                // Nothing was torn down (a stopped checkpoint was resumed):
                // the task keeps running.
                tracing::warn!(task = %task.id, "suspend: the snapshot failed, the task runs on: {e}");
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
        self.metrics.suspend_seconds.observe(begun.elapsed().as_secs_f64());
        if state == TaskState::Waking {
            self.schedule_wake(task.id.clone(), "an event that came while suspending".into(), None);
        }
        Ok(state)
    }

    /// Suspends tasks idle for longer than their `idle_suspend`.
    pub fn spawn_idle_suspender(self: Arc<Self>) {
        tokio::spawn(async move {
            while self.pause(Duration::from_millis(500)).await {
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
}
