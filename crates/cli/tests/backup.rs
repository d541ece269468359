//! `cairn backup` while tasks work, and `cairn restore` into a new home:
//! the restored node has every task, file, snapshot, secret and ledger
//! entry the backup's database had, and every object those snapshots
//! reference (`check --read-data`). Bad backups are refused whole, with
//! the home left without a store.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_blob::moto::Moto;
use cairn_store::testing::postgres::fresh_database;
use common::Daemon;

/// `cairn restore FILE` on `home` (no daemon there); the output.
fn restore(home: &Path, file: &Path) -> std::process::Output {
    common::output_within(std::process::Command::new(common::CAIRN).arg("restore").arg(file).env("CAIRN_HOME", home).stdin(std::process::Stdio::null()), Duration::from_secs(120))
}

fn one_line_error(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "should have failed: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(err.starts_with("cairn: ") && !err.contains('\n'), "want one line starting with 'cairn: ', got {err:?}");
    err
}

#[test]
fn a_backup_made_while_tasks_work_restores_into_a_new_home_whole() {
    let keep = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let file = keep.path().join("node.tar");
    let d = Daemon::start();
    let a = d.create(&["--name", "keeper"]);
    // 48 MiB that does not compress, so that the backup takes a while.
    let (code, sum, err) = d.sh(&a, "head -c 50331648 /dev/urandom > /workspace/data && sha256sum /workspace/data | cut -d' ' -f1");
    assert_eq!(code, 0, "{err}");
    d.ok(&["snapshot", &a, "--note", "the data"]);
    let mut secret = d.cmd();
    secret.args(["secret", "set", "DEPLOY_TOKEN"]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = secret.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"value-0123").unwrap();
    assert!(common::output_of(child, Duration::from_secs(30)).unwrap().status.success());

    // Task b changes and snapshots all through the backup.
    let b = d.create(&["--name", "churner"]);
    let stop = AtomicBool::new(false);
    let churned: Mutex<Vec<(Instant, Instant)>> = Mutex::new(Vec::new());
    let (began, ended) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let start = Instant::now();
                d.ok(&["exec", &b, "--", "sh", "-c", &format!("echo {i} > /workspace/n; head -c 65536 /dev/urandom > /workspace/r{i}")]);
                d.ok(&["snapshot", &b, "--note", &format!("churn {i}")]);
                churned.lock().unwrap().push((start, Instant::now()));
            }
        });
        // Let the churn get going, then back up while it runs.
        while churned.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let began = Instant::now();
        let out = d.ok(&["backup", file.to_str().unwrap()]);
        let ended = Instant::now();
        stop.store(true, Ordering::Relaxed);
        assert!(out.contains("backup of node") && out.contains("2 tasks"), "{out}");
        (began, ended)
    });
    let churned = churned.into_inner().unwrap();
    assert!(
        churned.iter().any(|(s, e)| *s < ended && *e > began),
        "no churn step overlapped the backup ({:?} long): the test did not show a backup made while a task works",
        ended - began
    );
    assert!(!file.with_extension("tar.partial").exists(), "no partial file is left");
    let entries = |verified: &str| -> u64 { verified.split(": ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{verified}")) };
    let backed_up = entries(&d.ok(&["log", &a, "--verify"]));

    // The node is lost: its tasks and its home go.
    d.ok(&["destroy", &a]);
    d.ok(&["destroy", &b]);
    drop(d);

    let restored = Daemon::start_prepared(
        |home| {
            let out = restore(home, &file);
            assert!(out.status.success(), "restore: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("2 tasks") && text.contains("restored node"), "{text}");
        },
        &[],
    );
    let tasks = restored.json(&["task", "list"]);
    assert_eq!(tasks.as_array().unwrap().len(), 2, "{tasks}");
    // The tasks ran when the backup was made: they come back from their
    // latest snapshots, as after a reboot.
    let (code, again, err) = restored.sh(&a, "sha256sum /workspace/data | cut -d' ' -f1");
    assert_eq!((code, again.trim()), (0, sum.trim()), "{err}");
    let (code, n, err) = restored.sh(&b, "cat /workspace/n");
    assert_eq!(code, 0, "{err}");
    assert!(n.trim().parse::<u32>().unwrap() >= 1, "{n}");
    // Every object every snapshot of the copied database references is
    // there and reads back to its id.
    let check = restored.ok(&["check", "--read-data"]);
    assert!(check.contains("no problems"), "{check}");
    for s in restored.json(&["snapshot", "list", &b]).as_array().unwrap() {
        assert!(s["id"].is_string());
    }
    // The ledger verifies under the restored keys, and holds what it held.
    let verified = restored.ok(&["log", &a, "--verify"]);
    assert!(entries(&verified) >= backed_up, "the restored log lost entries: {verified}");
    let secrets = restored.ok(&["secret", "list"]);
    assert!(secrets.contains("DEPLOY_TOKEN"), "{secrets}");
    // A second restore into the same home is refused: it holds a store.
    restored.ok(&["destroy", &a]);
    restored.ok(&["destroy", &b]);
    let err = one_line_error(&restore(restored.home(), &file));
    assert!(err.contains("another cairn daemon is already running"), "{err}");
}

