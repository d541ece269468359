//! Delivery end to end: a task makes files in a git repository in its
//! workspace; a patch, an archive, a report and a file are delivered with a
//! signed record; `cairn verify` passes, and fails naming what differs when
//! one byte of the record or of any deliverable changes, a deliverable is
//! replaced, the record is checked against another key, or the ledger is
//! edited behind the daemon's back. A ledger that cannot be checked (no
//! daemon, or one that does not know the task) fails too, unless
//! `--offline` skips it on purpose. The record also verifies with Python's
//! securesystemslib (DSSE) and in-toto-attestation (the statement), which
//! Cairn's authors did not write. `--complete` leaves nothing on the host.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Command;

use common::Daemon;
use serde_json::Value;

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

const WORK: &str = "set -e; cd /workspace; git init -q; git config user.email dev@example.com; git config user.name dev;
printf 'line 1\\nline 2\\n' > app.txt; git add app.txt; git commit -qm init;
printf 'line 1\\nline 2 changed\\n' > app.txt; echo 'brand new' > added.txt;
mkdir -p out/sub; echo 'a,b' > out/data.csv; echo deep > out/sub/x.txt; printf '# Report\\nall green\\n' > report.md";

fn verify(d: &Daemon, args: &[&str]) -> (bool, String, String) {
    let mut a = vec!["verify"];
    a.extend_from_slice(args);
    let out = d.cairn(&a);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).trim().to_owned())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_delivery_verifies_and_every_change_is_named() {
    let d = Daemon::start();
    let id = d.create(&["--name", "builder"]);
    must(&d, &id, WORK);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("delivered");
    let v = d.json(&[
        "deliver", &id, "--patch", "--archive", "/workspace/out", "--report", "/workspace/report.md", "--file", "/workspace/app.txt", "--out",
        out.to_str().unwrap(),
    ]);
    let names: Vec<&str> = v["deliverables"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["workspace.patch", "app.txt", "report.md", "out.tar.zst"]);
    for n in names.iter().chain(["record.json"].iter()) {
        assert!(out.join(n).is_file(), "{n} written to --out");
    }
    for x in v["deliverables"].as_array().unwrap() {
        assert_eq!(sha256(&std::fs::read(out.join(x["name"].as_str().unwrap())).unwrap()), x["sha256"].as_str().unwrap());
    }

    // The patch is git's and applies to the original commit.
    let patch = std::fs::read_to_string(out.join("workspace.patch")).unwrap();
    assert!(patch.contains("-line 2\n+line 2 changed") && patch.contains("+brand new") && patch.contains("b/added.txt"), "{patch}");
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("app.txt"), "line 1\nline 2\n").unwrap();
    let applied = common::run(Command::new("git").args(["apply", out.join("workspace.patch").to_str().unwrap()]).current_dir(&repo)).unwrap().status;
    assert!(applied.success());
    assert_eq!(std::fs::read_to_string(repo.join("app.txt")).unwrap(), "line 1\nline 2 changed\n");
    assert_eq!(std::fs::read_to_string(repo.join("added.txt")).unwrap(), "brand new\n");
    // The archive holds the directory.
    let mut tar = Vec::new();
    zstd::Decoder::new(std::fs::File::open(out.join("out.tar.zst")).unwrap()).unwrap().read_to_end(&mut tar).unwrap();
    let mut entries: Vec<String> =
        tar::Archive::new(tar.as_slice()).entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
    entries.sort();
    assert_eq!(entries, ["out", "out/data.csv", "out/sub", "out/sub/x.txt"]);

    // Positive controls: the record verifies with the daemon's keys and
    // with the public key given explicitly.
    let record = out.join("record.json");
    let (ok, text, err) = verify(&d, &[record.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(text.contains("verified") && text.contains("ledger of"), "{text}");
    let key = d.json(&["key", "show"]);
    let hex = key["public_key"].as_str().or(key[0]["public_key"].as_str()).unwrap().to_owned();
    assert!(verify(&d, &[record.to_str().unwrap(), "--key", &hex]).0);

    // One byte changed in each deliverable, in turn.
    for name in ["workspace.patch", "app.txt", "report.md", "out.tar.zst"] {
        let copy = dir.path().join(format!("t-{name}"));
        copy_dir(&out, &copy);
        let mut bytes = std::fs::read(copy.join(name)).unwrap();
        bytes[0] ^= 1;
        std::fs::write(copy.join(name), bytes).unwrap();
        let (ok, _, err) = verify(&d, &[copy.join("record.json").to_str().unwrap()]);
        assert!(!ok && err.contains(&format!("deliverable {name}")) && err.contains("does not match"), "{name}: {err}");
    }
    // A deliverable replaced by another file.
    let copy = dir.path().join("replaced");
    copy_dir(&out, &copy);
    std::fs::copy(copy.join("report.md"), copy.join("app.txt")).unwrap();
    let (ok, _, err) = verify(&d, &[copy.join("record.json").to_str().unwrap()]);
    assert!(!ok && err.contains("deliverable app.txt"), "{err}");
    // A deliverable missing next to the record comes from the store.
    std::fs::copy(out.join("app.txt"), copy.join("app.txt")).unwrap();
    std::fs::remove_file(copy.join("out.tar.zst")).unwrap();
    let (ok, text, err) = verify(&d, &[copy.join("record.json").to_str().unwrap()]);
    assert!(ok && text.contains("from the store"), "{text}{err}");
    // One byte of the record: in the signed payload, and in the signature.
    let rec = std::fs::read_to_string(&record).unwrap();
    let env: Value = serde_json::from_str(&rec).unwrap();
    for field in ["payload", "sig"] {
        let value = if field == "payload" { env["payload"].as_str().unwrap() } else { env["signatures"][0]["sig"].as_str().unwrap() };
        let pos = value.len() / 2;
        let flipped_char = if &value[pos..pos + 1] == "A" { "B" } else { "A" };
        let edited = rec.replacen(value, &format!("{}{}{}", &value[..pos], flipped_char, &value[pos + 1..]), 1);
        let path = dir.path().join(format!("edited-{field}.json"));
        std::fs::write(&path, edited).unwrap();
        copy_dir(&out, &dir.path().join("edited"));
        let target = dir.path().join("edited").join("record.json");
        std::fs::copy(&path, &target).unwrap();
        let (ok, _, err) = verify(&d, &[target.to_str().unwrap()]);
        assert!(!ok && err.contains("signature"), "{field}: {err}");
    }
    let path = dir.path().join("garbled.json");
    std::fs::write(&path, &rec[1..]).unwrap();
    let (ok, _, err) = verify(&d, &[path.to_str().unwrap()]);
    assert!(!ok && err.contains("not a delivery record"), "{err}");

    // Another key: after a rotation, the old record still verifies with the
    // daemon's keys but not with only the new key; a new record is signed
    // with the new key and not accepted with only the old one.
    d.ok(&["key", "rotate"]);
    let key2 = d.json(&["key", "show"]);
    let hex2 = key2["public_key"].as_str().or(key2[0]["public_key"].as_str()).unwrap().to_owned();
    assert_ne!(hex, hex2);
    assert!(verify(&d, &[record.to_str().unwrap()]).0, "old records verify after a rotation");
    let (ok, _, err) = verify(&d, &[record.to_str().unwrap(), "--key", &hex2]);
    assert!(!ok && err.contains("signature"), "{err}");
    let out2 = dir.path().join("second");
    d.json(&["deliver", &id, "--file", "/workspace/report.md", "--out", out2.to_str().unwrap()]);
    assert!(verify(&d, &[out2.join("record.json").to_str().unwrap(), "--key", &hex2]).0);
    let (ok, _, err) = verify(&d, &[out2.join("record.json").to_str().unwrap(), "--key", &hex]);
    assert!(!ok && err.contains("signature"), "{err}");

    // Python's reference implementations accept the record.
    let py = common::run(Command::new("python3").arg("-c").arg(PYTHON_CHECK).arg(&record).arg(&out).arg(&hex)).unwrap();
    assert!(py.status.success(), "python verification failed: {}{}", String::from_utf8_lossy(&py.stdout), String::from_utf8_lossy(&py.stderr));
    assert!(String::from_utf8_lossy(&py.stdout).contains("4 subjects match"), "{}", String::from_utf8_lossy(&py.stdout));

    // A ledger row edited in SQLite behind the daemon's back.
    let db = d.home().join("cairn.db");
    let edit = common::run(Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.execute('DROP TRIGGER IF EXISTS events_no_update')\nc.execute(\"UPDATE events SET actor = 'mallory' WHERE task_id = ? AND seq = 2\", (sys.argv[2],))\nc.commit()")
        .arg(&db)
        .arg(&id))
        .unwrap()
        .status;
    assert!(edit.success());
    let (ok, _, err) = verify(&d, &[record.to_str().unwrap()]);
    assert!(!ok && err.contains("ledger of") && err.contains("entry 2"), "{err}");
    d.ok(&["destroy", &id]);
}

const PYTHON_CHECK: &str = r#"
import hashlib, json, os, sys
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

record, out, public = sys.argv[1], sys.argv[2], sys.argv[3]
env = Envelope.from_dict(json.load(open(record)))
keyid = env.signatures and next(iter(env.signatures))
key = SSlibKey(keyid, "ed25519", "ed25519", {"public": public})
env.verify([key], 1)
assert env.payload_type == "application/vnd.in-toto+json", env.payload_type
pb = json_format.Parse(env.payload, statement_pb2.Statement())
Statement.copy_from_pb(pb).validate()
stmt = json.loads(env.payload)
n = 0
for s in stmt["subject"]:
    digest = hashlib.sha256(open(os.path.join(out, s["name"]), "rb").read()).hexdigest()
    assert digest == s["digest"]["sha256"], s
    n += 1
print(n, "subjects match")
"#;

#[test]
fn complete_tears_everything_down_and_keeps_the_records() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "echo result > /workspace/result.txt; echo changed >> /etc/motd");
    d.ok(&["snapshot", &id, "--kind", "milestone", "--note", "done"]);
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    let netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert!(net_holders(&netns).contains(&pid.to_string()), "positive control: the init holds it");
    // No repository in the working directory: the patch is the writable
    // layer against the base image.
    let v = d.json(&["deliver", &id, "--patch", "--file", "/workspace/result.txt", "--complete"]);
    assert_eq!(v["completed"], true);
    let patch_sha = v["deliverables"][0]["sha256"].as_str().unwrap().to_owned();
    let t = d.task(&id);
    assert_eq!((t["state"].as_str(), t["sandbox"].as_str()), (Some("completed"), Some("none")));
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new(), "no process, mount, cgroup, loop device or scratch directory remains");
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let holders = net_holders(&netns);
    assert!(holders.is_empty(), "no process holds the sandbox's network namespace {netns:?}: {holders:?}");
    // Records stay: the log (with its chain), snapshots kept by retention,
    // the deliverables.
    d.ok(&["log", &id, "--verify"]);
    let log = d.json(&["log", &id]);
    let kinds: Vec<&str> = log.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.ends_with(&["delivery", "complete"]), "{kinds:?}");
    assert_eq!(d.json(&["snapshot", "list", &id]).as_array().unwrap().len(), 1, "the milestone is kept");
    let out = dir_with_record(&d, &id);
    let (ok, text, err) = verify(&d, &[out.path().join("record.json").to_str().unwrap()]);
    assert!(ok && text.contains("from the store"), "{text}{err}");
    let patch = String::from_utf8(fetch(&d, &format!("/v1/deliverables/{patch_sha}"))).unwrap();
    assert!(patch.contains("+++ b/workspace/result.txt") && patch.contains("+changed") && patch.contains("a/etc/motd"), "{patch}");
    // gc keeps what a record names and removes, after the grace period,
    // a deliverable no record names (a delivery cut short).
    let orphan = "ab".repeat(32);
    let dir = d.home().join("blobs/deliverables/ab");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&orphan), "left behind").unwrap();
    let young = d.json(&["gc"]);
    assert_eq!(young["orphan_deliverables"], serde_json::json!([]), "young orphans stay");
    assert!(common::run(Command::new("touch").args(["-d", "2 hours ago"]).arg(dir.join(&orphan))).unwrap().status.success());
    let dry = d.json(&["gc", "--dry-run"]);
    assert_eq!(dry["orphan_deliverables"], serde_json::json!([orphan]));
    assert!(dir.join(&orphan).exists());
    assert!(d.ok(&["gc"]).contains(&format!("deleted deliverable {orphan}")));
    assert!(!dir.join(&orphan).exists());
    let (ok, _, err) = verify(&d, &[out.path().join("record.json").to_str().unwrap()]);
    assert!(ok, "what the record names stays: {err}");
    // A completed task takes no more commands or deliveries.
    let err = d.fails(&["exec", &id, "--", "true"]);
    assert!(err.contains("completed"), "{err}");
    let err = d.fails(&["deliver", &id, "--file", "/workspace/result.txt"]);
    assert!(err.contains("completed"), "{err}");
    let err = d.fails(&["task", "complete", &id]);
    assert!(err.contains("completed"), "{err}");
}

