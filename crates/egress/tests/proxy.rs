//! The egress proxy against real sockets on 127.0.0.1: HTTP, TLS and echo
//! upstreams, clients writing raw requests, and a resolver that records
//! every lookup.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use cairn_egress::{AllowedRanges, Attempt, AttemptKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, timeout, Instant};

use support::*;

fn forbidden_head(body: &str) -> String {
    format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
}

/// The fields of a refusal the proxy answered itself.
fn assert_refused(
    a: &Attempt,
    kind: AttemptKind,
    host: &str,
    port: u16,
    status: u16,
    reason: &str,
) {
    assert_eq!(a.kind, kind, "{a:?}");
    assert_eq!(a.host, host, "{a:?}");
    assert_eq!(a.port, port, "{a:?}");
    assert!(!a.allowed, "{a:?}");
    assert_eq!(a.status, Some(status), "{a:?}");
    assert_eq!(a.reason, reason, "{a:?}");
    assert_eq!((a.bytes_up, a.bytes_down), (0, 0), "{a:?}");
}

async fn echo_round(s: &mut tokio::net::TcpStream, data: &[u8]) {
    s.write_all(data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    timeout(WAIT, s.read_exact(&mut back))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(back, data);
}

#[tokio::test]
async fn http_requests_are_forwarded_in_origin_form() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut c = proxy.client().await;
    c.write_all(
        b"GET http://allowed.test/hello?x=1 HTTP/1.1\r\nHost: allowed.test\r\n\
          Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n\
          Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\nTE: trailers\r\n\r\n",
    )
    .await
    .unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "GET /hello?x=1 host=allowed.test body=0");
    assert_eq!(r.header("x-upstream"), Some("yes"));
    assert_eq!(r.header("keep-alive"), None, "hop-by-hop, not passed down");
    let seen = world.seen().pop().unwrap();
    assert_eq!(seen.target, "/hello?x=1");
    assert_eq!(seen.header("host"), Some("allowed.test"));
    assert_eq!(seen.header("x-keep"), Some("2"));
    for gone in [
        "proxy-authorization",
        "proxy-connection",
        "x-drop",
        "te",
        "connection",
    ] {
        assert_eq!(
            seen.header(gone),
            None,
            "{gone} must not reach the upstream"
        );
    }
    let a = proxy.attempt().await;
    assert_eq!(
        a,
        Attempt {
            kind: AttemptKind::Http,
            host: "allowed.test".into(),
            port: 80,
            address: Some(world.http),
            allowed: true,
            rule: Some("allowed.test".into()),
            reason: "allowed by rule allowed.test".into(),
            status: Some(200),
            bytes_up: 0,
            bytes_down: r.body.len() as u64,
            duration_ms: a.duration_ms,
            open: false,
            method: None,
            path: None,
            secrets: Vec::new(),
            scrubbed: 0,
        }
    );

    // Keep-alive: a body with a length, then a chunked one.
    c.write_all(
        b"POST http://allowed.test/upload HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await
    .unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.text(), "POST /upload host=allowed.test body=5");
    let a = proxy.attempt().await;
    assert_eq!((a.bytes_up, a.status), (5, Some(200)));
    c.write_all(
        b"POST http://allowed.test/chunked HTTP/1.1\r\nHost: allowed.test\r\n\
          Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.text(), "POST /chunked host=allowed.test body=7");
    assert_eq!(world.seen().pop().unwrap().body, b"abcdefg");
    assert_eq!(proxy.attempt().await.bytes_up, 7);
    assert_eq!(proxy.lookups(), vec![("allowed.test".to_owned(), 80); 3]);
    drop(c);
    assert!(
        proxy.shutdown().await.is_empty(),
        "each request logged once"
    );
}

#[tokio::test]
async fn http_10_requests_get_a_host_header() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let r = proxy
        .request(b"GET http://allowed.test:80/ten HTTP/1.0\r\n\r\n")
        .await;
    assert_eq!(r.text(), "GET /ten host=allowed.test:80 body=0");
    assert_eq!(proxy.attempt().await.status, Some(200));
}

