//! `cairn task ...` and `cairn destroy`: create, list, show, watch, update, complete, destroy.

use anyhow::{anyhow, Result};
use cairn_api as api;
use api::egress::EgressView;
use api::tasks::TaskView;
use clap::{Args, Subcommand};

use crate::client::{Answer, Client};
use crate::output;
use super::Out;

#[derive(Subcommand, Debug)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum TaskCmd {
    /// Create a task and start its sandbox.
    Create(CreateArgs),
    /// List tasks, oldest first; destroyed ones only with --all.
    List {
        /// Include destroyed tasks.
        #[arg(long)]
        all: bool,
    },
    /// Show a task: state, sandbox, limits, retention, egress, pending wait.
    Show { task: String },
    /// Stream the task's event log as it grows (Ctrl-C to stop).
    Watch { task: String },
    /// Change a running task's egress policy; tunnels it now denies are cut.
    Update(UpdateArgs),
    /// Mark a task completed: its sandbox and scratch space go, its
    /// records, snapshots kept by retention and deliverables stay.
    Complete { task: String },
}

#[derive(Args, Debug)]
pub(crate) struct CreateArgs {
    /// The base image or template (`cairn image list`); default: the host image.
    #[arg(long)]
    pub(crate) image: Option<String>,
    /// A name to use instead of the id in every command (unique).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Memory limit, e.g. 512M.
    #[arg(long)]
    pub(crate) memory: Option<String>,
    /// CPU limit, e.g. 1 or 0.5.
    #[arg(long)]
    pub(crate) cpus: Option<String>,
    /// Process limit.
    #[arg(long)]
    pub(crate) pids: Option<String>,
    /// Size of the writable layer, e.g. 2G.
    #[arg(long)]
    pub(crate) disk: Option<String>,
    /// An environment variable of every command in the task (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub(crate) env: Vec<String>,
    /// Where commands start (default /workspace).
    #[arg(long)]
    pub(crate) workdir: Option<String>,
    /// Retention: always keep the newest N snapshots.
    #[arg(long, value_name = "N")]
    pub(crate) keep_last: Option<u32>,
    /// Retention: keep every milestone (true or false).
    #[arg(long, value_name = "BOOL")]
    pub(crate) keep_milestones: Option<bool>,
    /// Retention: other snapshots expire after this long (e.g. 2d, or never).
    #[arg(long, value_name = "DURATION")]
    pub(crate) expire_after: Option<String>,
    /// A command pattern (regular expression) that takes a pre-risk
    /// snapshot first, on top of the daemon's; repeatable.
    #[arg(long = "risky-pattern", value_name = "REGEX")]
    pub(crate) risky: Vec<String>,
    /// A service: a command started (detached, logged to
    /// /var/log/cairn/service-N.log) whenever the sandbox starts; repeatable.
    #[arg(long = "service", value_name = "CMD")]
    pub(crate) services: Vec<String>,
    /// Suspend the task after this long without activity (e.g. 5m).
    #[arg(long, value_name = "DURATION")]
    pub(crate) idle_suspend: Option<String>,
    /// Let the sandbox reach HOST[:PORT] through its proxy (repeatable;
    /// *.example.com matches subdomains only; default ports 80 and 443).
    /// Without any, the sandbox is offline.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) allow: Vec<String>,
    /// Never let it reach HOST[:PORT] (repeatable; wins over --allow).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) deny: Vec<String>,
    /// A request rule for an allowed host: only these methods under this
    /// path prefix (repeatable), e.g. 'api.example.com=GET,POST /repos/acme/'.
    #[arg(long = "rule", value_name = "HOST=METHODS PATH_PREFIX")]
    pub(crate) rules: Vec<String>,
    /// A header the proxy sets on the requests to an allowed host, its value
    /// naming secrets as {{secret:NAME}} (repeatable), e.g.
    /// 'api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}'; or
    /// 'HOST=$NAME': the agent may send $NAME, replaced on the way out.
    #[arg(long, value_name = "HOST=HEADER: VALUE")]
    pub(crate) inject: Vec<String>,
    /// The isolation driver: native (namespaces around the workload) or
    /// gvisor (runsc: a second kernel, whose suspends keep processes and
    /// memory). Default: the daemon's.
    #[arg(long, value_name = "DRIVER")]
    pub(crate) isolation: Option<String>,
    /// Whether suspends keep processes and memory (gvisor only; default:
    /// yes under gvisor).
    #[arg(long, value_name = "BOOL")]
    pub(crate) keep_memory: Option<bool>,
    /// A label to find the task by (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    pub(crate) metadata: Vec<String>,
    /// End the task this long after it is created (e.g. `30m`): destroyed,
    /// or suspended with --suspend-at-timeout.
    #[arg(long, value_name = "DURATION")]
    pub(crate) timeout: Option<String>,
    /// At --timeout, suspend the task instead of destroying it.
    #[arg(long)]
    pub(crate) suspend_at_timeout: bool,
}

