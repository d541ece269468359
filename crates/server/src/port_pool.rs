//! Kept-alive connections to tasks' ports. Reaching a port makes a
//! connection into the sandbox (under gvisor, a relay started with `runsc
//! exec`, tens of milliseconds), so a connection whose answer is complete
//! is kept for the next request to the same port, as a reverse proxy keeps
//! its upstream connections. Only requests without a body that may be
//! sent again (GET, HEAD, OPTIONS) ride a kept connection: when the
//! sandbox's server closed it meanwhile (or the task was suspended, rolled
//! back), the request goes again over a new one. Upgrades (WebSockets)
//! always get a connection of their own, and so does every request to a
//! gvisor task: its connection is a relay process inside the sandbox,
//! which a checkpoint could not save if it were kept.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::Response;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// Idle connections kept per port.
const MAX_IDLE_PER_PORT: usize = 8;
/// How long an idle connection is kept.
const IDLE_FOR: Duration = Duration::from_secs(30);
/// How long a kept connection may take to finish its last answer.
const READY_WAIT: Duration = Duration::from_millis(100);

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

/// The idle connections, by (task, port).
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<(String, u16), Vec<Idle>>>,
}

static POOL: LazyLock<Pool> = LazyLock::new(Pool::default);

impl Pool {
    /// An idle connection, if one is kept (it may still be finishing its
    /// last answer: see [`send`]).
    fn take(&self, task: &str, port: u16) -> Option<SendRequest<Body>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = idle.get_mut(&(task.to_owned(), port))?;
        while let Some(c) = kept.pop() {
            if c.since.elapsed() < IDLE_FOR && !c.sender.is_closed() {
                return Some(c.sender);
            }
        }
        None
    }

    fn give(&self, task: &str, port: u16, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Old ones go first: they are the likeliest to be closed.
        idle.retain(|_, kept| {
            kept.retain(|c| c.since.elapsed() < IDLE_FOR && !c.sender.is_closed());
            !kept.is_empty()
        });
        let kept = idle.entry((task.to_owned(), port)).or_default();
        if kept.len() < MAX_IDLE_PER_PORT {
            kept.push(Idle { sender, since: Instant::now() });
        }
    }
}

/// Whether `req` may ride a kept connection (and be sent again on a new one).
pub(crate) fn reusable(req: &Request) -> bool {
    let bodiless = req.headers().get(header::CONTENT_LENGTH).is_none_or(|v| v.as_bytes() == b"0") && !req.headers().contains_key(header::TRANSFER_ENCODING);
    matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) && bodiless && !req.headers().contains_key(header::UPGRADE)
}

/// `req` as a port's server receives it: path and query only, `Host: host`.
fn for_port(req: Request, host: &str) -> Result<Request, String> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "/".into());
    parts.uri = path.parse().map_err(|e| format!("{e}"))?;
    parts.headers.insert(header::HOST, HeaderValue::from_str(host).map_err(|e| e.to_string())?);
    Ok(Request::from_parts(parts, body))
}

/// A bodiless request again, for a second try.
fn copy_of(req: &Request) -> Request {
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// Sends a [`reusable`] request to `port` of `task` over a kept connection
/// if one answers, else over a new one from `connect`; the connection is
/// kept afterwards.
pub(crate) async fn send<F>(task: &str, port: u16, req: Request, connect: F) -> Result<Response, SendError>
where
    F: std::future::Future<Output = Result<cairn_runtime::ports::PortStream, cairn_runtime::Error>>,
{
    let host = format!("127.0.0.1:{port}");
    let req = for_port(req, &host).map_err(SendError::Broken)?;
    while let Some(mut sender) = POOL.take(task, port) {
        // Kept when its answer began: ready once that answer has been read
        // to its end, which the client has done by now or will not do.
        if !matches!(tokio::time::timeout(READY_WAIT, sender.ready()).await, Ok(Ok(()))) {
            continue;
        }
        // Closed by the other side since: try the next, then a new one.
        if let Ok(resp) = sender.send_request(copy_of(&req)).await {
            POOL.give(task, port, sender);
            return Ok(resp.map(Body::new));
        }
    }
    let stream = connect.await.map_err(SendError::Connect)?;
    let keep = stream.keepable();
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await.map_err(|e| SendError::Broken(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("port connection: {e}");
        }
    });
    let resp = sender.send_request(req).await.map_err(|e| SendError::Broken(e.to_string()))?;
    if keep {
        POOL.give(task, port, sender);
    }
    Ok(resp.map(Body::new))
}

/// Why a request did not reach a port's server.
pub(crate) enum SendError {
    /// No connection could be made (the runtime's reason).
    Connect(cairn_runtime::Error),
    /// The connection broke before the answer.
    Broken(String),
}
