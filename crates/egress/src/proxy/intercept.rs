//! A tunnel to a host with request rules or injections: the proxy ends the
//! client's TLS itself, with a certificate from the task's own CA, and
//! opens its own verified TLS connection to the host. In between it sees
//! each request: it checks the request rules, sets the injected headers,
//! replaces the agent's placeholders with secrets, and replaces any
//! secret that comes back in a response with its placeholder.
//!
//! HTTP/1.1 and HTTP/2 on both sides, each side as its peer chose.
//! Placeholders are replaced in the request line and headers, not in
//! request bodies. A response the proxy cannot scan (an encoding other
//! than gzip, deflate or br) is refused when the host's requests carry a
//! secret; the `Accept-Encoding` the host sees only offers those.

use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error as StdError;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, HOST, UPGRADE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use super::attempt::{Activity, AttemptKind, Meter, Recorder};
use super::framing::{FramingGuard, Guarded, REFUSED_HEADER};
use super::forward::strip_hop_by_hop;
use super::respond::{response, response_bytes};
use super::stream::Prefixed;
use super::{fmt_duration, Ctx};
use crate::ca::TaskCa;
use crate::connect::{MAX_HEAD, MAX_HEADERS};
use crate::rules::{HostRules, Inject, Part};
use crate::scrub::Replacer;
use crate::{normalise, Host, Policy};

type BoxError = Box<dyn StdError + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;
/// Encodings the proxy can undo to scan a response.
const SCANNABLE: &str = "gzip, deflate, br";
/// Read size for response bodies that are scanned.
const SCAN_CHUNK: usize = 64 * 1024;

/// The values of the secrets a task's rules name. Its debug form shows the
/// names only.
#[derive(Default, Clone)]
pub struct SecretValues {
    values: HashMap<String, Vec<u8>>,
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.values.keys()).finish()
    }
}

impl SecretValues {
    pub fn insert(&mut self, name: &str, value: Vec<u8>) {
        self.values.insert(name.to_owned(), value);
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.values.get(name).map(Vec::as_slice)
    }
}

/// What a task's proxy needs to intercept: its CA, the secrets' values
/// (changed with the rules) and the trust roots for upstream certificates.
#[derive(Debug)]
pub struct Interception {
    pub ca: Arc<TaskCa>,
    pub secrets: watch::Receiver<Arc<SecretValues>>,
    pub upstream_tls: Arc<rustls::ClientConfig>,
}

