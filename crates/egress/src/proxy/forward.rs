//! Plain HTTP: the client connection is served by hyper, each request on it
//! (keep-alive) checked on its own and forwarded in origin form over a
//! fresh upstream connection the proxy opened to the address it checked.
//! One [`super::Attempt`] per request, logged when its response ends.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, Version};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1 as client_http1;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::attempt::{Activity, AttemptKind, CutSlot, Meter, Recorder};
use super::conn::recorder;
use super::respond::response;
use super::route::{self, Refusal};
use super::stream::Prefixed;
use super::{fmt_duration, Ctx};
use crate::connect::{MAX_HEAD, MAX_HEADERS};
use crate::{host_header_agrees, parse_request_head, Host, RequestHead, Target};

type BoxError = Box<dyn StdError + Send + Sync>;
type UpstreamConn = client_http1::Connection<TokioIo<TcpStream>, CountedUp>;

/// Hop-by-hop headers, never forwarded either way (`Transfer-Encoding` is
/// redone by hyper for each side).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// What the connection's watcher needs to know about the request in flight
/// (hyper serves HTTP/1 requests one at a time).
#[derive(Debug, Default)]
struct ConnState {
    current: Mutex<Option<Current>>,
    /// A request began: deadlines changed.
    changed: Notify,
    cut: Arc<CutSlot>,
    next_id: AtomicU64,
}

#[derive(Debug, Clone)]
struct Current {
    id: u64,
    host: Host,
    port: u16,
    deadline: Instant,
}

impl ConnState {
    fn begin(self: &Arc<Self>, host: Host, port: u16, deadline: Instant) -> InFlight {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        *self.lock() = Some(Current {
            id,
            host,
            port,
            deadline,
        });
        self.changed.notify_one();
        InFlight {
            state: self.clone(),
            id,
        }
    }

    fn current(&self) -> Option<Current> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Marks the request as no longer in flight when dropped.
#[derive(Debug)]
struct InFlight {
    state: Arc<ConnState>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut current = self.state.lock();
        if current.as_ref().is_some_and(|c| c.id == self.id) {
            *current = None;
        }
    }
}

/// Serves a plain HTTP client connection whose first bytes (`buf`, at least
/// one complete absolute-form head) were already read.
pub(crate) async fn serve(ctx: Arc<Ctx>, client: TcpStream, buf: Vec<u8>) {
    let activity = Arc::new(Activity::new());
    let state = Arc::new(ConnState::default());
    let io = TokioIo::new(Prefixed::new(buf, client, activity.clone()));
    let service = {
        let (ctx, state) = (ctx.clone(), state.clone());
        service_fn(move |req| handle(ctx.clone(), state.clone(), req))
    };
    let config = &ctx.config;
    let mut builder = server_http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Also ends an idle keep-alive connection.
        .header_read_timeout(config.handshake_timeout)
        .max_buf_size(MAX_HEAD.max(8192))
        .max_headers(MAX_HEADERS)
        .auto_date_header(false)
        .title_case_headers(true)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut policy = ctx.policy.clone();
    let mut watching = true;
    let idle = config.idle_timeout;
    loop {
        let idle_at = activity.last() + idle;
        let current = state.current();
        let wake = current
            .as_ref()
            .map_or(idle_at, |c| c.deadline.min(idle_at));
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    log_connection_error(&ctx, &e);
                }
                return;
            }
            () = state.changed.notified() => {}
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if activity.last() + idle <= now {
                    return state.cut.set(format!("idle for {}", fmt_duration(idle)));
                }
                if state.current().is_some_and(|c| c.deadline <= now) {
                    return state.cut.set(format!(
                        "open longer than {}",
                        fmt_duration(config.max_duration)
                    ));
                }
            }
            changed = policy.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let now = policy.borrow_and_update().clone();
                if let Some(c) = state.current() {
                    let d = now.decide(&c.host, c.port);
                    if !d.allowed {
                        return state.cut.set(format!("policy changed: {}", d.reason));
                    }
                }
            }
        }
    }
}

/// A request hyper itself refused (a malformed head after the first): it
/// answered 400 (431 for a head too large); log it.
fn log_connection_error(ctx: &Ctx, e: &hyper::Error) {
    if !e.is_parse() && !e.is_parse_too_large() {
        tracing::debug!("egress proxy {}: HTTP connection ended: {e}", ctx.listener);
        return;
    }
    let mut rec = recorder(ctx, AttemptKind::Http, Instant::now());
    rec.status(if e.is_parse_too_large() { 431 } else { 400 });
    rec.reason(format!("bad request: {e}"));
    rec.finish();
}

