//! The [`Runtime`]: the engine's state (store, driver, blob store, keys,
//! one cell per task) and what every operation shares: finding a task, its
//! cell and lock, its live sandbox, its view; opening, bringing up and
//! shutting down.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_core::{Bytes, EventKind, Limits, NewEvent, Task, TaskId};
use cairn_sandbox::{IdRange, InitProcess, NativeDriver, SandboxDriver};
use cairn_image::ImageStore;
use cairn_store::{SharedStore, SqliteStore};

use crate::{Error, OpenError, reaper};
use crate::config::Config;
use crate::home::Home;

/// A live sandbox as the daemon knows it.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    pub init: InitProcess,
    pub ids: IdRange,
}

pub use cairn_api::tasks::{CreateRequest, LimitsView, TaskView};

/// A duration a user typed that must be positive, in milliseconds.
pub(crate) fn parse_positive_ms(what: &str, s: &str) -> Result<u64, Error> {
    let d = cairn_core::parse_duration(s).map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    if d.is_zero() {
        return Err(Error::invalid(format!("{what} must be longer than zero, not {s:?}")));
    }
    Ok(d.as_millis() as u64)
}

/// Limits as a user reads them.
pub fn limits_view(l: &Limits) -> LimitsView {
    LimitsView { memory: Bytes(l.memory_bytes).to_string(), cpus: l.cpus_display(), pids: l.pids, disk: Bytes(l.disk_bytes).to_string() }
}

#[derive(Debug)]
pub struct Runtime {
    /// `$CAIRN_HOME` (the store may be elsewhere: `--store`).
    pub(crate) home: PathBuf,
    pub(crate) store: SharedStore,
    /// Images, their pulls and the fork bases' lock.
    pub(crate) images: crate::images::Images,
    pub(crate) driver: crate::driver::Driver,
    pub(crate) snaps: crate::snapshot::Snapshots,
    /// Signs approval links.
    pub(crate) link_key: crate::gateway::approval::LinkKey,
    /// The key secrets are sealed under, or why this daemon has none.
    pub(crate) secrets: crate::secrets::Secrets,
    /// The node's ledger signing keys (`$CAIRN_HOME/keys/`).
    pub(crate) keys: std::sync::Mutex<cairn_ledger::NodeKeys>,
    /// The daemon's base URL (for webhook and approval links), once bound.
    pub(crate) base_url: std::sync::OnceLock<String>,
    /// What is kept in memory per task (lock, live sandbox, busy count,
    /// progress, baseline, egress proxy).
    pub(crate) cells: Arc<crate::cell::Cells>,
    /// What a new task gets where its request says nothing.
    pub(crate) task_defaults: crate::defaults::TaskDefaults,
    pub(crate) egress: crate::egress::Egress,
    /// Wakes of `waking` tasks, deduplicated, a bounded number at a time.
    pub(crate) wakes: Arc<crate::wakes::WakeScheduler>,
    /// What `/metrics` reports.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Wakes the timer loop when a timer wait is added.
    pub(crate) timer_added: tokio::sync::Notify,
    /// This daemon as a node of the store's cluster.
    pub(crate) cluster: crate::nodes::Cluster,
    /// Outgoing notifications: their HTTP client and settings.
    pub(crate) notifier: crate::notify::Notifier,
    /// Commands and event streams held open, against `[limits]`.
    pub(crate) admission: crate::admission::Admission,
    /// Commands running in the background, with handles.
    pub(crate) processes: crate::processes::Processes,
    pub(crate) watchers: crate::watchers::Watchers,
    /// Cancelled by [`Runtime::shutdown`]: the background loops end.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
}

/// Marks a task busy while a command runs (the exec records its end as
/// activity before the guard drops).
#[derive(Debug)]
pub(crate) struct BusyGuard {
    cell: Arc<crate::cell::TaskCell>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.cell.add_busy(-1);
    }
}

impl Runtime {
    /// Opens the runtime of `home` on the native driver (`helper` is the
    /// executable run as the sandbox helper). `own` is the daemon's API
    /// address, which sandboxes must never reach.
    pub async fn open(home: &Home, config: &Config, helper: PathBuf, own: std::net::SocketAddr) -> Result<Runtime, OpenError> {
        let images = ImageStore::new(home.images()).with_limits(config.image_limits);
        let root = home.root().to_owned();
        let (defaults, pool, disk_space) = (config.defaults, config.disk_pool, config.disk_space);
        let driver = tokio::task::spawn_blocking(move || -> Result<NativeDriver, cairn_sandbox::Error> {
            images.cleanup()?;
            images.ensure_host()?;
            NativeDriver::new(&root, helper, defaults, pool, disk_space)
        })
        .await
        .map_err(|e| OpenError::Sandbox(cairn_sandbox::Error::Helper(e.to_string())))??;
        Self::with_driver(home, config, Arc::new(driver), own).await
    }

