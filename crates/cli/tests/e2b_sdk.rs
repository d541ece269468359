//! E2B's own Python SDK (the `e2b` package from PyPI, unmodified) against
//! a real daemon, configured only by `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! `E2B_API_KEY` (a key made with `cairn api-key create`): the pytest file
//! `tests/e2b/test_e2b_sdk.py`. The SDK lives in its own virtual
//! environment (`scripts/setup-debian.sh` makes it at
//! `/opt/cairn-test/e2b`, or `CAIRN_E2B_PYTHON` names its python); the
//! test fails, never skips, when it is missing.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;

fn python() -> String {
    std::env::var("CAIRN_E2B_PYTHON").unwrap_or_else(|_| "/opt/cairn-test/e2b/bin/python".into())
}

fn require_sdk(python: &str) {
    let probe = Command::new(python).args(["-c", "import e2b, pytest, httpx"]).stdin(Stdio::null()).output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("the e2b SDK's environment at {python} lacks a package (run scripts/setup-debian.sh): {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")),
        Err(e) => panic!("no python at {python} ({e}): run scripts/setup-debian.sh, which makes the e2b SDK's environment"),
    }
}

#[test]
fn the_e2b_python_sdk_runs_against_a_daemon() {
    common::require_root();
    let python = python();
    require_sdk(&python);
    let d = Daemon::start();
    let key = d.ok(&["api-key", "create", "e2b-sdk-suite"]).trim().to_owned();
    assert!(key.starts_with("e2b_") && key.len() == 44, "a key in E2B's format: {key}");
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b");
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_e2b_sdk.py"])
        .current_dir(&tests)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("E2B_API_URL", &d.url)
        .env("E2B_SANDBOX_URL", &d.url)
        .env("E2B_API_KEY", &key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .stdin(Stdio::null());
    let out = common::output_within(&mut cmd, Duration::from_secs(600));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "the e2b SDK suite failed:\n{text}");
    let summary = text.lines().rev().find(|l| l.contains(" passed")).unwrap_or_else(|| panic!("no pytest summary:\n{text}"));
    assert!(!summary.contains("skipped") && !summary.contains("failed"), "{summary}");
    let passed: u32 = summary.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    let defined = std::fs::read_to_string(tests.join("test_e2b_sdk.py")).unwrap().lines().filter(|l| l.starts_with("def test_")).count() as u32;
    assert_eq!(passed, defined, "every test of the file ran: {summary}");
    // The key was used, and every sandbox the suite made is gone.
    let keys = d.json(&["api-key", "list"]);
    assert!(keys[0]["last_used_ms"].as_i64().is_some(), "{keys}");
    let tasks = d.json(&["task", "list"]);
    let live: Vec<&serde_json::Value> = tasks.as_array().unwrap().iter().filter(|t| t["state"] != "destroyed").collect();
    assert!(live.is_empty(), "the suite left sandboxes behind: {live:?}");
}

/// The keys themselves: made in E2B's format, listed without the key,
/// refused once revoked; bad names and unknown keys fail in one line.
#[test]
fn api_keys_are_made_listed_and_revoked() {
    let d = Daemon::start();
    let key = d.ok(&["api-key", "create", "ci"]).trim().to_owned();
    assert!(key.starts_with("e2b_") && key[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    let listed = d.ok(&["api-key", "list"]);
    assert!(listed.contains("ci") && !listed.contains(&key), "never the key itself: {listed}");
    let err = d.fails(&["api-key", "create", "ci"]);
    assert!(err.contains("exists already"), "{err}");
    let err = d.fails(&["api-key", "create", "not a name"]);
    assert!(err.contains("invalid API key name"), "{err}");

    let sandboxes = format!("{}/v2/sandboxes", d.url);
    let status = |k: &str| {
        let out = Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-H", &format!("X-API-Key: {k}"), &sandboxes]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status(&key), "200", "control: the key works");
    assert_eq!(status("e2b_0000000000000000000000000000000000000000"), "401");
    d.ok(&["api-key", "revoke", "ci"]);
    assert_eq!(status(&key), "401", "a revoked key is refused");
    let err = d.fails(&["api-key", "revoke", "ci"]);
    assert!(err.contains("no API key named"), "{err}");
}
