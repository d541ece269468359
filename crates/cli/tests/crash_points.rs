//! The daemon killed exactly at each named crash point (docs/testing.md):
//! the test starts it with `CAIRN_CRASH_AT=op.step`, runs the operation,
//! sees the daemon report that point and die of SIGKILL, restarts it, and
//! checks what must hold after any crash: the blob store checks clean
//! (also after a gc), the ledger verifies, every acknowledged snapshot and
//! event is there exactly once, and the task is in the state its record
//! says and works.
//!
//! The list of points is read from the sources, so a point added without a
//! test here fails `every_crash_point_has_a_test`.
//!
//! The daemons use SQLite and a local blob directory, or, with
//! `CAIRN_TEST_STORE=postgres-s3`, a fresh PostgreSQL database and a bucket
//! on a loopback S3 server (moto) each: scripts/test.sh runs this file
//! both ways.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cairn_blob::moto::Moto;
use cairn_store::testing::postgres::{fresh_database, TempDatabase};
use common::Daemon;
use serde_json::Value;

/// A daemon on this run's store, and what that store needs kept alive
/// (dropped after the daemon: its cleanup still reads the store).
struct Node {
    d: Daemon,
    _db: Option<TempDatabase>,
    _moto: Option<Arc<Moto>>,
}

impl Deref for Node {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.d
    }
}

impl DerefMut for Node {
    fn deref_mut(&mut self) -> &mut Daemon {
        &mut self.d
    }
}

/// Starts a daemon on SQLite and a local directory, or on PostgreSQL and
/// S3 under `CAIRN_TEST_STORE=postgres-s3`.
fn start() -> Node {
    match std::env::var("CAIRN_TEST_STORE").as_deref() {
        Err(_) | Ok("sqlite") => Node { d: Daemon::start(), _db: None, _moto: None },
        Ok("postgres-s3") => {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let moto = Moto::shared();
            let bucket = format!("cairn-crash-{}-{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            moto.create_bucket(&bucket);
            let db = fresh_database();
            let blob = format!("s3://{bucket}/blobs");
            let env = moto.env();
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let d = Daemon::start_with_env(&["--store", &db.url, "--blob", &blob], &env);
            Node { d, _db: Some(db), _moto: Some(moto) }
        }
        Ok(other) => panic!("CAIRN_TEST_STORE={other}: the stores are sqlite and postgres-s3"),
    }
}

/// The points this file crashes at, one test each.
const TESTED: &[&str] = &[
    "blob.pack_written",
    "snapshot.frozen",
    "snapshot.packs_written",
    "snapshot.manifest_stored",
    "snapshot.recorded",
    "suspend.snapshot_taken",
    "suspend.sandbox_stopped",
    "suspend.recorded",
    "wake.disk_restored",
    "wake.sandbox_started",
    "wake.recorded",
    "rollback.sandbox_stopped",
    "rollback.disk_restored",
    "rollback.recorded",
    "fork.recorded",
    "fork.disk_restored",
    "event.verified",
    "event.stored",
    "deliver.content_stored",
    "deliver.record_stored",
    "deliver.recorded",
    "gc.index_rewritten",
    "gc.packs_deleted",
    "create.recorded",
    "destroy.state_recorded",
    "complete.state_recorded",
    "timer.due",
    "image.commit_restored",
    "image.committed",
    "pull.downloaded",
    "pull.imported",
    "checkpoint.saved",
];

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}\n{}", d.log());
    out
}

/// Restarts the daemon armed at `point`, runs `op` against it, and asserts
/// that the daemon died of SIGKILL exactly there (its last words name the
/// point); then starts it again, unarmed. Returns what `op` printed.
fn crash_at(d: &mut Daemon, point: &str, op: impl FnOnce(&Daemon) -> Output) -> Output {
    let marker = format!("crash point {point} reached");
    let before = d.log().matches(&marker).count();
    d.kill();
    d.spawn_armed(point);
    let out = op(d);
    let status = d.wait_exit(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{point}: the daemon never got there: {e}\n{}", d.log()));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: the daemon ended with {status}, not by the crash point\n{}", d.log());
    assert_eq!(d.log().matches(&marker).count(), before + 1, "{point}: the kill did not land at the point\n{}", d.log());
    d.restart();
    out
}

