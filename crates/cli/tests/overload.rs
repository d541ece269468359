//! Overload is refused, never fatal to others: a flood of concurrent execs
//! on one task gets 429 past the bounds of `[limits]` (set low here), while
//! the other tasks keep their processes, their commands run about as fast
//! as when the daemon is quiet, and the daemon's memory comes back. Driven
//! over HTTP with reqwest against a real daemon and real sandboxes.
//!
//! `CAIRN_TEST_FLOOD` sets the number of requests of the flood (default
//! 10,000, the number that once took every descriptor of the daemon and
//! tore down every other task's sandbox).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{json, Value};

const EXECS_PER_TASK: usize = 8;
const EXECS_TOTAL: usize = 12;
const STREAMS_PER_TASK: usize = 2;
const STREAMS_TOTAL: usize = 3;

/// Every request of the test has this deadline.
const REQUEST_DEADLINE: Duration = Duration::from_secs(90);

fn start() -> Daemon {
    let n = |v: usize| v.to_string();
    let (a, b, c, e) = (
        n(EXECS_PER_TASK),
        n(EXECS_TOTAL),
        n(STREAMS_PER_TASK),
        n(STREAMS_TOTAL),
    );
    Daemon::start_with(&[
        "--execs-per-task",
        &a,
        "--execs-total",
        &b,
        "--streams-per-task",
        &c,
        "--streams-total",
        &e,
    ])
}

/// The daemon's API: its URL and token, and a client with a deadline.
#[derive(Clone)]
struct Api {
    url: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    /// A client that keeps its connections (`keep_alive`) or opens one per
    /// request, as a flood of separate clients would.
    fn new(d: &Daemon, keep_alive: bool) -> Api {
        let token = std::fs::read_to_string(d.home().join("token"))
            .unwrap()
            .trim()
            .to_owned();
        let mut b = reqwest::Client::builder().timeout(REQUEST_DEADLINE);
        if !keep_alive {
            b = b.pool_max_idle_per_host(0);
        }
        Api {
            url: d.url.clone(),
            token,
            http: b.build().unwrap(),
        }
    }

    /// `POST /v1/tasks/{task}/exec` of `cmd`: (status, body), or the
    /// client's error.
    async fn run(&self, task: &str, cmd: &[&str]) -> Result<(u16, Value), String> {
        let resp = self
            .http
            .post(format!("{}/v1/tasks/{task}/exec", self.url))
            .bearer_auth(&self.token)
            .json(&json!({ "cmd": cmd }))
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| format!("{e:?}"))?;
        Ok((
            status,
            serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body))),
        ))
    }

    /// How many held commands have started in the task: the `in-*` files
    /// they leave in `/workspace`.
    async fn started(&self, task: &str) -> usize {
        let resp = self
            .http
            .get(format!("{}/v1/tasks/{task}/dir?path=/workspace", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let dir: Value = resp.json().await.unwrap();
        dir["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("in-")))
            .count()
    }

    /// `GET /v1/tasks/{task}/watch`, kept open: the response, or its status
    /// and body when refused.
    async fn watch(&self, task: &str) -> Result<reqwest::Response, (u16, Value)> {
        // No overall timeout: the stream stays open until dropped; its
        // answer (the status and headers) has a deadline.
        let request = reqwest::Client::new().get(format!("{}/v1/tasks/{task}/watch", self.url)).bearer_auth(&self.token).send();
        let resp = tokio::time::timeout(REQUEST_DEADLINE, request)
            .await
            .unwrap_or_else(|_| panic!("watch {task}: no answer within {REQUEST_DEADLINE:?}"))
            .unwrap_or_else(|e| panic!("watch {task}: {e}"));
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = tokio::time::timeout(REQUEST_DEADLINE, resp.bytes())
            .await
            .unwrap()
            .unwrap();
        Err((status, serde_json::from_slice(&body).unwrap()))
    }
}

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// How many descriptors the daemon has open.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    assert!(!v.is_empty(), "no samples");
    v.sort();
    v[v.len() / 2]
}

/// One `true` in the task, timed; it must succeed.
async fn timed_true(api: &Api, task: &str) -> Duration {
    let t0 = Instant::now();
    let (status, body) = api
        .run(task, &["true"])
        .await
        .unwrap_or_else(|e| panic!("exec in {task}: {e}"));
    assert_eq!(
        (status, body["exit_code"].as_i64()),
        (200, Some(0)),
        "exec in {task}: {body}"
    );
    t0.elapsed()
}

/// A 429 body: code `too_many_requests` and a message of one line.
fn refusal(status: u16, body: &Value) -> String {
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
    let message = body["error"]["message"].as_str().unwrap().to_owned();
    assert!(!message.contains('\n'), "{message:?}");
    message
}

/// A bystander: a task with a long `sleep` started in the background, and
/// what must not change about it.
struct Bystander {
    id: String,
    sleep_pid: String,
    init_pid: i64,
}

impl Bystander {
    fn start(d: &Daemon) -> Bystander {
        let id = d.create(&[]);
        let (code, out, err) = d.sh(&id, "sleep 100000 >/dev/null 2>&1 & echo $!");
        assert_eq!(code, 0, "{err}");
        let sleep_pid = out.trim().to_owned();
        assert!(sleep_pid.parse::<u32>().is_ok(), "{out:?}");
        let init_pid = d.task(&id)["sandbox_pid"].as_i64().unwrap();
        Bystander {
            id,
            sleep_pid,
            init_pid,
        }
    }

    /// Its sandbox and its sleep are the ones it had; it was never lost.
    fn check_untouched(&self, d: &Daemon) {
        let t = d.task(&self.id);
        assert_eq!(
            (t["state"].as_str(), t["sandbox"].as_str()),
            (Some("running"), Some("ready")),
            "{t}"
        );
        assert_eq!(
            t["sandbox_pid"].as_i64(),
            Some(self.init_pid),
            "the sandbox was replaced: {t}"
        );
        assert!(
            t["recovery_note"].is_null() && t["sandbox_note"].is_null(),
            "{t}"
        );
        let (code, out, err) = d.sh(
            &self.id,
            &format!(
                "kill -0 {0} && cat /proc/{0}/cmdline | tr '\\0' ' '",
                self.sleep_pid
            ),
        );
        assert_eq!(
            (code, out.as_str()),
            (0, "sleep 100000 "),
            "the bystander's sleep is gone: {err}"
        );
        let log = d.json(&["log", &self.id]);
        let lost: Vec<&Value> = log
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "sandbox_lost" || e["kind"] == "recovered")
            .collect();
        assert!(lost.is_empty(), "{lost:?}");
    }
}