#[tokio::test]
async fn large_http_bodies_stream_and_are_counted() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut c = proxy.client().await;
    c.write_all(b"GET http://allowed.test/big HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.body.len(), BIG);
    assert_eq!(proxy.attempt().await.bytes_down, BIG as u64);

    let head = format!(
        "PUT http://allowed.test/up HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: {BIG}\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(&vec![b'u'; BIG]).await.unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.text(), format!("PUT /up host=allowed.test body={BIG}"));
    assert_eq!(proxy.attempt().await.bytes_up, BIG as u64);
}

#[tokio::test]
async fn a_keep_alive_request_to_a_denied_host_is_refused() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut c = proxy.client().await;
    c.write_all(b"GET http://allowed.test/one HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut c).await.status, 200);
    assert!(proxy.attempt().await.allowed);

    c.write_all(b"GET http://denied.test/two HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut c).await;
    assert_eq!(r.head, forbidden_head("denied by rule denied.test\n"));
    assert_eq!(r.text(), "denied by rule denied.test\n");
    assert!(
        read_to_close(&mut c).await.is_empty(),
        "closed after a refusal"
    );
    let a = proxy.attempt().await;
    assert_refused(
        &a,
        AttemptKind::Http,
        "denied.test",
        80,
        403,
        "denied by rule denied.test",
    );
    assert_eq!(a.rule.as_deref(), Some("denied.test"));
    assert_eq!(a.address, None);
    assert_eq!(proxy.lookups(), vec![("allowed.test".to_owned(), 80)]);
    assert_eq!(world.seen().len(), 1, "the denied request never left");
}

#[tokio::test]
async fn every_request_on_a_connection_is_checked_on_its_own() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let cases: &[(&str, u16, &str)] = &[
        (
            "GET /origin HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            400,
            "is not an absolute URI",
        ),
        (
            "GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
            400,
            "Host header \"other.test\" does not match request target \"allowed.test:80\"",
        ),
        (
            "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nHost: allowed.test\r\n\r\n",
            400,
            "more than one Host header",
        ),
        (
            "CONNECT echo.test:7000 HTTP/1.1\r\nHost: echo.test:7000\r\n\r\n",
            400,
            "CONNECT is only accepted as the first request on a connection",
        ),
        (
            "GET http://127.0.0.1/ HTTP/1.1\r\n\r\n",
            403,
            "IP literals are not allowed unless a rule names the address (127.0.0.1)",
        ),
        (
            "GET http://allowed.test:8080/ HTTP/1.1\r\n\r\n",
            403,
            "no rule allows it",
        ),
        (
            "GET http://a_b.test/ HTTP/1.1\r\n\r\n",
            400,
            "invalid host \"a_b.test\"",
        ),
    ];
    for (second, status, why) in cases {
        let mut c = proxy.client().await;
        c.write_all(b"GET http://allowed.test/first HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_response(&mut c).await.status, 200, "{second:?}");
        assert!(proxy.attempt().await.allowed);
        c.write_all(second.as_bytes()).await.unwrap();
        let r = read_response(&mut c).await;
        assert_eq!(r.status, *status, "{second:?}: {r:?}");
        assert!(r.text().contains(why), "{second:?}: {}", r.text());
        assert!(read_to_close(&mut c).await.is_empty());
        let a = proxy.attempt().await;
        assert!(!a.allowed);
        assert_eq!(a.status, Some(*status));
        assert_eq!(format!("{}\n", a.reason), r.text());
    }
    assert!(
        proxy
            .lookups()
            .iter()
            .all(|(h, p)| h == "allowed.test" && *p == 80),
        "{:?}",
        proxy.lookups()
    );
    assert_eq!(world.seen().len(), cases.len());
}

#[tokio::test]
async fn connect_with_matching_sni_is_relayed() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let s = proxy.tunnel("tls.test:443").await;
    let mut tls = tls_over(&world.tls_connector(true), "tls.test", s)
        .await
        .unwrap();
    let mut hello = [0u8; 6];
    tls.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello, b"tls-ok");
    tls.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tls.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    tls.shutdown().await.unwrap();
    drop(tls);
    // First the entry written when the bytes started to flow, then the
    // final one.
    let opened = proxy.entry().await;
    assert!(opened.open && opened.allowed && opened.host == "tls.test" && opened.status == Some(200), "{opened:?}");
    assert_eq!((opened.bytes_up, opened.bytes_down), (0, 0));
    let a = proxy.entry().await;
    assert!(!a.open, "{a:?}");
    assert_eq!(a.kind, AttemptKind::Connect);
    assert_eq!((a.host.as_str(), a.port), ("tls.test", 443));
    assert_eq!(a.address, Some(world.tls));
    assert!(a.allowed);
    assert_eq!(a.rule.as_deref(), Some("tls.test"));
    assert_eq!(a.reason, "allowed by rule tls.test");
    assert_eq!(a.status, Some(200));
    assert!(a.bytes_up > 100 && a.bytes_down > 100, "{a:?}");
    assert_eq!(world.snis(), vec!["tls.test"]);
    assert_eq!(proxy.lookups(), vec![("tls.test".to_owned(), 443)]);
}

#[tokio::test]
async fn the_sni_must_name_the_connect_host() {
    let world = World::new().await;
    let mut proxy = world.proxy();

    let s = proxy.tunnel("tls.test:443").await;
    assert!(tls_over(&world.tls_connector(true), "other.test", s)
        .await
        .is_err());
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert_eq!(
        a.reason,
        "SNI other.test does not match CONNECT host tls.test"
    );
    assert_eq!((a.status, a.bytes_up, a.bytes_down), (Some(200), 0, 0));
    assert_eq!(a.address, Some(world.tls));

    let s = proxy.tunnel("tls.test:443").await;
    assert!(tls_over(&world.tls_connector(false), "tls.test", s)
        .await
        .is_err());
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert_eq!(
        a.reason,
        "no SNI in the ClientHello for CONNECT host tls.test"
    );

    assert!(
        world.snis().is_empty(),
        "no refused hello reached the upstream"
    );

    // Control: the right name.
    let s = proxy.tunnel("tls.test:443").await;
    let mut tls = tls_over(&world.tls_connector(true), "tls.test", s)
        .await
        .unwrap();
    let mut ok = [0u8; 6];
    tls.read_exact(&mut ok).await.unwrap();
    assert_eq!(world.snis(), vec!["tls.test"]);
}

#[tokio::test]
async fn port_443_carries_only_tls() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut s = proxy.tunnel("tls.test:443").await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: tls.test\r\n\r\n")
        .await
        .unwrap();
    assert!(read_to_close(&mut s).await.is_empty());
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert!(
        a.reason
            .starts_with("not a TLS ClientHello: record type 71"),
        "{}",
        a.reason
    );

    // A malformed hello is refused as such.
    let mut s = proxy.tunnel("tls.test:443").await;
    s.write_all(&[22, 3, 1, 0, 0]).await.unwrap();
    assert!(read_to_close(&mut s).await.is_empty());
    let a = proxy.attempt().await;
    assert!(
        a.reason.starts_with("malformed TLS ClientHello"),
        "{}",
        a.reason
    );

    // Closing without a word.
    let mut s = proxy.tunnel("tls.test:443").await;
    s.shutdown().await.unwrap();
    assert!(read_to_close(&mut s).await.is_empty());
    let a = proxy.attempt().await;
    assert_eq!(
        a.reason,
        "client closed the tunnel without sending a ClientHello"
    );
    assert!(world.snis().is_empty());
}

