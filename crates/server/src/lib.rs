//! Cairn's daemon: the HTTP front end of the runtime (`cairn-runtime`).
//!
//! - [`routes`]: the router, authentication, one file per group of routes;
//!   each handler parses, calls one runtime method and maps the result.
//! - [`ApiError`]: the one mapping of the runtime's error kinds to HTTP
//!   statuses and the stable codes of the error body.
//! - [`gateway`]: the approval page people see.
//!
//! [`Daemon::start`] runs everything on the caller's tokio runtime, so the
//! same code serves `cairn serve` and the embedded daemon of `cairn demo`.

mod forward;
mod port_pool;
mod ports;
mod error;
pub mod gateway;
pub mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use cairn_runtime::{Config, Home};
pub use error::ApiError;
use cairn_runtime::Runtime;
use tokio::sync::oneshot;

/// Errors that stop the daemon from starting.
///
/// Wrapped errors are `transparent`: their message is this one, and the
/// error chain (`{:#}`, as the CLI prints it) names it once.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Home(#[from] cairn_runtime::home::HomeError),
    #[error(transparent)]
    Runtime(#[from] cairn_runtime::OpenError),
    #[error("cannot listen on {0}: {1}{hint}", hint = listen_hint(.1))]
    Listen(SocketAddr, std::io::Error),
    /// The secrets the nodes of a shared store have in common could not be
    /// read or adopted.
    #[error("cannot join the cluster's secrets: {0}")]
    Cluster(String),
}

/// What to do about an address that is taken: every daemon listens on
/// 127.0.0.1:7878 unless told otherwise, so a second one meets this first.
fn listen_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another daemon (or another program) listens there: pass --listen ADDR (e.g. --listen 127.0.0.1:0 for a free port, \
             or `listen` in the config file), or stop the other daemon"
        }
        _ => "",
    }
}

/// A daemon serving, but for its lock.
#[derive(Debug)]
struct Serving {
    url: String,
    token: String,
    addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
    runtime: Arc<Runtime>,
}

/// What a start found missing in the home and created: a failed start
/// removes it again, so that it leaves the home as it was.
#[derive(Debug)]
struct Created {
    dir: Option<PathBuf>,
    files: Vec<PathBuf>,
}

impl Created {
    fn before(home: &Home) -> Created {
        let root = home.root();
        let dir = (!root.exists()).then(|| root.to_owned());
        let files = [root.join("daemon.lock"), home.token_path(), home.url_path()].into_iter().filter(|p| !p.exists()).collect();
        Created { dir, files }
    }

    /// Removes the files, then the directory if nothing else is in it (a
    /// runtime that got further, e.g. created its database, keeps its data
    /// for a look).
    fn undo(&self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir(d);
        }
    }
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
    runtime: Arc<Runtime>,
    _lock: cairn_runtime::home::HomeLock,
}

impl Daemon {
    /// Opens the home, reconciles every task with what is left on the host,
    /// binds the listener and starts serving in the background.
    /// A start that fails removes what it created in the home (the lock
    /// file, the token, the directory itself when it was new).
    pub async fn start(opts: DaemonOptions) -> Result<Daemon, StartError> {
        cairn_runtime::arm_crash_points_from_env();
        let home = Home::new(opts.home.clone());
        let created = Created::before(&home);
        let lock = match home.lock() {
            Ok(l) => l,
            Err(e) => {
                // Never another daemon's lock: only what this start created.
                created.undo();
                return Err(e.into());
            }
        };
        match Self::serve(&home, &opts).await {
            Ok(Serving { url, token, addr, shutdown, served, runtime }) => {
                Ok(Daemon { url, token, addr, shutdown: Some(shutdown), served, runtime, _lock: lock })
            }
            Err(e) => {
                // Still holding the lock: no other daemon starts meanwhile.
                created.undo();
                drop(lock);
                Err(e)
            }
        }
    }

    /// [`Daemon::start`] once the home is locked.
    async fn serve(home: &Home, opts: &DaemonOptions) -> Result<Serving, StartError> {
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
        let runtime = Arc::new(Runtime::open(home, &opts.config, opts.helper_exe.clone(), addr).await?);
        // Again, now that the store and the keys have made their files.
        home.make_private()?;
        let token = runtime.cluster_token(home, token).await.map_err(|e| StartError::Cluster(e.to_string()))?;
        let url = opts.config.node_url.clone().unwrap_or_else(|| format!("http://{addr}"));
        runtime.bring_up(url.clone()).await;
        home.write_url(&url)?;
        tracing::info!(%url, home = %home.root().display(), store = %runtime.store_location(), "cairn daemon listening");
        let b = runtime.bounds();
        tracing::info!(
            "at once at most {} commands ({} per task) and {} event streams ({} per task); descriptor limit {}, {} of them kept in reserve",
            b.execs_total,
            b.execs_per_task,
            b.streams_total,
            b.streams_per_task,
            b.nofile,
            b.reserve
        );
        let app = routes::router(runtime.clone(), token.clone());
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
        Ok(Serving { url, token, addr, shutdown: tx, served, runtime })
    }

    /// Stops serving. Sandboxes keep running: they belong to their tasks,
    /// not to this process.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.served).await;
        self.runtime.shutdown().await;
    }

    /// Serves until the process is told to stop (SIGINT or SIGTERM).
    pub async fn run_until_signal(self) {
        self.run_until_signal_then(|| {}).await;
    }

    /// [`Self::run_until_signal`], calling `stopping` once told to stop,
    /// before the daemon stops (a service manager is told so).
    pub async fn run_until_signal_then(self, stopping: impl FnOnce()) {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("stopping");
        stopping();
        self.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message and its sources, as an error chain prints them (`{:#}`).
    fn chain(e: &dyn std::error::Error) -> String {
        let mut parts = vec![e.to_string()];
        let mut cur = e.source();
        while let Some(s) = cur {
            parts.push(s.to_string());
            cur = s.source();
        }
        parts.join(": ")
    }

    #[test]
    fn start_errors_name_their_cause_once() {
        let locked = cairn_runtime::home::HomeError::Locked { home: "/h".into(), pid: "42".into() };
        let line = locked.to_string();
        let e = StartError::from(locked);
        assert_eq!(chain(&e), line);
        let e = StartError::from(cairn_runtime::OpenError::Config("bad".into()));
        assert_eq!(chain(&e), "config: bad");
        let blob = cairn_blob::Error::UnknownChunk("c1".into());
        let e = StartError::from(cairn_runtime::OpenError::from(blob));
        assert_eq!(chain(&e), "blob store: chunk c1 is not in the index");
    }

    #[tokio::test]
    async fn a_start_on_a_taken_address_says_what_to_do_and_leaves_nothing() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let d = tempfile::tempdir().unwrap();
        let existing = d.path().join("existing");
        std::fs::create_dir(&existing).unwrap();
        std::fs::write(existing.join("keep"), "x").unwrap();
        for home in [d.path().join("new"), existing.clone()] {
            let config = Config { listen: addr, ..Config::default() };
            let opts = DaemonOptions { home: home.clone(), config, helper_exe: "/bin/false".into() };
            let err = Daemon::start(opts).await.unwrap_err().to_string();
            assert!(err.contains(&addr.to_string()) && err.contains("--listen ADDR") && !err.contains('\n'), "{err}");
            for left in ["daemon.lock", "token", "url"] {
                assert!(!home.join(left).exists(), "{left} left behind in {}", home.display());
            }
        }
        assert!(!d.path().join("new").exists(), "a home the start created goes too");
        assert!(existing.join("keep").exists(), "what was there stays");
    }
}
