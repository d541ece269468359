//! The store's test suite, written once against the [`Store`] trait object
//! and run against every backend, so that they all keep the same contract.
//!
//! A backend takes part with a [`TestDatabase`] (a fresh, empty database
//! per case) and one line at the end of this file:
//! `conformance_suite!(name, TheTestDatabase);`. Each case is then a test
//! named `name::case`. What only one backend has (its triggers, SQLite's
//! file format from before the ledger) is tested next to that backend.
//! The PostgreSQL cases run against a private server the tests start
//! (`src/testing/postgres.rs`), a database per case.

use std::collections::BTreeSet;
use std::sync::Arc;

use cairn_core::{
    EventKind, EventSource, InboxEvent, InboxId, Limits, NewEvent, RollbackNote, SandboxState, Snapshot, SnapshotId,
    SnapshotKind, Task, TaskConfig, TaskId, TaskState, Transition, Wait, WaitFor, WaitId,
};
use cairn_ledger::{verify_chain, Checkpoint, NodeKeys, SignedCheckpoint, GENESIS};

use crate::{now_ms, ApiKeyRow, Error, HookRow, NodeRow, SecretRow, SharedStore, Store, TaskFilter, Unheld};

/// A database for one test case, empty when created and gone when dropped.
pub(crate) trait TestDatabase: Sized {
    async fn create() -> Self;

    /// A new handle on the database: a second one sees what the first
    /// wrote, as the daemon does after a restart.
    async fn open(&self) -> SharedStore;

    /// Runs `sql` on the database past the store, as someone editing it
    /// by hand would, with `$1` bound to `task` when given; the database's
    /// message when it refuses.
    async fn tamper(&self, sql: &str, task: Option<&str>) -> std::result::Result<(), String>;
}

/// Runs every case of the suite against the backend whose test database is
/// `$db`, as the tests of a module named `$backend`.
macro_rules! conformance_suite {
    ($backend:ident, $db:ty) => {
        mod $backend {
            conformance_suite!(@cases $db;
                tasks_are_found_by_id_or_name_and_listed,
                a_page_of_tasks_is_filtered_and_counted_in_the_store,
                a_state_change_is_a_compare_and_set_over_the_transition_table,
                of_concurrent_moves_from_one_state_exactly_one_wins,
                waiters_see_each_committed_change_and_nothing_else,
                tasks_and_events_survive_reopen,
                events_are_numbered_per_task_and_read_after_a_seq,
                every_insert_path_extends_one_chain,
                concurrent_writers_do_not_fork_the_chain,
                a_large_batch_of_two_tasks_chains_each_log,
                task_fields_change_through_their_own_writes,
                sandbox_slots_are_unique_and_reused,
                concurrent_claims_never_share_a_slot,
                snapshots_rollback_notes_and_expiry,
                a_fork_is_written_whole_or_not_at_all,
                an_event_satisfies_the_pending_wait_once_and_wakes_a_suspended_task,
                an_event_before_its_wait_satisfies_the_next_matching_wait,
                a_cancelled_wait_ends_without_an_event_and_wakes_a_suspended_task,
                concurrent_deliveries_wait_their_turn,
                a_delivery_retried_concurrently_takes_effect_once,
                timers_and_finishing_a_suspend,
                checkpoints_are_kept_in_order,
                nodes_register_heartbeat_and_carry_the_tasks_they_run,
                a_lease_is_one_nodes_and_fences_off_the_node_that_lost_it,
                a_suspend_or_an_end_drops_the_lease,
                unheld_tasks_are_taken_by_exactly_one_node,
                the_first_nodes_secret_is_every_nodes,
                gc_and_snapshots_of_different_nodes_keep_apart,
                api_keys_are_found_by_hash_used_and_revoked,
                secrets_are_set_again_counted_and_removed,
                an_event_a_hook_takes_enters_its_outbox_and_leaves_in_order,
                the_log_and_checkpoints_stay_append_only,
                writes_for_an_unknown_task_are_refused,
            );
        }
    };
    (@cases $db:ty; $($case:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let db = <$db as crate::conformance::TestDatabase>::create().await;
                crate::conformance::$case(&db).await;
            }
        )*
    };
}

conformance_suite!(sqlite, crate::sqlite::TempSqlite);
conformance_suite!(postgres, crate::testing::postgres::TempPostgres);

pub(crate) async fn a_page_of_tasks_is_filtered_and_counted_in_the_store(db: &impl TestDatabase) {
    let store = db.open().await;
    let mut made = Vec::new();
    for (i, name) in ["Build_1", "build-2", "deploy", "100%"].iter().enumerate() {
        let mut t = task(Some(name));
        t.created_ms = 1_000 + i as i64;
        store.insert_task(&t).await.unwrap();
        made.push(t);
    }
    let mut unnamed = task(None);
    unnamed.created_ms = 2_000;
    store.insert_task(&unnamed).await.unwrap();
    store.transition(&made[2].id, TaskState::Created, Transition::Start).await.unwrap();
    let names = |page: &[Task]| page.iter().map(|t| t.name.clone().unwrap_or_default()).collect::<Vec<_>>();
    let all = TaskFilter::default();
    let (page, total) = store.list_tasks_page(&all, 0, 2).await.unwrap();
    assert_eq!((names(&page), total), (vec!["".to_owned(), "100%".to_owned()], 5), "newest first, counted in all");
    let (page, _) = store.list_tasks_page(&all, 4, 2).await.unwrap();
    assert_eq!(names(&page), ["Build_1"], "the last page");
    let by = |text: &str| TaskFilter { text: Some(text.into()), ..TaskFilter::default() };
    let (page, total) = store.list_tasks_page(&by("BUILD"), 0, 10).await.unwrap();
    assert_eq!((names(&page), total), (vec!["build-2".to_owned(), "Build_1".to_owned()], 2), "by name, ignoring case");
    assert_eq!(store.list_tasks_page(&by("d_"), 0, 10).await.unwrap().1, 1, "`_` is a character, not a wildcard");
    assert_eq!(names(&store.list_tasks_page(&by("%"), 0, 10).await.unwrap().0), ["100%"], "`%` too");
    let id_part = &unnamed.id.as_str()[1..7];
    assert_eq!(store.list_tasks_page(&by(id_part), 0, 10).await.unwrap().0[0].id, unnamed.id, "by part of the id");
    let running = TaskFilter { state: Some(TaskState::Running), ..TaskFilter::default() };
    assert_eq!(names(&store.list_tasks_page(&running, 0, 10).await.unwrap().0), ["deploy"], "by state");
    let none = TaskFilter { state: Some(TaskState::Running), text: Some("build".into()) };
    assert_eq!(store.list_tasks_page(&none, 0, 10).await.unwrap(), (vec![], 0));
}

fn task(name: Option<&str>) -> Task {
    Task::new(TaskId::random(), name.map(str::to_owned), TaskConfig { limits: Limits::default(), ..TaskConfig::default() }, now_ms())
}

fn event(id: &TaskId, kind: EventKind) -> NewEvent {
    NewEvent { task: id.clone(), kind, actor: "test".into(), args: serde_json::json!({"argv": ["true"]}), exit_code: Some(0), duration_ms: Some(3) }
}

fn event_with(id: &TaskId, kind: EventKind, args: serde_json::Value) -> NewEvent {
    NewEvent { args, ..event(id, kind) }
}

fn snap(task: &TaskId, kind: SnapshotKind) -> Snapshot {
    Snapshot {
        id: SnapshotId::random(),
        task: task.clone(),
        parent: None,
        kind,
        note: "n".into(),
        healthy: true,
        step: 3,
        memory: "remember".into(),
        with_memory: false,
        config: TaskConfig::default(),
        manifest: "ab".repeat(32),
        files: 1,
        bytes: 2,
        added_bytes: 3,
        freeze_ms: 1.5,
        duration_ms: 9.0,
        created_ms: now_ms(),
    }
}

fn wait(task: &TaskId, what: WaitFor) -> Wait {
    Wait { id: WaitId::random(), task: task.clone(), what, created_ms: now_ms(), satisfied_ms: None, event: None, cancelled_ms: None }
}

fn incoming(task: &TaskId, source: EventSource, name: &str, delivery: Option<&str>) -> InboxEvent {
    InboxEvent {
        id: InboxId::random(),
        task: task.clone(),
        source,
        name: name.into(),
        delivery: delivery.map(str::to_owned),
        data: serde_json::json!({"n": 1}),
        received_ms: now_ms(),
        wait: None,
    }
}

/// A new task in `store`, already running.
async fn running_task(store: &dyn Store) -> TaskId {
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
    t.id
}

/// A store holding one task, already running.
async fn store_with_running_task(db: &impl TestDatabase) -> (SharedStore, TaskId) {
    let store = db.open().await;
    let t = running_task(&*store).await;
    (store, t)
}

/// The task's log is one unbroken chain numbered 1..=entries.
pub(crate) async fn assert_chain(store: &dyn Store, task: &TaskId, entries: usize) {
    let events = store.events(task).await.unwrap();
    let r = verify_chain(task, &events);
    assert!(r.ok(), "{:?}", r.problem);
    assert_eq!(r.entries, entries);
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=entries as u64).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.hash.as_ref().is_some_and(|h| h.len() == 64)));
}

