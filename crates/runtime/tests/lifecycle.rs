//! The task lifecycle over the fake sandbox driver: every operation, and a
//! failure injected in the middle of each, with a real store and a real
//! blob store in a temporary directory. No root (run as root, the last test
//! runs the others again as `nobody`), no namespaces, no daemon:
//! the whole file runs in well under a second or two.
//!
//! What a failure must leave behind is each operation's policy (see
//! `materialise.rs` and docs/architecture.md): a failed start fails the
//! task and gives its uid slot back (also one after the restore of a wake,
//! a rollback or a fork), a failed snapshot or suspend leaves the
//! task running; a failed restore sends a wake back to `suspended`, marks
//! a rolled-back sandbox lost (the next use recovers it), fails a fork's
//! new task only, and leaves a recovery to try again.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use cairn_api::exec::{ExecStart, ServerFrame, STDOUT};
use cairn_api::snapshots::{ForkRequest, RollbackRequest, SnapshotRequest};
use cairn_api::tasks::CreateRequest;
use cairn_api::waits::{ApproveRequest, WaitRequest};
use cairn_core::{EventKind, SandboxState, TaskState};
use cairn_runtime::deliver::DeliverRequest;
use cairn_runtime::exec::{ExecChannel, ExecInput, ExecOutput};
use cairn_runtime::{Config, Home, Runtime};
use cairn_sandbox::fake::{FakeDriver, Op};
use cairn_sandbox::SandboxDriver;

/// A runtime over a fake driver in a temporary home, with a tiny image.
struct World {
    rt: Arc<Runtime>,
    fake: Arc<FakeDriver>,
    home: Home,
    config: Config,
    _dir: tempfile::TempDir,
}

const IMAGE: &str = "tiny";

impl World {
    async fn new() -> World {
        Self::with_config(Config { disk_pool: 0, ..Config::default() }).await
    }

    async fn with_config(config: Config) -> World {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let fake = Arc::new(FakeDriver::new(&dir.path().join("sandboxes")).unwrap());
        let rt = Self::runtime(&home, &config, &fake).await;
        // An image the test user owns (the host image is the native
        // driver's, built as root).
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        std::fs::write(tree.join("etc/os-release"), "NAME=tiny\n").unwrap();
        rt.import_image(cairn_api::images::ImportRequest { name: IMAGE.into(), path: tree.display().to_string(), tag: None }).await.unwrap();
        World { rt, fake, home, config, _dir: dir }
    }

    async fn runtime(home: &Home, config: &Config, fake: &Arc<FakeDriver>) -> Arc<Runtime> {
        let driver: Arc<dyn SandboxDriver> = fake.clone();
        let rt = Arc::new(Runtime::with_driver(home, config, driver, "127.0.0.1:9".parse().unwrap()).await.unwrap());
        rt.bring_up("http://127.0.0.1:9".into()).await;
        rt
    }

    /// A second runtime on the same home and driver: a daemon restart.
    async fn restart(&self) -> Arc<Runtime> {
        // The old daemon is gone: none of its background work goes on.
        self.rt.shutdown().await;
        Self::runtime(&self.home, &self.config, &self.fake).await
    }

    async fn create(&self) -> String {
        let req = CreateRequest { image: Some(IMAGE.into()), workdir: Some("/".into()), ..Default::default() };
        self.rt.create(req, "test").await.unwrap().task.id.to_string()
    }

    /// Runs `sh -c script` in the task; its exit code and stdout.
    async fn sh(&self, task: &str, script: &str) -> Result<(i32, String), cairn_runtime::Error> {
        sh(&self.rt, task, script).await
    }

    async fn state(&self, task: &str) -> (TaskState, SandboxState) {
        let t = self.rt.show(task).await.unwrap().task;
        (t.state, t.sandbox)
    }

    async fn snapshot(&self, task: &str, note: &str) -> String {
        let req = SnapshotRequest { kind: Some("milestone".into()), note: Some(note.into()), ..Default::default() };
        self.rt.snapshot(task, req, "test").await.unwrap().id.to_string()
    }

