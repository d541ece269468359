//! Snapshots through the real CLI and daemon: a round trip of every file
//! kind through snapshot and rollback, step/memory/rollback notes, pre-risk
//! snapshots, forks sharing data, diffs, retention and gc, a damaged store
//! found by `check` and refused by rollback, a full blob store, and SIGKILL
//! of the daemon in the middle of snapshots.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::Daemon;
use serde_json::Value;

/// Lists a tree inside the sandbox: per entry its type and mode, owner,
/// mtime, size, content hash, whether it is sparse, link target, hard-link
/// group and xattrs.
const LISTING: &str = r#"
import os, stat, hashlib, json, sys
out, inodes = [], {}
for top in sys.argv[1:]:
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(root, name)
            st = os.lstat(p)
            e = [p, stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns]
            if stat.S_ISREG(st.st_mode):
                with open(p, 'rb') as f:
                    e += [st.st_size, hashlib.sha256(f.read()).hexdigest(), st.st_blocks * 512 < st.st_size]
                if st.st_nlink > 1:
                    e.append('linked-with:' + inodes.setdefault(st.st_ino, p))
            elif stat.S_ISLNK(st.st_mode):
                e.append(os.readlink(p))
            if not stat.S_ISLNK(st.st_mode) and not stat.S_ISFIFO(st.st_mode):
                e.append(sorted((k, os.getxattr(p, k).hex()) for k in os.listxattr(p)))
            out.append(e)
print(json.dumps(out))
"#;

fn listing(d: &Daemon, task: &str, tops: &[&str]) -> Value {
    let mut args = vec!["exec", task, "--", "python3", "-c", LISTING];
    args.extend_from_slice(tops);
    serde_json::from_str(&d.ok(&args)).expect("listing is JSON")
}

fn snapshot(d: &Daemon, task: &str, extra: &[&str]) -> Value {
    let mut a = vec!["snapshot", task];
    a.extend_from_slice(extra);
    d.json(&a)
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// Every kind of entry a writable layer can hold, including deletions and
/// a rename of base-image directories.
const EVERY_KIND: &str = r#"
set -e
cd /workspace
mkdir -p src/deep/er && echo hello > src/deep/er/a.txt
: > empty
head -c 3000000 /dev/urandom > big.bin
truncate -s 8M sparse.img && printf 'middle' | dd of=sparse.img bs=1 seek=4000000 conv=notrunc 2>/dev/null
ln -s src/deep/er/a.txt link && ln -s /nowhere dangling
echo shared > hard1 && ln hard1 hard2
mkfifo pipe
chmod 0640 src/deep/er/a.txt && chmod 2775 src && chmod 4755 big.bin
chown 1000:1001 src/deep/er/a.txt && chown -h 33:33 link
python3 -c "import os; os.setxattr('empty', 'user.note', b'kept'); os.setxattr('src', 'user.dir', b'\x00\x01')"
rm /etc/debian_version
mv /etc/default /etc/default-renamed
rm -rf /etc/ld.so.conf.d && mkdir /etc/ld.so.conf.d && echo mine > /etc/ld.so.conf.d/only-this
touch -d '2001-02-03 04:05:06' src/deep/er/a.txt
"#;

/// Shell that waits (at most 10 s) until the task's service, which ends
/// in `exec sleep 1000`, runs: a poll, not a fixed sleep.
const UNTIL_SERVICE_RUNS: &str = "i=0; until grep -qx sleep /proc/[0-9]*/comm 2>/dev/null; do i=$((i+1)); [ $i -lt 1000 ] || break; sleep 0.01; done; ";

#[test]
fn rollback_restores_every_file_kind_exactly() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, EVERY_KIND);
    let before = listing(&d, &id, &["/workspace", "/etc"]);
    let s1 = snapshot(&d, &id, &["--kind", "milestone", "--note", "everything"]);
    let sid = s1["id"].as_str().unwrap().to_owned();
    // The sandbox was frozen for the second pass, inside the capture.
    let (freeze, took) = (s1["freeze_ms"].as_f64().unwrap(), s1["duration_ms"].as_f64().expect("duration_ms"));
    assert!(freeze > 0.0 && freeze <= took, "{s1}");

    // Wreck it: contents, deletions, modes, owners, new files, base files back.
    must(
        &d,
        &id,
        "set -e; cd /workspace; rm -rf src hard2 pipe; echo changed > big.bin; chmod 600 empty; chown 5:5 empty; \
         mkdir -p new/dir && echo x > new/dir/f; ln -sf /etc link; mkdir /etc/default; echo back > /etc/debian_version; \
         rm -rf /etc/default-renamed /etc/ld.so.conf.d/only-this; truncate -s 0 sparse.img",
    );
    assert_ne!(listing(&d, &id, &["/workspace", "/etc"]), before);

    let out = d.json(&["rollback", &id, "--to", &sid, "--reason", "tests went red"]);
    assert_eq!(out["rollback_note"]["to"], sid.as_str());
    let after = listing(&d, &id, &["/workspace", "/etc"]);
    assert_eq!(after, before, "the writable layer is exactly the snapshot's");
    // A spot check of what the listing encodes.
    let text = after.to_string();
    assert!(text.contains("/workspace/sparse.img") && text.contains("linked-with:/workspace/hard1"), "{text}");
    assert!(!text.contains("/etc/debian_version") && text.contains("/etc/default-renamed") && text.contains("/etc/ld.so.conf.d/only-this"));
    // The opaque directory hides everything the base had there (the base has
    // more, as a fresh task shows).
    assert_eq!(must(&d, &id, "ls -A /etc/ld.so.conf.d"), "only-this\n", "the opaque directory hides what the base had");
    let fresh = d.create(&[]);
    let base = must(&d, &fresh, "ls -A /etc/ld.so.conf.d");
    assert!(!base.is_empty() && base != "only-this\n", "the base image has its own /etc/ld.so.conf.d: {base:?}");
}

