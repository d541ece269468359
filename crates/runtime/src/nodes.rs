//! This daemon as a node of the cluster sharing its store: it registers at
//! start (name, API URL, version), heartbeats every fifth of its lease
//! (`[node] lease`, 10 s: every 2 s) from a background task, and answers
//! `GET /v1/nodes` from the registry. A node is up while its latest
//! heartbeat is younger than three periods, by the clock of the node that
//! answers.
//!
//! Each heartbeat also tends this node's task leases (`lease.rs`): renews
//! them, and takes over the tasks no live node holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_api::nodes::{Node, NodeState};
use cairn_store::{now_ms, NodeRow, SharedStore};

use crate::runtime::Runtime;
use crate::Error;

/// The node name a daemon takes without `--node` or `[node] name`: the host
/// name (or `localhost` when it has none that is valid).
pub fn default_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .and_then(|h| crate::config::parse_node_name(&h).ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The engine's cluster part: this daemon as a node of the store's
/// cluster (its name, when it started, how many sandboxes it runs at
/// most) and what the node registry says of the others. Leases, the
/// tasks a node holds, are tended in `lease.rs`, where they meet the
/// driver.
#[derive(Debug)]
pub(crate) struct Cluster {
    store: SharedStore,
    pub(crate) name: String,
    pub(crate) started_ms: i64,
    /// The most sandboxes this node runs (`None`: no limit of its own).
    pub(crate) capacity: Option<usize>,
    /// How long a task's lease lasts without a renewal.
    pub(crate) lease: Duration,
}

impl Cluster {
    pub(crate) fn new(store: SharedStore, name: String, capacity: Option<usize>, lease: Duration) -> Cluster {
        Cluster { store, name, started_ms: now_ms(), capacity, lease }
    }

    /// How often this node heartbeats and renews its leases: five times a
    /// lease, so a renewal survives a few slow heartbeats.
    pub(crate) fn heartbeat_every(&self) -> Duration {
        self.lease / 5
    }

    /// How old a heartbeat may be for its node to be up: three periods.
    pub(crate) fn down_after(&self) -> Duration {
        self.heartbeat_every() * 3
    }

    /// The lease in milliseconds, as the store takes it.
    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// True when other daemons may share the store (a cluster).
    pub(crate) fn is_shared(&self) -> bool {
        self.store.shared()
    }

    /// This node's row as it announces it, reachable at `url`.
    fn row(&self, url: String) -> NodeRow {
        NodeRow { name: self.name.clone(), url, started_ms: self.started_ms, heartbeat_ms: now_ms(), version: env!("CARGO_PKG_VERSION").to_owned() }
    }

    pub(crate) async fn register(&self, url: String) -> Result<(), Error> {
        Ok(self.store.register_node(&self.row(url)).await?)
    }

    pub(crate) async fn heartbeat(&self, url: String) -> Result<(), Error> {
        Ok(self.store.heartbeat_node(&self.row(url), now_ms()).await?)
    }

    /// The API URL of the node running the task (`id_or_name`) when that
    /// is another node that is up: requests for the task are forwarded
    /// there. `None` for a task this node runs, no node runs, that does not
    /// exist, or on a store no other daemon shares.
    pub(crate) async fn runs_elsewhere(&self, id_or_name: &str) -> Result<Option<String>, Error> {
        if !self.store.shared() {
            return Ok(None);
        }
        let task = match self.store.find_task(id_or_name).await {
            Ok(t) => t,
            Err(cairn_store::Error::UnknownTask(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let now = now_ms();
        let lease = self.store.lease(&task.id).await?;
        let Some(holder) = lease.live_holder(now).filter(|h| *h != self.name) else { return Ok(None) };
        let up_after = now - self.down_after().as_millis() as i64;
        let node = self.store.list_nodes().await?.into_iter().find(|n| n.name == holder && n.heartbeat_ms > up_after);
        match node {
            Some(n) => Ok(Some(n.url)),
            None => Err(Error::Unavailable(format!(
                "task {} runs on node {holder}, which is not answering; it is recovered elsewhere once its lease runs out (within {} s)",
                task.id,
                self.lease.as_secs()
            ))),
        }
    }

    /// Every node of the store, with its state, load and tasks.
    pub(crate) async fn nodes(&self) -> Result<Vec<Node>, Error> {
        let rows = self.store.list_nodes().await?;
        let mut tasks: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, task) in self.store.node_tasks().await? {
            tasks.entry(node).or_default().push(task.to_string());
        }
        let now = now_ms();
        Ok(rows
            .into_iter()
            .map(|r| {
                let age = (now - r.heartbeat_ms).max(0);
                let state = if age < self.down_after().as_millis() as i64 { NodeState::Up } else { NodeState::Down };
                let tasks = tasks.remove(&r.name).unwrap_or_default();
                Node {
                    name: r.name,
                    url: r.url,
                    state,
                    heartbeat_age_ms: age,
                    started_ms: r.started_ms,
                    version: r.version,
                    load: tasks.len(),
                    tasks,
                }
            })
            .collect())
    }
}

impl Runtime {
    /// This daemon's node name.
    pub fn node_name(&self) -> &str {
        &self.cluster.name
    }

    /// Registers this node (once the API's URL is known) and starts its
    /// heartbeats. A registration that fails is logged: the heartbeat
    /// registers it again.
    pub(crate) async fn join_cluster(self: &Arc<Self>) {
        if let Err(e) = self.cluster.register(self.base_url()).await {
            tracing::error!(node = %self.cluster.name, "cannot register the node: {e}");
        }
        if let Err(e) = self.publish_keys().await {
            tracing::error!(node = %self.cluster.name, "cannot publish the node's public keys: {e}");
        }
        let rt = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(rt.cluster.heartbeat_every());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = rt.stopping.cancelled() => return,
                }
                if let Err(e) = rt.cluster.heartbeat(rt.base_url()).await {
                    tracing::warn!(node = %rt.cluster.name, "heartbeat: {e}");
                }
                rt.tend_leases().await;
            }
        });
    }

    /// True when other daemons may share this one's store (a cluster).
    pub fn is_clustered(&self) -> bool {
        self.cluster.is_shared()
    }

    /// See [`Cluster::runs_elsewhere`].
    pub async fn runs_elsewhere(&self, id_or_name: &str) -> Result<Option<String>, Error> {
        self.cluster.runs_elsewhere(id_or_name).await
    }

    /// Every node of the store, with its state, load and tasks.
    pub async fn nodes(&self) -> Result<Vec<Node>, Error> {
        self.cluster.nodes().await
    }
}
