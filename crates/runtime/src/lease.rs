//! Leases, the runtime's side: this node builds a sandbox for a task only
//! while it holds the task's lease in the store (create, wake, recovery,
//! fork), renews its leases with each heartbeat, and takes over the tasks
//! no live node holds: `waking` ones (an event came for a suspended task
//! and the node that took it in had no room) and running ones whose node
//! stopped renewing (node loss), recovered from their latest snapshot.
//!
//! The store fences every write with the lease its handle took, so a node
//! that stalled past its expiry cannot write for the task any more; when
//! its heartbeat finds the lease gone it removes its sandbox of the task
//! without a word to the store.

use std::sync::Arc;

use cairn_core::{EventKind, NewEvent, SandboxState, TaskId, TaskState};
use cairn_store::now_ms;
use serde_json::json;

use crate::runtime::Runtime;
use crate::{reaper, Error};

impl Runtime {
    /// Takes (or keeps) the lease of `task` for this node; false when a live
    /// node holds it. When another node ran the task since this one did,
    /// the copy of its disk kept here is stale and goes.
    pub(crate) async fn take_lease(&self, task: &TaskId) -> Result<bool, Error> {
        let Some(lease) = self.store.acquire_lease(task, &self.cluster.name, self.cluster.lease_ms()).await? else {
            return Ok(false);
        };
        let ran_elsewhere = lease.last_node.as_deref().is_some_and(|n| n != self.cluster.name);
        if ran_elsewhere && self.live(task).is_none() && self.driver.has_disk(task.as_str()).await? {
            self.driver.discard_disk(task.as_str()).await?;
            tracing::info!(task = %task, "dropped the local disk: node {} ran the task since", lease.last_node.unwrap_or_default());
        }
        Ok(true)
    }

    /// True while this node runs fewer sandboxes than its capacity.
    pub(crate) fn has_room(&self) -> bool {
        let live = self.cells.all().into_iter().filter(|(_, c)| c.live().is_some()).count();
        self.cluster.capacity.is_none_or(|c| live < c)
    }

    /// True when this node has the task's image (images are per node: a
    /// task on an image pulled elsewhere only runs where it was pulled).
    pub(crate) async fn can_run(&self, image: &str) -> bool {
        self.image(image).await.is_ok()
    }

