//! Egress end to end: real sandboxes whose only way out is the daemon's
//! proxy on 127.0.0.1:3128 inside their network namespace, against HTTP,
//! TLS and TCP echo servers on the host's loopback, which the daemon's
//! test-only config (`[egress.hosts]`, `allow_private`) makes reachable by
//! name. Clients inside the sandbox are the real `curl`, `getent` and
//! Python's socket and ssl modules.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Daemon;
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
    try:
        got = s.recv(100)
        print("closed" if got == b"" else "got: %r" % got)
    except Exception as e:
        print("closed:", type(e).__name__)
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
    assert!(out.contains(&format!(" {}", libc::ENETUNREACH)), "no route: {out}");
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
        let out = d.cmd().args(["serve", "--listen", "127.0.0.1:0", "--config", path.to_str().unwrap()]).output().unwrap();
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
