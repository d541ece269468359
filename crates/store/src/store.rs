//! What the rest of Cairn asks of the task database, whatever keeps it.
//!
//! The contract is split by concern ([`TaskStore`], [`EventStore`],
//! [`SandboxStore`], [`SnapshotStore`], [`WaitStore`], [`CheckpointStore`],
//! [`NodeStore`], [`LeaseStore`], [`ApiKeyStore`]) so that a backend implements it one file at a time, and [`Store`] joins
//! them into the one object the runtime holds ([`SharedStore`]). The traits
//! are object-safe (`async_trait` boxes each call's future) because the
//! runtime picks a backend at start, not at compile time.
//!
//! What every backend must keep, and what the conformance suite checks:
//! a method that writes more than one thing writes them in one transaction
//! (a crash leaves all or none); a task's state only moves through
//! [`TaskStore::transition`]'s compare-and-set over core's transition table;
//! a task's event log is append-only and hash-chained (`cairn_ledger`), with
//! no two entries on the same sequence number under concurrent writers.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use cairn_core::{
    Event, InboxEvent, NewEvent, RollbackNote, SandboxState, Snapshot, SnapshotId, Task, TaskConfig, TaskId, TaskState,
    Transition, Wait, WaitId,
};
use cairn_ledger::SignedCheckpoint;

use crate::{Error, Lease, Result};

/// The store as the runtime holds it: shared by every request and
/// background loop, whichever backend it is.
/// What [`Store::on_change`] calls.
pub type ChangeListener = Arc<dyn Fn(&TaskId) + Send + Sync>;

pub type SharedStore = Arc<dyn Store>;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The live sandbox of a task, as recorded.
/// Which tasks a [`TaskStore::list_tasks_page`] lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks whose id or name holds this text (ignoring ASCII case).
    pub text: Option<String>,
}

