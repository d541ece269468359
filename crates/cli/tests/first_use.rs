//! What a new user meets first: output into a pipe that closes, a second
//! daemon, the task list and details, waits that can be cancelled, and the
//! messages of a copy that finds nothing.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::Daemon;

/// Runs `cairn ARGS` with its stdout read by nobody (the read end closed
/// before the command writes) and returns (exit code, stderr).
fn into_closed_pipe(d: &Daemon, args: &[&str]) -> (Option<i32>, String) {
    let mut child = d.cmd().args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let deadline = std::time::Instant::now() + common::CALL_DEADLINE;
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "cairn {args:?} still runs into a closed pipe");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_pipe_ends_every_verb_quietly() {
    let d = Daemon::start();
    let id = d.create(&["--name", "piped"]);
    d.ok(&["snapshot", &id]);
    let calls: [&[&str]; 9] = [
        &["task", "show", &id],
        &["task", "list"],
        &["--json", "task", "show", &id],
        &["log", &id],
        &["snapshot", "list", &id],
        &["image", "list"],
        &["key", "show"],
        &["exec", &id, "--", "sh", "-c", "yes | head -n 200000"],
        &["task", "--help"],
    ];
    for args in calls {
        let (code, err) = into_closed_pipe(&d, args);
        assert_ne!(code, Some(101), "cairn {args:?} panicked: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "cairn {args:?}: {err}");
        assert!(err.is_empty(), "cairn {args:?} should end quietly, said: {err}");
    }
    // Control: the same verbs still print when someone reads.
    assert!(d.ok(&["task", "show", &id]).contains("piped"));
    assert_eq!(d.sh(&id, "yes | head -n 3").1, "y\ny\ny\n");
}

/// Runs `cairn serve ARGS` on `home`, which must fail at once; returns stderr.
fn serve_fails(home: &std::path::Path, args: &[&str]) -> String {
    let out = common::output_within(
        std::process::Command::new(common::CAIRN).arg("serve").args(args).env("CAIRN_HOME", home).env("NO_COLOR", "1").stdin(Stdio::null()),
        Duration::from_secs(30),
    );
    assert!(!out.status.success(), "a second daemon should not start");
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

#[test]
fn a_second_daemon_says_why_once_and_leaves_nothing() {
    let d = Daemon::start();
    // On the same home: the reason once, and the first daemon's files stay.
    let err = serve_fails(d.home(), &["--listen", "127.0.0.1:0"]);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("cairn: ")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert_eq!(err.matches("already running").count(), 1, "said twice: {err}");
    assert!(d.home().join("daemon.lock").exists() && d.home().join("token").exists());
    d.ok(&["task", "list"]);
    // On another home, on the first daemon's address: it names the address
    // and --listen, and takes back what it created.
    let addr = d.url.trim_start_matches("http://").to_owned();
    let other = tempfile::tempdir().unwrap();
    for home in [other.path().join("fresh"), other.path().to_owned()] {
        let err = serve_fails(&home, &["--listen", &addr]);
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("cairn: ") && last.contains(&addr) && last.contains("--listen ADDR"), "{err}");
        for left in ["daemon.lock", "token", "url"] {
            assert!(!home.join(left).exists(), "{left} left in {}", home.display());
        }
    }
    assert!(!other.path().join("fresh").exists());
    d.ok(&["task", "list"]);
}

#[test]
fn task_list_hides_destroyed_tasks_and_fork_json_is_the_api_answer() {
    let d = Daemon::start();
    let gone = d.create(&["--name", "gone"]);
    let kept = d.create(&["--name", "kept"]);
    d.ok(&["destroy", &gone]);
    let ids = |v: serde_json::Value| -> Vec<String> { v.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect() };
    assert_eq!(ids(d.json(&["task", "list"])), vec![kept.clone()]);
    assert_eq!(ids(d.json(&["task", "list", "--all"])), vec![gone.clone(), kept.clone()]);
    let table = d.ok(&["task", "list"]);
    assert!(table.contains(&kept) && !table.contains(&gone), "{table}");
    assert!(d.ok(&["task", "list", "--all"]).contains(&gone));
    // fork --json: the new tasks, as POST /v1/tasks/{id}/fork answers (docs/api.md).
    let snap = d.json(&["snapshot", &kept])["id"].as_str().unwrap().to_owned();
    let forks = d.json(&["fork", &kept, "--from", &snap, "--count", "2"]);
    let kids = ids(forks.clone());
    assert_eq!(kids.len(), 2, "{forks}");
    for k in &kids {
        assert_eq!(forks.as_array().unwrap().iter().find(|t| t["id"] == k.as_str()).unwrap()["state"], "running");
        assert_eq!(d.task(k)["id"], k.as_str());
    }
    let human = d.ok(&["fork", &kept, "--from", &snap]);
    assert_eq!(human.lines().count(), 1, "one id per line: {human}");
}

#[test]
fn help_durations_patterns_copy_errors_and_the_log_read_well() {
    let d = Daemon::start();
    // task --help describes every subcommand.
    let help = d.ok(&["task", "--help"]);
    for sub in ["list", "show"] {
        let line = help.lines().find(|l| l.trim_start().starts_with(sub)).unwrap_or_else(|| panic!("{sub} missing: {help}"));
        assert!(line.trim_start()[sub.len()..].trim().len() > 5, "{sub} has no description: {line:?}");
    }
    // Durations in words; a pattern as written.
    let id = d.create(&["--expire-after", "7days", "--idle-suspend", "90m", "--risky-pattern", r"\bshred\s+-u"]);
    let shown = d.ok(&["task", "show", &id]);
    assert!(shown.contains("others expire after 7 days"), "{shown}");
    assert!(shown.contains("after 1 hour 30 minutes"), "{shown}");
    assert!(shown.contains(r"risky:         \bshred\s+-u"), "{shown}");
    let out = d.cairn(&["exec", &id, "--", "shred", "-u", "/tmp/nothing"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r"matches high-risk pattern `\bshred\s+-u`"), "{err}");
    assert!(!err.contains(r"\\"), "doubled backslashes: {err}");
    // A copy of a missing file names the path and the side.
    let local = tempfile::tempdir().unwrap();
    let err = d.fails(&["cp", &format!("{id}:/workspace/x"), local.path().to_str().unwrap()]);
    assert_eq!(err, format!("cairn: cannot copy {id}:/workspace/x: no such file or directory in the sandbox"));
    let missing = local.path().join("nope");
    let err = d.fails(&["cp", missing.to_str().unwrap(), &format!("{id}:/workspace/")]);
    assert_eq!(err, format!("cairn: cannot copy {}: no such file or directory here", missing.display()));
    // Control: a file that is there copies.
    d.sh(&id, "echo hi > /workspace/x");
    d.ok(&["cp", &format!("{id}:/workspace/x"), local.path().to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(local.path().join("x")).unwrap(), "hi\n");
    // The daemon's log, redirected to a file, has no colour codes.
    let log = d.log();
    assert!(log.contains("cairn daemon listening") && !log.contains('\x1b'), "{log}");
}

#[test]
fn a_pending_wait_is_shown_outlives_resume_and_can_be_cancelled() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let err = d.fails(&["wait", &id, "--cancel"]);
    assert!(err.contains("no pending wait"), "{err}");
    // A timer: show names it, since when and when it fires.
    let w = d.json(&["wait", &id, "--timer", "2h"]);
    let wid = w["id"].as_str().unwrap().to_owned();
    assert_eq!(d.state(&id), "suspended");
    let shown = d.ok(&["task", "show", &id]);
    let line = shown.lines().find(|l| l.starts_with("wait:")).unwrap_or_else(|| panic!("no wait line: {shown}"));
    assert!(line.contains(&wid) && line.contains("timer, fires at 20") && line.contains("since 20"), "{line}");
    assert_eq!(d.task(&id)["pending_wait"]["id"], wid.as_str());
    // resume runs the task, and says the wait still stands.
    let resumed = d.ok(&["resume", &id]);
    assert!(resumed.contains("is running") && resumed.contains(&format!("its wait {wid}")) && resumed.contains("still stands"), "{resumed}");
    assert_eq!(d.task(&id)["pending_wait"]["state"], "pending");
    // Cancelled while running: the task runs on, nothing is pending.
    let c = d.json(&["wait", &id, "--cancel"]);
    assert_eq!((c["id"].as_str(), c["state"].as_str()), (Some(wid.as_str()), Some("cancelled")));
    assert!(d.task(&id).get("pending_wait").is_none());
    assert!(!d.ok(&["task", "show", &id]).contains("wait:"));
    assert!(d.ok(&["resume", &id]).contains("no wait pending"));
    assert_eq!(d.sh(&id, "echo on").1, "on\n");
    // Cancelled while suspended for it: the task wakes.
    d.json(&["wait", &id, "--webhook", "build"]);
    assert_eq!(d.state(&id), "suspended");
    let c = d.json(&["wait", &id, "--cancel"]);
    assert_eq!(c["state"], "cancelled");
    d.wait_for_state(&id, "running", Duration::from_secs(60));
    assert_eq!(d.sh(&id, "echo awake").1, "awake\n");
    // The event comes later: it waits in the inbox, it wakes nothing.
    let ev = d.json(&["event", &id, "--name", "build"]);
    assert_eq!(ev["satisfied"], serde_json::Value::Null);
    // A waiter blocked on it learns of the cancel and ends.
    let blocked = d.cmd().args(["wait", &id, "--approval", "ok?", "--block"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while d.task(&id).get("pending_wait").is_none() {
        assert!(std::time::Instant::now() < deadline, "the blocked wait never registered");
        std::thread::sleep(Duration::from_millis(50));
    }
    d.ok(&["wait", &id, "--cancel"]);
    let out = common::output_of(blocked, common::CALL_DEADLINE).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("was cancelled"), "{err}");
    d.wait_for_state(&id, "running", Duration::from_secs(60));
}