#[tokio::test]
async fn tls_on_other_ports_is_checked_and_other_protocols_pass() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let s = proxy.tunnel("tls.test:8443").await;
    let mut tls = tls_over(&world.tls_connector(true), "tls.test", s)
        .await
        .unwrap();
    let mut ok = [0u8; 6];
    tls.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"tls-ok");
    drop(tls);
    assert!(proxy.attempt().await.allowed);

    let s = proxy.tunnel("tls.test:8443").await;
    assert!(tls_over(&world.tls_connector(true), "other.test", s)
        .await
        .is_err());
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert_eq!(
        a.reason,
        "SNI other.test does not match CONNECT host tls.test"
    );

    // Not TLS on a port the policy names: relayed as is.
    let mut s = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut s, b"SSH-2.0-test\r\n").await;
    drop(s);
    let a = proxy.attempt().await;
    assert!(a.allowed);
    assert_eq!((a.bytes_up, a.bytes_down), (14, 14));
    assert_eq!(world.snis(), vec!["tls.test"]);
}

#[tokio::test]
async fn a_client_hello_in_one_byte_writes_is_read() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let s = proxy.tunnel("tls.test:443").await;
    let mut tls = tls_over(&world.tls_connector(true), "tls.test", Trickle::new(s, 400))
        .await
        .unwrap();
    assert!(tls.get_ref().0.writes >= 200, "{}", tls.get_ref().0.writes);
    let mut ok = [0u8; 6];
    tls.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"tls-ok");
    drop(tls);
    assert!(proxy.attempt().await.allowed);
    assert_eq!(world.snis(), vec!["tls.test"]);
}

#[tokio::test]
async fn tunnel_data_sent_with_the_connect_head_is_kept() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut s = proxy.client().await;
    s.write_all(b"CONNECT echo.test:7000 HTTP/1.1\r\nHost: echo.test:7000\r\n\r\nearly bytes")
        .await
        .unwrap();
    assert_eq!(read_response_head(&mut s).await.status, 200);
    let mut back = [0u8; 11];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"early bytes");
    drop(s);
    assert_eq!(proxy.attempt().await.bytes_up, 11);

    // A ClientHello right behind the CONNECT head.
    let mut s = proxy.client().await;
    let mut req = b"CONNECT tls.test:443 HTTP/1.1\r\nHost: tls.test:443\r\n\r\n".to_vec();
    req.extend_from_slice(&client_hello("tls.test"));
    s.write_all(&req).await.unwrap();
    assert_eq!(read_response_head(&mut s).await.status, 200);
    let until = Instant::now() + WAIT;
    while world.snis().is_empty() && Instant::now() < until {
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(world.snis(), vec!["tls.test"]);
    drop(s);
    assert!(proxy.attempt().await.allowed);
}

#[tokio::test]
async fn the_sni_is_normalised_before_it_is_compared() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    for sni in ["TLS.Test", "tls.test."] {
        let mut s = proxy.tunnel("Tls.TEST:443").await;
        s.write_all(&client_hello(sni)).await.unwrap();
        let until = Instant::now() + WAIT;
        while world.snis().is_empty() && Instant::now() < until {
            sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            world.snis().len(),
            1,
            "{sni}: the hello reached the upstream"
        );
        world.snis.lock().unwrap().clear();
        drop(s);
        let a = proxy.attempt().await;
        assert!(a.allowed, "{sni}: {a:?}");
        assert_eq!(a.host, "tls.test");
    }
    // Control: a name that differs only after normalising is still refused.
    let mut s = proxy.tunnel("tls.test:443").await;
    s.write_all(&client_hello("tls.test.other")).await.unwrap();
    assert!(read_to_close(&mut s).await.is_empty());
    assert_eq!(
        proxy.attempt().await.reason,
        "SNI tls.test.other does not match CONNECT host tls.test"
    );
}

#[tokio::test]
async fn an_unfinished_client_hello_times_out() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.handshake_timeout = Duration::from_millis(200));
    let mut s = proxy.tunnel("tls.test:443").await;
    s.write_all(&client_hello("tls.test")[..20]).await.unwrap();
    let started = Instant::now();
    assert!(read_to_close(&mut s).await.is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert_eq!(a.reason, "no ClientHello within 200ms");

    // Nothing at all.
    let mut s = proxy.tunnel("tls.test:443").await;
    assert!(read_to_close(&mut s).await.is_empty());
    assert_eq!(proxy.attempt().await.reason, "no ClientHello within 200ms");
    assert!(world.snis().is_empty());
}

#[tokio::test]
async fn denied_hosts_are_refused_before_any_lookup() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let cases = [
        (
            "denied.test:443",
            "denied by rule denied.test",
            Some("denied.test"),
        ),
        (
            "DENIED.test.:7000",
            "denied by rule denied.test",
            Some("denied.test"),
        ),
        ("nowhere.test:443", "no rule allows it", None),
    ];
    for (target, reason, rule) in cases {
        let (mut s, r) = proxy.connect(target).await;
        let body = format!("{reason}\n");
        assert_eq!(r.head, forbidden_head(&body), "{target}");
        assert_eq!(r.text(), body);
        assert!(read_to_close(&mut s).await.is_empty());
        let a = proxy.attempt().await;
        let (host, port) = target.rsplit_once(':').unwrap();
        let host = host.to_lowercase();
        assert_refused(
            &a,
            AttemptKind::Connect,
            host.trim_end_matches('.'),
            port.parse().unwrap(),
            403,
            reason,
        );
        assert_eq!(a.rule.as_deref(), rule);
        assert_eq!(a.address, None);
    }
    let r = proxy
        .request(b"GET http://denied.test/x HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        .await;
    assert_eq!(r.head, forbidden_head("denied by rule denied.test\n"));
    assert_refused(
        &proxy.attempt().await,
        AttemptKind::Http,
        "denied.test",
        80,
        403,
        "denied by rule denied.test",
    );
    assert!(proxy.lookups().is_empty(), "{:?}", proxy.lookups());

    // Control: an allowed host is looked up.
    let mut s = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut s, b"x").await;
    assert_eq!(proxy.lookups(), vec![("echo.test".to_owned(), 7000)]);
}