/// Runs the CLI against the armed daemon (which dies during the call).
fn cli<'a>(args: &'a [&'a str]) -> impl FnOnce(&Daemon) -> Output + 'a {
    move |d: &Daemon| d.try_cairn(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Waits until the task is no longer between states, returns its state.
fn settled(d: &Daemon, id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = d.state(id);
        if st != "waking" && st != "suspending" {
            return st;
        }
        assert!(Instant::now() < deadline, "task {id} still {st} 60 s after the restart\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What must hold after any crash, for every task: the store checks clean
/// before and after a gc, the ledger verifies, and each task is in the
/// state its record says: a running one has a ready sandbox that runs a
/// command, a suspended one has none and resumes.
fn consistent(d: &Daemon) {
    d.ok(&["check", "--read-data"]);
    d.ok(&["gc", "--grace", "0s"]);
    d.ok(&["check", "--read-data"]);
    for t in d.json(&["task", "list", "--all"]).as_array().unwrap() {
        let id = t["id"].as_str().unwrap();
        d.ok(&["log", id, "--verify"]);
        // Ended tasks run nothing: their ledger is what is left to check.
        if t["state"] == "destroyed" || t["state"] == "completed" {
            continue;
        }
        match settled(d, id).as_str() {
            "running" => {
                assert_eq!(d.task(id)["sandbox"], "ready", "{id}: {}", d.task(id));
                assert_eq!(must(d, id, "echo alive"), "alive\n");
            }
            "suspended" => {
                assert!(d.task(id)["sandbox_pid"].is_null(), "{id}: a suspended task holds no sandbox: {}", d.task(id));
                d.ok(&["resume", id]);
                assert_eq!(must(d, id, "echo alive"), "alive\n");
            }
            other => panic!("{id} is {other} after the crash\n{}", d.log()),
        }
    }
}

fn snapshots(d: &Daemon, id: &str) -> Vec<Value> {
    d.json(&["snapshot", "list", id]).as_array().unwrap().clone()
}

fn events(d: &Daemon, id: &str, kind: &str) -> Vec<Value> {
    d.json(&["log", id]).as_array().unwrap().iter().filter(|e| e["kind"] == kind).cloned().collect()
}

/// A task with a few MB of files (enough for several packs) and `a` = 1.
fn task_with_files(d: &Daemon) -> String {
    let id = d.create(&[]);
    must(d, &id, "head -c 3000000 /dev/urandom > /workspace/data; echo 1 > /workspace/a");
    id
}

fn snapshot_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    d.ok(&["snapshot", &id]);
    must(&d, &id, "echo 2 > /workspace/a; head -c 2000000 /dev/urandom > /workspace/more");
    let sum = must(&d, &id, "md5sum /workspace/more");
    let out = crash_at(&mut d, point, cli(&["snapshot", &id]));
    assert!(!out.status.success(), "{point}: the snapshot was not acknowledged");
    // The sandbox outlived the daemon and was thawed; nothing changed in it.
    assert_eq!(settled(&d, &id), "running");
    assert_eq!(must(&d, &id, "cat /workspace/a; md5sum /workspace/more"), format!("2\n{sum}"));
    let recorded = usize::from(point == "snapshot.recorded");
    assert_eq!(snapshots(&d, &id).len(), 1 + recorded, "{point}: the snapshot exists only once it is recorded");
    consistent(&d);
    // A snapshot after the crash captures everything and restores.
    let s = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
    must(&d, &id, "rm /workspace/more; echo 3 > /workspace/a");
    d.ok(&["rollback", &id, "--to", &s, "--reason", "after the crash"]);
    assert_eq!(must(&d, &id, "cat /workspace/a; md5sum /workspace/more"), format!("2\n{sum}"));
    consistent(&d);
}

#[test]
fn crash_while_a_pack_is_written() {
    snapshot_crash("blob.pack_written");
}

#[test]
fn crash_while_the_sandbox_is_frozen() {
    snapshot_crash("snapshot.frozen");
}

#[test]
fn crash_after_the_packs_of_a_snapshot() {
    snapshot_crash("snapshot.packs_written");
}

#[test]
fn crash_after_the_manifest_of_a_snapshot() {
    snapshot_crash("snapshot.manifest_stored");
}

#[test]
fn crash_after_a_snapshot_is_recorded() {
    snapshot_crash("snapshot.recorded");
}

fn suspend_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let sum = must(&d, &id, "md5sum /workspace/data");
    let out = crash_at(&mut d, point, cli(&["suspend", &id]));
    assert!(!out.status.success(), "{point}: the suspend was not acknowledged");
    // Cut short before it was recorded, the task runs on (its sandbox
    // survived, or it is recovered from the suspend's snapshot); recorded,
    // it is suspended.
    let want = if point == "suspend.recorded" { "suspended" } else { "running" };
    assert_eq!(settled(&d, &id), want, "{point}: {}", d.task(&id));
    let kinds: Vec<Value> = snapshots(&d, &id).iter().map(|s| s["kind"].clone()).collect();
    assert_eq!(kinds, vec![Value::from("suspend")], "{point}: the suspend's snapshot, once");
    consistent(&d);
    assert_eq!(must(&d, &id, "cat /workspace/a; md5sum /workspace/data"), format!("1\n{sum}"));
}

#[test]
fn crash_after_a_suspend_snapshot() {
    suspend_crash("suspend.snapshot_taken");
}

#[test]
fn crash_after_a_suspended_sandbox_stopped() {
    suspend_crash("suspend.sandbox_stopped");
}

#[test]
fn crash_after_a_suspend_is_recorded() {
    suspend_crash("suspend.recorded");
}

fn wake_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let sum = must(&d, &id, "md5sum /workspace/data");
    d.ok(&["suspend", &id]);
    // The wake restores from the blob store, not the cached disk.
    std::fs::remove_file(d.home().join("disks").join(format!("{id}.img"))).unwrap();
    crash_at(&mut d, point, cli(&["resume", &id]));
    // The restarted daemon finishes the wake it finds under way.
    assert_eq!(settled(&d, &id), "running", "{point}: {}", d.task(&id));
    assert_eq!(must(&d, &id, "cat /workspace/a; md5sum /workspace/data"), format!("1\n{sum}"));
    let woke = events(&d, &id, "wake").iter().filter(|e| e["exit_code"] == 0).count();
    assert_eq!(woke, 1, "{point}: one wake succeeded: {:?}", events(&d, &id, "wake"));
    consistent(&d);
}

#[test]
fn crash_after_a_wake_restored_the_disk() {
    wake_crash("wake.disk_restored");
}

#[test]
fn crash_after_a_wake_started_the_sandbox() {
    wake_crash("wake.sandbox_started");
}

#[test]
fn crash_after_a_wake_is_recorded() {
    wake_crash("wake.recorded");
}

fn rollback_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let target = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
    must(&d, &id, "echo 2 > /workspace/a");
    let latest = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
    must(&d, &id, "echo 3 > /workspace/a");
    let out = crash_at(&mut d, point, cli(&["rollback", &id, "--to", &target, "--reason", "try again"]));
    assert!(!out.status.success(), "{point}: the rollback was not acknowledged");
    assert_eq!(settled(&d, &id), "running");
    let t = d.task(&id);
    if point == "rollback.recorded" {
        // Recorded: the task is at the target, as its rollback note says.
        assert_eq!(t["rollback_note"]["to"], target.as_str(), "{t}");
        assert_eq!(must(&d, &id, "cat /workspace/a"), "1\n", "{point}: the disk is the rollback target's");
    } else {
        // Not recorded: the sandbox was gone, so the task is recovered from
        // its latest snapshot, with a note that says so.
        assert!(t["rollback_note"].is_null(), "{t}");
        assert!(t["recovery_note"].as_str().unwrap_or_default().contains(&latest), "{t}");
        assert_eq!(must(&d, &id, "cat /workspace/a"), "2\n", "{point}: the disk is the latest snapshot's");
    }
    assert_eq!(snapshots(&d, &id).len(), 2);
    consistent(&d);
}

#[test]
fn crash_after_a_rollback_stopped_the_sandbox() {
    rollback_crash("rollback.sandbox_stopped");
}

#[test]
fn crash_after_a_rollback_restored_the_disk() {
    rollback_crash("rollback.disk_restored");
}

#[test]
fn crash_after_a_rollback_is_recorded() {
    rollback_crash("rollback.recorded");
}

fn fork_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let sum = must(&d, &id, "md5sum /workspace/data");
    let snap = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
    let out = crash_at(&mut d, point, cli(&["fork", &id, "--from", &snap]));
    assert!(!out.status.success(), "{point}: the fork was not acknowledged");
    let tasks = d.json(&["task", "list"]);
    let forks: Vec<String> = tasks.as_array().unwrap().iter().filter(|t| t["id"] != id.as_str()).map(|t| t["id"].as_str().unwrap().to_owned()).collect();
    // The fork is recorded with its branch snapshot in one step, so it
    // exists whole, and comes back from that snapshot.
    assert_eq!(forks.len(), 1, "{point}: {tasks}");
    let fork = &forks[0];
    assert_eq!(settled(&d, fork), "running");
    assert_eq!(must(&d, fork, "cat /workspace/a; md5sum /workspace/data"), format!("1\n{sum}"));
    let kinds: Vec<Value> = snapshots(&d, fork).iter().map(|s| s["kind"].clone()).collect();
    assert_eq!(kinds, vec![Value::from("branch")]);
    assert_eq!(must(&d, &id, "cat /workspace/a"), "1\n", "the source is untouched");
    consistent(&d);
}