#[test]
fn rollback_restores_step_and_memory_and_tells_the_agent_why() {
    let d = Daemon::start();
    let id = d.create(&["--service", "echo up >> /tmp/service-ran; exec sleep 1000"]);
    assert_eq!(must(&d, &id, &format!("{UNTIL_SERVICE_RUNS}cat /tmp/service-ran")), "up\n", "the service started with the sandbox");
    must(&d, &id, "echo v1 > /workspace/state");
    let good = snapshot(&d, &id, &["--memory", "tried plan A; tests pass"]);
    assert_eq!(d.task(&id)["memory"], "tried plan A; tests pass");
    let step_at_good = good["step"].as_u64().unwrap();
    must(&d, &id, "echo v2 > /workspace/state");
    let memfile = d.home().join("memory.txt");
    std::fs::write(&memfile, "plan B half done").unwrap();
    let bad = snapshot(&d, &id, &["--unhealthy", "--note", "plan B broke the build", "--memory", &format!("@{}", memfile.display())]);
    assert_eq!(d.task(&id)["memory"], "plan B half done");
    must(&d, &id, "echo v3 > /workspace/state");

    d.ok(&["rollback", &id, "--last-healthy", "--reason", "plan B broke the build"]);
    let t = d.task(&id);
    assert_eq!(t["step"].as_u64().unwrap(), step_at_good, "the step counter is the snapshot's");
    // A fresh sandbox (a new, empty /tmp) with the service started again.
    assert_eq!(must(&d, &id, &format!("{UNTIL_SERVICE_RUNS}cat /tmp/service-ran; grep -lx sleep /proc/[0-9]*/comm | wc -l")), "up\n1\n");
    assert_eq!(must(&d, &id, "cat /workspace/state"), "v1\n");
    assert_eq!(t["memory"], "tried plan A; tests pass");
    let note = &t["rollback_note"];
    assert_eq!((note["to"].as_str(), note["from"].as_str()), (good["id"].as_str(), bad["id"].as_str()));
    assert_eq!(note["reason"], "plan B broke the build");
    let human = d.ok(&["task", "show", &id]);
    assert!(human.contains("rollback:") && human.contains("plan B broke the build"), "{human}");
    let list = d.json(&["snapshot", "list", &id]);
    let health: Vec<bool> = list.as_array().unwrap().iter().map(|s| s["healthy"].as_bool().unwrap()).collect();
    assert_eq!(health, [true, false]);
    let log = d.json(&["log", &id]);
    assert!(log.as_array().unwrap().iter().any(|e| e["kind"] == "rollback" && e["args"]["phase"] == "end"));
    let after = snapshot(&d, &id, &[]);
    assert_eq!(after["parent"], good["id"], "the next snapshot descends from the rollback target");
}

