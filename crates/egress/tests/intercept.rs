//! Hosts with request rules and injections: the proxy ends the client's
//! TLS with the task's CA, checks each request, puts secrets in, and takes
//! them out of what comes back. The upstream is a real HTTPS server on
//! loopback with its own CA, echoing what it received (plain, chunked,
//! gzip, br), over HTTP/1.1 or HTTP/2.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_egress::ca::{self, TaskCa};
use cairn_egress::proxy::{upstream_tls, Interception, SecretValues};
use cairn_egress::{AllowedRanges, Attempt, AttemptKind, Policy, ProxyConfig, SystemResolver, TaskProxy};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use support::{read_response, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;

const SECRET: &str = "ghp_s3cr3t-Value_0123456789";
const HOST: &str = "api.example.com";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What the upstream saw: method, target and headers of each request.
type Seen = Arc<Mutex<Vec<(String, String, Vec<(String, String)>)>>>;

/// The upstream's own CA and what its server saw.
struct Upstream {
    addr: SocketAddr,
    ca_pem: String,
    seen: Seen,
}

/// An HTTPS echo server for `names`, its certificate from its own CA;
/// `alpn` is what it offers. Paths: `/gzip`, `/br`, `/zstd` (an encoding
/// the proxy cannot undo), `/drip` (the echo in pieces of 3 bytes), `/forever`.
async fn upstream(names: &[&str], alpn: &[&[u8]], expired: bool) -> Upstream {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "upstream test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let leaf = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], PrivatePkcs8KeyDer::from(key.serialize_der()).into())
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |req| echo(record.clone(), req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    Upstream { addr, ca_pem: ca_cert.pem(), seen }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn echo(seen: Seen, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().to_string();
    let target = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let headers: Vec<(String, String)> = req.headers().iter().map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let auth = req.headers().get("authorization").cloned();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    seen.lock().unwrap().push((method.clone(), target.clone(), headers.clone()));
    let mut text = format!("{method} {target}\n");
    for (n, v) in &headers {
        text.push_str(&format!("{n}: {v}\n"));
    }
    text.push_str(&String::from_utf8_lossy(&body));
    let mut resp = match target.as_str() {
        "/gzip" | "/br" => {
            let raw = std::io::Cursor::new(text.into_bytes());
            let mut out = Vec::new();
            if target == "/gzip" {
                async_compression::tokio::bufread::GzipEncoder::new(raw).read_to_end(&mut out).await.unwrap();
            } else {
                async_compression::tokio::bufread::BrotliEncoder::new(raw).read_to_end(&mut out).await.unwrap();
            }
            let mut r = Response::new(Full::new(Bytes::from(out)).boxed());
            r.headers_mut().insert("content-encoding", target.trim_start_matches('/').parse().unwrap());
            r
        }
        "/zstd" => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"(zstd bytes)")).boxed());
            r.headers_mut().insert("content-encoding", "zstd".parse().unwrap());
            r
        }
        "/drip" => {
            let pieces: Vec<Result<Frame<Bytes>, Infallible>> = text.into_bytes().chunks(3).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
            Response::new(StreamBody::new(futures_util::stream::iter(pieces)).boxed())
        }
        "/forever" => {
            let tick = futures_util::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((Ok(Frame::data(Bytes::from_static(b"tick\n"))), ()))
            });
            Response::new(StreamBody::new(tick).boxed())
        }
        _ => Response::new(Full::new(Bytes::from(text)).boxed()),
    };
    if let Some(a) = auth {
        resp.headers_mut().insert("x-echo-authorization", a);
    }
    Ok(resp)
}

struct Setup {
    proxy: Option<TaskProxy>,
    addr: SocketAddr,
    log: mpsc::UnboundedReceiver<Attempt>,
    ca_pem: String,
    _policy: watch::Sender<Arc<Policy>>,
}

