//! A task's ports through the daemon: an HTTP server and a WebSocket echo
//! inside a task, reached by path and by host name, with each way in (API
//! token, traffic token, signed link and its cookie) and each refusal
//! (none, a forged or expired link, a port nobody listens on, a port out
//! of range); a request whose body comes late and an answer larger than a
//! socket's buffer, each whole. The sandbox stays offline throughout.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Daemon;
use futures_util::{SinkExt, StreamExt};

/// A WebSocket echo server in Python's standard library, for the sandbox.
const WS_ECHO: &str = include_str!("e2b/ws_echo.py");

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "{script}: {err}");
    out
}

/// A GET with `headers`: its status, `Set-Cookie` and body.
struct Http {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Http {
    fn new() -> Http {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Http { rt, client }
    }

    fn get(&self, url: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
        self.rt.block_on(async {
            let mut req = self.client.get(url);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let r = req.send().await.unwrap();
            let cookie = r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_owned());
            (r.status().as_u16(), cookie, r.text().await.unwrap())
        })
    }
}

#[test]
fn a_tasks_http_and_websocket_ports_are_reached_through_the_daemon_and_only_with_a_credential() {
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned();
    let t = d.create(&[]);
    must(&d, &t, "mkdir -p /workspace/www && printf 'hello from inside' > /workspace/www/index.html");
    must(&d, &t, "cd /workspace/www && setsid python3 -m http.server 8000 >/dev/null 2>&1 < /dev/null &");
    must(&d, &t, &format!("cat > /workspace/ws.py <<'EOF'\n{WS_ECHO}\nEOF\nsetsid python3 /workspace/ws.py >/dev/null 2>&1 < /dev/null &"));
    must(&d, &t, "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000)); socket.create_connection((\"127.0.0.1\", 8765))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1");
    let page = format!("{}/v1/tasks/{t}/ports/8000/index.html", d.url);
    let c = Http::new();
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];

    // Refused without a credential; the API token, control.
    let (status, _, body) = c.get(&page, &[]);
    assert_eq!(status, 401);
    assert!(body.contains("signed link"), "names the ways in: {body}");
    assert_eq!(c.get(&page, &auth), (200, None, "hello from inside".to_owned()));
    assert_eq!(c.get(&page, &[("Authorization", "Bearer wrong")]).0, 401);

    // The traffic token and a signed link (whose cookie serves the next
    // request); a forged and an expired link are refused.
    let link = d.json(&["port", &t, "8000"]);
    let traffic = link["traffic_token"].as_str().unwrap();
    assert_eq!(c.get(&page, &[("X-Cairn-Traffic-Token", traffic)]).0, 200);
    assert_eq!(c.get(&page, &[("X-Cairn-Traffic-Token", &"0".repeat(64))]).0, 401);
    let url = link["url"].as_str().unwrap();
    let (status, cookie, _) = c.get(url, &[]);
    assert_eq!(status, 200);
    let cookie = cookie.expect("a cookie for the port's path").split(';').next().unwrap().to_owned();
    assert_eq!(c.get(&page, &[("Cookie", &cookie)]).0, 200);
    assert_eq!(c.get(&url.replace("sig=", "sig=x"), &[]).0, 401, "a forged link");
    let short = d.json(&["port", &t, "8000", "--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(c.get(short["url"].as_str().unwrap(), &[]).0, 401, "an expired link");

    // By host name, as E2B's get_host(port) gives it.
    let host = format!("8000-{t}.sandbox.example.com");
    assert_eq!(c.get(&format!("{}/index.html", d.url), &[("Host", &host), auth[0]]).2, "hello from inside");
    assert_eq!(c.get(&format!("{}/index.html", d.url), &[("Host", &host)]).0, 401, "by host name, a credential too");

    // Refusals in one line: nobody listens, out of range.
    let (status, _, body) = c.get(&format!("{}/v1/tasks/{t}/ports/9/", d.url), &auth);
    assert_eq!(status, 503);
    assert!(body.contains("nothing listens") && !body.trim().contains('\n'), "{body}");
    assert_eq!(c.get(&format!("{}/v1/tasks/{t}/ports/70000/", d.url), &auth).0, 400);
    assert_eq!(c.get(&format!("{}/v1/tasks/{t}/ports/3128/", d.url), &auth).0, 503, "the egress proxy's port is not the task's");
    assert_eq!(c.get(&format!("{}/v1/tasks/tnosuchtask/ports/8000/", d.url), &auth).0, 404);

    // A WebSocket through the daemon.
    let echoed = c.rt.block_on(async {
        let ws_url = format!("{}/v1/tasks/{t}/ports/8765/", d.url.replace("http://", "ws://"));
        let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(ws_url.as_str()).unwrap();
        req.headers_mut().insert("X-Cairn-Traffic-Token", traffic.parse().unwrap());
        let upgrade = tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::connect_async(req)).await.expect("the WebSocket upgrade is answered");
        let (mut ws, _) = upgrade.expect("the WebSocket upgrade goes through");
        ws.send(tokio_tungstenite::tungstenite::Message::text("ping")).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap().unwrap().unwrap();
        got.into_text().unwrap().to_string()
    });
    assert_eq!(echoed, "echo: ping");

    // Still offline, and every request is counted and logged.
    let (code, _, _) = d.sh(&t, "python3 -c 'import socket; socket.create_connection((\"93.184.216.34\", 80), timeout=2)'");
    assert_ne!(code, 0, "the sandbox has no way out");
    let log = d.json(&["log", &t]);
    let ports: Vec<&serde_json::Value> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "port").collect();
    assert!(ports.len() >= 5, "{ports:?}");
    assert!(ports.iter().all(|e| !e["args"]["path"].as_str().unwrap_or("").contains("sig=")), "a link's signature is never logged");
    let metrics = c.get(&format!("{}/metrics", d.url), &auth).2;
    let counted: f64 = metrics.lines().find(|l| l.starts_with("cairn_port_requests_total")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(counted >= 5.0, "{counted}");
    d.ok(&["destroy", &t]);
}