#[tokio::test]
async fn ip_literals_are_refused_in_every_spelling_unless_a_rule_names_the_address() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let literals = [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("8.8.8.8", "8.8.8.8"),
    ];
    for (literal, ip) in literals {
        let reason = format!("IP literals are not allowed unless a rule names the address ({ip})");
        let canonical = cairn_egress::Host::address(ip.parse().unwrap()).to_string();
        let (mut s, r) = proxy.connect(&format!("{literal}:443")).await;
        assert_eq!(r.status, 403, "{literal}");
        assert_eq!(r.text(), format!("{reason}\n"));
        assert!(read_to_close(&mut s).await.is_empty());
        assert_refused(
            &proxy.attempt().await,
            AttemptKind::Connect,
            &canonical,
            443,
            403,
            &reason,
        );

        let req = format!("GET http://{literal}/ HTTP/1.1\r\nHost: {literal}\r\n\r\n");
        let r = proxy.request(req.as_bytes()).await;
        assert_eq!(r.status, 403, "{literal}");
        assert_refused(
            &proxy.attempt().await,
            AttemptKind::Http,
            &canonical,
            80,
            403,
            &reason,
        );
    }
    // Unbracketed IPv6 is not even a valid target.
    let (_, r) = proxy.connect("::ffff:127.0.0.1:443").await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("must be in brackets"), "{}", r.text());
    proxy.attempt().await;
    assert!(proxy.lookups().is_empty());
    assert!(world.seen().is_empty());
}

#[tokio::test]
async fn a_rule_naming_an_address_allows_it_without_a_lookup_and_still_screens_it() {
    let world = World::new().await;
    let port = world.http.port();
    let mut proxy = world.proxy();
    proxy.set_policy(&[&format!("127.0.0.1:{port}")], &[]);
    for spelled in ["127.0.0.1", "0x7f.1", "2130706433"] {
        let req = format!("GET http://{spelled}:{port}/x HTTP/1.1\r\nHost: {spelled}:{port}\r\n\r\n");
        let r = proxy.request(req.as_bytes()).await;
        assert_eq!(r.status, 200, "{spelled}: {}", r.text());
        let a = proxy.attempt().await;
        assert!(a.allowed && a.host == "127.0.0.1" && a.rule.as_deref() == Some(&*format!("127.0.0.1:{port}")), "{a:?}");
        assert_eq!(a.address, Some(world.http));
    }
    assert!(proxy.lookups().is_empty(), "an address is not looked up");
    // Another address, or another port of it: refused.
    for target in [format!("127.0.0.2:{port}"), "127.0.0.1:80".to_owned()] {
        let req = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n");
        assert_eq!(proxy.request(req.as_bytes()).await.status, 403, "{target}");
        proxy.attempt().await;
    }
    // Named by a rule, but loopback without allow_private: still refused.
    let mut strict = world.proxy_with(|c| c.allow_private = AllowedRanges::default());
    strict.set_policy(&[&format!("127.0.0.1:{port}")], &[]);
    let req = format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let r = strict.request(req.as_bytes()).await;
    assert_eq!(r.status, 403);
    assert!(r.text().contains("reserved range (loopback)"), "{}", r.text());
    strict.attempt().await;
}

#[tokio::test]
async fn a_tunnel_to_an_address_takes_tls_without_sni_but_not_a_hostname() {
    let world = World::new().await;
    let target = format!("127.0.0.1:{}", world.tls.port());
    let mut proxy = world.proxy();
    proxy.set_policy(&[&target], &[]);
    // TLS clients send no SNI to an address: relayed.
    let s = proxy.tunnel(&target).await;
    let mut tls = tls_over(&world.tls_connector(false), "tls.test", s).await.unwrap();
    let mut hello = [0u8; 6];
    tls.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello, b"tls-ok");
    drop(tls);
    let a = proxy.attempt().await;
    assert!(a.allowed && a.host == "127.0.0.1", "{a:?}");
    // A hostname in the SNI would front for another site: refused.
    let s = proxy.tunnel(&target).await;
    assert!(tls_over(&world.tls_connector(true), "tls.test", s).await.is_err());
    let a = proxy.attempt().await;
    assert!(!a.allowed);
    assert_eq!(a.reason, "SNI tls.test does not match CONNECT address 127.0.0.1");
}

