//! Waits: a task waits for an approval, a webhook or a timer, suspended
//! meanwhile; `wait --block` is woken by the task's changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{EventKind, NewEvent, TaskState, Wait, WaitFor, WaitId, check_event_name};
use cairn_store::now_ms;
use serde_json::json;

use crate::Error;
use crate::gateway::approval;
use crate::runtime::Runtime;

/// Longest approval prompt or comment.
pub(crate) const MAX_PROMPT: usize = 4096;

/// How long an approval link stays valid when the wait has no other end.
pub const APPROVAL_LINK_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

pub use cairn_api::waits::{ApprovalContext, ApproveRequest, EventRequest, SinceMilestone, WaitRequest, WaitView};

impl Runtime {
    /// The URL senders post webhooks named `name` for `task` to: fixed per
    /// task and name, so it can be handed out before the wait exists.
    pub fn webhook_url(&self, task: &str, name: &str) -> String {
        format!("{}/v1/hooks/{task}/{name}", self.base_url())
    }

    pub(crate) fn approval_url(&self, wait: &Wait) -> String {
        let exp = wait.created_ms + APPROVAL_LINK_TTL.as_millis() as i64;
        approval::link(&self.base_url(), wait.id.as_str(), exp, &self.link_key.token(wait.id.as_str(), exp))
    }

    pub async fn wait_view(&self, wait: Wait) -> Result<WaitView, Error> {
        let task = self.store.find_task(wait.task.as_str()).await?;
        let event = match &wait.event {
            Some(e) => Some(self.store.inbox_event(e.as_str()).await?),
            None => None,
        };
        let (approval_url, webhook_url) = match &wait.what {
            WaitFor::Approval { .. } if wait.satisfied_ms.is_none() => (Some(self.approval_url(&wait)), None),
            WaitFor::Webhook { name } => (None, Some(self.webhook_url(task.id.as_str(), name))),
            _ => (None, None),
        };
        Ok(WaitView::new(wait, task.state, approval_url, webhook_url, event))
    }

    /// Every pending approval, oldest first, with what an approver needs
    /// to decide it ([`ApprovalContext`]): the console's approvals page.
    pub async fn pending_approvals(&self) -> Result<Vec<ApprovalContext>, Error> {
        let mut out = Vec::new();
        for wait in self.store.pending_waits("approval").await? {
            out.push(self.approval_context(wait).await?);
        }
        Ok(out)
    }

    /// An approval wait with what an approver needs to decide it: the
    /// task's name and step, the prompt, the files changed from its last
    /// milestone snapshot to its newest, and its last commands.
    pub async fn approval_context(&self, wait: Wait) -> Result<ApprovalContext, Error> {
        /// Commands shown per approval.
        const LAST_COMMANDS: usize = 5;
        let prompt = match &wait.what {
            WaitFor::Approval { prompt } => prompt.clone(),
            other => return Err(Error::invalid(format!("wait {} is for {}, not an approval", wait.id, other.kind()))),
        };
        let task = self.store.find_task(wait.task.as_str()).await?;
        let events = self.store.events_before(&task.id, None, 200).await?;
        let mut last_commands: Vec<_> = events.into_iter().rev().filter(|e| e.kind == EventKind::Exec).take(LAST_COMMANDS).collect();
        last_commands.reverse();
        let snapshots = self.store.snapshots(&task.id).await?;
        let milestone = snapshots.iter().rev().find(|s| s.kind == cairn_core::SnapshotKind::Milestone);
        let since_milestone = match (milestone, snapshots.last()) {
            (Some(m), Some(newest)) => match self.diff(task.id.as_str(), m.id.as_str(), newest.id.as_str()).await {
                Ok(diff) => Some(SinceMilestone { milestone: m.id.to_string(), note: m.note.clone(), to: newest.id.to_string(), diff }),
                Err(e) => {
                    tracing::warn!(task = %task.id, "the diff since the last milestone: {e}");
                    None
                }
            },
            _ => None,
        };
        Ok(ApprovalContext { wait: self.wait_view(wait).await?, task_name: task.name, step: task.step, prompt, since_milestone, last_commands })
    }

