//! The examples of `examples/`: the scripted agent runs end to end against
//! a real daemon (red, rollback with a reason, green, approval through the
//! signed page, delivery, verification); the reference agent loop, which
//! needs a model, is compiled. Needs python3 with the SDK's dependencies
//! (`scripts/setup-debian.sh`); fails, never skips, without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

#[test]
fn the_scripted_agent_goes_red_rolls_back_goes_green_and_delivers_after_approval() {
    common::require_root();
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let delivery = out.path().join("delivery");
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("examples/scripted_agent.py"))
        .args(["--auto-approve", "--out"])
        .arg(&delivery)
        .env("PYTHONPATH", repo().join("sdk/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CAIRN_URL", &d.url)
        .env("CAIRN_TOKEN", token.trim())
        .stdin(Stdio::null());
    let run = common::output_within(&mut cmd, Duration::from_secs(300));
    let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    eprintln!("{text}");
    assert!(run.status.success(), "the scripted agent failed:\n{text}");
    // Each step, in order.
    let steps = ["[milestone]", "[pre-risk]", "[red] exit 1", "[rollback] back to", "rollback note, as the agent reads it", "[green] exit 0", "[approval] approve by approval-page", "[deliver]", "[verify] record verified", "[teardown]"];
    let mut at = 0;
    for step in steps {
        let found = text[at..].find(step).unwrap_or_else(|| panic!("step {step:?} missing or out of order in:\n{text}"));
        at += found + step.len();
    }
    // What it delivered is on disk, the patch holds the fix, and the CLI
    // verifies the same record.
    let patch = std::fs::read_dir(&delivery).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "patch" || x == "diff"));
    let patch = std::fs::read_to_string(patch.unwrap_or_else(|| panic!("no patch in {}", delivery.display()))).unwrap();
    assert!(patch.contains("divmod(total_cents, people)"), "{patch}");
    assert!(!patch.contains("round("), "the rolled-back try is not in the patch: {patch}");
    let record = delivery.join("record.json");
    d.ok(&["verify", record.to_str().unwrap()]);
    let tasks: serde_json::Value = d.json(&["task", "list"]);
    assert!(tasks.as_array().unwrap().iter().all(|t| t["state"] == "destroyed"), "the example left a task: {tasks}");
}

#[test]
fn the_reference_agent_loop_compiles() {
    let out = common::run(Command::new("python3").args(["-m", "py_compile"]).arg(repo().join("examples/agent_loop.py")).env("PYTHONPYCACHEPREFIX", std::env::temp_dir().join("cairn-pycache"))).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
