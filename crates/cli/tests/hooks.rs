//! Notifications out (`cairn hooks`), against a receiver on loopback: every
//! event a hook takes arrives once, in the order of the task's log, signed
//! (checked here with HMAC-SHA256 as the Standard Webhooks spec writes it,
//! not with the daemon's code); a receiver that is down gets them when it
//! comes back, also across a SIGKILL of the daemon; a notification past
//! its time is given up and shown as failed; E2B's format; bad input.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine as _;
use common::Daemon;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One request the receiver answered with a 2xx.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or_else(|| panic!("no header {name}: {:?}", self.headers))
    }
}

/// An HTTP/1.1 receiver on 127.0.0.1: answers every request with the
/// status set (200 unless told otherwise), keeps the ones it answered
/// with a 2xx and counts the others.
struct Receiver {
    port: u16,
    status: Arc<AtomicU16>,
    got: Arc<Mutex<Vec<Received>>>,
    refused: Arc<AtomicUsize>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(AtomicU16::new(200));
        let got = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicUsize::new(0));
        let (s, g, r) = (status.clone(), got.clone(), refused.clone());
        // The thread ends with the test binary; each connection is short.
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, g, r) = (s.clone(), g.clone(), r.clone());
                std::thread::spawn(move || serve(conn, &s, &g, &r));
            }
        });
        Receiver { port, status, got, refused }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Waits (at most 30 s) until `done` holds for what arrived.
    fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.got();
            if done(&got) {
                return got;
            }
            assert!(Instant::now() < deadline, "{what}: not there after 30 s; got {:?}", got.iter().map(|r| r.json()["type"].clone()).collect::<Vec<_>>());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn serve(conn: TcpStream, status: &AtomicU16, got: &Mutex<Vec<Received>>, refused: &AtomicUsize) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let len: usize = headers.get("content-length").map_or(0, |l| l.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    let code = status.load(Ordering::SeqCst);
    if (200..300).contains(&code) {
        got.lock().unwrap().push(Received { path, headers, body });
    } else {
        refused.fetch_add(1, Ordering::SeqCst);
    }
    let mut conn = conn;
    let _ = write!(conn, "HTTP/1.1 {code} X\r\ncontent-length: 8\r\nconnection: close\r\n\r\nreceived");
}

/// Checks a Standard Webhooks signature: `v1,` and base64 of HMAC-SHA256
/// over `{id}.{timestamp}.{body}` under the base64 key after `whsec_`.
fn assert_signed(r: &Received, secret: &str) {
    let key = STANDARD.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", r.header("webhook-id"), r.header("webhook-timestamp")).as_bytes());
    mac.update(&r.body);
    let want = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    assert_eq!(r.header("webhook-signature"), want, "signature of {}", String::from_utf8_lossy(&r.body));
    let ts: i64 = r.header("webhook-timestamp").parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - ts).abs() < 300, "timestamp {ts} is now");
}

/// The types the standard format sends for a task's log, in its order:
/// what the receiver must get, once each.
fn expected_types(d: &Daemon, task: &str) -> Vec<(u64, String)> {
    let map: BTreeMap<&str, &str> = [
        ("create", "task.created"),
        ("wait", "task.waiting"),
        ("wake", "task.woken"),
        ("suspend", "task.suspended"),
        ("rollback", "task.rolled_back"),
        ("exec", "task.command_finished"),
        ("snapshot", "task.snapshotted"),
        ("delivery", "task.delivered"),
        ("sandbox_lost", "task.failed"),
        ("complete", "task.completed"),
        ("destroy", "task.destroyed"),
    ]
    .into_iter()
    .collect();
    d.json(&["log", task])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| map.get(e["kind"].as_str().unwrap()).map(|t| (e["seq"].as_u64().unwrap(), (*t).to_owned())))
        .collect()
}

/// What arrived for `task`: (seq, type), in arrival order.
fn arrived(got: &[Received], task: &str) -> Vec<(u64, String)> {
    got.iter()
        .map(Received::json)
        .filter(|v| v["data"]["task"]["id"] == task)
        .map(|v| (v["data"]["event"]["seq"].as_u64().unwrap(), v["type"].as_str().unwrap().to_owned()))
        .collect()
}

