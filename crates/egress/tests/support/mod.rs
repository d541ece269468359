//! Upstream servers, a recording resolver and raw clients for the proxy
//! tests. Everything listens on 127.0.0.1 ephemeral ports; the proxy's name
//! map points the test names at them.

#![allow(clippy::unwrap_used, dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use cairn_egress::{
    AllowedRanges, Attempt, Host, Policy, ProxyConfig, Resolver, SystemResolver, TaskProxy,
};
use futures_util::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{timeout, Sleep};
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

/// Longest wait for anything that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(5);

pub const BIG: usize = 1 << 20;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What the HTTP upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The upstreams every test can reach through the proxy.
pub struct World {
    pub http: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub tls: SocketAddr,
    /// The SNI of every ClientHello the TLS upstream received.
    pub snis: Arc<Mutex<Vec<String>>>,
    pub cert: CertificateDer<'static>,
    pub echo: SocketAddr,
    /// Speaks first: sends a banner, then echoes.
    pub greet: SocketAddr,
    /// Nothing listens there.
    pub dead: SocketAddr,
}

impl World {
    pub async fn new() -> World {
        let (http, seen) = http_upstream().await;
        let (tls, snis, cert) = tls_upstream().await;
        let echo = echo_upstream(None).await;
        let greet = echo_upstream(Some(b"220 greetings\r\n")).await;
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        World {
            http,
            seen,
            tls,
            snis,
            cert,
            echo,
            greet,
            dead,
        }
    }

    /// The name map: each test name to an upstream (its port replacing the
    /// requested one).
    pub fn hosts(&self, proxy: SocketAddr) -> HashMap<String, Vec<(IpAddr, Option<u16>)>> {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let at = |a: SocketAddr| vec![(a.ip(), Some(a.port()))];
        let mut m = HashMap::new();
        for name in [
            "allowed.test",
            "xn--bcher-kva.test",
            "api.wild.test",
            "private.test",
            "denied.test",
            "other.test",
        ] {
            m.insert(name.to_owned(), at(self.http));
        }
        m.insert("tls.test".into(), at(self.tls));
        m.insert("echo.test".into(), at(self.echo));
        m.insert("greet.test".into(), at(self.greet));
        m.insert("dead.test".into(), at(self.dead));
        m.insert("self.test".into(), at(proxy));
        m.insert("empty.test".into(), vec![]);
        m.insert("ten.test".into(), vec![("10.0.0.1".parse().unwrap(), None)]);
        m.insert(
            "mixed.test".into(),
            vec![
                ("10.0.0.1".parse().unwrap(), Some(self.http.port())),
                ("169.254.169.254".parse().unwrap(), Some(self.http.port())),
                (lo, Some(self.http.port())),
            ],
        );
        m
    }