/// What the flood measured.
struct Flood {
    quiet: Vec<Duration>,
    during: Vec<Duration>,
    ok: usize,
    refused: usize,
    other: Vec<String>,
    took: Duration,
    rss_start: u64,
    rss_peak: u64,
    rss_after: u64,
    fds_peak: usize,
}

/// `count` concurrent `sleep 3` on `target`, each on its own connection,
/// while a bystander runs `true` again and again over its own.
async fn flood(d: &Daemon, target: &str, bystander: &str, count: usize) -> Flood {
    let daemon = d.pid();
    // The bystander runs on a thread, a runtime and a connection of its
    // own, so that what it measures is the daemon, not this process busy
    // with the flood: first on a quiet daemon (warmed up), then until the
    // flood is over.
    let running = Arc::new(AtomicBool::new(true));
    let (quiet_tx, quiet_rx) = std::sync::mpsc::channel();
    let sampler = {
        let (probe, bystander, running) =
            (Api::new(d, true), bystander.to_owned(), running.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for _ in 0..3 {
                    timed_true(&probe, &bystander).await;
                }
                let mut quiet = Vec::new();
                for _ in 0..15 {
                    quiet.push(timed_true(&probe, &bystander).await);
                }
                let _ = quiet_tx.send((quiet, rss_kib(daemon)));
                let (mut during, mut rss_peak, mut fds_peak) = (Vec::new(), 0, 0);
                while running.load(Ordering::Relaxed) {
                    during.push(timed_true(&probe, &bystander).await);
                    rss_peak = rss_peak.max(rss_kib(daemon));
                    fds_peak = fds_peak.max(fds(daemon));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (during, rss_peak, fds_peak)
            })
        })
    };
    let (quiet, rss_start) =
        tokio::task::block_in_place(|| quiet_rx.recv_timeout(REQUEST_DEADLINE)).unwrap();
    let flooder = Api::new(d, false);
    let began = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    // At most this many requests are in flight at once: far past the
    // task's bound, but within the listen backlog (1024), which the kernel
    // answers with a reset once full: a reset of the kernel's, not an
    // answer of the daemon's.
    let in_flight = Arc::new(tokio::sync::Semaphore::new(768));
    for _ in 0..count {
        let (api, task, in_flight) = (flooder.clone(), target.to_owned(), in_flight.clone());
        set.spawn(async move {
            let _permit = in_flight.acquire_owned().await.unwrap();
            // Long enough that the task's bound stays full for the whole
            // flood: the test is of the refusals. With `sleep 0.5` the
            // admitted commands alone (16 a second) slowed a bystander's
            // command up to 5 times on 2 cores, which is a neighbour's
            // permitted load, not the flood's harm.
            api.run(&task, &["sleep", "3"]).await
        });
    }
    let per_task = format!("task {target} already runs {EXECS_PER_TASK} commands at once (limit [limits] execs_per_task = {EXECS_PER_TASK})");
    let (mut ok, mut refused, mut other) = (0, 0, Vec::new());
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok((200, body)) if body["exit_code"] == 0 => ok += 1,
            Ok((429, body)) if refusal(429, &body).starts_with(&per_task) => refused += 1,
            Ok((status, body)) => other.push(format!("{status} {body}")),
            Err(e) => other.push(e),
        }
    }
    let took = began.elapsed();
    running.store(false, Ordering::Relaxed);
    let (during, rss_peak, fds_peak) = tokio::task::block_in_place(|| sampler.join()).unwrap();
    drop(flooder);
    // The memory the flood took comes back (a bounded wait).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rss_after = rss_kib(daemon);
    while rss_after > 2 * rss_start && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_after = rss_kib(daemon);
    }
    Flood {
        quiet,
        during,
        ok,
        refused,
        other,
        took,
        rss_start,
        rss_peak,
        rss_after,
        fds_peak,
    }
}