/// A TLS client configuration trusting the host's roots and, if given, the
/// certificates of a PEM bundle; offers HTTP/2 and HTTP/1.1.
pub fn upstream_tls(extra_pem: Option<&[u8]>) -> crate::Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let tls = |e: String| crate::Error::Tls(e);
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system certificate rustls cannot use is skipped, as OpenSSL would.
        let _ = roots.add(cert);
    }
    if let Some(pem) = extra_pem {
        let mut added = 0;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| tls(format!("upstream CA bundle: {e}")))?;
            roots.add(cert).map_err(|e| tls(format!("upstream CA bundle: {e}")))?;
            added += 1;
        }
        if added == 0 {
            return Err(tls("upstream CA bundle holds no certificate".to_owned()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The upstream side: one verified TLS connection, shared by the requests
/// of the tunnel.
enum Upstream {
    /// HTTP/1.1 carries one request at a time.
    H1(Mutex<hyper::client::conn::http1::SendRequest<ProxyBody>>),
    H2(hyper::client::conn::http2::SendRequest<ProxyBody>),
    /// The connection could not be made: every request is answered 502.
    Failed(String),
}

/// What every request of one intercepted tunnel shares.
struct Session {
    host: Host,
    port: u16,
    address: Option<std::net::SocketAddr>,
    upstream: Upstream,
    policy: watch::Receiver<Arc<Policy>>,
    secrets: watch::Receiver<Arc<SecretValues>>,
    activity: Arc<Activity>,
    /// The tunnel's own meter: the sum of its requests.
    tunnel: Arc<Meter>,
    /// The scrubber of the last rules and secrets seen, made once for the
    /// requests that follow (a change of either makes a new one).
    scrubber: std::sync::Mutex<Option<CachedScrubber>>,
}

/// The secrets' names and values a scrubber was made for, and the scrubber.
type CachedScrubber = (Vec<String>, Arc<SecretValues>, Option<Arc<Replacer>>);

impl Session {
    /// What replaces the secrets of `rules` in responses; `None` when the
    /// host gets no secret.
    fn scrubber(&self, rules: &HostRules, secrets: &Arc<SecretValues>) -> Option<Arc<Replacer>> {
        let names = rules.secrets();
        let mut cached = self.scrubber.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((n, s, r)) = cached.as_ref() {
            if *n == names && Arc::ptr_eq(s, secrets) {
                return r.clone();
            }
        }
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = names.iter().filter_map(|n| Some((secrets.get(n)?.to_vec(), format!("${n}").into_bytes()))).collect();
        let made = Replacer::new(&pairs).map(Arc::new);
        *cached = Some((names, secrets.clone(), made.clone()));
        made
    }
}

/// Runs an intercepted tunnel after `200 Connection established` was sent.
/// Returns why it ended, when the proxy ended it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    ctx: &Ctx,
    interception: &Interception,
    client: TcpStream,
    early: Vec<u8>,
    upstream: TcpStream,
    host: &Host,
    port: u16,
    rec: &mut Recorder,
    deadline: Instant,
) -> Option<String> {
    let config = &ctx.config;
    let activity = Arc::new(Activity::new());
    let mut client = Prefixed::new(early, client, activity.clone());
    // A client that does not start TLS gets a plain answer saying so.
    let mut first = [0u8; 1];
    let wait = config.handshake_timeout;
    match tokio::time::timeout(wait, client.read(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
        Ok(Ok(1)) => {
            let why = format!("{host} is intercepted by the proxy (it has request rules): speak TLS to it through CONNECT");
            let _ = client.write_all(&response_bytes(400, &why)).await;
            return Some(why);
        }
        Ok(_) => return Some("client closed the tunnel without sending a ClientHello".to_owned()),
        Err(_) => return Some(format!("no ClientHello within {}", fmt_duration(wait))),
    }
    let client = Prefixed::new(Bytes::copy_from_slice(&first), client, activity.clone());
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
    let start = match tokio::time::timeout(wait, acceptor).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Some(format!("TLS from the client failed: {e}")),
        Err(_) => return Some(format!("no ClientHello within {}", fmt_duration(wait))),
    };
    match start.client_hello().server_name().map(normalise) {
        Some(Ok(name)) if name == *host => {}
        Some(_) => return Some(format!("SNI does not match CONNECT host {host}")),
        None => return Some(format!("no SNI in the ClientHello for CONNECT host {host}")),
    }
    let server_config = match interception.ca.server_config(host) {
        Ok(c) => c,
        Err(e) => return Some(format!("cannot make a certificate for {host}: {e}")),
    };
    let client = match tokio::time::timeout(wait, start.into_stream(server_config)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Some(format!("TLS from the client failed (a client that pins its own CA refuses the task's): {e}")),
        Err(_) => return Some(format!("TLS from the client not done within {}", fmt_duration(wait))),
    };
    rec.allowed();
    let (upstream, upstream_conn) = connect_upstream(interception, upstream, host, wait).await;
    if let Upstream::Failed(why) = &upstream {
        tracing::debug!("intercepted {host}: {why}");
        rec.reason(why.clone());
    }
    let session = Arc::new(Session {
        host: host.clone(),
        port,
        address: rec.address_of(),
        upstream,
        policy: ctx.policy.clone(),
        secrets: interception.secrets.clone(),
        activity: activity.clone(),
        tunnel: rec.meter().clone(),
        scrubber: std::sync::Mutex::new(None),
    });
    // HTTP/2 when the client chose it; else HTTP/1.1, each request's
    // framing checked before hyper reads it (see `framing`).
    let h2 = client.get_ref().1.alpn_protocol() == Some(b"h2");
    let token = framing_token();
    let service = {
        let (session, log, cancel, token) = (session.clone(), ctx.log.clone(), ctx.cancel.clone(), token.clone());
        service_fn(move |req| {
            let rec = Recorder::new(AttemptKind::Intercepted, Instant::now(), log.clone(), cancel.clone(), Arc::default());
            handle(session.clone(), req, rec, token.clone())
        })
    };
    let serving: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), hyper::Error>> + Send>> = if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder.max_header_list_size(u32::try_from(MAX_HEAD).unwrap_or(u32::MAX)).auto_date_header(false);
        Box::pin(builder.serve_connection(TokioIo::new(client), service))
    } else {
        let guard = FramingGuard::new(token, host.to_string(), MAX_HEAD);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).max_buf_size(MAX_HEAD.max(8192)).max_headers(MAX_HEADERS).auto_date_header(false);
        Box::pin(builder.serve_connection(TokioIo::new(Guarded::new(client, guard)), service))
    };
    // The upstream connection is driven in this task beside the client's,
    // not spawned: a request then crosses no task on its way out and back
    // (a spawned connection cost a wake on another thread each way).
    let upstream_conn = async move {
        if let Some(conn) = upstream_conn {
            if let Err(e) = conn.await {
                tracing::debug!("intercepted: upstream connection ended: {e}");
            }
        }
        // Its requests are answered 502 by hyper from here on; the client's
        // side runs until it ends.
        std::future::pending::<()>().await;
    };
    let idle = config.idle_timeout;
    let mut policy = ctx.policy.clone();
    tokio::select! {
        () = upstream_conn => None,
        r = serving => {
            if let Err(e) = r {
                tracing::debug!("intercepted {host}: client connection ended: {e}");
            }
            None
        }
        () = activity.idle_for(idle) => Some(format!("idle for {}", fmt_duration(idle))),
        () = tokio::time::sleep_until(deadline) => Some(format!("open longer than {}", fmt_duration(config.max_duration))),
        d = super::tunnel::denied_by_change(&mut policy, host, port) => Some(format!("policy changed: {}", d.reason)),
        () = ctx.cancel.cancelled() => Some("proxy shut down".to_owned()),
    }
}