#[tokio::test]
async fn names_resolving_to_reserved_addresses_need_allow_private() {
    let world = World::new().await;
    let mut strict = world.proxy_with(|c| c.allow_private = AllowedRanges::default());
    let why = "127.0.0.1 is in a reserved range (loopback); allow it with [egress] allow_private";
    let r = strict
        .request(b"GET http://private.test/ HTTP/1.1\r\nHost: private.test\r\n\r\n")
        .await;
    assert_eq!(r.head, forbidden_head(&format!("{why}\n")));
    let a = strict.attempt().await;
    assert_refused(&a, AttemptKind::Http, "private.test", 80, 403, why);
    assert_eq!(a.address, Some(world.http));
    assert_eq!(
        a.rule.as_deref(),
        Some("private.test"),
        "the policy allowed it"
    );
    let (_, r) = strict.connect("echo.test:7000").await;
    assert_eq!(r.status, 403);
    assert_eq!(strict.attempt().await.address, Some(world.echo));

    let mut proxy = world.proxy();
    let r = proxy
        .request(b"GET http://ten.test/ HTTP/1.1\r\nHost: ten.test\r\n\r\n")
        .await;
    let why = "10.0.0.1 is in a reserved range (private); allow it with [egress] allow_private";
    assert_eq!(r.text(), format!("{why}\n"));
    let a = proxy.attempt().await;
    assert_eq!(a.reason, why);
    assert_eq!(a.address, Some("10.0.0.1:80".parse().unwrap()));

    // Control: allowed with allow_private = 127.0.0.0/8.
    let r = proxy
        .request(b"GET http://private.test/ HTTP/1.1\r\nHost: private.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    assert!(proxy.attempt().await.allowed);
    // Refused addresses are skipped, an allowed one is used.
    let r = proxy
        .request(b"GET http://mixed.test/ HTTP/1.1\r\nHost: mixed.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(proxy.attempt().await.address, Some(world.http));
}

#[tokio::test]
async fn the_daemon_and_the_proxy_itself_are_never_upstreams() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.own_addrs = vec![world.echo]);
    let (_, r) = proxy.connect("echo.test:7000").await;
    let why = format!("{} is the daemon itself", world.echo);
    assert_eq!(r.head, forbidden_head(&format!("{why}\n")));
    let a = proxy.attempt().await;
    assert_refused(&a, AttemptKind::Connect, "echo.test", 7000, 403, &why);
    assert_eq!(a.address, Some(world.echo));

    let why = format!("{} is this proxy itself", proxy.addr);
    let (_, r) = proxy.connect("self.test:443").await;
    assert_eq!(r.text(), format!("{why}\n"));
    assert_eq!(proxy.attempt().await.reason, why);
    let r = proxy
        .request(b"GET http://self.test/ HTTP/1.1\r\nHost: self.test\r\n\r\n")
        .await;
    assert_eq!(r.text(), format!("{why}\n"));
    assert_eq!(proxy.attempt().await.reason, why);

    // A daemon listening on every address is matched by port.
    let any = SocketAddr::from(([0, 0, 0, 0], world.echo.port()));
    let mut proxy = world.proxy_with(|c| c.own_addrs = vec![any]);
    let (_, r) = proxy.connect("echo.test:7000").await;
    assert_eq!(r.status, 403);
    assert!(proxy
        .attempt()
        .await
        .reason
        .ends_with("is the daemon itself"));

    // Control: the same upstream when it is not the daemon.
    let proxy = world.proxy();
    let mut s = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut s, b"not the daemon").await;
}

#[tokio::test]
async fn ports_outside_the_policy_are_refused() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    for target in ["allowed.test:22", "echo.test:7001", "allowed.test:8443"] {
        let (_, r) = proxy.connect(target).await;
        assert_eq!(r.text(), "no rule allows it\n", "{target}");
        proxy.attempt().await;
    }
    let r = proxy
        .request(b"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n\r\n")
        .await;
    assert_eq!(r.status, 403);
    let a = proxy.attempt().await;
    assert_eq!((a.port, a.reason.as_str()), (8080, "no rule allows it"));
    assert!(proxy.lookups().is_empty());

    // Controls: the ports the rules name.
    let r = proxy
        .request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    let mut s = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut s, b"ok").await;
}

#[tokio::test]
async fn malformed_heads_get_400() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let long = "a".repeat(250) + ".test";
    let absurd = "b".repeat(5000);
    let mut big_header = b"GET http://allowed.test/ HTTP/1.1\r\nX-Big: ".to_vec();
    big_header.extend_from_slice(&vec![b'v'; 17 * 1024]);
    big_header.extend_from_slice(b"\r\n\r\n");
    let cases: Vec<(Vec<u8>, &str, AttemptKind, String, u16)> = vec![
        (
            b"CONNECT allowed.test HTTP/1.1\r\n\r\n".to_vec(),
            "has no port",
            AttemptKind::Connect,
            "allowed.test".into(),
            0,
        ),
        (
            b"CONNECT allowed.test:0 HTTP/1.1\r\n\r\n".to_vec(),
            "port \"0\"",
            AttemptKind::Connect,
            "allowed.test".into(),
            0,
        ),
        (
            b"CONNECT allowed.test:443 HTTP/2.0\r\n\r\n".to_vec(),
            "unsupported HTTP version",
            AttemptKind::Connect,
            "allowed.test".into(),
            443,
        ),
        (
            b"connect allowed.test:443 HTTP/1.1\r\n\r\n".to_vec(),
            "is not an upper-case token",
            AttemptKind::Connect,
            "allowed.test".into(),
            443,
        ),
        (
            b"CONNECT allowed.test:443 HTTP/1.1\r\nNo colon\r\n\r\n".to_vec(),
            "bad header field",
            AttemptKind::Connect,
            "allowed.test".into(),
            443,
        ),
        (
            b"CONNECT allowed.test:443 HTTP/1.1\r\nX: \xff\r\n\r\n".to_vec(),
            "is not UTF-8",
            AttemptKind::Connect,
            "allowed.test".into(),
            443,
        ),
        (
            b"GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n".to_vec(),
            "is not an absolute URI",
            AttemptKind::Http,
            String::new(),
            0,
        ),
        (
            b"GET https://allowed.test/ HTTP/1.1\r\n\r\n".to_vec(),
            "scheme \"https\" not supported",
            AttemptKind::Http,
            "allowed.test".into(),
            80,
        ),
        (
            b"CONNECT user@allowed.test:443 HTTP/1.1\r\n\r\n".to_vec(),
            "userinfo",
            AttemptKind::Connect,
            "user@allowed.test".into(),
            443,
        ),
        (
            b"GET http://user:pw@allowed.test/ HTTP/1.1\r\n\r\n".to_vec(),
            "userinfo",
            AttemptKind::Http,
            "user:pw@allowed.test".into(),
            80,
        ),
        (
            b"CONNECT allowed%2etest:443 HTTP/1.1\r\n\r\n".to_vec(),
            "'%'",
            AttemptKind::Connect,
            "allowed%2etest".into(),
            443,
        ),
        (
            b"CONNECT a_b.test:443 HTTP/1.1\r\n\r\n".to_vec(),
            "invalid host \"a_b.test\"",
            AttemptKind::Connect,
            "a_b.test".into(),
            443,
        ),
        (
            b"CONNECT a..test:443 HTTP/1.1\r\n\r\n".to_vec(),
            "empty label",
            AttemptKind::Connect,
            "a..test".into(),
            443,
        ),
        (
            format!("CONNECT {long}:443 HTTP/1.1\r\n\r\n").into_bytes(),
            "longer than 253 bytes",
            AttemptKind::Connect,
            long.clone(),
            443,
        ),
        (
            format!("CONNECT {absurd}:443 HTTP/1.1\r\n\r\n").into_bytes(),
            "longer than 253 bytes",
            AttemptKind::Connect,
            "b".repeat(300),
            443,
        ),
        (
            "CONNECT bücher.test:443 HTTP/1.1\r\n\r\n"
                .as_bytes()
                .to_vec(),
            "contains byte 0xc3",
            AttemptKind::Connect,
            "bücher.test".into(),
            443,
        ),
        (
            client_hello("tls.test"),
            "contains byte 0x16",
            AttemptKind::Http,
            String::new(),
            0,
        ),
        (
            b"\r\n\r\n".to_vec(),
            "empty request line",
            AttemptKind::Http,
            String::new(),
            0,
        ),
        (
            big_header,
            "request head exceeds 16384 bytes",
            AttemptKind::Http,
            "allowed.test".into(),
            80,
        ),
    ];
    for (raw, why, kind, host, port) in cases {
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(60)]).into_owned();
        let r = proxy.request(&raw).await;
        assert_eq!(r.status, 400, "{shown:?}: {r:?}");
        assert!(r.head.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(r.text().contains(why), "{shown:?}: {}", r.text());
        assert!(r.text().ends_with('\n') && r.text().lines().count() == 1);
        let a = proxy.attempt().await;
        assert_refused(&a, kind, &host, port, 400, r.text().trim_end());
    }
    assert!(proxy.lookups().is_empty(), "{:?}", proxy.lookups());
}