/// The README's tour: a milestone, then `rm -rf build` (a pre-risk
/// snapshot first), then `rollback --last-healthy`: it lands on the
/// pre-risk snapshot, the newest healthy one, which holds the build the
/// delete removed, and the note says which was chosen and why, and from
/// which step (not "to X from X").
#[test]
fn last_healthy_after_the_readme_s_delete_says_which_snapshot_and_why() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "mkdir -p /workspace/build && echo parser > /workspace/build/out");
    let milestone = snapshot(&d, &id, &["--kind", "milestone", "--note", "tests green"]);
    let out = d.cairn(&["exec", &id, "--", "rm", "-rf", "/workspace/build"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains("took pre-risk snapshot s"));
    let list = d.json(&["snapshot", "list", &id]);
    let pre_risk = list.as_array().unwrap().iter().find(|s| s["kind"] == "pre-risk").unwrap().clone();
    assert_ne!(pre_risk["id"], milestone["id"]);
    let step_before = d.task(&id)["step"].as_u64().unwrap();

    d.ok(&["rollback", &id, "--last-healthy", "--reason", "the refactor broke the parser"]);
    assert_eq!(must(&d, &id, "cat /workspace/build/out"), "parser\n", "the pre-risk snapshot holds what the delete removed");
    let note = &d.task(&id)["rollback_note"];
    assert_eq!(note["to"], pre_risk["id"]);
    let chosen = note["chosen"].as_str().unwrap();
    assert!(chosen.starts_with("--last-healthy: the newest healthy snapshot, pre-risk at step") && chosen.contains("before `rm -rf /workspace/build`"), "{chosen}");
    let human = d.ok(&["task", "show", &id]);
    let line = human.lines().find(|l| l.starts_with("rollback:")).unwrap();
    let to = pre_risk["id"].as_str().unwrap();
    assert!(line.contains(&format!("to {to} from step {step_before} at")), "{line}");
    assert_eq!(line.matches(to).count(), 1, "the target is named once: {line}");
    assert!(human.contains("chosen by --last-healthy: the newest healthy snapshot, pre-risk"), "{human}");

    // Named with --to, the milestone; the note says so.
    let m = milestone["id"].as_str().unwrap();
    d.ok(&["rollback", &id, "--to", m, "--reason", "back to green"]);
    let note = &d.task(&id)["rollback_note"];
    assert_eq!((note["to"].as_str(), note["chosen"].as_str()), (Some(m), Some("--to: named by the caller")));
    let human = d.ok(&["task", "show", &id]);
    assert!(human.contains(&format!("latest snapshot {to}")), "the latest snapshot then is named when it is another: {human}");
}