pub(crate) async fn tasks_are_found_by_id_or_name_and_listed(db: &impl TestDatabase) {
    let store = db.open().await;
    let named = task(Some("same"));
    let plain = Task { created_ms: named.created_ms + 1, ..task(None) };
    store.insert_task(&named).await.unwrap();
    store.insert_task(&plain).await.unwrap();
    assert_eq!(store.find_task(named.id.as_str()).await.unwrap(), named, "every field comes back as written");
    assert_eq!(store.find_task("same").await.unwrap(), named);
    assert_eq!(store.list_tasks().await.unwrap(), [named.clone(), plain.clone()], "oldest first");

    assert!(matches!(store.insert_task(&task(Some("same"))).await, Err(Error::NameTaken(n)) if n == "same"));
    assert!(matches!(store.find_task("nope").await, Err(Error::UnknownTask(_))));
    assert!(matches!(store.find_task(TaskId::random().as_str()).await, Err(Error::UnknownTask(_))));
    let ghost = TaskId::random();
    assert!(matches!(store.bump_step(&ghost).await, Err(Error::UnknownTask(_))));
    assert!(matches!(store.transition(&ghost, TaskState::Created, Transition::Start).await, Err(Error::UnknownTask(_))));
    assert_eq!(store.list_tasks().await.unwrap().len(), 2, "failed calls changed nothing");
}

pub(crate) async fn a_state_change_is_a_compare_and_set_over_the_transition_table(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    assert_eq!(store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap(), TaskState::Running);
    // Two actors that both read `running` and both suspend: one wins.
    assert_eq!(store.transition(&t.id, TaskState::Running, Transition::Suspend).await.unwrap(), TaskState::Suspending);
    match store.transition(&t.id, TaskState::Running, Transition::Suspend).await {
        Err(Error::StateChanged { expected, found, action, .. }) => {
            assert_eq!((expected, found, action), (TaskState::Running, TaskState::Suspending, "suspend"));
        }
        other => panic!("the second suspend must lose: {other:?}"),
    }
    // Not in the table: refused before the database is asked.
    let err = store.transition(&t.id, TaskState::Suspending, Transition::Woke).await.unwrap_err();
    assert!(matches!(err, Error::Transition { .. }), "{err}");
    assert_eq!(err.to_string(), format!("task {} is suspending; it cannot finish waking", t.id));
    assert_eq!(store.find_task(t.id.as_str()).await.unwrap().state, TaskState::Suspending, "the losers changed nothing");

    assert!(!store.begin_wake(&t.id).await.unwrap(), "only a suspended task begins waking");
    store.transition(&t.id, TaskState::Suspending, Transition::Suspended).await.unwrap();
    assert!(store.begin_wake(&t.id).await.unwrap());
    assert_eq!(store.find_task(t.id.as_str()).await.unwrap().state, TaskState::Waking);
}

pub(crate) async fn of_concurrent_moves_from_one_state_exactly_one_wins(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let mut all = Vec::new();
    for i in 0..12 {
        let (store, t) = (store.clone(), t.clone());
        let move_ = if i % 2 == 0 { Transition::Suspend } else { Transition::Fail };
        all.push(tokio::spawn(async move { store.transition(&t, TaskState::Running, move_).await }));
    }
    let mut won = Vec::new();
    for h in all {
        match h.await.unwrap() {
            Ok(to) => won.push(to),
            Err(Error::StateChanged { expected: TaskState::Running, .. }) => {}
            Err(e) => panic!("a loser is told the state changed, not {e}"),
        }
    }
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, won[0]);
}

pub(crate) async fn waiters_see_each_committed_change_and_nothing_else(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    let told = Arc::new(std::sync::Mutex::new(Vec::<TaskId>::new()));
    let sink = told.clone();
    store.on_change(Arc::new(move |id: &TaskId| sink.lock().unwrap().push(id.clone())));
    // What was told since the last call.
    let take = || std::mem::take(&mut *told.lock().unwrap());
    // Control: a read changes nothing.
    store.find_task(t.id.as_str()).await.unwrap();
    assert_eq!(take(), vec![]);
    // A state change (one statement) and an event (a transaction) each name the task.
    store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
    assert_eq!(take(), vec![t.id.clone()], "a state change is a change");
    store.append_event(&event(&t.id, EventKind::Exec)).await.unwrap();
    assert_eq!(take(), vec![t.id.clone()], "an appended event is a change");
    // So is a delivered event, but not its retry.
    store.deliver(&incoming(&t.id, EventSource::Webhook, "x", Some("d1"))).await.unwrap();
    assert_eq!(take(), vec![t.id.clone()], "a delivery is a change");
    assert!(store.deliver(&incoming(&t.id, EventSource::Webhook, "x", Some("d1"))).await.unwrap().duplicate);
    assert_eq!(take(), vec![], "a duplicate delivery changed nothing");
    // A failed write is not.
    assert!(store.transition(&TaskId::random(), TaskState::Running, Transition::Suspend).await.is_err());
    assert!(store.transition(&t.id, TaskState::Created, Transition::Start).await.is_err());
    assert_eq!(take(), vec![], "a write that changed nothing tells nobody");
    // Another task's change names that task, not this one.
    let other = task(None);
    store.insert_task(&other).await.unwrap();
    store.append_event(&event(&other.id, EventKind::Exec)).await.unwrap();
    let seen = take();
    assert!(!seen.is_empty() && seen.iter().all(|id| *id == other.id), "{seen:?}");
    // A batch of one task's events is one change of that task.
    store.append_events(&[event(&other.id, EventKind::Exec), event(&other.id, EventKind::Exec)]).await.unwrap();
    assert_eq!(take(), vec![other.id.clone()], "told once");
}

pub(crate) async fn tasks_and_events_survive_reopen(db: &impl TestDatabase) {
    let t = task(Some("demo"));
    {
        let store = db.open().await;
        store.insert_task(&t).await.unwrap();
        store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
        assert_eq!(store.bump_step(&t.id).await.unwrap(), 1);
        assert_eq!(store.append_event(&event(&t.id, EventKind::Create)).await.unwrap(), 1);
        assert_eq!(store.append_event(&event(&t.id, EventKind::Exec)).await.unwrap(), 2);
        store.close().await;
    }
    let store = db.open().await;
    let back = store.find_task("demo").await.unwrap();
    assert_eq!((back.id.clone(), back.state, back.step), (t.id.clone(), TaskState::Running, 1));
    let evs = store.events(&t.id).await.unwrap();
    assert_eq!(evs.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(), [(1, EventKind::Create), (2, EventKind::Exec)]);
    assert_eq!(evs[1].args["argv"][0], "true");
    assert_eq!(store.append_event(&event(&t.id, EventKind::Exec)).await.unwrap(), 3, "the log goes on where it was");
    assert_chain(&*store, &t.id, 3).await;
}

pub(crate) async fn events_are_numbered_per_task_and_read_after_a_seq(db: &impl TestDatabase) {
    let store = db.open().await;
    let (a, b) = (task(None), task(None));
    store.insert_task(&a).await.unwrap();
    store.insert_task(&b).await.unwrap();
    assert_eq!(store.append_event(&event(&a.id, EventKind::Create)).await.unwrap(), 1);
    assert_eq!(store.append_event(&event(&b.id, EventKind::Create)).await.unwrap(), 1, "each task has its own numbering");
    store.append_events(&[event(&a.id, EventKind::Egress), event(&a.id, EventKind::Exec)]).await.unwrap();
    store.append_events(&[]).await.unwrap();
    let all = store.events(&a.id).await.unwrap();
    assert_eq!(all.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(), [(1, EventKind::Create), (2, EventKind::Egress), (3, EventKind::Exec)]);
    let e = &all[2];
    assert_eq!((e.task.clone(), e.actor.as_str(), e.exit_code, e.duration_ms), (a.id.clone(), "test", Some(0), Some(3)));
    let new: Vec<u64> = store.events_after(&a.id, 1).await.unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(new, [2, 3], "only what came after seq 1");
    assert!(store.events_after(&a.id, 3).await.unwrap().is_empty());
    assert_eq!(store.events_after(&a.id, 0).await.unwrap(), all);
    let seqs = |page: Vec<cairn_core::Event>| page.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.events_before(&a.id, None, 2).await.unwrap()), [2, 3], "the newest page, in order");
    assert_eq!(seqs(store.events_before(&a.id, Some(2), 2).await.unwrap()), [1], "the page before seq 2");
    assert_eq!(store.events_before(&a.id, None, 10).await.unwrap(), all);
    assert!(store.events_before(&a.id, Some(1), 10).await.unwrap().is_empty());
    assert!(store.events(&TaskId::random()).await.unwrap().is_empty());
    assert!(store.append_event(&event(&TaskId::random(), EventKind::Exec)).await.is_err(), "no log without its task");
}

