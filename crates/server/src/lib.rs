//! Cairn's daemon: the HTTP API under `/v1`, the per-task scheduler that
//! drives sandboxes through the store, and start-up reconciliation.
//!
//! - [`home`]: the data directory (`$CAIRN_HOME`): token, url, lock file.
//! - [`config`]: the TOML config file and its defaults.
//! - [`tasks`]: task lifecycle (create, start, destroy, reconcile).
//! - [`exec`]: commands over a WebSocket, streamed as they run.
//! - [`snapshots`]: snapshots, rollback in place, forks, retention, check, gc.
//! - [`egress`]: each live sandbox's allowlist proxy and its decision log.
//! - [`deliver`]: deliverables into the blob store, signed delivery records, completion.
//! - [`ledger`]: each task's hash-chained log, signed checkpoints, the
//!   node's signing keys.
//! - [`api`]: routes, authentication, errors as JSON.
//!
//! [`Daemon::start`] runs everything on the caller's tokio runtime, so the
//! same code serves `cairn serve` and the embedded daemon of `cairn demo`.

pub mod api;
pub mod config;
#[cfg(feature = "failpoints")]
mod crash_points;
pub mod deliver;
pub mod egress;
mod error;
pub mod exec;
mod files;
pub mod gateway;
pub mod home;
pub mod ledger;
mod reaper;
mod services;
pub mod snapshots;
mod suspend;
pub mod waits;
pub mod tasks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use config::Config;
pub use error::ApiError;
pub use home::Home;
use tokio::sync::oneshot;

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Home(#[from] home::HomeError),
    #[error("{0}")]
    Store(#[from] cairn_store::Error),
    #[error("{0}")]
    Sandbox(#[from] cairn_sandbox::Error),
    #[error("blob store: {0}")]
    Blob(#[from] cairn_blob::Error),
    #[error("signing keys: {0}")]
    Keys(#[from] cairn_ledger::Error),
    #[error("config: {0}")]
    Config(String),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// How to start a daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub home: PathBuf,
    pub config: Config,
    /// The `cairn` executable, run as the sandbox helper.
    pub helper_exe: PathBuf,
}

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    pub url: String,
    pub token: String,
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    tasks: Arc<tasks::Tasks>,
    _lock: home::HomeLock,
}

impl Daemon {
    /// Opens the home, reconciles every task with what is left on the host,
    /// binds the listener and starts serving in the background.
    pub async fn start(opts: DaemonOptions) -> Result<Daemon, StartError> {
        #[cfg(feature = "failpoints")]
        crash_points::arm_from_env();
        let home = Home::new(opts.home.clone());
        let lock = home.lock()?;
        let token = home.token()?;
        // Bound first: the egress proxies must know the address to refuse.
        // Requests wait in the backlog until serving starts below.
        let listener = tokio::net::TcpListener::bind(opts.config.listen)
            .await
            .map_err(|e| StartError::Listen(opts.config.listen, e))?;
        let addr = listener.local_addr().map_err(|e| StartError::Listen(opts.config.listen, e))?;
        for line in opts.config.egress.exceptions() {
            tracing::warn!("{line}");
        }
        let state = Arc::new(tasks::Tasks::open(&home, &opts.config, opts.helper_exe.clone(), addr).await?);
        reaper::become_subreaper();
        state.reconcile().await;
        state.clone().spawn_background();
        let url = format!("http://{addr}");
        let _ = state.base_url.set(url.clone());
        // Wake, recover, fire timers: after the URL is known (links).
        state.recover_all().await;
        state.clone().spawn_timers();
        state.clone().spawn_idle_suspender();
        home.write_url(&url)?;
        tracing::info!(%url, home = %home.root().display(), "cairn daemon listening");
        let app = api::router(state.clone(), token.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let shutdown = async {
                let _ = rx.await;
            };
            // Small frames (an exec's "started", then its exit) must not wait
            // for the peer's delayed ACK.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY: {e}");
                }
            });
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
                tracing::error!("server stopped: {e}");
            }
        });
        Ok(Daemon { url, token, addr, shutdown: Some(tx), served, tasks: state, _lock: lock })
    }

    /// Stops serving. Sandboxes keep running: they belong to their tasks,
    /// not to this process.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.served).await;
        self.tasks.egress.shutdown().await;
        let driver = self.tasks.driver.clone();
        let _ = tokio::task::spawn_blocking(move || driver.discard_prestarted()).await;
    }

    /// Serves until the process is told to stop (SIGINT or SIGTERM).
    pub async fn run_until_signal(self) {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("stopping");
        self.stop().await;
    }
}