#[test]
fn risky_commands_take_a_pre_risk_snapshot_first() {
    let d = Daemon::start();
    let id = d.create(&["--risky-pattern", "^make deploy"]);
    must(&d, &id, "mkdir -p /workspace/build && echo keep > /workspace/build/out");
    // Positive control: an ordinary command takes none.
    let out = d.cairn(&["exec", &id, "--", "ls", "/workspace"]);
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("pre-risk"));
    assert_eq!(d.json(&["snapshot", "list", &id]).as_array().unwrap().len(), 0);

    let out = d.cairn(&["exec", &id, "--", "rm", "-rf", "/workspace/build"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("took pre-risk snapshot s"), "{err}");
    let out = d.cairn(&["exec", &id, "--risky", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--risky"));
    let out = d.cairn(&["exec", &id, "--", "sh", "-c", "make deploy || true"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("pre-risk"), "the task pattern is anchored to the command line");
    let out = d.cairn(&["exec", &id, "--", "make", "deploy"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("^make deploy"));
    let list = d.json(&["snapshot", "list", &id]);
    let kinds: Vec<&str> = list.as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["pre-risk", "pre-risk", "pre-risk"]);
    // The first one holds what the delete removed.
    let first = list[0]["id"].as_str().unwrap();
    d.ok(&["rollback", &id, "--to", first, "--reason", "deleted the build by mistake"]);
    assert_eq!(must(&d, &id, "cat /workspace/build/out"), "keep\n");
}

fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        total += if m.is_dir() { dir_size(&e.path()) } else { m.len() };
    }
    total
}

#[test]
fn snapshots_are_incremental_and_forks_share_data() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "head -c 20000000 /dev/urandom > /workspace/data.bin; seq 1 100000 > /workspace/numbers");
    let first = snapshot(&d, &id, &[]);
    assert!(first["added_bytes"].as_u64().unwrap() > 19_000_000, "{first}");
    let second = snapshot(&d, &id, &[]);
    assert!(second["added_bytes"].as_u64().unwrap() < 100_000, "no change adds (almost) nothing: {second}");
    assert_eq!(second["manifest"], first["manifest"], "same tree, same manifest");
    must(&d, &id, "echo one more line >> /workspace/numbers");
    let third = snapshot(&d, &id, &[]);
    assert!(third["added_bytes"].as_u64().unwrap() < 1_000_000, "only the changed file's new chunk: {third}");
    let log = d.json(&["log", &id]);
    let reads: Vec<u64> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "snapshot").map(|e| e["args"]["files_read"].as_u64().unwrap()).collect();
    // A file changed within the last few milliseconds is read again in the
    // frozen pass (its timestamps cannot yet tell a later change apart).
    assert_eq!(reads[1], 0, "nothing changed, nothing read: {reads:?}");
    assert!((1..=2).contains(&reads[2]), "an incremental snapshot reads only the changed file: {reads:?}");

    let packs = d.home().join("blobs/packs");
    let before = dir_size(&packs);
    let forks = d.json(&["fork", &id, "--from", first["id"].as_str().unwrap(), "--count", "2"]);
    let kids: Vec<String> = forks.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kids.len(), 2);
    // No file data: only the branch manifest's segments (a few entries each).
    let grown = dir_size(&packs) - before;
    assert!(grown < 16 * 1024, "a fork stores no new file data, {grown} bytes of packs");
    for k in &kids {
        assert_eq!(must(&d, k, "wc -l < /workspace/numbers").trim(), "100000", "the fork starts from the chosen snapshot");
        let snaps = d.json(&["snapshot", "list", k]);
        assert_eq!(snaps[0]["kind"], "branch");
        assert_eq!(snaps[0]["parent"], first["id"]);
    }
    must(&d, &kids[0], "echo only-here > /workspace/mine");
    assert_eq!(d.sh(&kids[1], "test -e /workspace/mine").0, 1, "forks are independent");
    assert_eq!(d.sh(&id, "test -e /workspace/mine").0, 1);

    // Diff: added, changed, deleted (a whiteout of a base file is a deletion).
    must(&d, &kids[0], "rm /workspace/data.bin /etc/debian_version; echo 2 > /workspace/numbers");
    let s2 = snapshot(&d, &kids[0], &[]);
    let branch = d.json(&["snapshot", "list", &kids[0]])[0]["id"].as_str().unwrap().to_owned();
    let diff = d.json(&["snapshot", "diff", &kids[0], &branch, s2["id"].as_str().unwrap()]);
    assert_eq!(diff["added"], serde_json::json!(["/workspace/mine"]));
    assert_eq!(diff["changed"], serde_json::json!(["/workspace/numbers"]));
    assert_eq!(diff["deleted"], serde_json::json!(["/etc/debian_version", "/workspace/data.bin"]));
}