/// A server that answers with the port of the connection it came on, and
/// keeps connections open (HTTP/1.1) unless asked to close one.
const PEER_PORT: &str = r#"
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = str(self.client_address[1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", 8001), H).serve_forever()
"#;

#[test]
fn connections_to_a_port_are_kept_for_the_next_request_and_replaced_when_closed() {
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned();
    let t = d.create(&[]);
    must(&d, &t, &format!("cat > /workspace/peer.py <<'EOF'\n{PEER_PORT}\nEOF\nsetsid python3 /workspace/peer.py >/dev/null 2>&1 < /dev/null &"));
    must(&d, &t, "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8001))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1");
    let c = Http::new();
    let bearer = format!("Bearer {token}");
    let auth = [("Authorization", bearer.as_str())];
    let url = |path: &str| format!("{}/v1/tasks/{t}/ports/8001{path}", d.url);
    let first = c.get(&url("/"), &auth);
    let second = c.get(&url("/"), &auth);
    assert_eq!((first.0, second.0), (200, 200));
    if common::under_gvisor() {
        assert_ne!(first.2, second.2, "a gvisor port's relay is never kept (a checkpoint could not save it)");
    } else {
        assert_eq!(first.2, second.2, "the second request came on the first one's connection");
    }
    // The server closes it: the next request gets a new connection.
    let closing = c.get(&url("/close"), &auth);
    assert_eq!(closing.0, 200);
    let third = c.get(&url("/"), &auth);
    assert_eq!(third.0, 200);
    assert_ne!(third.2, closing.2, "a new connection after the server closed the kept one");
    // A request with a body never rides a kept connection, and is answered.
    let posted = c.rt.block_on(async { c.client.post(url("/")).header("Authorization", &bearer).body("x").send().await.unwrap().status().as_u16() });
    assert_eq!(posted, 501, "http.server has no POST: its own answer, relayed");
    // After a suspend the kept connection is dead: the request wakes the task.
    d.ok(&["suspend", &t]);
    let (after, _, after_body) = c.get(&url("/"), &auth);
    if common::under_gvisor() {
        assert_eq!(after, 200, "the server survived the suspend with its memory (gvisor): a new connection reaches it: {after_body}");
    } else {
        assert_eq!(after, 503, "the server did not survive the suspend (native): refused, not hung");
    }
    assert_eq!(d.state(&t), "running", "the request woke the task");
    d.ok(&["destroy", &t]);
}

/// A server that answers `GET /big` with [`BIG`] bytes and a `POST` with
/// its body, read to its end.
const LATE_AND_LARGE: &str = r#"
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.answer(b"x" * (4 << 20))
    def do_POST(self):
        self.answer(self.rfile.read(int(self.headers["Content-Length"])))
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", 8002), H).serve_forever()
"#;

/// The size of the large answer: many times a socket's buffer.
const BIG: usize = 4 << 20;

#[test]
fn a_request_whose_body_comes_late_and_a_large_answer_go_through_whole() {
    use std::io::{Read, Write};
    let d = Daemon::start();
    let token = std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned();
    let t = d.create(&[]);
    must(&d, &t, &format!("cat > /workspace/late.py <<'EOF'\n{LATE_AND_LARGE}\nEOF\nsetsid python3 /workspace/late.py >/dev/null 2>&1 < /dev/null &"));
    must(&d, &t, "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8002))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1");
    let addr = d.url.trim_start_matches("http://").to_owned();
    let c = Http::new();
    // Several times each: under gvisor each request has a relay of its own.
    for i in 0..4 {
        // The body follows the head after a pause: the connection to the
        // port must wait for it, not end.
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!("POST /v1/tasks/{t}/ports/8002/echo HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Length: 11\r\nConnection: close\r\n\r\n");
        conn.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        conn.write_all(b"late body ").unwrap();
        conn.write_all(i.to_string().as_bytes()).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with(&format!("\r\n\r\nlate body {i}")), "{answer}");

        // A large answer: the sandbox's side outruns the reader.
        let (status, _, body) = c.get(&format!("{}/v1/tasks/{t}/ports/8002/big", d.url), &[("Authorization", &format!("Bearer {token}"))]);
        assert_eq!((status, body.len()), (200, BIG), "the whole answer");
    }
    d.ok(&["destroy", &t]);
}
