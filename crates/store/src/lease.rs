//! Task leases and the fencing of writes, the part both backends share.
//!
//! A task runs on at most one node: the one holding its lease (columns of
//! the task's row: holder, token, expiry). Taking a lease that is free or
//! expired increments the token; renewing one's own does not. Each store
//! handle remembers the leases taken through it ([`Fences`]) and checks,
//! inside the transaction of every write for such a task, that the token
//! it holds is still the task's: a node that lost its lease (it stalled
//! past the expiry and another node took the task) can no longer write for
//! the task, however late its writes arrive. Writes by a node that holds
//! no lease for the task are intake (an event, an approval for a task
//! that runs elsewhere) and pass; a state change or a sandbox record by
//! such a node is refused while another node's lease is live.

use std::collections::HashMap;
use std::sync::Mutex;

use cairn_core::{TaskId, TaskState};

use crate::{Error, Result};

/// A task's lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub task: TaskId,
    /// The holder; `None` once dropped (suspended, ended) or never taken.
    pub node: Option<String>,
    /// Incremented at each acquisition; kept when the lease is dropped.
    pub token: u64,
    /// When the lease runs out unless renewed (ms since the epoch).
    pub expires_ms: Option<i64>,
    /// The node that took the lease last before (as returned by an
    /// acquisition: the previous taker, possibly the same node), or now
    /// (as read). `None` for a task no node has leased yet.
    pub last_node: Option<String>,
}

impl Lease {
    /// Held by a node whose lease has not run out at `now_ms`.
    pub fn live_holder(&self, now_ms: i64) -> Option<&str> {
        match (&self.node, self.expires_ms) {
            (Some(n), Some(e)) if e >= now_ms => Some(n),
            _ => None,
        }
    }
}

impl Lease {
    /// The token `node` holds after taking this lease at `now_ms`: the same
    /// when it holds it live already, the next one when the lease is free
    /// or ran out (also its own: its late writes are then refused), `None`
    /// while another node's is live.
    pub(crate) fn token_for(&self, node: &str, now_ms: i64) -> Option<u64> {
        match self.live_holder(now_ms) {
            Some(holder) if holder == node => Some(self.token),
            Some(_) => None,
            None => Some(self.token + 1),
        }
    }
}

/// A task moving into `state` drops its lease (in the same transaction):
/// it needs no node until it wakes.
pub(crate) fn drops_lease(state: TaskState) -> bool {
    state == TaskState::Suspended || state.is_terminal()
}

/// What a write asks of the lease, beyond the token of its own writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Any node may write (an event in the inbox, a log entry); only a
    /// holder whose token is stale is refused.
    Writer,
    /// Changes what the task is or runs (its state, its sandbox): also
    /// refused to a node without the lease while another node's is live.
    Owner,
}

/// The leases taken through one store handle: task → (node, token).
#[derive(Debug, Default)]
pub(crate) struct Fences {
    held: Mutex<HashMap<TaskId, (String, u64)>>,
}

impl Fences {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, (String, u64)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn hold(&self, task: &TaskId, node: &str, token: u64) {
        self.held().insert(task.clone(), (node.to_owned(), token));
    }

    pub(crate) fn forget(&self, task: &TaskId) {
        self.held().remove(task);
    }

    /// The lease held through this handle on `task`: (node, token).
    pub(crate) fn of_task(&self, task: &TaskId) -> Option<(String, u64)> {
        self.held().get(task).cloned()
    }

    /// The tasks held through this handle by `node`, with their tokens.
    pub(crate) fn of_node(&self, node: &str) -> Vec<(TaskId, u64)> {
        self.held().iter().filter(|(_, (n, _))| n == node).map(|(t, (_, tok))| (t.clone(), *tok)).collect()
    }

    /// After a renewal that did not reach `gone` (task, token held):
    /// forgets them, and returns those another node took since (a newer
    /// token), not those this handle dropped itself by suspending or
    /// ending the task (the token as it was).
    pub(crate) async fn settle_unrenewed(&self, store: &dyn crate::LeaseStore, gone: Vec<(TaskId, u64)>) -> Vec<TaskId> {
        let mut lost = Vec::new();
        for (task, token) in gone {
            self.forget(&task);
            if store.lease(&task).await.map(|l| l.token != token).unwrap_or(true) {
                lost.push(task);
            }
        }
        lost
    }

    /// Checks a write for `task` against its lease as stored (read under
    /// the transaction's lock on the task's row).
    pub(crate) fn check(&self, stored: &Lease, fence: Fence, now_ms: i64) -> Result<()> {
        let held = self.held().get(&stored.task).cloned();
        match held {
            Some((node, token)) => {
                if stored.token == token && (stored.node.is_none() || stored.node.as_deref() == Some(node.as_str())) {
                    // Still ours, or dropped by us with nobody taking it since.
                    return Ok(());
                }
                Err(Error::LeaseLost { task: stored.task.to_string(), node, holder: stored.node.clone() })
            }
            None => match (fence, stored.live_holder(now_ms)) {
                (Fence::Owner, Some(holder)) => Err(Error::Leased { task: stored.task.to_string(), node: holder.to_owned() }),
                _ => Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(task: &TaskId, node: Option<&str>, token: u64, expires_ms: Option<i64>) -> Lease {
        Lease { task: task.clone(), node: node.map(str::to_owned), token, expires_ms, last_node: None }
    }

    #[test]
    fn a_holder_writes_while_its_token_is_the_tasks() {
        let (t, f) = (TaskId::random(), Fences::default());
        f.hold(&t, "a", 3);
        assert!(f.check(&lease(&t, Some("a"), 3, Some(10)), Fence::Owner, 100).is_ok(), "expired but not taken: still ours");
        assert!(f.check(&lease(&t, None, 3, None), Fence::Owner, 0).is_ok(), "dropped by us");
        let lost = f.check(&lease(&t, Some("b"), 4, Some(1_000)), Fence::Writer, 0).unwrap_err();
        assert!(matches!(lost, Error::LeaseLost { .. }), "{lost}");
        assert!(lost.to_string().contains("node a") && lost.to_string().contains("held by b"), "{lost}");
        // Taken by b and dropped again: the token says so.
        assert!(f.check(&lease(&t, None, 4, None), Fence::Writer, 0).is_err());
        f.forget(&t);
        assert!(f.check(&lease(&t, None, 4, None), Fence::Owner, 0).is_ok());
    }

    #[test]
    fn a_task_drops_its_lease_only_when_suspended_or_ended() {
        let dropping: Vec<TaskState> = TaskState::ALL.into_iter().filter(|s| drops_lease(*s)).collect();
        assert_eq!(dropping, [TaskState::Suspended, TaskState::Completed, TaskState::Destroyed]);
    }

    #[test]
    fn a_node_without_the_lease_adds_events_but_does_not_move_the_task() {
        let (t, f) = (TaskId::random(), Fences::default());
        let live = lease(&t, Some("b"), 1, Some(1_000));
        assert!(f.check(&live, Fence::Writer, 0).is_ok());
        let refused = f.check(&live, Fence::Owner, 0).unwrap_err();
        assert!(matches!(refused, Error::Leased { .. }), "{refused}");
        // Once b's lease ran out, anyone may.
        assert!(f.check(&live, Fence::Owner, 2_000).is_ok());
    }
}
