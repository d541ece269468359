//! The SQLite store on a disk that fills up: a write that finds no room
//! fails with a clean error and leaves nothing half-written, everything
//! acknowledged before stays, and once there is room again the same store
//! handle goes on working (create, state changes, destroy), no restart.
//!
//! Each case runs on a small tmpfs of its own, mounted in a temporary
//! directory and unmounted when the case ends, also when it fails. Mounting
//! needs root: without it the cases fail, they never skip.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use cairn_core::{
    EventKind, EventSource, InboxEvent, InboxId, NewEvent, Snapshot, SnapshotId, SnapshotKind, Task, TaskConfig, TaskId, TaskState,
    Transition,
};
use cairn_store::{now_ms, Error, EventStore, LeaseStore, SnapshotStore, SqliteStore, Store, TaskStore, WaitStore};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use sqlx::Connection;

const NODE: &str = "node-a";
const TTL_MS: i64 = 3_600_000;
/// Room for the database, its log and the tasks of a case, with the
/// batches that spill out of SQLite's page cache.
const FS_BYTES: u64 = 32 << 20;
/// Whole task lives run after a failure: enough writes to go through
/// every connection of the pool, so that one left in a bad state is met.
const ROUNDS: usize = 6;

/// A tmpfs of [`FS_BYTES`] in a temporary directory.
struct TinyFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl TinyFs {
    fn mount() -> TinyFs {
        assert!(nix::unistd::geteuid().is_root(), "the disk-full tests mount a tmpfs: run them as root");
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let mnt = dir.path().join("fs");
        std::fs::create_dir(&mnt).expect("create the mount point");
        let opts = format!("size={FS_BYTES},mode=0700");
        mount(Some("tmpfs"), &mnt, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, Some(opts.as_str()))
            .expect("mount a tmpfs");
        TinyFs { mnt, _dir: dir }
    }

    fn db(&self) -> PathBuf {
        self.mnt.join("cairn.db")
    }

    fn filler(&self) -> PathBuf {
        self.mnt.join("filler")
    }

    /// Writes a file until the filesystem has no byte left.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.filler()).expect("create the filler");
        let chunk = vec![0x5a_u8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("fill the tmpfs: {e}"),
            }
        }
        let st = nix::sys::statvfs::statvfs(&self.mnt).expect("statvfs");
        assert_eq!(st.blocks_available(), 0, "the tmpfs is full");
    }

    fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        // Detached, so that a file still open (a store a failing case did
        // not close) does not keep the mount; the directory goes after.
        if let Err(e) = umount2(&self.mnt, MntFlags::MNT_DETACH) {
            eprintln!("cannot unmount {}: {e}", self.mnt.display());
        }
    }
}

/// Empties the write-ahead log into the database file and truncates it,
/// through a connection of its own: the next write then has to grow the
/// log, so that on a full disk it is the one that fails.
async fn truncate_wal(db: &Path) {
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(db);
    let mut conn = sqlx::SqliteConnection::connect_with(&opts).await.expect("open the database beside the store");
    let (busy, _, _): (i64, i64, i64) =
        sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)").fetch_one(&mut conn).await.expect("checkpoint the log");
    assert_eq!(busy, 0, "the checkpoint ran to its end");
    conn.close().await.expect("close the side connection");
}

/// What the store acknowledged for one task: all of it must be there, and
/// nothing else.
#[derive(Debug, Default)]
struct Expect {
    state: Option<TaskState>,
    events: usize,
    snapshots: BTreeSet<String>,
    inbox: BTreeSet<String>,
    baseline: Option<String>,
}

#[derive(Default)]
struct Acked(BTreeMap<TaskId, Expect>);

impl Acked {
    fn task(&mut self, id: &TaskId) -> &mut Expect {
        self.0.entry(id.clone()).or_default()
    }

    /// Compares the store with what it acknowledged: every task, its state,
    /// its whole (unbroken) log, its snapshots, inbox and baseline.
    async fn check(&self, store: &dyn Store) {
        let listed: BTreeSet<TaskId> = store.list_tasks().await.unwrap().into_iter().map(|t| t.id).collect();
        assert_eq!(listed, self.0.keys().cloned().collect(), "the tasks are exactly the acknowledged ones");
        for (id, want) in &self.0 {
            let task = store.find_task(id.as_str()).await.unwrap();
            assert_eq!(Some(task.state), want.state, "state of {id}");
            let events = store.events(id).await.unwrap();
            let chain = cairn_ledger::verify_chain(id, &events);
            assert!(chain.ok(), "the log of {id} is unbroken: {:?}", chain.problem);
            assert_eq!(events.len(), want.events, "entries in the log of {id}");
            let snapshots: BTreeSet<String> = store.snapshots(id).await.unwrap().into_iter().map(|s| s.id.to_string()).collect();
            assert_eq!(snapshots, want.snapshots, "snapshots of {id}");
            let inbox: BTreeSet<String> = store.inbox(id).await.unwrap().into_iter().map(|e| e.id.to_string()).collect();
            assert_eq!(inbox, want.inbox, "inbox of {id}");
            assert_eq!(store.baseline(id).await.unwrap(), want.baseline, "baseline of {id}");
        }
    }
}

