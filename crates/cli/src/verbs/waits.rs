//! `cairn wait`, `approve`, `event`, `suspend` and `resume`.

use anyhow::{anyhow, Result};
use cairn_api as api;
use api::tasks::TaskView;
use api::waits::{Delivered, WaitView};
use cairn_core::TaskState;
use clap::Args;
use serde_json::Value;

use crate::client::{Answer, Client};
use crate::output;
use super::Out;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("for").args(["approval", "webhook", "timer", "cancel"])))]
pub(crate) struct WaitCli {
    pub(crate) task: String,
    /// Wait for a person to approve; PROMPT says what.
    #[arg(long, value_name = "PROMPT")]
    pub(crate) approval: Option<String>,
    /// Wait for the event NAME (a signed webhook to its URL, or `cairn event`).
    #[arg(long, value_name = "NAME")]
    pub(crate) webhook: Option<String>,
    /// Wait this long (e.g. 30s, 2h).
    #[arg(long, value_name = "DURATION")]
    pub(crate) timer: Option<String>,
    /// Block until the wait is satisfied and the task runs again; print the
    /// event. Alone (no --approval, --webhook or --timer): block on the
    /// task's pending wait.
    #[arg(long, conflicts_with = "cancel")]
    pub(crate) block: bool,
    /// Cancel the task's pending wait instead; a task suspended for it wakes.
    #[arg(long)]
    pub(crate) cancel: bool,
}

pub(crate) async fn wait(client: &Client, a: WaitCli, out: Out) -> Result<u8> {
    if a.cancel {
        let v: Answer<WaitView> = client.delete(&format!("/v1/tasks/{}/waits", a.task)).await?;
        out.print(&v, |w| format!("cancelled wait {} ({}); task {} is {}", w.id, output::wait_for(w), w.task, w.task_state));
        return Ok(0);
    }
    let task = a.task;
    let id = if a.approval.is_none() && a.webhook.is_none() && a.timer.is_none() {
        if !a.block {
            return Err(anyhow!("wait {task}: give --approval, --webhook or --timer for a new wait, --block to block on its pending one, or --cancel"));
        }
        let v: TaskView = client.get(&format!("/v1/tasks/{task}")).await?;
        let pending = v.pending_wait.ok_or_else(|| anyhow!("task {task} has no pending wait to block on"))?;
        if !out.json {
            eprintln!("{}", output::wait_summary(&pending));
        }
        pending.id
    } else {
        let body = api::waits::WaitRequest { approval: a.approval, webhook: a.webhook, timer: a.timer };
        let v: Answer<WaitView> = client.post(&format!("/v1/tasks/{task}/waits"), &body).await?;
        // A webhook wait also gets a ready example of a signed post (the
        // task's secret is in its row).
        let example = match &v.body.webhook_url {
            Some(url) if !out.json => {
                let t: TaskView = client.get(&format!("/v1/tasks/{task}")).await?;
                t.task.webhook_secret.map(|secret| output::webhook_example(url, &secret))
            }
            _ => None,
        };
        if !a.block {
            out.print(&v, output::wait_summary);
            if let Some(e) = example {
                outln!("{e}");
            }
            return Ok(0);
        }
        if !out.json {
            eprintln!("{}", output::wait_summary(&v.body));
            if let Some(e) = example {
                eprintln!("{e}");
            }
        }
        v.body.id
    };
    let done = loop {
        let w: WaitView = client.get(&format!("/v1/waits/{id}?block_ms=30000")).await?;
        if w.state == "cancelled" {
            return Err(anyhow!("wait {id} was cancelled"));
        }
        if w.state == "satisfied" && !matches!(w.task_state, TaskState::Waking | TaskState::Suspending) {
            break w;
        }
    };
    // The event as JSON in both modes; through a JSON value, so that its
    // fields print sorted, as those of every answer do.
    let event = serde_json::to_value(&done.event)?;
    outln!("{}", serde_json::to_string_pretty(&event).unwrap_or_default());
    Ok(0)
}

pub(crate) async fn approve(client: &Client, task: String, reject: bool, comment: Option<String>, out: Out) -> Result<u8> {
    let v: Answer<Delivered> = client.post(&format!("/v1/tasks/{task}/approve"), &api::waits::ApproveRequest { approve: !reject, comment }).await?;
    out.print(&v, |d| format!("{} {task}", if reject { "rejected" } else { "approved" }) + if d.wakes { "; it wakes" } else { "" });
    Ok(0)
}

pub(crate) async fn event(client: &Client, task: String, name: String, data: String, out: Out) -> Result<u8> {
    let data: Value = serde_json::from_str(&data).map_err(|e| anyhow!("--data is not JSON: {e}"))?;
    let v: Answer<Delivered> = client.post(&format!("/v1/tasks/{task}/inbox"), &api::waits::EventRequest { name, data }).await?;
    out.print(&v, |d| {
        let what = match &d.satisfied {
            Some(w) => format!("satisfied wait {w}"),
            None => "kept in the inbox for a later wait".to_owned(),
        };
        format!("event {}: {what}", d.event.id)
    });
    Ok(0)
}

pub(crate) async fn suspend(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<TaskView> = client.post_empty(&format!("/v1/tasks/{task}/suspend")).await?;
    out.print(&v, |v| format!("{} is {}", v.task.id, v.task.state));
    Ok(0)
}

pub(crate) async fn resume(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<TaskView> = client.post_empty(&format!("/v1/tasks/{task}/resume")).await?;
    out.print(&v, output::resumed);
    Ok(0)
}