impl Setup {
    /// A proxy whose task allows `HOST` with `requests` and `injections`,
    /// `plain.example.com` without rules, the upstream at `up` for both.
    async fn new(up: &Upstream, requests: &[&str], injections: &[&str], tweak: impl FnOnce(&mut ProxyConfig)) -> Setup {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut config = ProxyConfig {
            allow_private: AllowedRanges::parse(&["127.0.0.0/8"]).unwrap(),
            handshake_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..ProxyConfig::default()
        };
        tweak(&mut config);
        let at = vec![(up.addr.ip(), Some(up.addr.port()))];
        let hosts: HashMap<String, _> = [(HOST.to_owned(), at.clone()), ("plain.example.com".to_owned(), at)].into_iter().collect();
        let policy = Policy::parse(&[HOST, "plain.example.com"], &[]).unwrap().with_requests(requests, injections).unwrap();
        let (policy_tx, policy_rx) = watch::channel(Arc::new(policy));
        let mut values = SecretValues::default();
        values.insert("GITHUB_TOKEN", SECRET.as_bytes().to_vec());
        let (_secrets_tx, secrets) = watch::channel(Arc::new(values));
        std::mem::forget(_secrets_tx);
        let pem = ca::generate("t-test").unwrap();
        let interception = Interception {
            ca: Arc::new(TaskCa::load("t-test", &pem).unwrap()),
            secrets,
            upstream_tls: Arc::new(upstream_tls(Some(up.ca_pem.as_bytes())).unwrap()),
        };
        let (log_tx, log) = mpsc::unbounded_channel();
        let proxy = TaskProxy::start(listener, policy_rx, Arc::new(config), Arc::new(SystemResolver::new(hosts)), log_tx, Some(interception)).unwrap();
        Setup { proxy: Some(proxy), addr, log, ca_pem: pem.cert, _policy: policy_tx }
    }

    async fn tunnel(&self, target: &str) -> TcpStream {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await.unwrap();
        let resp = read_response(&mut s).await;
        assert_eq!(resp.status, 200, "{target}: {resp:?}");
        s
    }

