//! `cairn snapshot`, `rollback`, `fork`, `gc` and `check`.

use anyhow::{anyhow, Context, Result};
use cairn_api as api;
use api::snapshots::{CheckReport, Diff, GcAnswer, RollbackAnswer};
use api::tasks::TaskView;
use cairn_core::Snapshot;
use clap::{Args, Subcommand};

use crate::client::{self, Answer, Client};
use crate::output;
use crate::progress;
use super::Out;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct SnapshotCli {
    #[command(subcommand)]
    pub(crate) sub: Option<SnapshotSub>,
    /// The task to snapshot.
    #[arg(required = true)]
    pub(crate) task: Option<String>,
    /// milestone, pre-risk, branch, suspend or manual.
    #[arg(long, default_value = "manual")]
    pub(crate) kind: String,
    /// What the snapshot holds, in a few words (shown in lists and rollback notes).
    #[arg(long)]
    pub(crate) note: Option<String>,
    /// The task's memory summary: TEXT, or @FILE to read it from a file.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// Mark the snapshot healthy (the default).
    #[arg(long, conflicts_with = "unhealthy")]
    pub(crate) healthy: bool,
    /// Mark the snapshot unhealthy: --last-healthy rollbacks skip it.
    #[arg(long)]
    pub(crate) unhealthy: bool,
    /// Also checkpoint the sandbox's processes and memory (gvisor tasks), so
    /// a rollback to it or a fork from it continues them.
    #[arg(long)]
    pub(crate) with_memory: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum SnapshotSub {
    /// List a task's snapshots, oldest first.
    List { task: String },
    /// Paths added, changed and deleted from snapshot A to snapshot B.
    Diff { task: String, a: String, b: String },
}

#[derive(Args, Debug)]
pub(crate) struct RollbackCli {
    pub(crate) task: String,
    /// The snapshot to return to.
    #[arg(long, required_unless_present = "last_healthy", conflicts_with = "last_healthy")]
    pub(crate) to: Option<String>,
    /// Return to the newest snapshot marked healthy.
    #[arg(long)]
    pub(crate) last_healthy: bool,
    /// Why: recorded and shown to the agent as the rollback note.
    #[arg(long)]
    pub(crate) reason: String,
}

#[derive(Args, Debug)]
pub(crate) struct ForkCli {
    pub(crate) task: String,
    /// The snapshot to start from (default: the task's latest).
    #[arg(long)]
    pub(crate) from: Option<String>,
    /// How many tasks to create (1 to 128). They share the snapshot as a
    /// read-only layer: a fork copies nothing, whatever its size.
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u32,
}

#[derive(Args, Debug)]
pub(crate) struct GcCli {
    /// Report what would be expired and freed; change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Keep unreferenced objects younger than this (default: the daemon's, 1h).
    #[arg(long)]
    pub(crate) grace: Option<String>,
}

pub(crate) async fn snapshot(client: &Client, a: SnapshotCli, out: Out) -> Result<u8> {
    match a {
        SnapshotCli { sub: Some(SnapshotSub::List { task }), .. } => list(client, task, out).await,
        SnapshotCli { sub: Some(SnapshotSub::Diff { task, a, b }), .. } => diff(client, task, a, b, out).await,
        a => take(client, a, out).await,
    }
}

pub(crate) async fn list(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<Vec<Snapshot>> = client.get(&format!("/v1/tasks/{task}/snapshots")).await?;
    out.print(&v, |v| output::snapshot_table(v));
    Ok(0)
}

pub(crate) async fn diff(client: &Client, task: String, a: String, b: String, out: Out) -> Result<u8> {
    let q = format!("/v1/tasks/{task}/snapshots/diff?a={}&b={}", client::query_escape(&a), client::query_escape(&b));
    let v: Answer<Diff> = client.get(&q).await?;
    out.print(&v, output::diff_lines);
    Ok(0)
}

pub(crate) async fn take(client: &Client, a: SnapshotCli, out: Out) -> Result<u8> {
    let task = a.task.ok_or_else(|| anyhow!("which task? usage: cairn snapshot ID"))?;
    let memory = match a.memory.as_deref() {
        Some(m) if m.starts_with('@') => {
            Some(std::fs::read_to_string(&m[1..]).with_context(|| format!("cannot read --memory file {}", &m[1..]))?)
        }
        other => other.map(str::to_owned),
    };
    let body = api::snapshots::SnapshotRequest { kind: Some(a.kind), note: a.note, memory, healthy: Some(!a.unhealthy), with_memory: a.with_memory };
    let v: Answer<Snapshot> = progress::while_running(client, &task, client.post(&format!("/v1/tasks/{task}/snapshots"), &body)).await?;
    out.print(&v, |s| s.id.to_string());
    Ok(0)
}

pub(crate) async fn rollback(client: &Client, a: RollbackCli, out: Out) -> Result<u8> {
    let body = api::snapshots::RollbackRequest { to: a.to, last_healthy: a.last_healthy, reason: a.reason };
    let task = a.task;
    let v: Answer<RollbackAnswer> = progress::while_running(client, &task, client.post(&format!("/v1/tasks/{task}/rollback"), &body)).await?;
    out.print(&v, |v| format!("rolled {} back to {} (step {}) in {:.0} ms", v.task, v.rollback_note.to, v.step, v.duration_ms));
    Ok(0)
}

pub(crate) async fn fork(client: &Client, a: ForkCli, out: Out) -> Result<u8> {
    let body = api::snapshots::ForkRequest { from: a.from, count: Some(a.count) };
    let task = a.task;
    // With --json, the answer of POST /v1/tasks/{id}/fork as it came (the
    // new tasks, docs/api.md), as every verb prints; else their ids.
    let children: Answer<Vec<TaskView>> = progress::while_running(client, &task, client.post(&format!("/v1/tasks/{task}/fork"), &body)).await?;
    out.print(&children, |c| c.iter().map(|t| t.task.id.to_string()).collect::<Vec<_>>().join("\n"));
    Ok(0)
}

pub(crate) async fn gc(client: &Client, a: GcCli, out: Out) -> Result<u8> {
    let v: Answer<GcAnswer> = client.post("/v1/gc", &api::snapshots::GcRequest { dry_run: a.dry_run, grace: a.grace }).await?;
    out.print(&v, output::gc_summary);
    Ok(0)
}

pub(crate) async fn check(client: &Client, read_data: bool, out: Out) -> Result<u8> {
    let v: Answer<CheckReport> = client.post("/v1/check", &api::snapshots::CheckRequest { read_data }).await?;
    out.print(&v, output::check_summary);
    let problems = v.body.problems.len();
    if problems > 0 {
        if !out.json {
            eprintln!("cairn: check found {problems} problem(s)");
        }
        return Ok(1);
    }
    Ok(0)
}
