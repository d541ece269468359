//! Human output of the client subcommands, read from the answers' typed
//! fields (the wire model, [`cairn_api`]).

use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use cairn_api::egress::{Decision, EgressView};
use cairn_api::images::Image;
use cairn_api::snapshots::{CheckReport, Diff, GcAnswer};
use cairn_api::tasks::TaskView;
use cairn_api::waits::WaitView;
use cairn_core::{Event, Snapshot, WaitFor};

use crate::progress::human;

/// The exit status when the reader of our stdout has gone: what a shell
/// reports for a writer killed by SIGPIPE (128 + 13).
pub const BROKEN_PIPE_EXIT: i32 = 141;

/// Writes to stdout (what `outln!` expands to). A reader that has gone
/// (`cairn task show ID | head -1`) ends the process quietly; any other
/// failure to write is one line on stderr.
///
/// SIGPIPE stays ignored (as Rust sets it) rather than reset to its default
/// for the client verbs: `cairn demo` runs a daemon in this same process,
/// and the HTTP client writes to sockets with writev(2), where a default
/// SIGPIPE would kill the CLI without a word when the daemon goes away.
/// So a closed pipe arrives here as EPIPE instead, in every verb.
pub fn write_stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut o = std::io::stdout().lock();
    let r = o.write_fmt(args).and_then(|_| if newline { o.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = r.and_then(|_| if newline { Ok(()) } else { o.flush() }) {
        stdout_failed(e);
    }
}

/// Ends the process after a failed write to stdout: quietly when the reader
/// has gone (EPIPE), else with one line saying what failed.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_EXIT);
    }
    eprintln!("cairn: cannot write to stdout: {e}");
    std::process::exit(1);
}

/// What a missing value prints as.
fn or_dash<T: Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Milliseconds since the epoch as RFC 3339 (UTC, seconds); `-` before it.
pub fn time(ms: i64) -> String {
    u64::try_from(ms)
        .map(|ms| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string())
        .unwrap_or_else(|_| "-".into())
}