fn add_hook(d: &Daemon, args: &[&str]) -> (String, String) {
    let mut a = vec!["hooks", "add"];
    a.extend_from_slice(args);
    let v = d.json(&a);
    (v["hook"]["id"].as_str().unwrap().to_owned(), v["secret"].as_str().unwrap().to_owned())
}

#[test]
fn every_event_arrives_once_in_order_signed_with_what_an_approver_needs() {
    let d = Daemon::start();
    let rx = Receiver::start();
    let (hook, secret) = add_hook(&d, &[&rx.url("/cairn")]);
    assert!(secret.starts_with("whsec_"), "{secret}");
    let listed = d.json(&["hooks", "list"]);
    assert_eq!(listed[0]["id"], hook.as_str());
    assert!(listed[0].get("secret").is_none() && !listed.to_string().contains(&secret), "no listing holds the secret: {listed}");

    let id = d.create(&["--name", "hooked"]);
    d.ok(&["exec", &id, "--", "sh", "-c", "echo one > /workspace/a.txt"]);
    assert_eq!(d.cairn(&["exec", &id, "--", "sh", "-c", "exit 3"]).status.code(), Some(3));
    let snap = d.json(&["snapshot", &id, "--memory", "first draft"])["id"].as_str().unwrap().to_owned();
    d.ok(&["exec", &id, "--", "sh", "-c", "rm /workspace/a.txt"]);
    d.ok(&["rollback", &id, "--to", &snap, "--reason", "the <draft> was deleted"]);
    let w = d.json(&["wait", &id, "--approval", "Ship the <b>draft</b>?"]);
    let approval_url = w["approval_url"].as_str().unwrap().to_owned();
    d.wait_for_state(&id, "suspended", Duration::from_secs(20));
    // The approver's notification comes while the task waits.
    let waiting = rx.wait_for("task.waiting", |got| got.iter().any(|r| r.json()["type"] == "task.waiting"));
    let waiting = waiting.iter().map(Received::json).find(|v| v["type"] == "task.waiting").unwrap();
    assert_eq!(waiting["data"]["wait"]["approval_url"], approval_url.as_str(), "the signed link, ready to post: {waiting}");
    assert_eq!(waiting["data"]["wait"]["prompt"], "Ship the <b>draft</b>?");
    assert_eq!(waiting["data"]["task"]["name"], "hooked");
    d.ok(&["approve", &id, "--comment", "fine"]);
    d.wait_for_state(&id, "running", Duration::from_secs(20));
    let out = tempfile::tempdir().unwrap();
    d.ok(&["deliver", &id, "--file", "/workspace/a.txt", "--out", out.path().to_str().unwrap()]);
    d.ok(&["destroy", &id]);

    let got = rx.wait_for("task.destroyed", |got| got.iter().any(|r| r.json()["type"] == "task.destroyed"));
    let want = expected_types(&d, &id);
    assert!(want.len() >= 10, "{want:?}");
    assert_eq!(arrived(&got, &id), want, "each event the hook takes, once, in the log's order");
    let mut ids: Vec<&str> = got.iter().map(|r| r.header("webhook-id")).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), got.len(), "one message id per notification");
    for r in &got {
        assert_eq!(r.path, "/cairn");
        assert_eq!(r.header("content-type"), "application/json");
        assert_signed(r, &secret);
    }
    let bodies: Vec<Value> = got.iter().map(Received::json).collect();
    let failed_cmd = bodies.iter().find(|v| v["type"] == "task.command_finished" && v["data"]["event"]["exit_code"] == 3).unwrap();
    assert!(failed_cmd["data"]["event"]["duration_ms"].is_u64(), "{failed_cmd}");
    let rolled = bodies.iter().find(|v| v["type"] == "task.rolled_back").unwrap();
    assert!(rolled.to_string().contains("the <draft> was deleted"), "the rollback's reason: {rolled}");
    assert!(bodies.iter().any(|v| v["type"] == "task.woken"));
    let listed = d.json(&["hooks", "show", &hook]);
    assert_eq!((listed["sent"].as_u64(), listed["pending"].as_u64(), listed["failed"].as_u64()), (Some(got.len() as u64), Some(0), Some(0)), "{listed}");

    // A test send, answered now and not kept.
    let before = rx.got().len();
    let said = d.ok(&["hooks", "test", &hook]);
    assert!(said.contains("answered 200"), "{said}");
    let test = rx.got()[before].clone();
    assert_eq!(test.json()["type"], "hook.test");
    assert_signed(&test, &secret);
    rx.answer(503);
    let out = d.cairn(&["hooks", "test", &hook]);
    assert_eq!(out.status.code(), Some(1), "a refused test fails the command");
    assert!(String::from_utf8_lossy(&out.stdout).contains("HTTP 503"), "{}", String::from_utf8_lossy(&out.stdout));

    d.ok(&["hooks", "rm", &hook]);
    assert_eq!(d.json(&["hooks", "list"]), serde_json::json!([]));
}

