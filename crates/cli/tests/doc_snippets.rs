//! Every Python block of README.md and docs/ runs as written against a real
//! daemon (`doc_snippets.py` beside this file runs them, with a helper that
//! approves and sends what they wait for), so an example cannot rot
//! unnoticed. Needs python3 with the SDK's dependencies, the mcp package
//! and standardwebhooks (`scripts/setup-debian.sh`); fails, never skips,
//! without them.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The Python blocks the Markdown holds, counted here on its own so that
/// a block the runner skipped fails the test.
fn python_blocks() -> usize {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    pages.extend(std::fs::read_dir(root.join("docs")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "md")));
    pages.iter().map(|p| std::fs::read_to_string(p).unwrap().lines().filter(|l| *l == "```python").count()).sum()
}

#[test]
fn every_python_block_of_the_readme_and_the_docs_runs_as_written() {
    common::require_root();
    let probe = common::run(Command::new("python3").args(["-c", "import httpx, cryptography, standardwebhooks, mcp"]).stdin(Stdio::null())).unwrap();
    assert!(
        probe.status.success(),
        "a Python package the snippets need is missing (scripts/setup-debian.sh installs them): {}",
        String::from_utf8_lossy(&probe.stderr).lines().last().unwrap_or("")
    );
    let want = python_blocks();
    assert!(want >= 13, "fewer Python blocks than the docs had ({want}): update this bound if some went on purpose");
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let root = repo_root();
    let mut cmd = Command::new("python3");
    cmd.arg(root.join("crates/cli/tests/doc_snippets.py"))
        .arg(&root)
        .current_dir(cwd.path())
        .env("PYTHONPATH", root.join("sdk/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CAIRN_URL", &d.url)
        .env("CAIRN_TOKEN", token.trim())
        .env_remove("CAIRN_HOME")
        .stdin(Stdio::null());
    let out = common::output_within(&mut cmd, Duration::from_secs(300));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a documented block failed:\n{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["blocks"].as_u64(), Some(want as u64), "every block ran:\n{stdout}");
    // The README's and the guide's approvals, and the guide's webhook, were
    // answered by the helper: the blocks really waited.
    assert!(summary["answered"]["approval"].as_u64() >= Some(2) && summary["answered"]["webhook"].as_u64() >= Some(1), "{summary}");
    assert!(stdout.contains("checked what docs/notifications.md defines"), "{stdout}");
    // What the blocks delivered is where they said, and nothing runs on.
    assert!(cwd.path().join("delivered/record.json").is_file() && cwd.path().join("delivery/record.json").is_file());
    let running: Vec<Value> = d.json(&["task", "list"]).as_array().unwrap().iter().filter(|t| t["state"] == "running" || t["state"] == "suspended").cloned().collect();
    assert!(running.is_empty(), "the blocks left tasks running: {running:?}");
}
