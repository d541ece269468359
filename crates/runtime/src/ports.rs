//! Ports: a process listening on a port inside a task is reached through
//! the daemon. The sandbox stays offline: its init makes the connection on
//! its own loopback and hands the socket out (under gvisor, a relay run
//! inside connects and copies the bytes over a socket pair); nothing is
//! bridged. Who may
//! reach a port: the daemon's API token, the task's traffic token, or a
//! signed, expiring link to one port ([`Runtime::port_link`]).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use cairn_core::{EventKind, NewEvent};
use cairn_sandbox::{PortConnection, RunningCommand};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::either::Either;

use crate::runtime::Runtime;
use crate::Error;

/// A signed link to one port, and the token that reaches all of the task's.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PortLink {
    pub url: String,
    /// Unix time in milliseconds.
    pub expires_ms: i64,
    pub traffic_token: String,
}

/// A connection to a port in a sandbox: a TCP socket made inside it, or
/// the socket of a relay running inside it (gvisor), kept alive with it.
#[derive(Debug)]
pub struct PortStream {
    io: Either<tokio::net::TcpStream, tokio::net::UnixStream>,
    _relay: Option<RunningCommand>,
}

impl PortStream {
    /// Whether the connection may be kept for later requests: not a gvisor
    /// relay, which a checkpoint of the sandbox could not save (a process
    /// holding the daemon's socket).
    pub fn keepable(&self) -> bool {
        self._relay.is_none()
    }
}

impl AsyncRead for PortStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// How long a connection to a port may take to be accepted.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Runtime {
    /// A connection to `port` on the loopback of task `id`'s sandbox.
    pub async fn connect_port(&self, id: &str, port: u16, actor: &str) -> Result<PortStream, Error> {
        if port == 0 {
            return Err(Error::invalid("port 0 is no port: give 1 to 65535"));
        }
        let (task, _live) = self.running(id, actor).await?;
        let made = self.driver.connect_port(task.id.as_str(), port).await?;
        let refused = |why: String| Error::Unavailable(format!("port {port} of task {}: {why}", task.id));
        let internal = |e: std::io::Error| Error::internal_from(e).context("the port connection");
        let stream = match made.map_err(refused)? {
            PortConnection::Socket(socket) => {
                let stream = tokio::net::TcpStream::from_std(socket).map_err(internal)?;
                match tokio::time::timeout(CONNECT_TIMEOUT, stream.writable()).await {
                    Err(_) => return Err(refused(format!("not accepted within {CONNECT_TIMEOUT:?}"))),
                    Ok(Err(e)) => return Err(refused(e.to_string())),
                    Ok(Ok(())) => {}
                }
                if let Ok(Some(e)) = stream.take_error() {
                    return Err(refused(format!("nothing listens there ({e})")));
                }
                // Requests are small and answered at once: no Nagle delay.
                let _ = stream.set_nodelay(true);
                PortStream { io: Either::Left(stream), _relay: None }
            }
            PortConnection::Relayed { stream, relay } => {
                stream.set_nonblocking(true).map_err(internal)?;
                let stream = tokio::net::UnixStream::from_std(stream).map_err(internal)?;
                PortStream { io: Either::Right(stream), _relay: Some(relay) }
            }
        };
        Ok(stream)
    }

    /// Logs one request to a port of task `id`, with its answer's status.
    pub async fn record_port_request(&self, id: &str, port: u16, method: &str, path: &str, status: u16, actor: &str) {
        self.metrics.port_requests.inc();
        let Ok(task) = self.find(id).await else { return };
        let path: String = path.chars().take(200).collect();
        let ev = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Port,
            actor: actor.to_owned(),
            args: json!({ "port": port, "method": method, "path": path, "status": status }),
            exit_code: None,
            duration_ms: None,
        };
        if let Err(e) = self.store.append_event(&ev).await {
            tracing::warn!(task = %task.id, "cannot log a port request: {e}");
        }
    }

    /// The token that reaches every port of task `task` (header
    /// `X-Cairn-Traffic-Token`, or E2B's `E2b-Traffic-Access-Token`).
    pub fn traffic_token(&self, task: &str) -> String {
        hex::encode(self.link_key.mac_text(&format!("port-traffic\n{task}")))
    }

    pub fn check_traffic_token(&self, task: &str, token: &str) -> bool {
        self.traffic_token(task).as_bytes().ct_eq(token.as_bytes()).into()
    }

    /// The query of a link to port `port` of task `task` that works until
    /// `expires_ms`: `exp=...&sig=...`.
    pub fn port_link_query(&self, task: &str, port: u16, expires_ms: i64) -> String {
        let sig = URL_SAFE_NO_PAD.encode(self.link_key.mac_text(&format!("port-link\n{task}\n{port}\n{expires_ms}")));
        format!("exp={expires_ms}&sig={sig}")
    }

    /// Whether `sig` signs a link to port `port` of `task` that has not
    /// expired.
    pub fn check_port_link(&self, task: &str, port: u16, expires_ms: i64, sig: &str) -> bool {
        let expected = self.port_link_query(task, port, expires_ms);
        let expected = expected.rsplit("sig=").next().unwrap_or_default();
        bool::from(expected.as_bytes().ct_eq(sig.as_bytes())) && expires_ms >= cairn_store::now_ms()
    }

    /// A signed link to port `port` of task `id`, valid for `ttl`.
    pub async fn port_link(&self, id: &str, port: u16, ttl: Duration) -> Result<PortLink, Error> {
        let task = self.find(id).await?;
        if port == 0 {
            return Err(Error::invalid("port 0 is no port: give 1 to 65535"));
        }
        let base = self.base_url.get().cloned().unwrap_or_default();
        let expires_ms = cairn_store::now_ms().saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64);
        let url = format!("{base}/v1/tasks/{}/ports/{port}/?{}", task.id, self.port_link_query(task.id.as_str(), port, expires_ms));
        Ok(PortLink { url, expires_ms, traffic_token: self.traffic_token(task.id.as_str()) })
    }
}
