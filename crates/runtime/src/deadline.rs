//! A task's deadline: when it ends by itself (E2B's sandbox timeout).
//! Past it, a running task is destroyed, or suspended when it asked to be
//! (`suspend_at_deadline`); a suspended one past it is destroyed unless it
//! asked to be suspended. Checked once a second by the node that runs the
//! task (or, for a suspended one, by any node).

use std::sync::Arc;
use std::time::Duration;

use cairn_core::{EventKind, NewEvent, TaskState};
use cairn_store::now_ms;
use serde_json::json;

use crate::runtime::{Runtime, TaskView};
use crate::Error;

/// How often deadlines are looked at.
const SWEEP: Duration = Duration::from_secs(1);

impl Runtime {
    /// Sets when task `id` ends by itself: `after` from now (`None`: it
    /// never does), and whether it is then suspended instead of destroyed
    /// (`None`: as before). Recorded with a `deadline` event.
    pub async fn set_deadline(&self, id: &str, after: Option<Duration>, suspend: Option<bool>, actor: &str) -> Result<TaskView, Error> {
        let task = self.find(id).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let mut task = self.find(task.id.as_str()).await?;
        if task.state.is_terminal() {
            return Err(Error::conflict(format!("task {} is {}; it has no deadline to change", task.id, task.state)));
        }
        task.config.deadline_ms = after.map(|d| now_ms().saturating_add(d.as_millis().min(i64::MAX as u128) as i64));
        if let Some(s) = suspend {
            task.config.suspend_at_deadline = s;
        }
        let event = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Deadline,
            actor: actor.to_owned(),
            args: json!({ "deadline_ms": task.config.deadline_ms, "suspend": task.config.suspend_at_deadline }),
            exit_code: None,
            duration_ms: None,
        };
        self.store.set_config(&task.id, &task.config, &event).await?;
        drop(_guard);
        self.show(task.id.as_str()).await
    }

    /// Ends the tasks past their deadline, for as long as the daemon runs.
    pub fn spawn_deadline_keeper(self: Arc<Self>) {
        tokio::spawn(async move {
            while self.pause(SWEEP).await {
                let Ok(tasks) = self.store.list_tasks().await else { continue };
                let now = now_ms();
                for t in tasks {
                    let Some(deadline) = t.config.deadline_ms else { continue };
                    if deadline > now || t.state.is_terminal() {
                        continue;
                    }
                    let result = match t.state {
                        // Another node's running task is that node's to end.
                        TaskState::Running if t.node.as_deref().is_some_and(|n| n != self.cluster.name) => continue,
                        TaskState::Running if t.config.suspend_at_deadline => {
                            if self.busy(&t.id) {
                                continue;
                            }
                            self.suspend_at_deadline(&t.id).await
                        }
                        TaskState::Suspended if t.config.suspend_at_deadline => continue,
                        TaskState::Running | TaskState::Suspended | TaskState::Failed | TaskState::Created => {
                            self.destroy(t.id.as_str(), "deadline").await.map(|_| ())
                        }
                        // Changing state: looked at again next time.
                        _ => continue,
                    };
                    if let Err(e) = result {
                        tracing::warn!(task = %t.id, "at its deadline: {e}");
                    }
                }
            }
        });
    }

    async fn suspend_at_deadline(self: &Arc<Self>, id: &cairn_core::TaskId) -> Result<(), Error> {
        let lock = self.lock_of(id);
        let Some(_guard) = lock.try_lock() else { return Ok(()) };
        let task = self.find(id.as_str()).await?;
        if task.state != TaskState::Running {
            return Ok(());
        }
        self.suspend_locked(&task, None, "deadline", "deadline").await?;
        Ok(())
    }
}
