//! The MCP server with the official `mcp` Python package as the client,
//! over both transports: `cairn mcp` on stdio (the bridge to the daemon)
//! and the daemon's `/mcp` over streamable HTTP. `mcp_client.py` lists the
//! tools, creates a task, writes, runs, lists, snapshots, breaks it, rolls
//! back with a reason, forks, delivers, makes bad calls (error results, the
//! session goes on), and waits for an approval given over the HTTP API.
//! Then the CLI checks what the daemon recorded: the actor `mcp`, the
//! rollback note, the woken task with its files. `/mcp` without the token
//! is 401, and `cairn mcp` without a daemon fails with one line.
//!
//! Needs `python3` and the `mcp` Python package (`scripts/setup-debian.sh`
//! installs it); the test fails, never skips, when one is missing.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{output_within, Daemon, CAIRN};
use serde_json::Value;

/// How long one run of the client script may take: two tasks, a fork, a
/// rollback, a delivery and a suspend and wake.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(300);

fn client_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py").display().to_string()
}

/// Fails, with the command that fixes it, when python3 or the package is
/// missing.
fn require_mcp_package() {
    let probe = common::run(Command::new("python3").args(["-c", "import mcp.client.stdio, mcp.client.streamable_http"]).stdin(Stdio::null()));
    match probe {
        Err(e) => panic!("python3 is not installed ({e}): run scripts/setup-debian.sh, or apt-get install -y python3 python3-pip"),
        Ok(out) if !out.status.success() => panic!(
            "the mcp Python package is missing: python3 -m pip install mcp (or with --break-system-packages), as scripts/setup-debian.sh does: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => {}
    }
}

fn token(d: &Daemon) -> String {
    std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned()
}

/// Runs the client over `transport`; answers its JSON summary.
fn drive(d: &Daemon, transport: &str, label: &str) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(client_script()).args([transport, &d.url, &token(d), CAIRN, label]).stdin(Stdio::null());
    let out = output_within(&mut cmd, SCRIPT_DEADLINE);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the MCP client over {transport} failed ({}):\n{stderr}\n{stdout}\ndaemon log:\n{}", out.status, d.log());
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("the client's output is not JSON ({e}): {stdout}\n{stderr}"))
}

/// What the daemon recorded of one client run, checked with the CLI.
fn check_recorded(d: &Daemon, r: &Value) {
    let task = r["task"].as_str().unwrap();
    let log = d.json(&["log", task]);
    let events = log.as_array().unwrap();
    let by_mcp: Vec<&str> = events.iter().filter(|e| e["actor"] == "mcp").filter_map(|e| e["kind"].as_str()).collect();
    for kind in ["create", "exec", "cp", "snapshot", "rollback", "wait", "delivery"] {
        assert!(by_mcp.contains(&kind), "no {kind} event by mcp: {by_mcp:?}");
    }
    let shown = d.task(task);
    assert_eq!(shown["rollback_note"]["reason"], r["reason"], "{shown}");
    assert_eq!(shown["state"], "running", "{shown}");
    let (code, out, err) = d.sh(task, "cat /workspace/hello.txt");
    assert_eq!((code, out.as_str()), (0, "hello from mcp\n"), "{err}");
    // The fork was destroyed by the client.
    let tasks = d.json(&["task", "list"]);
    assert!(!tasks.as_array().unwrap().iter().any(|t| t["id"] == r["fork"] && t["state"] != "destroyed"), "the fork is gone: {tasks}");
    d.ok(&["destroy", task]);
}

#[test]
fn an_mcp_client_works_in_tasks_over_stdio_and_streamable_http() {
    require_mcp_package();
    let d = Daemon::start();

    let over_stdio = drive(&d, "stdio", "stdio");
    check_recorded(&d, &over_stdio);
    let over_http = drive(&d, "http", "http");
    check_recorded(&d, &over_http);

    // /mcp is behind the bearer token, as /v1 is.
    for auth in [None, Some("Bearer wrong")] {
        let mut curl = Command::new("curl");
        curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", "content-type: application/json"])
            .args(["-H", "accept: application/json, text/event-stream", "--data", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#]);
        if let Some(a) = auth {
            curl.args(["-H", &format!("authorization: {a}")]);
        }
        let out = output_within(curl.arg(format!("{}/mcp", d.url)), Duration::from_secs(30));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "401", "/mcp with {auth:?}");
    }
}

#[test]
fn the_stdio_bridge_without_a_daemon_fails_with_one_line() {
    let mut cmd = Command::new(CAIRN);
    cmd.arg("mcp").env("CAIRN_URL", "http://127.0.0.1:9").env("CAIRN_TOKEN", "x").stdin(Stdio::null());
    let out = output_within(&mut cmd, Duration::from_secs(30));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(err.starts_with("cairn: ") && !err.contains('\n') && err.contains("127.0.0.1:9"), "{err:?}");
    assert!(out.stdout.is_empty(), "nothing on stdout, which belongs to the protocol");
}

#[test]
fn the_stdio_bridge_answers_piped_messages_and_exits_at_the_end_of_input() {
    common::require_root();
    let d = Daemon::start();
    let input = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_command","arguments":{"task":"nope","cmd":["true"]}}}"#,
    ]
    .join("\n");
    let dir = tempfile::tempdir().unwrap();
    let stdin = dir.path().join("in");
    std::fs::write(&stdin, input + "\n").unwrap();
    let mut cmd = Command::new(CAIRN);
    cmd.arg("mcp").env("CAIRN_URL", &d.url).env("CAIRN_TOKEN", token(&d)).stdin(std::fs::File::open(&stdin).unwrap());
    let out = output_within(&mut cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 2, "an answer per request, none for the notification: {answers:?}");
    let by_id = |id: u64| answers.iter().find(|a| a["id"] == id).unwrap();
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "cairn");
    let call = &by_id(2)["result"];
    assert_eq!(call["isError"], true, "{call}");
    assert!(call["content"][0]["text"].as_str().unwrap().starts_with("not_found: "), "{call}");
}