#[test]
fn verify_fails_when_the_ledger_cannot_be_checked_unless_offline() {
    let mut d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "echo result > /workspace/result.txt");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("delivered");
    d.json(&["deliver", &id, "--file", "/workspace/result.txt", "--out", out.to_str().unwrap(), "--complete"]);
    let record = out.join("record.json");
    let rec = record.to_str().unwrap();
    let key = d.json(&["key", "show"]);
    let hex = key["public_key"].as_str().or(key[0]["public_key"].as_str()).unwrap().to_owned();
    let keys_file = dir.path().join("node-keys.json");
    std::fs::write(&keys_file, serde_json::to_string(&key).unwrap()).unwrap();
    let keys_file = keys_file.to_str().unwrap();

    // Positive control: with the daemon, the ledger is checked.
    let text = d.ok(&["verify", rec]);
    assert!(text.contains("verified") && !text.contains("NOT verified") && text.contains(&format!("ledger of {id} checked")), "{text}");
    let v = d.json(&["verify", rec, "--key", &hex]);
    assert_eq!((&v["verified"], &v["ledger"]["checked"], &v["ledger"]["result"]), (&Value::from(true), &Value::from(true), &Value::from("ledger checked")));

    // A daemon that answers an error: another node, which does not know
    // the task. The signature (with --key) and the digests still verify.
    {
        let other = Daemon::start();
        let err = other.fails(&["verify", rec, "--key", &hex]);
        assert!(err.contains(&format!("ledger of {id} could not be checked")) && err.contains(&id) && err.contains("--offline"), "{err}");
        let o = other.cairn(&["verify", rec, "--key", &hex]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(!o.status.success() && text.contains("NOT verified") && text.contains("result.txt matches"), "{text}");
        let o = other.cairn(&["--json", "verify", rec, "--key", keys_file]);
        assert!(!o.status.success());
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!((&v["verified"], &v["ledger"]["checked"]), (&Value::from(false), &Value::from(false)), "{v}");
        // Without --key the other node's keys do not sign the record.
        let err = other.fails(&["verify", rec]);
        assert!(err.contains("signature"), "{err}");
        // --offline asks no daemon, so the other one does not matter.
        let text = other.ok(&["verify", rec, "--offline", "--key", &hex]);
        assert!(text.contains("ledger not checked (--offline)"), "{text}");
    }

    // No daemon: stopped (its url is still in the home) ...
    d.kill();
    let err = d.fails(&["verify", rec, "--key", &hex]);
    assert!(err.contains(&format!("ledger of {id} could not be checked")) && err.contains("daemon not running"), "{err}");
    let o = d.cairn(&["verify", rec, "--key", &hex]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("NOT verified") && text.contains("result.txt matches"), "what was checked is still printed: {text}");
    let err = d.fails(&["verify", rec]);
    assert!(err.contains("signature") && err.contains("--key"), "{err}");
    // ... or never started in this home.
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = d.cmd();
    cmd.env("CAIRN_HOME", empty.path()).args(["verify", rec, "--key", &hex]).stdin(std::process::Stdio::null());
    let o = common::output_within(&mut cmd, common::CALL_DEADLINE);
    let err = String::from_utf8_lossy(&o.stderr).trim().to_owned();
    assert!(!o.status.success() && err.starts_with("cairn: ") && !err.contains('\n'), "{err}");
    assert!(err.contains("ledger of") && err.contains("could not be checked") && err.contains("daemon not running"), "{err}");

    // --offline: the ledger is skipped on purpose and the exit code is the
    // signature's and the digests'.
    let text = d.ok(&["verify", rec, "--offline", "--key", &hex]);
    assert!(text.contains("verified") && !text.contains("NOT verified") && text.contains("ledger not checked (--offline)"), "{text}");
    let v = d.json(&["verify", rec, "--offline", "--key", keys_file]);
    assert_eq!((&v["verified"], &v["ledger"]["checked"]), (&Value::from(true), &Value::from(false)), "{v}");
    assert_eq!(v["ledger"]["result"], "ledger not checked (--offline)");
    let err = d.fails(&["verify", rec, "--offline"]);
    assert!(err.contains("--offline needs --key"), "{err}");
    let copy = dir.path().join("edited");
    copy_dir(&out, &copy);
    std::fs::write(copy.join("result.txt"), "edited\n").unwrap();
    let err = d.fails(&["verify", copy.join("record.json").to_str().unwrap(), "--offline", "--key", &hex]);
    assert!(err.contains("deliverable result.txt") && err.contains("does not match"), "{err}");
    std::fs::remove_file(copy.join("result.txt")).unwrap();
    let err = d.fails(&["verify", copy.join("record.json").to_str().unwrap(), "--offline", "--key", &hex]);
    assert!(err.contains("deliverable result.txt") && err.contains("--offline"), "{err}");

    // The daemon back: checked again.
    d.spawn(&[]);
    let text = d.ok(&["verify", rec]);
    assert!(text.contains(&format!("ledger of {id} checked")), "{text}");
}