#[tokio::test]
async fn names_are_normalised_before_the_decision() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let r = proxy
        .request(b"GET http://ALLOWED.Test./x HTTP/1.1\r\nHost: ALLOWED.Test.\r\n\r\n")
        .await;
    assert_eq!(r.text(), "GET /x host=ALLOWED.Test. body=0");
    let a = proxy.attempt().await;
    assert_eq!(
        (a.host.as_str(), a.rule.as_deref()),
        ("allowed.test", Some("allowed.test"))
    );

    // The rule was written "Bücher.test"; requests carry punycode.
    let r = proxy
        .request(b"GET http://XN--BCHER-KVA.test/ HTTP/1.1\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    let a = proxy.attempt().await;
    assert_eq!(a.host, "xn--bcher-kva.test");
    assert_eq!(a.rule.as_deref(), Some("xn--bcher-kva.test"));

    let r = proxy
        .request(b"GET http://API.Wild.test/ HTTP/1.1\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(proxy.attempt().await.rule.as_deref(), Some("*.wild.test"));

    let r = proxy
        .request(b"GET http://Denied.TEST./ HTTP/1.1\r\n\r\n")
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(proxy.attempt().await.host, "denied.test");
    assert_eq!(
        proxy.lookups(),
        vec![
            ("allowed.test".to_owned(), 80),
            ("xn--bcher-kva.test".to_owned(), 80),
            ("api.wild.test".to_owned(), 80)
        ]
    );
}

#[tokio::test]
async fn the_host_header_must_agree_with_the_target() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let r = proxy
        .request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.text(),
        "Host header \"denied.test\" does not match request target \"allowed.test:80\"\n"
    );
    assert_eq!(proxy.attempt().await.status, Some(400));
    let r = proxy
        .request(b"CONNECT echo.test:7000 HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.text(), "bad proxy request: more than one Host header\n");
    assert_eq!(proxy.attempt().await.kind, AttemptKind::Connect);
    assert!(proxy.lookups().is_empty());

    // Control: the same host, spelled with its default port.
    let r = proxy
        .request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: Allowed.test:80\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn connections_over_the_limit_get_429() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.max_tunnels = 2);
    let mut first = proxy.tunnel("echo.test:7000").await;
    let mut second = proxy.client().await;
    second
        .write_all(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut second).await.status, 200);
    assert!(proxy.attempt().await.allowed);

    let (mut third, r) = proxy.connect("echo.test:7000").await;
    assert_eq!(
        r.head,
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(r.text(), "more than 2 open connections\n");
    assert!(read_to_close(&mut third).await.is_empty());
    let a = proxy.attempt().await;
    assert_refused(
        &a,
        AttemptKind::Connect,
        "echo.test",
        7000,
        429,
        "more than 2 open connections",
    );
    let r = proxy
        .request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 429);
    assert_eq!(proxy.attempt().await.kind, AttemptKind::Http);
    assert_eq!(proxy.lookups().len(), 2, "refused before any lookup");

    // Closing one frees its place.
    echo_round(&mut first, b"still here").await;
    drop(first);
    assert!(proxy.attempt().await.allowed);
    let until = Instant::now() + WAIT;
    loop {
        let (mut s, r) = proxy.connect("echo.test:7000").await;
        if r.status == 200 {
            echo_round(&mut s, b"back").await;
            break;
        }
        assert_eq!(r.status, 429);
        proxy.attempt().await;
        assert!(Instant::now() < until, "a place never freed up");
        sleep(Duration::from_millis(20)).await;
    }
    drop(second);
}