impl TaskFilter {
    /// The `LIKE` pattern of [`TaskFilter::text`] (`%`, `_` and `\`
    /// escaped), or empty for any.
    pub(crate) fn like(&self) -> String {
        match self.text.as_deref().filter(|t| !t.is_empty()) {
            None => String::new(),
            Some(t) => {
                let escaped: String = t.to_ascii_lowercase().chars().flat_map(|c| if "%_\\".contains(c) { vec!['\\', c] } else { vec![c] }).collect();
                format!("%{escaped}%")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxRow {
    pub task: TaskId,
    pub uid_slot: u32,
    pub init_pid: Option<i32>,
    pub init_start_time: Option<u64>,
    pub started_ms: i64,
}

/// What delivering an event did.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivered {
    /// The stored event (for a repeated delivery: the first one).
    pub event: InboxEvent,
    /// The same delivery id was seen before: nothing changed.
    pub duplicate: bool,
    /// The wait it satisfied, if any.
    pub satisfied: Option<WaitId>,
    /// The task was suspended and is now `waking`: the caller wakes it.
    pub wake: bool,
}

/// The whole task database: every concern, plus what a handle on it is.
#[async_trait]
pub trait Store:
    TaskStore + EventStore + SandboxStore + SnapshotStore + WaitStore + CheckpointStore + NodeStore + LeaseStore + ApiKeyStore + SecretStore + HookStore + std::fmt::Debug
{
    /// Where the database is, as a store URL without its password
    /// (`sqlite:///var/lib/cairn/cairn.db`, `postgres://cairn@db/cairn`), for
    /// people reading logs.
    fn location(&self) -> String;

    /// True for a database several daemons can share (a server): then
    /// other nodes' work can become this one's (their timers, their tasks).
    fn shared(&self) -> bool {
        false
    }

    /// Calls `listener` with the id of each task whose state, events or
    /// waits changed, right after the change is committed through this
    /// store, so that waiters are woken by the change instead of polling. A
    /// write that failed or changed nothing calls nothing; a transaction
    /// names each task it changed once. The listener runs on the writer's
    /// task: it must be quick and must not block (it ticks a channel). One
    /// listener; a later call replaces it.
    fn on_change(&self, listener: ChangeListener);

    /// Writes a consistent copy of the whole database to `path`, a file
    /// that must not exist, while the store stays in use (a backup).
    /// [`Error::Unsupported`] for a database server, which its own tools
    /// back up.
    async fn copy_to(&self, path: &std::path::Path) -> Result<()>;

    /// Closes the database once the calls in flight are done.
    async fn close(&self);
}

/// Task rows: identity, lifecycle state, step counter, config.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Inserts a new task (a taken name is [`Error::NameTaken`]).
    async fn insert_task(&self, task: &Task) -> Result<()>;

    /// Finds a task by id or by name.
    async fn find_task(&self, id_or_name: &str) -> Result<Task>;

    /// Every task, oldest first.
    async fn list_tasks(&self) -> Result<Vec<Task>>;

    /// The tasks that match `filter`, newest first: `limit` of them from
    /// `offset`, and how many match in all.
    async fn list_tasks_page(&self, filter: &TaskFilter, offset: u64, limit: u64) -> Result<(Vec<Task>, u64)>;

    /// Running tasks with an idle-suspend time that have had no activity
    /// for longer than it at `now_ms`.
    async fn idle_tasks(&self, now_ms: i64) -> Result<Vec<Task>>;

    /// Moves the task by `t` from `from`, the state the caller read, if it
    /// is still there: a compare-and-set over core's transition table, so
    /// that two actors never both move a task. Returns the new state.
    ///
    /// A move the table refuses is [`Error::Transition`] and never reaches
    /// the database; a task that is no longer in `from` is
    /// [`Error::StateChanged`] and stays as it is.
    async fn transition(&self, id: &TaskId, from: TaskState, t: Transition) -> Result<TaskState>;

    /// Moves a suspended task to `waking` (resume, exec, cp). False when it
    /// was not suspended.
    async fn begin_wake(&self, task: &TaskId) -> Result<bool> {
        match self.transition(task, TaskState::Suspended, Transition::Wake).await {
            Ok(_) => Ok(true),
            Err(Error::StateChanged { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records what the sandbox of a task is doing, with a note for people
    /// (why it was lost, say).
    async fn set_sandbox_state(&self, id: &TaskId, state: SandboxState, note: Option<&str>) -> Result<()>;

    /// Increments the step counter and returns the new value.
    async fn bump_step(&self, id: &TaskId) -> Result<u64>;

    /// Replaces a task's config and logs why, in one transaction.
    async fn set_config(&self, id: &TaskId, config: &TaskConfig, ev: &NewEvent) -> Result<()>;

    /// Logs the end of a command and marks it as the task's latest
    /// activity (an idle suspend counts from there), in one transaction;
    /// returns the event's sequence number.
    async fn end_command(&self, ev: &NewEvent) -> Result<u64>;

    /// Marks a recovered task running again with its recovery note, in one
    /// transaction with the `recovered` event.
    async fn record_recovery(&self, task: &TaskId, from: TaskState, step: u64, memory: &str, note: &str, ev: &NewEvent) -> Result<()>;
}

/// Each task's append-only, hash-chained event log.
#[async_trait]
pub trait EventStore: Send + Sync {
    /// Appends an event; returns its sequence number in the task's log.
    async fn append_event(&self, ev: &NewEvent) -> Result<u64>;

    /// Appends several events in one transaction (one fsync): the egress
    /// decision log writes bursts of connection attempts this way.
    async fn append_events(&self, events: &[NewEvent]) -> Result<()>;

    /// The task's whole log, in order.
    async fn events(&self, id: &TaskId) -> Result<Vec<Event>>;

    /// The task's events after sequence number `after` (a live watch asks
    /// for what is new, not for the whole log again).
    async fn events_after(&self, id: &TaskId, after: u64) -> Result<Vec<Event>>;

    /// A page of the task's log: its last `limit` events before sequence
    /// number `before` (all of them when `None`), in order.
    async fn events_before(&self, id: &TaskId, before: Option<u64>, limit: u64) -> Result<Vec<Event>>;
}

/// Live sandboxes and the uid slots they hold: a slot is a range of host
/// uids, so two sandboxes must never share one.
#[async_trait]
pub trait SandboxStore: Send + Sync {
    /// Records a new sandbox for `id` on the lowest free uid slot and returns
    /// the slot. Atomic, so two concurrent starts never share a slot; one
    /// sandbox per task.
    async fn claim_sandbox_slot(&self, id: &TaskId) -> Result<u32> {
        self.claim_sandbox_slot_from(id, 0).await
    }

    /// Like [`Self::claim_sandbox_slot`], with the lowest slot `>= min`.
    async fn claim_sandbox_slot_from(&self, id: &TaskId, min: u32) -> Result<u32>;

    /// Takes exactly uid slot `slot` for a new sandbox of `task`; false
    /// when another sandbox holds it.
    async fn try_claim_sandbox_slot(&self, task: &TaskId, slot: u32) -> Result<bool>;

    /// Records, in one transaction, that the sandbox of `id` is up on
    /// `node`: its init, the task state (`running` when it was `created`),
    /// the sandbox state, the task's node, and the start event. Returns the
    /// event's sequence number. The task's node is cleared when its sandbox
    /// goes: [`Self::release_sandbox`], a sandbox state other than `ready`,
    /// the end of a suspend.
    async fn record_sandbox_ready(&self, id: &TaskId, node: &str, pid: i32, start_time: u64, ev: &NewEvent) -> Result<u64>;

    async fn sandbox(&self, id: &TaskId) -> Result<Option<SandboxRow>>;

    /// Every live sandbox, by uid slot.
    async fn sandboxes(&self) -> Result<Vec<SandboxRow>>;

    /// Forgets the sandbox of `id`, freeing its uid slot, and clears the
    /// task's node. Absent is fine.
    async fn release_sandbox(&self, id: &TaskId) -> Result<()>;

    /// Remembers the slot a suspended task's sandbox had, so that a wake
    /// can take it again and keep the disk cache of that slot.
    async fn set_last_uid_slot(&self, task: &TaskId, slot: Option<u32>) -> Result<()>;

    async fn last_uid_slot(&self, task: &TaskId) -> Result<Option<u32>>;
}

/// Snapshot records, rollback notes and each task's baseline manifest. The
/// snapshot data itself is in the blob store; a record is written only
/// once that data is durable.
#[async_trait]
pub trait SnapshotStore: Send + Sync {
    /// Records a snapshot whose data is durable, in one transaction with the
    /// task's new baseline, its memory summary (when `memory` is given) and
    /// the snapshot event.
    async fn insert_snapshot(&self, s: &Snapshot, baseline: &str, memory: Option<&str>, ev: &NewEvent) -> Result<()>;

    /// Records a fork in one transaction: the new task, its creation event,
    /// and its branch snapshot (whose data is the source's, durable
    /// already), so that a crash leaves either no fork or a whole one that
    /// recovery restores from its branch.
    async fn insert_fork(&self, task: &Task, created: &NewEvent, branch: &Snapshot, snapshotted: &NewEvent) -> Result<()>;

    /// A task's snapshots, oldest first.
    async fn snapshots(&self, task: &TaskId) -> Result<Vec<Snapshot>>;

    /// Every snapshot of every task (for `check` and `gc`).
    async fn all_snapshots(&self) -> Result<Vec<Snapshot>>;

    async fn find_snapshot(&self, id: &str) -> Result<Snapshot>;

    /// Manifest ids that tasks use as baselines (live for `gc`).
    async fn baselines(&self) -> Result<Vec<String>>;

    async fn baseline(&self, task: &TaskId) -> Result<Option<String>>;

    async fn set_baseline(&self, task: &TaskId, baseline: Option<&str>) -> Result<()>;

    /// Records a finished rollback in one transaction: the task's step,
    /// memory summary, baseline and rollback note, and the event.
    async fn record_rollback(&self, task: &TaskId, to: &Snapshot, note: &RollbackNote, baseline: &str, ev: &NewEvent) -> Result<()>;

    /// Deletes expired snapshot records with one event each, in one
    /// transaction. Their data becomes garbage for `gc`.
    async fn expire_snapshots(&self, ids: &[SnapshotId], events: &[NewEvent]) -> Result<()>;
}

/// Waits, the durable inbox, and the task-state steps of suspend and wake
/// that must commit together with them.
#[async_trait]
pub trait WaitStore: Send + Sync {
    /// Registers a wait. If the inbox already holds a matching event, the
    /// wait is satisfied at once by the oldest one, which is returned. A
    /// task has at most one pending wait ([`Error::WaitPending`]).
    async fn insert_wait(&self, w: &Wait, ev: &NewEvent) -> Result<Option<InboxEvent>>;

    /// Writes an event to the task's inbox and satisfies its pending wait
    /// when it matches, all in one transaction: once this returns, the event
    /// is durable and has taken effect exactly once. A delivery id seen
    /// before makes it a no-op.
    async fn deliver(&self, ev: &InboxEvent) -> Result<Delivered>;

    /// Ends a suspend: `suspended`, or straight to `waking` when the wait
    /// it suspended for was satisfied meanwhile (an event that came in while
    /// the snapshot was being stored). Returns the state written.
    async fn finish_suspend(&self, task: &TaskId, waiting_for: Option<&WaitId>, ev: &NewEvent) -> Result<TaskState>;

    /// Marks a waking task running, in one transaction with its `wake`
    /// event: a crash leaves both or neither.
    async fn finish_wake(&self, task: &TaskId, ev: &NewEvent) -> Result<()>;

    /// Cancels the task's pending wait, in one transaction with `ev`: it
    /// ends without an event (`cancelled_ms`, and `satisfied_ms` so that it
    /// is no longer pending). A task suspended for it becomes `waking`
    /// (the bool): the caller wakes it. `None` when no wait is pending.
    async fn cancel_wait(&self, task: &TaskId, ev: &NewEvent) -> Result<Option<(Wait, bool)>>;

    async fn pending_wait(&self, task: &TaskId) -> Result<Option<Wait>>;

    /// Every pending wait of one kind (`approval`, `webhook`, `timer`),
    /// oldest first: what the console lists for approvers.
    async fn pending_waits(&self, kind: &str) -> Result<Vec<Wait>>;

    async fn find_wait(&self, id: &str) -> Result<Wait>;

    /// Pending timers due at `now_ms`, earliest first.
    async fn due_timers(&self, now_ms: i64) -> Result<Vec<Wait>>;

    /// The earliest pending timer, for the timer loop to sleep until.
    async fn next_timer_ms(&self) -> Result<Option<i64>>;

    async fn inbox_event(&self, id: &str) -> Result<InboxEvent>;

    /// A task's inbox, oldest first.
    async fn inbox(&self, task: &TaskId) -> Result<Vec<InboxEvent>>;
}

/// Signed checkpoints of a task's chain head (the store's side of the
/// ledger).
#[async_trait]
pub trait CheckpointStore: Send + Sync {
    /// Records a signed checkpoint; `actor` is who asked (kept, not signed).
    async fn insert_checkpoint(&self, c: &SignedCheckpoint, actor: &str) -> Result<()>;

    /// A task's checkpoints, oldest first.
    async fn checkpoints(&self, task: &TaskId) -> Result<Vec<SignedCheckpoint>>;

    /// A task's newest checkpoint.
    async fn latest_checkpoint(&self, task: &TaskId) -> Result<Option<SignedCheckpoint>>;
}

/// A daemon sharing this database, as it last announced itself.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct NodeRow {
    /// Unique among the daemons of a database (`cairn serve --node`).
    pub name: String,
    /// Its API's base URL.
    pub url: String,
    /// When it started (ms since the epoch).
    pub started_ms: i64,
    /// Its latest heartbeat (ms since the epoch).
    pub heartbeat_ms: i64,
    /// Its Cairn version.
    pub version: String,
}

/// The node registry: which daemons share the database, when each last
/// said it was alive, and which tasks' sandboxes each runs. Whether a node
/// is up (how old a heartbeat may be) is the reader's call.
#[async_trait]
pub trait NodeStore: Send + Sync {
    /// Registers a node at its start: inserts its row, or replaces every
    /// field of the row its name already has (a restart).
    async fn register_node(&self, node: &NodeRow) -> Result<()>;

    /// Records a heartbeat of `node` at `now_ms`. A node whose row is gone
    /// (deleted by hand) is registered again, with `started_ms` as given.
    async fn heartbeat_node(&self, node: &NodeRow, now_ms: i64) -> Result<()>;

    /// Every node, by name.
    async fn list_nodes(&self) -> Result<Vec<NodeRow>>;

    /// Publishes the public keys `node` signs (or signed) with; a key
    /// published before is kept as it is.
    async fn publish_keys(&self, node: &str, keys: &[cairn_ledger::KeyInfo]) -> Result<()>;

    /// Every node's published public keys, as `(node, key)` (`current` is
    /// false: only the node itself knows which one it signs with now).
    async fn cluster_keys(&self) -> Result<Vec<(String, cairn_ledger::KeyInfo)>>;

    /// The tasks whose sandbox is up on a node, as `(node, task)` pairs,
    /// by node then task id.
    async fn node_tasks(&self) -> Result<Vec<(String, TaskId)>>;
}

/// A task that no live node holds but that needs one: waking (an event
/// came for it), or running or half-suspended on a node whose lease ran
/// out (a node lost).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unheld {
    pub task: TaskId,
    pub state: TaskState,
    /// The node whose lease ran out, if one held it.
    pub last_node: Option<String>,
}

/// Task leases: which node may run a task, with fencing tokens (see
/// `lease.rs`). A lease is dropped in the transaction that makes the task
/// `suspended` or ends it.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes the lease of `task` for `node` for `ttl_ms` when it is free,
    /// expired, or `node`'s already (then the token stays). `None` while
    /// another node's lease is live. From then on this handle's writes for
    /// the task carry the token.
    async fn acquire_lease(&self, task: &TaskId, node: &str, ttl_ms: i64) -> Result<Option<Lease>>;

    /// Extends every lease `node` holds through this handle by `ttl_ms`
    /// from now. Returns the tasks whose lease another node took meanwhile
    /// (this handle forgets them: their writes are refused).
    async fn renew_leases(&self, node: &str, ttl_ms: i64) -> Result<Vec<TaskId>>;

    /// Drops the lease this handle holds on `task` (a no-op when it holds
    /// none or lost it).
    async fn release_lease(&self, task: &TaskId) -> Result<()>;

    /// The lease of `task` as stored.
    async fn lease(&self, task: &TaskId) -> Result<Lease>;

    /// Tasks that need a node and have no live lease at `now_ms`, oldest
    /// first.
    async fn unheld_tasks(&self, now_ms: i64) -> Result<Vec<Unheld>>;

    /// Takes a shared (`exclusive` false: a snapshot, restore or fork) or an
    /// exclusive (gc) hold on the blob store for `node` until `ttl_ms` from
    /// now, named `id`. False, and nothing held, while another node holds
    /// the other kind (or, for an exclusive one, any kind).
    async fn lock_blobs(&self, id: &str, node: &str, exclusive: bool, ttl_ms: i64) -> Result<bool>;

    /// Lets go of the hold named `id`.
    async fn unlock_blobs(&self, id: &str) -> Result<()>;

    /// Extends every hold of `node` by `ttl_ms` from now.
    async fn renew_blob_locks(&self, node: &str, ttl_ms: i64) -> Result<()>;

    /// A secret every node of the database shares: `proposed` when none is
    /// stored under `name` yet (the first node's own), else the stored one.
    async fn cluster_secret(&self, name: &str, proposed: &str) -> Result<String>;
}

/// An API key as the store keeps it: never the key, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ApiKeyRow {
    /// Unique: how people pick the key out (to revoke it).
    pub name: String,
    /// Hex SHA-256 of the key; unique, as a request finds its key by it.
    pub hash: String,
    /// When it was made (ms since the epoch).
    pub created_ms: i64,
    /// The latest request that presented it (ms since the epoch); `None`
    /// until one did.
    pub last_used_ms: Option<i64>,
}

/// Keys for the E2B-compatible API (`X-API-Key`), shared by every node of
/// the database. The store sees hashes only: the caller hashes a key
/// before storing it or looking it up.
#[async_trait]
pub trait ApiKeyStore: Send + Sync {
    /// Records a new key ([`Error::KeyNameTaken`] when a key of that name
    /// exists).
    async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()>;

    /// Every key, oldest first.
    async fn api_keys(&self) -> Result<Vec<ApiKeyRow>>;

    /// Removes the key `name`; false when there is none.
    async fn revoke_api_key(&self, name: &str) -> Result<bool>;

    /// The name of the key whose hash is `hash`, its last use set to
    /// `now_ms` in the same statement; `None` when no key has it (never
    /// made, or revoked).
    async fn use_api_key(&self, hash: &str, now_ms: i64) -> Result<Option<String>>;
}

/// A secret as the store keeps it: its value sealed by the caller.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SecretRow {
    /// Unique: the name rules and placeholders use.
    pub name: String,
    /// The value sealed under the daemon's secrets key (base64 of the
    /// nonce and the ciphertext); the store never sees the value.
    pub sealed: String,
    /// When the name was first set (ms since the epoch).
    pub created_ms: i64,
    /// When its value was last set.
    pub updated_ms: i64,
    /// The latest request that used it; `None` until one did.
    pub last_used_ms: Option<i64>,
    /// How many requests used it.
    pub uses: i64,
}

/// Secrets for the egress proxy, shared by every node of the database.
/// The store sees sealed values only: the caller seals and opens them.
#[async_trait]
pub trait SecretStore: Send + Sync {
    /// Stores `sealed` under `name`: a new secret, or a new value for an
    /// existing one (which keeps its creation time and use count).
    async fn put_secret(&self, name: &str, sealed: &str, now_ms: i64) -> Result<()>;