#[test]
fn retention_expires_snapshots_and_gc_frees_their_data() {
    let d = Daemon::start();
    let id = d.create(&["--keep-last", "1", "--keep-milestones", "true", "--expire-after", "never"]);
    must(&d, &id, "head -c 4000000 /dev/urandom > /workspace/a");
    let milestone = snapshot(&d, &id, &["--kind", "milestone"]);
    must(&d, &id, "rm /workspace/a; head -c 4000000 /dev/urandom > /workspace/b");
    let doomed = snapshot(&d, &id, &[]);
    must(&d, &id, "rm /workspace/b; echo small > /workspace/c");
    let latest = snapshot(&d, &id, &[]);
    let ids: Vec<String> = d.json(&["snapshot", "list", &id]).as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, [milestone["id"].as_str().unwrap(), latest["id"].as_str().unwrap()], "the middle one expired");
    assert!(d.json(&["log", &id]).as_array().unwrap().iter().any(|e| e["kind"] == "snapshot_expired" && e["args"]["snapshot"] == doomed["id"]));

    let packs = d.home().join("blobs/packs");
    let before = dir_size(&packs);
    let dry = d.json(&["gc", "--dry-run", "--grace", "0s"]);
    assert!(dry["report"]["bytes_freed"].as_u64().unwrap() >= 3_000_000, "{dry}");
    assert_eq!(dir_size(&packs), before, "a dry run deletes nothing");
    let young = d.json(&["gc"]);
    assert_eq!(young["report"]["packs_deleted"], 0, "the default grace period keeps fresh objects: {young}");
    let real = d.json(&["gc", "--grace", "0s"]);
    assert!(real["report"]["bytes_freed"].as_u64().unwrap() >= 3_000_000, "{real}");
    assert!(dir_size(&packs) <= before - 3_000_000);
    d.ok(&["check", "--read-data"]);
    // What is left still restores.
    d.ok(&["rollback", &id, "--to", milestone["id"].as_str().unwrap(), "--reason", "back to the milestone"]);
    assert_eq!(must(&d, &id, "wc -c < /workspace/a").trim(), "4000000");
}

#[test]
fn bad_snapshot_input_is_refused_with_one_line() {
    let d = Daemon::start();
    let a = d.create(&[]);
    let b = d.create(&[]);
    let sa = snapshot(&d, &a, &[])["id"].as_str().unwrap().to_owned();
    let err = d.fails(&["rollback", &a, "--to", "s222222222", "--reason", "x"]);
    assert!(err.contains("unknown snapshot"), "{err}");
    let err = d.fails(&["rollback", &b, "--to", &sa, "--reason", "x"]);
    assert!(err.contains(&format!("belongs to task {a}")), "{err}");
    let err = d.fails(&["rollback", &a, "--to", &sa, "--reason", "  "]);
    assert!(err.contains("reason"), "{err}");
    let err = d.fails(&["rollback", &b, "--last-healthy", "--reason", "x"]);
    assert!(err.contains("no healthy snapshot"), "{err}");
    let err = d.fails(&["snapshot", &a, "--kind", "yolo"]);
    assert!(err.contains("snapshot kind"), "{err}");
    let err = d.fails(&["fork", &b]);
    assert!(err.contains("no snapshot to fork from"), "{err}");
    let err = d.fails(&["fork", &a, "--count", "0"]);
    assert!(err.contains("--count"), "{err}");
    let err = d.fails(&["task", "create", "--risky-pattern", "(oops"]);
    assert!(err.contains("risk pattern"), "{err}");
    let err = d.fails(&["snapshot", "diff", &a, &sa, "nonsense"]);
    assert!(err.contains("unknown snapshot"), "{err}");
    d.ok(&["destroy", &a]);
    let err = d.fails(&["fork", &a]);
    assert!(err.contains("destroyed"), "{err}");
    // Nothing of that changed b.
    assert_eq!(d.task(&b)["state"], "running");
}

