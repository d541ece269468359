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
    runtime: Arc<Runtime>,
    _lock: cairn_runtime::home::HomeLock,
}

impl Daemon {
    /// Opens the home, reconciles every task with what is left on the host,
    /// binds the listener and starts serving in the background.
    pub async fn start(opts: DaemonOptions) -> Result<Daemon, StartError> {
        cairn_runtime::arm_crash_points_from_env();
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
        let runtime = Arc::new(Runtime::open(&home, &opts.config, opts.helper_exe.clone(), addr).await?);
        let url = format!("http://{addr}");
        runtime.bring_up(url.clone()).await;
        home.write_url(&url)?;
        tracing::info!(%url, home = %home.root().display(), "cairn daemon listening");
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
        Ok(Daemon { url, token, addr, shutdown: Some(tx), served, runtime, _lock: lock })
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
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("stopping");
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
}