async fn handle(
    ctx: Arc<Ctx>,
    state: Arc<ConnState>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let kind = if req.method() == Method::CONNECT {
        AttemptKind::Connect
    } else {
        AttemptKind::Http
    };
    // Sharing the connection's cut slot: if the watcher cuts the connection
    // while this request is in flight, the log says why.
    let rec = Recorder::new(
        kind,
        Instant::now(),
        ctx.log.clone(),
        ctx.cancel.clone(),
        state.cut.clone(),
    );
    Ok(forward(&ctx, &state, req, rec).await)
}

async fn forward(
    ctx: &Ctx,
    state: &Arc<ConnState>,
    req: Request<Incoming>,
    mut rec: Recorder,
) -> Response<ProxyBody> {
    let started = Instant::now();
    {
        let uri = req.uri();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.host().is_some() { 80 } else { 0 });
        rec.target(uri.host().unwrap_or_default(), port);
    }
    if req.method() == Method::CONNECT {
        return refused(
            rec,
            Refusal::new(
                400,
                "CONNECT is only accepted as the first request on a connection",
            ),
        );
    }
    let head = match checked_head(&req) {
        Ok(head) => head,
        Err(r) => return refused(rec, r),
    };
    let Target::Absolute {
        host, port, path, ..
    } = &head.target
    else {
        return refused(rec, Refusal::new(400, "not an absolute-form request"));
    };
    let port = *port;
    rec.target(host, port);
    let name = match route::name(host) {
        Ok(h) => h,
        Err(r) => return refused(rec, r),
    };
    rec.host(&name);
    // In flight before the decision, so a policy change from here on is
    // seen by the watcher.
    let in_flight = state.begin(name.clone(), port, started + ctx.config.max_duration);
    let mut policy = ctx.policy.clone();
    let upstream = match route::open(ctx, &mut policy, &mut rec, &name, port).await {
        Ok(u) => u,
        Err(r) => return refused(rec, r),
    };
    // Read the upstream in large chunks: bulk downloads take fewer trips.
    let (sender, conn) = match client_http1::Builder::new().max_buf_size(1 << 20).read_buf_exact_size(None).handshake(TokioIo::new(upstream)).await {
        Ok(pair) => pair,
        Err(e) => return refused(rec, Refusal::new(502, format!("upstream {name}: {e}"))),
    };
    let upstream_req = match upstream_request(req, path, rec.meter().clone()) {
        Ok(r) => r,
        Err(r) => return refused(rec, r),
    };
    rec.allowed();
    let (sender, conn, sent) = send(sender, conn, upstream_req, &name).await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(r) => return refused(rec, r),
    };
    rec.status(resp.status().as_u16());
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = UpstreamBody {
        inner: body,
        conn,
        _sender: sender,
        meter: rec.meter().clone(),
        rec: Some(rec),
        _in_flight: in_flight,
    };
    Response::from_parts(parts, ProxyBody::Upstream(Box::new(body)))
}

/// Sends the request while driving the upstream connection, until the
/// response head arrives. The connection is returned if still running: the
/// response body needs it driven too.
async fn send(
    mut sender: client_http1::SendRequest<CountedUp>,
    conn: UpstreamConn,
    req: Request<CountedUp>,
    name: &Host,
) -> (
    client_http1::SendRequest<CountedUp>,
    Option<Pin<Box<UpstreamConn>>>,
    Result<Response<Incoming>, Refusal>,
) {
    let mut conn = Box::pin(conn);
    let mut conn_done = false;
    let result = {
        let sending = sender.send_request(req);
        tokio::pin!(sending);
        loop {
            tokio::select! {
                r = &mut sending => {
                    break r.map_err(|e| Refusal::new(502, format!("upstream {name} failed: {e}")));
                }
                r = conn.as_mut(), if !conn_done => {
                    conn_done = true;
                    if let Err(e) = r {
                        tracing::debug!("upstream connection to {name} failed: {e}");
                    }
                }
            }
        }
    };
    (sender, (!conn_done).then_some(conn), result)
}