    /// Every secret, by name.
    async fn secrets(&self) -> Result<Vec<SecretRow>>;

    /// The secret `name`, if any.
    async fn secret(&self, name: &str) -> Result<Option<SecretRow>>;

    /// Removes the secret `name`; false when there is none.
    async fn remove_secret(&self, name: &str) -> Result<bool>;

    /// Counts `uses` more uses of `name`, the latest at `now_ms`.
    async fn use_secret(&self, name: &str, uses: i64, now_ms: i64) -> Result<()>;
}

/// An outgoing hook as the store keeps it: its signing secret sealed by
/// the caller.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct HookRow {
    pub id: String,
    /// Where notifications are posted.
    pub url: String,
    /// The one task whose events it takes; `None`: every task's.
    pub task_id: Option<String>,
    /// How a notification is shaped and signed (`standard`, `e2b`).
    pub format: String,
    /// The signing secret sealed under the daemon's secrets key.
    pub sealed: String,
    pub created_ms: i64,
    /// Notifications answered with a 2xx.
    pub sent: i64,
    /// The latest of them.
    pub last_sent_ms: Option<i64>,
}

/// A hook with the event-log kinds it takes and the state of its outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookEntry {
    pub hook: HookRow,
    /// Event-log kinds (`events.kind`), sorted.
    pub kinds: Vec<String>,
    /// Notifications not yet answered with a 2xx.
    pub pending: i64,
    /// Notifications given up on.
    pub failed: i64,
    /// The latest failed attempt's error, of any notification still kept.
    pub last_error: Option<String>,
}