    async fn events(&self, task: &str, kind: EventKind) -> Vec<cairn_core::Event> {
        self.rt.events(task).await.unwrap().into_iter().filter(|e| e.kind == kind).collect()
    }

    /// Waits (briefly) until the task is in `state`.
    async fn until_state(&self, task: &str, state: TaskState) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.state(task).await.0 != state {
            assert!(tokio::time::Instant::now() < deadline, "task {task} never became {state}: {:?}", self.state(task).await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn sh(rt: &Arc<Runtime>, task: &str, script: &str) -> Result<(i32, String), cairn_runtime::Error> {
    let mut chan = Collect::default();
    let start = ExecStart { argv: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() };
    rt.exec(task, "test", start, &mut chan).await?;
    let code = chan.exit.unwrap_or_else(|| panic!("no exit frame for {script:?}"));
    Ok((code, String::from_utf8_lossy(&chan.stdout).into_owned()))
}

/// An exec client that keeps what it is sent and never sends anything.
#[derive(Default)]
struct Collect {
    stdout: Vec<u8>,
    exit: Option<i32>,
}

impl ExecChannel for Collect {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        match out {
            ExecOutput::Output(STDOUT, data) => self.stdout.extend_from_slice(data),
            ExecOutput::Output(..) => {}
            ExecOutput::Frame(ServerFrame::Exit { exit, .. }) => self.exit = Some(exit.exit_code),
            ExecOutput::Frame(_) => {}
        }
        true
    }

    async fn recv(&mut self) -> ExecInput {
        std::future::pending().await
    }
}

fn rollback_to(snapshot: &str, reason: &str) -> RollbackRequest {
    RollbackRequest { to: Some(snapshot.into()), reason: reason.into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_starts_a_sandbox_and_a_failed_start_fails_the_task() {
    let w = World::new().await;
    let t = w.create().await;
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert!(w.fake.running(&t).is_some());
    assert_eq!(w.fake.ops_for(&t).iter().filter(|o| **o == Op::Start).count(), 1);

    w.fake.fail_next(Op::Start);
    let err = w.rt.create(CreateRequest { image: Some(IMAGE.into()), workdir: Some("/".into()), ..Default::default() }, "test").await;
    assert!(err.is_err(), "a failed start is an error");
    let failed = w.rt.list().await.unwrap().into_iter().find(|v| v.task.id.as_str() != t).unwrap().task;
    assert_eq!(failed.state, TaskState::Failed);
    assert!(failed.sandbox_note.unwrap_or_default().contains("failed to start"));
    assert!(w.fake.running(failed.id.as_str()).is_none());
    // Its uid slot went back: only the first task holds one.
    let held: Vec<_> = (0..4).filter_map(|s| w.fake.slot_holder(s)).collect();
    assert_eq!(held, vec![t.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_in_the_task_and_a_failed_exec_leaves_it_running() {
    let w = World::new().await;
    let t = w.create().await;
    assert_eq!(w.sh(&t, "echo hello > notes.txt; cat notes.txt").await.unwrap(), (0, "hello\n".into()));
    assert_eq!(w.sh(&t, "exit 3").await.unwrap().0, 3);
    let logged = w.events(&t, EventKind::Exec).await;
    assert_eq!(logged.iter().map(|e| e.exit_code).collect::<Vec<_>>(), vec![Some(0), Some(3)]);

    w.fake.fail_next(Op::Exec);
    assert!(w.sh(&t, "true").await.is_err());
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert_eq!(w.sh(&t, "cat notes.txt").await.unwrap().1, "hello\n", "the next command runs");

    // The end of a command is activity: an idle suspend counts from there.
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    w.sh(&t, "sleep 0.3").await.unwrap();
    let last = w.rt.show(&t).await.unwrap().task.last_activity_ms;
    assert!(last >= started + 300, "last activity {} ms after the command started", last - started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_freezes_and_a_failed_freeze_records_nothing() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo one > a.txt").await.unwrap();
    let s = w.snapshot(&t, "first").await;
    let snaps = w.rt.list_snapshots(&t).await.unwrap();
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].id.to_string(), s);
    assert!(snaps[0].files >= 1);
    assert_eq!(w.fake.freezes(), 1);
    assert!(!w.fake.is_frozen(&t), "thawed after the capture");

    w.fake.fail_next(Op::Freeze);
    let req = SnapshotRequest { kind: Some("milestone".into()), ..Default::default() };
    assert!(w.rt.snapshot(&t, req, "test").await.is_err());
    assert_eq!(w.rt.list_snapshots(&t).await.unwrap().len(), 1, "no row for the failed snapshot");
    assert!(!w.fake.is_frozen(&t));
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_and_wake_keep_the_files_and_a_failed_suspend_keeps_running() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo before > state.txt").await.unwrap();

    // A failure in the suspend's snapshot: nothing was torn down.
    w.fake.fail_next(Op::Freeze);
    assert!(w.rt.suspend(&t, "test").await.is_err());
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert!(w.fake.running(&t).is_some());

    // A wait suspends; the approval wakes it through the wake scheduler.
    let view = w.rt.wait(&t, WaitRequest { approval: Some("go?".into()), ..Default::default() }, "test").await.unwrap();
    assert_eq!(w.state(&t).await.0, TaskState::Suspended);
    assert!(w.fake.running(&t).is_none(), "no sandbox while suspended");
    w.rt.approve(&t, ApproveRequest::default(), "test").await.unwrap();
    w.until_state(&t, TaskState::Running).await;
    let woken = w.rt.get_wait(view.id.as_str(), Some(Duration::from_secs(5))).await.unwrap();
    assert!(woken.satisfied_ms.is_some());
    assert_eq!(w.sh(&t, "cat state.txt").await.unwrap().1, "before\n");
    let wake = w.events(&t, EventKind::Wake).await;
    assert_eq!(wake.last().unwrap().args["from_cache"], true, "the kept disk was used as it is");
}

/// The kept disk is used as it is only under the uid range it was left
/// with: a task woken onto another uid slot (its own was taken meanwhile)
/// is restored from its snapshot instead, with its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_onto_another_uid_slot_restores_from_the_snapshot() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo kept > state.txt").await.unwrap();
    w.rt.suspend(&t, "test").await.unwrap();
    assert!(w.fake.has_disk(&t), "the disk is kept as a cache");
    // Another task takes the slot the suspended one had.
    let other = w.create().await;
    w.rt.resume(&t, "test").await.unwrap();
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert_eq!(w.events(&t, EventKind::Wake).await.last().unwrap().args["from_cache"], false, "another uid range: restored");
    assert_eq!(w.sh(&t, "cat state.txt").await.unwrap().1, "kept\n");
    assert_eq!(w.sh(&other, "echo ok").await.unwrap().1, "ok\n");
}

/// A node at its capacity leaves a wake to another node: the task stays
/// `waking` with no sandbox here; with room again, it wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_leaves_a_wake_waking_and_wakes_it_once_it_has_room() {
    let w = World::with_config(Config { disk_pool: 0, capacity: Some(1), ..Config::default() }).await;
    let t = w.create().await;
    w.sh(&t, "echo kept > state.txt").await.unwrap();
    w.rt.suspend(&t, "test").await.unwrap();
    let other = w.create().await;
    let view = w.rt.resume(&t, "test").await.unwrap();
    assert_eq!(view.task.state, TaskState::Waking, "no room: left for another node");
    assert!(w.fake.running(&t).is_none(), "no sandbox started past the capacity");
    w.rt.destroy(&other, "test").await.unwrap();
    w.rt.resume(&t, "test").await.unwrap();
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert_eq!(w.sh(&t, "cat state.txt").await.unwrap().1, "kept\n");
}

/// The idle suspender: a task with `idle_suspend` is suspended once that
/// long has passed since its last command, not before; a task without it
/// runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_task_is_suspended_once_its_idle_time_has_passed_and_not_before() {
    let w = World::new().await;
    let req = CreateRequest { image: Some(IMAGE.into()), workdir: Some("/".into()), idle_suspend: Some("2s".into()), ..Default::default() };
    let idle = w.rt.create(req, "test").await.unwrap().task.id.to_string();
    let busy = w.create().await;
    let last_command = std::time::Instant::now();
    w.sh(&idle, "echo last > state.txt").await.unwrap();
    w.until_state(&idle, TaskState::Suspended).await;
    let after = last_command.elapsed();
    assert!(after >= Duration::from_secs(2), "suspended {after:?} after its last command, before its idle time of 2 s");
    assert_eq!(w.state(&busy).await, (TaskState::Running, SandboxState::Ready), "a task without idle_suspend runs on");
    let suspend = w.events(&idle, EventKind::Suspend).await;
    assert_eq!(suspend[0].args["reason"], "idle", "{suspend:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_that_cannot_restore_goes_back_to_suspended_and_succeeds_later() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo kept > state.txt").await.unwrap();
    w.rt.suspend(&t, "test").await.unwrap();
    // No local disk (as on another node): the wake restores from the blob store.
    std::fs::remove_dir_all(w.fake.disk_dir(&t)).unwrap();
    assert!(!w.fake.has_disk(&t));

    w.fake.fail_next(Op::PrepareDisk);
    assert!(w.rt.resume(&t, "test").await.is_err());
    assert_eq!(w.state(&t).await.0, TaskState::Suspended, "back to suspended, snapshot intact");
    let failed = w.events(&t, EventKind::Wake).await;
    assert_eq!(failed.last().unwrap().exit_code, Some(1));

    w.rt.resume(&t, "test").await.unwrap();
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
    assert_eq!(w.sh(&t, "cat state.txt").await.unwrap().1, "kept\n");
    assert_eq!(w.events(&t, EventKind::Wake).await.last().unwrap().args["from_cache"], false);
}

/// What a sandbox start that failed after its disk was restored must leave:
/// the task failed with the start's error as its sandbox's note, no
/// sandbox, no uid slot held, and a failed `sandbox_start` logged; its disk
/// goes with a destroy.
async fn assert_failed_start_leaves_nothing(w: &World, task: &str) {
    let t = w.rt.show(task).await.unwrap().task;
    assert_eq!((t.state, t.sandbox), (TaskState::Failed, SandboxState::None), "{task}");
    assert!(t.sandbox_note.as_deref().unwrap_or_default().contains("failed to start"), "{:?}", t.sandbox_note);
    assert!(w.fake.running(task).is_none(), "no sandbox is left running");
    assert!(w.rt.live(&t.id).is_none(), "the runtime holds no live sandbox");
    assert!((0..8).all(|s| w.fake.slot_holder(s).as_deref() != Some(task)), "its uid slot is free");
    let ops = w.fake.ops_for(task);
    let restored = ops.iter().rposition(|o| *o == Op::PrepareDisk);
    assert!(restored.is_some_and(|r| ops[r..].contains(&Op::Start)), "the start came after a restore: {ops:?}");
    assert_eq!(w.events(task, EventKind::SandboxStart).await.last().unwrap().exit_code, Some(1));
    w.rt.destroy(task, "test").await.unwrap();
    assert!(!w.fake.has_disk(task), "the destroy removes its disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_whose_sandbox_fails_to_start_after_the_restore_fails_the_task() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo kept > state.txt").await.unwrap();
    w.rt.suspend(&t, "test").await.unwrap();
    // No local disk: the wake restores from the blob store, then starts.
    std::fs::remove_dir_all(w.fake.disk_dir(&t)).unwrap();

    w.fake.fail_next(Op::Start);
    let err = w.rt.resume(&t, "test").await.unwrap_err();
    assert!(err.to_string().contains("failed to start"), "{err}");
    assert!(w.fake.has_disk(&t), "the disk was restored before the start");
    // Unlike a failed restore (back to `suspended`), a failed start fails
    // the task, as a failed start does everywhere.
    assert_eq!(w.events(&t, EventKind::Wake).await.last().unwrap().exit_code, Some(1));
    assert_failed_start_leaves_nothing(&w, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_whose_sandbox_fails_to_start_after_the_restore_fails_the_task() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo good > code.txt").await.unwrap();
    let good = w.snapshot(&t, "green").await;
    w.sh(&t, "echo broken > code.txt").await.unwrap();

    w.fake.fail_next(Op::Start);
    let err = w.rt.rollback(&t, rollback_to(&good, "tests went red"), "test").await.unwrap_err();
    assert!(err.to_string().contains("failed to start"), "{err}");
    // The restore was recorded before the start: the task's record names
    // the target.
    let task = w.rt.show(&t).await.unwrap().task;
    assert_eq!(task.rollback_note.unwrap().to.to_string(), good);
    let ended = w.events(&t, EventKind::Rollback).await;
    assert_eq!((ended.last().unwrap().args["phase"].as_str(), ended.last().unwrap().exit_code), (Some("end"), Some(0)));
    assert_failed_start_leaves_nothing(&w, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_whose_sandbox_fails_to_start_after_the_restore_fails_only_the_child() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo base > plan.txt").await.unwrap();
    let s = w.snapshot(&t, "fork point").await;

    w.fake.fail_next(Op::Start);
    let err = w.rt.fork(&t, ForkRequest { from: Some(s.clone()), count: Some(1) }, "test").await.unwrap_err();
    assert!(err.to_string().contains("failed to start"), "{err}");
    let all = w.rt.list().await.unwrap();
    assert_eq!(all.len(), 2);
    let child = all.iter().find(|v| v.task.id.as_str() != t).unwrap().task.id.to_string();
    assert_failed_start_leaves_nothing(&w, &child).await;
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready), "the source runs on");
    // The snapshot forks again, into a child that runs.
    let again = w.rt.fork(&t, ForkRequest { from: Some(s), count: Some(1) }, "test").await.unwrap();
    assert_eq!(w.sh(again[0].task.id.as_str(), "true").await.unwrap().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_restores_in_place_and_a_failed_restore_leaves_it_to_recovery() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo good > code.txt").await.unwrap();
    let good = w.snapshot(&t, "green").await;
    w.sh(&t, "echo broken > code.txt; echo junk > extra.txt").await.unwrap();

    w.rt.rollback(&t, rollback_to(&good, "tests went red"), "test").await.unwrap();
    assert_eq!(w.sh(&t, "cat code.txt; ls").await.unwrap().1, "good\ncode.txt\n");
    let task = w.rt.show(&t).await.unwrap().task;
    assert_eq!(task.rollback_note.unwrap().reason, "tests went red", "the reason is handed back");

    // A restore that fails after the old sandbox is gone: the task is
    // marked lost, and its next use recovers it from the target.
    w.sh(&t, "echo broken > code.txt").await.unwrap();
    w.fake.fail_next(Op::PrepareDisk);
    assert!(w.rt.rollback(&t, rollback_to(&good, "again"), "test").await.is_err());
    let (state, sandbox) = w.state(&t).await;
    assert_eq!((state, sandbox), (TaskState::Running, SandboxState::Lost));
    assert!(w.fake.running(&t).is_none());
    assert_eq!(w.sh(&t, "cat code.txt").await.unwrap().1, "good\n", "recovered from its head snapshot on use");
    assert!(!w.events(&t, EventKind::Recovered).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_makes_tasks_from_a_snapshot_and_a_failed_fork_fails_only_the_child() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo base > plan.txt").await.unwrap();
    let s = w.snapshot(&t, "fork point").await;

    let children = w.rt.fork(&t, ForkRequest { from: Some(s.clone()), count: Some(2) }, "test").await.unwrap();
    assert_eq!(children.len(), 2);
    // The children share the snapshot as a read-only layer of their image
    // (the fake driver mounts no overlay, so it is read here, not through
    // the sandbox); each starts with an empty writable layer of its own.
    let base = children[0].task.config.image.clone();
    assert!(base.starts_with(".fork-"), "{base}");
    let detail = w.rt.image_detail(&base).await.unwrap();
    let root = detail.image.layers().into_iter().find(|l| l.at == std::path::Path::new("/")).unwrap();
    assert_eq!((root.history, root.lowers.len()), (1, 2), "the snapshot's layer over the image: {root:?}");
    assert_eq!(std::fs::read_to_string(root.lowers[0].join("plan.txt")).unwrap(), "base\n");
    for (i, c) in children.iter().enumerate() {
        let id = c.task.id.to_string();
        assert_eq!(c.task.config.image, base, "one base for every fork of the snapshot");
        assert_eq!(w.sh(&id, &format!("echo {i} >> plan.txt; ls; cat plan.txt")).await.unwrap().1, format!("plan.txt\n{i}\n"));
    }
    assert_eq!(w.sh(&t, "cat plan.txt").await.unwrap().1, "base\n", "the source is untouched");

    w.fake.fail_next(Op::PrepareDisk);
    assert!(w.rt.fork(&t, ForkRequest { from: Some(s), count: Some(1) }, "test").await.is_err());
    let all = w.rt.list().await.unwrap();
    assert_eq!(all.len(), 4);
    let failed: Vec<_> = all.iter().filter(|v| v.task.state == TaskState::Failed).collect();
    assert_eq!(failed.len(), 1, "only the new child failed");
    let id = failed[0].task.id.to_string();
    assert!(!w.fake.has_disk(&id), "its disk is gone");
    assert!((0..8).all(|s| w.fake.slot_holder(s).as_deref() != Some(id.as_str())), "its slot is free");
    assert_eq!(w.state(&t).await, (TaskState::Running, SandboxState::Ready));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_a_restart_restores_the_head_snapshot_and_retries_after_a_failure() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo saved > work.txt").await.unwrap();
    w.snapshot(&t, "saved").await;
    w.sh(&t, "echo unsaved >> work.txt").await.unwrap();
    // The host loses the sandbox (and, as after a reboot, its disk).
    assert!(w.fake.kill_init(&t));
    w.fake.fail_next(Op::PrepareDisk);
    std::fs::remove_dir_all(w.fake.disk_dir(&t)).unwrap();

    // The restarted runtime finds it lost; its first recovery fails.
    let rt = w.restart().await;
    let task = rt.show(&t).await.unwrap().task;
    assert_eq!((task.state, task.sandbox), (TaskState::Running, SandboxState::Lost));
    // The next use recovers it from the snapshot, with a note of what was lost.
    assert_eq!(sh(&rt, &t, "cat work.txt").await.unwrap().1, "saved\n");
    let note = rt.show(&t).await.unwrap().task.recovery_note.unwrap();
    assert!(note.contains("recovered from snapshot"), "{note}");
}

/// A suspend that met no event stays suspended: nothing schedules a wake
/// behind it (only an event that came while it was suspending does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_without_an_event_stays_suspended() {
    let w = World::new().await;
    let t = w.create().await;
    assert_eq!(w.rt.suspend(&t, "test").await.unwrap().task.state, TaskState::Suspended);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(w.state(&t).await.0, TaskState::Suspended, "still suspended");
    assert!(w.events(&t, EventKind::Wake).await.is_empty(), "no wake was started");
    assert!(w.fake.running(&t).is_none());
}

/// A recovery's note says which steps were lost: those after the head
/// snapshot, or none when the snapshot was the last step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_note_names_the_lost_steps_or_none() {
    let w = World::new().await;
    let lost = w.create().await;
    let kept = w.create().await;
    for t in [&lost, &kept] {
        w.sh(t, "echo one > work.txt").await.unwrap();
        w.snapshot(t, "saved").await;
    }
    w.sh(&lost, "echo two >> work.txt").await.unwrap();
    w.sh(&lost, "echo three >> work.txt").await.unwrap();
    let (snap_step, last_step) = {
        let snaps = w.rt.list_snapshots(&lost).await.unwrap();
        (snaps.last().unwrap().step, w.rt.show(&lost).await.unwrap().task.step)
    };
    assert!(last_step > snap_step);
    for t in [&lost, &kept] {
        assert!(w.fake.kill_init(t));
    }
    let rt = w.restart().await;
    for t in [&lost, &kept] {
        sh(&rt, t, "true").await.unwrap();
    }
    let note = rt.show(&lost).await.unwrap().task.recovery_note.unwrap();
    assert!(note.contains(&format!("steps {} to {last_step} and their changes to files were lost", snap_step + 1)), "{note}");
    let note = rt.show(&kept).await.unwrap().task.recovery_note.unwrap();
    assert!(note.ends_with("nothing was lost"), "{note}");
}

/// A task left `waking` (a full node left its wake) is woken by the next
/// daemon's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_left_waking_is_woken_after_a_restart() {
    let w = World::with_config(Config { disk_pool: 0, capacity: Some(1), ..Config::default() }).await;
    let t = w.create().await;
    w.sh(&t, "echo kept > state.txt").await.unwrap();
    w.rt.suspend(&t, "test").await.unwrap();
    let other = w.create().await;
    assert_eq!(w.rt.resume(&t, "test").await.unwrap().task.state, TaskState::Waking);
    w.rt.destroy(&other, "test").await.unwrap();
    let rt = w.restart().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rt.show(&t).await.unwrap().task.state != TaskState::Running {
        assert!(tokio::time::Instant::now() < deadline, "never woken: {:?}", rt.show(&t).await.unwrap().task.state);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sh(&rt, &t, "cat state.txt").await.unwrap().1, "kept\n");
    let wake = rt.events(&t).await.unwrap().into_iter().rev().find(|e| e.kind == EventKind::Wake).unwrap();
    assert_eq!(wake.args["trigger"], "restart of the daemon", "{wake:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_records_outputs_and_a_failed_read_records_nothing() {
    let w = World::new().await;
    let t = w.create().await;
    w.sh(&t, "echo result > out.txt").await.unwrap();

    w.fake.fail_next(Op::OpenRoot);
    let req = DeliverRequest { files: vec!["/out.txt".into()], ..Default::default() };
    assert!(w.rt.deliver_outputs(&t, req.clone(), "test").await.is_err());
    assert!(w.events(&t, EventKind::Delivery).await.is_empty(), "nothing recorded");

    let d = w.rt.deliver_outputs(&t, DeliverRequest { complete: true, ..req }, "test").await.unwrap();
    assert_eq!(d.deliverables.len(), 1);
    assert!(d.completed);
    assert_eq!(w.state(&t).await.0, TaskState::Completed);
    assert!(w.fake.running(&t).is_none() && !w.fake.has_disk(&t), "nothing of the sandbox is left");
    let stored = w.rt.deliverable(&d.deliverables[0].sha256).await.unwrap();
    assert_eq!(&stored[..], b"result\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_removes_the_sandbox_and_its_slot() {
    let w = World::new().await;
    let t = w.create().await;
    w.rt.destroy(&t, "test").await.unwrap();
    assert_eq!(w.state(&t).await.0, TaskState::Destroyed);
    assert!(w.fake.running(&t).is_none() && !w.fake.has_disk(&t));
    assert!((0..4).all(|s| w.fake.slot_holder(s).is_none()));
    assert!(w.sh(&t, "true").await.is_err(), "a destroyed task runs nothing");
}

/// Everything above runs without root: as root (how the suite runs), this
/// file's other tests run again as `nobody`, and must all pass there.
#[test]
fn every_lifecycle_test_here_runs_without_root() {
    if !rustix::process::geteuid().is_root() {
        return; // this run is the unprivileged one
    }
    use std::os::unix::fs::PermissionsExt;
    // A copy of this binary where `nobody` can run it (the checkout may sit
    // in a directory only root enters), and a directory it may write in.
    let scratch = tempfile::Builder::new().prefix("cairn-nobody-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let me = scratch.path().join("lifecycle");
    std::fs::copy(std::env::current_exe().unwrap(), &me).unwrap();
    std::fs::set_permissions(&me, std::fs::Permissions::from_mode(0o755)).unwrap();
    let writable = scratch.path().join("tmp");
    std::fs::create_dir(&writable).unwrap();
    std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--"])
        .arg(&me)
        .args(["--skip", "every_lifecycle_test_here_runs_without_root", "--test-threads=2"])
        .current_dir(&writable)
        .env("TMPDIR", &writable)
        .env("HOME", &writable)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv (util-linux) runs this binary as nobody");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "as nobody:\n{text}");
    // Every test of the file ran there, not a filtered few.
    let ran = text.lines().filter(|l| l.starts_with("test ") && l.ends_with(" ok")).count();
    let tests = include_str!("lifecycle.rs").matches("\n#[tokio::test(").count();
    assert_eq!(ran, tests, "as nobody:\n{text}");
}