#[test]
fn a_receiver_that_is_down_gets_everything_after_it_recovers_also_across_a_daemon_kill() {
    let config = tempfile::tempdir().unwrap();
    let path = config.path().join("cairn.toml");
    std::fs::write(&path, "[hooks]\ntimeout = \"2s\"\n").unwrap();
    let mut d = Daemon::start_with_env(&["--config", path.to_str().unwrap()], &[]);
    let rx = Receiver::start();
    rx.answer(503);
    let (hook, secret) = add_hook(&d, &[&rx.url("/"), "--events", "task.created,task.command_finished,task.destroyed"]);
    let id = d.create(&[]);
    for n in 0..3 {
        d.ok(&["exec", &id, "--", "sh", "-c", &format!("echo {n}")]);
    }
    // Refused and kept: the first of the stream retried, the rest behind it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rx.refused.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "no retry after a refusal");
        std::thread::sleep(Duration::from_millis(50));
    }
    let outbox = d.json(&["hooks", "outbox", &hook]);
    assert_eq!(outbox.as_array().unwrap().len(), 4, "the create and three commands: {outbox}");
    assert!(outbox[0]["attempts"].as_i64().unwrap() >= 2 && outbox[0]["last_error"].as_str().unwrap().contains("HTTP 503"), "{outbox}");
    let shown = d.ok(&["hooks", "list"]);
    assert!(shown.contains("pending 4") && shown.contains("HTTP 503"), "{shown}");
    assert!(rx.got().is_empty());

    // SIGKILL with everything unsent; more events while it is down cannot
    // happen, so one after the restart too.
    d.kill();
    d.respawn();
    d.ok(&["exec", &id, "--", "true"]);
    rx.answer(200);
    d.ok(&["destroy", &id]);
    let got = rx.wait_for("everything", |got| got.iter().any(|r| r.json()["type"] == "task.destroyed"));
    let want: Vec<(u64, String)> =
        expected_types(&d, &id).into_iter().filter(|(_, t)| ["task.created", "task.command_finished", "task.destroyed"].contains(&t.as_str())).collect();
    assert_eq!(want.len(), 6, "{want:?}");
    assert_eq!(arrived(&got, &id), want, "once each, in order, across the kill");
    for r in &got {
        assert_signed(r, &secret);
    }
}

