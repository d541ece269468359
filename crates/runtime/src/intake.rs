//! Event intake: webhooks (verified on plain bytes), approvals, operator
//! events and timers. Every event is written to the task's durable inbox
//! and matched against its pending wait in one transaction before it is
//! acknowledged; a match on a suspended task queues its wake.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{EventSource, InboxEvent, InboxId, WaitFor, check_event_name};
use cairn_api::waits::Delivered;
use cairn_store::now_ms;
use serde_json::{Value, json};

use crate::Error;
use crate::gateway::webhook;
use crate::runtime::Runtime;
use crate::waits::{ApproveRequest, EventRequest, MAX_PROMPT};

/// What the page of an approval link posts: the link's wait, expiry and
/// signature, and the decision with its comment.
#[derive(Debug)]
pub struct LinkDecision<'a> {
    pub wait: &'a str,
    pub exp: i64,
    pub sig: &'a str,
    /// `approve` or `reject`.
    pub decision: &'a str,
    pub comment: Option<String>,
}

/// A decision [`Runtime::approve_by_link`] delivered.
#[derive(Debug)]
pub struct LinkApproved {
    pub task: cairn_core::TaskId,
    pub approve: bool,
    /// The comment, unless it was blank.
    pub comment: Option<String>,
    pub delivered: Delivered,
}

impl Runtime {
    /// Delivers an event; wakes the task when it satisfied the wait it was
    /// suspended on.
    pub(crate) async fn deliver(self: &Arc<Self>, ev: InboxEvent) -> Result<Delivered, Error> {
        let accepted = Instant::now();
        let d = self.store.deliver(&ev).await?;
        fail::fail_point!("event.stored");
        if d.wake {
            self.schedule_wake(ev.task.clone(), format!("event {}", d.event.id), Some(accepted));
        }
        Ok(Delivered { event: d.event, duplicate: d.duplicate, satisfied: d.satisfied, wakes: d.wake })
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

    /// A decision made on the page of an approval link: checks the link
    /// (signature, expiry, a wait still pending), then the decision
    /// (`approve` or `reject`; anything else is [`Error::Invalid`]), then
    /// delivers it. A blank comment is none.
    pub async fn approve_by_link(self: &Arc<Self>, link: LinkDecision<'_>, by: &str) -> Result<LinkApproved, Error> {
        let linked = self.linked_wait(link.wait, link.exp, link.sig).await?;
        let approve = match link.decision {
            "approve" => true,
            "reject" => false,
            other => return Err(Error::invalid(format!("unknown decision {other:?}"))),
        };
        let comment = link.comment.filter(|c| !c.trim().is_empty());
        let task = linked.wait.task;
        let delivered = self.approve_wait(&task, ApproveRequest { approve, comment: comment.clone() }, by).await?;
        Ok(LinkApproved { task, approve, comment, delivered })
    }

    pub(crate) async fn approve_wait(self: &Arc<Self>, task: &cairn_core::TaskId, req: ApproveRequest, by: &str) -> Result<Delivered, Error> {
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
        let result = self.take_webhook(task, name, headers, body).await;
        self.metrics.webhook(match &result {
            Ok(d) if d.duplicate => "duplicate",
            Ok(_) => "accepted",
            Err(_) => "refused",
        });
        result
    }

    async fn take_webhook(self: &Arc<Self>, task: &str, name: &str, headers: &webhook::WebhookHeaders, body: &[u8]) -> Result<Delivered, Error> {
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
            while !self.stopping.is_cancelled() {
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
                            fail::fail_point!("timer.due");
                            if let Err(e) = self.deliver(ev).await {
                                tracing::error!(task = %w.task, "timer {}: {}", w.id, e);
                            }
                        }
                    }
                    Err(e) => tracing::error!("timers: {e}"),
                }
                // Until the next timer is due, or a new timer comes first;
                // at most a minute, in case the clock jumped.
                // On a store other daemons share, at most a heartbeat: their
                // timers are this node's too once they are gone.
                let most = if self.store.shared() { self.cluster.heartbeat_every().as_millis() as i64 } else { 60_000 };
                let next = self.store.next_timer_ms().await.ok().flatten();
                let sleep = next.map(|t| (t - now_ms()).clamp(5, most)).unwrap_or(most);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(sleep as u64)) => {}
                    _ = self.timer_added.notified() => {}
                    _ = self.stopping.cancelled() => {}
                }
            }
        });
    }
}
