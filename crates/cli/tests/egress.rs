//! Egress end to end: real sandboxes whose only way out is the daemon's
//! proxy on 127.0.0.1:3128 inside their network namespace, against HTTP,
//! TLS and TCP echo servers on the host's loopback, which the daemon's
//! test-only config (`[egress.hosts]`, `allow_private`) makes reachable by
//! name. Clients inside the sandbox are the real `curl`, `getent` and
//! Python's socket and ssl modules.
//!
//! The tests of the address checks run the daemon with its default
//! configuration and the real system resolver, in a network and mount
//! namespace of the test's own ([`in_own_network`]): a public address on
//! its `lo`, traps on reserved addresses that count any connection, and a
//! DNS server on its 127.0.0.1:53 that the test's own `/etc/resolv.conf`
//! names, with TTL 0 answers that can change from one query to the next.
//! Nothing of it touches the host's network or files.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{under_gvisor, Daemon};
use serde_json::Value;

/// Upstream servers on the host's loopback, each on its own thread.
struct Upstreams {
    http: u16,
    tls: u16,
    echo: u16,
    /// SNI names the TLS server saw, in order.
    sni_seen: Arc<Mutex<Vec<Option<String>>>>,
}

fn spawn_loop(listener: TcpListener, serve: impl Fn(TcpStream) + Send + Sync + 'static) {
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let serve = serve.clone();
            std::thread::spawn(move || serve(conn));
        }
    });
}

/// Reads a request head; answers with what it asked for.
fn answer_http(mut conn: impl Read + Write, tag: &str) {
    let mut reader = BufReader::new(&mut conn);
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let mut host = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.strip_prefix("Host: ").or_else(|| line.strip_prefix("host: ")) {
            host = v.trim().to_owned();
        }
    }
    let body = format!("{tag} {} host={host}\n", first.split(' ').nth(1).unwrap_or("?"));
    let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    let _ = conn.flush();
}

