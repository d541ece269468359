//! A short fuzz of the HTTP API generated from its own OpenAPI document:
//! schemathesis (from PyPI) sends examples, boundary values, random bodies
//! and stateful sequences (create a task, then use its id) to every route,
//! and no answer may be a server error (5xx). Excluded: importing an image
//! (its body names a path on the daemon's host), the two long polls (the
//! live event stream never ends; a blocking wait holds up to `block_ms`, 5
//! minutes at most) and tar uploads (schemathesis cannot build a tar).
//! Needs the `schemathesis` Python package (`scripts/setup-debian.sh`);
//! fails, never skips, without it.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;

#[test]
fn a_fuzz_of_the_api_from_its_openapi_document_finds_no_server_error() {
    common::require_root();
    let probe = common::run(Command::new("schemathesis").arg("--version").stdin(Stdio::null()));
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "schemathesis is not installed: python3 -m pip install schemathesis, as scripts/setup-debian.sh does ({probe:?})"
    );
    // The fuzz creates dozens of tasks: small disks, so that the host's
    // free space admits them all (a refusal is a 507, which the fuzz would
    // count as a server error).
    let cfg = tempfile::tempdir().unwrap();
    std::fs::write(cfg.path().join("cairn.toml"), "[defaults]\ndisk = \"64M\"\n").unwrap();
    let d = Daemon::start_with(&["--config", cfg.path().join("cairn.toml").to_str().unwrap()]);
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let mut cmd = Command::new("schemathesis");
    cmd.arg("run")
        .arg(format!("{}/v1/openapi.json", d.url))
        .args(["-H", &format!("Authorization: Bearer {}", token.trim())])
        // Deterministic: the same requests each run, so a failure in CI
        // reproduces; longer, random runs are for by hand.
        .args(["--checks", "not_a_server_error", "--max-examples", "10", "--request-timeout", "10", "--workers", "1", "--generation-deterministic"])
        .args(["--exclude-operation-id", "import_image", "--exclude-operation-id", "watch_task", "--exclude-operation-id", "show_wait", "--exclude-operation-id", "copy_in"])
        .env("NO_COLOR", "1")
        .current_dir(d.home())
        .stdin(Stdio::null());
    let out = common::output_within(&mut cmd, Duration::from_secs(900));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "the API fuzz found a server error (or could not run):\n{text}");
    // It ran for real: every phase, over the routes.
    // Every operation of the document but the four left out was tested.
    let tested: usize = text.lines().find_map(|l| l.trim().strip_prefix("Tested: ")).and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no count of tested operations:\n{text}"));
    let total: usize = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Operations:"))
        .and_then(|l| l.split('/').nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of the document's operations:\n{text}"));
    assert_eq!(tested, total - 4, "fewer operations tested than the document has:\n{text}");
    assert!(!text.contains("ST101"), "{text}");
    // What the stateful phase created goes, so the harness finds no leak.
    let tasks: serde_json::Value = d.json(&["task", "list"]);
    for t in tasks.as_array().unwrap() {
        let state = t["state"].as_str().unwrap();
        if state != "destroyed" {
            let id = t["id"].as_str().unwrap();
            d.ok(&["destroy", id]);
        }
    }
}