    /// A proxy with the test policy, the name map, 127.0.0.0/8 allowed and
    /// short handshake and connect timeouts; `tweak` adjusts the config.
    pub fn proxy_with(&self, tweak: impl FnOnce(&mut ProxyConfig)) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = ProxyConfig {
            allow_private: AllowedRanges::parse(&["127.0.0.0/8"]).unwrap(),
            handshake_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..ProxyConfig::default()
        };
        tweak(&mut config);
        let resolver = Arc::new(Recording {
            inner: SystemResolver::new(self.hosts(addr)),
            calls: Mutex::default(),
        });
        let (policy, policy_rx) = watch::channel(Arc::new(test_policy()));
        let (log_tx, log) = mpsc::unbounded_channel();
        let proxy = TaskProxy::start(
            listener,
            policy_rx,
            Arc::new(config),
            resolver.clone(),
            log_tx,
            None,
        )
        .unwrap();
        assert_eq!(proxy.local_addr(), addr);
        Proxy {
            proxy: Some(proxy),
            addr,
            log,
            policy,
            resolver,
        }
    }

    pub fn proxy(&self) -> Proxy {
        self.proxy_with(|_| {})
    }

    pub fn tls_connector(&self, sni: bool) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.enable_sni = sni;
        TlsConnector::from(Arc::new(config))
    }

    pub fn snis(&self) -> Vec<String> {
        self.snis.lock().unwrap().clone()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

pub fn test_policy() -> Policy {
    Policy::parse(
        &[
            "allowed.test",
            "Bücher.test",
            "*.wild.test",
            "tls.test",
            "tls.test:8443",
            "echo.test:7000",
            "greet.test:7001",
            "private.test",
            "ten.test",
            "mixed.test",
            "dead.test",
            "empty.test",
            "broken.test",
            "self.test",
            "denied.test",
        ],
        &["denied.test"],
    )
    .unwrap()
}

/// The resolver double: the real one, recording every call; `broken.test`
/// fails.
pub struct Recording {
    inner: SystemResolver,
    calls: Mutex<Vec<(String, u16)>>,
}

impl Resolver for Recording {
    fn resolve(&self, host: &Host, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        self.calls
            .lock()
            .unwrap()
            .push((host.as_str().to_owned(), port));
        if host.as_str() == "broken.test" {
            return Box::pin(async { Err(io::Error::other("lookup exploded")) });
        }
        self.inner.resolve(host, port)
    }
}

pub struct Proxy {
    pub proxy: Option<TaskProxy>,
    pub addr: SocketAddr,
    pub log: mpsc::UnboundedReceiver<Attempt>,
    pub policy: watch::Sender<Arc<Policy>>,
    pub resolver: Arc<Recording>,
}

impl Proxy {
    pub async fn client(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// The next logged attempt.
    /// The next final entry (a tunnel's "open" entries are skipped; see
    /// [`Proxy::entry`]).
    pub async fn attempt(&mut self) -> Attempt {
        loop {
            let a = self.entry().await;
            if !a.open {
                return a;
            }
        }
    }

    /// The next entry, "open" ones included.
    pub async fn entry(&mut self) -> Attempt {
        timeout(WAIT, self.log.recv())
            .await
            .expect("an attempt is logged in time")
            .expect("the log is open")
    }

    /// Asserts no final entry is logged for a moment (a tunnel's "open"
    /// entry may be).
    pub async fn quiet(&mut self) {
        while let Ok(Some(a)) = timeout(Duration::from_millis(150), self.log.recv()).await {
            assert!(a.open, "unexpected attempt {a:?}");
        }
    }

    pub fn lookups(&self) -> Vec<(String, u16)> {
        self.resolver.calls.lock().unwrap().clone()
    }

    pub fn set_policy(&self, allow: &[&str], deny: &[&str]) {
        self.policy
            .send(Arc::new(Policy::parse(allow, deny).unwrap()))
            .unwrap();
    }

    /// Shuts the proxy down and returns every final entry still to be
    /// logged; the log is closed afterwards, so nothing is logged twice.
    pub async fn shutdown(mut self) -> Vec<Attempt> {
        let proxy = self.proxy.take().unwrap();
        timeout(WAIT, proxy.shutdown())
            .await
            .expect("shutdown in time");
        let mut rest = Vec::new();
        while let Some(a) = timeout(WAIT, self.log.recv())
            .await
            .expect("the log closes after shutdown")
        {
            if !a.open {
                rest.push(a);
            }
        }
        rest
    }

    /// One request on a new connection; the response.
    pub async fn request(&self, raw: &[u8]) -> Resp {
        let mut s = self.client().await;
        s.write_all(raw).await.unwrap();
        read_response(&mut s).await
    }

    /// `CONNECT target` on a new connection: the stream and the response.
    pub async fn connect(&self, target: &str) -> (TcpStream, Resp) {
        let mut s = self.client().await;
        let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let resp = read_response(&mut s).await;
        (s, resp)
    }

    /// A tunnel that must be established.
    pub async fn tunnel(&self, target: &str) -> TcpStream {
        let (s, resp) = self.connect(target).await;
        assert_eq!(resp.status, 200, "{target}: {resp:?}");
        assert_eq!(resp.head, "HTTP/1.1 200 Connection established\r\n\r\n");
        s
    }
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub head: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response: the head byte by byte (so no tunnel bytes are
/// consumed), then a `Content-Length` or chunked body, if any.
pub async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> Resp {
    timeout(WAIT, async {
        let mut resp = read_response_head(s).await;
        if let Some(len) = resp.header("content-length") {
            resp.body.resize(len.parse().unwrap(), 0);
            s.read_exact(&mut resp.body).await.unwrap();
        } else if resp
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            loop {
                let line = read_line(s).await;
                let size = usize::from_str_radix(line.trim(), 16).unwrap();
                let mut chunk = vec![0u8; size + 2];
                s.read_exact(&mut chunk).await.unwrap();
                if size == 0 {
                    break;
                }
                resp.body.extend_from_slice(&chunk[..size]);
            }
        }
        resp
    })
    .await
    .expect("a response in time")
}

/// Reads a response head only.
pub async fn read_response_head<S: AsyncRead + Unpin>(s: &mut S) -> Resp {
    timeout(WAIT, async {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = s.read(&mut b).await.unwrap();
            assert!(
                n == 1,
                "connection closed inside a response head: {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(b[0]);
        }
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut slots);
        parsed.parse(&head).unwrap();
        let status = parsed.code.unwrap();
        let headers = parsed
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        Resp {
            head: String::from_utf8(head).unwrap(),
            status,
            headers,
            body: Vec::new(),
        }
    })
    .await
    .expect("a response head in time")
}

/// One CRLF-terminated line, without the CRLF.
pub async fn read_line<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut line = Vec::new();
    while !line.ends_with(b"\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        line.push(b[0]);
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).unwrap()
}

/// Reads until the peer closes (or resets); what arrived before.
pub async fn read_to_close<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match timeout(WAIT, s.read(&mut buf))
            .await
            .expect("the connection closes in time")
        {
            Ok(0) | Err(_) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
}

/// An HTTP/1.1 server that answers with what it saw. Paths: `/big` (1 MiB
/// body), `/slow` (answers after 30 s), `/drip` (one chunk, then nothing).
async fn http_upstream() -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(record.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

async fn answer(
    record: Arc<Mutex<Vec<Seen>>>,
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let method = req.method().to_string();
    let target = req.uri().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let host = req
        .headers()
        .get("host")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
    let summary = format!("{method} {target} host={host} body={}", body.len());
    record.lock().unwrap().push(Seen {
        method,
        target: target.clone(),
        headers,
        body,
    });
    let body = match target.as_str() {
        "/big" => Full::new(Bytes::from(vec![b'x'; BIG])).boxed(),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Full::new(Bytes::from("slow")).boxed()
        }
        "/drip" => {
            let first = futures_util::stream::once(async {
                Ok::<_, Infallible>(Frame::data(Bytes::from("first")))
            });
            let stream = futures_util::StreamExt::chain(first, futures_util::stream::pending());
            StreamBody::new(stream).boxed()
        }
        _ => Full::new(Bytes::from(summary)).boxed(),
    };
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert("x-upstream", "yes".parse().unwrap());
    resp.headers_mut()
        .insert("keep-alive", "timeout=5".parse().unwrap());
    Ok(resp)
}

/// A TLS server for `tls.test` (self-signed): records each ClientHello's
/// SNI, then completes the handshake, says `tls-ok` and echoes.
async fn tls_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>, CertificateDer<'static>) {
    let key = rcgen::generate_simple_self_signed(vec!["tls.test".to_owned()]).unwrap();
    let cert = key.cert.der().clone();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.clone()],
            PrivatePkcs8KeyDer::from(key.key_pair.serialize_der()).into(),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let snis = Arc::new(Mutex::new(Vec::new()));
    let record = snis.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (record, config) = (record.clone(), config.clone());
            tokio::spawn(async move {
                let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
                let Ok(start) = acceptor.await else {
                    return;
                };
                let sni = start
                    .client_hello()
                    .server_name()
                    .unwrap_or("<none>")
                    .to_owned();
                record.lock().unwrap().push(sni);
                let Ok(mut tls) = start.into_stream(config).await else {
                    return;
                };
                if tls.write_all(b"tls-ok").await.is_err() {
                    return;
                }
                let mut buf = [0u8; 4096];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, snis, cert)
}

