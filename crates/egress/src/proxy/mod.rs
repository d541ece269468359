//! The per-task egress proxy: the one place in this crate that resolves
//! names and opens sockets.
//!
//! A task's sandbox reaches the network only through its [`TaskProxy`],
//! which serves HTTP/1.1 proxy requests on one listening socket:
//!
//! - `CONNECT host:port` opens a tunnel; on port 443 (and on any port when
//!   the client starts with a TLS record) the first bytes must be a TLS
//!   ClientHello whose SNI names the same host;
//! - `GET http://host/...` (absolute form) is forwarded as plain HTTP, each
//!   request on a keep-alive connection decided on its own.
//!
//! For every request the host is normalised, the task's [`Policy`] decides
//! before any lookup, the [`Resolver`] turns the name into addresses, every
//! address in a reserved range (unless allowed by the operator) or belonging
//! to the daemon or this proxy is dropped, and the proxy connects to exactly
//! the address it checked. Every attempt ends as one [`Attempt`] in the
//! task's decision log.
//!
//! Inside: `attempt` (the logged record and the recorder that sends it
//! once), `resolve` (names to addresses, the address checks, connecting),
//! `route` (the steps shared by tunnels and forwarded requests), `conn` (one
//! client connection, the connection limit), `head` (reading the first
//! request head), `respond` (the responses the proxy writes itself),
//! `tunnel` (CONNECT, the SNI check, the two-way relay), `intercept` (a
//! tunnel to a host with request rules, TLS ended by the proxy), `framing`
//! (its HTTP/1.1 requests' framing checked before hyper reads them), `forward` (plain
//! HTTP through hyper) and `stream` (the client stream with its
//! already-read bytes in front).

mod attempt;
mod conn;
mod forward;
mod framing;
mod head;
mod intercept;
mod resolve;
mod respond;
mod route;
mod splice;
mod stream;
mod tunnel;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::{AllowedRanges, Policy};

pub use attempt::{Attempt, AttemptKind};
pub use intercept::{upstream_tls, Interception, SecretValues};
pub use resolve::{Resolver, SystemResolver};

/// How a task's proxy behaves. Limits apply per [`TaskProxy`].
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Reserved ranges the operator allows explicitly.
    pub allow_private: AllowedRanges,
    /// The daemon's own listening sockets: never connect there. An address
    /// matches on the same port and the same IP, or when the listening IP is
    /// unspecified (`0.0.0.0`, `::`: any IP with that port), or when both
    /// are loopback. The proxy's own listening address is always added.
    pub own_addrs: Vec<SocketAddr>,
    /// Open client connections per task (CONNECT tunnels and plain HTTP
    /// connections, idle keep-alive ones included); one more is answered
    /// `429 Too Many Requests`.
    pub max_tunnels: usize,
    /// A tunnel or request with no bytes either way for this long is cut.
    pub idle_timeout: Duration,
    /// Total life of one tunnel or one forwarded request.
    pub max_duration: Duration,
    /// Time to receive a complete request head, and the ClientHello.
    pub handshake_timeout: Duration,
    /// Time for one upstream TCP connect (and for the name lookup).
    pub connect_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            allow_private: AllowedRanges::default(),
            own_addrs: Vec::new(),
            max_tunnels: 64,
            idle_timeout: Duration::from_secs(300),
            max_duration: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What every connection of one proxy shares.
pub(crate) struct Ctx {
    pub config: Arc<ProxyConfig>,
    pub resolver: Arc<dyn Resolver>,
    pub policy: watch::Receiver<Arc<Policy>>,
    pub log: mpsc::UnboundedSender<Attempt>,
    /// The proxy's own listening address, refused like `own_addrs`.
    pub listener: SocketAddr,
    /// Cancelled when the proxy shuts down.
    pub cancel: CancellationToken,
    /// How hosts with request rules are intercepted; without it their
    /// tunnels are refused.
    pub interception: Option<Arc<Interception>>,
}

/// The proxy of one task, serving one listening socket (created by the
/// daemon inside the task's network namespace).
#[derive(Debug)]
pub struct TaskProxy {
    local_addr: SocketAddr,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TaskProxy {
    /// Spawns the accept loop on the current tokio runtime (an error outside
    /// one). `policy` is the task's live policy: a change re-decides every
    /// open tunnel and request and closes those now denied (logging reason
    /// "policy changed: ..."). Every attempt, allowed or not, is sent to
    /// `log` exactly once, when it ends.
    pub fn start(
        listener: std::net::TcpListener,
        policy: watch::Receiver<Arc<Policy>>,
        config: Arc<ProxyConfig>,
        resolver: Arc<dyn Resolver>,
        log: mpsc::UnboundedSender<Attempt>,
        interception: Option<Interception>,
    ) -> io::Result<TaskProxy> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let cancel = CancellationToken::new();
        let ctx = Arc::new(Ctx {
            config,
            resolver,
            policy,
            log,
            listener: local_addr,
            cancel: cancel.clone(),
            interception: interception.map(Arc::new),
        });
        let task = runtime.spawn(accept_loop(listener, ctx));
        Ok(TaskProxy {
            local_addr,
            cancel,
            task: Some(task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Closes the listener and every open connection; returns when they are
    /// gone (each still logs its [`Attempt`], with reason "proxy shut down"
    /// if it was cut).
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                tracing::warn!("egress proxy {} ended badly: {e}", self.local_addr);
            }
        }
    }
}

impl Drop for TaskProxy {
    /// Aborts the listener and every connection without waiting; their
    /// attempts are still logged as their tasks are dropped.
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Accepts connections until cancelled, then waits for the open ones (which
/// watch the same token) to finish.
async fn accept_loop(listener: tokio::net::TcpListener, ctx: Arc<Ctx>) {
    let limit = ctx.config.max_tunnels.min(Semaphore::MAX_PERMITS);
    let open = Arc::new(Semaphore::new(limit));
    // Over-limit connections get a 429 after their head is read; at most
    // this many at once, beyond that they are closed with a best-effort 429.
    let refusing = Arc::new(Semaphore::new(limit.max(1)));
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => break,
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!("egress proxy {}: a connection task panicked", ctx.listener);
                    }
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if let Ok(permit) = open.clone().try_acquire_owned() {
                        conns.spawn(conn::serve(ctx.clone(), stream, permit));
                    } else if let Ok(permit) = refusing.clone().try_acquire_owned() {
                        conns.spawn(conn::refuse_over_limit(ctx.clone(), stream, permit));
                    } else {
                        conn::refuse_now(&ctx, stream);
                    }
                }
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!("egress proxy {}: accept failed: {e}", ctx.listener);
                    tokio::select! {
                        () = ctx.cancel.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
            }
        }
    }
    drop(listener);
    while let Some(done) = conns.join_next().await {
        if done.as_ref().is_err_and(|e| e.is_panic()) {
            tracing::error!("egress proxy {}: a connection task panicked", ctx.listener);
        }
    }
}

/// `300s`, `1.5s` or `200ms`: durations as reasons show them.
pub(crate) fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_secs() > 0 {
        format!("{}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.subsec_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_duration(Duration::from_secs(300)), "300s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(fmt_duration(Duration::from_millis(200)), "200ms");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn defaults() {
        let c = ProxyConfig::default();
        assert_eq!(c.max_tunnels, 64);
        assert_eq!(c.idle_timeout, Duration::from_secs(300));
        assert_eq!(c.max_duration, Duration::from_secs(3600));
        assert_eq!(c.handshake_timeout, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert!(c.allow_private.is_empty() && c.own_addrs.is_empty());
    }
}