/// A duration as configured, in whole seconds and words: `7 days`,
/// `1 hour 30 minutes`, `45 seconds` (humantime's `7days` read oddly).
pub fn whole_seconds(d: Duration) -> String {
    let mut left = d.as_secs();
    let mut parts = Vec::new();
    for (unit, secs) in [("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1)] {
        let n = left / secs;
        left %= secs;
        if n > 0 {
            parts.push(format!("{n} {unit}{}", if n == 1 { "" } else { "s" }));
        }
    }
    if parts.is_empty() {
        "0 seconds".into()
    } else {
        parts.join(" ")
    }
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect::<Vec<_>>().join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

/// At most `max` characters of `text`, the last one `…` when cut.
fn cut(text: String, max: usize) -> String {
    if text.chars().count() > max {
        format!("{}…", text.chars().take(max - 1).collect::<String>())
    } else {
        text
    }
}

pub fn task_table(tasks: &[TaskView]) -> String {
    let rows = tasks
        .iter()
        .map(|v| {
            let t = &v.task;
            vec![t.id.to_string(), or_dash(t.name.as_ref()), t.state.to_string(), t.sandbox.to_string(), t.config.image.clone(), t.step.to_string(), time(t.created_ms)]
        })
        .collect();
    table(&["ID", "NAME", "STATE", "SANDBOX", "IMAGE", "STEP", "CREATED"], rows)
}

/// `cairn node list`: one row per node, its heartbeat as an age.
pub fn node_table(nodes: &[cairn_api::nodes::Node]) -> String {
    let rows = nodes
        .iter()
        .map(|n| {
            let age = format!("{:.1}s ago", n.heartbeat_age_ms as f64 / 1000.0);
            let tasks = if n.tasks.is_empty() { "-".to_owned() } else { n.tasks.join(",") };
            vec![n.name.clone(), n.state.as_str().to_owned(), age, n.load.to_string(), n.url.clone(), tasks]
        })
        .collect();
    table(&["NAME", "STATE", "HEARTBEAT", "LOAD", "URL", "TASKS"], rows)
}

pub fn task_detail(v: &TaskView) -> String {
    let (t, l) = (&v.task, &v.limits);
    let env: Vec<String> = t.config.env.iter().map(|e| format!("{}={}", e.key, e.value)).collect();
    let mut lines = vec![
        format!("id:            {}", t.id),
        format!("name:          {}", or_dash(t.name.as_ref())),
        format!("state:         {}", t.state),
        format!("sandbox:       {}{}", t.sandbox, t.sandbox_note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()),
        format!("node:          {}", or_dash(t.node.as_ref())),
        format!("image:         {}", t.config.image),
        format!("limits:        memory {}, cpus {}, pids {}, disk {}", l.memory, l.cpus, l.pids, l.disk),
        format!("workdir:       {}", t.config.workdir),
        format!(
            "isolation:     {}{}",
            t.config.isolation,
            if t.config.keep_memory { " (suspends keep processes and memory)" } else { "" }
        ),
        format!("env:           {}", if env.is_empty() { "-".into() } else { env.join(" ") }),
        format!("step:          {}", t.step),
        format!("memory:        {}", if t.memory.is_empty() { "-" } else { &t.memory }),
        format!("created:       {}", time(t.created_ms)),
        format!("last activity: {}", time(t.last_activity_ms)),
    ];
    if let Some(r) = &t.rollback_note {
        // From the step the task was at; its latest snapshot then is named
        // only when it is not the one rolled back to.
        let latest = match &r.from {
            Some(f) if *f != r.to => format!(", latest snapshot {f}"),
            _ => String::new(),
        };
        lines.push(format!("rollback:      to {} from step {}{latest} at {}: {}", r.to, r.from_step, time(r.time_ms), r.reason));
        if let Some(chosen) = &r.chosen {
            lines.push(format!("               chosen by {chosen}"));
        }
    }
    if let Some(n) = &t.recovery_note {
        lines.push(format!("recovery:      {n}"));
    }
    if let Some(ms) = t.config.idle_suspend_ms {
        lines.push(format!("idle suspend:  after {}", whole_seconds(Duration::from_millis(ms))));
    }
    let ret = &t.config.retention;
    lines.push(format!(
        "retention:     keep last {}, {} milestones, others expire {}",
        ret.keep_last,
        if ret.keep_milestones { "keep" } else { "no special rule for" },
        ret.expire_after.map(|d| format!("after {}", whole_seconds(d))).unwrap_or("never".into())
    ));
    lines.push(format!("egress:        {}", policy_line(&t.config.egress.allow, &t.config.egress.deny)));
    if !t.config.risky.is_empty() {
        lines.push(format!("risky:         {}", t.config.risky.join(", ")));
    }
    if let Some(w) = &v.pending_wait {
        lines.push(pending_wait_line(w));
    }
    if let Some(pid) = v.sandbox_pid {
        lines.push(format!("sandbox init:  host pid {pid}, uids from {}", or_dash(v.sandbox_uid_base)));
    }
    lines.join("\n")
}

pub fn event_table(events: &[Event]) -> String {
    let rows = events
        .iter()
        .map(|e| {
            vec![
                e.seq.to_string(),
                time(e.time_ms),
                e.kind.to_string(),
                e.actor.clone(),
                or_dash(e.exit_code),
                e.duration_ms.map(|d| format!("{d}ms")).unwrap_or("-".into()),
                cut(e.args.to_string(), 80),
            ]
        })
        .collect();
    table(&["SEQ", "TIME", "KIND", "ACTOR", "EXIT", "TOOK", "ARGS"], rows)
}

/// One entry of `cairn task watch`, as it has always printed: the sequence
/// number unpadded.
pub fn watch_line(e: &Event) -> String {
    format!("{}  {}  {:<15} {:<10} {}", e.seq, time(e.time_ms), e.kind.as_str(), e.actor, e.args)
}

pub fn image_table(images: &[Image]) -> String {
    let rows = images
        .iter()
        .map(|i| {
            let layers = match i.kind {
                cairn_api::images::ImageKind::Oci => i.layers.len().to_string(),
                // Its own layers, over its parent's.
                cairn_api::images::ImageKind::Template => format!("+{}", i.committed.len()),
                _ => "-".to_owned(),
            };
            vec![i.name.clone(), i.kind.as_str().to_owned(), layers, i.files.to_string(), human(i.size_bytes as f64), i.source.clone()]
        })
        .collect();
    table(&["NAME", "KIND", "LAYERS", "ENTRIES", "SIZE", "SOURCE"], rows)
}

/// `cairn image inspect`: the record, its layers and its run config.
pub fn image_detail(d: &cairn_api::images::ImageDetail) -> String {
    let i = &d.image;
    let mut out = vec![
        format!("name:      {}", i.name),
        format!("kind:      {}", i.kind.as_str()),
        format!("source:    {}", i.source),
        format!("created:   {}", time(i.created_ms)),
        format!("size:      {} in {} entries", human(i.size_bytes as f64), i.files),
    ];
    if let Some(m) = &i.manifest_digest {
        out.push(format!("manifest:  {m}"));
    }
    if !i.layers.is_empty() {
        out.push(format!("layers:    {} (bottom first)", i.layers.len()));
        for (n, diff_id) in i.layers.iter().enumerate() {
            let size = d.layer_details.iter().find(|l| &l.diff_id == diff_id);
            let size = size.map(|l| format!("  {} unpacked, {} entries, blob {}", human(l.size_bytes as f64), l.files, human(l.bytes as f64)));
            out.push(format!("  {n}: {diff_id}{}", size.unwrap_or_default()));
        }
    }
    if let Some(p) = &i.parent {
        out.push(format!("parent:    {p}"));
    }
    if let Some(s) = &i.fork_of {
        out.push(format!("fork of:   snapshot {s}"));
    }
    for c in &i.committed {
        let size = d.layer_details.iter().find(|l| l.diff_id == c.layer);
        let size = size.map(|l| format!("  {} in {} entries", human(l.size_bytes as f64), l.files));
        out.push(format!("committed: {} at {}{}", c.layer, c.at.display(), size.unwrap_or_default()));
    }
    for p in &i.projections {
        out.push(format!("projects:  {} at {}", p.host_path.display(), p.at.display()));
    }
    if let Some(c) = &i.config {
        let list = |v: &[String]| if v.is_empty() { "-".to_owned() } else { serde_json::to_string(v).unwrap_or_default() };
        out.push("config:".to_owned());
        out.push(format!("  env:         {}", list(&c.env)));
        out.push(format!("  workdir:     {}", c.working_dir.as_deref().filter(|w| !w.is_empty()).unwrap_or("-")));
        out.push(format!("  user:        {}", c.user.as_deref().filter(|u| !u.is_empty()).unwrap_or("-")));
        out.push(format!("  entrypoint:  {}", list(&c.entrypoint)));
        out.push(format!("  cmd:         {}", list(&c.cmd)));
    }
    out.join("\n")
}

pub fn snapshot_table(snapshots: &[Snapshot]) -> String {
    let rows = snapshots
        .iter()
        .map(|x| {
            vec![
                x.id.to_string(),
                x.kind.to_string(),
                if x.healthy { "healthy".into() } else { "unhealthy".into() },
                x.step.to_string(),
                if x.with_memory { "kept".into() } else { "-".into() },
                x.files.to_string(),
                human(x.bytes as f64),
                human(x.added_bytes as f64),
                format!("{:.1}ms", x.freeze_ms),
                time(x.created_ms),
                cut(x.note.clone(), 48),
            ]
        })
        .collect();
    table(&["ID", "KIND", "HEALTH", "STEP", "PROCESSES", "FILES", "SIZE", "ADDED", "FROZEN", "TIME", "NOTE"], rows)
}

pub fn diff_lines(d: &Diff) -> String {
    let mut out = Vec::new();
    for (paths, mark) in [(&d.added, "+"), (&d.changed, "~"), (&d.deleted, "-")] {
        out.extend(paths.iter().map(|p| format!("{mark} {p}")));
    }
    if out.is_empty() {
        "no differences".into()
    } else {
        out.join("\n")
    }
}

pub fn gc_summary(v: &GcAnswer) -> String {
    let r = &v.report;
    let verb = if v.dry_run { "would free" } else { "freed" };
    let mut lines: Vec<String> = v
        .expired_snapshots
        .iter()
        .map(|x| format!("{} snapshot {} of {} ({})", if v.dry_run { "would expire" } else { "expired" }, x.id, x.task, x.kind))
        .collect();
    lines.push(format!(
        "{verb} {} ({} packs, {} manifests); kept {} young and {} partly used packs",
        human(r.bytes_freed as f64),
        r.packs_deleted,
        r.manifests_deleted,
        r.kept_young,
        r.packs_partly_live,
    ));
    for o in &v.orphan_deliverables {
        lines.push(format!("{} deliverable {o} (no record names it)", if v.dry_run { "would delete" } else { "deleted" }));
    }
    lines.join("\n")
}

pub fn check_summary(v: &CheckReport) -> String {
    let mut lines: Vec<String> = v.problems.iter().map(|p| format!("problem: {p}")).collect();
    let read = if v.bytes_read > 0 { format!(", {} read and verified", human(v.bytes_read as f64)) } else { String::new() };
    lines.push(format!(
        "checked {} manifests, {} chunks, {} packs{read}: {}",
        v.manifests,
        v.chunks,
        v.packs,
        if lines.is_empty() { "no problems" } else { "PROBLEMS FOUND" }
    ));
    lines.join("\n")
}

/// What a wait waits for: `approval "PROMPT"`, `webhook NAME`, or `timer
/// until TIME`.
pub fn wait_for(v: &WaitView) -> String {
    match &v.what {
        WaitFor::Approval { prompt } => format!("approval: {}", cut(prompt.replace('\n', " "), 60)),
        WaitFor::Webhook { name } => format!("webhook {name}"),
        WaitFor::Timer { fire_at_ms } => format!("timer, fires at {}", time(*fire_at_ms)),
    }
}

/// The `wait:` line of `task show`.
fn pending_wait_line(v: &WaitView) -> String {
    format!("wait:          {} ({}), since {}; cancel: cairn wait {} --cancel", v.id, wait_for(v), time(v.created_ms), v.task)
}

/// `cairn resume`: the state, and whether a wait still stands.
pub fn resumed(v: &TaskView) -> String {
    match &v.pending_wait {
        Some(w) => format!(
            "{} is {}; its wait {} ({}) still stands: cairn wait {} --cancel ends it",
            v.task.id,
            v.task.state,
            w.id,
            wait_for(w),
            v.task.id
        ),
        None => format!("{} is {}; no wait pending", v.task.id, v.task.state),
    }
}

pub fn wait_summary(v: &WaitView) -> String {
    let mut lines = vec![format!("wait {} ({}): {}; task {}", v.id, v.what.kind(), v.state, v.task_state)];
    if let Some(u) = &v.approval_url {
        lines.push(format!("approve or reject at: {u}"));
    }
    if let Some(u) = &v.webhook_url {
        lines.push(format!("webhook URL: {u}"));
    }
    lines.join("\n")
}

/// A ready example that signs a webhook for `url` with the task's
/// `secret` (Standard Webhooks: HMAC-SHA256 of `id.timestamp.body` under
/// the key the `whsec_` secret carries in base64) and posts it, in POSIX
/// sh with openssl and curl. Its body is the event's data.
pub fn webhook_example(url: &str, secret: &str) -> String {
    [
        "send it signed (Standard Webhooks), e.g. with openssl and curl:".to_owned(),
        "    body='{\"status\":\"green\"}'".to_owned(),
        "    id=msg_$(date +%s%N) ts=$(date +%s)".to_owned(),
        format!("    key=$(printf %s '{secret}' | sed 's/^whsec_//' | base64 -d | od -An -tx1 | tr -d ' \\n')"),
        "    sig=$(printf %s \"$id.$ts.$body\" | openssl dgst -sha256 -mac HMAC -macopt \"hexkey:$key\" -binary | base64)".to_owned(),
        format!("    curl -sS -X POST '{url}' -H \"webhook-id: $id\" -H \"webhook-timestamp: $ts\" -H \"webhook-signature: v1,$sig\" -H 'content-type: application/json' --data-binary \"$body\""),
    ]
    .join("\n")
}

/// `allow a, b; deny c`, or `offline` when nothing is allowed.
pub fn policy_line(allow: &[String], deny: &[String]) -> String {
    let mut out = if allow.is_empty() { "offline (no allow rules)".to_owned() } else { format!("allow {}", allow.join(", ")) };
    if !deny.is_empty() {
        out.push_str(&format!("; deny {}", deny.join(", ")));
    }
    out
}

/// `cairn egress log`: the policy, then one line per attempt.
pub fn egress_log(v: &EgressView) -> Result<String> {
    let mut rows = Vec::with_capacity(v.decisions.len());
    for d in &v.decisions {
        rows.push(decision_row(d)?);
    }
    Ok(format!(
        "policy: {}\n{}",
        policy_line(&v.allow, &v.deny),
        table(&["TIME", "KIND", "DESTINATION", "ADDRESS", "VERDICT", "STATUS", "UP/DOWN", "TOOK", "REASON"], rows)
    ))
}

fn decision_row(d: &Decision) -> Result<Vec<String>> {
    let a = d.attempt().map_err(|e| anyhow::anyhow!("malformed decision {} from the daemon: {e}", d.seq))?;
    let verdict = match (a.open, a.allowed) {
        (true, _) => "open",
        (_, true) => "allow",
        _ => "deny",
    };
    Ok(vec![
        time(d.time_ms),
        a.kind.as_str().to_owned(),
        format!("{}:{}", a.host, a.port),
        or_dash(a.address),
        verdict.to_owned(),
        or_dash(a.status),
        format!("{}/{}", a.bytes_up, a.bytes_down),
        format!("{}ms", a.duration_ms),
        a.reason,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_waiting(what: WaitFor) -> TaskView {
        use cairn_core::{Task, TaskConfig, TaskId, TaskState, Wait, WaitId};
        let id: TaskId = "t1".parse().unwrap_or_else(|_| TaskId::random());
        let task = Task::new(id.clone(), None, TaskConfig::default(), 0);
        let wait = Wait { id: WaitId::random(), task: id, what, created_ms: 1_000, satisfied_ms: None, event: None, cancelled_ms: None };
        let wait = WaitView::new(wait, TaskState::Running, None, None, None);
        let limits = cairn_api::tasks::LimitsView { memory: "1G".into(), cpus: "1".into(), pids: 1, disk: "1G".into() };
        TaskView { task, limits, sandbox_pid: None, sandbox_uid_base: None, pending_wait: Some(wait) }
    }

    #[test]
    fn a_pending_wait_is_shown_and_resume_says_it_stands() {
        let v = task_waiting(WaitFor::Timer { fire_at_ms: 86_400_000 });
        let w = v.pending_wait.as_ref().map(|w| w.id.to_string()).unwrap_or_default();
        let id = v.task.id.to_string();
        let shown = task_detail(&v);
        let line = shown.lines().find(|l| l.starts_with("wait:")).unwrap_or_default();
        assert_eq!(line, format!("wait:          {w} (timer, fires at 1970-01-02T00:00:00Z), since 1970-01-01T00:00:01Z; cancel: cairn wait {id} --cancel"));
        assert!(resumed(&v).contains(&format!("its wait {w} (timer, fires at 1970-01-02T00:00:00Z) still stands")), "{}", resumed(&v));
        let approval = task_waiting(WaitFor::Approval { prompt: "Deploy?".into() });
        assert!(task_detail(&approval).contains("(approval: Deploy?)"));
        let none = TaskView { pending_wait: None, ..v };
        assert!(!task_detail(&none).contains("wait:"));
        assert!(resumed(&none).ends_with("; no wait pending"));
    }

    #[test]
    fn durations_read_as_words() {
        let s = |secs| whole_seconds(Duration::from_secs(secs));
        assert_eq!(s(7 * 86_400), "7 days");
        assert_eq!(s(86_400 + 7_200), "1 day 2 hours");
        assert_eq!(s(5_400), "1 hour 30 minutes");
        assert_eq!(s(300), "5 minutes");
        assert_eq!(s(1), "1 second");
        assert_eq!(s(0), "0 seconds");
        assert_eq!(whole_seconds(Duration::from_millis(90_500)), "1 minute 30 seconds");
    }
}
