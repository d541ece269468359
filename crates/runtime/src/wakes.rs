//! The wake scheduler: events, timers and suspends that end in `waking`
//! queue a wake here instead of each spawning their own. A task is queued
//! at most once at a time (ten events for one task make one wake), and at
//! most [`MAX_CONCURRENT_WAKES`] wakes run at once (more would only share
//! the same cores and disk). The queue is not the record: a task's
//! `waking` state is durable, and a restarted daemon wakes it again.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cairn_core::TaskId;
use tokio::sync::{mpsc, Semaphore};

use crate::runtime::Runtime;

/// Wakes that run at the same time.
pub const MAX_CONCURRENT_WAKES: usize = 8;

/// One queued wake.
#[derive(Debug)]
pub(crate) struct WakeJob {
    pub task: TaskId,
    /// What woke it, for the event log.
    pub trigger: String,
    /// When the event that woke it was accepted (for its latency).
    pub accepted: Option<Instant>,
}

#[derive(Debug)]
pub(crate) struct WakeScheduler {
    queued: Mutex<HashSet<TaskId>>,
    tx: mpsc::UnboundedSender<WakeJob>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<WakeJob>>>,
    limit: usize,
}

impl WakeScheduler {
    pub(crate) fn new(limit: usize) -> WakeScheduler {
        let (tx, rx) = mpsc::unbounded_channel();
        WakeScheduler { queued: Mutex::default(), tx, rx: Mutex::new(Some(rx)), limit: limit.max(1) }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, HashSet<TaskId>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a wake of `job.task` unless one is queued already (a wake
    /// that has begun does not count: it may have read the state before
    /// the event that queues this one). True when queued.
    pub(crate) fn schedule(&self, job: WakeJob) -> bool {
        if !self.queued().insert(job.task.clone()) {
            return false;
        }
        self.tx.send(job).is_ok()
    }

    /// Runs queued wakes with `wake`, at most `limit` at a time, until the
    /// scheduler is dropped. Called once.
    pub(crate) fn run<F, Fut>(self: &Arc<Self>, wake: F)
    where
        F: Fn(WakeJob) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(mut rx) = self.rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return tracing::error!("the wake scheduler was started twice");
        };
        let me = Arc::downgrade(self);
        let permits = Arc::new(Semaphore::new(self.limit));
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                let Ok(permit) = permits.clone().acquire_owned().await else { return };
                let Some(me) = me.upgrade() else { return };
                me.queued().remove(&job.task);
                let run = wake(job);
                tokio::spawn(async move {
                    run.await;
                    drop(permit);
                });
            }
        });
    }
}

impl Runtime {
    /// Queues a wake of a `waking` task (see [`WakeScheduler::schedule`]).
    pub(crate) fn schedule_wake(&self, task: TaskId, trigger: String, accepted: Option<Instant>) {
        self.wakes.schedule(WakeJob { task, trigger, accepted });
    }

    /// Starts running queued wakes.
    pub(crate) fn spawn_wakes(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        self.wakes.run(move |job| {
            let me = me.clone();
            async move {
                let Some(rt) = me.upgrade() else { return };
                if let Err(e) = rt.wake(&job.task, &job.trigger, job.accepted).await {
                    tracing::error!(task = %job.task, "wake failed: {e}");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn job(task: &TaskId) -> WakeJob {
        WakeJob { task: task.clone(), trigger: "test".into(), accepted: None }
    }

    #[tokio::test]
    async fn a_task_is_queued_once_and_wakes_run_within_the_limit() {
        let scheduler = Arc::new(WakeScheduler::new(2));
        let tasks: Vec<TaskId> = (0..6).map(|_| TaskId::random()).collect();
        for t in &tasks {
            assert!(scheduler.schedule(job(t)));
            // Repeats before the wake begins add nothing.
            assert!(!scheduler.schedule(job(t)));
        }
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (r, m, d) = (running.clone(), most.clone(), done.clone());
        scheduler.run(move |job| {
            let (r, m, d) = (r.clone(), m.clone(), d.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                d.lock().unwrap().push(job.task);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.lock().unwrap().len() < tasks.len() {
            assert!(Instant::now() < deadline, "wakes did not finish: {:?}", done.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut woken = done.lock().unwrap().clone();
        woken.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut expected = tasks.clone();
        expected.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(woken, expected, "each task woken exactly once");
        assert_eq!(most.load(Ordering::SeqCst), 2, "at most two at a time, and the limit was used");
        // Once its wake has begun, a task can be queued again.
        assert!(scheduler.schedule(job(&tasks[0])));
    }
}