pub(crate) async fn every_insert_path_extends_one_chain(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    let id = &t.id;
    let ev = |kind, args| event_with(id, kind, args);
    // Nested args with unsorted keys, floats and non-ASCII text.
    store.append_event(&ev(EventKind::Create, serde_json::json!({"z": {"b": 0.1, "a": "é\n"}, "k": [3, 1e-7]}))).await.unwrap();
    store.append_events(&[ev(EventKind::Egress, serde_json::json!({"host": "a"})), ev(EventKind::Egress, serde_json::json!({"host": "b"}))]).await.unwrap();
    store.set_config(id, &TaskConfig::default(), &ev(EventKind::PolicyUpdate, serde_json::json!({}))).await.unwrap();
    store.claim_sandbox_slot(id).await.unwrap();
    store.record_sandbox_ready(id, "n1", 1, 2, &ev(EventKind::SandboxStart, serde_json::json!({}))).await.unwrap();
    let s = Snapshot { step: 1, ..snap(id, SnapshotKind::Milestone) };
    store.insert_snapshot(&s, "base", None, &ev(EventKind::Snapshot, serde_json::json!({"freeze_ms": 0.25}))).await.unwrap();
    let note = RollbackNote { from: None, to: s.id.clone(), from_step: 1, reason: "r".into(), time_ms: 1, chosen: None };
    store.record_rollback(id, &s, &note, "base", &ev(EventKind::Rollback, serde_json::json!({}))).await.unwrap();
    store.expire_snapshots(std::slice::from_ref(&s.id), &[ev(EventKind::SnapshotExpired, serde_json::json!({}))]).await.unwrap();
    let w = wait(id, WaitFor::Webhook { name: "x".into() });
    store.insert_wait(&w, &ev(EventKind::Wait, serde_json::json!({}))).await.unwrap();
    store.deliver(&incoming(id, EventSource::Operator, "x", None)).await.unwrap();
    store.transition(id, TaskState::Running, Transition::Suspend).await.unwrap();
    store.finish_suspend(id, None, &ev(EventKind::Suspend, serde_json::json!({}))).await.unwrap();
    assert_chain(&*store, id, 11).await;
    let back = store.events(id).await.unwrap();
    assert_eq!(back[0].args["z"]["a"], "é\n", "args come back as written");
    // Another task's log is its own chain.
    let other = task(None);
    store.insert_task(&other).await.unwrap();
    store.append_event(&event(&other.id, EventKind::Create)).await.unwrap();
    assert_eq!(store.events(&other.id).await.unwrap()[0].prev_hash.as_deref(), Some(GENESIS));
    assert_chain(&*store, id, 11).await;
}

pub(crate) async fn a_large_batch_of_two_tasks_chains_each_log(db: &impl TestDatabase) {
    let store = db.open().await;
    let (a, b) = (task(None), task(None));
    store.insert_task(&a).await.unwrap();
    store.insert_task(&b).await.unwrap();
    store.append_event(&event(&a.id, EventKind::Create)).await.unwrap();
    // More entries than one statement carries, the two tasks interleaved.
    let batch: Vec<NewEvent> = (0..450).map(|i| event_with(if i % 3 == 0 { &b.id } else { &a.id }, EventKind::Egress, serde_json::json!({ "i": i }))).collect();
    store.append_events(&batch).await.unwrap();
    assert_chain(&*store, &a.id, 301).await;
    assert_chain(&*store, &b.id, 150).await;
    let order: Vec<i64> = store.events(&a.id).await.unwrap()[1..].iter().map(|e| e.args["i"].as_i64().unwrap()).collect();
    assert_eq!(order, (0..450).filter(|i| i % 3 != 0).collect::<Vec<i64>>(), "in the order given");
    // A batch with a task that does not exist writes nothing of it.
    let ghost = TaskId::random();
    assert!(store.append_events(&[event(&a.id, EventKind::Exec), event(&ghost, EventKind::Exec)]).await.is_err());
    assert_eq!(store.events(&a.id).await.unwrap().len(), 301);
}

pub(crate) async fn concurrent_writers_do_not_fork_the_chain(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    let mut all = Vec::new();
    for i in 0..40 {
        let (store, id) = (store.clone(), t.id.clone());
        all.push(tokio::spawn(async move {
            if i % 4 == 0 {
                let burst = [event_with(&id, EventKind::Egress, serde_json::json!({"i": i})), event_with(&id, EventKind::Egress, serde_json::json!({"i": i}))];
                store.append_events(&burst).await.map(|_| 0)
            } else {
                store.append_event(&event_with(&id, EventKind::Exec, serde_json::json!({"i": i}))).await
            }
        }));
    }
    for h in all {
        h.await.unwrap().expect("no append is refused for a busy database");
    }
    assert_chain(&*store, &t.id, 50).await;
}

pub(crate) async fn task_fields_change_through_their_own_writes(db: &impl TestDatabase) {
    let store = db.open().await;
    let idle = TaskConfig { idle_suspend_ms: Some(1000), ..TaskConfig::default() };
    let t = Task::new(TaskId::random(), None, idle.clone(), 5000);
    let never = Task::new(TaskId::random(), None, TaskConfig::default(), 5000);
    store.insert_task(&t).await.unwrap();
    store.insert_task(&never).await.unwrap();
    assert!(store.idle_tasks(now_ms() + 60_000).await.unwrap().is_empty(), "only running tasks go idle");
    // A state change is activity.
    store.transition(&t.id, TaskState::Created, Transition::Start).await.unwrap();
    store.transition(&never.id, TaskState::Created, Transition::Start).await.unwrap();
    let since = store.find_task(t.id.as_str()).await.unwrap().last_activity_ms;
    assert!(since > 5000);
    assert!(store.idle_tasks(since + 999).await.unwrap().is_empty(), "not idle for its idle time yet");
    let idle_ids: Vec<TaskId> = store.idle_tasks(since + 1000).await.unwrap().into_iter().map(|t| t.id).collect();
    assert_eq!(idle_ids, std::slice::from_ref(&t.id), "a task without an idle time never goes idle");
    // The end of a command is activity, logged with it.
    let since = store.find_task(never.id.as_str()).await.unwrap().last_activity_ms;
    let before = store.events(&never.id).await.unwrap().len();
    store.end_command(&event(&never.id, EventKind::Exec)).await.unwrap();
    assert!(store.find_task(never.id.as_str()).await.unwrap().last_activity_ms >= since);
    assert_eq!(store.events(&never.id).await.unwrap().len(), before + 1, "the command's end is logged with it");

    assert_eq!(store.bump_step(&t.id).await.unwrap(), 1);
    assert_eq!(store.bump_step(&t.id).await.unwrap(), 2);
    store.set_sandbox_state(&t.id, SandboxState::Lost, Some("gone")).await.unwrap();
    let back = store.find_task(t.id.as_str()).await.unwrap();
    assert_eq!((back.step, back.sandbox, back.sandbox_note.as_deref()), (2, SandboxState::Lost, Some("gone")));
    assert!(matches!(store.set_sandbox_state(&TaskId::random(), SandboxState::Lost, None).await, Err(Error::UnknownTask(_))));

    let offline = TaskConfig { idle_suspend_ms: None, risky: vec!["rm -rf".into()], ..idle };
    store.set_config(&t.id, &offline, &event(&t.id, EventKind::PolicyUpdate)).await.unwrap();
    assert_eq!(store.find_task(t.id.as_str()).await.unwrap().config, offline);
    assert_eq!(store.events(&t.id).await.unwrap().len(), 1, "the config change is logged with it");
    let ghost = TaskId::random();
    assert!(matches!(store.set_config(&ghost, &offline, &event(&ghost, EventKind::PolicyUpdate)).await, Err(Error::UnknownTask(_))));

    store.record_recovery(&t.id, TaskState::Running, 1, "mem", "rebuilt from s1", &event(&t.id, EventKind::Recovered)).await.unwrap();
    let back = store.find_task(t.id.as_str()).await.unwrap();
    assert_eq!((back.state, back.step, back.memory.as_str(), back.recovery_note.as_deref()), (TaskState::Running, 1, "mem", Some("rebuilt from s1")));
    let err = store.record_recovery(&t.id, TaskState::Suspended, 1, "", "", &event(&t.id, EventKind::Recovered)).await.unwrap_err();
    assert!(matches!(err, Error::Transition { .. }), "{err}");
    let err = store.record_recovery(&t.id, TaskState::Suspending, 9, "", "", &event(&t.id, EventKind::Recovered)).await.unwrap_err();
    assert!(matches!(err, Error::StateChanged { .. }), "{err}");
    assert_eq!(store.find_task(t.id.as_str()).await.unwrap().step, 1, "a refused recovery wrote nothing");
    assert_eq!(store.events(&t.id).await.unwrap().len(), 2, "nor its event");
}

pub(crate) async fn sandbox_slots_are_unique_and_reused(db: &impl TestDatabase) {
    let store = db.open().await;
    let ts: Vec<Task> = (0..3).map(|_| task(None)).collect();
    for t in &ts {
        store.insert_task(t).await.unwrap();
    }
    let mut slots = Vec::new();
    for t in &ts {
        slots.push(store.claim_sandbox_slot(&t.id).await.unwrap());
    }
    assert_eq!(slots, [0, 1, 2]);
    assert!(store.claim_sandbox_slot(&ts[0].id).await.is_err(), "one sandbox per task");
    store.release_sandbox(&ts[1].id).await.unwrap();
    store.release_sandbox(&ts[1].id).await.unwrap();
    assert_eq!(store.sandboxes().await.unwrap().iter().map(|s| s.uid_slot).collect::<Vec<_>>(), [0, 2]);
    let t4 = task(None);
    store.insert_task(&t4).await.unwrap();
    assert_eq!(store.claim_sandbox_slot(&t4.id).await.unwrap(), 1, "lowest free slot is reused");
    let t5 = task(None);
    store.insert_task(&t5).await.unwrap();
    assert_eq!(store.claim_sandbox_slot_from(&t5.id, 1).await.unwrap(), 3, "skips taken slots from the minimum");
    let ev = event(&t4.id, EventKind::SandboxStart);
    assert_eq!(store.record_sandbox_ready(&t4.id, "n1", 4242, 99, &ev).await.unwrap(), 1);
    let back = store.find_task(t4.id.as_str()).await.unwrap();
    assert_eq!((back.state, back.sandbox), (TaskState::Running, SandboxState::Ready));
    let row = store.sandbox(&t4.id).await.unwrap().unwrap();
    assert_eq!((row.task, row.uid_slot, row.init_pid, row.init_start_time), (t4.id.clone(), 1, Some(4242), Some(99)));
    assert_eq!(store.sandbox(&ts[1].id).await.unwrap(), None);

    // A wake takes its previous slot again when it is free.
    let t6 = task(None);
    store.insert_task(&t6).await.unwrap();
    assert_eq!(store.last_uid_slot(&t6.id).await.unwrap(), None);
    store.set_last_uid_slot(&t6.id, Some(2)).await.unwrap();
    assert_eq!(store.last_uid_slot(&t6.id).await.unwrap(), Some(2));
    assert!(!store.try_claim_sandbox_slot(&t6.id, 2).await.unwrap(), "slot 2 is taken");
    assert!(store.try_claim_sandbox_slot(&t6.id, 7).await.unwrap());
    assert_eq!(store.sandbox(&t6.id).await.unwrap().map(|s| s.uid_slot), Some(7));
    store.set_last_uid_slot(&t6.id, None).await.unwrap();
    assert_eq!(store.last_uid_slot(&t6.id).await.unwrap(), None);
}