    /// Registers a wait; unless an event in the inbox satisfies it at once,
    /// suspends the task until one does.
    pub async fn wait(self: &Arc<Self>, id_or_name: &str, req: WaitRequest, actor: &str) -> Result<WaitView, Error> {
        let what = match (req.approval, req.webhook, req.timer) {
            (Some(prompt), None, None) => {
                if prompt.trim().is_empty() || prompt.len() > MAX_PROMPT {
                    return Err(Error::invalid(format!("the approval prompt must be 1 to {MAX_PROMPT} bytes")));
                }
                WaitFor::Approval { prompt }
            }
            (None, Some(name), None) => {
                check_event_name(&name)?;
                WaitFor::Webhook { name }
            }
            (None, None, Some(t)) => {
                let ms = crate::runtime::parse_positive_ms("--timer", &t)?;
                WaitFor::Timer { fire_at_ms: now_ms() + ms as i64 }
            }
            _ => return Err(Error::invalid("give exactly one of --approval PROMPT, --webhook NAME and --timer DURATION")),
        };
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        if task.state != TaskState::Running {
            return Err(Error::conflict(format!("task {} is {}; only a running task can wait", task.id, task.state)));
        }
        let wait = Wait { id: WaitId::random(), task: task.id.clone(), what, created_ms: now_ms(), satisfied_ms: None, event: None, cancelled_ms: None };
        let log = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Wait,
            actor: actor.to_owned(),
            args: json!({ "wait": wait.id, "for": wait.what }),
            exit_code: None,
            duration_ms: None,
        };
        let early = self.store.insert_wait(&wait, &log).await.map_err(|e| match e {
            cairn_store::Error::WaitPending(_) => Error::conflict(e.to_string()),
            other => other.into(),
        })?;
        if matches!(wait.what, WaitFor::Timer { .. }) {
            self.timer_added.notify_one();
        }
        if early.is_none() {
            if let Err(e) = self.suspend_locked(&task, Some(&wait.id), "wait", actor).await {
                tracing::error!(task = %task.id, "suspend for wait {} failed: {}", wait.id, e);
                return Err(e);
            }
        }
        let wait = self.store.find_wait(wait.id.as_str()).await?;
        self.wait_view(wait).await
    }

    /// Cancels the task's pending wait. A task suspended for it wakes (it
    /// was suspended only to wait); a running one runs on.
    pub async fn cancel_wait(self: &Arc<Self>, id_or_name: &str, actor: &str) -> Result<WaitView, Error> {
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let guard = lock.lock().await;
        let pending = self.store.pending_wait(&task.id).await?;
        let Some(wait) = pending else {
            return Err(Error::not_found(format!("task {} has no pending wait", task.id)));
        };
        let log = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Wait,
            actor: actor.to_owned(),
            args: json!({ "wait": wait.id, "cancelled": true }),
            exit_code: None,
            duration_ms: None,
        };
        let Some((wait, wake)) = self.store.cancel_wait(&task.id, &log).await? else {
            return Err(Error::not_found(format!("task {} has no pending wait", task.id)));
        };
        drop(guard);
        if wake {
            self.schedule_wake(task.id.clone(), format!("wait {} cancelled by {actor}", wait.id), None);
        }
        self.wait_view(wait).await
    }

    pub(crate) async fn find_wait(&self, id: &str) -> Result<Wait, Error> {
        Ok(self.store.find_wait(id).await?)
    }

    /// A wait, optionally after blocking until it is satisfied and its task
    /// runs again (at most `timeout`).
    pub async fn get_wait(&self, id: &str, block: Option<Duration>) -> Result<WaitView, Error> {
        let deadline = block.map(|b| Instant::now() + b);
        let task = self.find_wait(id).await?.task;
        // Subscribed before the reads below: a change after one wakes us.
        let mut changes = self.cells.of(&task).subscribe();
        loop {
            let view = self.wait_view(self.find_wait(id).await?).await?;
            let done = view.satisfied_ms.is_some() && !matches!(view.task_state, TaskState::Waking | TaskState::Suspending);
            match deadline {
                Some(d) if !done && Instant::now() < d => {
                    // Woken by the next committed change, or the deadline.
                    if let Ok(Err(_)) = tokio::time::timeout_at(d.into(), changes.changed()).await {
                        return Ok(view);
                    }
                }
                _ => return Ok(view),
            }
        }
    }
}