/// Flips one byte in the middle of the largest pack.
fn corrupt_largest_pack(home: &Path) -> PathBuf {
    let mut packs = Vec::new();
    let mut stack = vec![home.join("blobs/packs")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                packs.push((e.metadata().unwrap().len(), e.path()));
            }
        }
    }
    packs.sort();
    let (len, path) = packs.pop().expect("a pack");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(len / 2) as usize] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_damaged_store_is_named_by_check_and_never_restored() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "head -c 3000000 /dev/urandom > /workspace/blob");
    let s = snapshot(&d, &id, &[])["id"].as_str().unwrap().to_owned();
    d.ok(&["check", "--read-data"]);
    let pack = corrupt_largest_pack(d.home());
    let pack_id = pack.file_name().unwrap().to_string_lossy().into_owned();
    // Without reading data the pack is present, so the quick check passes.
    d.ok(&["check"]);
    let out = d.cairn(&["check", "--read-data"]);
    assert!(!out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains(&pack_id[..16]), "the broken pack is named: {report}");
    // The rollback must read the damaged chunks (an unchanged file would be
    // kept as it is on disk, which is correct data).
    must(&d, &id, "rm /workspace/blob; echo after > /workspace/marker");
    let err = d.fails(&["rollback", &id, "--to", &s, "--reason", "try it"]);
    assert!(err.contains(&pack_id[..16]) && err.contains("corrupt"), "the damaged pack is named: {err}");
    // The refused rollback left a usable task: either untouched, or marked
    // with what failed; never silently restored wrong data.
    let t = d.task(&id);
    assert_eq!(t["sandbox"], "lost", "{t}");
    assert!(t["sandbox_note"].as_str().unwrap().contains(&pack_id[..16]), "{t}");
    assert!(d.task(&id)["rollback_note"].is_null(), "no rollback was recorded");

    // A truncated pack is found without reading data.
    std::fs::write(&pack, b"short").unwrap();
    let out = d.cairn(&["check"]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // A missing one too.
    std::fs::remove_file(&pack).unwrap();
    let out = d.cairn(&["check"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&pack_id[..16]));
}

/// A small tmpfs mounted over the blob store; unmounted on drop.
struct SmallMount(PathBuf);

impl Drop for SmallMount {
    fn drop(&mut self) {
        let _ = common::run(Command::new("umount").arg("-l").arg(&self.0));
    }
}

#[test]
fn a_full_blob_store_fails_the_snapshot_cleanly() {
    let mut d = Daemon::start();
    // Restart the daemon on a blob store of 8 MiB.
    d.kill();
    let blobs = d.home().join("blobs");
    std::fs::remove_dir_all(&blobs).unwrap();
    std::fs::create_dir(&blobs).unwrap();
    let st = common::run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"]).arg(&blobs)).unwrap().status;
    assert!(st.success(), "mount tmpfs");
    let _mount = SmallMount(blobs.clone());
    d.spawn(&[]);
    let id = d.create(&[]);
    must(&d, &id, "echo small > /workspace/ok");
    let good = snapshot(&d, &id, &[])["id"].as_str().unwrap().to_owned();
    must(&d, &id, "head -c 20000000 /dev/urandom > /workspace/too-big");
    let err = d.fails(&["snapshot", &id]);
    assert!(err.to_lowercase().contains("no space"), "{err}");
    // The task still runs (and is not left frozen), the earlier snapshot is
    // intact and restores.
    assert_eq!(must(&d, &id, "cat /workspace/ok"), "small\n");
    assert_eq!(d.json(&["snapshot", "list", &id]).as_array().unwrap().len(), 1);
    d.ok(&["check", "--read-data"]);
    d.ok(&["rollback", &id, "--to", &good, "--reason", "disk filled up"]);
    assert_eq!(d.sh(&id, "test -e /workspace/too-big").0, 1);
    d.ok(&["destroy", &id]);
    // `_mount` goes first (declared last), so the home holds no mount point
    // when the daemon's drop removes it.
}