#[test]
fn a_notification_past_its_time_is_failed_and_the_stream_goes_on() {
    let config = tempfile::tempdir().unwrap();
    let path = config.path().join("cairn.toml");
    std::fs::write(&path, "[hooks]\ngive_up_after = \"2s\"\ntimeout = \"1s\"\n").unwrap();
    let d = Daemon::start_with(&["--config", path.to_str().unwrap()]);
    let rx = Receiver::start();
    rx.answer(500);
    let (hook, _) = add_hook(&d, &[&rx.url("/"), "--events", "task.command_finished"]);
    let id = d.create(&[]);
    d.ok(&["exec", &id, "--", "true"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = d.json(&["hooks", "show", &hook]);
        if h["failed"] == 1 {
            assert_eq!((h["pending"].as_i64(), h["sent"].as_i64()), (Some(0), Some(0)), "{h}");
            assert!(h["last_error"].as_str().unwrap().starts_with("HTTP 500"), "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "not given up after 30 s: {h}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let outbox = d.json(&["hooks", "outbox", &hook]);
    assert_eq!(outbox[0]["state"], "failed", "kept, shown: {outbox}");
    // The receiver is back: the next command arrives; the failed one stays failed.
    rx.answer(200);
    assert_eq!(d.cairn(&["exec", &id, "--", "sh", "-c", "exit 7"]).status.code(), Some(7));
    let got = rx.wait_for("the next command", |got| !got.is_empty());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["data"]["event"]["exit_code"], 7);
    assert_eq!(d.json(&["hooks", "show", &hook])["failed"], 1);
    d.ok(&["destroy", &id]);
}

#[test]
fn e2b_shaped_and_per_task_hooks_and_bad_input() {
    let d = Daemon::start();
    let rx = Receiver::start();
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("secret");
    std::fs::write(&secret_file, "e2b-shared-secret\n").unwrap();
    let one = d.create(&["--name", "watched"]);
    let other = d.create(&[]);
    let (e2b, secret) = add_hook(&d, &[&rx.url("/e2b"), "--format", "e2b", "--secret-file", secret_file.to_str().unwrap()]);
    assert_eq!(secret, "e2b-shared-secret");
    let (_, _) = add_hook(&d, &[&rx.url("/one"), "--task", "watched", "--events", "task.command_finished"]);
    d.ok(&["exec", &one, "--", "true"]);
    d.ok(&["exec", &other, "--", "true"]);
    d.ok(&["destroy", &one]);
    d.ok(&["destroy", &other]);
    let got = rx.wait_for("two kills and one command", |got| got.iter().filter(|r| r.path == "/e2b").count() == 2 && got.iter().any(|r| r.path == "/one"));
    // A moment for anything that should not come (the other task's command).
    std::thread::sleep(Duration::from_millis(500));
    assert!(rx.got().len() >= got.len());
    let got = rx.got();
    let per_task: Vec<Value> = got.iter().filter(|r| r.path == "/one").map(Received::json).collect();
    assert_eq!(per_task.len(), 1, "only the watched task's command: {per_task:?}");
    assert_eq!(per_task[0]["data"]["task"]["id"], one.as_str());
    let killed: Vec<&Received> = got.iter().filter(|r| r.path == "/e2b").collect();
    assert_eq!(killed.len(), 2, "both tasks' ends, nothing else (the hook was added after the creates)");
    for r in &killed {
        let v = r.json();
        assert_eq!((v["version"].as_str(), v["type"].as_str()), (Some("v2"), Some("sandbox.lifecycle.killed")), "{v}");
        assert!(v["sandboxId"] == one.as_str() || v["sandboxId"] == other.as_str(), "{v}");
        let mut digest = Sha256::new();
        digest.update(b"e2b-shared-secret");
        digest.update(&r.body);
        assert_eq!(r.header("e2b-signature"), STANDARD_NO_PAD.encode(digest.finalize()));
        assert_eq!((r.header("e2b-webhook-id"), r.header("e2b-signature-version")), (e2b.as_str(), "v1"));
    }

    // Bad input: one line naming what is wrong, nothing added.
    let empty = secrets.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["hooks", "add", "ftp://hooks.example.com/"], "scheme must be http or https"),
        (vec!["hooks", "add", "hooks.example.com/x"], "hook URL \"hooks.example.com/x\""),
        (vec!["hooks", "add", "https://hooks.example.com/", "--events", "task.exploded"], "unknown event type \"task.exploded\""),
        (vec!["hooks", "add", "https://hooks.example.com/", "--format", "e2b", "--events", "task.created"], "for the e2b format"),
        (vec!["hooks", "add", "https://hooks.example.com/", "--format", "slack"], "--format slack"),
        (vec!["hooks", "add", "https://hooks.example.com/", "--task", "nobody"], "nobody"),
        (vec!["hooks", "add", "https://hooks.example.com/", "--secret-file", empty.to_str().unwrap()], "is empty"),
        (vec!["hooks", "add", "https://hooks.example.com/", "--secret-file", "/nonexistent/secret"], "cannot read --secret-file"),
        (vec!["hooks", "rm", "hook-nothere"], "no hook \"hook-nothere\""),
        (vec!["hooks", "test", "hook-nothere"], "no hook \"hook-nothere\""),
        (vec!["hooks", "outbox", "hook-nothere"], "no hook \"hook-nothere\""),
    ];
    for (args, want) in cases {
        let err = d.fails(&args);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert_eq!(d.json(&["hooks", "list"]).as_array().unwrap().len(), 2, "nothing added by the refused ones");
}