#[tokio::test]
async fn a_policy_change_cuts_open_tunnels_now_denied() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut echo = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut echo, b"one").await;
    let s = proxy.tunnel("tls.test:443").await;
    let mut tls = tls_over(&world.tls_connector(true), "tls.test", s)
        .await
        .unwrap();
    let mut ok = [0u8; 6];
    tls.read_exact(&mut ok).await.unwrap();

    // A change that still allows both keeps both.
    // (No wait needed: the cut below must name the later deny rule and
    // count the bytes of both rounds, which a cut here would not.)
    proxy.set_policy(&["echo.test:7000", "tls.test", "new.test"], &[]);
    echo_round(&mut echo, b"two").await;
    proxy.quiet().await;

    proxy.set_policy(&["tls.test"], &["echo.test"]);
    assert!(read_to_close(&mut echo).await.is_empty());
    let a = proxy.attempt().await;
    assert_eq!(a.host, "echo.test");
    assert_eq!(a.reason, "policy changed: denied by rule echo.test");
    assert!(a.allowed, "it was relayed before the cut");
    assert_eq!((a.bytes_up, a.bytes_down), (6, 6));
    assert_eq!(
        a.rule.as_deref(),
        Some("echo.test:7000"),
        "the rule that let it in"
    );

    // The TLS tunnel is still allowed and still works.
    tls.write_all(b"after").await.unwrap();
    let mut back = [0u8; 5];
    tls.read_exact(&mut back).await.unwrap();
    proxy.quiet().await;

    proxy.set_policy(&[], &[]);
    let mut rest = Vec::new();
    let _ = timeout(WAIT, tls.read_to_end(&mut rest)).await.unwrap();
    assert_eq!(
        proxy.attempt().await.reason,
        "policy changed: no rule allows it"
    );
}

#[tokio::test]
async fn a_policy_change_cuts_http_requests_in_flight() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut c = proxy.client().await;
    c.write_all(b"GET http://allowed.test/drip HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let r = read_response_head(&mut c).await;
    assert_eq!(r.status, 200);
    assert_eq!(read_line(&mut c).await, "5");
    assert_eq!(read_line(&mut c).await, "first");
    proxy.set_policy(&[], &["allowed.test"]);
    read_to_close(&mut c).await;
    let a = proxy.attempt().await;
    assert_eq!(a.reason, "policy changed: denied by rule allowed.test");
    assert!(a.allowed);
    assert_eq!((a.status, a.bytes_down), (Some(200), 5));

    // Waiting for the response head.
    proxy.set_policy(&["allowed.test"], &[]);
    let mut c = proxy.client().await;
    c.write_all(b"GET http://allowed.test/slow HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let until = Instant::now() + WAIT;
    while !world.seen().iter().any(|s| s.target == "/slow") {
        assert!(Instant::now() < until);
        sleep(Duration::from_millis(10)).await;
    }
    proxy.set_policy(&["other.test"], &[]);
    assert!(read_to_close(&mut c).await.is_empty());
    let a = proxy.attempt().await;
    assert_eq!(a.reason, "policy changed: no rule allows it");
    assert_eq!(a.status, None);
}

#[tokio::test]
async fn idle_tunnels_and_requests_are_cut() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.idle_timeout = Duration::from_millis(300));
    let mut s = proxy.tunnel("echo.test:7000").await;
    // Control: traffic keeps it open past the idle timeout.
    for _ in 0..6 {
        sleep(Duration::from_millis(100)).await;
        echo_round(&mut s, b"tick").await;
    }
    let started = Instant::now();
    assert!(read_to_close(&mut s).await.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
    let a = proxy.attempt().await;
    assert_eq!(a.reason, "idle for 300ms");
    assert!(a.allowed);
    assert_eq!(a.bytes_up, 24);

    let mut c = proxy.client().await;
    c.write_all(b"GET http://allowed.test/drip HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response_head(&mut c).await.status, 200);
    read_to_close(&mut c).await;
    let a = proxy.attempt().await;
    assert_eq!(a.reason, "idle for 300ms");
    assert_eq!(
        (a.kind, a.status, a.bytes_down),
        (AttemptKind::Http, Some(200), 5)
    );
}

#[tokio::test]
async fn tunnels_older_than_max_duration_are_cut() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.max_duration = Duration::from_millis(400));
    let mut s = proxy.tunnel("echo.test:7000").await;
    let started = Instant::now();
    let cut = loop {
        s.write_all(b"busy").await.unwrap();
        let mut back = [0u8; 4];
        match timeout(WAIT, s.read_exact(&mut back)).await.unwrap() {
            Ok(_) => sleep(Duration::from_millis(50)).await,
            Err(_) => break started.elapsed(),
        }
    };
    assert!(
        cut >= Duration::from_millis(300) && cut < Duration::from_secs(3),
        "{cut:?}"
    );
    assert_eq!(proxy.attempt().await.reason, "open longer than 400ms");
}

#[tokio::test]
async fn slow_heads_get_408() {
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.handshake_timeout = Duration::from_millis(200));
    let mut s = proxy.client().await;
    s.write_all(b"CONNECT echo.te").await.unwrap();
    let r = read_response(&mut s).await;
    assert!(r.head.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
    assert_eq!(r.text(), "no complete request head within 200ms\n");
    let a = proxy.attempt().await;
    assert_refused(
        &a,
        AttemptKind::Connect,
        "echo.te",
        0,
        408,
        "no complete request head within 200ms",
    );

    // Silence is timed out too.
    let mut s = proxy.client().await;
    assert_eq!(read_response(&mut s).await.status, 408);
    assert_refused(
        &proxy.attempt().await,
        AttemptKind::Http,
        "",
        0,
        408,
        "no complete request head within 200ms",
    );

    // A connection closed without a word is not an attempt.
    drop(proxy.client().await);
    proxy.quiet().await;
}