pub(crate) async fn concurrent_claims_never_share_a_slot(db: &impl TestDatabase) {
    let store = db.open().await;
    let mut all = Vec::new();
    for i in 0..16 {
        let t = task(None);
        store.insert_task(&t).await.unwrap();
        let store = store.clone();
        all.push(tokio::spawn(async move {
            if i % 4 == 0 {
                // A wake that wants slot 0 back races the fresh starts.
                Ok(store.try_claim_sandbox_slot(&t.id, 0).await?.then_some(0))
            } else {
                store.claim_sandbox_slot(&t.id).await.map(Some)
            }
        }));
    }
    let mut claimed = Vec::new();
    for h in all {
        claimed.extend(h.await.unwrap().expect("no claim is refused for a busy database"));
    }
    let distinct: BTreeSet<u32> = claimed.iter().copied().collect();
    assert_eq!(distinct.len(), claimed.len(), "two tasks got the same slot: {claimed:?}");
    let recorded: Vec<u32> = store.sandboxes().await.unwrap().iter().map(|s| s.uid_slot).collect();
    assert_eq!(recorded, distinct.into_iter().collect::<Vec<_>>());
}

pub(crate) async fn snapshots_rollback_notes_and_expiry(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    assert_eq!(store.baseline(&t.id).await.unwrap(), None);
    let a = snap(&t.id, SnapshotKind::Milestone);
    let b = Snapshot { parent: Some(a.id.clone()), created_ms: a.created_ms + 1, ..snap(&t.id, SnapshotKind::PreRisk) };
    store.insert_snapshot(&a, "base-a", Some("mem a"), &event(&t.id, EventKind::Snapshot)).await.unwrap();
    store.insert_snapshot(&b, "base-b", None, &event(&t.id, EventKind::Snapshot)).await.unwrap();
    assert_eq!(store.snapshots(&t.id).await.unwrap(), [a.clone(), b.clone()], "every field comes back, oldest first");
    assert_eq!(store.find_snapshot(b.id.as_str()).await.unwrap(), b);
    assert!(matches!(store.find_snapshot("s222222222").await, Err(Error::UnknownSnapshot(_))));
    assert_eq!(store.baseline(&t.id).await.unwrap().as_deref(), Some("base-b"));
    assert_eq!(store.find_task(t.id.as_str()).await.unwrap().memory, "mem a", "memory kept when not given");
    let orphan = snap(&TaskId::random(), SnapshotKind::Milestone);
    assert!(store.insert_snapshot(&orphan, "x", None, &event(&t.id, EventKind::Snapshot)).await.is_err(), "no snapshot without its task");

    let other = task(None);
    store.insert_task(&other).await.unwrap();
    let c = Snapshot { created_ms: b.created_ms + 1, ..snap(&other.id, SnapshotKind::Milestone) };
    store.insert_snapshot(&c, "base-c", None, &event(&other.id, EventKind::Snapshot)).await.unwrap();
    assert_eq!(store.all_snapshots().await.unwrap(), [a.clone(), b.clone(), c]);
    let mut baselines = store.baselines().await.unwrap();
    baselines.sort();
    assert_eq!(baselines, ["base-b", "base-c"]);
    store.set_baseline(&other.id, None).await.unwrap();
    assert_eq!(store.baselines().await.unwrap(), ["base-b"]);
    assert!(matches!(store.baseline(&TaskId::random()).await, Err(Error::UnknownTask(_))));

    let note = RollbackNote { from: Some(b.id.clone()), to: a.id.clone(), from_step: 7, reason: "tests broke".into(), time_ms: 1, chosen: Some("--to: named by the caller".into()) };
    store.record_rollback(&t.id, &a, &note, "base-r", &event(&t.id, EventKind::Rollback)).await.unwrap();
    let back = store.find_task(t.id.as_str()).await.unwrap();
    assert_eq!((back.step, back.memory.as_str(), back.rollback_note), (3, "remember", Some(note)));
    assert_eq!(store.baseline(&t.id).await.unwrap().as_deref(), Some("base-r"));

    store.expire_snapshots(std::slice::from_ref(&a.id), &[event(&t.id, EventKind::SnapshotExpired)]).await.unwrap();
    assert_eq!(store.snapshots(&t.id).await.unwrap(), [b]);
    let kinds: Vec<EventKind> = store.events(&t.id).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Snapshot, EventKind::Snapshot, EventKind::Rollback, EventKind::SnapshotExpired]);
}

pub(crate) async fn a_fork_is_written_whole_or_not_at_all(db: &impl TestDatabase) {
    let store = db.open().await;
    let src = task(Some("src"));
    store.insert_task(&src).await.unwrap();
    let head = snap(&src.id, SnapshotKind::Milestone);
    store.insert_snapshot(&head, &head.manifest, None, &event(&src.id, EventKind::Snapshot)).await.unwrap();

    let fork = task(Some("fork"));
    let branch = Snapshot { parent: Some(head.id.clone()), ..snap(&fork.id, SnapshotKind::Branch) };
    store.insert_fork(&fork, &event(&fork.id, EventKind::Create), &branch, &event(&fork.id, EventKind::Snapshot)).await.unwrap();
    assert_eq!(store.find_task("fork").await.unwrap().id, fork.id);
    assert_eq!(store.snapshots(&fork.id).await.unwrap(), std::slice::from_ref(&branch));
    assert_eq!(store.baseline(&fork.id).await.unwrap().as_deref(), Some(branch.manifest.as_str()), "the fork restores from its branch");
    let kinds: Vec<EventKind> = store.events(&fork.id).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Create, EventKind::Snapshot]);
    assert_chain(&*store, &fork.id, 2).await;

    // A second fork under a taken name leaves nothing behind.
    let clash = task(Some("fork"));
    let branch2 = snap(&clash.id, SnapshotKind::Branch);
    let err = store.insert_fork(&clash, &event(&clash.id, EventKind::Create), &branch2, &event(&clash.id, EventKind::Snapshot)).await.unwrap_err();
    assert!(matches!(err, Error::NameTaken(_)), "{err}");
    assert!(matches!(store.find_task(clash.id.as_str()).await, Err(Error::UnknownTask(_))));
    assert!(matches!(store.find_snapshot(branch2.id.as_str()).await, Err(Error::UnknownSnapshot(_))));
    assert!(store.events(&clash.id).await.unwrap().is_empty());
    assert_eq!(store.all_snapshots().await.unwrap().len(), 2);
}

pub(crate) async fn an_event_satisfies_the_pending_wait_once_and_wakes_a_suspended_task(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let log = || event(&t, EventKind::Wait);
    let w = wait(&t, WaitFor::Webhook { name: "build".into() });
    assert_eq!(store.insert_wait(&w, &log()).await.unwrap(), None);
    assert_eq!(store.pending_wait(&t).await.unwrap(), Some(w.clone()));
    assert_eq!(store.pending_waits("webhook").await.unwrap(), std::slice::from_ref(&w), "listed by its kind");
    assert!(store.pending_waits("approval").await.unwrap().is_empty(), "and by no other");
    let second = wait(&t, WaitFor::Timer { fire_at_ms: 1 });
    assert!(matches!(store.insert_wait(&second, &log()).await, Err(Error::WaitPending(_))), "one pending wait per task");
    assert!(matches!(store.find_wait(second.id.as_str()).await, Err(Error::UnknownWait(_))), "the refused wait was not written");
    store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    store.transition(&t, TaskState::Suspending, Transition::Suspended).await.unwrap();

    let other = store.deliver(&incoming(&t, EventSource::Webhook, "lint", Some("d0"))).await.unwrap();
    assert_eq!((other.satisfied, other.wake), (None, false), "another name waits in the inbox");
    let first = store.deliver(&incoming(&t, EventSource::Webhook, "build", Some("d1"))).await.unwrap();
    assert_eq!((first.satisfied.as_ref(), first.wake, first.duplicate), (Some(&w.id), true, false));
    assert_eq!(first.event.wait.as_ref(), Some(&w.id));
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Waking);
    let retry = store.deliver(&incoming(&t, EventSource::Webhook, "build", Some("d1"))).await.unwrap();
    assert!(retry.duplicate && !retry.wake);
    assert_eq!(retry.event, first.event, "a retry answers with the first delivery");
    assert_eq!(retry.satisfied.as_ref(), Some(&w.id));
    assert_eq!(store.inbox(&t).await.unwrap(), [other.event.clone(), first.event.clone()], "oldest first, once each");
    assert_eq!(store.inbox_event(first.event.id.as_str()).await.unwrap(), first.event);
    let back = store.find_wait(w.id.as_str()).await.unwrap();
    assert_eq!(back.event.as_ref(), Some(&first.event.id));
    assert!(back.satisfied_ms.is_some());
    assert!(store.pending_wait(&t).await.unwrap().is_none());
    assert!(store.pending_waits("webhook").await.unwrap().is_empty(), "a satisfied wait is no longer listed");
    let kinds: Vec<EventKind> = store.events(&t).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Wait, EventKind::EventReceived, EventKind::EventReceived], "a retry is not logged again");
    let unknown = incoming(&TaskId::random(), EventSource::Operator, "x", None);
    assert!(matches!(store.deliver(&unknown).await, Err(Error::UnknownTask(_))));
}