/// The future that carries an upstream connection's bytes; it must be
/// polled for any request on the connection to make progress.
type UpstreamConn = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), hyper::Error>> + Send>>;

/// TLS to the host, verified against the upstream roots, SNI the name.
/// Returns the requests' side and the connection to drive.
async fn connect_upstream(interception: &Interception, tcp: TcpStream, host: &Host, wait: std::time::Duration) -> (Upstream, Option<UpstreamConn>) {
    let failed = |why: String| (Upstream::Failed(why), None);
    let Ok(name) = ServerName::try_from(host.as_str().to_owned()) else {
        return failed(format!("{host} is not a name a certificate can carry"));
    };
    let connector = tokio_rustls::TlsConnector::from(interception.upstream_tls.clone());
    let tls = match tokio::time::timeout(wait, connector.connect(name, tcp)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return failed(format!("TLS to {host} failed: {e}")),
        Err(_) => return failed(format!("TLS to {host} not done within {}", fmt_duration(wait))),
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    if h2 {
        match hyper::client::conn::http2::Builder::new(TokioExecutor::new()).timer(TokioTimer::new()).handshake(io).await {
            Ok((sender, conn)) => (Upstream::H2(sender), Some(Box::pin(conn))),
            Err(e) => failed(format!("HTTP/2 to {host} failed: {e}")),
        }
    } else {
        match hyper::client::conn::http1::Builder::new().max_buf_size(1 << 20).handshake(io).await {
            Ok((sender, conn)) => (Upstream::H1(Mutex::new(sender)), Some(Box::pin(conn))),
            Err(e) => failed(format!("HTTP/1.1 to {host} failed: {e}")),
        }
    }
}

/// A refusal the proxy answers itself, logged.
fn refuse(mut rec: Recorder, status: u16, why: &str) -> Response<ProxyBody> {
    rec.status(status);
    rec.reason(why);
    rec.finish();
    response(status, why).map(|b| http_body_util::Full::new(b).map_err(|never| match never {}).boxed_unsync())
}

/// A token no client can guess, which marks the guard's refusals.
fn framing_token() -> String {
    let mut bytes = [0u8; 16];
    // A failed read leaves zeros: the marker is then guessable, which only
    // lets a client have its own request refused.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn handle(session: Arc<Session>, mut req: Request<Incoming>, mut rec: Recorder, token: String) -> Result<Response<ProxyBody>, Infallible> {
    session.activity.touch();
    rec.target(session.host.as_str(), session.port);
    rec.host(&session.host);
    if let Some(a) = session.address {
        rec.address(a);
    }
    if let Some(marker) = req.headers_mut().remove(REFUSED_HEADER) {
        if let Some(why) = marker.to_str().ok().and_then(|m| m.strip_prefix(token.as_str())).filter(|_| !token.is_empty()) {
            return Ok(refuse(rec, 400, why.trim()));
        }
    }
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    rec.request(&method, &path);
    let rules = session.policy.borrow().rules_for(&session.host, session.port);
    let secrets = session.secrets.borrow().clone();
    match checked(&session, &rules, &req) {
        Ok(rule) => rec.rule(rule),
        Err((status, why)) => return Ok(refuse(rec, status, &why)),
    }
    let (req, used) = match prepared(&session, &rules, &secrets, req) {
        Ok(r) => r,
        Err((status, why)) => return Ok(refuse(rec, status, &why)),
    };
    rec.secrets(used.clone());
    rec.allowed();
    rec.reason("allowed by the host's rules");
    let sent = match &session.upstream {
        Upstream::Failed(why) => return Ok(refuse(rec, 502, why)),
        Upstream::H2(sender) => sender.clone().send_request(req).await,
        Upstream::H1(sender) => {
            let mut sender = sender.lock().await;
            match sender.ready().await {
                Ok(()) => sender.send_request(req).await,
                Err(e) => Err(e),
            }
        }
    };
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return Ok(refuse(rec, 502, &format!("upstream {} failed: {e}", session.host))),
    };
    session.activity.touch();
    rec.status(resp.status().as_u16());
    Ok(scrubbed(&session, &rules, &secrets, resp, rec))
}

