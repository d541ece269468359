//! The daemon on a full disk (docs/security.md, "Disk space"): its task
//! database and blob store on a small filesystem of their own that the test
//! fills. A snapshot, an event's intake and a suspend then fail with one
//! line and change nothing; once there is room again, the same daemon,
//! without a restart, creates, runs, snapshots, suspends and destroys, and
//! everything acknowledged before is there. Needs root.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::Daemon;

/// A tmpfs of its own, unmounted when dropped (also when the test fails).
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn new(size: &str) -> SmallFs {
        common::require_root();
        let dir = tempfile::Builder::new().prefix("cairn-small-fs-").tempdir_in("/var/tmp").unwrap();
        let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV;
        nix::mount::mount(Some("tmpfs"), dir.path(), Some("tmpfs"), flags, Some(format!("size={size},mode=0700").as_str())).unwrap();
        SmallFs(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes a file until the filesystem is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0xa5u8; 1 << 16];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// One line that says the disk is full.
fn says_full(err: &str) -> bool {
    let e = err.to_lowercase();
    (e.contains("full") || e.contains("no space")) && !err.trim().contains('\n')
}

fn event_count(d: &Daemon, task: &str) -> usize {
    d.json(&["log", task]).as_array().unwrap().len()
}

#[test]
fn a_full_store_and_blob_store_refuse_writes_cleanly_and_work_again_once_there_is_room() {
    let fs = SmallFs::new("48M");
    let store = format!("sqlite://{}", fs.path().join("cairn.db").display());
    let blobs = fs.path().join("blobs");
    let d = Daemon::start_with(&["--store", &store, "--blob", blobs.to_str().unwrap()]);
    let t = d.create(&[]);
    must(&d, &t, "head -c 2M /dev/urandom > /workspace/kept");
    let kept = d.json(&["snapshot", &t, "--note", "before the disk filled"]);
    let kept_id = kept["id"].as_str().unwrap().to_owned();
    let waiting = d.create(&[]);
    d.json(&["wait", &waiting, "--webhook", "build-done"]);
    let logged = event_count(&d, &t);

    // New data, so that a snapshot has chunks to write.
    must(&d, &t, "head -c 8M /dev/urandom > /workspace/late");
    let filler = fs.fill();
    // Even a command is refused now: its step is a write to the store.
    let (code, _, err) = d.sh(&t, "true");
    assert!(code != 0 && err.contains("database or disk is full") && !err.trim().contains('\n'), "{err}");
    let err = d.fails(&["snapshot", &t]);
    assert!(says_full(&err), "{err}");
    let err = d.fails(&["event", &waiting, "--name", "build-done"]);
    assert!(says_full(&err), "{err}");
    assert_eq!(d.state(&waiting), "suspended", "an event not taken in wakes nothing");
    let err = d.fails(&["suspend", &t]);
    assert!(says_full(&err), "{err}");
    assert_eq!(d.state(&t), "running", "a suspend that could not store keeps the task running");

    std::fs::remove_file(filler).unwrap();
    assert_eq!(must(&d, &t, "wc -c < /workspace/kept"), "2097152\n");
    // The same daemon, no restart: everything works again.
    let snaps = d.json(&["snapshot", "list", &t]);
    assert!(snaps.as_array().unwrap().iter().any(|s| s["id"] == kept_id.as_str()), "the acknowledged snapshot is kept: {snaps}");
    assert!(event_count(&d, &t) >= logged, "no acknowledged event was lost");
    d.ok(&["log", &t, "--verify"]);
    let later = d.json(&["snapshot", &t, "--note", "room again"]);
    assert!(later["id"].is_string(), "{later}");
    d.ok(&["event", &waiting, "--name", "build-done"]);
    d.wait_for_state(&waiting, "running", std::time::Duration::from_secs(30));
    d.ok(&["suspend", &t]);
    d.ok(&["resume", &t]);
    assert_eq!(must(&d, &t, "wc -c < /workspace/late"), "8388608\n");
    d.ok(&["rollback", &t, "--to", &kept_id, "--reason", "back before the disk filled"]);
    assert_eq!(must(&d, &t, "test -e /workspace/late || echo gone"), "gone\n");
    let fresh = d.create(&[]);
    assert_eq!(must(&d, &fresh, "echo ok"), "ok\n");
    d.ok(&["check", "--read-data"]);
    for id in [&t, &waiting, &fresh] {
        d.ok(&["destroy", id]);
    }
}

/// `cairn cp` onto a full disk, both ways: one line naming the destination
/// and the full disk, and no partial file (nor, copying out, the tree the
/// copy had started) left behind. Positive controls: the same copies with
/// room.
#[test]
fn a_cp_that_fills_a_disk_names_the_destination_and_leaves_no_partial_file() {
    let local = SmallFs::new("24m");
    let d = Daemon::start();
    let t = d.create(&["--disk", "64M"]);
    let big = tempfile::NamedTempFile::new_in("/var/tmp").unwrap();
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for _ in 0..100 {
        big.as_file().write_all(&chunk).unwrap();
    }
    // In: 100 MiB onto a 64 MiB disk.
    let into = format!("{t}:/workspace/big.bin");
    let err = d.fails(&["cp", big.path().to_str().unwrap(), &into]);
    assert!(says_full(&err) && err.contains("/workspace/big.bin"), "{err}");
    assert_eq!(must(&d, &t, "ls -A /workspace"), "", "no partial file in the sandbox");
    let small = local.path().join("small.bin");
    std::fs::write(&small, &chunk).unwrap();
    d.ok(&["cp", small.to_str().unwrap(), &into]);
    assert_eq!(must(&d, &t, "stat -c %s /workspace/big.bin"), format!("{}\n", chunk.len()), "control: a copy with room");
    std::fs::remove_file(&small).unwrap();

    // Out: 30 MiB into a 24 MiB filesystem, as a file and as a tree.
    must(&d, &t, "rm /workspace/big.bin && mkdir /workspace/tree && head -c 30M /dev/urandom > /workspace/tree/z.bin && echo hi > /workspace/tree/a.txt");
    for (from, to) in [("/workspace/tree/z.bin", "z.bin"), ("/workspace/tree", "tree")] {
        let dest = local.path().join(to);
        let err = d.fails(&["cp", &format!("{t}:{from}"), dest.to_str().unwrap()]);
        assert!(says_full(&err) && err.contains(dest.to_str().unwrap()), "{err}");
        assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0, "nothing of the copy of {from} is left");
    }
    let a = local.path().join("a.txt");
    d.ok(&["cp", &format!("{t}:/workspace/tree/a.txt"), a.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "hi\n", "control: a copy out with room");
}