/// Echoes until the client half-closes, then closes; `banner` is sent
/// first.
async fn echo_upstream(banner: Option<&'static [u8]>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Some(b) = banner {
                    if stream.write_all(b).await.is_err() {
                        return;
                    }
                }
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// TLS over `stream` to `name` (also the SNI unless the connector has it
/// off).
pub async fn tls_over<S>(
    connector: &TlsConnector,
    name: &str,
    stream: S,
) -> io::Result<tokio_rustls::client::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(name.to_owned()).unwrap();
    timeout(WAIT, connector.connect(name, stream))
        .await
        .expect("the TLS handshake ends in time")
}

/// A ClientHello as rustls writes it, for tests that send it by hand.
pub fn client_hello(sni: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Writes the first `slow` bytes one at a time with a pause between them,
/// so the reader sees many small pieces; the rest goes through as is.
pub struct Trickle<S> {
    inner: S,
    slow: usize,
    pause: Pin<Box<Sleep>>,
    pub writes: usize,
}

impl<S> Trickle<S> {
    pub fn new(inner: S, slow: usize) -> Self {
        Trickle {
            inner,
            slow,
            pause: Box::pin(tokio::time::sleep(Duration::ZERO)),
            writes: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Trickle<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Trickle<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.slow == 0 || buf.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.pause.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, &buf[..1]);
        if let Poll::Ready(Ok(n)) = polled {
            this.slow -= n;
            this.writes += 1;
            let next = tokio::time::Instant::now() + Duration::from_millis(1);
            this.pause.as_mut().reset(next);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
