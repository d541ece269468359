//! `cairn demo`: everything Cairn can do so far, end to end, against an
//! embedded daemon in a temporary home. Each step prints what it shows and
//! how long it took; any step that does not show what it should fails the
//! demo.

use std::path::Path;
use std::time::Instant;

use cairn_api as api;
use anyhow::{bail, Context, Result};
use api::egress::EgressView;
use api::ledger::LedgerView;
use api::snapshots::{CheckReport, GcAnswer, RollbackAnswer};
use api::tasks::TaskView;
use api::waits::WaitView;
use cairn_core::{Event, EventKind, Snapshot, TaskState};

use crate::client::Client;
use crate::demo_oci;
use crate::exec::{self, ExecArgs, ExecResult, Sink};

struct Demo {
    client: Client,
    task: String,
    step: usize,
}

impl Demo {
    fn say(&mut self, title: &str, took: std::time::Duration, detail: &str) {
        self.step += 1;
        outln!("{:>2}. {title:<58} {:>9.1} ms", self.step, took.as_secs_f64() * 1e3);
        for line in detail.lines().filter(|l| !l.trim().is_empty()) {
            outln!("      {line}");
        }
    }

    async fn exec(&self, script: &str) -> Result<ExecResult> {
        let args = ExecArgs { task: self.task.clone(), argv: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() };
        exec::run(&self.client, &args, Sink::Capture).await
    }

    /// Runs `script` in the sandbox, prints its output under `title`.
    async fn show(&mut self, title: &str, script: &str, expect: impl Fn(&ExecResult) -> bool) -> Result<ExecResult> {
        let t = Instant::now();
        let r = self.exec(script).await?;
        let took = t.elapsed();
        let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
        out.push_str(&String::from_utf8_lossy(&r.stderr));
        if let Some(note) = exec::exit_note(&r) {
            out.push_str(&format!("\n{note}"));
        }
        self.say(title, took, &out);
        if !expect(&r) {
            bail!("demo step {title:?} did not show what it should (exit {})", r.code());
        }
        Ok(r)
    }
}