pub(crate) async fn a_cancelled_wait_ends_without_an_event_and_wakes_a_suspended_task(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let log = || event(&t, EventKind::Wait);
    assert_eq!(store.cancel_wait(&t, &log()).await.unwrap(), None, "nothing to cancel");
    // Running (e.g. resumed while it waited): cancelled, the task runs on.
    let w = wait(&t, WaitFor::Timer { fire_at_ms: 1 });
    store.insert_wait(&w, &log()).await.unwrap();
    let (gone, wake) = store.cancel_wait(&t, &log()).await.unwrap().unwrap();
    assert_eq!((gone.id.clone(), wake), (w.id.clone(), false));
    assert!(gone.cancelled_ms.is_some() && gone.satisfied_ms == gone.cancelled_ms && gone.event.is_none());
    assert_eq!(store.find_wait(w.id.as_str()).await.unwrap(), gone);
    assert!(store.pending_wait(&t).await.unwrap().is_none());
    assert!(store.due_timers(i64::MAX).await.unwrap().is_empty(), "a cancelled timer never fires");
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Running);
    // Suspended for the wait: cancelled, the task is waking.
    let w2 = wait(&t, WaitFor::Webhook { name: "build".into() });
    store.insert_wait(&w2, &log()).await.unwrap();
    store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    store.transition(&t, TaskState::Suspending, Transition::Suspended).await.unwrap();
    let (gone, wake) = store.cancel_wait(&t, &log()).await.unwrap().unwrap();
    assert_eq!((gone.id, wake), (w2.id, true));
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Waking);
    // An event for it later waits in the inbox for another wait.
    let later = store.deliver(&incoming(&t, EventSource::Webhook, "build", None)).await.unwrap();
    assert_eq!((later.satisfied, later.wake), (None, false));
    assert_eq!(store.events(&t).await.unwrap().len(), 5, "each cancel is logged with its change");
}

pub(crate) async fn an_event_before_its_wait_satisfies_the_next_matching_wait(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let log = || event(&t, EventKind::Wait);
    store.deliver(&incoming(&t, EventSource::Operator, "deploy", None)).await.unwrap();
    let approval = wait(&t, WaitFor::Approval { prompt: "ok?".into() });
    assert_eq!(store.insert_wait(&approval, &log()).await.unwrap(), None, "a deploy event does not approve");
    let a = store.deliver(&incoming(&t, EventSource::Approval, "approval", None)).await.unwrap();
    assert_eq!((a.satisfied.as_ref(), a.wake), (Some(&approval.id), false), "a running task is not woken");
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Running);
    let hook = wait(&t, WaitFor::Webhook { name: "deploy".into() });
    let got = store.insert_wait(&hook, &log()).await.unwrap().expect("satisfied by the early event");
    assert_eq!((got.name.as_str(), got.wait.as_ref()), ("deploy", Some(&hook.id)));
    assert!(store.pending_wait(&t).await.unwrap().is_none());
    assert_eq!(store.find_wait(hook.id.as_str()).await.unwrap().event.as_ref(), Some(&got.id));
    // The early event is used up: the next wait for it waits.
    let again = wait(&t, WaitFor::Webhook { name: "deploy".into() });
    assert_eq!(store.insert_wait(&again, &log()).await.unwrap(), None);
}

pub(crate) async fn concurrent_deliveries_wait_their_turn(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let mut all = Vec::new();
    for i in 0..48 {
        let (store, t) = (store.clone(), t.clone());
        all.push(tokio::spawn(async move { store.deliver(&incoming(&t, EventSource::Webhook, "x", Some(&format!("d{i}")))).await }));
    }
    for h in all {
        h.await.unwrap().expect("no delivery is refused for a busy database");
    }
    assert_eq!(store.inbox(&t).await.unwrap().len(), 48);
    assert_chain(&*store, &t, 48).await;
}

pub(crate) async fn a_delivery_retried_concurrently_takes_effect_once(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let w = wait(&t, WaitFor::Webhook { name: "build".into() });
    store.insert_wait(&w, &event(&t, EventKind::Wait)).await.unwrap();
    store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    store.transition(&t, TaskState::Suspending, Transition::Suspended).await.unwrap();
    let mut all = Vec::new();
    for _ in 0..8 {
        let (store, t) = (store.clone(), t.clone());
        // Each retry arrives with a new inbox id but the sender's delivery id.
        all.push(tokio::spawn(async move { store.deliver(&incoming(&t, EventSource::Webhook, "build", Some("once"))).await }));
    }
    let mut results = Vec::new();
    for h in all {
        results.push(h.await.unwrap().expect("a retry is answered, not refused"));
    }
    let firsts: Vec<_> = results.iter().filter(|d| !d.duplicate).collect();
    assert_eq!(firsts.len(), 1, "exactly one delivery took effect");
    assert!(firsts[0].wake && firsts[0].satisfied.as_ref() == Some(&w.id));
    assert!(results.iter().all(|d| d.event == firsts[0].event && (d.duplicate != d.wake)), "every retry names the first");
    assert_eq!(store.inbox(&t).await.unwrap().len(), 1);
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Waking);
}

pub(crate) async fn timers_and_finishing_a_suspend(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    let log = || event(&t, EventKind::Wait);
    assert_eq!(store.next_timer_ms().await.unwrap(), None);
    let w = wait(&t, WaitFor::Timer { fire_at_ms: 1000 });
    store.insert_wait(&w, &log()).await.unwrap();
    let other = running_task(&*store).await;
    let w2 = wait(&other, WaitFor::Timer { fire_at_ms: 900 });
    store.insert_wait(&w2, &event(&other, EventKind::Wait)).await.unwrap();
    assert_eq!(store.next_timer_ms().await.unwrap(), Some(900));
    assert!(store.due_timers(899).await.unwrap().is_empty());
    assert_eq!(store.due_timers(999).await.unwrap(), std::slice::from_ref(&w2));
    assert_eq!(store.due_timers(1000).await.unwrap(), [w2.clone(), w.clone()], "earliest first");
    let fired = store.deliver(&incoming(&other, EventSource::Timer, w2.id.as_str(), None)).await.unwrap();
    assert_eq!(fired.satisfied.as_ref(), Some(&w2.id));
    assert_eq!(store.next_timer_ms().await.unwrap(), Some(1000), "a fired timer is no longer pending");
    assert_eq!(store.due_timers(5000).await.unwrap(), std::slice::from_ref(&w));

    store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    // The timer fires while the task is still suspending.
    let fired = store.deliver(&incoming(&t, EventSource::Timer, w.id.as_str(), None)).await.unwrap();
    assert_eq!((fired.satisfied.as_ref(), fired.wake), (Some(&w.id), false));
    assert_eq!(store.next_timer_ms().await.unwrap(), None);
    let end = NewEvent { args: serde_json::json!({"phase": "end"}), kind: EventKind::Suspend, ..log() };
    assert_eq!(store.finish_suspend(&t, Some(&w.id), &end).await.unwrap(), TaskState::Waking, "satisfied meanwhile: wake at once");
    assert_eq!(store.find_task(t.as_str()).await.unwrap().sandbox, SandboxState::None);
    store.finish_wake(&t, &event(&t, EventKind::Wake)).await.unwrap();
    assert_eq!(store.find_task(t.as_str()).await.unwrap().state, TaskState::Running);
    assert!(matches!(store.finish_wake(&t, &event(&t, EventKind::Wake)).await, Err(Error::StateChanged { .. })), "only a waking task finishes waking");
    store.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    assert_eq!(store.finish_suspend(&t, None, &end).await.unwrap(), TaskState::Suspended, "a plain suspend stays suspended");
    assert!(matches!(store.finish_suspend(&t, None, &end).await, Err(Error::StateChanged { .. })));
    let kinds: Vec<EventKind> = store.events(&t).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Wait, EventKind::EventReceived, EventKind::Suspend, EventKind::Wake, EventKind::Suspend], "refused steps log nothing");
}

