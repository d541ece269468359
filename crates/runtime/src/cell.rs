//! What the runtime keeps in memory about each task it works with, in one
//! cell per task instead of one map per concern: the lock that serialises
//! its lifecycle steps, its live sandbox, the commands running in it, the
//! progress of a snapshot or restore, the parsed manifest its disk matches,
//! its egress proxy, and a watch channel that ticks when its record changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_api::snapshots::OpProgress;
use cairn_core::TaskId;
use cairn_snapshot::{ChangeWatch, Manifest};
use tokio::sync::watch;

use crate::admission::Kind;
use crate::egress::Proxy;
use crate::runtime::Live;

/// One task's in-memory state. Everything in it can be rebuilt from the
/// store and the host after a restart.
#[derive(Debug)]
pub(crate) struct TaskCell {
    /// Serialises the task's lifecycle steps (start, snapshot, suspend,
    /// wake, rollback, destroy).
    lock: tokio::sync::Mutex<()>,
    state: Mutex<CellState>,
    /// Ticks after each committed change to the task's state, events or
    /// waits; waiters (`wait --block`, the event stream) subscribe.
    changed: watch::Sender<u64>,
    /// Its running commands' output, for whoever watches (the console);
    /// sent only while someone does.
    output: tokio::sync::broadcast::Sender<cairn_api::exec::LiveOutput>,
}

/// Chunks of live output a slow watcher may fall behind by before it
/// misses some (it is told how many).
const LIVE_OUTPUT_BACKLOG: usize = 256;

impl Default for TaskCell {
    fn default() -> Self {
        TaskCell {
            lock: tokio::sync::Mutex::default(),
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            output: tokio::sync::broadcast::channel(LIVE_OUTPUT_BACKLOG).0,
        }
    }
}

#[derive(Debug, Default)]
struct CellState {
    live: Option<Live>,
    /// Commands running now: a task is not idle while one runs.
    busy: usize,
    /// Commands and event streams admitted and not yet done, against the
    /// task's bounds (`crate::admission`).
    execs: usize,
    streams: usize,
    progress: Option<OpProgress>,
    /// The manifest the task's disk matches, by id, so an incremental
    /// snapshot does not parse its parent's manifest again.
    baseline: Option<(String, Arc<Manifest>)>,
    /// The change watch on the task's disk that has seen every change since
    /// the baseline of this id was captured.
    tracker: Option<(String, ChangeWatch)>,
    proxy: Option<Proxy>,
}

impl TaskCell {
    pub(crate) async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    pub(crate) fn try_lock(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.lock.try_lock().ok()
    }