#[test]
fn bad_backups_and_bad_places_are_refused_and_leave_no_store() {
    let keep = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let file = keep.path().join("node.tar");
    let d = Daemon::start();
    let t = d.create(&[]);
    d.sh(&t, "echo x > /workspace/x");
    d.ok(&["snapshot", &t]);
    d.ok(&["backup", file.to_str().unwrap()]);
    // An existing file is never overwritten.
    let before = std::fs::read(&file).unwrap();
    let err = d.fails(&["backup", file.to_str().unwrap()]);
    assert!(err.contains("exists") && err.contains("node.tar"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
    d.ok(&["destroy", &t]);

    // Positive control: the whole file restores into a fresh home.
    let fresh = keep.path().join("fresh");
    let out = restore(&fresh, &file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(fresh.join("cairn.db").is_file());
    // ... and not a second time.
    let err = one_line_error(&restore(&fresh, &file));
    assert!(err.contains("already holds a store"), "{err}");

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("cut short", before[..before.len() / 2].to_vec(), "not whole"),
        ("not a tar", b"just some words, not a tar stream at all".repeat(40), "not whole"),
        ("an object changed", changed_entry(&before, "blobs/packs/"), "differs from its manifest"),
        ("an entry outside", with_extra_entry(&before, "../escaped"), "no file a backup holds"),
        ("a link", with_symlink(&before), "not a plain file"),
    ];
    for (what, bytes, want) in cases {
        let bad = keep.path().join(format!("{}.tar", what.replace(' ', "-")));
        std::fs::write(&bad, &bytes).unwrap();
        let home = keep.path().join(format!("home-{}", what.replace(' ', "-")));
        let err = one_line_error(&restore(&home, &bad));
        assert!(err.contains(want), "{what}: {err}");
        assert!(!home.join("cairn.db").exists(), "{what}: a refused restore leaves no store");
        assert!(!keep.path().join("escaped").exists() && !home.parent().unwrap().join("escaped").exists(), "{what}");
        let left: Vec<_> = std::fs::read_dir(&home).unwrap().filter_map(Result::ok).map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with("restore-")).collect();
        assert!(left.is_empty(), "{what}: the staging directory is removed: {left:?}");
    }
    let err = one_line_error(&restore(&keep.path().join("home-none"), &keep.path().join("absent.tar")));
    assert!(err.contains("absent.tar"), "{err}");
}

#[test]
fn a_node_on_a_shared_store_says_what_backs_it_up() {
    let moto = Moto::shared();
    let bucket = format!("cairn-backup-{}", std::process::id());
    moto.create_bucket(&bucket);
    let db = fresh_database();
    let blob = format!("s3://{bucket}/blobs");
    let env = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = Daemon::start_with_env(&["--store", db.url.as_str(), "--blob", blob.as_str(), "--node", "node-a"], &env);
    let keep = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let file = keep.path().join("node.tar");
    let err = d.fails(&["backup", file.to_str().unwrap()]);
    assert!(err.contains("its own tools") && err.contains("docs/operations.md"), "{err}");
    assert!(!file.exists() && !keep.path().join("node.tar.partial").exists());
    // Positive control: the same daemon answers other calls.
    d.ok(&["task", "list"]);
    drop(d);
}

/// The backup with the first byte of the first entry under `prefix` changed
/// (the tar's header checksums stay right; the manifest's digest does not).
fn changed_entry(tar_bytes: &[u8], prefix: &str) -> Vec<u8> {
    let mut out = tar_bytes.to_vec();
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.path().unwrap().to_string_lossy().starts_with(prefix) {
            let at = entry.raw_file_position() as usize;
            out[at] ^= 0xff;
            return out;
        }
    }
    panic!("no entry under {prefix}");
}

/// The backup with an entry named `name` added before its manifest.
fn with_extra_entry(tar_bytes: &[u8], name: &str) -> Vec<u8> {
    rebuild(tar_bytes, |b| {
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        // Set the name's bytes as they are: the tar crate refuses `..` in
        // names it writes, a hostile backup would not.
        let raw = h.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, &b"bad"[..]).unwrap();
    })
}

/// The backup with a symbolic link `keys/evil` to `/etc` added.
fn with_symlink(tar_bytes: &[u8]) -> Vec<u8> {
    rebuild(tar_bytes, |b| {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, "keys/evil", "/etc").unwrap();
    })
}

/// Every entry of the backup but its manifest, then what `add` adds, then
/// the manifest.
fn rebuild(tar_bytes: &[u8], add: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut manifest = None;
    let mut archive = tar::Archive::new(tar_bytes);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        let header = entry.header().clone();
        if entry.path().unwrap().to_string_lossy() == "cairn-backup.json" {
            manifest = Some((header, data));
        } else {
            b.append(&header, data.as_slice()).unwrap();
        }
    }
    add(&mut b);
    let (h, data) = manifest.unwrap();
    b.append(&h, data.as_slice()).unwrap();
    b.into_inner().unwrap()
}