pub(crate) async fn checkpoints_are_kept_in_order(db: &impl TestDatabase) {
    let store = db.open().await;
    let t = task(None);
    store.insert_task(&t).await.unwrap();
    store.append_event(&event(&t.id, EventKind::Create)).await.unwrap();
    assert_eq!(store.latest_checkpoint(&t.id).await.unwrap(), None);
    assert!(store.checkpoints(&t.id).await.unwrap().is_empty());
    let keys_dir = tempfile::tempdir().unwrap();
    let keys = NodeKeys::load_or_create(&keys_dir.path().join("keys")).unwrap();
    let head = store.events(&t.id).await.unwrap()[0].hash.clone().unwrap();
    let cp = |seq| Checkpoint { task: t.id.to_string(), seq, head: head.clone(), time_ms: now_ms(), key_id: String::new() };
    let first = SignedCheckpoint::sign(&keys, cp(1));
    let second = SignedCheckpoint::sign(&keys, cp(1));
    store.insert_checkpoint(&first, "cli:a").await.unwrap();
    store.insert_checkpoint(&second, "cli:b").await.unwrap();
    assert_eq!(store.checkpoints(&t.id).await.unwrap(), [first.clone(), second.clone()]);
    assert_eq!(store.latest_checkpoint(&t.id).await.unwrap(), Some(second.clone()));
    store.latest_checkpoint(&t.id).await.unwrap().unwrap().verify(&keys.verifying_keys()).unwrap();
    let ghost = SignedCheckpoint::sign(&keys, Checkpoint { task: TaskId::random().to_string(), ..cp(1) });
    assert!(matches!(store.insert_checkpoint(&ghost, "x").await, Err(Error::UnknownTask(_))));
    assert_eq!(store.checkpoints(&t.id).await.unwrap().len(), 2);
}

pub(crate) async fn nodes_register_heartbeat_and_carry_the_tasks_they_run(db: &impl TestDatabase) {
    let store = db.open().await;
    assert!(store.list_nodes().await.unwrap().is_empty());
    let node = |name: &str, at: i64| NodeRow {
        name: name.into(),
        url: format!("http://{name}:7070"),
        started_ms: at,
        heartbeat_ms: at,
        version: "0.1.0".into(),
    };
    store.register_node(&node("beta", 10)).await.unwrap();
    store.register_node(&node("alpha", 20)).await.unwrap();
    assert_eq!(store.list_nodes().await.unwrap(), [node("alpha", 20), node("beta", 10)], "by name");

    // A heartbeat moves only the heartbeat; a restart replaces the row.
    store.heartbeat_node(&NodeRow { url: "http://elsewhere".into(), ..node("alpha", 20) }, 25).await.unwrap();
    assert_eq!(store.list_nodes().await.unwrap()[0], NodeRow { heartbeat_ms: 25, ..node("alpha", 20) });
    store.register_node(&NodeRow { version: "0.2.0".into(), ..node("alpha", 30) }).await.unwrap();
    assert_eq!(store.list_nodes().await.unwrap()[0], NodeRow { version: "0.2.0".into(), ..node("alpha", 30) });
    // A heartbeat of a node whose row is gone registers it again.
    store.heartbeat_node(&node("gamma", 40), 41).await.unwrap();
    assert_eq!(store.list_nodes().await.unwrap()[2], NodeRow { heartbeat_ms: 41, ..node("gamma", 40) });
    // Another handle (another daemon) sees the same registry.
    assert_eq!(db.open().await.list_nodes().await.unwrap().len(), 3);

    // A task's node: set with its sandbox up, cleared when it goes.
    let ts: Vec<Task> = (0..4).map(|_| task(None)).collect();
    for t in &ts {
        store.insert_task(t).await.unwrap();
        store.claim_sandbox_slot(&t.id).await.unwrap();
    }
    assert!(store.node_tasks().await.unwrap().is_empty(), "a claimed slot is not a sandbox up");
    let on = ["beta", "alpha", "alpha", "beta"];
    for (t, n) in ts.iter().zip(on) {
        store.record_sandbox_ready(&t.id, n, 1, 2, &event(&t.id, EventKind::SandboxStart)).await.unwrap();
    }
    let mut want: Vec<(String, TaskId)> = ts.iter().zip(on).map(|(t, n)| (n.to_owned(), t.id.clone())).collect();
    want.sort();
    assert_eq!(store.node_tasks().await.unwrap(), want);
    // Back to ready (a sandbox that survived a restart) keeps the node.
    store.set_sandbox_state(&ts[0].id, SandboxState::Ready, None).await.unwrap();
    // Lost, released (destroy), suspended: no node.
    store.set_sandbox_state(&ts[1].id, SandboxState::Lost, Some("gone")).await.unwrap();
    store.release_sandbox(&ts[2].id).await.unwrap();
    store.transition(&ts[3].id, TaskState::Running, Transition::Suspend).await.unwrap();
    store.finish_suspend(&ts[3].id, None, &event(&ts[3].id, EventKind::Suspend)).await.unwrap();
    assert_eq!(store.node_tasks().await.unwrap(), [("beta".to_owned(), ts[0].id.clone())]);
    // And a sandbox up again after the loss takes the node it is on now.
    store.record_sandbox_ready(&ts[1].id, "gamma", 3, 4, &event(&ts[1].id, EventKind::SandboxStart)).await.unwrap();
    assert_eq!(store.node_tasks().await.unwrap(), [("beta".to_owned(), ts[0].id.clone()), ("gamma".to_owned(), ts[1].id.clone())]);
}

/// Long enough not to run out during a test.
const TTL: i64 = 600_000;

pub(crate) async fn a_lease_is_one_nodes_and_fences_off_the_node_that_lost_it(db: &impl TestDatabase) {
    let (a, t) = store_with_running_task(db).await;
    let b = db.open().await;
    let first = a.acquire_lease(&t, "a", TTL).await.unwrap().expect("a free lease is taken");
    assert_eq!((first.node.as_deref(), first.token), (Some("a"), 1));
    assert_eq!(b.acquire_lease(&t, "b", TTL).await.unwrap(), None, "a's lease is live");
    assert_eq!(a.acquire_lease(&t, "a", TTL).await.unwrap().map(|l| l.token), Some(1), "its own again: the token stays");
    // Without the lease, b adds to the task's log (intake) but does not move it.
    b.append_event(&event(&t, EventKind::EventReceived)).await.expect("intake by another node");
    let refused = b.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap_err();
    assert!(matches!(&refused, Error::Leased { node, .. } if node == "a"), "{refused}");
    assert!(matches!(b.set_sandbox_state(&t, SandboxState::Lost, None).await, Err(Error::Leased { .. })));
    // a stalls: its lease runs out (a renewal in the past stands for that), b takes the task.
    a.acquire_lease(&t, "a", -1).await.unwrap().unwrap();
    let taken = b.acquire_lease(&t, "b", TTL).await.unwrap().expect("an expired lease is taken");
    assert_eq!(taken.token, 2, "a new holder, a new token");
    // Whatever a writes late is refused, and changes nothing.
    let before = a.events(&t).await.unwrap().len();
    for refused in [
        a.append_event(&event(&t, EventKind::Exec)).await.map(drop),
        a.transition(&t, TaskState::Running, Transition::Suspend).await.map(drop),
        a.record_sandbox_ready(&t, "a", 1, 1, &event(&t, EventKind::SandboxStart)).await.map(drop),
        a.insert_snapshot(&snap(&t, SnapshotKind::Manual), "cd", None, &event(&t, EventKind::Snapshot)).await,
    ] {
        assert!(matches!(&refused, Err(Error::LeaseLost { holder: Some(h), .. }) if h == "b"), "{refused:?}");
    }
    assert_eq!(a.events(&t).await.unwrap().len(), before);
    assert_eq!(a.find_task(t.as_str()).await.unwrap().state, TaskState::Running);
    // a's heartbeat finds out and forgets the lease; from then on it is a node without it.
    assert_eq!(a.renew_leases("a", TTL).await.unwrap(), std::slice::from_ref(&t));
    a.append_event(&event(&t, EventKind::EventReceived)).await.expect("intake again");
    assert!(matches!(a.transition(&t, TaskState::Running, Transition::Suspend).await, Err(Error::Leased { .. })));
    // Nor does a command that ran on in a's stale sandbox get its start or
    // end recorded (a zombie node's late exec).
    let events = a.events(&t).await.unwrap().len();
    assert!(matches!(a.bump_step(&t).await, Err(Error::Leased { .. })));
    assert!(matches!(a.end_command(&event(&t, EventKind::Exec)).await, Err(Error::Leased { .. })));
    assert_eq!(a.events(&t).await.unwrap().len(), events);
    // The holder works on.
    b.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    assert!(b.renew_leases("b", TTL).await.unwrap().is_empty());
    assert_chain(&*b, &t, before + 1).await;
}

pub(crate) async fn a_suspend_or_an_end_drops_the_lease(db: &impl TestDatabase) {
    let (a, t) = store_with_running_task(db).await;
    let b = db.open().await;
    a.acquire_lease(&t, "a", TTL).await.unwrap().unwrap();
    a.transition(&t, TaskState::Running, Transition::Suspend).await.unwrap();
    let end = event_with(&t, EventKind::Suspend, serde_json::json!({"phase": "end"}));
    assert_eq!(a.finish_suspend(&t, None, &end).await.unwrap(), TaskState::Suspended);
    let dropped = a.lease(&t).await.unwrap();
    assert_eq!((dropped.node, dropped.expires_ms, dropped.token), (None, None, 1), "dropped with the suspend; the token stays");
    assert!(a.renew_leases("a", TTL).await.unwrap().is_empty(), "dropping its own lease is not losing it");
    // Any node wakes it: the event's node moves it, then takes the lease.
    assert!(b.begin_wake(&t).await.unwrap());
    let taken = b.acquire_lease(&t, "b", TTL).await.unwrap().unwrap();
    assert_eq!((taken.token, taken.last_node.as_deref()), (2, Some("a")), "told who had it before (whose disk is current)");
    assert_eq!(b.lease(&t).await.unwrap().last_node.as_deref(), Some("b"));
    b.finish_wake(&t, &event(&t, EventKind::Wake)).await.unwrap();
    b.transition(&t, TaskState::Running, Transition::Destroy).await.unwrap();
    assert_eq!(b.lease(&t).await.unwrap().node, None, "an ended task holds no lease");
    // A lease given back by hand.
    let u = running_task(&*a).await;
    a.acquire_lease(&u, "a", TTL).await.unwrap().unwrap();
    a.release_lease(&u).await.unwrap();
    assert_eq!(b.acquire_lease(&u, "b", TTL).await.unwrap().map(|l| l.token), Some(2));
    a.release_lease(&u).await.unwrap();
    assert_eq!(b.lease(&u).await.unwrap().node.as_deref(), Some("b"), "releasing what one no longer holds changes nothing");
}