/// Which rule lets the request through, or the status and reason to refuse.
fn checked(session: &Session, rules: &HostRules, req: &Request<Incoming>) -> Result<String, (u16, String)> {
    let host = &session.host;
    // Every request names the tunnel's host (Host or :authority).
    let named = req.uri().host().map(str::to_owned).or_else(|| {
        let h = req.headers().get(HOST)?.to_str().ok()?;
        Some(h.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(h, |(n, _)| n).to_owned())
    });
    match named.as_deref().map(normalise) {
        Some(Ok(n)) if n == *host => {}
        Some(_) => return Err((400, format!("the request names another host than the tunnel's {host}"))),
        None => return Err((400, "the request names no host".to_owned())),
    }
    // An ambiguous framing never gets here: the framing guard answered it.
    if req.method() == Method::CONNECT || req.headers().contains_key(UPGRADE) {
        return Err((501, format!("protocol upgrades are not relayed to {host}, whose requests the proxy checks")));
    }
    rules.check(req.method().as_str(), req.uri().path()).map_err(|why| (403, format!("refused by the request rules of {host}: {why}")))
}

/// The request as the host gets it, and the secrets it carries (by name).
#[allow(clippy::type_complexity)]
fn prepared(
    session: &Session,
    rules: &HostRules,
    secrets: &SecretValues,
    req: Request<Incoming>,
) -> Result<(Request<ProxyBody>, Vec<String>), (u16, String)> {
    let (mut parts, body) = req.into_parts();
    let mut used: Vec<String> = Vec::new();
    let value_of = |name: &str| secrets.get(name).ok_or_else(|| (502, format!("secret {name} is not available to the proxy")));
    // The agent's placeholders, in the request line and headers.
    let mut pairs = Vec::new();
    for i in &rules.injections {
        if let Inject::Placeholder(name) = &i.inject {
            pairs.push((format!("${name}").into_bytes(), value_of(name)?.to_vec(), name.clone()));
        }
    }
    if !pairs.is_empty() {
        let replacer = Replacer::new(&pairs.iter().map(|(p, v, _)| (p.clone(), v.clone())).collect::<Vec<_>>());
        if let Some(replacer) = replacer {
            let mut note = |text: &[u8]| {
                for (p, _, name) in &pairs {
                    if text.windows(p.len()).any(|w| w == p.as_slice()) && !used.contains(name) {
                        used.push(name.clone());
                    }
                }
            };
            if let Some(pq) = parts.uri.path_and_query() {
                if replacer.finds(pq.as_str().as_bytes()) {
                    note(pq.as_str().as_bytes());
                    let replaced = replacer.replace_all(pq.as_str().as_bytes());
                    let replaced = String::from_utf8(replaced).map_err(|_| (400, "a secret put in the request line is not text".to_owned()))?;
                    let mut uri = parts.uri.clone().into_parts();
                    uri.path_and_query = Some(replaced.parse().map_err(|_| (400, "a secret put in the request line makes it invalid".to_owned()))?);
                    parts.uri = Uri::from_parts(uri).map_err(|e| (400, e.to_string()))?;
                }
            }
            for value in parts.headers.values_mut() {
                if replacer.finds(value.as_bytes()) {
                    note(value.as_bytes());
                    *value = HeaderValue::from_bytes(&replacer.replace_all(value.as_bytes()))
                        .map_err(|_| (400, "a secret put in a header makes it invalid".to_owned()))?;
                }
            }
        }
    }
    // Injected headers replace what the agent sent under that name.
    for i in &rules.injections {
        if let Inject::Header { name, value } = &i.inject {
            let mut bytes = Vec::new();
            for p in value {
                match p {
                    Part::Text(t) => bytes.extend_from_slice(t.as_bytes()),
                    Part::Secret(n) => {
                        bytes.extend_from_slice(value_of(n)?);
                        if !used.contains(n) {
                            used.push(n.clone());
                        }
                    }
                }
            }
            let value = HeaderValue::from_bytes(&bytes).map_err(|_| (502, format!("injected header {name} is not a valid header value")))?;
            let name = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| (502, format!("{name} is not a header name")))?;
            parts.headers.insert(name, value);
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    if !rules.secrets().is_empty() {
        // Only encodings the proxy can undo come back.
        parts.headers.insert(ACCEPT_ENCODING, HeaderValue::from_static(SCANNABLE));
    }
    let authority = if session.port == 443 { session.host.to_string() } else { format!("{}:{}", session.host, session.port) };
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    match &session.upstream {
        Upstream::H2(_) => {
            parts.headers.remove(HOST);
            parts.uri = format!("https://{authority}{pq}").parse().map_err(|_| (400, "bad request target".to_owned()))?;
            parts.version = Version::HTTP_2;
        }
        _ => {
            parts.headers.insert(HOST, HeaderValue::from_str(&authority).map_err(|_| (400, "bad host".to_owned()))?);
            parts.uri = pq.parse().map_err(|_| (400, "bad request target".to_owned()))?;
            parts.version = Version::HTTP_11;
        }
    }
    let meter = session.tunnel.clone();
    let activity = session.activity.clone();
    let body = body
        .map_frame(move |f| {
            if let Some(d) = f.data_ref() {
                meter.add_up(d.len());
                activity.touch();
            }
            f
        })
        .map_err(|e| Box::new(e) as BoxError)
        .boxed_unsync();
    Ok((Request::from_parts(parts, body), used))
}

/// The host's response as the agent gets it: secrets in headers and body
/// replaced by their placeholders (bodies decoded to do so).
fn scrubbed(session: &Session, rules: &HostRules, secrets: &Arc<SecretValues>, resp: Response<Incoming>, mut rec: Recorder) -> Response<ProxyBody> {
    let replacer = session.scrubber(rules, secrets);
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let meter = session.tunnel.clone();
    let activity = session.activity.clone();
    let Some(replacer) = replacer else {
        // No secret goes to this host: the body passes as it is.
        let own = rec.meter().clone();
        let body = body
            .map_frame(move |f| {
                if let Some(d) = f.data_ref() {
                    meter.add_down(d.len());
                    own.add_down(d.len());
                    activity.touch();
                }
                f
            })
            .map_err(|e| Box::new(e) as BoxError)
            .boxed_unsync();
        let body = Logged { inner: body, rec: Some(rec) };
        return Response::from_parts(parts, BodyExt::boxed_unsync(body));
    };
    scrub_headers(&mut parts.headers, &replacer, &mut rec);
    let replacer = Replacer::clone(&replacer);
    let encoding = parts.headers.get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_ascii_lowercase());
    let raw = body.into_data_stream().map_err(std::io::Error::other);
    let raw = BufReader::new(tokio_util::io::StreamReader::new(raw));
    let decoded: Box<dyn AsyncRead + Send + Unpin> = match encoding.as_deref() {
        None | Some("identity") | Some("") => Box::new(raw),
        Some("gzip") | Some("x-gzip") => Box::new(async_compression::tokio::bufread::GzipDecoder::new(raw)),
        Some("deflate") => Box::new(async_compression::tokio::bufread::ZlibDecoder::new(raw)),
        Some("br") => Box::new(async_compression::tokio::bufread::BrotliDecoder::new(raw)),
        Some(other) => {
            let why = format!("the response of {} is encoded as {other:?}, which the proxy cannot scan for secrets (it scans {SCANNABLE})", session.host);
            return refuse(rec, 502, &why);
        }
    };
    // The body changes length: framed anew, and no longer encoded.
    parts.headers.remove(CONTENT_LENGTH);
    parts.headers.remove(CONTENT_ENCODING);
    let own = rec.meter().clone();
    let state = Scan { reader: decoded, stream: replacer.stream(), buf: vec![0u8; SCAN_CHUNK], rec: Some(rec), meter, own, activity };
    let stream = futures_util::stream::unfold(state, Scan::next).map(|r| r.map(Frame::data));
    Response::from_parts(parts, BodyExt::boxed_unsync(StreamBody::new(stream)))
}

