//! Secrets from the CLI against a real daemon: a value goes in from stdin
//! or a file, never from an argument; no command, route or log gives it
//! back, and no file of the daemon's home holds it in the clear (the store
//! keeps it sealed under `secrets.key`, 0600).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use common::Daemon;

/// Runs `cairn secret set NAME` with `value` on stdin.
fn set_from_stdin(d: &Daemon, name: &str, value: &[u8]) -> std::process::Output {
    let mut child = d.cmd().args(["secret", "set", name]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(value).unwrap();
    common::output_of(child, common::CALL_DEADLINE).unwrap()
}

/// Every file under `dir` whose bytes contain `needle`, but for what holds
/// sandboxes and images (`run/` binds the host's directories into a
/// prestarted sandbox; `disks/` and `images/` hold their trees): the
/// database, its journal, the log, the keys and the blobs are all read.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() && ["run", "disks", "images", "home-mount"].contains(&entry.file_name().to_string_lossy().as_ref()) {
            continue;
        }
        if kind.is_dir() {
            found.extend(files_holding(&entry.path(), needle));
        } else if kind.is_file() {
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(entry.path().display().to_string());
            }
        }
    }
    found
}

#[test]
fn secrets_are_set_from_stdin_or_a_file_listed_without_values_and_removed() {
    let d = Daemon::start();
    let value = b"ghp_cairnsuite0123456789secretvalue";
    let out = set_from_stdin(&d, "GITHUB_TOKEN", &[value.as_slice(), b"\n"].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "set GITHUB_TOKEN");
    let file = d.home().join("model-key.txt");
    std::fs::write(&file, "sk-cairnsuite-model-key").unwrap();
    d.ok(&["secret", "set", "MODEL_KEY", "--file", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();

    let listed = d.json(&["secret", "list"]);
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["GITHUB_TOKEN", "MODEL_KEY"], "{listed}");
    assert_eq!(listed[0]["uses"], 0);
    assert!(listed[0]["last_used_ms"].is_null());
    let table = d.ok(&["secret", "list"]);
    assert!(table.contains("GITHUB_TOKEN") && table.contains("never"), "{table}");
    // A new value keeps the secret's creation time.
    let created = listed[0]["created_ms"].as_i64().unwrap();
    assert!(set_from_stdin(&d, "GITHUB_TOKEN", value).status.success());
    assert_eq!(d.json(&["secret", "list"])[0]["created_ms"].as_i64(), Some(created));

    // No answer, no log line and no file of the home holds a value.
    let everything = format!("{listed}{table}{}", d.log());
    assert!(!everything.contains("cairnsuite"), "a value showed: {everything}");
    let stored = files_holding(d.home(), b"cairnsuite");
    assert!(stored.is_empty(), "a value is in the clear in {stored:?}");
    // Positive control: the finder finds what is there.
    assert!(!files_holding(d.home(), b"GITHUB_TOKEN").is_empty(), "the name is stored");
    let key = d.home().join("secrets.key");
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);

    // Bad input: one line each, nothing stored.
    let err = d.fails(&["secret", "set", "9LIVES", "--file", "/dev/null"]);
    assert!(err.contains("empty"), "{err}");
    let out = set_from_stdin(&d, "bad-name", b"x");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("invalid secret name") && err.trim().lines().count() == 1, "{err}");
    let out = set_from_stdin(&d, "HUGE", &vec![b'x'; 65 << 10]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("at most 65536"), "{}", String::from_utf8_lossy(&out.stderr));
    let err = d.fails(&["secret", "set", "MISSING_FILE", "--file", "/nonexistent/value"]);
    assert!(err.contains("/nonexistent/value"), "{err}");
    assert_eq!(d.json(&["secret", "list"]).as_array().unwrap().len(), 2, "a refused value is not stored");

    d.ok(&["secret", "rm", "MODEL_KEY"]);
    let err = d.fails(&["secret", "rm", "MODEL_KEY"]);
    assert!(err.contains("no secret named"), "{err}");
    assert_eq!(d.json(&["secret", "list"]).as_array().unwrap().len(), 1);
}