pub(crate) async fn unheld_tasks_are_taken_by_exactly_one_node(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    let held = running_task(&*a).await;
    a.acquire_lease(&held, "a", TTL).await.unwrap().unwrap();
    let lost = running_task(&*a).await;
    a.acquire_lease(&lost, "a", -1).await.unwrap().unwrap();
    let waking = running_task(&*a).await;
    a.transition(&waking, TaskState::Running, Transition::Suspend).await.unwrap();
    a.transition(&waking, TaskState::Suspending, Transition::Suspended).await.unwrap();
    assert!(a.begin_wake(&waking).await.unwrap());
    let suspended = running_task(&*a).await;
    a.transition(&suspended, TaskState::Running, Transition::Suspend).await.unwrap();
    a.transition(&suspended, TaskState::Suspending, Transition::Suspended).await.unwrap();
    let unheld = b.unheld_tasks(now_ms()).await.unwrap();
    assert_eq!(
        unheld,
        [
            Unheld { task: lost.clone(), state: TaskState::Running, last_node: Some("a".into()) },
            Unheld { task: waking.clone(), state: TaskState::Waking, last_node: None },
        ],
        "a held, or suspended, task needs no node"
    );
    for t in [&lost, &waking] {
        let (x, y) = tokio::join!(a.acquire_lease(t, "a2", TTL), b.acquire_lease(t, "b", TTL));
        let won: Vec<_> = [x.unwrap(), y.unwrap()].into_iter().flatten().collect();
        assert_eq!(won.len(), 1, "one node takes {t}: {won:?}");
    }
    assert!(b.unheld_tasks(now_ms()).await.unwrap().is_empty());
}

pub(crate) async fn the_first_nodes_secret_is_every_nodes(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    assert_eq!(a.cluster_secret("token", "from-a").await.unwrap(), "from-a");
    assert_eq!(b.cluster_secret("token", "from-b").await.unwrap(), "from-a");
    assert_eq!(b.cluster_secret("approval-key", "k-b").await.unwrap(), "k-b", "each secret by its name");
    // Public keys: each node's, kept as first published.
    let key = |id: &str, created_ms| cairn_ledger::KeyInfo { key_id: id.into(), public_key: "ab".repeat(32), created_ms, current: true };
    a.publish_keys("a", &[key("k1", 1)]).await.unwrap();
    b.publish_keys("b", &[key("k2", 2), key("k3", 3)]).await.unwrap();
    b.publish_keys("b", &[key("k1", 9)]).await.unwrap();
    let all = b.cluster_keys().await.unwrap();
    let seen: Vec<(&str, &str, i64, bool)> = all.iter().map(|(n, k)| (n.as_str(), k.key_id.as_str(), k.created_ms, k.current)).collect();
    assert_eq!(seen, [("a", "k1", 1, false), ("b", "k3", 3, false), ("b", "k2", 2, false)]);
}

pub(crate) async fn gc_and_snapshots_of_different_nodes_keep_apart(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    assert!(a.lock_blobs("snap-1", "a", false, TTL).await.unwrap());
    assert!(a.lock_blobs("snap-2", "a", false, TTL).await.unwrap(), "shared holds go together");
    assert!(b.lock_blobs("snap-3", "b", false, TTL).await.unwrap(), "also across nodes");
    assert!(!b.lock_blobs("gc-b", "b", true, TTL).await.unwrap(), "gc waits for a's snapshots");
    a.unlock_blobs("snap-1").await.unwrap();
    a.unlock_blobs("snap-2").await.unwrap();
    b.unlock_blobs("snap-3").await.unwrap();
    assert!(b.lock_blobs("gc-b", "b", true, TTL).await.unwrap());
    assert!(!a.lock_blobs("snap-4", "a", false, TTL).await.unwrap(), "a snapshot waits for b's gc");
    assert!(!a.lock_blobs("gc-a", "a", true, TTL).await.unwrap(), "one gc at a time");
    // b dies: its hold runs out (a renewal in the past stands for that).
    b.renew_blob_locks("b", -1).await.unwrap();
    assert!(a.lock_blobs("snap-4", "a", false, TTL).await.unwrap());
    a.renew_blob_locks("a", TTL).await.unwrap();
    assert!(!b.lock_blobs("gc-b2", "b", true, TTL).await.unwrap(), "a renewed hold still counts");
}

pub(crate) async fn api_keys_are_found_by_hash_used_and_revoked(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    let key = |name: &str, hash: &str, created_ms| ApiKeyRow { name: name.into(), hash: hash.repeat(32), created_ms, last_used_ms: None };
    // Inserted newest first: the list is by age, not by insertion or name.
    let ci = key("ci", "cd", 2000);
    let laptop = key("laptop", "ab", 1000);
    a.insert_api_key(&ci).await.unwrap();
    a.insert_api_key(&laptop).await.unwrap();
    assert_eq!(b.api_keys().await.unwrap(), [laptop.clone(), ci.clone()], "every node's, oldest first");
    let err = b.insert_api_key(&key("ci", "ef", 3000)).await.unwrap_err();
    assert!(matches!(&err, Error::KeyNameTaken(n) if n == "ci"), "{err}");
    let err = b.insert_api_key(&key("copy", "ab", 3000)).await.unwrap_err();
    assert!(matches!(&err, Error::Query(..)), "one hash, one key: {err}");
    assert_eq!(a.api_keys().await.unwrap().len(), 2, "a refused key is not stored");

    assert_eq!(b.use_api_key(&ci.hash, 5000).await.unwrap().as_deref(), Some("ci"));
    assert_eq!(a.use_api_key(&"00".repeat(32), 5001).await.unwrap(), None, "an unknown hash is no key");
    assert_eq!(a.use_api_key("ci", 5002).await.unwrap(), None, "a name is not a hash");
    let listed = a.api_keys().await.unwrap();
    assert_eq!(listed, [laptop.clone(), ApiKeyRow { last_used_ms: Some(5000), ..ci.clone() }], "the use is recorded on its key only");
    assert_eq!(a.use_api_key(&ci.hash, 6000).await.unwrap().as_deref(), Some("ci"));
    assert_eq!(b.api_keys().await.unwrap()[1].last_used_ms, Some(6000), "each use moves it");

    assert!(b.revoke_api_key("ci").await.unwrap());
    assert!(!a.revoke_api_key("ci").await.unwrap(), "revoked already");
    assert!(!a.revoke_api_key("nobody").await.unwrap());
    assert_eq!(a.use_api_key(&ci.hash, 7000).await.unwrap(), None, "a revoked key lets no one in");
    assert_eq!(a.api_keys().await.unwrap(), std::slice::from_ref(&laptop));
    assert_eq!(a.use_api_key(&laptop.hash, 7001).await.unwrap().as_deref(), Some("laptop"), "the other key still works");
    // The name is free again.
    a.insert_api_key(&key("ci", "ef", 8000)).await.unwrap();
    assert_eq!(b.use_api_key(&"ef".repeat(32), 8001).await.unwrap().as_deref(), Some("ci"));
}

pub(crate) async fn secrets_are_set_again_counted_and_removed(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    a.put_secret("TOKEN", "sealed-1", 1000).await.unwrap();
    a.put_secret("API_KEY", "sealed-2", 1500).await.unwrap();
    let listed = b.secrets().await.unwrap();
    assert_eq!(listed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["API_KEY", "TOKEN"], "every node's, by name");
    let token = SecretRow { name: "TOKEN".into(), sealed: "sealed-1".into(), created_ms: 1000, updated_ms: 1000, last_used_ms: None, uses: 0 };
    assert_eq!(b.secret("TOKEN").await.unwrap(), Some(token.clone()));
    // Counted uses, then a new value: the count and the creation stay.
    b.use_secret("TOKEN", 3, 2000).await.unwrap();
    a.put_secret("TOKEN", "sealed-3", 3000).await.unwrap();
    let again = SecretRow { sealed: "sealed-3".into(), updated_ms: 3000, last_used_ms: Some(2000), uses: 3, ..token };
    assert_eq!(a.secret("TOKEN").await.unwrap(), Some(again));
    b.use_secret("NOBODY", 1, 4000).await.unwrap();
    assert_eq!(a.secret("NOBODY").await.unwrap(), None, "a use of no secret makes none");
    assert!(b.remove_secret("TOKEN").await.unwrap());
    assert!(!a.remove_secret("TOKEN").await.unwrap(), "removed already");
    assert_eq!(a.secret("TOKEN").await.unwrap(), None);
    assert_eq!(b.secrets().await.unwrap().len(), 1, "the other stays");
}