    /// TLS through a tunnel, trusting the PEM certificates `trust`.
    async fn tls(&self, host: &str, trust: &str, alpn: &[u8]) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(trust.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().unwrap().with_root_certificates(roots).with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tunnel = self.tunnel(&format!("{host}:443")).await;
        let name = ServerName::try_from(host.to_owned()).unwrap();
        timeout(WAIT, tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tunnel)).await.expect("TLS in time")
    }

    /// One request through the proxy, the client speaking HTTP/2 or
    /// HTTP/1.1: status, headers and body as text.
    async fn send(&self, alpn: &[u8], req: Request<Full<Bytes>>) -> (u16, http::HeaderMap, String) {
        let tls = self.tls(HOST, &self.ca_pem, alpn).await.unwrap();
        let resp = if alpn == b"h2" {
            let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
            tokio::spawn(conn);
            sender.send_request(req).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
            tokio::spawn(conn);
            sender.send_request(req).await.unwrap()
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = timeout(WAIT, resp.into_body().collect()).await.unwrap().unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    async fn attempt(&mut self) -> Attempt {
        loop {
            let a = timeout(WAIT, self.log.recv()).await.expect("an attempt in time").unwrap();
            if !a.open {
                return a;
            }
        }
    }

    /// The next logged request inside an intercepted tunnel.
    async fn request_entry(&mut self) -> Attempt {
        loop {
            let a = self.attempt().await;
            if a.kind == AttemptKind::Intercepted {
                return a;
            }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        drop(self.proxy.take());
    }
}

fn get(path: &str, alpn: &[u8]) -> Request<Full<Bytes>> {
    let b = Request::get(if alpn == b"h2" { format!("https://{HOST}{path}") } else { path.to_owned() });
    let b = if alpn == b"h2" { b } else { b.header("host", HOST) };
    b.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn a_secret_goes_out_in_the_header_and_never_comes_back() {
    for (client_alpn, upstream_alpn) in [(&b"http/1.1"[..], &[&b"http/1.1"[..]][..]), (b"h2", &[b"h2", b"http/1.1"]), (b"http/1.1", &[b"h2"]), (b"h2", &[b"http/1.1"])] {
        let up = upstream(&[HOST, "plain.example.com"], upstream_alpn, false).await;
        let mut s = Setup::new(&up, &["api.example.com=GET,POST /repos/acme/"], &["api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}"], |_| {}).await;
        for path in ["/repos/acme/x", "/repos/acme/y?page=2"] {
            let path = path.split('?').next().unwrap().to_owned();
            let (status, headers, body) = s.send(client_alpn, get(&path, client_alpn)).await;
            assert_eq!(status, 200, "{body}");
            let seen = up.seen.lock().unwrap().last().cloned().unwrap();
            let auth = seen.2.iter().find(|(n, _)| n == "authorization").map(|(_, v)| v.clone());
            assert_eq!(auth.as_deref(), Some(format!("Bearer {SECRET}").as_str()), "the request arrives with the secret");
            assert!(!body.contains(SECRET), "the echo holds no secret: {body}");
            assert!(body.contains("Bearer $GITHUB_TOKEN"), "the agent sees the placeholder: {body}");
            assert_eq!(headers.get("x-echo-authorization").unwrap(), "Bearer $GITHUB_TOKEN");
            let a = s.request_entry().await;
            assert_eq!((a.host.as_str(), a.method.as_deref(), a.path.as_deref()), (HOST, Some("GET"), Some(path.as_str())));
            assert_eq!(a.secrets, vec!["GITHUB_TOKEN".to_owned()]);
            assert_eq!(a.rule.as_deref(), Some("api.example.com=GET,POST /repos/acme/"));
            assert!(a.allowed && a.status == Some(200) && a.scrubbed >= 2, "{a:?}");
            assert!(!serde_json::to_string(&a).unwrap().contains(SECRET));
        }
    }
}

#[tokio::test]
async fn encoded_and_chunked_echoes_are_scrubbed_and_an_unscannable_one_is_refused() {
    let up = upstream(&[HOST], &[b"http/1.1"], false).await;
    let mut s = Setup::new(&up, &[], &["api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}"], |_| {}).await;
    for path in ["/gzip", "/br", "/drip"] {
        let (status, headers, body) = s.send(b"http/1.1", get(path, b"http/1.1")).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert!(headers.get("content-encoding").is_none(), "{path}: handed on decoded");
        assert!(body.contains("Bearer $GITHUB_TOKEN") && !body.contains(SECRET), "{path}: {body}");
        let seen = up.seen.lock().unwrap().last().cloned().unwrap();
        let ae = seen.2.iter().find(|(n, _)| n == "accept-encoding").map(|(_, v)| v.clone());
        assert_eq!(ae.as_deref(), Some("gzip, deflate, br"), "only encodings the proxy can undo are offered");
        assert!(s.request_entry().await.scrubbed >= 1);
    }
    let (status, _, body) = s.send(b"http/1.1", get("/zstd", b"http/1.1")).await;
    assert_eq!(status, 502);
    assert!(body.contains("\"zstd\"") && body.contains("cannot scan"), "{body}");
    let a = s.request_entry().await;
    assert_eq!(a.status, Some(502));
}

#[tokio::test]
async fn a_placeholder_the_agent_sends_is_replaced_on_the_way_out_only_where_injected() {
    let up = upstream(&[HOST, "plain.example.com"], &[b"http/1.1"], false).await;
    let mut s = Setup::new(&up, &[], &["api.example.com=$GITHUB_TOKEN"], |_| {}).await;
    let req = Request::get("/user?token=$GITHUB_TOKEN").header("host", HOST).header("authorization", "token $GITHUB_TOKEN").body(Full::new(Bytes::new())).unwrap();
    let (status, _, body) = s.send(b"http/1.1", req).await;
    assert_eq!(status, 200);
    let seen = up.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen.1, format!("/user?token={SECRET}"));
    assert!(seen.2.contains(&("authorization".to_owned(), format!("token {SECRET}"))));
    assert!(!body.contains(SECRET) && body.contains("token $GITHUB_TOKEN"), "{body}");
    assert_eq!(s.request_entry().await.secrets, vec!["GITHUB_TOKEN".to_owned()]);
    // A placeholder split across two writes of the head is replaced whole.
    let mut tls = s.tls(HOST, &s.ca_pem, b"http/1.1").await.unwrap();
    tls.write_all(format!("GET /split HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: token $GITH").as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tls.write_all(b"UB_TOKEN\r\nConnection: close\r\n\r\n").await.unwrap();
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 200, "{resp:?}");
    let seen = up.seen.lock().unwrap().last().cloned().unwrap();
    assert!(seen.2.contains(&("authorization".to_owned(), format!("token {SECRET}"))), "{:?}", seen.2);
    assert!(!resp.text().contains(SECRET));
    s.request_entry().await;
    // A host without rules is a plain tunnel: the upstream's own
    // certificate, and the placeholder reaches it as the agent wrote it.
    let tls = s.tls("plain.example.com", &up.ca_pem, b"http/1.1").await.expect("the upstream's own certificate");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get("/user").header("host", "plain.example.com").header("authorization", "token $GITHUB_TOKEN").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
    let seen = up.seen.lock().unwrap().last().cloned().unwrap();
    assert!(seen.2.contains(&("authorization".to_owned(), "token $GITHUB_TOKEN".to_owned())), "never replaced there");
    // The task's CA is not shown for it: a client trusting only that CA fails.
    assert!(s.tls("plain.example.com", &s.ca_pem, b"http/1.1").await.is_err());
}

#[tokio::test]
async fn requests_outside_the_rules_are_refused_naming_the_rule() {
    let up = upstream(&[HOST], &[b"h2", b"http/1.1"], false).await;
    let mut s = Setup::new(&up, &["api.example.com=GET /repos/acme/"], &["api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}"], |_| {}).await;
    for (method, path) in [("POST", "/repos/acme/x"), ("GET", "/repos/other/x"), ("GET", "/repos/acme/../other/x"), ("GET", "/repos/acme/%2e%2e/other")] {
        for alpn in [&b"http/1.1"[..], b"h2"] {
            let before = up.seen.lock().unwrap().len();
            let uri = if alpn == b"h2" { format!("https://{HOST}{path}") } else { path.to_owned() };
            let mut b = Request::builder().method(method).uri(uri);
            if alpn != b"h2" {
                b = b.header("host", HOST);
            }
            let (status, _, body) = s.send(alpn, b.body(Full::new(Bytes::new())).unwrap()).await;
            assert_eq!(status, 403, "{method} {path}: {body}");
            assert!(body.contains("api.example.com=GET /repos/acme/") || body.contains(". or .."), "{body}");
            assert_eq!(up.seen.lock().unwrap().len(), before, "nothing reached the upstream");
            let a = s.request_entry().await;
            assert!(!a.allowed && a.status == Some(403) && a.secrets.is_empty(), "{a:?}");
        }
    }
}

#[tokio::test]
async fn bad_clients_and_bad_upstreams_are_refused_clearly() {
    let up = upstream(&[HOST], &[b"http/1.1"], false).await;
    let mut s = Setup::new(&up, &[], &["api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}"], |c| c.max_duration = Duration::from_secs(2)).await;
    // A client that pins its own CA (here: the upstream's) refuses the task's.
    let e = s.tls(HOST, &up.ca_pem, b"http/1.1").await.unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");
    let a = s.attempt().await;
    assert!(a.reason.contains("TLS from the client failed"), "{a:?}");
    // A client speaking plain HTTP into the tunnel.
    let mut t = s.tunnel(&format!("{HOST}:443")).await;
    t.write_all(format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n").as_bytes()).await.unwrap();
    let resp = read_response(&mut t).await;
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("speak TLS"), "{resp:?}");
    // Smuggling: both framings at once, and a request hidden behind them,
    // in either order: refused with 400, and nothing after it is read.
    for framing in ["Content-Length: 40\r\nTransfer-Encoding: chunked", "Transfer-Encoding: chunked\r\nContent-Length: 40"] {
        let mut tls = s.tls(HOST, &s.ca_pem, b"http/1.1").await.unwrap();
        let smuggled = format!("POST /x HTTP/1.1\r\nHost: {HOST}\r\n{framing}\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
        tls.write_all(smuggled.as_bytes()).await.unwrap();
        let resp = read_response(&mut tls).await;
        assert_eq!(resp.status, 400, "{resp:?}");
        assert!(resp.text().contains("both Content-Length and Transfer-Encoding"), "{resp:?}");
        let rest = support::read_to_close(&mut tls).await;
        assert!(rest.is_empty(), "nothing after: {}", String::from_utf8_lossy(&rest));
        let seen = up.seen.lock().unwrap().clone();
        assert!(seen.iter().all(|(_, t, _)| t != "/smuggled" && t != "/x"), "neither reached the upstream");
        let a = s.request_entry().await;
        assert!(a.status == Some(400) && !a.allowed, "{a:?}");
    }
    // The marker header a client sends itself is no refusal: it is dropped.
    let req = Request::get("/x").header("host", HOST).header("x-cairn-framing-refused", "guess").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(s.send(b"http/1.1", req).await.0, 200);
    let seen = up.seen.lock().unwrap().last().cloned().unwrap();
    assert!(!seen.2.iter().any(|(n, _)| n == "x-cairn-framing-refused"));
    s.request_entry().await;
    // A 10 MB header.
    let mut tls = s.tls(HOST, &s.ca_pem, b"http/1.1").await.unwrap();
    let big = "a".repeat(10 << 20);
    let _ = tls.write_all(format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nX-Big: {big}\r\n\r\n").as_bytes()).await;
    let resp = read_response(&mut tls).await;
    assert_eq!(resp.status, 431, "{resp:?}");
    // A response that never ends is cut at the tunnel's limit.
    let tls = s.tls(HOST, &s.ca_pem, b"http/1.1").await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(get("/forever", b"http/1.1")).await.unwrap();
    let collected = timeout(Duration::from_secs(10), resp.into_body().collect()).await.expect("cut in time");
    assert!(collected.is_err(), "the body ends in an error, not as complete");
    loop {
        let a = s.attempt().await;
        if a.kind == AttemptKind::Connect && a.reason.contains("open longer than") {
            break;
        }
    }
    // An upstream whose certificate is for another name, and one expired.
    for (names, expired, why) in [(&["other.example.com"][..], false, "not valid for name"), (&[HOST][..], true, "expired")] {
        let bad = upstream(names, &[b"http/1.1"], expired).await;
        let mut s = Setup::new(&bad, &[], &["api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}"], |_| {}).await;
        let (status, _, body) = s.send(b"http/1.1", get("/x", b"http/1.1")).await;
        assert_eq!(status, 502, "{body}");
        assert!(body.contains(why), "{body}");
        assert!(bad.seen.lock().unwrap().is_empty(), "no request reached it");
        assert!(s.request_entry().await.reason.contains(why));
    }
}

#[tokio::test]
async fn an_address_for_a_host_with_rules_is_no_way_around_them() {
    let up = upstream(&[HOST], &[b"http/1.1"], false).await;
    let s = Setup::new(&up, &["api.example.com=GET /"], &[], |_| {}).await;
    // The rules belong to the name; its address is no rule's.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let target = up.addr.to_string();
    c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await.unwrap();
    let resp = read_response(&mut c).await;
    assert_eq!(resp.status, 403, "{resp:?}");
    assert!(resp.text().contains("IP literals are not allowed"), "{resp:?}");
}
