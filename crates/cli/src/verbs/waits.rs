//! `cairn wait`, `approve`, `event`, `suspend` and `resume`.

use anyhow::{anyhow, Context, Result};
use cairn_api as api;
use clap::Args;
use serde_json::{json, Value};

use crate::client::Client;
use crate::output;
use super::Out;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("for").required(true).args(["approval", "webhook", "timer"])))]
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
    /// Block until the wait is satisfied and the task runs again; print the event.
    #[arg(long)]
    pub(crate) block: bool,
}

pub(crate) async fn wait(client: &Client, a: WaitCli, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let json_out = out.json;
    let body = api::waits::WaitRequest { approval: a.approval, webhook: a.webhook, timer: a.timer };
    let task = a.task;
    let v = client.post(&format!("/v1/tasks/{task}/waits"), &body).await?;
    if !a.block {
        print(&v, &output::wait_summary);
        return Ok(0);
    }
    if !json_out {
        eprintln!("{}", output::wait_summary(&v));
    }
    let id = v["id"].as_str().unwrap_or_default().to_owned();
    let done = loop {
        let w: Value = client.get(&format!("/v1/waits/{id}?block_ms=30000")).await?;
        if w["state"] == "satisfied" && w["task_state"] != "waking" && w["task_state"] != "suspending" {
            break w;
        }
    };
    print(&done["event"], &|e| serde_json::to_string_pretty(e).unwrap_or_default());
    Ok(0)
}

pub(crate) async fn approve(client: &Client, task: String, reject: bool, comment: Option<String>, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let v = client.post(&format!("/v1/tasks/{task}/approve"), &api::waits::ApproveRequest { approve: !reject, comment }).await?;
    let d: api::waits::Delivered = serde_json::from_value(v.clone()).context("the daemon's answer to an approval")?;
    print(&v, &|_| format!("{} {task}", if reject { "rejected" } else { "approved" }) + if d.wakes { "; it wakes" } else { "" });
    Ok(0)
}

pub(crate) async fn event(client: &Client, task: String, name: String, data: String, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let data: Value = serde_json::from_str(&data).map_err(|e| anyhow!("--data is not JSON: {e}"))?;
    let v = client.post(&format!("/v1/tasks/{task}/inbox"), &api::waits::EventRequest { name, data }).await?;
    let d: api::waits::Delivered = serde_json::from_value(v.clone()).context("the daemon's answer to an event")?;
    print(&v, &|_| {
        let what = match &d.satisfied {
            Some(w) => format!("satisfied wait {w}"),
            None => "kept in the inbox for a later wait".to_owned(),
        };
        format!("event {}: {what}", d.event.id)
    });
    Ok(0)
}

pub(crate) async fn suspend(client: &Client, task: String, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let v = client.post(&format!("/v1/tasks/{task}/suspend"), &json!({})).await?;
    print(&v, &|v| format!("{} is {}", v["id"].as_str().unwrap_or_default(), v["state"].as_str().unwrap_or_default()));
    Ok(0)
}

pub(crate) async fn resume(client: &Client, task: String, out: Out) -> Result<u8> {
    let print = |v: &Value, human: &dyn Fn(&Value) -> String| out.print(v, human);
    let v = client.post(&format!("/v1/tasks/{task}/resume"), &json!({})).await?;
    print(&v, &|v| format!("{} is {}", v["id"].as_str().unwrap_or_default(), v["state"].as_str().unwrap_or_default()));
    Ok(0)
}
