//! `cairn hooks add|list|show|rm|test|outbox`: outgoing notifications. A
//! hook posts the events it takes (a task waiting with its approval link,
//! woken, suspended, rolled back, a command finished, delivered, failed,
//! destroyed, ...) to a URL, signed with its secret, at least once and in
//! order per task, retried with backoff across daemon restarts.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cairn_api::hooks::{CreatedHook, HookFormat, HookTestAnswer, HookView, NewHook, NotificationView, E2B_EVENTS, STANDARD_EVENTS};
use clap::Subcommand;

use super::Out;
use crate::client::{Answer, Client};

#[derive(Subcommand, Debug)]
pub(crate) enum HooksCmd {
    /// Send events to URL (http or https); prints the hook's id and its
    /// signing secret, which nothing shows again.
    #[command(after_help = after_help_add())]
    Add {
        url: String,
        /// The event types to send, comma-separated (default: every one of the format).
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
        /// Only this task's events (id or name); default: every task's.
        #[arg(long)]
        task: Option<String>,
        /// `standard` (Standard Webhooks) or `e2b` (E2B's sandbox lifecycle webhooks).
        #[arg(long, default_value = "standard")]
        format: String,
        /// Read the signing secret from this file (E2B's receivers are given
        /// theirs); default: a new `whsec_` secret.
        #[arg(long)]
        secret_file: Option<PathBuf>,
    },
    /// Every hook: where it sends, what, and its outbox (sent, pending, failed).
    List,
    /// One hook, with its last error.
    Show { id: String },
    /// Remove a hook and what it has not sent.
    Rm { id: String },
    /// Send a `hook.test` notification now and say what the receiver answered.
    Test { id: String },
    /// What a hook has not sent yet: pending (retried), then failed.
    Outbox { id: String },
}

fn names(events: &[(&str, &[cairn_api::EventKind])]) -> String {
    events.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

fn after_help_add() -> String {
    format!(
        "Event types of the standard format: {}\nEvent types of the e2b format: {}\n\nA receiver checks `webhook-signature` with the secret (Standard Webhooks; docs/notifications.md has a receiver).",
        names(STANDARD_EVENTS),
        names(E2B_EVENTS)
    )
}

fn when(ms: i64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)).to_string()
}

fn describe(h: &HookView) -> String {
    let scope = h.task.as_deref().map(|t| format!("task {t}")).unwrap_or_else(|| "every task".into());
    let mut lines = vec![
        format!("{}  {} ({} format, {scope})", h.id, h.url, h.format.as_str()),
        format!("  events: {}", h.events.join(", ")),
        format!(
            "  sent {}{}, pending {}, failed {}",
            h.sent,
            h.last_sent_ms.map(|t| format!(" (last {})", when(t))).unwrap_or_default(),
            h.pending,
            h.failed
        ),
    ];
    if let Some(e) = &h.last_error {
        lines.push(format!("  last error: {e}"));
    }
    lines.join("\n")
}

pub(crate) async fn run(client: &Client, cmd: HooksCmd, out: Out) -> Result<u8> {
    match cmd {
        HooksCmd::Add { url, events, task, format, secret_file } => {
            let Some(format) = HookFormat::parse(&format) else { bail!("--format {format}: the formats are standard and e2b") };
            let secret = match &secret_file {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --secret-file {}", path.display()))?;
                    let secret = text.trim_end_matches(['\n', '\r']).to_owned();
                    if secret.is_empty() {
                        bail!("--secret-file {}: the file is empty", path.display());
                    }
                    Some(secret)
                }
                None => None,
            };
            let req = NewHook { url, events, task, format, secret };
            let v: Answer<CreatedHook> = client.send(client.request(reqwest::Method::POST, "/v1/outgoing-hooks").json(&req)).await?;
            out.print(&v, |c| format!("{}\nsecret: {} (shown once: give it to the receiver)", describe(&c.hook), c.secret));
        }
        HooksCmd::List => {
            let v: Answer<Vec<HookView>> = client.get("/v1/outgoing-hooks").await?;
            out.print(&v, |all| if all.is_empty() { "no hooks".into() } else { all.iter().map(describe).collect::<Vec<_>>().join("\n") });
        }
        HooksCmd::Show { id } => {
            let v: Answer<HookView> = client.get(&format!("/v1/outgoing-hooks/{id}")).await?;
            out.print(&v, describe);
        }
        HooksCmd::Rm { id } => {
            let v: Answer<serde_json::Value> = client.delete(&format!("/v1/outgoing-hooks/{id}")).await?;
            out.print(&v, |_| format!("removed {id}"));
        }
        HooksCmd::Test { id } => {
            let v: Answer<HookTestAnswer> = client.post_empty(&format!("/v1/outgoing-hooks/{id}/test")).await?;
            out.print(&v, |t| match (&t.error, t.status) {
                (None, Some(s)) => format!("{id}: the receiver answered {s} in {} ms", t.duration_ms),
                (Some(e), _) => format!("{id}: not delivered: {e}"),
                (None, None) => format!("{id}: no answer"),
            });
            if !v.body.ok {
                return Ok(1);
            }
        }
        HooksCmd::Outbox { id } => {
            let v: Answer<Vec<NotificationView>> = client.get(&format!("/v1/outgoing-hooks/{id}/outbox")).await?;
            out.print(&v, |all| {
                if all.is_empty() {
                    return format!("{id}: nothing waiting");
                }
                let mut lines = vec![format!("{:<14} {:>6} {:<8} {:>8}  {:<20} {}", "TASK", "SEQ", "STATE", "ATTEMPTS", "EVENT AT", "LAST ERROR")];
                lines.extend(all.iter().map(|n| {
                    format!("{:<14} {:>6} {:<8} {:>8}  {:<20} {}", n.task, n.seq, n.state, n.attempts, when(n.created_ms), n.last_error.as_deref().unwrap_or("-"))
                }));
                lines.join("\n")
            });
        }
    }
    Ok(0)
}