/// Secrets in response headers become their placeholders.
fn scrub_headers(headers: &mut HeaderMap, replacer: &Replacer, rec: &mut Recorder) {
    let mut replaced = 0;
    for value in headers.values_mut() {
        if replacer.finds(value.as_bytes()) {
            if let Ok(v) = HeaderValue::from_bytes(&replacer.replace_all(value.as_bytes())) {
                *value = v;
                replaced += 1;
            }
        }
    }
    if replaced > 0 {
        rec.scrubbed(replaced);
    }
}

/// A scanned response body: read, decoded, replaced, counted.
struct Scan {
    reader: Box<dyn AsyncRead + Send + Unpin>,
    stream: crate::scrub::ReplaceStream,
    buf: Vec<u8>,
    rec: Option<Recorder>,
    meter: Arc<Meter>,
    own: Arc<Meter>,
    activity: Arc<Activity>,
}

impl Scan {
    async fn next(mut self) -> Option<(Result<Bytes, BoxError>, Scan)> {
        let mut rec = self.rec.take()?;
        match self.reader.read(&mut self.buf).await {
            Ok(0) => {
                let tail = self.stream.finish();
                rec.scrubbed(self.stream.replaced);
                self.count(tail.len());
                rec.finish();
                Some((Ok(Bytes::from(tail)), self))
            }
            Ok(n) => {
                let out = self.stream.feed(self.buf.get(..n).unwrap_or_default());
                self.count(out.len());
                self.rec = Some(rec);
                Some((Ok(Bytes::from(out)), self))
            }
            Err(e) => {
                rec.scrubbed(self.stream.replaced);
                rec.reason(format!("the response body failed: {e}"));
                rec.finish();
                Some((Err(Box::new(e) as BoxError), self))
            }
        }
    }

    fn count(&self, n: usize) {
        self.meter.add_down(n);
        self.own.add_down(n);
        self.activity.touch();
    }
}

/// A body that logs its request's attempt when it ends.
struct Logged<B> {
    inner: B,
    rec: Option<Recorder>,
}

impl<B: hyper::body::Body<Data = Bytes, Error = BoxError> + Unpin> hyper::body::Body for Logged<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None) => {
                if let Some(rec) = self.rec.take() {
                    rec.finish();
                }
            }
            std::task::Poll::Ready(Some(Err(e))) => {
                if let Some(mut rec) = self.rec.take() {
                    rec.reason(format!("the response body failed: {e}"));
                    rec.finish();
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