#[test]
fn crash_after_a_fork_is_recorded() {
    fork_crash("fork.recorded");
}

#[test]
fn crash_after_a_fork_restored_its_disk() {
    fork_crash("fork.disk_restored");
}

const SIGN: &str = r#"
import sys, datetime
from standardwebhooks import Webhook
secret, msg_id, ts = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(Webhook(secret).sign(msg_id, datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc), sys.argv[4]))
"#;

/// Posts a webhook signed by the Python reference package; returns the
/// HTTP status (0 when the connection broke).
fn post_webhook(d: &Daemon, id: &str, secret: &str, msg: &str, body: &str) -> u16 {
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs().to_string();
    let sign = common::run(Command::new("python3").args(["-c", SIGN, secret, msg, &ts, body])).unwrap();
    assert!(sign.status.success(), "signing with standardwebhooks failed: {}", String::from_utf8_lossy(&sign.stderr));
    let sig = String::from_utf8_lossy(&sign.stdout).trim().to_owned();
    let url = format!("{}/v1/hooks/{id}/go", d.url);
    let out = common::output_within(
        Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"]).args([
            "-H",
            &format!("webhook-id: {msg}"),
            "-H",
            &format!("webhook-timestamp: {ts}"),
            "-H",
            &format!("webhook-signature: {sig}"),
            "--data-binary",
            body,
            &url,
        ]),
        common::CALL_DEADLINE,
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