#[derive(Args, Debug)]
pub(crate) struct UpdateArgs {
    pub(crate) task: String,
    /// Allow HOST[:PORT] (repeatable); removes the same rule from the deny list.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) allow: Vec<String>,
    /// Deny HOST[:PORT] (repeatable; without a port: every port); removes
    /// the same rule from the allow list.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) deny: Vec<String>,
    /// Add a request rule (repeatable): 'HOST=METHODS PATH_PREFIX'.
    #[arg(long = "rule", value_name = "HOST=METHODS PATH_PREFIX")]
    pub(crate) rules: Vec<String>,
    /// Add an injection (repeatable): 'HOST=HEADER: VALUE' or 'HOST=$NAME'.
    #[arg(long, value_name = "HOST=HEADER: VALUE")]
    pub(crate) inject: Vec<String>,
    /// Remove every rule first (alone: the task goes offline).
    #[arg(long)]
    pub(crate) clear_egress: bool,
}

pub(crate) async fn run(client: &Client, cmd: TaskCmd, out: Out) -> Result<u8> {
    match cmd {
        TaskCmd::Create(a) => create(client, a, out).await,
        TaskCmd::Update(a) => update(client, a, out).await,
        TaskCmd::Complete { task } => complete(client, task, out).await,
        TaskCmd::List { all } => list(client, all, out).await,
        TaskCmd::Show { task } => show(client, task, out).await,
        TaskCmd::Watch { task } => watch(client, task, out).await,
    }
}

pub(crate) async fn create(client: &Client, a: CreateArgs, out: Out) -> Result<u8> {
    let body = api::tasks::CreateRequest {
        image: a.image,
        name: a.name,
        memory: a.memory,
        cpus: a.cpus,
        pids: a.pids,
        disk: a.disk,
        env: a.env,
        workdir: a.workdir,
        keep_last: a.keep_last,
        keep_milestones: a.keep_milestones,
        expire_after: a.expire_after,
        risky: a.risky,
        services: a.services,
        idle_suspend: a.idle_suspend,
        rules: a.rules,
        inject: a.inject,
        allow: a.allow,
        deny: a.deny,
        isolation: a.isolation,
        keep_memory: a.keep_memory,
        metadata: a
            .metadata
            .iter()
            .map(|m| m.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| anyhow!("--metadata {m:?}: give KEY=VALUE")))
            .collect::<Result<_>>()?,
        timeout: a.timeout,
        suspend_at_timeout: a.suspend_at_timeout.then_some(true),
    };
    let v: Answer<TaskView> = client.post("/v1/tasks", &body).await?;
    out.print(&v, |v| v.task.id.to_string());
    Ok(0)
}

/// `cairn port TASK PORT`: prints a signed link to the port.
pub(crate) async fn port_link(client: &Client, task: String, port: String, ttl: Option<String>, out: Out) -> Result<u8> {
    let query = ttl.map(|t| format!("?ttl={t}")).unwrap_or_default();
    let v: Answer<serde_json::Value> = client.post_empty(&format!("/v1/tasks/{task}/port-links/{port}{query}")).await?;
    out.print(&v, |v| v["url"].as_str().unwrap_or_default().to_owned());
    Ok(0)
}

pub(crate) async fn update(client: &Client, a: UpdateArgs, out: Out) -> Result<u8> {
    if a.allow.is_empty() && a.deny.is_empty() && a.rules.is_empty() && a.inject.is_empty() && !a.clear_egress {
        return Err(anyhow!("nothing to update: give --allow, --deny, --rule, --inject or --clear-egress"));
    }
    let body = api::egress::PolicyUpdate { allow: a.allow, deny: a.deny, rules: a.rules, inject: a.inject, clear: a.clear_egress };
    let v: Answer<EgressView> = client.post(&format!("/v1/tasks/{}/egress", a.task), &body).await?;
    out.print(&v, |v| format!("{}: {}", v.task, output::policy_line(&v.allow, &v.deny)));
    Ok(0)
}

pub(crate) async fn complete(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<TaskView> = client.post_empty(&format!("/v1/tasks/{task}/complete")).await?;
    out.print(&v, |v| format!("{} completed; its sandbox and scratch space are gone", v.task.id));
    Ok(0)
}

pub(crate) async fn list(client: &Client, all: bool, out: Out) -> Result<u8> {
    let mut v: Answer<Vec<TaskView>> = client.get("/v1/tasks").await?;
    if !all {
        // The API lists every task; the CLI leaves out the destroyed ones,
        // in both outputs, unless --all.
        // The raw list is the decoded one as it came: its entries are
        // kept where the decoded ones are.
        let keep: Vec<bool> = v.body.iter().map(|t| !destroyed(&t.task.state)).collect();
        if let serde_json::Value::Array(raw) = &mut v.raw {
            let mut keep = keep.iter();
            raw.retain(|_| keep.next().copied().unwrap_or(true));
        }
        v.body.retain(|t| !destroyed(&t.task.state));
    }
    out.print(&v, |v| output::task_table(v));
    Ok(0)
}

fn destroyed(state: &cairn_core::TaskState) -> bool {
    matches!(state, cairn_core::TaskState::Destroyed)
}

pub(crate) async fn show(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<TaskView> = client.get(&format!("/v1/tasks/{task}")).await?;
    out.print(&v, output::task_detail);
    Ok(0)
}

pub(crate) async fn watch(client: &Client, task: String, out: Out) -> Result<u8> {
    let json_out = out.json;
    client.watch(&task, json_out).await?;
    Ok(0)
}

pub(crate) async fn destroy(client: &Client, task: String, out: Out) -> Result<u8> {
    let v: Answer<TaskView> = client.delete(&format!("/v1/tasks/{task}")).await?;
    out.print(&v, |v| format!("destroyed {}", v.task.id));
    Ok(0)
}