/// One notification to send: the event `seq` of `task` to hook `hook_id`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct Notification {
    pub id: i64,
    pub hook_id: String,
    pub task_id: String,
    pub seq: i64,
    /// When its event was appended (ms since the epoch).
    pub created_ms: i64,
    /// Attempts so far, this one included.
    pub attempts: i64,
    /// `pending` or `failed`.
    pub state: String,
    pub last_error: Option<String>,
}

/// Outgoing hooks and their outbox, shared by every node of the database.
/// The outbox is filled by the database itself: appending an event of a
/// kind a hook takes adds a row in the same transaction.
#[async_trait]
pub trait HookStore: Send + Sync {
    /// Stores a new hook taking the event-log `kinds`.
    async fn insert_hook(&self, hook: &HookRow, kinds: &[String]) -> Result<()>;

    /// Every hook, oldest first, with its outbox's state.
    async fn hooks(&self) -> Result<Vec<HookEntry>>;

    /// Removes the hook `id` and its outbox; false when there is none.
    async fn remove_hook(&self, id: &str) -> Result<bool>;

    /// Claims for `node` until `until_ms` at most `limit` notifications
    /// due at `now_ms`, each the oldest pending one of its (hook, task)
    /// stream and claimed by no one else, oldest first; counts an attempt
    /// of each.
    async fn claim_notifications(&self, node: &str, now_ms: i64, until_ms: i64, limit: i64) -> Result<Vec<Notification>>;

    /// Notification `id` was answered with a 2xx at `now_ms`: it leaves
    /// the outbox and counts as sent.
    async fn notification_sent(&self, id: i64, hook_id: &str, now_ms: i64) -> Result<()>;

    /// Notification `id` failed with `error`: tried again from `next_ms`,
    /// or (`next_ms` `None`) given up and kept as failed.
    async fn notification_failed(&self, id: i64, error: &str, next_ms: Option<i64>) -> Result<()>;

    /// Hook `hook_id`'s notifications still in the outbox (pending, then
    /// failed), oldest first, at most `limit`.
    async fn notifications(&self, hook_id: &str, limit: i64) -> Result<Vec<Notification>>;
}