/// The request head as this crate's parser sees it, so every request on the
/// connection gets the same checks as the first: absolute form, `http`
/// only, one `Host` agreeing with the target.
fn checked_head(req: &Request<Incoming>) -> Result<RequestHead, Refusal> {
    let version = if req.version() == Version::HTTP_10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let mut raw = format!("{} {} {version}\r\n", req.method(), req.uri()).into_bytes();
    for (name, value) in req.headers() {
        raw.extend_from_slice(name.as_str().as_bytes());
        raw.extend_from_slice(b": ");
        raw.extend_from_slice(value.as_bytes());
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"\r\n");
    let head = match parse_request_head(&raw) {
        Ok(Some(head)) => head,
        Ok(None) => return Err(Refusal::new(400, "incomplete request head")),
        Err(e) => return Err(Refusal::new(400, e.to_string())),
    };
    host_header_agrees(&head).map_err(|e| Refusal::new(400, e.to_string()))?;
    Ok(head)
}

/// The request as the upstream gets it: origin form, HTTP/1.1, no
/// hop-by-hop headers, a `Host` header, the body counted as it streams.
fn upstream_request(
    req: Request<Incoming>,
    path: &str,
    meter: Arc<Meter>,
) -> Result<Request<CountedUp>, Refusal> {
    let (mut parts, body) = req.into_parts();
    let authority = parts.uri.authority().map(|a| a.as_str().to_owned());
    parts.uri = path
        .parse::<Uri>()
        .map_err(|e| Refusal::new(400, format!("bad path {path:?}: {e}")))?;
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    if !parts.headers.contains_key(HOST) {
        if let Some(value) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            parts.headers.insert(HOST, value);
        }
    }
    Ok(Request::from_parts(parts, CountedUp { inner: body, meter }))
}

/// Removes hop-by-hop headers and those `Connection` names (except `Host`
/// and `Content-Length`, which a client must not be able to drop). With
/// `Transfer-Encoding` present any `Content-Length` goes too: hyper frames
/// the forwarded body itself.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| *n != HOST && *n != CONTENT_LENGTH)
        .collect();
    for name in listed {
        headers.remove(name);
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        headers.remove(CONTENT_LENGTH);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Logs the refusal and answers it.
fn refused(mut rec: Recorder, r: Refusal) -> Response<ProxyBody> {
    rec.status(r.status);
    rec.reason(&r.reason);
    rec.finish();
    response(r.status, &r.reason).map(|b| ProxyBody::Fixed(Some(b)))
}

/// The client's request body on its way up, counted.
#[derive(Debug)]
struct CountedUp {
    inner: Incoming,
    meter: Arc<Meter>,
}

impl Body for CountedUp {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.meter.add_up(data.len());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body: the proxy's own, or the upstream's streamed through.
#[derive(Debug)]
enum ProxyBody {
    Fixed(Option<Bytes>),
    Upstream(Box<UpstreamBody>),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Fixed(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Fixed(bytes) => bytes.is_none(),
            ProxyBody::Upstream(body) => body.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Fixed(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            ProxyBody::Upstream(body) => body.inner.size_hint(),
        }
    }
}

/// The upstream's response body, counted, with the upstream connection
/// driven while it streams; logs the attempt when it ends or is dropped.
struct UpstreamBody {
    inner: Incoming,
    conn: Option<Pin<Box<UpstreamConn>>>,
    _sender: client_http1::SendRequest<CountedUp>,
    meter: Arc<Meter>,
    rec: Option<Recorder>,
    _in_flight: InFlight,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("inner", &self.inner)
            .field("rec", &self.rec)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(conn) = self.conn.as_mut() {
            if conn.as_mut().poll(cx).is_ready() {
                self.conn = None;
            }
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.meter.add_down(data.len());
                }
                if self.inner.is_end_stream() {
                    self.finish(None);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.finish(Some(format!(
                    "upstream failed during the response body: {e}"
                )));
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                self.finish(None);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn finish(&mut self, problem: Option<String>) {
        if let Some(mut rec) = self.rec.take() {
            if let Some(p) = problem {
                rec.reason(p);
            }
            rec.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_stripped() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Secret, host, Content-Length"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "1"),
            ("x-kept", "1"),
            ("host", "a.test"),
            ("content-length", "3"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eDp5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("upgrade", "websocket"),
        ] {
            h.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "host", "x-kept"]);

        let mut h = HeaderMap::new();
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("10"));
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty(), "framing is hyper's: {h:?}");
    }
}