fn hook(id: &str, task: Option<&TaskId>) -> HookRow {
    HookRow {
        id: id.into(),
        url: format!("http://receiver.example.com/{id}"),
        task_id: task.map(|t| t.to_string()),
        format: "standard".into(),
        sealed: "sealed".into(),
        created_ms: 1000,
        sent: 0,
        last_sent_ms: None,
    }
}

/// The outbox: an event of a kind a hook takes, of a task it takes, adds a
/// row in the transaction that appends it, whichever write appends it;
/// a sender gets each (hook, task) stream's oldest row only, one node at
/// a time; a sent row leaves, a failed one waits its time or is kept as
/// failed; removing a hook removes its outbox.
pub(crate) async fn an_event_a_hook_takes_enters_its_outbox_and_leaves_in_order(db: &impl TestDatabase) {
    let a = db.open().await;
    let b = db.open().await;
    let (t1, t2) = (task(Some("one")), task(Some("two")));
    a.insert_task(&t1).await.unwrap();
    a.insert_task(&t2).await.unwrap();
    a.insert_hook(&hook("every", None), &["exec".into(), "wait".into()]).await.unwrap();
    a.insert_hook(&hook("only-two", Some(&t2.id)), &["exec".into()]).await.unwrap();
    // Three commands of t1 (one logged through a command's end), a
    // snapshot no hook takes, one command of t2.
    a.append_event(&event(&t1.id, EventKind::Exec)).await.unwrap();
    a.end_command(&event(&t1.id, EventKind::Exec)).await.unwrap();
    a.append_events(&[event(&t1.id, EventKind::Snapshot), event(&t1.id, EventKind::Exec)]).await.unwrap();
    a.append_event(&event(&t2.id, EventKind::Exec)).await.unwrap();

    let listed = b.hooks().await.unwrap();
    assert_eq!(listed.iter().map(|h| (h.hook.id.as_str(), h.kinds.clone(), h.pending)).collect::<Vec<_>>(), [
        ("every", vec!["exec".to_owned(), "wait".to_owned()], 4),
        ("only-two", vec!["exec".to_owned()], 1)
    ]);
    let t1_seqs = {
        let events = a.events(&t1.id).await.unwrap();
        events.iter().filter(|e| e.kind == EventKind::Exec).map(|e| e.seq as i64).collect::<Vec<_>>()
    };
    assert_eq!(t1_seqs.len(), 3);

    // Each stream's head only: t1's first command to `every`, t2's to both.
    let now = now_ms() + 1;
    let t2_seq = a.events(&t2.id).await.unwrap().iter().find(|e| e.kind == EventKind::Exec).unwrap().seq as i64;
    let mut first = a.claim_notifications("node-a", now, now + 30_000, 10).await.unwrap();
    assert!(first.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
    first.sort_by(|x, y| (&x.hook_id, &x.task_id).cmp(&(&y.hook_id, &y.task_id)));
    let heads: Vec<_> = first.iter().map(|n| (n.hook_id.as_str(), n.task_id.as_str(), n.seq, n.attempts)).collect();
    let mut expected = vec![("every", t1.id.as_str(), t1_seqs[0], 1), ("every", t2.id.as_str(), t2_seq, 1), ("only-two", t2.id.as_str(), t2_seq, 1)];
    expected.sort();
    assert_eq!(heads, expected);
    let t1_head = first.iter().position(|n| n.task_id == t1.id.as_str()).unwrap();
    let t1_head = first.remove(t1_head);
    assert!(b.claim_notifications("node-b", now, now + 30_000, 10).await.unwrap().is_empty(), "claimed by node-a: no one else's, and no stream's second");

    // t1's head fails: retried later, its stream waits behind it.
    a.notification_failed(t1_head.id, "connection refused", Some(now + 5_000)).await.unwrap();
    for n in &first {
        a.notification_sent(n.id, &n.hook_id, now).await.unwrap();
    }
    assert!(b.claim_notifications("node-b", now, now + 30_000, 10).await.unwrap().is_empty(), "t1's head is not due, and its next waits behind it");
    let again = b.claim_notifications("node-b", now + 5_000, now + 35_000, 10).await.unwrap();
    assert_eq!(again.iter().map(|n| (n.seq, n.attempts)).collect::<Vec<_>>(), [(t1_seqs[0], 2)]);
    // Given up: kept as failed; the stream goes on.
    b.notification_failed(again[0].id, "HTTP 500", None).await.unwrap();
    let next = a.claim_notifications("node-a", now + 5_000, now + 35_000, 10).await.unwrap();
    assert_eq!(next.iter().map(|n| n.seq).collect::<Vec<_>>(), [t1_seqs[1]]);
    // A claim that ran out (its node died sending) is anyone's again.
    let taken = b.claim_notifications("node-b", now + 40_000, now + 70_000, 10).await.unwrap();
    assert_eq!(taken.iter().map(|n| (n.seq, n.attempts)).collect::<Vec<_>>(), [(t1_seqs[1], 2)]);
    b.notification_sent(taken[0].id, "every", now + 40_000).await.unwrap();

    let listed = a.hooks().await.unwrap();
    let every = &listed[0];
    assert_eq!((every.pending, every.failed, every.hook.sent, every.hook.last_sent_ms), (1, 1, 2, Some(now + 40_000)));
    assert_eq!(every.last_error.as_deref(), Some("HTTP 500"));
    let kept = a.notifications("every", 10).await.unwrap();
    assert_eq!(kept.iter().map(|n| (n.seq, n.state.as_str())).collect::<Vec<_>>(), [(t1_seqs[2], "pending"), (t1_seqs[0], "failed")]);

    // Removed: its outbox goes, and new events add nothing for it.
    assert!(b.remove_hook("every").await.unwrap());
    assert!(!b.remove_hook("every").await.unwrap(), "removed already");
    a.append_event(&event(&t1.id, EventKind::Exec)).await.unwrap();
    assert!(a.notifications("every", 10).await.unwrap().is_empty());
    assert_eq!(a.hooks().await.unwrap().iter().map(|h| h.hook.id.as_str()).collect::<Vec<_>>(), ["only-two"]);
}

/// The database itself refuses to change or remove an entry of a log or a
/// checkpoint, or to add an entry without its hash (its triggers, written
/// in each backend's migrations).
pub(crate) async fn the_log_and_checkpoints_stay_append_only(db: &impl TestDatabase) {
    let (store, t) = store_with_running_task(db).await;
    store.append_event(&event(&t, EventKind::Exec)).await.unwrap();
    let keys_dir = tempfile::tempdir().unwrap();
    let keys = NodeKeys::load_or_create(&keys_dir.path().join("keys")).unwrap();
    let head = store.events(&t).await.unwrap()[0].hash.clone().unwrap();
    let signed = SignedCheckpoint::sign(&keys, Checkpoint { task: t.to_string(), seq: 1, head, time_ms: now_ms(), key_id: String::new() });
    store.insert_checkpoint(&signed, "cli:a").await.unwrap();
    for sql in [
        "UPDATE events SET args = '{\"x\":1}'",
        "UPDATE events SET actor = 'mallory'",
        "UPDATE events SET hash = 'ab'",
        "UPDATE events SET hash = NULL, prev_hash = NULL",
        "DELETE FROM events",
        "UPDATE checkpoints SET seq = 2",
        "DELETE FROM checkpoints",
    ] {
        let err = db.tamper(sql, None).await.unwrap_err();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    let err = db.tamper("INSERT INTO events (task_id, seq, time_ms, kind, actor, args) VALUES ($1, 9, 0, 'exec', 'x', '{}')", Some(t.as_str())).await.unwrap_err();
    assert!(err.contains("written with its hash"), "{err}");
    assert_chain(&*store, &t, 1).await;
    assert_eq!(store.checkpoints(&t).await.unwrap(), [signed]);
}

/// A write for a task that does not exist says so, whichever way it
/// reaches the task's row, and writes nothing.
pub(crate) async fn writes_for_an_unknown_task_are_refused(db: &impl TestDatabase) {
    let store = db.open().await;
    let ghost = TaskId::random();
    let ready = store.record_sandbox_ready(&ghost, "a", 1, 1, &event(&ghost, EventKind::SandboxStart)).await;
    assert!(matches!(ready, Err(Error::UnknownTask(_))), "{ready:?}");
    let suspended = store.finish_suspend(&ghost, None, &event(&ghost, EventKind::Suspend)).await;
    assert!(matches!(suspended, Err(Error::UnknownTask(_))), "{suspended:?}");
    assert!(matches!(store.finish_wake(&ghost, &event(&ghost, EventKind::Wake)).await, Err(Error::UnknownTask(_))));
    let recovered = store.record_recovery(&ghost, TaskState::Running, 1, "", "", &event(&ghost, EventKind::Recovered)).await;
    assert!(matches!(recovered, Err(Error::UnknownTask(_))), "{recovered:?}");
    assert!(store.cancel_wait(&ghost, &event(&ghost, EventKind::Wait)).await.unwrap().is_none(), "no wait is pending");
    assert!(matches!(store.acquire_lease(&ghost, "a", 1_000).await, Err(Error::UnknownTask(_))));
    assert!(matches!(store.lease(&ghost).await, Err(Error::UnknownTask(_))));
    assert!(store.append_event(&event(&ghost, EventKind::Exec)).await.is_err(), "a log needs its task");
    assert!(store.list_tasks().await.unwrap().is_empty());
    assert!(store.events(&ghost).await.unwrap().is_empty());
}