#[test]
fn killing_the_daemon_during_snapshots_never_corrupts_the_store() {
    let mut d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "mkdir -p /workspace/many && for i in $(seq 1 300); do head -c 20000 /dev/urandom > /workspace/many/f$i; done");
    let mut taken = 0;
    let mut rng = common::Rng::seeded("killing_the_daemon_during_snapshots");
    let mut window = common::KillWindow::new(rng.below(150) + 20);
    // A kill landed mid-snapshot when the daemon reported the snapshot in
    // progress just before it, or by what an interrupted snapshot leaves:
    // records not acknowledged, and objects no snapshot references (gc's
    // dry run counts them).
    let garbage = |d: &Daemon| {
        let gc = d.json(&["gc", "--dry-run", "--grace", "0s"]);
        gc["report"]["packs_deleted"].as_u64().unwrap() + gc["report"]["manifests_deleted"].as_u64().unwrap()
    };
    let (mut listed, mut garbage_before) = (d.json(&["snapshot", "list", &id]).as_array().unwrap().len(), garbage(&d));
    for round in 0..8 {
        must(&d, &id, &format!("head -c 3000000 /dev/urandom > /workspace/round{round}; echo {round} >> /workspace/many/f1"));
        let child = d.cmd().args(["snapshot", &id]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(window.delay(&mut rng));
        // The daemon's own account of what it is doing, just before the
        // kill: a snapshot it reports in progress was begun.
        let (status, body) = d.http_path(&id, "GET", "progress", "", None);
        let in_flight = status == 200 && serde_json::from_slice::<serde_json::Value>(&body).is_ok_and(|p| p["op"] == "snapshot");
        d.kill();
        let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
        if out.status.success() {
            taken += 1;
        }
        d.spawn(&[]);
        let now_listed = d.json(&["snapshot", "list", &id]).as_array().unwrap().len();
        let garbage_now = garbage(&d);
        window.landed(if out.status.success() {
            common::Landed::After
        } else if in_flight || now_listed > listed || garbage_now > garbage_before {
            common::Landed::Mid
        } else {
            common::Landed::Before
        });
        (listed, garbage_before) = (now_listed, garbage_now);
        let check = d.cairn(&["check", "--read-data"]);
        assert!(check.status.success(), "round {round}: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
        // Every listed snapshot is whole: the task's sandbox survived (and
        // was thawed), and the latest snapshot restores.
        assert_eq!(d.task(&id)["sandbox"], "ready", "round {round}: {}", d.log());
        let list = d.json(&["snapshot", "list", &id]);
        assert!(list.as_array().unwrap().len() >= taken, "an acknowledged snapshot is never lost");
    }
    window.assert_cut_one("killing the daemon during snapshots");
    // A snapshot after the crashes works, and rolling back to it restores.
    let last = snapshot(&d, &id, &[]);
    d.ok(&["rollback", &id, "--to", last["id"].as_str().unwrap(), "--reason", "after the crashes"]);
    assert_eq!(must(&d, &id, "ls /workspace/many | wc -l").trim(), "300");
    // The garbage of interrupted snapshots is collectable.
    d.ok(&["gc", "--grace", "0s"]);
    d.ok(&["check", "--read-data"]);
}

#[test]
fn gc_running_during_snapshots_never_takes_their_data() {
    let d = Daemon::start();
    let id = d.create(&["--keep-last", "2", "--expire-after", "0s", "--keep-milestones", "false"]);
    for round in 0..5 {
        must(&d, &id, &format!("head -c 2000000 /dev/urandom > /workspace/r{round}; rm -f /workspace/r{}", round.max(1) - 1));
        let snap = d.cmd().args(["--json", "snapshot", &id]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let gc = d.cmd().args(["gc", "--grace", "0s"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (s, g) = (common::output_of(snap, common::CALL_DEADLINE).unwrap(), common::output_of(gc, common::CALL_DEADLINE).unwrap());
        assert!(s.status.success() && g.status.success(), "{}{}", String::from_utf8_lossy(&s.stderr), String::from_utf8_lossy(&g.stderr));
        d.ok(&["check", "--read-data"]);
    }
    let list = d.json(&["snapshot", "list", &id]);
    assert_eq!(list.as_array().unwrap().len(), 2, "retention kept the newest two");
    for s in list.as_array().unwrap() {
        d.ok(&["rollback", &id, "--to", s["id"].as_str().unwrap(), "--reason", "every kept snapshot restores"]);
    }
    assert_eq!(must(&d, &id, "ls /workspace").trim(), "r4");
}