fn log(task: &TaskId, kind: EventKind, args: serde_json::Value) -> NewEvent {
    NewEvent { task: task.clone(), kind, actor: "test".into(), args, exit_code: Some(0), duration_ms: Some(1) }
}

fn snapshot(task: &TaskId) -> Snapshot {
    Snapshot {
        id: SnapshotId::random(),
        task: task.clone(),
        parent: None,
        kind: SnapshotKind::Milestone,
        note: "n".into(),
        healthy: true,
        step: 1,
        memory: "remember".into(),
        with_memory: false,
        config: TaskConfig::default(),
        manifest: "ab".repeat(32),
        files: 1,
        bytes: 2,
        added_bytes: 3,
        freeze_ms: 1.0,
        duration_ms: 2.0,
        created_ms: now_ms(),
    }
}

/// Creates a task as the daemon does (row, lease, creation event). Stops at
/// the first write that fails; what returned Ok is recorded.
async fn create(store: &SqliteStore, acked: &mut Acked) -> Result<TaskId, Error> {
    let t = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
    store.insert_task(&t).await?;
    acked.task(&t.id).state = Some(TaskState::Created);
    store.acquire_lease(&t.id, NODE, TTL_MS).await?.expect("a new task's lease is free");
    store.append_event(&log(&t.id, EventKind::Create, serde_json::json!({}))).await?;
    acked.task(&t.id).events += 1;
    Ok(t.id)
}

/// A created task, started: what the writes under test are made to.
async fn running(store: &SqliteStore, acked: &mut Acked) -> TaskId {
    let id = create(store, acked).await.unwrap();
    store.transition(&id, TaskState::Created, Transition::Start).await.unwrap();
    acked.task(&id).state = Some(TaskState::Running);
    id
}

/// A task's whole life on the store: create, exec, suspend, wake, destroy.
async fn life(store: &SqliteStore, acked: &mut Acked) {
    let id = running(store, acked).await;
    store.end_command(&log(&id, EventKind::Exec, serde_json::json!({"argv": ["true"]}))).await.unwrap();
    acked.task(&id).events += 1;
    store.transition(&id, TaskState::Running, Transition::Suspend).await.unwrap();
    assert_eq!(store.finish_suspend(&id, None, &log(&id, EventKind::Suspend, serde_json::json!({}))).await.unwrap(), TaskState::Suspended);
    acked.task(&id).events += 1;
    assert!(store.begin_wake(&id).await.unwrap());
    store.acquire_lease(&id, NODE, TTL_MS).await.unwrap().expect("a suspended task's lease is free");
    store.finish_wake(&id, &log(&id, EventKind::Wake, serde_json::json!({}))).await.unwrap();
    acked.task(&id).events += 1;
    store.renew_leases(NODE, TTL_MS).await.unwrap();
    store.transition(&id, TaskState::Running, Transition::Destroy).await.unwrap();
    store.append_event(&log(&id, EventKind::Destroy, serde_json::json!({}))).await.unwrap();
    acked.task(&id).events += 1;
    acked.task(&id).state = Some(TaskState::Destroyed);
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A create's row is one statement of its own; its lease and event
    /// follow in transactions.
    Create,
    /// A fork is created in one transaction: task, event, branch snapshot.
    Fork,
    Intake,
    ExecEnd,
    SnapshotRecord,
    Suspend,
    LeaseRenewal,
    /// A batch larger than SQLite's page cache: it spills to the log
    /// before the commit, so that a statement fails, not the commit.
    EgressBatch,
}