/// Processes whose network namespace is `ns`.
fn net_holders(ns: &Path) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path().join("ns/net")).ok().as_deref() == Some(ns))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The record of the task's last delivery, alone in a new directory.
fn dir_with_record(d: &Daemon, id: &str) -> tempfile::TempDir {
    let log = d.json(&["log", id]);
    let rec = log.as_array().unwrap().iter().rev().find(|e| e["kind"] == "delivery").unwrap()["args"]["record_id"].as_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("record.json"), fetch(d, &format!("/v1/records/{rec}"))).unwrap();
    dir
}

fn fetch(d: &Daemon, path: &str) -> Vec<u8> {
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let out = common::run(Command::new("curl").args(["-sf", "-H", &format!("Authorization: Bearer {}", token.trim()), &format!("{}{path}", d.url)])).unwrap();
    assert!(out.status.success(), "GET {path}");
    out.stdout
}

#[test]
fn bad_deliveries_are_refused_with_one_line() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "echo ok > /workspace/ok.txt; ln -s /etc/hostname /workspace/link; mkdir -p /workspace/dir");
    for (args, want) in [
        (vec!["--file", "/workspace/missing.txt"], "missing.txt"),
        (vec!["--file", "../../../../etc/passwd"], "leaves the sandbox root"),
        (vec!["--file", "/workspace/link"], "link"),
        (vec!["--file", "/workspace/dir"], "not a regular file"),
        (vec!["--archive", "/workspace/ok.txt"], "not a directory"),
        (vec!["--report", "/nope/report.md"], "report"),
        (vec![], "nothing to deliver"),
        (vec!["--file", "/workspace/ok.txt", "--file", "/workspace/ok.txt"], "two deliverables"),
    ] {
        let mut a = vec!["deliver", id.as_str()];
        a.extend(args.iter().copied());
        let err = d.fails(&a);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), "taken").unwrap();
    let err = d.fails(&["deliver", &id, "--file", "/workspace/ok.txt", "--out", dir.path().to_str().unwrap()]);
    assert!(err.contains("not empty"), "{err}");
    let log = d.json(&["log", &id]);
    assert!(!log.as_array().unwrap().iter().any(|e| e["kind"] == "delivery"), "no delivery was recorded");
    let err = d.fails(&["verify", "/nonexistent/record.json"]);
    assert!(err.contains("cannot read record"), "{err}");
    d.ok(&["destroy", &id]);
}
