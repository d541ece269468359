//! The Python SDK (`sdk/python`) against a real daemon: its pytest suite
//! runs with `CAIRN_URL` and `CAIRN_TOKEN` naming a daemon this test
//! starts, importing the SDK from this checkout. Needs python3 with
//! pytest, httpx, cryptography and standardwebhooks
//! (`scripts/setup-debian.sh` installs them with `pip install
//! ./sdk/python[test]`); it fails, never skips, when one is missing.
//! Also checks that the SDK's blocking client is what `scripts/unasync.py`
//! generates from the asyncio one.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn sdk_dir() -> PathBuf {
    repo_root().join("sdk/python")
}

/// The suite's tests, all of which must pass: a lower bar would let tests
/// that stop being collected go unnoticed. Update it with the suite.
const SDK_TESTS: u32 = 30;

fn require_python_packages() {
    let probe = common::run(Command::new("python3").args(["-c", "import pytest, httpx, cryptography, standardwebhooks"]).stdin(Stdio::null()));
    match probe {
        Err(e) => panic!("python3 is not installed ({e}): run scripts/setup-debian.sh"),
        Ok(o) if !o.status.success() => panic!(
            "a Python package the SDK tests need is missing: python3 -m pip install './sdk/python[test]' standardwebhooks, as scripts/setup-debian.sh does: {}",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        ),
        Ok(_) => {}
    }
}

#[test]
fn the_python_sdk_suite_passes_against_a_real_daemon() {
    common::require_root();
    require_python_packages();
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let sdk = sdk_dir();
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(sdk.join("tests"))
        .current_dir(&sdk)
        .env("PYTHONPATH", sdk.join("src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("CAIRN_URL", &d.url)
        .env("CAIRN_TOKEN", token.trim())
        .env_remove("CAIRN_HOME")
        .stdin(Stdio::null());
    let out = common::output_within(&mut cmd, Duration::from_secs(600));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "the SDK's tests failed:\n{text}");
    // The suite ran for real: its summary counts passes and no skips.
    let summary = text.lines().rev().find(|l| l.contains(" passed")).unwrap_or_else(|| panic!("no pytest summary:\n{text}"));
    assert!(!summary.contains("skipped") && !summary.contains("failed"), "{summary}");
    let passed: u32 = summary.split_whitespace().find_map(|w| w.parse().ok()).unwrap();
    assert_eq!(passed, SDK_TESTS, "{passed} SDK tests passed, the suite has {SDK_TESTS}: {summary}");
    // Every task the suite made, it destroyed.
    let tasks: serde_json::Value = d.json(&["task", "list"]);
    let live: Vec<&serde_json::Value> = tasks.as_array().unwrap().iter().filter(|t| t["state"] != "destroyed").collect();
    assert!(live.is_empty(), "the SDK suite left tasks behind: {live:?}");
}

/// `scripts/unasync.py --check` with `--root DIR`.
fn unasync_check(root: &Path) -> std::process::Output {
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("scripts/unasync.py")).args(["--check", "--root"]).arg(root).env("PYTHONDONTWRITEBYTECODE", "1").stdin(Stdio::null());
    common::output_within(&mut cmd, Duration::from_secs(60))
}

#[test]
fn the_blocking_client_is_what_unasync_generates_from_the_async_one() {
    let root = repo_root();
    let out = unasync_check(&root);
    assert!(out.status.success(), "_sync.py is stale: {}", String::from_utf8_lossy(&out.stderr));
    // The check can fail: a copy whose _sync.py has one line changed.
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path().join("sdk/python/src/cairn");
    std::fs::create_dir_all(&dir).unwrap();
    let src = root.join("sdk/python/src/cairn");
    std::fs::copy(src.join("_async.py"), dir.join("_async.py")).unwrap();
    let sync = std::fs::read_to_string(src.join("_sync.py")).unwrap();
    let edited = sync.replacen("def close(self)", "def close_(self)", 1);
    assert_ne!(edited, sync);
    std::fs::write(dir.join("_sync.py"), &edited).unwrap();
    let out = unasync_check(copy.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("_sync.py") && err.lines().count() == 1, "{err}");
    // Positive control: the unchanged file passes in the copy too.
    std::fs::write(dir.join("_sync.py"), &sync).unwrap();
    assert!(unasync_check(copy.path()).status.success());
}
