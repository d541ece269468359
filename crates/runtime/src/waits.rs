//! Waits and the event gateway's intake: approvals, operator events, signed
//! webhooks and timers. Every event is written to the task's durable inbox
//! (and matched against its pending wait, in the same transaction) before
//! the caller gets its answer; a task woken by it is woken in the background.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{check_event_name, EventKind, EventSource, InboxEvent, InboxId, NewEvent, TaskState, Wait, WaitFor, WaitId};
use cairn_store::{now_ms, Delivered};
use serde_json::{json, Value};

use crate::gateway::{approval, webhook};
use crate::tasks::Runtime;
use crate::Error;

/// Longest approval prompt or comment.
const MAX_PROMPT: usize = 4096;
/// How long an approval link stays valid when the wait has no other end.
pub const APPROVAL_LINK_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

pub use cairn_api::waits::{ApproveRequest, EventRequest, WaitRequest, WaitView};

impl Runtime {
    /// The URL senders post webhooks named `name` for `task` to: fixed per
    /// task and name, so it can be handed out before the wait exists.
    pub fn webhook_url(&self, task: &str, name: &str) -> String {
        format!("{}/v1/hooks/{task}/{name}", self.base_url())
    }

    fn approval_url(&self, wait: &Wait) -> String {
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
                let ms = crate::tasks::parse_positive_ms("--timer", &t)?;
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
        let wait = Wait { id: WaitId::random(), task: task.id.clone(), what, created_ms: now_ms(), satisfied_ms: None, event: None };
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

    async fn find_wait(&self, id: &str) -> Result<Wait, Error> {
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

    /// Delivers an event; wakes the task when it satisfied the wait it was
    /// suspended on.
    async fn deliver(self: &Arc<Self>, ev: InboxEvent) -> Result<Delivered, Error> {
        let accepted = Instant::now();
        let d = self.store.deliver(&ev).await?;
        fail::fail_point!("event.stored");
        if d.wake {
            self.schedule_wake(ev.task.clone(), format!("event {}", d.event.id), Some(accepted));
        }
        Ok(d)
    }

    /// `cairn approve`: approves or rejects the task's pending approval.
    pub async fn approve(self: &Arc<Self>, id_or_name: &str, req: ApproveRequest, by: &str) -> Result<Delivered, Error> {
        let task = self.find(id_or_name).await?;
        let pending = self.store.pending_wait(&task.id).await?;
        if !matches!(pending.as_ref().map(|w| &w.what), Some(WaitFor::Approval { .. })) {
            return Err(Error::conflict(format!("task {} is not waiting for an approval", task.id)));
        }
        self.approve_wait(&task.id, req, by).await
    }

    pub async fn approve_wait(self: &Arc<Self>, task: &cairn_core::TaskId, req: ApproveRequest, by: &str) -> Result<Delivered, Error> {
        if req.comment.as_ref().is_some_and(|c| c.len() > MAX_PROMPT) {
            return Err(Error::invalid(format!("the comment is over {MAX_PROMPT} bytes")));
        }
        let decision = if req.approve { "approve" } else { "reject" };
        self.deliver(InboxEvent {
            id: InboxId::random(),
            task: task.clone(),
            source: EventSource::Approval,
            name: "approval".into(),
            delivery: None,
            data: json!({ "decision": decision, "comment": req.comment, "by": by }),
            received_ms: now_ms(),
            wait: None,
        })
        .await
    }

    /// `cairn event`: an operator's event, by name.
    pub async fn operator_event(self: &Arc<Self>, id_or_name: &str, req: EventRequest, actor: &str) -> Result<Delivered, Error> {
        check_event_name(&req.name)?;
        let task = self.find(id_or_name).await?;
        if task.state.is_terminal() {
            return Err(Error::conflict(format!("task {} is {}", task.id, task.state)));
        }
        self.deliver(InboxEvent {
            id: InboxId::random(),
            task: task.id.clone(),
            source: EventSource::Operator,
            name: req.name,
            delivery: None,
            data: json!({ "payload": req.data, "by": actor }),
            received_ms: now_ms(),
            wait: None,
        })
        .await
    }

    /// A webhook for `task`'s event `name`, signed with the task's secret.
    pub async fn webhook(self: &Arc<Self>, task: &str, name: &str, headers: &webhook::WebhookHeaders, body: &[u8]) -> Result<Delivered, Error> {
        if !cairn_core::TaskId::looks_like(task) {
            return Err(Error::not_found(format!("unknown task {task:?}")));
        }
        let t = self.find(task).await?;
        check_event_name(name).map_err(|e| Error::not_found(e.to_string()))?;
        if t.state.is_terminal() {
            return Err(Error::not_found(format!("task {} is {}", t.id, t.state)));
        }
        let secret = t.webhook_secret.as_deref().ok_or_else(|| Error::not_found(format!("task {} takes no webhooks", t.id)))?;
        let verified = webhook::verify(secret, headers, body, now_ms() / 1000)?;
        let data: Value = serde_json::from_slice(body).map_err(|e| Error::invalid(format!("webhook body is not JSON: {e}")))?;
        fail::fail_point!("event.verified");
        self.deliver(InboxEvent {
            id: InboxId::random(),
            task: t.id.clone(),
            source: EventSource::Webhook,
            name: name.to_owned(),
            delivery: Some(verified.id),
            data,
            received_ms: now_ms(),
            wait: None,
        })
        .await
    }

    /// Fires due timers, now and whenever one comes due (also those that
    /// came due while the daemon was down).
    pub fn spawn_timers(self: Arc<Self>) {
        tokio::spawn(async move {
            loop {
                match self.store.due_timers(now_ms()).await {
                    Ok(due) => {
                        for w in due {
                            let ev = InboxEvent {
                                id: InboxId::random(),
                                task: w.task.clone(),
                                source: EventSource::Timer,
                                name: w.id.to_string(),
                                // A timer fires once, even if the daemon dies right after.
                                delivery: Some(w.id.to_string()),
                                data: json!({ "fire_at_ms": match w.what { WaitFor::Timer { fire_at_ms } => fire_at_ms, _ => 0 } }),
                                received_ms: now_ms(),
                                wait: None,
                            };
                            if let Err(e) = self.deliver(ev).await {
                                tracing::error!(task = %w.task, "timer {}: {}", w.id, e);
                            }
                        }
                    }
                    Err(e) => tracing::error!("timers: {e}"),
                }
                // Until the next timer is due, or a new timer comes first;
                // at most a minute, in case the clock jumped.
                let next = self.store.next_timer_ms().await.ok().flatten();
                let sleep = next.map(|t| (t - now_ms()).clamp(5, 60_000)).unwrap_or(60_000);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(sleep as u64)) => {}
                    _ = self.timer_added.notified() => {}
                }
            }
        });
    }
}