#[tokio::test]
async fn lookup_and_connect_failures_get_502() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let (_, r) = proxy.connect("broken.test:443").await;
    assert!(r.head.starts_with("HTTP/1.1 502 Bad Gateway\r\n"));
    assert_eq!(r.text(), "cannot resolve broken.test: lookup exploded\n");
    let a = proxy.attempt().await;
    assert_eq!((a.status, a.address, a.allowed), (Some(502), None, false));

    let (_, r) = proxy.connect("empty.test:443").await;
    assert_eq!(r.text(), "cannot resolve empty.test: no addresses\n");
    proxy.attempt().await;

    let (_, r) = proxy.connect("dead.test:443").await;
    assert_eq!(r.status, 502);
    let prefix = format!("cannot connect to dead.test ({}): ", world.dead);
    assert!(r.text().starts_with(&prefix), "{}", r.text());
    let a = proxy.attempt().await;
    assert_eq!(a.address, Some(world.dead));
    assert!(!a.allowed);

    let r = proxy
        .request(b"GET http://dead.test/ HTTP/1.1\r\nHost: dead.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 502);
    assert_eq!(proxy.attempt().await.status, Some(502));
}

#[tokio::test]
async fn servers_that_speak_first_are_relayed() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut s = proxy.tunnel("greet.test:7001").await;
    let mut banner = [0u8; 15];
    timeout(WAIT, s.read_exact(&mut banner))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&banner, b"220 greetings\r\n");
    echo_round(&mut s, b"hi").await;
    drop(s);
    let a = proxy.attempt().await;
    assert_eq!((a.bytes_up, a.bytes_down), (2, 17));
}

#[tokio::test]
async fn tunnels_relay_large_transfers_both_ways() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let s = proxy.tunnel("echo.test:7000").await;
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let data: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let back = read_to_close(&mut r).await;
    writer.await.unwrap();
    assert_eq!(back.len(), BIG);
    assert!(back.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    let a = proxy.attempt().await;
    assert_eq!((a.bytes_up, a.bytes_down), (BIG as u64, BIG as u64));
    assert_eq!(a.reason, "allowed by rule echo.test:7000");
}

#[tokio::test]
async fn shutdown_closes_every_connection_and_logs_each_once() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut echo = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut echo, b"hello").await;
    let mut gate = proxy.tunnel("tls.test:443").await;
    let mut slow = proxy.client().await;
    slow.write_all(b"GET http://allowed.test/slow HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let mut silent = proxy.client().await;
    let mut half = proxy.client().await;
    half.write_all(b"CONNECT half.test:44").await.unwrap();
    let until = Instant::now() + WAIT;
    while !world.seen().iter().any(|s| s.target == "/slow") {
        assert!(Instant::now() < until);
        sleep(Duration::from_millis(10)).await;
    }
    proxy.quiet().await;
    let addr = proxy.addr;
    let started = Instant::now();
    let mut rest = proxy.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    rest.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    let summary: Vec<_> = rest
        .iter()
        .map(|a| (a.host.as_str(), a.port, a.allowed, a.reason.as_str()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("allowed.test", 80, true, "proxy shut down"),
            ("echo.test", 7000, true, "proxy shut down"),
            ("half.test", 44, false, "proxy shut down"),
            ("tls.test", 443, false, "proxy shut down"),
        ]
    );
    assert_eq!(rest[2].status, None, "no answer to half a head");
    assert_eq!(rest[1].bytes_up, 5);
    for s in [&mut echo, &mut gate, &mut slow, &mut silent, &mut half] {
        assert!(read_to_close(s).await.is_empty());
    }
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn dropping_the_proxy_aborts_everything() {
    let world = World::new().await;
    let mut proxy = world.proxy();
    let mut echo = proxy.tunnel("echo.test:7000").await;
    echo_round(&mut echo, b"x").await;
    drop(proxy.proxy.take());
    assert!(read_to_close(&mut echo).await.is_empty());
    assert_eq!(proxy.attempt().await.reason, "proxy shut down");
    assert!(timeout(WAIT, proxy.log.recv()).await.unwrap().is_none());
}

/// Panics seen on each thread since [`count_panics`] was first called.
static PANICS: std::sync::Mutex<Vec<std::thread::ThreadId>> = std::sync::Mutex::new(Vec::new());

/// Counts panics per thread (then reports them as the default hook does).
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(std::thread::current().id());
            default(info);
        }));
    });
}

fn panics_on(thread: std::thread::ThreadId) -> usize {
    PANICS.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|t| **t == thread).count()
}

#[tokio::test]
async fn hostile_bytes_never_break_the_proxy() {
    // A current-thread runtime: the proxy's connection tasks run here.
    count_panics();
    let world = World::new().await;
    let mut proxy = world.proxy_with(|c| c.handshake_timeout = Duration::from_millis(300));
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let prefixes: [&[u8]; 5] = [
        b"",
        b"CONNECT ",
        b"GET http://",
        b"CONNECT tls.test:443 HTTP/1.1\r\n\r\n",
        b"GET http://allowed.test/ HTTP/1.1\r\n",
    ];
    let mut clients = Vec::new();
    for i in 0..40 {
        let mut raw = prefixes[i % prefixes.len()].to_vec();
        let len = (next() % 3000) as usize;
        raw.extend((0..len).map(|_| next() as u8));
        let mut s = proxy.client().await;
        clients.push(tokio::spawn(async move {
            let _ = s.write_all(&raw).await;
            read_to_close(&mut s).await
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    // Each hostile connection ends in one refusal in the decision log.
    let mut refused = 0;
    while refused < 40 {
        let a = timeout(WAIT, proxy.attempt()).await.expect("a decision for each hostile connection");
        // (A CONNECT is answered 200 before its ClientHello is checked.)
        assert!(!a.allowed && a.bytes_up == 0, "hostile bytes were let through: {a:?}");
        refused += 1;
    }
    // A panic in a connection's task would be swallowed by tokio and the
    // proxy would seem fine: none happened on this test's runtime.
    assert_eq!(panics_on(std::thread::current().id()), 0, "a connection handler panicked");
    let r = proxy
        .request(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await;
    assert_eq!(r.status, 200);
}