impl Upstreams {
    fn start() -> Upstreams {
        let http = TcpListener::bind("127.0.0.1:0").unwrap();
        let tls = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let ports = (http.local_addr().unwrap().port(), tls.local_addr().unwrap().port(), echo.local_addr().unwrap().port());
        spawn_loop(http, |conn| answer_http(conn, "plain"));

        let cert = rcgen::generate_simple_self_signed(vec!["tls.test".to_owned()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let config = Arc::new(config);
        let sni_seen = Arc::new(Mutex::new(Vec::new()));
        let seen = sni_seen.clone();
        spawn_loop(tls, move |mut sock| {
            let Ok(mut conn) = rustls::ServerConnection::new(config.clone()) else { return };
            while conn.is_handshaking() {
                if conn.complete_io(&mut sock).is_err() {
                    seen.lock().unwrap().push(conn.server_name().map(str::to_owned));
                    return;
                }
            }
            seen.lock().unwrap().push(conn.server_name().map(str::to_owned));
            answer_http(rustls::StreamOwned::new(conn, sock), "tls");
        });
        spawn_loop(echo, |mut conn| {
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 || conn.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
        Upstreams { http: ports.0, tls: ports.1, echo: ports.2, sni_seen }
    }

    /// A daemon config that maps test names to these servers.
    fn config(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("egress.toml");
        let text = format!(
            r#"
[egress]
allow_private = ["127.0.0.0/8"]
handshake_timeout = "2s"

[egress.hosts]
"web.test" = "127.0.0.1:{http}"
"other.test" = "127.0.0.1:{http}"
"tls.test" = "127.0.0.1:{tls}"
"echo.test" = "127.0.0.1:{echo}"
"internal.test" = "10.20.30.40"
"#,
            http = self.http,
            tls = self.tls,
            echo = self.echo
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

fn start() -> (Daemon, Upstreams, tempfile::TempDir) {
    let up = Upstreams::start();
    let dir = tempfile::tempdir().unwrap();
    let config = up.config(dir.path());
    let d = Daemon::start_with(&["--config", config.to_str().unwrap()]);
    (d, up, dir)
}

fn decisions(d: &Daemon, task: &str) -> Vec<Value> {
    d.json(&["egress", "log", task])["decisions"].as_array().unwrap().clone()
}

/// Waits until the log has a decision matching `pick` (each attempt is
/// written when its connection ends, a moment after the client sees it).
fn decision(d: &Daemon, task: &str, pick: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = decisions(d, task).into_iter().find(|v| pick(v)) {
            return v;
        }
        assert!(Instant::now() < deadline, "no such decision in {:#?}", decisions(d, task));
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// Runs a Python program in the sandbox; returns its stdout.
fn python(d: &Daemon, task: &str, program: &str) -> String {
    let out = d.cairn(&["exec", task, "--", "python3", "-c", program]);
    assert!(out.status.success(), "python failed: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Python client inside the sandbox that opens a CONNECT tunnel and
/// starts TLS with `sni` (None: no SNI) or sends `raw` bytes instead, and
/// prints what happened.
fn tunnel_script(target: &str, sni: Option<&str>, raw: Option<&str>) -> String {
    let sni = sni.map(|s| format!("{s:?}")).unwrap_or("None".into());
    let raw = raw.map(|s| format!("{s:?}")).unwrap_or("None".into());
    format!(
        r#"
import socket, ssl, sys
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(1)
    if not chunk:
        break
    head += chunk
print("proxy:", head.split(b"\r\n")[0].decode())
if not head.startswith(b"HTTP/1.1 200"):
    sys.exit(0)
raw = {raw}
if raw is not None:
    s.sendall(raw.encode())
    # Everything until the other end closes: a reply may come in pieces.
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        print("closed" if got == b"" else "got: %r" % got)
    except Exception as e:
        print("closed:" if got == b"" else "got: %r, then" % got, type(e).__name__)
    sys.exit(0)
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname={sni})
    t.sendall(b"GET /secure HTTP/1.1\r\nHost: tls.test\r\n\r\n")
    data = b""
    while True:
        try:
            chunk = t.recv(200)
        except ssl.SSLEOFError:
            break
        if not chunk:
            break
        data += chunk
    print("tls:", data.decode().splitlines()[-1])
except Exception as e:
    print("closed:", type(e).__name__)
"#
    )
}

#[test]
fn allowed_hosts_work_through_the_proxy_and_everything_else_is_refused_and_logged() {
    let (d, up, _dir) = start();
    let id = d.create(&["--allow", "web.test", "--allow", "tls.test", "--allow", "internal.test", "--allow", &format!("echo.test:{}", 7000)]);
    let env = must(&d, &id, "env | grep -i _proxy | sort");
    for want in ["HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128", "http_proxy=", "https_proxy=", "NO_PROXY=localhost,127.0.0.1"] {
        assert!(env.contains(want), "{want} in {env}");
    }

    // Positive controls: plain HTTP is forwarded, HTTPS goes through CONNECT.
    let out = must(&d, &id, "curl -sS --max-time 10 http://web.test/hello?x=1");
    assert_eq!(out.trim(), format!("plain /hello?x=1 host=web.test"));
    let out = must(&d, &id, "curl -sS -k --max-time 10 https://tls.test/secure");
    assert_eq!(out.trim(), "tls /secure host=tls.test");
    assert!(up.sni_seen.lock().unwrap().contains(&Some("tls.test".to_owned())));
    // Names are normalised before the decision: case and a trailing dot.
    let out = must(&d, &id, "curl -sS --max-time 10 http://WEB.Test./x");
    assert!(out.starts_with("plain /x"), "{out}");

    // A name no rule allows: 403, no lookup (no address in the log). The
    // proxy is named explicitly: NO_PROXY would send 127.0.0.1 direct.
    let code = |url: &str| must(&d, &id, &format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 --noproxy '' -x http://127.0.0.1:3128 '{url}'"));
    assert_eq!(code("http://other.test/"), "403");
    let denied = decision(&d, &id, |v| v["host"] == "other.test");
    assert_eq!((denied["allowed"].as_bool(), denied["address"].is_null()), (Some(false), true), "{denied}");
    assert_eq!(denied["reason"], "no rule allows it");
    // The same through CONNECT.
    let (c, out, _) = d.sh(&id, "curl -sS -k --max-time 10 https://other.test/");
    assert_ne!(c, 0);
    assert!(out.is_empty());
    // A port the rule does not cover.
    assert_eq!(code(&format!("http://web.test:{}/", up.http)), "403");
    // IP literals, whatever their spelling, and whatever they point to.
    for url in ["http://127.0.0.1/", "http://2130706433/", "http://0x7f.1/", "http://127.1/", "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://10.20.30.40/"] {
        assert_eq!(code(url), "403", "{url}");
    }
    let out = python(&d, &id, &tunnel_script("127.0.0.1:443", Some("tls.test"), None));
    assert!(out.contains("proxy: HTTP/1.1 403"), "{out}");
    // ... unless a rule names the address (here a loopback one, which the
    // test config's allow_private lets through): then in any spelling.
    let literal = format!("127.0.0.1:{}", up.http);
    d.ok(&["task", "update", &id, "--allow", &literal]);
    for spelled in [literal.clone(), format!("2130706433:{}", up.http)] {
        let out = must(&d, &id, &format!("curl -sS --max-time 10 --noproxy '' -x http://127.0.0.1:3128 http://{spelled}/ip"));
        assert!(out.starts_with("plain /ip host="), "{spelled}: {out}");
    }
    assert_eq!(code(&format!("http://127.0.0.2:{}/", up.http)), "403", "another address");
    d.ok(&["task", "update", &id, "--deny", &literal]);
    assert_eq!(code(&format!("http://{literal}/")), "403");
    // An allowed name that resolves to a private address.
    assert_eq!(code("http://internal.test/"), "403");
    let private = decision(&d, &id, |v| v["host"] == "internal.test");
    assert!(private["reason"].as_str().unwrap().contains("10.20.30.40"), "{private}");

    // TLS checks on CONNECT to 443: the SNI must name the CONNECT host.
    let out = python(&d, &id, &tunnel_script("tls.test:443", Some("tls.test"), None));
    assert!(out.contains("tls: tls /secure host=tls.test"), "positive control: {out}");
    for (sni, raw, what) in [(Some("other.test"), None, "does not match"), (None, None, "SNI"), (None, Some("GET / HTTP/1.1\r\n\r\n"), "TLS")] {
        let out = python(&d, &id, &tunnel_script("tls.test:443", sni, raw));
        assert!(out.contains("proxy: HTTP/1.1 200") && out.contains("closed"), "{sni:?} {raw:?}: {out}");
        let v = decision(&d, &id, |v| v["host"] == "tls.test" && v["allowed"] == false && v["reason"].as_str().unwrap().contains(what));
        assert_eq!(v["kind"], "connect");
    }

    // No DNS inside the sandbox, and no route for programs that ignore the
    // proxy variables.
    let (c, _, _) = d.sh(&id, "getent hosts example.com");
    assert_ne!(c, 0, "getent must fail");
    let out = must(
        &d,
        &id,
        r#"python3 -c '
import socket
for target, proto in [(("1.1.1.1", 53), socket.SOCK_DGRAM), (("10.0.0.1", 53), socket.SOCK_DGRAM), (("1.1.1.1", 80), socket.SOCK_STREAM)]:
    s = socket.socket(socket.AF_INET, proto)
    try:
        if proto == socket.SOCK_DGRAM:
            s.sendto(b"x", target)
        else:
            s.connect(target)
        print("reached", target)
    except OSError as e:
        print("refused", target, e.errno)
'"#,
    );
    assert!(!out.contains("reached") && out.matches("refused").count() == 3, "{out}");
    // gVisor's network stack answers EHOSTUNREACH where Linux's says
    // ENETUNREACH: no route either way.
    let no_route = if under_gvisor() { libc::EHOSTUNREACH } else { libc::ENETUNREACH };
    assert!(out.contains(&format!(" {no_route}")), "no route: {out}");
    let (c, _, _) = d.sh(&id, "curl -s --noproxy '*' --max-time 5 http://93.184.215.14/");
    assert_eq!(c, 7, "curl without the proxy cannot connect");

    // Every attempt is in the log, with the fields the issue names.
    let all = decisions(&d, &id);
    assert!(all.len() >= 15, "{all:#?}");
    let web = all.iter().find(|v| v["host"] == "web.test" && v["allowed"] == true).unwrap();
    assert_eq!(web["address"], format!("127.0.0.1:{}", up.http));
    assert!(web["bytes_down"].as_u64().unwrap() > 0, "{web}");
    assert!(web["rule"] == "web.test" && web["status"] == 200, "{web}");
    let human = d.ok(&["egress", "log", &id]);
    assert!(human.contains("policy: allow web.test") && human.contains("no rule allows it"), "{human}");
    d.ok(&["destroy", &id]);
}

#[test]
fn a_policy_change_cuts_open_tunnels_and_applies_to_new_connections() {
    let (d, _up, _dir) = start();
    let id = d.create(&["--allow", "echo.test:7000", "--allow", "web.test"]);
    // A tunnel that echoes every 100 ms until it is cut.
    let script = r#"
import socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT echo.test:7000 HTTP/1.1\r\nHost: echo.test:7000\r\n\r\n")
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
print("proxy:", head.split(b"\r\n")[0].decode(), flush=True)
n = 0
while True:
    try:
        s.sendall(b"ping")
        if s.recv(4) != b"ping":
            break
    except OSError:
        break
    n += 1
    time.sleep(0.1)
print("cut after", n, flush=True)
"#;
    let mut child = d.cmd().args(["exec", &id, "--", "python3", "-c", script]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    // Lines read on a thread, so a client that hangs fails the test at a
    // deadline instead of blocking it.
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let next_line = || lines.recv_timeout(Duration::from_secs(30)).expect("the client printed nothing for 30 s");
    assert_eq!(next_line(), "proxy: HTTP/1.1 200 Connection established");
    // An open tunnel is on record before it ends.
    let open = decision(&d, &id, |v| v["host"] == "echo.test" && v["open"] == true);
    assert_eq!((open["allowed"].as_bool(), open["address"].is_string()), (Some(true), true), "{open}");
    assert!(d.ok(&["egress", "log", &id]).contains(" open "), "the human log shows it open");
    let v = d.json(&["task", "update", &id, "--deny", "echo.test"]);
    assert_eq!(v["deny"], serde_json::json!(["echo.test"]));
    let t0 = Instant::now();
    let cut = next_line();
    assert!(cut.starts_with("cut after") && t0.elapsed() < Duration::from_secs(5), "{cut}");
    assert!(child.wait().unwrap().success());
    let v = decision(&d, &id, |v| v["host"] == "echo.test" && v["reason"].as_str().unwrap().contains("policy changed"));
    assert!(v["bytes_up"].as_u64().unwrap() >= 4 && v["bytes_down"].as_u64().unwrap() >= 4, "{v}");
    let log = d.json(&["log", &id]);
    assert!(log.as_array().unwrap().iter().any(|e| e["kind"] == "policy_update"), "the change is in the task's log");

    // New connections follow the new policy; other hosts are untouched.
    let code = |url: &str| must(&d, &id, &format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 '{url}'"));
    assert_eq!(code("http://web.test/"), "200");
    d.ok(&["task", "update", &id, "--deny", "web.test"]);
    assert_eq!(code("http://web.test/"), "403");
    d.ok(&["task", "update", &id, "--allow", "web.test"]);
    assert_eq!(code("http://web.test/"), "200");
    // Clearing every rule takes the task offline: no proxy variables for
    // new commands either.
    d.ok(&["task", "update", &id, "--clear-egress"]);
    let out = must(&d, &id, "curl -s -o /dev/null -w '%{http_code}' --max-time 10 -x http://127.0.0.1:3128 http://web.test/");
    assert_eq!(out, "403");
    let (_, env, _) = d.sh(&id, "env | grep -ci _proxy");
    assert_eq!(env.trim(), "0");
    d.ok(&["destroy", &id]);
}

#[test]
fn an_offline_task_reaches_nothing_and_the_proxy_survives_restarts_and_wakes() {
    let (mut d, _up, _dir) = start();
    let offline = d.create(&[]);
    let (_, env, _) = d.sh(&offline, "env | grep -ci _proxy");
    assert_eq!(env.trim(), "0", "no proxy variables without an allowlist");
    let out = must(&d, &offline, "curl -s -o /dev/null -w '%{http_code}' --max-time 10 -x http://127.0.0.1:3128 http://web.test/");
    assert_eq!(out, "403");
    assert_eq!(decision(&d, &offline, |v| v["host"] == "web.test")["reason"], "no rule allows it");

    // A daemon killed and restarted serves the surviving sandbox's proxy
    // again (the init hands its listening socket over once more).
    let online = d.create(&["--allow", "web.test"]);
    assert!(must(&d, &online, "curl -sS --max-time 10 http://web.test/a").starts_with("plain /a"));
    // Decisions are written a moment after their connection ends (in
    // batches): wait for this one before the kill.
    decision(&d, &online, |v| v["host"] == "web.test");
    d.kill();
    d.spawn(&["--config", _dir.path().join("egress.toml").to_str().unwrap()]);
    assert!(must(&d, &online, "curl -sS --max-time 10 http://web.test/b").starts_with("plain /b"));
    // A suspended task wakes into a fresh sandbox with a fresh proxy.
    d.ok(&["suspend", &online]);
    d.wait_for_state(&online, "suspended", Duration::from_secs(30));
    assert!(must(&d, &online, "curl -sS --max-time 10 http://web.test/c").starts_with("plain /c"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while decisions(&d, &online).iter().filter(|v| v["allowed"] == true).count() < 3 {
        assert!(Instant::now() < deadline, "{:#?}", decisions(&d, &online));
        std::thread::sleep(Duration::from_millis(50));
    }
    d.ok(&["destroy", &online]);
    d.ok(&["destroy", &offline]);
}

#[test]
fn invalid_rules_and_config_are_refused_with_one_line() {
    let (d, _up, _dir) = start();
    for bad in ["*", "*x.com", "a.*.com", "example.com:0", "example.com:65536", "example.com:http", "*.127.0.0.1", "exa mple.com", "a@b.com"] {
        let err = d.fails(&["task", "create", "--allow", bad]);
        assert!(err.contains(bad) || err.contains("invalid"), "{bad}: {err}");
    }
    assert_eq!(d.json(&["task", "list"]).as_array().unwrap().len(), 0, "no task was created");
    let id = d.create(&["--allow", "web.test"]);
    let err = d.fails(&["task", "update", &id, "--allow", "*.com"]);
    assert!(err.contains("*.com"), "{err}");
    let err = d.fails(&["task", "update", &id]);
    assert!(err.contains("nothing to update"), "{err}");
    assert_eq!(d.task(&id)["config"]["egress"]["allow"], serde_json::json!(["web.test"]), "unchanged");
    let err = d.fails(&["task", "update", "nosuchtask", "--allow", "a.com"]);
    assert!(err.contains("nosuchtask"), "{err}");
    d.ok(&["destroy", &id]);

    // A daemon config with a bad egress entry does not start.
    for (toml, want) in [
        ("[egress]\nallow_private = [\"10.0.0.0/33\"]\n", "allow_private"),
        ("[egress]\nallow = [\"*\"]\n", "egress"),
        ("[egress.hosts]\n\"x.test\" = \"not-an-ip\"\n", "not-an-ip"),
        ("[egress]\nidle_timeout = \"0s\"\n", "idle_timeout"),
    ] {
        let path = _dir.path().join("bad.toml");
        std::fs::write(&path, toml).unwrap();
        let out = common::run(d.cmd().args(["serve", "--listen", "127.0.0.1:0", "--config", path.to_str().unwrap()])).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{toml}: {err}");
    }
}

#[test]
fn the_operator_exceptions_are_printed_at_start_up() {
    let (d, _up, _dir) = start();
    let log = d.log();
    assert!(log.contains("egress: reserved ranges allowed: 127.0.0.0/8"), "{log}");
    assert!(log.contains("egress: web.test resolves to 127.0.0.1:"), "{log}");
}

// --- the real resolver, in a network of the test's own ---

/// A public address (in no reserved range) that only the test's own
/// network namespace has, on its `lo`.
const PUBLIC: Ipv4Addr = Ipv4Addr::new(93, 184, 215, 14);

/// A TCP server on its own thread: counts connections, serves each with
/// `serve`. Stopped and joined when dropped.
struct Server {
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(addr: SocketAddr, serve: impl Fn(TcpStream) + Send + 'static) -> Server {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        listener.set_nonblocking(true).unwrap();
        let (hits, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        h.fetch_add(1, Ordering::SeqCst);
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                        serve(conn);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Server { hits, stop, thread: Some(thread) }
    }

    /// An HTTP server answering `{tag} {path} host={host}`.
    fn http(addr: SocketAddr, tag: &'static str) -> Server {
        Server::start(addr, move |conn| answer_http(conn, tag))
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Each name with the answer sets its A queries get in turn.
type Zone = Vec<(String, Vec<Vec<Ipv4Addr>>)>;

/// A DNS server on UDP 127.0.0.1:53 with TTL 0 answers. Each name has a
/// list of answer sets for A queries, handed out in turn, one per query
/// (so a name can resolve to one address and then to another); AAAA
/// queries get no data, unknown names NXDOMAIN. Every query is recorded.
struct Dns {
    zone: Arc<Mutex<Zone>>,
    queries: Arc<Mutex<Vec<(String, u16)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Dns {
    fn start() -> Dns {
        let socket = UdpSocket::bind("127.0.0.1:53").unwrap_or_else(|e| panic!("bind 127.0.0.1:53 in the test's network: {e}"));
        socket.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let zone: Arc<Mutex<Zone>> = Arc::default();
        let queries: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (z, q, s) = (zone.clone(), queries.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !s.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else { continue };
                if let Some(reply) = dns_reply(&buf[..n], &z, &q) {
                    let _ = socket.send_to(&reply, from);
                }
            }
        });
        Dns { zone, queries, stop, thread: Some(thread) }
    }

    fn set(&self, name: &str, answers: &[&[Ipv4Addr]]) {
        let mut zone = self.zone.lock().unwrap();
        zone.retain(|(n, _)| n != name);
        zone.push((name.to_owned(), answers.iter().map(|a| a.to_vec()).collect()));
    }

    /// How many A queries for `name` were answered.
    fn a_queries(&self, name: &str) -> usize {
        self.queries.lock().unwrap().iter().filter(|(n, t)| n == name && *t == 1).count()
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The answer to one DNS query (RFC 1035 wire format), or `None` for
/// something that is not a single-question query.
fn dns_reply(query: &[u8], zone: &Mutex<Zone>, log: &Mutex<Vec<(String, u16)>>) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || query[4..6] != [0, 1] {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let n = usize::from(*query.get(i)?);
        i += 1;
        if n == 0 {
            break;
        }
        if n & 0xc0 != 0 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(i..i + n)?).to_ascii_lowercase());
        i += n;
    }
    let qtype = u16::from_be_bytes([*query.get(i)?, *query.get(i + 1)?]);
    let question = query.get(12..i + 4)?;
    let name = labels.join(".");
    let (rcode, addrs) = {
        let zone = zone.lock().unwrap();
        let mut log = log.lock().unwrap();
        let asked = log.iter().filter(|(n, t)| *n == name && *t == qtype).count();
        log.push((name.clone(), qtype));
        match zone.iter().find(|(n, _)| *n == name) {
            None => (3, Vec::new()),
            Some((_, sets)) if qtype == 1 && !sets.is_empty() => (0, sets[asked % sets.len()].clone()),
            Some(_) => (0, Vec::new()),
        }
    };
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&query[..2]);
    // QR, AA and the query's RD; RA and the rcode.
    out.extend_from_slice(&[0x84 | (query[2] & 0x01), 0x80 | rcode, 0, 1]);
    out.extend_from_slice(&u16::try_from(addrs.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(question);
    for a in addrs {
        // A pointer to the question's name, A, IN, TTL 0, four bytes.
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        out.extend_from_slice(&a.octets());
    }
    Some(out)
}

/// Runs `test` on a thread of its own in a new network namespace and a new
/// mount namespace (mounts reach it from the host, nothing of it reaches
/// the host). The network has only `lo`, with 127.0.0.1, ::1, [`PUBLIC`],
/// 10.0.0.1 and 169.254.169.254; the resolver configuration is the test's
/// own: `/etc/hosts` names only `localhost`, `/etc/nsswitch.conf` says
/// `files dns` and `/etc/resolv.conf` points at 127.0.0.1, where [`Dns`]
/// can answer. A daemon started inside resolves through the real system
/// resolver (getaddrinfo), and everything the test starts, the daemon
/// first, is dropped inside; the namespaces end with the thread.
fn in_own_network(test: impl FnOnce() + Send + 'static) {
    common::require_root();
    let ip = ["/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"].into_iter().find(|p| std::path::Path::new(p).exists());
    let ip = ip.unwrap_or_else(|| panic!("`ip` is missing on the host: install iproute2 (apt-get install -y iproute2)"));
    let thread = std::thread::spawn(move || {
        // SAFETY: unshare on the calling thread only; a thread may take a
        // mount and a network namespace of its own.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) }, 0, "unshare: {}", std::io::Error::last_os_error());
        let root = c"/";
        // SAFETY: valid C strings; changes propagation in this namespace.
        let rc = unsafe { libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) };
        assert_eq!(rc, 0, "make / a slave: {}", std::io::Error::last_os_error());
        let etc = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("hosts", "127.0.0.1 localhost\n::1 localhost\n"),
            ("nsswitch.conf", "hosts: files dns\n"),
            ("resolv.conf", "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n"),
        ] {
            let (src, dst) = (etc.path().join(name), format!("/etc/{name}"));
            std::fs::write(&src, text).unwrap();
            let (src_c, dst_c) = (std::ffi::CString::new(src.to_str().unwrap()).unwrap(), std::ffi::CString::new(dst.as_str()).unwrap());
            // SAFETY: valid C strings; a bind mount in this namespace only.
            let rc = unsafe { libc::mount(src_c.as_ptr(), dst_c.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
            assert_eq!(rc, 0, "bind {} over {dst}: {}", src.display(), std::io::Error::last_os_error());
        }
        // A host's name service cache would answer from the host's
        // configuration: hide its socket.
        let nscd = std::path::Path::new("/run/nscd");
        if nscd.is_dir() {
            let empty = std::ffi::CString::new(etc.path().to_str().unwrap()).unwrap();
            // SAFETY: valid C strings; a bind mount in this namespace only.
            let rc = unsafe { libc::mount(empty.as_ptr(), c"/run/nscd".as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
            assert_eq!(rc, 0, "hide /run/nscd: {}", std::io::Error::last_os_error());
        }
        let run = |args: &[&str]| {
            let out = common::run(Command::new(ip).args(args)).unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["link", "set", "lo", "up"]);
        for addr in [PUBLIC, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(169, 254, 169, 254)] {
            run(&["addr", "add", &format!("{addr}/32"), "dev", "lo"]);
        }
        test();
        drop(etc);
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Servers of the test's network: [`PUBLIC`]:80 answers, and a trap on
/// port 80 of each reserved address counts any connection that reaches it.
struct Upstream {
    public: Server,
    traps: Vec<(SocketAddr, Server)>,
}

impl Upstream {
    fn start() -> Upstream {
        let public = Server::http(SocketAddr::from((PUBLIC, 80)), "public");
        let traps = ["127.0.0.1:80", "[::1]:80", "10.0.0.1:80", "169.254.169.254:80"]
            .into_iter()
            .map(|a| {
                let a: SocketAddr = a.parse().unwrap();
                (a, Server::http(a, "trap"))
            })
            .collect();
        Upstream { public, traps }
    }

    /// Every trap must be untouched.
    fn assert_traps_untouched(&self) {
        for (addr, trap) in &self.traps {
            assert_eq!(trap.hits(), 0, "the proxy connected to {addr}");
        }
    }
}

/// `curl` through the proxy (named explicitly: NO_PROXY would send
/// localhost and 127.0.0.1 direct): the status and the body.
fn via_proxy(d: &Daemon, task: &str, url: &str) -> (String, String) {
    let out = must(d, task, &format!("curl -s -w '\\n%{{http_code}}' --max-time 10 --noproxy '' -x http://127.0.0.1:3128 '{url}'"));
    let (body, code) = out.rsplit_once('\n').unwrap_or_else(|| panic!("{out:?}"));
    (code.to_owned(), body.trim_end().to_owned())
}

/// The decisions `pick` matches, once there are `n` of them (and exactly
/// `n`), in the order they were logged.
fn decisions_for(d: &Daemon, task: &str, pick: impl Fn(&Value) -> bool, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all: Vec<Value> = decisions(d, task).into_iter().filter(|v| pick(v)).collect();
        if all.len() >= n {
            assert_eq!(all.len(), n, "{all:#?}");
            return all;
        }
        assert!(Instant::now() < deadline, "{n} such decisions wanted: {:#?}", decisions(d, task));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the decision log says of a refused address: its exact reason.
fn reserved(ip: IpAddr, range: &str) -> String {
    format!("{} is in a reserved range ({range}); allow it with [egress] allow_private", ip.to_canonical())
}

#[test]
fn a_name_rebound_to_a_private_address_is_refused_when_it_resolves_there() {
    in_own_network(|| {
        let up = Upstream::start();
        let dns = Dns::start();
        let private = Ipv4Addr::new(10, 0, 0, 1);
        // Public, then private, then public again...: one answer per query.
        let name = "rebind.example.com";
        dns.set(name, &[&[PUBLIC], &[private]]);
        let d = Daemon::start();
        let id = d.create(&["--allow", name]);

        // Query 1 (public): forwarded, from exactly the address checked.
        let (code, body) = via_proxy(&d, &id, &format!("http://{name}/first"));
        assert_eq!((code.as_str(), body.as_str()), ("200", "public /first host=rebind.example.com"));
        // Query 2 (private): refused before any connection.
        let (code, body) = via_proxy(&d, &id, &format!("http://{name}/second"));
        assert_eq!(code, "403", "{body}");
        // Query 3 (public) through CONNECT, query 4 (private) likewise.
        let raw = Some("GET /third HTTP/1.1\r\nHost: rebind.example.com\r\n\r\n");
        let out = python(&d, &id, &tunnel_script(&format!("{name}:80"), None, raw));
        assert!(out.starts_with("proxy: HTTP/1.1 200") && out.contains("public /third host=rebind.example.com"), "{out}");
        let out = python(&d, &id, &tunnel_script(&format!("{name}:80"), None, raw));
        assert!(out.starts_with("proxy: HTTP/1.1 403"), "{out}");

        // (An open tunnel's interim entry aside: each attempt ends in one.)
        let log = decisions_for(&d, &id, |v| v["host"] == name && v["open"] != true, 4);
        let public = format!("{PUBLIC}:80");
        for (v, kind, allowed) in [(&log[0], "http", true), (&log[1], "http", false), (&log[2], "connect", true), (&log[3], "connect", false)] {
            assert_eq!((v["kind"].as_str(), v["allowed"].as_bool(), v["rule"].as_str()), (Some(kind), Some(allowed), Some(name)), "{v}");
            if allowed {
                assert_eq!((v["address"].as_str(), v["status"].as_u64()), (Some(public.as_str()), Some(200)), "{v}");
            } else {
                assert_eq!((v["address"].as_str(), v["status"].as_u64()), (Some("10.0.0.1:80"), Some(403)), "{v}");
                assert_eq!(v["reason"], reserved(private.into(), "private"), "{v}");
                assert_eq!((v["bytes_up"].as_u64(), v["bytes_down"].as_u64()), (Some(0), Some(0)), "{v}");
            }
        }
        // One lookup per attempt, each used as checked: the private
        // address was never connected to, the public one twice.
        assert_eq!(dns.a_queries(name), 4, "{:?}", dns.queries.lock().unwrap());
        assert_eq!(up.public.hits(), 2);
        up.assert_traps_untouched();
        d.ok(&["destroy", &id]);
    });
}

#[test]
fn loopback_private_and_link_local_addresses_are_refused_by_default() {
    in_own_network(|| {
        let up = Upstream::start();
        let dns = Dns::start();
        let ok = "www.example.com";
        dns.set(ok, &[&[PUBLIC]]);
        dns.set("loopback.example.com", &[&[Ipv4Addr::LOCALHOST]]);
        dns.set("intranet.example.com", &[&[Ipv4Addr::new(10, 0, 0, 1)]]);
        dns.set("metadata.example.com", &[&[Ipv4Addr::new(169, 254, 169, 254)]]);
        dns.set("mixed.example.com", &[&[Ipv4Addr::new(10, 0, 0, 1), PUBLIC]]);
        // The daemon's default configuration: no reserved range allowed.
        let d = Daemon::start();
        let names = ["localhost", "loopback.example.com", "intranet.example.com", "metadata.example.com"];
        let literals = ["127.0.0.1", "10.0.0.1", "[::1]", "169.254.169.254"];
        let mut args = vec!["--allow", ok, "--allow", "mixed.example.com"];
        for r in names.iter().chain(&literals) {
            args.extend(["--allow", r]);
        }
        let id = d.create(&args);

        let control = |n: usize| {
            let (code, body) = via_proxy(&d, &id, &format!("http://{ok}/control"));
            assert_eq!((code.as_str(), body.as_str()), ("200", "public /control host=www.example.com"));
            assert_eq!(up.public.hits(), n, "the allowed upstream was reached");
        };
        control(1);
        let mut n = 1;
        for host in names.iter().chain(&literals) {
            let (code, body) = via_proxy(&d, &id, &format!("http://{host}/"));
            assert_eq!(code, "403", "{host}: {body}");
            let v = decisions_for(&d, &id, |v| v["host"] == *host, 1).remove(0);
            let address: SocketAddr = v["address"].as_str().unwrap_or_else(|| panic!("{v}")).parse().unwrap();
            let (v4, v6): (IpAddr, IpAddr) = (Ipv4Addr::LOCALHOST.into(), std::net::Ipv6Addr::LOCALHOST.into());
            let (want, range): (IpAddr, &str) = match *host {
                // The test's /etc/hosts gives localhost both; the first
                // the lookup returns is the one refused.
                "localhost" if address.ip() == v6 => (v6, "loopback"),
                "localhost" | "loopback.example.com" | "127.0.0.1" => (v4, "loopback"),
                "intranet.example.com" | "10.0.0.1" => (Ipv4Addr::new(10, 0, 0, 1).into(), "private"),
                "metadata.example.com" | "169.254.169.254" => (Ipv4Addr::new(169, 254, 169, 254).into(), "link-local"),
                "[::1]" => (v6, "loopback"),
                other => unreachable!("{other}"),
            };
            assert_eq!(address, SocketAddr::new(want, 80), "{host}: {v}");
            assert_eq!((v["allowed"].as_bool(), v["status"].as_u64(), v["rule"].as_str()), (Some(false), Some(403), Some(*host)), "{v}");
            assert_eq!(v["reason"], reserved(want, range), "{v}");
            // Paired control: the allowed upstream still works.
            n += 1;
            control(n);
        }
        // A name with a private and a public address: only the public one
        // is used.
        let (code, body) = via_proxy(&d, &id, "http://mixed.example.com/m");
        assert_eq!((code.as_str(), body.as_str()), ("200", "public /m host=mixed.example.com"));
        let v = decisions_for(&d, &id, |v| v["host"] == "mixed.example.com", 1).remove(0);
        assert_eq!((v["allowed"].as_bool(), v["address"].as_str()), (Some(true), Some(format!("{PUBLIC}:80").as_str())), "{v}");
        up.assert_traps_untouched();
        assert!(dns.a_queries("loopback.example.com") >= 1, "the daemon asked the test's DNS server");
        d.ok(&["destroy", &id]);
    });
}

#[test]
fn the_daemon_s_own_api_port_is_refused_through_the_proxy() {
    in_own_network(|| {
        // Loopback allowed, so that only the own-socket check can refuse.
        let up = Server::http("127.0.0.1:8080".parse().unwrap(), "loopback");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("egress.toml");
        std::fs::write(&config, "[egress]\nallow_private = [\"127.0.0.0/8\"]\n[egress.hosts]\n\"api.test\" = \"127.0.0.1\"\n").unwrap();
        let d = Daemon::start_with(&["--config", config.to_str().unwrap()]);
        let port: u16 = d.url.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).unwrap_or_else(|| panic!("{}", d.url));
        // Control: the API answers on that port (here without a token).
        let mut api = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(api, "GET /v1/tasks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut head = String::new();
        BufReader::new(api).read_line(&mut head).unwrap();
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");

        let rules = [format!("127.0.0.1:{port}"), format!("api.test:{port}"), format!("localhost:{port}"), "127.0.0.1:8080".to_owned(), "127.0.0.1:3128".to_owned()];
        let mut args = Vec::new();
        for r in &rules {
            args.extend(["--allow", r.as_str()]);
        }
        let id = d.create(&args);
        let control = |n: usize| {
            let (code, body) = via_proxy(&d, &id, "http://127.0.0.1:8080/control");
            assert_eq!((code.as_str(), body.as_str()), ("200", "loopback /control host=127.0.0.1:8080"));
            assert_eq!(up.hits(), n);
        };
        control(1);
        for (i, host) in ["127.0.0.1", "api.test", "localhost"].into_iter().enumerate() {
            let (code, body) = via_proxy(&d, &id, &format!("http://{host}:{port}/v1/tasks"));
            assert_eq!(code, "403", "{host}: {body}");
            let v = decisions_for(&d, &id, |v| v["host"] == host && v["port"] == port, 1).remove(0);
            let address = v["address"].as_str().unwrap_or_else(|| panic!("{v}")).to_owned();
            assert!(address == format!("127.0.0.1:{port}") || address == format!("[::1]:{port}"), "{v}");
            assert_eq!((v["allowed"].as_bool(), v["status"].as_u64()), (Some(false), Some(403)), "{v}");
            assert_eq!(v["reason"], format!("{address} is the daemon itself"), "{v}");
            control(i + 2);
        }
        // A tunnel to it, and to the proxy's own port.
        let out = python(&d, &id, &tunnel_script(&format!("127.0.0.1:{port}"), None, Some("GET / HTTP/1.1\r\n\r\n")));
        assert!(out.starts_with("proxy: HTTP/1.1 403"), "{out}");
        let tunnels: Vec<Value> = decisions_for(&d, &id, |v| v["host"] == "127.0.0.1" && v["port"] == port, 2).into_iter().filter(|v| v["kind"] == "connect").collect();
        assert_eq!(tunnels.len(), 1, "{tunnels:#?}");
        assert_eq!(tunnels[0]["reason"], format!("127.0.0.1:{port} is the daemon itself"));
        let (code, _) = via_proxy(&d, &id, "http://127.0.0.1:3128/");
        assert_eq!(code, "403");
        let v = decision(&d, &id, |v| v["address"] == "127.0.0.1:3128");
        assert_eq!((v["allowed"].as_bool(), v["reason"].as_str()), (Some(false), Some("127.0.0.1:3128 is this proxy itself")), "{v}");
        control(5);
        d.ok(&["destroy", &id]);
    });
}