#[test]
fn a_flood_of_execs_on_one_task_is_refused_past_its_bounds_and_harms_no_other_task() {
    let count: usize = std::env::var("CAIRN_TEST_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let d = start();
    let target = d.create(&[]);
    let target_init = d.task(&target)["sandbox_pid"].as_i64().unwrap();
    let bystanders: Vec<Bystander> = (0..3).map(|_| Bystander::start(&d)).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let f = rt.block_on(flood(&d, &target, &bystanders[0].id, count));
    let (quiet, during) = (median(f.quiet.clone()), median(f.during.clone()));
    eprintln!(
        "flood of {count} in {:?}: {} ran, {} refused (429), {} otherwise; bystander median {quiet:?} quiet, {during:?} during ({} samples, max {:?}); \
         daemon RSS {} KiB at start, {} KiB at most, {} KiB after; at most {} descriptors open",
        f.took,
        f.ok,
        f.refused,
        f.other.len(),
        f.during.len(),
        f.during.iter().max(),
        f.rss_start,
        f.rss_peak,
        f.rss_after,
        f.fds_peak
    );
    assert!(
        f.other.is_empty(),
        "answers neither a success nor a refusal: {:?}",
        &f.other[..f.other.len().min(5)]
    );
    assert!(
        f.refused > 0 && f.ok > 0,
        "{} ran, {} refused",
        f.ok,
        f.refused
    );
    assert_eq!(f.ok + f.refused, count);
    assert!(
        during <= 3 * quiet,
        "a bystander's command took {during:?} during the flood, {quiet:?} before"
    );
    assert!(
        f.rss_after <= 2 * f.rss_start,
        "the daemon's RSS went from {} KiB to {} KiB and stayed",
        f.rss_start,
        f.rss_after
    );
    for b in &bystanders {
        b.check_untouched(&d);
    }
    assert_eq!(
        d.task(&target)["sandbox_pid"].as_i64(),
        Some(target_init),
        "the flooded task's sandbox was replaced"
    );
    assert_eq!(d.sh(&target, "echo still here").1, "still here\n");
}

#[test]
fn past_a_bound_the_cli_and_the_api_say_which_in_one_line_until_a_place_is_free() {
    let d = start();
    let (a, b, c) = (d.create(&[]), d.create(&[]), d.create(&[]));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let api = Api::new(&d, false);
    rt.block_on(async {
        // Task a's every place, then the rest of the daemon's on b, each
        // command held until its file appears.
        let hold = |task: &str, n: usize| {
            (0..n)
                .map(|_| {
                    let (api, task) = (api.clone(), task.to_owned());
                    let script = "touch /workspace/in-$$; while [ ! -e /workspace/go ]; do sleep 0.05; done";
                    tokio::spawn(async move { api.run(&task, &["sh", "-c", script]).await })
                })
                .collect::<Vec<_>>()
        };
        let mut held = hold(&a, EXECS_PER_TASK);
        held.extend(hold(&b, EXECS_TOTAL - EXECS_PER_TASK));
        // Until every one runs (seen through the files API, which takes
        // no place among commands).
        let deadline = Instant::now() + Duration::from_secs(60);
        for (t, n) in [(&a, EXECS_PER_TASK), (&b, EXECS_TOTAL - EXECS_PER_TASK)] {
            while api.started(t).await < n {
                if let Some(h) = held.iter_mut().find(|h| h.is_finished()) {
                    panic!("a held command ended early: {:?}", h.await);
                }
                assert!(Instant::now() < deadline, "the held commands of {t} never all started");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Then c's command is refused for the daemon's bound, a's for a's.
        let (status, body) = api.run(&c, &["true"]).await.unwrap();
        assert_eq!(
            refusal(status, &body),
            format!("the daemon already runs {EXECS_TOTAL} commands at once (limit [limits] execs_total = {EXECS_TOTAL}); try again later")
        );
        let (status, body) = api.run(&a, &["true"]).await.unwrap();
        let m = refusal(status, &body);
        assert_eq!(m, format!("task {a} already runs {EXECS_PER_TASK} commands at once (limit [limits] execs_per_task = {EXECS_PER_TASK}); try again later"));

        // The CLI (over the WebSocket) shows a refusal as one line and
        // fails; a streamed run is refused before its stream starts.
        let (ea, ec) = tokio::task::block_in_place(|| (d.fails(&["exec", &a, "--", "true"]), d.fails(&["exec", &c, "--", "true"])));
        assert_eq!(ea, format!("cairn: {m}"));
        assert!(ec.starts_with(&format!("cairn: the daemon already runs {EXECS_TOTAL} commands at once")), "{ec}");
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/tasks/{a}/exec", api.url))
            .bearer_auth(&api.token)
            .header("accept", "text/event-stream")
            .json(&json!({"cmd": ["true"]}))
            .timeout(REQUEST_DEADLINE)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        refusal(status, &serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap());

        // The held commands let go (the file put in without an exec): they
        // ended well, and their places are free again.
        for t in [&a, &b] {
            let (status, answer) = tokio::task::block_in_place(|| d.http_file(t, "PUT", "/workspace/go", Some(b"")));
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        }
        for h in held {
            let (status, body) = h.await.unwrap().unwrap();
            assert_eq!((status, body["exit_code"].as_i64()), (200, Some(0)), "a held command: {body}");
        }
        for t in [&a, &b, &c] {
            timed_true(&api, t).await;
        }
    });
}

#[test]
fn event_streams_are_bounded_and_given_back_when_their_client_goes() {
    let d = start();
    let (a, b) = (d.create(&[]), d.create(&[]));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let api = Api::new(&d, false);
    rt.block_on(async {
        let mut open = Vec::new();
        for _ in 0..STREAMS_PER_TASK {
            open.push(api.watch(&a).await.unwrap_or_else(|(s, b)| panic!("{s} {b}")));
        }
        let (status, body) = api.watch(&a).await.unwrap_err();
        assert_eq!(
            refusal(status, &body),
            format!("task {a} already has {STREAMS_PER_TASK} open event streams (limit [limits] streams_per_task = {STREAMS_PER_TASK}); try again later")
        );
        for _ in STREAMS_PER_TASK..STREAMS_TOTAL {
            open.push(api.watch(&b).await.unwrap_or_else(|(s, b)| panic!("{s} {b}")));
        }
        let (status, body) = api.watch(&b).await.unwrap_err();
        assert_eq!(
            refusal(status, &body),
            format!("the daemon already has {STREAMS_TOTAL} open event streams (limit [limits] streams_total = {STREAMS_TOTAL}); try again later")
        );
        // Commands are counted apart: they still run.
        timed_true(&api, &a).await;
        // The clients go; the daemon notices (at the latest when it next
        // writes to them) and a stream opens again.
        drop(open);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match api.watch(&a).await {
                Ok(_) => break,
                Err((status, body)) => {
                    refusal(status, &body);
                    assert!(Instant::now() < deadline, "the streams of clients gone were never given back");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
}