fn text(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

pub async fn run() -> Result<u8> {
    let began = Instant::now();
    let home = tempfile::Builder::new().prefix("cairn-demo-").tempdir_in("/var/tmp").context("temporary home")?;
    outln!("Cairn demo: an embedded daemon in {}\n", home.path().display());
    let t = Instant::now();
    // A stand-in for a documentation site, on the host's loopback: the
    // daemon is told its name and that this one loopback address may be
    // reached (both are printed at start-up, as any operator exception).
    let docs = docs_site().await?;
    // And an HTTPS API that echoes the credential it is sent, with a CA of
    // its own, which the daemon is told to trust for upstreams.
    let (api_addr, api_ca) = api_site().await?;
    let api_ca_file = home.path().join("demo-api-ca.pem");
    std::fs::write(&api_ca_file, api_ca)?;
    let mut config = cairn_server::Config { listen: "127.0.0.1:0".parse()?, disk_pool: 1, ..Default::default() };
    config.egress.hosts.insert(DOCS_HOST.to_owned(), vec![(docs.ip(), Some(docs.port()))]);
    config.egress.hosts.insert(API_HOST.to_owned(), vec![(api_addr.ip(), Some(api_addr.port()))]);
    config.egress.upstream_ca = Some(api_ca_file);
    config.egress.allow_private = cairn_egress::AllowedRanges::parse(&["127.0.0.1/32"])?;
    let exceptions = config.egress.exceptions().join("\n");
    let daemon = cairn_server::Daemon::start(cairn_server::DaemonOptions {
        home: home.path().to_owned(),
        config,
        helper_exe: std::env::current_exe()?,
    })
    .await?;
    let client = Client::new(daemon.url.clone(), daemon.token.clone());
    let port = daemon.addr.port();
    let mut d = Demo { client, task: String::new(), step: 0 };
    d.say("start the daemon (SQLite store, host image, disk pool)", t.elapsed(), &format!("listening on {}\n{exceptions}", daemon.url));

    let result = steps(&mut d, home.path(), port).await;
    if result.is_err() && !d.task.is_empty() {
        // A failed step must not leave its sandbox behind.
        let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{}", d.task)).await;
    }
    let t = Instant::now();
    daemon.stop().await;
    d.say("stop the daemon and remove its temporary home", t.elapsed(), "");
    drop(home);
    match result {
        Ok(()) => {
            outln!("\nall steps passed in {:.2} s", began.elapsed().as_secs_f64());
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// What the host sees of the home: private, and mounted where set-id bits
/// and device files mean nothing.
fn host_home(d: &mut Demo, home: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let t = Instant::now();
    let mode = std::fs::metadata(home)?.permissions().mode() & 0o777;
    let flags = nix::sys::statvfs::statvfs(home)?.flags();
    let sealed = flags.contains(nix::sys::statvfs::FsFlags::ST_NOSUID) && flags.contains(nix::sys::statvfs::FsFlags::ST_NODEV);
    if mode != 0o700 || !sealed {
        bail!("the home is {mode:o}, nosuid,nodev: {sealed}");
    }
    d.say("on the host the home is 0700 and mounted nosuid,nodev", t.elapsed(), "a set-uid file the task made means nothing outside it");
    Ok(())
}

async fn steps(d: &mut Demo, home: &Path, daemon_port: u16) -> Result<()> {
    let t = Instant::now();
    let view: TaskView = d
        .client
        .post("/v1/tasks", &api::tasks::CreateRequest {
                name: Some("demo".into()),
                memory: Some("256M".into()),
                pids: Some("64".into()),
                disk: Some("256M".into()),
                env: vec!["GREETING=hello".into()],
                ..Default::default()
            })
        .await?;
    d.task = view.task.id.to_string();
    let l = &view.limits;
    d.say(
        "create a task; its sandbox starts at once",
        t.elapsed(),
        &format!("task {} (memory {}, cpus {}, pids {}, disk {})", d.task, l.memory, l.cpus, l.pids, l.disk),
    );
    d.show("run a command (warm exec)", "echo \"$GREETING from $(hostname), in $(pwd)\"", |r| r.code() == 0).await?;
    let t = Instant::now();
    let run = api::exec::RunRequest { cmd: vec!["sh".into(), "-c".into(), "read name; echo \"hello, $name\"".into()], stdin: Some("http\n".into()), ..Default::default() };
    let ran: api::exec::RunAnswer = d.client.post(&format!("/v1/tasks/{}/exec", d.task), &run).await?;
    if ran.exit_code != 0 || ran.stdout != "hello, http\n" {
        bail!("exec over plain HTTP answered {ran:?}");
    }
    d.say("the same over plain HTTP (POST .../exec, no WebSocket)", t.elapsed(), &format!("exit {}, stdout {:?}", ran.exit_code, ran.stdout));

    let uid = d.show("root inside is an unprivileged uid range outside", "id; cat /proc/self/uid_map", |r| text(r).contains("uid=0(root)")).await?;
    let base: u64 = text(&uid).lines().last().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    if base == 0 {
        bail!("uid 0 is not mapped to a non-zero host uid");
    }
    d.show(
        "host secrets are not there",
        "ls -A /root /home; ls /etc/shadow /etc/gshadow /etc/machine-id 2>&1 | sed 's/^/  /'",
        |r| text(r).contains("No such file"),
    )
    .await?;
    d.show(
        "seccomp and a bounded capability set",
        "grep -E 'Seccomp:|CapBnd' /proc/self/status; unshare -U true 2>&1 || echo \"unshare refused (exit $?)\"",
        |r| text(r).contains("Seccomp:\t2") && text(r).contains("unshare refused"),
    )
    .await?;
    d.show(
        "set-uid programs work inside (set-uid id run as nobody)",
        "cp /usr/bin/id /workspace/sid && chmod 4755 /workspace/sid && setpriv --reuid 65534 --regid 65534 --clear-groups /workspace/sid",
        |r| text(r).contains("euid=0"),
    )
    .await?;
    host_home(d, home)?;
    d.show(
        "network: only lo; the daemon's port is unreachable",
        &format!("tail -n +3 /proc/net/dev | cut -d: -f1; bash -c 'exec 3<>/dev/tcp/127.0.0.1/{daemon_port}' 2>&1 && echo connected || echo 'connect to the host daemon failed'"),
        |r| text(r).contains("connect to the host daemon failed") || String::from_utf8_lossy(&r.stderr).contains("refused"),
    )
    .await?;
    d.show(
        "writes to the base image land in the task's own layer",
        "touch /usr/bin/cairn-demo-marker && ls -l /usr/bin/cairn-demo-marker",
        |r| r.code() == 0,
    )
    .await?;
    if Path::new("/usr/bin/cairn-demo-marker").exists() {
        bail!("the write reached the host's /usr");
    }
    outln!("      host: /usr/bin/cairn-demo-marker does not exist");
    egress(d).await?;
    injection(d).await?;
    d.show(
        "memory limit: allocating 400M in a 256M task is OOM-killed",
        "dd if=/dev/zero of=/dev/null bs=400M count=1",
        |r| r.exit.oom_killed,
    )
    .await?;
    d.show(
        "pids limit: a fork bomb stops at 64",
        "(i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); echo $i > /tmp/n; done) 2>/dev/null; read n < /tmp/n; echo \"fork failed after $n of 200 processes\"; kill -9 -1 2>/dev/null; true",
        |r| text(r).contains("of 200"),
    )
    .await?;
    d.show(
        "disk limit: filling the writable layer stops with ENOSPC",
        "dd if=/dev/zero of=/workspace/fill bs=1M count=400 2>&1 | grep -o 'No space left on device' | head -1; rm -f /workspace/fill",
        |r| text(r).contains("No space left"),
    )
    .await?;
    let t = Instant::now();
    let refused = d.client.post::<TaskView, _>("/v1/tasks", &api::tasks::CreateRequest { disk: Some("15T".into()), ..Default::default() }).await;
    match refused {
        Err(e) if e.to_string().contains("no room for a 15 TiB task disk") => {
            d.say("a disk the host cannot promise is refused at create", t.elapsed(), &format!("{e:#}"))
        }
        other => bail!("a 15T disk was not refused for room: {other:?}"),
    }

    let t = Instant::now();
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("notes.txt"), "copied in by cairn cp\n")?;
    crate::cp::run(&d.client, &src.path().join("notes.txt").display().to_string(), &format!("{}:/workspace/", d.task), crate::cp::Links::Refuse).await?;
    let back = src.path().join("back.txt");
    crate::cp::run(&d.client, &format!("{}:/workspace/notes.txt", d.task), &back.display().to_string(), crate::cp::Links::Refuse).await?;
    let round = std::fs::read_to_string(&back)?;
    d.say("cp a file in and back out", t.elapsed(), &format!("round trip: {}", round.trim()));
    copy_links(d, src.path()).await?;

    snapshots(d).await?;
    images(d).await?;
    waits(d, home).await?;
    gvisor(d).await?;

    let t = Instant::now();
    let events: Vec<Event> = d.client.get(&format!("/v1/tasks/{}/events", d.task)).await?;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    d.say("the durable event log", t.elapsed(), &format!("{} entries: {}", kinds.len(), kinds.join(", ")));
    raw_file_and_metrics(d).await?;
    python_sdk(d).await?;
    e2b_sdk(d).await?;
    port(d).await?;
    mcp(d).await?;
    cluster(d, home).await?;
    backup(d).await?;

    deliver(d, home).await
}

/// A backup of the node while it runs, read back and checked against its
/// manifest (`cairn restore` puts one into a new home: docs/operations.md).
async fn backup(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("node.tar");
    let (manifest, bytes) = crate::verbs::backup::write_backup(&d.client, &file).await?;
    let manifest = manifest.ok_or_else(|| anyhow::anyhow!("the backup came back without its manifest"))?;
    if manifest.tasks == 0 || !manifest.entries.iter().any(|e| e.path == "cairn.db") {
        bail!("the backup holds no tasks or no database: {manifest:?}");
    }
    let line = crate::verbs::backup::summary(&manifest, bytes, Path::new("node.tar"));
    d.say("backup of the node while it runs (store, blob store, keys), checked entry by entry", t.elapsed(), &line);
    Ok(())
}

/// Two more daemons, sharing one PostgreSQL store and one S3 bucket: a
/// task suspended on one wakes on the other (restored from the bucket),
/// and a call through either node reaches it wherever it runs.
async fn cluster(d: &mut Demo, home: &Path) -> Result<()> {
    let t = Instant::now();
    // Beside the first daemon's home, not in it: a home is private to its
    // daemon, and PostgreSQL runs as its own user.
    let beside = home.parent().unwrap_or(Path::new("/var/tmp"));
    let dir = tempfile::Builder::new().prefix("cairn-demo-cluster-").tempdir_in(beside)?;
    let cluster = crate::demo_cluster::Cluster::start(&dir.path().join("cluster"), &["demo-a", "demo-b"]).await?;
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let nodes: Vec<api::nodes::Node> = b.client.get("/v1/nodes").await?;
    if nodes.len() != 2 || nodes.iter().any(|n| n.state != api::nodes::NodeState::Up) {
        bail!("expected two nodes up: {nodes:?}");
    }
    if a.token != b.token {
        bail!("the second node did not adopt the first node's API token");
    }
    let mut said: Vec<String> = nodes.iter().map(|n| format!("{} {} at {}", n.name, n.state.as_str(), n.url)).collect();
    said.push(format!("{} adopted the API token and link key of {}, the first node", b.name, a.name));
    d.say("a cluster: two nodes on one PostgreSQL store and one S3 bucket", t.elapsed(), &said.join("\n"));
    let mut task = None;
    let result = cluster_steps(d, &cluster, &mut task).await;
    if let Some(id) = task {
        let _ = a.client.delete::<TaskView>(&format!("/v1/tasks/{id}")).await;
    }
    let t = Instant::now();
    drop(cluster);
    if result.is_ok() {
        d.say("stop both nodes, PostgreSQL and the S3 server", t.elapsed(), "");
    }
    result
}

async fn cluster_steps(d: &mut Demo, cluster: &crate::demo_cluster::Cluster, task: &mut Option<String>) -> Result<()> {
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let t = Instant::now();
    let view: TaskView = a.client.post("/v1/tasks", &api::tasks::CreateRequest { name: Some("clustered".into()), ..Default::default() }).await?;
    let id = view.task.id.to_string();
    *task = Some(id.clone());
    let run = |client: &Client, script: &str| {
        let args = ExecArgs { task: id.clone(), argv: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() };
        let client = client.clone();
        async move { exec::run(&client, &args, Sink::Capture).await }
    };
    let wrote = run(&a.client, "echo 'written on the first node' > /workspace/note.txt && cat /workspace/note.txt").await?;
    let wait: WaitView = a.client.post(&format!("/v1/tasks/{id}/waits"), &api::waits::WaitRequest { approval: Some("go on?".into()), ..Default::default() }).await?;
    let on_a: TaskView = a.client.get(&format!("/v1/tasks/{id}")).await?;
    if wrote.code() != 0 || on_a.task.state != TaskState::Suspended {
        bail!("the task on {} did not write its file and suspend: {:?}", a.name, on_a.task.state);
    }
    d.say(
        &format!("on {}: a task writes a file, waits and suspends", a.name),
        t.elapsed(),
        &format!("task {id}, lease on {}, file {:?}; wait {} suspends it", a.name, text(&wrote).trim(), wait.id),
    );
    let t = Instant::now();
    let _: serde_json::Value = b.client.post(&format!("/v1/tasks/{id}/approve"), &api::waits::ApproveRequest::default()).await?;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let woke = loop {
        let v: TaskView = b.client.get(&format!("/v1/tasks/{id}")).await?;
        if v.task.state == TaskState::Running {
            break v;
        }
        if Instant::now() > deadline {
            bail!("the task did not wake within 60 s: {:?}", v.task.state);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    if woke.task.node.as_deref() != Some(b.name.as_str()) {
        bail!("the task woke on {:?}, not on {}", woke.task.node, b.name);
    }
    d.say(
        &format!("approved through {}: it wakes there, restored from S3", b.name),
        t.elapsed(),
        &format!("task {id} now runs on {}", b.name),
    );
    let t = Instant::now();
    let read = run(&a.client, "cat /workspace/note.txt; hostname").await?;
    if read.code() != 0 || !text(&read).contains("written on the first node") {
        bail!("the file did not come along: {}", text(&read));
    }
    d.say(
        &format!("exec through {}: forwarded to {}, where the file is", a.name, b.name),
        t.elapsed(),
        text(&read).lines().next().unwrap_or_default(),
    );
    Ok(())
}

/// One JSON-RPC call to the daemon's `/mcp`, as an MCP client makes it.
async fn mcp_call(d: &Demo, id: u64, method: &str, params: serde_json::Value) -> Result<serde_json::Value> {
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let req = d
        .client
        .request(reqwest::Method::POST, "/mcp")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    let answer: serde_json::Value = d.client.send(req).await?;
    answer.get("result").cloned().ok_or_else(|| anyhow::anyhow!("/mcp answered {method} with {answer}"))
}

/// What an MCP client sees at `/mcp` (and through `cairn mcp` on stdio):
/// the tools, and a command run in the demo's task by one of them.
async fn mcp(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let init = serde_json::json!({ "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "cairn-demo", "version": "1" } });
    let server = mcp_call(d, 1, "initialize", init).await?;
    let tools = mcp_call(d, 2, "tools/list", serde_json::json!({})).await?;
    let names: Vec<&str> = tools["tools"].as_array().map(|a| a.iter().filter_map(|t| t["name"].as_str()).collect()).unwrap_or_default();
    // A shell line as cmd, as agents often send it.
    let args = serde_json::json!({ "task": d.task, "cmd": "echo $((6 * 7)) from an MCP tool call" });
    let ran = mcp_call(d, 3, "tools/call", serde_json::json!({ "name": "run_command", "arguments": args })).await?;
    let stdout = ran["structuredContent"]["stdout"].as_str().unwrap_or_default().to_owned();
    if !names.contains(&"run_command") || !names.contains(&"rollback") || stdout != "42 from an MCP tool call\n" {
        bail!("/mcp did not answer as it should: tools {names:?}, run_command {ran}");
    }
    let shown = mcp_call(d, 4, "tools/call", serde_json::json!({ "name": "get_task", "arguments": { "task": d.task } })).await?;
    let task = &shown["structuredContent"];
    if task["id"].as_str() != Some(d.task.as_str()) || task.get("webhook_secret").is_some() {
        bail!("/mcp get_task did not answer the compact task: {shown}");
    }
    let detail = format!(
        "server {} speaks {}\n{} tools: {}\nrun_command \"echo $((6 * 7)) ...\" answered: {}\nget_task: {} at step {}, workdir {} (no webhook secret, env names only)",
        server["serverInfo"]["name"].as_str().unwrap_or("?"),
        server["protocolVersion"].as_str().unwrap_or("?"),
        names.len(),
        names.join(", "),
        stdout.trim(),
        task["state"].as_str().unwrap_or("?"),
        task["step"],
        task["workdir"].as_str().unwrap_or("?")
    );
    d.say("an MCP client: the tools at /mcp (or cairn mcp on stdio)", t.elapsed(), &detail);
    Ok(())
}

/// What an agent written in Python does through the SDK (`sdk/python`):
/// its own task, a command, a file, a milestone, a rollback with a reason.
const SDK_AGENT: &str = r#"
import cairn
with cairn.Client() as c:
    t = c.tasks.create(name="from-python")
    try:
        r = t.exec(["python3", "-c", "print(6 * 7)"])
        t.files.write("/workspace/plan.txt", "step 1: works\n")
        good = t.snapshot(kind="milestone", note="plan written", healthy=True)
        t.files.write("/workspace/plan.txt", "step 2: broke it\n")
        note = t.rollback(last_healthy=True, reason="step 2 broke the plan")
        back = t.files.read("/workspace/plan.txt").decode().strip()
        print(f"task {t.id}: exec printed {r.stdout.strip()}, milestone {good.id}")
        print(f"rolled back to {note.to} because {note.reason!r}; plan.txt is {back!r} again")
    finally:
        t.destroy()
"#;

/// An agent written for E2B, unmodified: E2B's own SDK, pointed at this
/// daemon by three environment variables (docs/e2b.md).
const E2B_AGENT: &str = r#"
from e2b import Sandbox
sb = Sandbox.create(timeout=120, metadata={"agent": "demo"})
try:
    r = sb.commands.run("echo hello from $(hostname); uname -s")
    watch = sb.files.watch_dir("/workspace")
    sb.files.write("/workspace/notes.txt", "written through E2B's SDK")
    h = sb.commands.run("sleep 30", background=True)
    listed = [p.pid for p in sb.commands.list()]
    sb.commands.kill(h.pid)
    seen = sorted({f"{e.type.value} {e.name}" for e in watch.get_new_events()})
    watch.stop()
    snap = sb.create_snapshot()
    child = Sandbox.create(snap.snapshot_id, timeout=60)
    from_snapshot = child.files.read("/workspace/notes.txt")
    child.kill()
    Sandbox.delete_snapshot(snap.snapshot_id)
    print(f"sandbox {sb.sandbox_id} (a Cairn task): {r.stdout.strip()!r}")
    print(f"notes.txt: {sb.files.read('/workspace/notes.txt')!r}; background command {h.pid} listed in {listed}, killed")
    print(f"watched /workspace (the sandbox's own inotify): {seen}")
    print(f"snapshot {snap.snapshot_id}: a new sandbox from it reads {from_snapshot!r}")
finally:
    sb.kill()
"#;

/// The E2B step: [`E2B_AGENT`] with the e2b SDK's own Python environment
/// (scripts/setup-debian.sh makes it), with a key made for it.
async fn e2b_sdk(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let python = std::env::var("CAIRN_E2B_PYTHON").unwrap_or_else(|_| "/opt/cairn-test/e2b/bin/python".into());
    let probe = tokio::process::Command::new(&python).args(["-c", "import e2b"]).output().await;
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        d.say("an agent written for E2B: not shown", t.elapsed(), &format!("E2B's SDK is not at {python} (scripts/setup-debian.sh installs it)"));
        return Ok(());
    }
    let key: cairn_api::api_keys::NewApiKey = d.client.post("/v1/api-keys", &cairn_api::api_keys::CreateApiKey { name: format!("demo-{}", std::process::id()) }).await?;
    let out = tokio::process::Command::new(&python)
        .args(["-c", E2B_AGENT])
        .env("E2B_API_URL", &d.client.base)
        .env("E2B_SANDBOX_URL", &d.client.base)
        .env("E2B_API_KEY", &key.key)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("run the e2b SDK")?;
    let _: serde_json::Value = d.client.delete(&format!("/v1/api-keys/{}", key.name)).await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown = ["written through E2B's SDK", "'create notes.txt'", "reads \"written through E2B's SDK\""];
    if !out.status.success() || !shown.iter().all(|s| text.contains(s)) {
        bail!("the E2B step failed ({}): {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    d.say("an agent written for E2B (its own SDK, three variables changed)", t.elapsed(), &text);
    Ok(())
}

/// The SDK step: runs [`SDK_AGENT`] with python3 against this daemon. The
/// README's set-up installs the SDK; without it the step says how to.
async fn python_sdk(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let probe = tokio::process::Command::new("python3").args(["-c", "import cairn"]).output().await;
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        d.say("an agent in Python, through the SDK: not shown", t.elapsed(), "the Python SDK is not installed: python3 -m pip install ./sdk/python (scripts/setup-debian.sh does)");
        return Ok(());
    }
    let out = tokio::process::Command::new("python3")
        .args(["-c", SDK_AGENT])
        .env("CAIRN_URL", &d.client.base)
        .env("CAIRN_TOKEN", &d.client.token)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("run python3")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("'step 1: works' again") {
        bail!("the SDK step failed ({}): {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    d.say("an agent in Python, through the SDK (import cairn)", t.elapsed(), &text);
    Ok(())
}

/// A server in the background inside the task, reached through the
/// daemon with a signed link: the sandbox stays offline.
async fn port(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let start = cairn_api::exec::ExecStart {
        argv: ["sh", "-c", "mkdir -p /workspace/site && echo 'served from inside the task' > /workspace/site/index.html && cd /workspace/site && exec python3 -m http.server 8000"]
            .map(str::to_owned)
            .to_vec(),
        ..Default::default()
    };
    let server: cairn_api::processes::ProcessView =
        d.client.post(&format!("/v1/tasks/{}/processes", d.task), &cairn_api::processes::StartProcess { start, tag: Some("site".into()) }).await?;
    let link: serde_json::Value = d.client.post_empty(&format!("/v1/tasks/{}/port-links/8000?ttl=10m", d.task)).await?;
    let url = link["url"].as_str().unwrap_or_default().to_owned();
    let http = reqwest::Client::new();
    let mut page = String::new();
    for _ in 0..100 {
        if let Ok(r) = http.get(&url).send().await {
            if r.status().is_success() {
                page = r.text().await.unwrap_or_default();
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _: cairn_api::processes::ProcessView = d.client.post_empty(&format!("/v1/tasks/{}/processes/{}/kill", d.task, server.id)).await?;
    if page.trim() != "served from inside the task" {
        bail!("the port step read {page:?} through {url}");
    }
    let shown: String = url.split('?').next().unwrap_or_default().to_owned();
    d.say("a server in the background, reached through a signed link (cairn port)", t.elapsed(), &format!("command {} (tag site); {shown}?exp=...&sig=... answered {:?}", server.id, page.trim()));
    Ok(())
}

/// One file as raw bytes over HTTP, then what `/metrics` counted so far.
async fn raw_file_and_metrics(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let path = format!("/v1/tasks/{}/file?path={}", d.task, crate::client::query_escape("/workspace/raw.txt"));
    let put = d.client.request(reqwest::Method::PUT, &path).body("written as raw bytes\n");
    let _: cairn_api::files::Written = d.client.send(put).await?;
    let got = d.client.request(reqwest::Method::GET, &path).send().await.map_err(|e| d.client.connect_error(e))?;
    let got = got.error_for_status().map_err(|e| anyhow::anyhow!("reading the file back: {e}"))?.text().await?;
    if got != "written as raw bytes\n" {
        bail!("the file read back as {got:?}");
    }
    d.say("one file in and out as raw bytes (PUT/GET .../file)", t.elapsed(), got.trim());

    let t = Instant::now();
    let resp = d.client.request(reqwest::Method::GET, "/metrics").send().await.map_err(|e| d.client.connect_error(e))?;
    let text = resp.error_for_status().map_err(|e| anyhow::anyhow!("/metrics: {e}"))?.text().await?;
    let wanted = ["cairn_tasks{state=\"running\"}", "cairn_live_sandboxes", "cairn_exec_duration_seconds_count", "cairn_wake_duration_seconds_count", "cairn_snapshot_added_bytes_total"];
    let lines: Vec<&str> = text.lines().filter(|l| wanted.iter().any(|w| l.split(' ').next() == Some(*w))).collect();
    if lines.len() != wanted.len() {
        bail!("/metrics lacks some of {wanted:?}: {text}");
    }
    d.say("Prometheus metrics (GET /metrics)", t.elapsed(), &lines.join("\n"));

    let t = Instant::now();
    let nodes: Vec<cairn_api::nodes::Node> = d.client.get("/v1/nodes").await?;
    let here = match nodes.as_slice() {
        [n] if n.tasks.contains(&d.task.to_string()) => n,
        _ => bail!("expected this daemon alone, running task {}: {nodes:?}", d.task),
    };
    let said = format!("{} {}, heartbeat {} ms ago, {} task(s) live, at {}", here.name, here.state.as_str(), here.heartbeat_age_ms, here.load, here.url);
    d.say("the node registry (cairn node list)", t.elapsed(), &said);
    Ok(())
}

/// A patch, an archive and a report with a signed record; verify it; the
/// ledger's chain; then complete the task and show nothing is left.
/// A link the agent plants in what it hands back: refused by default,
/// followed inside the sandbox on request, never to the host's file.
async fn copy_links(d: &mut Demo, local: &Path) -> Result<()> {
    d.show(
        "the agent plants a link to a host path in its results",
        "mkdir -p /workspace/out && echo result > /workspace/out/r.txt && ln -s /etc/hostname /workspace/out/hostname && ls /workspace/out",
        |r| r.code() == 0,
    )
    .await?;
    let t = Instant::now();
    let src = format!("{}:/workspace/out", d.task);
    let refused = match crate::cp::run(&d.client, &src, &local.join("out").display().to_string(), crate::cp::Links::Refuse).await {
        Ok(_) => bail!("a link out of the copied tree was copied"),
        Err(e) => e.to_string(),
    };
    d.say("cp out refuses it, naming the link", t.elapsed(), &refused);
    let t = Instant::now();
    crate::cp::run(&d.client, &src, &local.join("followed").display().to_string(), crate::cp::Links::Follow).await?;
    let followed = std::fs::read_to_string(local.join("followed/hostname"))?;
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    if followed == host && !host.is_empty() {
        bail!("--follow-links read the host's file");
    }
    d.say("--follow-links copies the sandbox's file, not the host's", t.elapsed(), &format!("hostname inside: {}", followed.trim()));
    d.exec("rm -rf /workspace/out").await?;
    Ok(())
}

async fn deliver(d: &mut Demo, home: &Path) -> Result<()> {
    d.show(
        "the agent's work: a git repository in the workspace",
        "cd /workspace && git init -q && git add notes.txt && git -c user.name=agent -c user.email=agent@example.com commit -qm start \
         && echo 'a second line' >> notes.txt && mkdir -p dist && echo 'built' > dist/app.txt && echo '# Report: all green' > report.md \
         && git status --short",
        |r| r.code() == 0 && text(r).contains("notes.txt"),
    )
    .await?;
    let shown: TaskView = d.client.get(&format!("/v1/tasks/{}", d.task)).await?;
    let init_pid = shown.sandbox_pid.unwrap_or(0);
    let t = Instant::now();
    let out = tempfile::tempdir()?;
    let args = crate::deliver::DeliverArgs {
        task: d.task.clone(),
        files: Vec::new(),
        archive: Some("/workspace/dist".into()),
        patch: true,
        report: Some("/workspace/report.md".into()),
        out: Some(out.path().join("delivered")),
        complete: true,
    };
    let v = crate::deliver::deliver(&d.client, args).await?;
    d.say(
        "deliver a patch, an archive and a report; complete the task",
        t.elapsed(),
        &crate::deliver::delivery_summary(&v.body, Some(&out.path().join("delivered"))),
    );
    let patch = std::fs::read_to_string(out.path().join("delivered/workspace.patch"))?;
    outln!("      {}", patch.lines().filter(|l| l.starts_with('+') && !l.starts_with("+++")).collect::<Vec<_>>().join("\n      "));
    let t = Instant::now();
    let record = out.path().join("delivered/record.json");
    let checked = crate::deliver::verify(crate::deliver::DaemonAccess::At(&d.client), &record, None).await?;
    if let Some(why) = crate::deliver::unverified(&checked) {
        bail!("{why}");
    }
    d.say("verify the record: signature, digests, ledger head", t.elapsed(), &crate::deliver::verify_summary(&checked));
    let t = Instant::now();
    std::fs::write(out.path().join("delivered/report.md"), "# Report: all green (edited)\n")?;
    let refused = match crate::deliver::verify(crate::deliver::DaemonAccess::At(&d.client), &record, None).await {
        Ok(_) => bail!("an edited deliverable passed verification"),
        Err(e) => e.to_string(),
    };
    d.say("an edited report no longer verifies", t.elapsed(), &refused);
    let t = Instant::now();
    let ledger: LedgerView = d.client.get(&format!("/v1/tasks/{}/ledger", d.task)).await?;
    if !ledger.ok {
        bail!("the ledger does not verify: {}", serde_json::Value::from(ledger.problem));
    }
    d.say(
        "the ledger: every log entry chained to the one before",
        t.elapsed(),
        &format!("{} entries, head {}, ok", ledger.entries, ledger.head.as_deref().unwrap_or("?")),
    );
    let t = Instant::now();
    let leftovers = cairn_sandbox::inspect::host_traces(home, &d.task, init_pid);
    d.say("nothing of the completed task is left on the host", t.elapsed(), &if leftovers.is_empty() {
        "no process, mount, cgroup, loop device or scratch directory remains".to_owned()
    } else {
        leftovers.join("\n")
    });
    if !leftovers.is_empty() {
        bail!("the completed task left things behind");
    }
    Ok(())
}

const DOCS_HOST: &str = "docs.demo.test";

/// Serves one page to whoever asks, until the demo ends.
async fn docs_site() -> Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let body = "the guide: step 1, read the docs\n";
                let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    Ok(addr)
}

const API_HOST: &str = "api.demo.test";

/// An HTTPS API for `API_HOST` (its certificate from a CA made here) that
/// answers with the Authorization header it was sent. Returns its address
/// and its CA's certificate.
async fn api_site() -> Result<(std::net::SocketAddr, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pem = cairn_egress::ca::generate("demo-api")?;
    let ca = cairn_egress::ca::TaskCa::load("demo-api", &pem)?;
    // It speaks HTTP/1.1 only, and says so.
    let mut config = (*ca.server_config(&cairn_egress::Host::parse(API_HOST)?)?).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(conn).await else { return };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let auth = head.lines().find_map(|l| l.strip_prefix("authorization: ").or_else(|| l.strip_prefix("Authorization: "))).unwrap_or("(none)");
                let body = format!("the API saw Authorization: {auth}\n");
                let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    Ok((addr, pem.cert))
}

/// A credential the sandbox never holds: the proxy injects it into the
/// requests to one host that a rule allows, and takes it out of the answer.
async fn injection(d: &mut Demo) -> Result<()> {
    const VALUE: &str = "demo-token-4f1c9a7e";
    let t = Instant::now();
    let req = d.client.request(reqwest::Method::PUT, "/v1/secrets/DEMO_TOKEN").body(VALUE);
    let _: api::secrets::SecretView = d.client.send(req).await?;
    let create = api::tasks::CreateRequest {
        allow: vec![API_HOST.into()],
        rules: vec![format!("{API_HOST}=GET /repos/acme/")],
        inject: vec![format!("{API_HOST}=Authorization: Bearer {{{{secret:DEMO_TOKEN}}}}")],
        ..Default::default()
    };
    let agent: TaskView = d.client.post("/v1/tasks", &create).await?;
    let main_task = std::mem::replace(&mut d.task, agent.task.id.to_string());
    d.say(
        "secrets: set one, and a task whose proxy injects it into one host's requests",
        t.elapsed(),
        &format!("cairn secret set DEMO_TOKEN; task {} --rule '{}' --inject '{}'", d.task, create.rules[0], create.inject[0]),
    );
    let result = async {
        d.show(
            "the API gets the secret; the agent sees only its placeholder",
            &format!("curl -sS --max-time 10 https://{API_HOST}/repos/acme/tool; env | grep -q demo-token && echo 'IN THE ENVIRONMENT' || echo 'not in the environment'"),
            |r| text(r).contains("Bearer $DEMO_TOKEN") && !text(r).contains(VALUE) && text(r).contains("not in the environment"),
        )
        .await?;
        d.show(
            "a request outside the rule is refused by the proxy",
            &format!("curl -sS --max-time 10 -X DELETE https://{API_HOST}/repos/acme/tool"),
            |r| text(r).contains("refused by the request rules"),
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    let agent = std::mem::replace(&mut d.task, main_task);
    let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{agent}")).await;
    result
}

/// Offline by default; one allowed host through the proxy; what it refuses;
/// the decision log.
async fn egress(d: &mut Demo) -> Result<()> {
    // Named explicitly: NO_PROXY would send 127.0.0.1 past it.
    let proxy = "--noproxy '' -x http://127.0.0.1:3128";
    d.show(
        "egress: offline by default (no DNS, proxy denies)",
        &format!("getent hosts example.com || echo 'no DNS'; curl -s -o /dev/null -w 'proxy answered %{{http_code}}\n' {proxy} http://{DOCS_HOST}/"),
        |r| text(r).contains("no DNS") && text(r).contains("proxy answered 403"),
    )
    .await?;
    let t = Instant::now();
    let v: EgressView = d.client.post(&format!("/v1/tasks/{}/egress", d.task), &api::egress::PolicyUpdate { allow: vec![DOCS_HOST.into()], ..Default::default() }).await?;
    d.say("allow one host while the task runs", t.elapsed(), &format!("policy: allow {}", serde_json::to_string(&v.allow)?));
    d.show(
        "the allowed host answers through the proxy",
        &format!("echo $HTTP_PROXY; curl -sS --max-time 5 http://{DOCS_HOST}/guide"),
        |r| text(r).contains("the guide"),
    )
    .await?;
    d.show(
        "refused: other names, IP literals, bypassing the proxy",
        &format!(
            "for u in http://other.demo.test/ http://127.0.0.1/ http://2130706433/ 'http://[::1]/'; do \
             curl -s -o /dev/null -w \"$u: %{{http_code}}\\n\" {proxy} \"$u\"; done; \
             curl -s --noproxy '*' --max-time 3 http://93.184.215.14/ || echo \"without the proxy: no route (curl exit $?)\""
        ),
        |r| text(r).matches(": 403").count() == 4 && text(r).contains("no route"),
    )
    .await?;
    let t = Instant::now();
    // Each attempt is written when its connection closes.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let log: EgressView = d.client.get(&format!("/v1/tasks/{}/egress", d.task)).await?;
    let mut lines = Vec::with_capacity(log.decisions.len());
    for decision in &log.decisions {
        let a = decision.attempt()?;
        let verdict = if a.allowed { "allowed" } else { "denied " };
        lines.push(format!("{verdict} {}:{} -> {}", a.host, a.port, a.reason));
    }
    d.say("the decision log (cairn egress log)", t.elapsed(), &lines.join("\n"));
    if lines.len() < 6 {
        bail!("the decision log has {} entries, want at least 6", lines.len());
    }
    Ok(())
}

/// Snapshots, a pre-risk snapshot, rollback in place, forks, check and gc.
async fn snapshots(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let body = api::snapshots::SnapshotRequest {
        kind: Some("milestone".into()),
        note: Some("workspace ready".into()),
        memory: Some("notes.txt is in place; next: build".into()),
        healthy: None,
        with_memory: false,
    };
    let snap: Snapshot = d.client.post(&format!("/v1/tasks/{}/snapshots", d.task), &body).await?;
    let sid = snap.id.to_string();
    d.say(
        "snapshot a milestone (with the agent's memory summary)",
        t.elapsed(),
        &format!(
            "{sid}: {} files, {} added to the blob store, sandbox frozen {:.1} ms",
            snap.files,
            crate::progress::human(snap.added_bytes as f64),
            snap.freeze_ms
        ),
    );
    let t = Instant::now();
    let again: Snapshot = d.client.post(&format!("/v1/tasks/{}/snapshots", d.task), &api::snapshots::SnapshotRequest::default()).await?;
    d.say(
        "snapshot again with nothing changed: incremental",
        t.elapsed(),
        &format!("{}: {} added (the manifest only)", again.id, crate::progress::human(again.added_bytes as f64)),
    );

    let t = Instant::now();
    let args = ExecArgs { task: d.task.clone(), argv: vec!["rm".into(), "-rf".into(), "/workspace/notes.txt".into()], ..Default::default() };
    let r = exec::run(&d.client, &args, Sink::Capture).await?;
    let Some(pre) = r.pre_risk.clone() else {
        bail!("rm -rf ran without a pre-risk snapshot");
    };
    d.say("a high-risk command (rm -rf) takes a pre-risk snapshot first", t.elapsed(), &format!("{} ({})", pre.snapshot, pre.reason));
    d.show("the file is gone", "ls /workspace/notes.txt 2>&1 || true", |r| text(r).contains("No such file")).await?;

    let t = Instant::now();
    let body = api::snapshots::RollbackRequest { to: Some(sid.clone()), last_healthy: false, reason: "deleted notes.txt by mistake".into() };
    let rb: RollbackAnswer = d.client.post(&format!("/v1/tasks/{}/rollback", d.task), &body).await?;
    let shown: TaskView = d.client.get(&format!("/v1/tasks/{}", d.task)).await?;
    d.say(
        "roll back in place to the milestone (same task id)",
        t.elapsed(),
        &format!("rollback note: {}\nmemory summary restored: {}", rb.rollback_note.reason, shown.task.memory),
    );
    d.show("the file is back", "cat /workspace/notes.txt", |r| text(r).contains("copied in by cairn cp")).await?;

    let t = Instant::now();
    let kids: Vec<TaskView> = d.client.post(&format!("/v1/tasks/{}/fork", d.task), &api::snapshots::ForkRequest { from: Some(sid.clone()), count: Some(2) }).await?;
    let ids: Vec<String> = kids.iter().map(|k| k.task.id.to_string()).collect();
    d.say("fork two tasks from the milestone (a shared read-only layer)", t.elapsed(), &ids.join(", "));
    let main = d.task.clone();
    for (i, k) in ids.iter().enumerate() {
        d.task = k.clone();
        let r = d.show(&format!("fork {}: approach {}", i + 1, i + 1), &format!("echo approach-{i} > /workspace/plan; cat /workspace/notes.txt /workspace/plan"), |r| r.code() == 0).await;
        let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{k}")).await;
        r?;
    }
    d.task = main;

    let t = Instant::now();
    let check: CheckReport = d.client.post("/v1/check", &api::snapshots::CheckRequest { read_data: true }).await?;
    let gc: GcAnswer = d.client.post("/v1/gc", &api::snapshots::GcRequest { dry_run: true, grace: None }).await?;
    d.say(
        "check the blob store (every byte) and preview gc",
        t.elapsed(),
        &format!("{}\n{}", crate::output::check_summary(&check), crate::output::gc_summary(&gc)),
    );
    if !check.problems.is_empty() {
        bail!("the blob store has problems");
    }
    Ok(())
}

/// OCI images as stacks of shared layers, and templates committed from a
/// task that new tasks start from without copying anything.
async fn images(d: &mut Demo) -> Result<()> {
    let Some(busybox) = ["/usr/bin/busybox", "/bin/busybox"].into_iter().map(Path::new).find(|p| p.exists()) else {
        d.say("an OCI image: not shown", std::time::Duration::ZERO, "busybox is not installed (scripts/setup-debian.sh installs busybox-static)");
        return Ok(());
    };
    let t = Instant::now();
    let tmp = tempfile::Builder::new().prefix("cairn-demo-oci-").tempdir_in("/var/tmp")?;
    let layout = tmp.path().join("layout");
    demo_oci::write_layout(&layout, busybox)?;
    let path = layout.to_str().context("temporary path is not UTF-8")?.to_owned();
    let image: api::images::Image = d.client.post("/v1/images", &api::images::ImportRequest { name: "demo-oci".into(), path, tag: None }).await?;
    d.say(
        "import an OCI image layout: two layers, stored once, stacked",
        t.elapsed(),
        &format!("{} layers, {} entries; the top layer deletes /etc/motd (a whiteout)", image.layers.len(), image.files),
    );
    let main = d.task.clone();
    let t = Instant::now();
    let on_oci: TaskView = d.client.post("/v1/tasks", &api::tasks::CreateRequest { image: Some("demo-oci".into()), ..Default::default() }).await?;
    d.task = on_oci.task.id.to_string();
    let took = t.elapsed();
    d.say("a task on it (the image's Env and WorkingDir apply)", took, &d.task.clone());
    let shown = d
        .show("the merged layers, as overlayfs stacks them", "cat /etc/release; test -e /etc/motd || echo 'motd: deleted by the top layer'; echo \"$FROM_IMAGE in $(pwd)\"", |r| {
            text(r).contains("layer two") && text(r).contains("deleted by the top layer") && text(r).contains("yes in /srv")
        })
        .await;
    d.task = main.clone();
    let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{}", on_oci.task.id)).await;
    shown?;

    d.exec("mkdir -p /workspace/deps && head -c 4000000 /dev/urandom > /workspace/deps/model.bin").await?;
    let t = Instant::now();
    let tpl: api::images::Image =
        d.client.post("/v1/images/commit", &api::images::CommitRequest { task: main.clone(), name: "demo-template".into(), from: None }).await?;
    d.say(
        "commit the task as a template (image + its writable layer)",
        t.elapsed(),
        &format!("{}: parent {}, {} in {} entries", tpl.name, tpl.parent.as_deref().unwrap_or("?"), crate::progress::human(tpl.size_bytes as f64), tpl.files),
    );
    let t = Instant::now();
    let from_tpl: TaskView = d.client.post("/v1/tasks", &api::tasks::CreateRequest { image: Some("demo-template".into()), ..Default::default() }).await?;
    let took = t.elapsed();
    d.say("a task from the template: nothing copied, whatever the size", took, &from_tpl.task.id.to_string());
    d.task = from_tpl.task.id.to_string();
    let shown = d.show("it starts with the committed files", "ls -l /workspace/deps; cat /workspace/notes.txt", |r| text(r).contains("model.bin")).await;
    d.task = main;
    let refused = d.client.delete::<api::images::Removed>("/v1/images/demo-template").await;
    let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{}", from_tpl.task.id)).await;
    shown?;
    let Err(refused) = refused else { bail!("a template in use was removed") };
    d.say("removing it while a task uses it is refused", std::time::Duration::ZERO, &format!("{refused:#}"));
    d.client.delete::<api::images::Removed>("/v1/images/demo-template").await?;
    d.client.delete::<api::images::Removed>("/v1/images/demo-oci").await?;
    Ok(())
}

/// Suspend on a wait, wake on an approval (through the signed page's form),
/// on a signed webhook and on a timer.
/// The web console as a person sees it, logged in with the API token: the
/// task in the list, its timeline, and the pending approval with its
/// prompt and what changed since the last milestone.
async fn console(d: &mut Demo) -> Result<()> {
    let t = Instant::now();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let login = http.post(d.client.url("/console/login")).form(&[("token", d.client.token.as_str())]).send().await?;
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::to_owned)
        .with_context(|| format!("the console's login answered {} without a session cookie", login.status()))?;
    let page = |path: String| {
        let req = http.get(d.client.url(&path)).header(reqwest::header::COOKIE, cookie.clone());
        async move {
            let resp = req.send().await?;
            let status = resp.status();
            let body = resp.text().await?;
            if !status.is_success() {
                bail!("the console's {path} answered {status}");
            }
            Ok::<String, anyhow::Error>(body)
        }
    };
    let list = page("/".into()).await?;
    let timeline = page(format!("/console/tasks/{}", d.task)).await?;
    let approvals = page("/console/approvals".into()).await?;
    let rows = timeline.matches("<li class=\"ev ").count();
    let ok = list.contains(&d.task) && rows > 0 && approvals.contains("Publish notes.txt?") && approvals.contains("Changed since milestone");
    d.say(
        "the web console: tasks, a live timeline, approvals with context",
        t.elapsed(),
        &format!("{}/ (log in with the API token)
task list names {}; its timeline shows {rows} events; the approval waits there with what changed since its milestone", d.client.base, d.task),
    );
    if !ok {
        bail!("the console did not show the task, its timeline and its pending approval");
    }
    Ok(())
}

async fn waits(d: &mut Demo, home: &Path) -> Result<()> {
    let t = Instant::now();
    let mut receiver = crate::demo_hooks::Receiver::start().await?;
    let new_hook = api::hooks::NewHook {
        url: receiver.url.clone(),
        events: vec!["task.waiting".into(), "task.woken".into()],
        task: Some(d.task.clone()),
        ..Default::default()
    };
    let hook: api::hooks::CreatedHook = d.client.post("/v1/outgoing-hooks", &new_hook).await?;
    d.say(
        "a hook: the task's waits and wakes are posted, signed, to a receiver",
        t.elapsed(),
        &format!("{} -> {} (secret {}...)", hook.hook.id, receiver.url, &hook.secret[..12.min(hook.secret.len())]),
    );

    let t = Instant::now();
    let shown: TaskView = d.client.get(&format!("/v1/tasks/{}", d.task)).await?;
    let pid = shown.sandbox_pid.unwrap_or(0);
    let w: WaitView = d.client.post(&format!("/v1/tasks/{}/waits", d.task), &api::waits::WaitRequest { approval: Some("Publish notes.txt?".into()), ..Default::default() }).await?;
    let traces: Vec<String> = cairn_sandbox::inspect::host_traces(home, &d.task, pid)
        .into_iter()
        .filter(|l| !l.ends_with(&format!("{}.img", d.task)))
        .collect();
    d.say(
        "wait for an approval: the task suspends",
        t.elapsed(),
        &format!(
            "state {}; on the host: {}\napproval page: {}",
            w.task_state,
            if traces.is_empty() { "no process, mount, cgroup or loop device (the disk image stays as a cache)".to_owned() } else { traces.join("; ") },
            w.approval_url.as_deref().unwrap_or_default()
        ),
    );
    if w.task_state != TaskState::Suspended || !traces.is_empty() {
        bail!("the waiting task still holds compute");
    }
    let t = Instant::now();
    let (arrived, waiting) = receiver.next_of("task.waiting").await?;
    let header = |name: &str| arrived.headers.get(name).cloned().unwrap_or_default();
    let headers = cairn_runtime::gateway::webhook::WebhookHeaders::from_lookup(|name| arrived.headers.get(name).map(|v| v.as_bytes()));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let signed = cairn_runtime::gateway::webhook::verify(&hook.secret, &headers, &arrived.body, now).is_ok();
    let link = waiting["data"]["wait"]["approval_url"].as_str().unwrap_or_default();
    d.say(
        "the approver is told: task.waiting, with the prompt and the signed link",
        t.elapsed(),
        &format!(
            "{} {}: {:?}\nsignature {} ({})\nlink: {link}",
            header("webhook-id"),
            waiting["type"].as_str().unwrap_or_default(),
            waiting["data"]["wait"]["prompt"].as_str().unwrap_or_default(),
            if signed { "verified" } else { "WRONG" },
            header("webhook-signature").chars().take(20).collect::<String>() + "...",
        ),
    );
    if !signed || Some(link) != w.approval_url.as_deref() {
        bail!("the task.waiting notification was not signed or lacked the approval link");
    }
    console(d).await?;
    let t = Instant::now();
    let url = w.approval_url.clone().unwrap_or_default();
    let http = reqwest::Client::new();
    let page = http.get(&url).send().await?.text().await?;
    let query = url.split_once('?').map(|q| q.1).unwrap_or_default().to_owned();
    let field = |k: &str| query.split('&').find_map(|p| p.strip_prefix(&format!("{k}="))).unwrap_or_default().to_owned();
    let action = format!("{}/approve/{}", d.client.url(""), w.id);
    let form = [("exp", field("exp")), ("sig", field("sig")), ("decision", "approve".to_owned()), ("comment", "looks good".to_owned())];
    let done = http.post(&action).form(&form).send().await?;
    let ok = done.status().is_success() && page.contains("Publish notes.txt?");
    d.say("approve on the web page (a form post to the signed link)", t.elapsed(), &format!("{} {}", done.status(), if ok { "Approved" } else { "failed" }));
    if !ok {
        bail!("the approval page did not work");
    }
    let t = Instant::now();
    let woke = wait_running(d, &w).await?;
    d.say("the task wakes into a fresh sandbox", t.elapsed(), &woke);
    let t = Instant::now();
    let (_, woken) = receiver.next_of("task.woken").await?;
    d.say("and the hook posts task.woken", t.elapsed(), &format!("trigger: {}", woken["data"]["event"]["args"]["trigger"]));
    let _: serde_json::Value = d.client.delete(&format!("/v1/outgoing-hooks/{}", hook.hook.id)).await?;
    d.show("its files are where they were", "cat /workspace/notes.txt", |r| text(r).contains("copied in by cairn cp")).await?;

    let t = Instant::now();
    let shown: TaskView = d.client.get(&format!("/v1/tasks/{}", d.task)).await?;
    let secret = shown.task.webhook_secret.unwrap_or_default();
    let w: WaitView = d.client.post(&format!("/v1/tasks/{}/waits", d.task), &api::waits::WaitRequest { webhook: Some("build-done".into()), ..Default::default() }).await?;
    let hook = w.webhook_url.clone().unwrap_or_default();
    let body = r#"{"status":"green"}"#;
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let sig = cairn_runtime::gateway::webhook::sign(&secret, "msg_demo", ts, body.as_bytes())?;
    let send = |sig: String| {
        http.post(&hook)
            .header("webhook-id", "msg_demo")
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(body)
            .send()
    };
    let forged = send("v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into()).await?.status();
    let accepted = send(sig.clone()).await?.status();
    let retried = send(sig).await?.status();
    d.say(
        "wait for a webhook; a forged one is refused, a signed one wakes it",
        t.elapsed(),
        &format!("forged: {forged}; signed: {accepted}; the sender's retry: {retried} (takes effect once)"),
    );
    if forged.as_u16() != 401 || !accepted.is_success() || !retried.is_success() {
        bail!("the webhook gateway did not answer as it should");
    }
    let t = Instant::now();
    let woke = wait_running(d, &w).await?;
    d.say("woken by the webhook", t.elapsed(), &woke);

    let t = Instant::now();
    let timer: WaitView = d.client.post(&format!("/v1/tasks/{}/waits", d.task), &api::waits::WaitRequest { timer: Some("1s".into()), ..Default::default() }).await?;
    let woke = wait_running(d, &timer).await?;
    d.say("wait on a 1 s timer: suspended, then woken by it", t.elapsed(), &woke);
    Ok(())
}

/// A second task under gVisor (`isolation: gvisor`): its service keeps a
/// counter in memory only; a wait suspends the task with its processes
/// and memory, and the wake continues the counter where it was.
async fn gvisor(d: &mut Demo) -> Result<()> {
    let main_task = std::mem::take(&mut d.task);
    let t = Instant::now();
    let counter = "b=$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \\n'); i=0; \
        while true; do i=$((i+1)); echo \"$b $i\" > /workspace/counter.new && mv /workspace/counter.new /workspace/counter; sleep 0.1; done";
    let view: TaskView = d
        .client
        .post("/v1/tasks", &api::tasks::CreateRequest {
            isolation: Some("gvisor".into()),
            services: vec![counter.into()],
            ..Default::default()
        })
        .await?;
    d.task = view.task.id.to_string();
    d.say("a task under gVisor (runsc): a second kernel", t.elapsed(), &format!("task {} (isolation {}, suspends keep memory: {})", d.task, view.task.config.isolation, view.task.config.keep_memory));
    let result = gvisor_steps(d).await;
    let _ = d.client.delete::<TaskView>(&format!("/v1/tasks/{}", d.task)).await;
    d.task = main_task;
    result
}

async fn gvisor_steps(d: &mut Demo) -> Result<()> {
    d.show("its kernel is gVisor's, its root the same overlay", "uname -sr; ls -ld /workspace", |r| r.code() == 0).await?;
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    let before = loop {
        let r = d.exec("cat /workspace/counter 2>/dev/null").await?;
        let count = text(&r).split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        if count >= 5 || Instant::now() > deadline {
            break text(&r).trim().to_owned();
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let t = Instant::now();
    let w: WaitView = d.client.post(&format!("/v1/tasks/{}/waits", d.task), &api::waits::WaitRequest { approval: Some("Go on counting?".into()), ..Default::default() }).await?;
    let snaps: Vec<cairn_core::Snapshot> = d.client.get(&format!("/v1/tasks/{}/snapshots", d.task)).await?;
    let with_memory = snaps.last().is_some_and(|s| s.with_memory);
    d.say(
        "the service's counter is in memory only; wait for an approval",
        t.elapsed(),
        &format!("counter (boot id, count) before: {before}
state {}; the suspend snapshot holds processes and memory: {with_memory}", w.task_state),
    );
    if w.task_state != TaskState::Suspended || !with_memory {
        bail!("the gvisor task was not suspended with its memory");
    }
    let t = Instant::now();
    let _: serde_json::Value = d.client.post(&format!("/v1/tasks/{}/approve", d.task), &api::waits::ApproveRequest { approve: true, comment: None }).await?;
    let woke = wait_running(d, &w).await?;
    d.say("approve: the sandbox is restored from the checkpoint", t.elapsed(), &woke);
    let r = d.show("the counter goes on from where it was (same boot id)", "cat /workspace/counter", |r| r.code() == 0).await?;
    let (b0, n0) = before.split_once(' ').unwrap_or_default();
    let after = text(&r);
    let (b1, n1) = after.trim().split_once(' ').unwrap_or_default();
    if b0 != b1 || n1.parse::<u64>().unwrap_or(0) < n0.parse::<u64>().unwrap_or(u64::MAX) {
        bail!("the counter did not continue: {before} -> {}", after.trim());
    }
    Ok(())
}

/// Waits (blocking in the daemon, which is woken by the change) until
/// the wait `w` is satisfied and its task runs again; describes the wake.
async fn wait_running(d: &Demo, w: &WaitView) -> Result<String> {
    let id = &w.id;
    let view: WaitView = d.client.get(&format!("/v1/waits/{id}?block_ms=10000")).await?;
    if view.satisfied_ms.is_none() || view.task_state != TaskState::Running {
        bail!("the task did not wake within 10 s (wait {id} is {}, the task {})", view.state, view.task_state);
    }
    let log: Vec<Event> = d.client.get(&format!("/v1/tasks/{}/events", d.task)).await?;
    // A wake's arguments are free-form JSON in the log, as each kind of
    // entry records its own.
    let a = log.iter().rev().find(|e| e.kind == EventKind::Wake).map(|e| e.args.clone()).unwrap_or_default();
    Ok(format!(
        "sandbox ready {:.1} ms after the wake began ({}{})",
        a["sandbox_ready_ms"].as_f64().unwrap_or(0.0),
        if a["from_cache"] == true { "its disk reused as suspended" } else { "restored from the blob store" },
        if a["resumed_processes"] == true { "; its processes restored" } else { "" }
    ))
}