fn event_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let secret = d.task(&id)["webhook_secret"].as_str().unwrap().to_owned();
    d.ok(&["wait", &id, "--webhook", "go"]);
    assert_eq!(d.state(&id), "suspended");
    let code = std::cell::Cell::new(0);
    crash_at(&mut d, point, |d| {
        code.set(post_webhook(d, &id, &secret, "msg_1", r#"{"n":1}"#));
        d.try_cairn(&["task", "list"]).unwrap()
    });
    assert_ne!(code.get(), 200, "{point}: the daemon died before answering");
    // The sender retries the same delivery, as senders do: accepted, and
    // it takes effect once whether or not the first one was stored.
    assert_eq!(post_webhook(&d, &id, &secret, "msg_1", r#"{"n":1}"#), 200);
    assert_eq!(settled(&d, &id), "running", "{}", d.task(&id));
    let received: Vec<Value> = events(&d, &id, "event_received").into_iter().filter(|e| e["args"]["delivery"] == "msg_1").collect();
    assert_eq!(received.len(), 1, "{point}: the event took effect exactly once: {received:?}");
    assert_eq!(must(&d, &id, "cat /workspace/a"), "1\n");
    consistent(&d);
}

#[test]
fn crash_after_a_webhook_is_verified() {
    event_crash("event.verified");
}

#[test]
fn crash_after_a_webhook_is_stored() {
    event_crash("event.stored");
}

#[test]
fn crash_when_a_timer_comes_due() {
    let mut d = start();
    let id = task_with_files(&d);
    d.ok(&["wait", &id, "--timer", "3s"]);
    assert_eq!(d.state(&id), "suspended");
    // The armed daemon dies when the timer comes due, before it fires.
    crash_at(&mut d, "timer.due", |_| common::output_within(Command::new("sleep").arg("5"), Duration::from_secs(30)));
    // After the restart the timer is still due: it fires, once.
    d.wait_for_state(&id, "running", Duration::from_secs(60));
    let fired: Vec<Value> = events(&d, &id, "event_received");
    assert_eq!(fired.len(), 1, "the timer fired exactly once: {fired:?}");
    assert_eq!(must(&d, &id, "cat /workspace/a"), "1\n");
    consistent(&d);
}

fn deliver_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    must(&d, &id, "echo result > /workspace/result.txt");
    let out_dir = tempfile::tempdir().unwrap();
    let out_path = out_dir.path().join("out");
    let out = crash_at(&mut d, point, cli(&["deliver", &id, "--file", "/workspace/result.txt", "--out", out_path.to_str().unwrap()]));
    assert!(!out.status.success(), "{point}: the delivery was not acknowledged");
    assert!(!out_path.join("record.json").exists(), "{point}: no record reached the client");
    let recorded = usize::from(point == "deliver.recorded");
    assert_eq!(events(&d, &id, "delivery").len(), recorded, "{point}: the delivery is in the log only once recorded");
    consistent(&d);
    // Delivering again works and verifies, with the daemon's ledger.
    let again = out_dir.path().join("again");
    d.ok(&["deliver", &id, "--file", "/workspace/result.txt", "--out", again.to_str().unwrap()]);
    d.ok(&["verify", again.join("record.json").to_str().unwrap()]);
    assert_eq!(events(&d, &id, "delivery").len(), recorded + 1);
    consistent(&d);
}

#[test]
fn crash_after_deliverables_are_stored() {
    deliver_crash("deliver.content_stored");
}

#[test]
fn crash_after_a_delivery_record_is_stored() {
    deliver_crash("deliver.record_stored");
}

#[test]
fn crash_after_a_delivery_is_recorded() {
    deliver_crash("deliver.recorded");
}

fn gc_crash(point: &str) {
    let mut d = start();
    let gone = task_with_files(&d);
    d.ok(&["snapshot", &gone]);
    let kept = task_with_files(&d);
    let sum = must(&d, &kept, "md5sum /workspace/data");
    let snap = d.json(&["snapshot", &kept])["id"].as_str().unwrap().to_owned();
    // The destroyed task's snapshots become garbage.
    d.ok(&["destroy", &gone]);
    let out = crash_at(&mut d, point, cli(&["gc", "--grace", "0s"]));
    assert!(!out.status.success(), "{point}: the gc was not acknowledged");
    consistent(&d);
    must(&d, &kept, "rm /workspace/data");
    d.ok(&["rollback", &kept, "--to", &snap, "--reason", "live data survived the gc"]);
    assert_eq!(must(&d, &kept, "md5sum /workspace/data"), sum);
}

#[test]
fn crash_after_gc_rewrote_the_index() {
    gc_crash("gc.index_rewritten");
}

#[test]
fn crash_after_gc_deleted_packs() {
    gc_crash("gc.packs_deleted");
}

#[test]
fn crash_after_a_create_is_recorded() {
    let mut d = start();
    let out = crash_at(&mut d, "create.recorded", cli(&["--json", "task", "create"]));
    assert!(!out.status.success(), "the create was not acknowledged");
    // The task's row was committed: after the restart it is there, and
    // runs (its sandbox started at the restart or at its first command).
    let tasks = d.json(&["task", "list", "--all"]);
    let tasks = tasks.as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    let id = tasks[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(must(&d, &id, "echo alive"), "alive\n");
    consistent(&d);
}

/// Waits (at most 30 s) until nothing of task `id` (whose sandbox's init
/// was `init`) is left on the host: the restart finishes a teardown.
fn teardown_finished(d: &Daemon, id: &str, init: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = d.leftovers(id, init);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the teardown was not finished after the restart: {left:?}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn crash_after_a_destroy_is_recorded() {
    let mut d = start();
    let id = task_with_files(&d);
    d.ok(&["snapshot", &id]);
    let init = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    let out = crash_at(&mut d, "destroy.state_recorded", cli(&["destroy", &id]));
    assert!(!out.status.success(), "the destroy was not acknowledged");
    // Recorded as destroyed: the restart finishes the teardown and leaves
    // nothing of the task on the host.
    assert_eq!(d.state(&id), "destroyed");
    teardown_finished(&d, &id, init);
    consistent(&d);
}

#[test]
fn crash_after_a_complete_is_recorded() {
    let mut d = start();
    let id = task_with_files(&d);
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("delivered");
    d.ok(&["deliver", &id, "--file", "/workspace/a", "--out", out.to_str().unwrap()]);
    let init = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    let answer = crash_at(&mut d, "complete.state_recorded", cli(&["task", "complete", &id]));
    assert!(!answer.status.success(), "the complete was not acknowledged");
    // Recorded as completed: the restart finishes the teardown, and the
    // records, the ledger and the delivery stay.
    assert_eq!(d.state(&id), "completed");
    teardown_finished(&d, &id, init);
    assert_eq!(events(&d, &id, "delivery").len(), 1, "the delivery made before stays");
    let err = d.fails(&["exec", &id, "--", "true"]);
    assert!(err.contains("completed"), "a completed task runs nothing: {err}");
    consistent(&d);
}

/// The image store after a restart: no half-built image or layer, no
/// download left behind (a build in progress is a `.tmp-*` name).
fn image_store_clean(d: &Daemon) {
    for dir in ["images", "layers/sha256"] {
        let left: Vec<String> = match std::fs::read_dir(d.home().join(dir)) {
            Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(".tmp-")).collect(),
            Err(_) => Vec::new(),
        };
        assert!(left.is_empty(), "{dir} holds what an unfinished build left: {left:?}\n{}", d.log());
    }
}

fn image_names(d: &Daemon) -> Vec<String> {
    d.json(&["image", "list"]).as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap().to_owned()).collect()
}

/// `image commit` killed before the template is published (no image, and
/// committing again works) or after (the image is whole, a second commit
/// is refused); either way a task made from it reads the source's files.
fn commit_crash(point: &str) {
    let mut d = start();
    let id = task_with_files(&d);
    let sum = must(&d, &id, "md5sum /workspace/data");
    let out = crash_at(&mut d, point, cli(&["image", "commit", &id, "committed"]));
    assert!(!out.status.success(), "the commit was not acknowledged");
    image_store_clean(&d);
    if point == "image.committed" {
        assert!(image_names(&d).contains(&"committed".to_owned()), "published before the kill: {:?}", image_names(&d));
        let err = d.fails(&["image", "commit", &id, "committed"]);
        assert!(err.contains("already exists"), "{err}");
    } else {
        assert!(!image_names(&d).contains(&"committed".to_owned()), "not published before the kill: {:?}", image_names(&d));
        d.ok(&["image", "commit", &id, "committed"]);
    }
    let kid = d.create(&["--image", "committed"]);
    assert_eq!(must(&d, &kid, "md5sum /workspace/data"), sum);
    assert_eq!(must(&d, &kid, "cat /workspace/a"), "1\n");
    consistent(&d);
}

#[test]
fn crash_after_a_commit_restored_the_snapshot() {
    commit_crash("image.commit_restored");
}

#[test]
fn crash_after_a_commit_published_the_template() {
    commit_crash("image.committed");
}

/// `image pull` from a registry on loopback, killed with its layers
/// downloaded (no image, no download left, the pull again works) or with
/// the image published (it is whole, a second pull is refused); either way
/// a task runs on it.
fn pull_crash(point: &str) {
    use cairn_image::testing::OciLayout;
    let reg = common::registry::Registry::start();
    let layout = tempfile::tempdir().unwrap();
    let dir = layout.path().join("img");
    OciLayout::single(&dir, &[common::registry::base_layer()]);
    reg.push(&dir, "latest", "test/crash:v1", None);
    let reference = format!("{}/test/crash:v1", reg.host());

    let mut d = start();
    let out = crash_at(&mut d, point, cli(&["image", "pull", "--insecure", &reference]));
    assert!(!out.status.success(), "the pull was not acknowledged");
    image_store_clean(&d);
    if point == "pull.imported" {
        assert!(image_names(&d).contains(&reference), "published before the kill: {:?}", image_names(&d));
        let err = d.fails(&["image", "pull", "--insecure", &reference]);
        assert!(err.contains("already exists"), "{err}");
    } else {
        assert!(!image_names(&d).contains(&reference), "not published before the kill: {:?}", image_names(&d));
        d.ok(&["image", "pull", "--insecure", &reference]);
    }
    let id = d.create(&["--image", &reference]);
    assert_eq!(must(&d, &id, "cat /etc/a"), "base a\n");
    consistent(&d);
}

#[test]
fn crash_after_a_pull_downloaded_its_layers() {
    pull_crash("pull.downloaded");
}

#[test]
fn crash_after_a_pull_published_the_image() {
    pull_crash("pull.imported");
}

/// A gvisor task's suspend killed once runsc saved the checkpoint, before
/// the snapshot holding it was taken: the suspend was never acknowledged,
/// so after the restart the task is running (its sandbox restarted from
/// that checkpoint or booted afresh on its disk), its files are there and
/// a suspend and wake then keep a process's memory as usual.
#[test]
fn crash_after_a_gvisor_checkpoint_was_saved() {
    let mut d = start();
    let id = d.create(&["--isolation", "gvisor"]);
    must(&d, &id, "echo 1 > /workspace/a");
    let before = snapshots(&d, &id).len();
    let out = crash_at(&mut d, "checkpoint.saved", cli(&["suspend", &id]));
    assert!(!out.status.success(), "the suspend was not acknowledged");
    assert_eq!(settled(&d, &id), "running", "an unacknowledged suspend leaves the task running\n{}", d.log());
    assert_eq!(must(&d, &id, "cat /workspace/a"), "1\n");
    assert_eq!(snapshots(&d, &id).len(), before, "no snapshot was recorded");
    consistent(&d);
    // Memory still crosses a suspend: a shell variable lives only there.
    must(&d, &id, "nohup sh -c 'x=$$; while :; do echo $x > /workspace/pid; sleep 0.1; done' >/dev/null 2>&1 &");
    let pid = written_pid(&d, &id, "the writer never wrote");
    d.ok(&["suspend", &id]);
    d.ok(&["resume", &id]);
    must(&d, &id, "rm /workspace/pid");
    let after = written_pid(&d, &id, "the writer did not come back with the wake");
    assert_eq!(after, pid, "the same process writes after the wake");
}

/// What the writer last put in /workspace/pid, waiting until it wrote.
/// Each read is used as read: the writer truncates the file before each
/// write, so a second read may meet it empty.
fn written_pid(d: &Daemon, id: &str, never: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pid = must(d, id, "cat /workspace/pid 2>/dev/null || true");
        if !pid.is_empty() {
            return pid;
        }
        assert!(Instant::now() < deadline, "{never}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every `fail_point!("name")` in the workspace's sources.
fn points_in_sources() -> BTreeSet<String> {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    let mut found = BTreeSet::new();
    let mut dirs = vec![crates];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                if !p.ends_with("tests") && !p.ends_with("target") {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for part in text.split("fail::fail_point!(\"").skip(1) {
                    found.insert(part.split('"').next().unwrap().to_owned());
                }
            }
        }
    }
    found
}

/// Points tested in another file, which needs more than one daemon.
const TESTED_ELSEWHERE: &[(&str, &str)] = &[("takeover.leased", "cluster.rs")];

#[test]
fn every_crash_point_has_a_test() {
    let mut tested: BTreeSet<String> = TESTED.iter().map(|s| (*s).to_owned()).collect();
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for (point, file) in TESTED_ELSEWHERE {
        let text = std::fs::read_to_string(tests.join(file)).unwrap();
        assert!(text.contains(&format!("spawn_armed(\"{point}\")")), "{file} arms {point}");
        tested.insert((*point).to_owned());
    }
    let in_sources = points_in_sources();
    assert!(in_sources.len() >= 20, "the points were found in the sources: {in_sources:?}");
    assert_eq!(in_sources, tested, "each crash point in the sources has a test here, and each tested point exists");
}