    /// The heartbeat's lease work: renew, let go of what was lost, take
    /// over what no live node holds.
    pub(crate) async fn tend_leases(self: &Arc<Self>) {
        match self.store.renew_leases(&self.cluster.name, self.cluster.lease_ms()).await {
            Ok(lost) => {
                for task in lost {
                    self.drop_lost(&task).await;
                }
            }
            Err(e) => tracing::warn!(node = %self.cluster.name, "renewing leases: {e}"),
        }
        if self.store.shared() {
            if let Err(e) = self.store.renew_blob_locks(&self.cluster.name, crate::blob_hold::HOLD_TTL.as_millis() as i64).await {
                tracing::warn!(node = %self.cluster.name, "renewing blob store holds: {e}");
            }
        }
        if self.store.shared() {
            self.cells.tick_watched();
            if let Err(e) = self.sweep_leftovers().await {
                tracing::warn!("removing what this node kept of tasks run elsewhere: {e}");
            }
        }
        let unheld = match self.store.unheld_tasks(now_ms()).await {
            Ok(u) => u,
            Err(e) => return tracing::warn!("listing tasks without a node: {e}"),
        };
        for u in unheld {
            if !self.has_room() {
                break;
            }
            match u.state {
                TaskState::Waking => self.schedule_wake(u.task, "a node with room took it".into(), None),
                _ if self.live(&u.task).is_some() => {
                    // Our own lease ran out (the store was unreachable for a while).
                    if let Err(e) = self.take_lease(&u.task).await {
                        tracing::warn!(task = %u.task, "taking back the lease: {e}");
                    }
                }
                _ => {
                    let rt = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = rt.recover_from_lost_node(&u.task, u.last_node.as_deref()).await {
                            tracing::error!(task = %u.task, "recovery after node loss: {e}");
                        }
                    });
                }
            }
        }
    }

    /// On a shared store, what this home keeps of tasks that other nodes
    /// ran since: a destroyed task's leftovers go (the node that destroyed
    /// it could not reach them), and the local disk of a task another
    /// node ran last is stale and goes too. A task being worked on here,
    /// or that this store does not know (a helper started ahead), is left
    /// alone.
    pub(crate) async fn sweep_leftovers(&self) -> Result<(), Error> {
        let names = self.driver.leftovers().await?;
        for name in names {
            let Ok(id) = name.parse::<TaskId>() else { continue };
            if self.live(&id).is_some() || !self.driver.has_local_state(&name).await? {
                continue;
            }
            let cell = self.lock_of(&id);
            let Some(_guard) = cell.try_lock() else { continue };
            let task = match self.store.find_task(id.as_str()).await {
                Ok(t) => t,
                Err(cairn_store::Error::UnknownTask(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            if task.state.is_terminal() {
                self.driver.destroy(&name, None).await??;
                self.cells.remove(&id);
                tracing::info!(task = %id, "removed what this node kept of a task ended elsewhere");
            } else if self.store.lease(&id).await?.last_node.is_some_and(|n| n != self.cluster.name) && self.driver.has_disk(&name).await? {
                self.driver.discard_disk(&name).await?;
                tracing::info!(task = %id, "dropped the local disk: another node ran the task since");
            }
        }
        Ok(())
    }

    /// Another node took a task this node still runs (this one stalled past
    /// its lease): its sandbox here goes, without a write to the store.
    async fn drop_lost(&self, task: &TaskId) {
        let lock = self.lock_of(task);
        let _guard = lock.lock().await;
        let Some(live) = self.live(task) else { return };
        tracing::warn!(task = %task, "another node took the task's lease: removing its sandbox here");
        let init = live.init;
        if let Ok(Err(e)) = self.driver.destroy(task.as_str(), Some(init)).await {
            tracing::warn!(task = %task, "removing the sandbox of a lost lease: {e}");
        }
        reaper::reap(init.pid);
        self.set_live(task, None);
        if let Ok(Some(row)) = self.store.sandbox(task).await {
            self.driver.release_slot(row.uid_slot, task.as_str()).await;
        }
    }

    /// Recovers a running task whose node stopped renewing its lease: takes
    /// the lease, records the sandbox there as lost, and restores the task
    /// here from its head snapshot, with a recovery note naming the node.
    pub(crate) async fn recover_from_lost_node(&self, id: &TaskId, last: Option<&str>) -> Result<(), Error> {
        {
            let lock = self.lock_of(id);
            let _guard = lock.lock().await;
            let task = self.find(id.as_str()).await?;
            if !matches!(task.state, TaskState::Running | TaskState::Suspending) || self.live(id).is_some() {
                return Ok(());
            }
            if !self.can_run(&task.config.image).await || !self.take_lease(id).await? {
                return Ok(());
            }
            fail::fail_point!("takeover.leased");
            let why = match last {
                Some(n) if n != self.cluster.name => format!("node {n} stopped renewing its lease"),
                _ => "the task's node was gone when its lease ran out".to_owned(),
            };
            tracing::warn!(task = %id, "{why}: recovering it on node {}", self.cluster.name);
            // The sandbox row was the lost node's: its uid slot is not this host's.
            self.store.release_sandbox(id).await?;
            self.store.set_sandbox_state(id, SandboxState::Lost, Some(&why)).await?;
            self.store
                .append_event(&NewEvent {
                    task: id.clone(),
                    kind: EventKind::SandboxLost,
                    actor: "daemon".into(),
                    args: json!({ "reason": why, "node": last, "step": task.step }),
                    exit_code: None,
                    duration_ms: None,
                })
                .await?;
        }
        self.recover(id).await
    }
}