    /// Opens the runtime of `home` over any sandbox driver (the fake one in
    /// the runtime's own tests). Images other than the ones in `home` are
    /// the caller's to import.
    pub async fn with_driver(home: &Home, config: &Config, driver: Arc<dyn SandboxDriver>, own: std::net::SocketAddr) -> Result<Runtime, OpenError> {
        let store: SharedStore = match &config.store {
            Some(url) => url.open().await?,
            None => Arc::new(SqliteStore::open(&home.db()).await?),
        };
        let images = ImageStore::new(home.images()).with_limits(config.image_limits);
        let url = config.blob.url.clone().unwrap_or_else(|| cairn_blob::BlobUrl::Local(home.blobs()));
        let (cache, cache_size) = (home.blob_cache(), config.blob.cache_size);
        let repo = tokio::task::spawn_blocking(move || -> Result<_, cairn_blob::Error> {
            let backend = url.open(&cache, cache_size)?;
            if url.is_remote() {
                let cache = if cache_size == 0 { "none".to_string() } else { format!("{} (up to {cache_size} bytes)", cache.display()) };
                tracing::info!(blob = %url, %cache, "blob store on remote storage");
            }
            cairn_blob::Repository::open(backend)
        })
        .await
        .map_err(|e| OpenError::Sandbox(cairn_sandbox::Error::Helper(e.to_string())))??;
        let risk = cairn_core::RiskPolicy::new(config.risky_patterns.iter().map(String::as_str))
            .map_err(|e| OpenError::Config(e.to_string()))?;
        let key_path = home.root().join("approval.key");
        let mut link_key = crate::gateway::approval::LinkKey::load_or_create(&key_path).map_err(|e| OpenError::Config(e.to_string()))?;
        if store.shared() {
            // Every node signs and checks approval links with one key: a
            // link made on one node is answered on any.
            let own = link_key.to_hex();
            let shared = store.cluster_secret("approval-key", &own).await?;
            if shared != own {
                link_key = crate::gateway::approval::LinkKey::adopt_hex(&key_path, &shared).map_err(|e| OpenError::Config(e.to_string()))?;
            }
        }
        let secrets = crate::secrets::open(home.root(), store.as_ref(), config.secrets_cluster_key.as_deref()).await.map_err(OpenError::Config)?;
        let keys = cairn_ledger::NodeKeys::load_or_create(&home.root().join("keys"))?;
        let bounds = crate::admission::resolve(&config.limits, crate::admission::nofile()).map_err(OpenError::Config)?;
        // Subscribed before anything writes: waiters see every change.
        let cells = Arc::new(crate::cell::Cells::default());
        cells.follow(store.as_ref());
        let cluster = crate::nodes::Cluster::new(store.clone(), config.node.clone().unwrap_or_else(crate::nodes::default_node_name), config.capacity, config.lease);
        Ok(Runtime {
            home: home.root().to_owned(),
            store,
            images: crate::images::Images::new(images),
            driver: crate::driver::Driver::new(driver),
            snaps: crate::snapshot::Snapshots::new(repo, risk, config.gc_grace),
            link_key,
            secrets,
            keys: std::sync::Mutex::new(keys),
            base_url: std::sync::OnceLock::new(),
            cells,
            wakes: Arc::new(crate::wakes::WakeScheduler::new(crate::wakes::MAX_CONCURRENT_WAKES)),
            metrics: Arc::default(),
            task_defaults: crate::defaults::TaskDefaults::new(config),
            egress: crate::egress::Egress::new(&config.egress, own),
            timer_added: tokio::sync::Notify::new(),
            admission: crate::admission::Admission::new(bounds),
            processes: Default::default(),
            watchers: Default::default(),
            cluster,
            notifier: crate::notify::Notifier::new(&config.hooks).map_err(OpenError::Config)?,
            stopping: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// The API token every node of a shared store accepts: this home's own
    /// when it is the first node (or the store is not shared), else the
    /// first node's, which then replaces the one in this home (the CLI
    /// reads it there).
    pub async fn cluster_token(&self, home: &Home, own: String) -> Result<String, Error> {
        if !self.store.shared() {
            return Ok(own);
        }
        let shared = self.store.cluster_secret("api-token", &own).await?;
        if shared != own {
            crate::home::write_atomic(&home.token_path(), shared.as_bytes(), 0o600).map_err(|e| Error::internal(e.to_string()))?;
            tracing::info!("this node uses the cluster's API token (written to {})", home.token_path().display());
        }
        Ok(shared)
    }

    /// The bounds on commands and event streams in force (`[limits]`).
    pub fn bounds(&self) -> crate::admission::Bounds {
        self.admission.bounds()
    }

    /// The task database's URL, without its password.
    pub fn store_location(&self) -> String {
        self.store.location()
    }

    pub fn base_url(&self) -> String {
        self.base_url.get().cloned().unwrap_or_default()
    }

    /// True while a command of the task runs.
    pub(crate) fn busy(&self, id: &TaskId) -> bool {
        self.cells.get(id).is_some_and(|c| c.busy())
    }

    /// Counts a running command until the guard drops.
    pub(crate) fn mark_busy(&self, id: &TaskId) -> BusyGuard {
        let cell = self.cells.of(id);
        cell.add_busy(1);
        BusyGuard { cell }
    }

    /// The task's cell; its `lock()` serialises the task's lifecycle steps.
    pub(crate) fn lock_of(&self, id: &TaskId) -> Arc<crate::cell::TaskCell> {
        self.cells.of(id)
    }

    pub fn live(&self, id: &TaskId) -> Option<Live> {
        self.cells.get(id).and_then(|c| c.live())
    }

    /// Records the task's live sandbox; with `None`, also stops its proxy.
    /// (A new sandbox gets its proxy from [`Runtime::serve_egress`].)
    pub(crate) fn set_live(&self, id: &TaskId, live: Option<Live>) {
        let cell = match live {
            Some(_) => self.cells.of(id),
            None => match self.cells.get(id) {
                Some(c) => c,
                None => return,
            },
        };
        if let Some(proxy) = cell.set_live(live) {
            tokio::spawn(proxy.stop());
        }
    }

    /// Serves the egress proxy of the task's live sandbox (once per sandbox).
    pub(crate) async fn serve_egress(&self, task: &Task, live: Live) {
        let cell = self.cells.of(&task.id);
        if cell.with_proxy(|p| p.init == live.init) == Some(true) {
            return;
        }
        let interception = if task.config.egress.intercepts() { self.interception(&task.id, &task.config.egress).await } else { None };
        if let Some(proxy) = self.egress.start_proxy(&self.store, &self.metrics, &self.driver, &task.id, &task.config.egress, live.init, interception).await {
            // The proxy of a sandbox this one replaced (a rollback) stops here.
            if let Some(old) = cell.set_proxy(proxy) {
                tokio::spawn(old.stop());
            }
        }
    }

    pub fn view(&self, task: Task) -> TaskView {
        let live = self.live(&task.id);
        TaskView {
            limits: limits_view(&task.config.limits),
            sandbox_pid: live.map(|l| l.init.pid),
            sandbox_uid_base: live.map(|l| l.ids.host_base),
            pending_wait: None,
            task,
        }
    }

    /// [`Runtime::view`] with the task's pending wait, for the answers
    /// about one task.
    pub async fn view_with_wait(&self, task: Task) -> Result<TaskView, Error> {
        let pending = match self.store.pending_wait(&task.id).await? {
            Some(w) => Some(self.wait_view(w).await?),
            None => None,
        };
        Ok(TaskView { pending_wait: pending, ..self.view(task) })
    }

    pub async fn find(&self, id_or_name: &str) -> Result<Task, Error> {
        Ok(self.store.find_task(id_or_name).await?)
    }

    /// Brings the runtime up once the API's base URL is known: reconciles
    /// every task with what is left on the host, then starts the background
    /// work (helpers ahead, recovery and wakes, timers, idle suspends).
    pub async fn bring_up(self: &Arc<Self>, base_url: String) {
        reaper::become_subreaper();
        self.reconcile().await;
        // A fork cut short by a crash may have left its base unused.
        if let Err(e) = self.remove_unused_fork_bases().await {
            tracing::warn!("cannot remove the fork bases no task uses: {e}");
        }
        self.clone().spawn_background();
        let _ = self.base_url.set(base_url);
        self.join_cluster().await;
        self.spawn_wakes();
        // Wake, recover, fire timers: after the URL is known (links).
        self.recover_all().await;
        self.clone().spawn_timers();
        self.clone().spawn_idle_suspender();
        self.clone().spawn_deadline_keeper();
        self.clone().spawn_notifier();
    }

    /// Stops the background loops, the proxies and the helpers started
    /// ahead. Sandboxes keep running: they belong to their tasks, not to
    /// this process.
    pub async fn shutdown(&self) {
        self.stopping.cancel();
        for (_, cell) in self.cells.all() {
            if let Some(proxy) = cell.take_proxy() {
                proxy.stop().await;
            }
        }
        self.driver.close().await;
    }

    /// Waits `d` between two rounds of a background loop; false once the
    /// runtime is stopping (the loop ends: no work after a shutdown).
    pub(crate) async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => !self.stopping.is_cancelled(),
            _ = self.stopping.cancelled() => false,
        }
    }

    /// Appends an event; a failure to log is reported, not returned (the
    /// step it records has happened either way).
    pub(crate) async fn log(&self, task: &TaskId, kind: EventKind, actor: &str, args: serde_json::Value, exit_code: Option<i32>, duration_ms: Option<u64>) {
        let ev = NewEvent { task: task.clone(), kind, actor: actor.to_owned(), args, exit_code, duration_ms };
        if let Err(e) = self.store.append_event(&ev).await {
            tracing::error!(task = %task, "cannot log {kind}: {e}");
        }
    }
}