/// One write of `kind` to `task`, recorded when it returns Ok.
async fn write(store: &SqliteStore, acked: &mut Acked, kind: Kind, task: &TaskId) -> Result<(), Error> {
    match kind {
        Kind::Create => create(store, acked).await.map(drop),
        Kind::Fork => {
            let fork = Task::new(TaskId::random(), None, TaskConfig::default(), now_ms());
            let branch = Snapshot { kind: SnapshotKind::Branch, ..snapshot(&fork.id) };
            let created = log(&fork.id, EventKind::Create, serde_json::json!({"from": task}));
            store.insert_fork(&fork, &created, &branch, &log(&fork.id, EventKind::Snapshot, serde_json::json!({}))).await?;
            let t = acked.task(&fork.id);
            t.state = Some(TaskState::Created);
            t.events += 2;
            t.snapshots.insert(branch.id.to_string());
            t.baseline = Some(branch.manifest);
            Ok(())
        }
        Kind::Intake => {
            let ev = InboxEvent {
                id: InboxId::random(),
                task: task.clone(),
                source: EventSource::Operator,
                name: "deploy".into(),
                delivery: Some(InboxId::random().to_string()),
                data: serde_json::json!({"n": 1}),
                received_ms: now_ms(),
                wait: None,
            };
            store.deliver(&ev).await?;
            let t = acked.task(task);
            t.inbox.insert(ev.id.to_string());
            t.events += 1;
            Ok(())
        }
        Kind::ExecEnd => {
            store.end_command(&log(task, EventKind::Exec, serde_json::json!({"argv": ["make"]}))).await?;
            acked.task(task).events += 1;
            Ok(())
        }
        Kind::SnapshotRecord => {
            let s = snapshot(task);
            let baseline = format!("manifest-{}", s.id);
            store.insert_snapshot(&s, &baseline, Some("remember"), &log(task, EventKind::Snapshot, serde_json::json!({}))).await?;
            let t = acked.task(task);
            t.snapshots.insert(s.id.to_string());
            t.baseline = Some(baseline);
            t.events += 1;
            Ok(())
        }
        Kind::Suspend => {
            store.transition(task, TaskState::Running, Transition::Suspend).await?;
            acked.task(task).state = Some(TaskState::Suspending);
            let state = store.finish_suspend(task, None, &log(task, EventKind::Suspend, serde_json::json!({}))).await?;
            let t = acked.task(task);
            t.state = Some(state);
            t.events += 1;
            Ok(())
        }
        Kind::LeaseRenewal => {
            let before = store.lease(task).await.unwrap();
            let res = store.renew_leases(NODE, TTL_MS).await;
            if res.is_err() {
                assert_eq!(store.lease(task).await.unwrap(), before, "a failed renewal changes no lease");
            }
            res.map(drop)
        }
        Kind::EgressBatch => {
            let big = "x".repeat(64 << 10);
            let batch: Vec<NewEvent> = (0..48)
                .map(|i| log(task, EventKind::Egress, serde_json::json!({"host": format!("h{i}.example.com"), "pad": big})))
                .collect();
            store.append_events(&batch).await?;
            acked.task(task).events += batch.len();
            Ok(())
        }
    }
}

/// SQLite's "database or disk is full", as the store reports it.
fn is_disk_full(e: &Error) -> bool {
    match e {
        Error::Query(_, sqlx::Error::Database(d)) => d.code().as_deref() == Some("13") || d.message().contains("disk is full"),
        _ => false,
    }
}

async fn fill_fail_and_recover(kind: Kind) {
    let fs = TinyFs::mount();
    let store = SqliteStore::open(&fs.db()).await.expect("open the store on the tmpfs");
    let mut acked = Acked::default();
    for _ in 0..ROUNDS {
        life(&store, &mut acked).await;
    }
    acked.check(&store).await;

    // Twice: a store that recovered once recovers again.
    for _ in 0..2 {
        let subjects = [running(&store, &mut acked).await, running(&store, &mut acked).await];
        truncate_wal(&fs.db()).await;
        fs.fill();
        let mut failed = None;
        for task in &subjects {
            if let Err(e) = write(&store, &mut acked, kind, task).await {
                failed = Some((task, e));
                break;
            }
        }
        let (task, err) = failed.unwrap_or_else(|| panic!("a {kind:?} on a full disk fails"));
        assert!(is_disk_full(&err), "a {kind:?} on a full disk fails for want of room, cleanly: {err:?}");
        // Reads go on while the disk is full; the failed write left nothing.
        acked.check(&store).await;

        fs.free();
        for _ in 0..ROUNDS {
            life(&store, &mut acked).await;
        }
        // The write that failed goes through now (a suspend whose first
        // step was acknowledged is past it).
        if acked.task(task).state == Some(TaskState::Running) {
            write(&store, &mut acked, kind, task).await.unwrap_or_else(|e| panic!("a {kind:?} once there is room: {e}"));
        }
        acked.check(&store).await;
    }

    // And all of it is on the disk: a new handle reads the same.
    store.close().await;
    let again = SqliteStore::open(&fs.db()).await.expect("open the store again");
    acked.check(&again).await;
    again.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_on_a_full_disk() {
    fill_fail_and_recover(Kind::Create).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_on_a_full_disk() {
    fill_fail_and_recover(Kind::Fork).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_intake_on_a_full_disk() {
    fill_fail_and_recover(Kind::Intake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_end_on_a_full_disk() {
    fill_fail_and_recover(Kind::ExecEnd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_record_on_a_full_disk() {
    fill_fail_and_recover(Kind::SnapshotRecord).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_on_a_full_disk() {
    fill_fail_and_recover(Kind::Suspend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_on_a_full_disk() {
    fill_fail_and_recover(Kind::LeaseRenewal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_batch_larger_than_the_page_cache_on_a_full_disk() {
    fill_fail_and_recover(Kind::EgressBatch).await;
}
