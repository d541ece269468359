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
    let probe = common::run(Command::new(python).args(["-c", "import e2b, pytest, httpx"]).stdin(Stdio::null()));
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("the e2b SDK's environment at {python} lacks a package (run scripts/setup-debian.sh): {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")),
        Err(e) => panic!("no python at {python} ({e}): run scripts/setup-debian.sh, which makes the e2b SDK's environment"),
    }
}

/// Points an E2B SDK's process at daemon `d` with `key`: the three
/// variables and nothing else of E2B's.
fn at_daemon<'a>(cmd: &'a mut Command, d: &Daemon, key: &str) -> &'a mut Command {
    cmd.env("E2B_API_URL", &d.url).env("E2B_SANDBOX_URL", &d.url).env("E2B_API_KEY", key).env_remove("E2B_DOMAIN").env_remove("E2B_DEBUG").stdin(Stdio::null())
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
    at_daemon(&mut cmd, &d, &key).args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_e2b_sdk.py"]).current_dir(&tests).env("PYTHONDONTWRITEBYTECODE", "1");
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

/// E2B's JavaScript SDK (the `e2b` package from npm, installed by
/// `scripts/setup-debian.sh` at `/opt/cairn-test/e2b-js`, or where
/// `CAIRN_E2B_JS` says) runs `tests/e2b/e2b_sdk.test.mjs` with node's test
/// runner against a daemon.
#[test]
fn the_e2b_javascript_sdk_runs_against_a_daemon() {
    common::require_root();
    let sdk = PathBuf::from(std::env::var("CAIRN_E2B_JS").unwrap_or_else(|_| "/opt/cairn-test/e2b-js".into()));
    let modules = sdk.join("node_modules");
    assert!(modules.join("e2b").is_dir(), "no e2b npm package under {}: run scripts/setup-debian.sh", modules.display());
    let node = common::run(Command::new("node").arg("--version")).unwrap_or_else(|e| panic!("node is not installed ({e}): run scripts/setup-debian.sh"));
    assert!(node.status.success(), "node --version failed");
    // The test file beside the package's modules, so that its import finds them.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e2b_sdk.test.mjs");
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/e2b_sdk.test.mjs"), &file).unwrap();
    std::os::unix::fs::symlink(&modules, dir.path().join("node_modules")).unwrap();
    let d = Daemon::start();
    let key = d.ok(&["api-key", "create", "e2b-js-suite"]).trim().to_owned();
    let mut cmd = Command::new("node");
    at_daemon(&mut cmd, &d, &key).args(["--test", "--test-reporter=tap"]).arg(&file).current_dir(dir.path());
    let out = common::output_within(&mut cmd, Duration::from_secs(600));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "the e2b JavaScript SDK suite failed:\n{text}");
    let count = |prefix: &str| text.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|n| n.trim().parse::<u32>().ok());
    let defined = std::fs::read_to_string(&file).unwrap().lines().filter(|l| l.starts_with("test(")).count() as u32;
    assert_eq!((count("# pass "), count("# fail "), count("# skipped ")), (Some(defined), Some(0), Some(0)), "every test of the file passed:\n{text}");
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
        let out = common::run(Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "-H", &format!("X-API-Key: {k}"), &sandboxes])).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status(&key), "200", "control: the key works");
    let health = common::run(Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", &format!("{}/health", d.url)])).unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout), "204", "E2B's health check takes no key");
    assert_eq!(status("e2b_0000000000000000000000000000000000000000"), "401");
    d.ok(&["api-key", "revoke", "ci"]);
    assert_eq!(status(&key), "401", "a revoked key is refused");
    let err = d.fails(&["api-key", "revoke", "ci"]);
    assert!(err.contains("no API key named"), "{err}");
}

/// An upload larger than the task's disk: the sandbox's own ENOSPC, a 507
/// in E2B's shape, the task and the daemon fine afterwards.
#[test]
fn an_upload_larger_than_the_tasks_disk_is_refused_with_507() {
    let d = Daemon::start();
    let key = d.ok(&["api-key", "create", "upload"]).trim().to_owned();
    let t = d.create(&["--disk", "64M"]);
    let detail = common::run(Command::new("curl").args(["-s", "--max-time", "10", "-H", &format!("X-API-Key: {key}"), &format!("{}/sandboxes/{t}", d.url)])).unwrap();
    let detail: serde_json::Value = serde_json::from_slice(&detail.stdout).unwrap();
    let token = detail["envdAccessToken"].as_str().unwrap_or_else(|| panic!("no access token: {detail}"));
    let big = tempfile::NamedTempFile::new().unwrap();
    big.as_file().set_len(96 << 20).unwrap();
    let out = common::run(Command::new("curl")
        .args(["-s", "--max-time", "120", "-w", "\n%{http_code}", "-H", &format!("E2b-Sandbox-Id: {t}"), "-H", &format!("X-Access-Token: {token}")])
        .args(["-H", "Content-Type: application/octet-stream", "--data-binary"])
        .arg(format!("@{}", big.path().display()))
        .arg(format!("{}/files?path=/workspace/too-big.bin", d.url)))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap();
    assert_eq!(status, "507", "{text}");
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["code"], 507, "{body}");
    assert!(body["message"].as_str().unwrap().contains("No space left"), "{body}");
    // The task goes on: its space back, a command runs.
    let (code, out, err) = d.sh(&t, "rm -f /workspace/too-big.bin && echo fine");
    assert_eq!((code, out.as_str()), (0, "fine\n"), "{err}");
    d.ok(&["destroy", &t]);
}