    /// A receiver that sees each later change of the task.
    /// Where its commands' live output goes.
    pub(crate) fn output(&self) -> tokio::sync::broadcast::Sender<cairn_api::exec::LiveOutput> {
        self.output.clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn tick(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn state(&self) -> MutexGuard<'_, CellState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn live(&self) -> Option<Live> {
        self.state().live
    }

    /// Records the live sandbox. With `None` (it is going away) returns its
    /// proxy for the caller to stop; a new sandbox's proxy replaces the old
    /// one through [`TaskCell::set_proxy`].
    pub(crate) fn set_live(&self, live: Option<Live>) -> Option<Proxy> {
        let mut s = self.state();
        s.live = live;
        if live.is_none() {
            s.proxy.take()
        } else {
            None
        }
    }

    pub(crate) fn set_proxy(&self, proxy: Proxy) -> Option<Proxy> {
        self.state().proxy.replace(proxy)
    }

    pub(crate) fn with_proxy<R>(&self, f: impl FnOnce(&Proxy) -> R) -> Option<R> {
        self.state().proxy.as_ref().map(f)
    }

    pub(crate) fn take_proxy(&self) -> Option<Proxy> {
        self.state().proxy.take()
    }

    pub(crate) fn busy(&self) -> bool {
        self.state().busy > 0
    }

    pub(crate) fn add_busy(&self, delta: isize) {
        let mut s = self.state();
        s.busy = s.busy.saturating_add_signed(delta);
    }

    /// Counts one more command or stream unless `limit` are held already.
    pub(crate) fn try_hold(&self, kind: Kind, limit: usize) -> bool {
        let mut s = self.state();
        let n = match kind {
            Kind::Exec => &mut s.execs,
            Kind::Stream => &mut s.streams,
        };
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    /// How many commands or streams are held now.
    pub(crate) fn held(&self, kind: Kind) -> usize {
        let s = self.state();
        match kind {
            Kind::Exec => s.execs,
            Kind::Stream => s.streams,
        }
    }

    pub(crate) fn release(&self, kind: Kind) {
        let mut s = self.state();
        let n = match kind {
            Kind::Exec => &mut s.execs,
            Kind::Stream => &mut s.streams,
        };
        *n = n.saturating_sub(1);
    }

    pub(crate) fn progress(&self) -> Option<OpProgress> {
        self.state().progress.clone()
    }

    pub(crate) fn set_progress(&self, p: Option<OpProgress>) {
        self.state().progress = p;
    }

    pub(crate) fn baseline(&self, hex: &str) -> Option<Arc<Manifest>> {
        self.state().baseline.as_ref().filter(|(h, _)| h == hex).map(|(_, m)| m.clone())
    }

    /// Another baseline also ends the change watch kept for the last one.
    pub(crate) fn set_baseline(&self, b: Option<(String, Arc<Manifest>)>) {
        let mut state = self.state();
        if state.tracker.as_ref().is_some_and(|(hex, _)| b.as_ref().is_none_or(|(h, _)| h != hex)) {
            state.tracker = None;
        }
        state.baseline = b;
    }

    /// Takes the change watch if it has seen every change since baseline
    /// `hex` (any other is dropped).
    pub(crate) fn take_watch(&self, hex: &str) -> Option<ChangeWatch> {
        self.state().tracker.take().filter(|(h, _)| h == hex).map(|(_, w)| w)
    }

    pub(crate) fn set_watch(&self, hex: String, watch: ChangeWatch) {
        self.state().tracker = Some((hex, watch));
    }
}

/// The cells of the tasks the runtime works with.
#[derive(Debug, Default)]
pub(crate) struct Cells(Mutex<HashMap<TaskId, Arc<TaskCell>>>);

impl Cells {
    fn map(&self) -> MutexGuard<'_, HashMap<TaskId, Arc<TaskCell>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task's cell, made empty on first use.
    pub(crate) fn of(&self, id: &TaskId) -> Arc<TaskCell> {
        self.map().entry(id.clone()).or_default().clone()
    }

    /// The task's cell if it has one (reads that must not make one).
    pub(crate) fn get(&self, id: &TaskId) -> Option<Arc<TaskCell>> {
        self.map().get(id).cloned()
    }

    /// Forgets a task that takes no more lifecycle steps (destroyed). A
    /// caller still holding the cell keeps it until it is done.
    pub(crate) fn remove(&self, id: &TaskId) -> Option<Arc<TaskCell>> {
        self.map().remove(id)
    }

    pub(crate) fn all(&self) -> Vec<(TaskId, Arc<TaskCell>)> {
        self.map().iter().map(|(id, c)| (id.clone(), c.clone())).collect()
    }

    /// Ticks every cell someone waits on. The store tells this node of its
    /// own writes only: on a store other nodes share, what they change
    /// reaches this node's waiters when each heartbeat looks again.
    pub(crate) fn tick_watched(&self) {
        for (_, c) in self.all() {
            if c.changed.receiver_count() > 0 {
                c.tick();
            }
        }
    }

    /// Ticks the cell of each task the store reports changed, on the
    /// writer's own task (a task with no cell has no waiter; one without a
    /// subscriber costs a lock and a counter).
    pub(crate) fn follow(self: &Arc<Self>, store: &dyn cairn_store::Store) {
        let cells = Arc::downgrade(self);
        store.on_change(Arc::new(move |task: &TaskId| {
            if let Some(c) = cells.upgrade().and_then(|cells| cells.get(task)) {
                c.tick();
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{Task, TaskState, Transition};
    use std::time::Duration;

    #[tokio::test]
    async fn a_change_ticks_only_the_cell_of_its_task() {
        let dir = tempfile::tempdir().unwrap();
        let store: cairn_store::SharedStore = Arc::new(cairn_store::SqliteStore::open(&dir.path().join("t.db")).await.unwrap());
        let cells = Arc::new(Cells::default());
        cells.follow(store.as_ref());
        let (a, b) = (Task::new(TaskId::random(), None, Default::default(), 0), Task::new(TaskId::random(), None, Default::default(), 0));
        let (mut seen_a, seen_b) = (cells.of(&a.id).subscribe(), cells.of(&b.id).subscribe());
        store.insert_task(&a).await.unwrap();
        store.transition(&a.id, TaskState::Created, Transition::Start).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), seen_a.changed()).await.unwrap().unwrap();
        assert!(!seen_b.has_changed().unwrap(), "b did not change");
        // A change of a task without a cell makes none.
        let c = Task::new(TaskId::random(), None, Default::default(), 0);
        store.insert_task(&c).await.unwrap();
        store.transition(&c.id, TaskState::Created, Transition::Start).await.unwrap();
        assert!(cells.get(&c.id).is_none());
        assert!(!seen_b.has_changed().unwrap());
    }

    #[test]
    fn busy_counts_nest_and_progress_and_baseline_are_kept() {
        let cell = TaskCell::default();
        assert!(!cell.busy());
        cell.add_busy(1);
        cell.add_busy(1);
        cell.add_busy(-1);
        assert!(cell.busy(), "one command still runs");
        cell.add_busy(-1);
        assert!(!cell.busy());
        assert!(cell.baseline("m1").is_none());
    }
}
