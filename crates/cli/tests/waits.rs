//! Suspend on wait, wake on events, and recovery, through the real CLI and
//! daemon: approvals (CLI and the web page's form), webhooks signed by the
//! Python `standardwebhooks` package, operator events, events before waits,
//! timers (also across a restart), auto-resume on exec and cp, idle
//! suspend, bad input, SIGKILL of the daemon at random points, and a
//! simulated host reboot.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Daemon;
use serde_json::Value;

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// What of a suspended task is still on the host, besides its cached disk.
fn traces_besides_cache(d: &Daemon, task: &str, init_pid: i32) -> Vec<String> {
    d.leftovers(task, init_pid).into_iter().filter(|t| !(t.starts_with("scratch") && t.ends_with(&format!("{task}.img")))).collect()
}

/// `curl` with a status line: returns (status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = common::run(Command::new("curl").args(["-s", "-o", "-", "-w", "\n%{http_code}"]).args(args)).expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Shell that waits (at most 10 s) until the task's service, which ends
/// in `exec sleep 1000`, runs: a poll, not a fixed sleep.
const UNTIL_SERVICE_RUNS: &str = "i=0; until grep -qx sleep /proc/[0-9]*/comm 2>/dev/null; do i=$((i+1)); [ $i -lt 1000 ] || break; sleep 0.01; done; ";

#[test]
fn an_approval_suspends_the_task_frees_its_compute_and_wakes_it_intact() {
    let d = Daemon::start();
    let id = d.create(&["--service", "echo up >> /tmp/svc; exec sleep 1000"]);
    must(&d, &id, "mkdir -p /workspace/out && echo draft > /workspace/out/report.md");
    d.ok(&["snapshot", &id, "--memory", "report drafted; waiting for sign-off"]);
    must(&d, &id, "echo final >> /workspace/out/report.md");
    let step = d.task(&id)["step"].as_u64().unwrap();
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;

    let w = d.json(&["wait", &id, "--approval", "Publish the <b>report</b>?"]);
    assert_eq!((w["state"].as_str(), w["task_state"].as_str()), (Some("pending"), Some("suspended")));
    let url = w["approval_url"].as_str().unwrap().to_owned();
    assert_eq!(traces_besides_cache(&d, &id, pid), Vec::<String>::new(), "no process, mount, cgroup or loop device of it");
    assert!(d.home().join(format!("disks/{id}.img")).exists(), "the disk stays as a local cache");
    let t = d.task(&id);
    assert!(t["sandbox_pid"].is_null() && t["sandbox"] == "none");

    // The page shows the prompt, escaped, and a form; a forged link does not.
    let (code, page) = curl(&[&url]);
    assert_eq!(code, 200);
    assert!(page.contains("Publish the &lt;b&gt;report&lt;/b&gt;?") && page.contains("name=\"decision\""), "{page}");
    let forged = url.replace("sig=", "sig=x");
    assert_eq!(curl(&[&forged]).0, 403);
    let moved = url.replacen("exp=1", "exp=2", 1);
    assert_eq!(curl(&[&moved]).0, 403, "a changed expiry is forged");

    // Approve through the form post, as a browser would.
    let wait_id = w["id"].as_str().unwrap();
    let query = url.split_once('?').unwrap().1;
    let exp = query.split('&').find_map(|p| p.strip_prefix("exp=")).unwrap();
    let sig = query.split('&').find_map(|p| p.strip_prefix("sig=")).unwrap();
    let action = format!("{}/approve/{wait_id}", d.url);
    let (code, done) = curl(&["-X", "POST", "--data-urlencode", &format!("exp={exp}"), "--data-urlencode", &format!("sig={sig}"), "-d", "decision=approve", "-d", "comment=ship+it", &action]);
    assert_eq!(code, 200, "{done}");
    assert!(done.contains("Approved"), "{done}");
    let (code, _) = curl(&["-X", "POST", "--data-urlencode", &format!("exp={exp}"), "--data-urlencode", &format!("sig={sig}"), "-d", "decision=reject", &action]);
    assert_eq!(code, 409, "a decided approval cannot be decided again");

    d.wait_for_state(&id, "running", Duration::from_secs(10));
    let back = d.json(&["log", &id]);
    let wake = back.as_array().unwrap().iter().rev().find(|e| e["kind"] == "wake").unwrap().clone();
    // The local disk was used: as it is, or (when another daemon on this
    // host took the task's uid slot meanwhile) re-owned in place with no
    // file written.
    let a = &wake["args"];
    assert!(a["from_cache"] == true || (a["restore"]["files_written"] == 0 && a["restore"]["files_kept"].as_u64() > Some(0)), "{wake}");
    assert!(wake["args"]["event_accepted_to_ready_ms"].as_f64().is_some());
    assert_eq!(must(&d, &id, "cat /workspace/out/report.md"), "draft\nfinal\n", "files as they were at the wait");
    let t = d.task(&id);
    assert_eq!(t["memory"], "report drafted; waiting for sign-off");
    assert_eq!(t["step"].as_u64().unwrap(), step + 1, "the step counter went on (plus the cat)");
    assert_eq!(must(&d, &id, &format!("{UNTIL_SERVICE_RUNS}cat /tmp/svc")), "up\n", "services start again on wake");
    // A second wait while one is pending is refused, clearly.
    let w = d.json(&["wait", &id, "--approval", "again?"]);
    assert_eq!(w["task_state"], "suspended");
    let err = d.fails(&["wait", &id, "--webhook", "never"]);
    assert!(err.contains("suspended") && err.contains("only a running task can wait"), "{err}");
    // Reject from the CLI; the task wakes and the agent sees the decision.
    d.ok(&["approve", &id, "--reject", "--comment", "not yet"]);
    d.wait_for_state(&id, "running", Duration::from_secs(10));
    let w = d.json(&["wait", &id, "--timer", "1ms", "--block"]);
    assert_eq!(w["source"], "timer", "--block prints the event: {w}");
    let log = d.json(&["log", &id]);
    let decision = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["source"] == "approval").count();
    assert_eq!(decision, 2, "approve, then reject");
    let err = d.fails(&["approve", &id]);
    assert!(err.contains("not waiting for an approval"), "{err}");
}

const SIGN: &str = r#"
import sys, json, datetime
from standardwebhooks import Webhook
secret, msg_id, ts = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = sys.stdin.read()
print(Webhook(secret).sign(msg_id, datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc), body))
"#;

/// A Standard Webhooks signature made by the Python reference package.
fn py_sign(secret: &str, msg_id: &str, ts: i64, body: &str) -> String {
    let mut child = Command::new("python3")
        .args(["-c", SIGN, secret, msg_id, &ts.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = common::output_of(child, common::CALL_DEADLINE).unwrap();
    assert!(out.status.success(), "signing with standardwebhooks failed (pip install standardwebhooks): {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn post_hook(url: &str, id: &str, ts: i64, sig: &str, body: &str) -> (u16, String) {
    // Through a file: a large body does not fit in an argument.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body).unwrap();
    let data = format!("@{}", file.path().display());
    curl(&["-X", "POST", "-H", &format!("webhook-id: {id}"), "-H", &format!("webhook-timestamp: {ts}"), "-H", &format!("webhook-signature: {sig}"), "-H", "content-type: application/json", "--data-binary", &data, url])
}

#[test]
fn signed_webhooks_wake_the_task_once_and_bad_ones_change_nothing() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let secret = d.task(&id)["webhook_secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let w = d.json(&["wait", &id, "--webhook", "build-done"]);
    let url = w["webhook_url"].as_str().unwrap().to_owned();
    assert_eq!(w["task_state"], "suspended");
    let body = r#"{"status":"green","run":42}"#;
    let ts = now_secs();
    let sig = py_sign(&secret, "msg_1", ts, body);

    // Refusals first, each with a positive control after.
    assert_eq!(post_hook(&url, "msg_1", ts, &sig, &body.replace("green", "red")).0, 401, "tampered body");
    assert_eq!(post_hook(&url, "msg_1", ts - 600, &py_sign(&secret, "msg_1", ts - 600, body), body).0, 401, "10 minutes old");
    assert_eq!(post_hook(&url, "msg_1", ts, &py_sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_1", ts, body), body).0, 401, "another secret");
    assert_eq!(curl(&["-X", "POST", "--data-binary", body, &url]).0, 401, "unsigned");
    let other_task = url.replace(&id, "t222222222222");
    assert_eq!(post_hook(&other_task, "msg_1", ts, &sig, body).0, 404, "unknown task");
    let huge = format!("{{\"x\":\"{}\"}}", "a".repeat(300 * 1024));
    assert_eq!(post_hook(&url, "msg_big", ts, &py_sign(&secret, "msg_big", ts, &huge), &huge).0, 413);
    assert_eq!(post_hook(&url, "msg_bad", ts, &py_sign(&secret, "msg_bad", ts, "{not json"), "{not json").0, 400);
    assert_eq!(d.state(&id), "suspended", "nothing of that woke it");

    let (code, ok) = post_hook(&url, "msg_1", ts, &sig, body);
    assert_eq!(code, 200, "{ok}");
    let first: Value = serde_json::from_str(&ok).unwrap();
    assert_eq!((first["duplicate"].as_bool(), first["wakes"].as_bool()), (Some(false), Some(true)));
    let (code, again) = post_hook(&url, "msg_1", ts, &sig, body);
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!((code, again["duplicate"].as_bool()), (200, Some(true)), "a retry gets 2xx and changes nothing");
    assert_eq!(again["event"]["id"], first["event"]["id"]);
    d.wait_for_state(&id, "running", Duration::from_secs(10));
    let log = d.json(&["log", &id]);
    let received: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received").collect();
    assert_eq!(received.len(), 1, "the event took effect once");
    assert_eq!(received[0]["args"]["delivery"], "msg_1");
    assert_eq!(log.as_array().unwrap().iter().filter(|e| e["kind"] == "wake").count(), 1);

    // The same name fixed per task: the URL works before any wait exists and
    // the event waits in the inbox.
    let (code, _) = post_hook(&url, "msg_2", ts, &py_sign(&secret, "msg_2", ts, body), body);
    assert_eq!(code, 200);
    let w = d.json(&["wait", &id, "--webhook", "build-done"]);
    assert_eq!((w["state"].as_str(), w["task_state"].as_str()), (Some("satisfied"), Some("running")), "satisfied at once, no suspend");
    assert_eq!(w["event"]["delivery"], "msg_2");
}

#[test]
fn operator_events_timers_and_auto_resume() {
    let d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "echo 1 > /workspace/n");
    // `task watch` streams the log as it grows.
    let mut watcher = d.cmd().args(["--json", "task", "watch", &id]).stdout(Stdio::piped()).spawn().unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(watcher.stdout.take().unwrap()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // An operator's event before its wait.
    let out = d.ok(&["event", &id, "--name", "deploy", "--data", r#"{"env":"prod"}"#]);
    assert!(out.contains("kept in the inbox"), "{out}");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.iter().any(|l: &String| l.contains("event_received")) {
        assert!(Instant::now() < deadline, "watch showed {seen:?}");
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(l);
        }
    }
    let kinds: Vec<String> = seen.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["kind"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kinds.first().map(String::as_str), Some("create"), "from the start of the log: {kinds:?}");
    let _ = watcher.kill();
    let _ = watcher.wait();
    let done = d.json(&["wait", &id, "--webhook", "deploy", "--block"]);
    assert_eq!(done["data"]["payload"]["env"], "prod");
    assert_eq!(d.state(&id), "running");

    // A timer suspends, then wakes the task by itself.
    let begun = Instant::now();
    let w = d.json(&["wait", &id, "--timer", "1s"]);
    assert_eq!(w["task_state"], "suspended");
    // `--block` alone blocks on the pending wait, until the task runs again.
    let blocked = d.json(&["wait", &id, "--block"]);
    assert_eq!(blocked["source"], "timer", "the event that ended the pending wait: {blocked}");
    assert_eq!(d.state(&id), "running");
    assert!(begun.elapsed() >= Duration::from_secs(1), "the 1 s timer held the task");
    let err = d.fails(&["wait", &id, "--block"]);
    assert!(err.contains("has no pending wait to block on"), "{err}");
    let err = d.fails(&["wait", &id]);
    assert!(err.contains("give --approval, --webhook or --timer"), "{err}");

    // exec and cp on a suspended task wake it first.
    d.ok(&["suspend", &id]);
    assert_eq!(d.state(&id), "suspended");
    assert_eq!(must(&d, &id, "cat /workspace/n"), "1\n");
    d.ok(&["suspend", &id]);
    let dst = d.home().join("n.out");
    d.ok(&["cp", &format!("{id}:/workspace/n"), dst.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&dst).unwrap(), "1\n");
    d.ok(&["suspend", &id]);
    let r = d.json(&["resume", &id]);
    assert_eq!(r["state"], "running");
    let r = d.json(&["resume", &id]);
    assert_eq!(r["state"], "running", "resuming a running task is a no-op");

    // Bad input.
    for (args, want) in [
        (vec!["wait", &id, "--timer", "0s"], "longer than zero"),
        (vec!["wait", &id, "--timer=-5s"], "timer"),
        (vec!["wait", &id, "--webhook", "a/b"], "event name"),
        (vec!["approve", &id], "not waiting for an approval"),
        (vec!["event", &id, "--name", "x", "--data", "{oops"], "not JSON"),
        (vec!["event", "t222222222222", "--name", "x"], "unknown task"),
    ] {
        let err = d.fails(&args);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert_eq!(d.state(&id), "running", "bad input changed nothing");

    // A suspended task destroyed leaves nothing, not even its cached disk.
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    d.ok(&["suspend", &id]);
    assert!(d.home().join(format!("disks/{id}.img")).exists());
    d.ok(&["destroy", &id]);
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
    let err = d.fails(&["resume", &id]);
    assert!(err.contains("destroyed"), "{err}");
}

#[test]
fn idle_tasks_suspend_themselves_and_timers_survive_a_restart() {
    let mut d = Daemon::start();
    let idle = d.create(&["--idle-suspend", "1s"]);
    must(&d, &idle, "echo idle > /workspace/f");
    // A command that runs longer than the idle time keeps it awake.
    must(&d, &idle, "sleep 1.6");
    assert_eq!(d.state(&idle), "running");
    d.wait_for_state(&idle, "suspended", Duration::from_secs(10));
    assert_eq!(must(&d, &idle, "cat /workspace/f"), "idle\n");

    let id = d.create(&[]);
    must(&d, &id, "echo before > /workspace/t");
    let w = d.json(&["wait", &id, "--timer", "2s"]);
    assert_eq!(w["task_state"], "suspended");
    let fire_at = w["fire_at_ms"].as_i64().unwrap();
    d.kill();
    // The timer comes due while no daemon runs.
    while now_ms() <= fire_at {
        std::thread::sleep(Duration::from_millis(20));
    }
    let restarted = now_ms();
    d.spawn(&[]);
    d.wait_for_state(&id, "running", Duration::from_secs(10));
    assert_eq!(must(&d, &id, "cat /workspace/t"), "before\n");
    let log = d.json(&["log", &id]);
    let fired: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["source"] == "timer").collect();
    assert_eq!(fired.len(), 1, "the timer fired once: {fired:?}");
    let at = fired[0]["time_ms"].as_i64().unwrap();
    assert!(at >= restarted && at >= fire_at, "it fired after the restart ({at} vs restart {restarted}, due {fire_at})");
    let woke = log.as_array().unwrap().iter().filter(|e| e["kind"] == "wake" && e["exit_code"] == 0).count();
    assert_eq!(woke, 1, "and woke the task once");
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}


#[test]
fn killing_the_daemon_at_random_points_loses_no_acknowledged_event() {
    let mut d = Daemon::start();
    let id = d.create(&[]);
    let secret = d.task(&id)["webhook_secret"].as_str().unwrap().to_owned();
    must(&d, &id, "head -c 2000000 /dev/urandom > /workspace/data; echo 0 > /workspace/round");
    let mut acknowledged = Vec::new();
    let mut rng = common::Rng::seeded("killing_the_daemon_at_random_points");
    let mut window = common::KillWindow::new(rng.below(100) + 10);
    let mut waits_begun = 0;
    for round in 0..6 {
        // Wait (and so suspend), killed at a point steered into the wait's
        // suspend.
        let waiter = d.cmd().args(["--json", "wait", &id, "--webhook", "go"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(window.delay(&mut rng));
        d.kill();
        let waited = common::output_of(waiter, common::CALL_DEADLINE).is_ok_and(|o| o.status.success());
        d.spawn(&[]);
        let st = d.state(&id);
        assert!(st == "running" || st == "suspended" || st == "waking", "round {round}: {st}");
        // Unacknowledged, the wait either never began or was recorded and
        // cut in its suspend (the log holds one more wait than before).
        let waits = d.json(&["log", &id]).as_array().unwrap().iter().filter(|e| e["kind"] == "wait" && e["args"]["for"].is_object()).count();
        window.landed(match (waited, waits > waits_begun) {
            (true, _) => common::Landed::After,
            (false, false) => common::Landed::Before,
            (false, true) => common::Landed::Mid,
        });
        waits_begun = waits;

        // A signed webhook, killed at a random point of intake or wake.
        let url = format!("{}/v1/hooks/{id}/go", d.url);
        let body = format!("{{\"round\":{round}}}");
        let msg = format!("msg_{round}");
        let ts = now_secs();
        let sig = py_sign(&secret, &msg, ts, &body);
        let sender = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", &format!("webhook-id: {msg}"), "-H", &format!("webhook-timestamp: {ts}"), "-H", &format!("webhook-signature: {sig}"), "--data-binary", &body, &url])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.below(80)));
        d.kill();
        let code = String::from_utf8_lossy(&common::output_of(sender, common::CALL_DEADLINE).unwrap().stdout).into_owned();
        d.spawn(&[]);
        // The daemon came back on another port.
        let url = format!("{}/v1/hooks/{id}/go", d.url);
        if code == "200" {
            acknowledged.push(msg.clone());
        } else {
            // The sender retries the same delivery, as senders do.
            let (code, _) = post_hook(&url, &msg, ts, &sig, &body);
            assert_eq!(code, 200, "round {round}: the retry is accepted");
            acknowledged.push(msg.clone());
        }
        // Whatever happened, the task works again (waking it if needed) and
        // its files are whole.
        assert_eq!(must(&d, &id, &format!("wc -c < /workspace/data; echo {round} > /workspace/round")).trim(), "2000000");
    }
    window.assert_cut_one("killing the daemon while a task suspends for a wait");
    let inbox = d.json(&["log", &id]);
    for msg in &acknowledged {
        let n = inbox.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["delivery"] == msg.as_str()).count();
        assert_eq!(n, 1, "{msg} took effect exactly once");
    }
    d.ok(&["check", "--read-data"]);
}

#[test]
fn a_host_reboot_recovers_tasks_from_their_latest_snapshot() {
    let mut d = Daemon::start();
    let id = d.create(&[]);
    must(&d, &id, "echo saved > /workspace/a");
    let snap = d.json(&["snapshot", &id, "--memory", "step one done"]);
    must(&d, &id, "echo unsaved > /workspace/b; echo changed > /workspace/a");
    let sleeper = d.create(&[]);
    must(&d, &sleeper, "echo zzz > /workspace/z");
    d.json(&["wait", &sleeper, "--webhook", "morning"]);
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;

    // The "reboot": the daemon and every sandbox process die, mounts and
    // loop devices go.
    d.kill();
    // SAFETY: kill with the pid of the sandbox init this test observed.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    common::reap(pid);
    let disk = d.home().join("run").join(&id).join("disk");
    let _ = common::run(Command::new("umount").arg("-l").arg(&disk));
    let img = d.home().join("disks").join(format!("{id}.img"));
    let out = common::run(Command::new("losetup").args(["-j"]).arg(&img)).unwrap();
    for dev in String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split(':').next()) {
        let _ = common::run(Command::new("losetup").args(["-d", dev]));
    }
    d.spawn(&[]);

    let t = d.task(&id);
    assert_eq!((t["state"].as_str(), t["sandbox"].as_str()), (Some("running"), Some("ready")), "{t}");
    let note = t["recovery_note"].as_str().unwrap();
    assert!(note.contains(snap["id"].as_str().unwrap()) && note.contains("lost"), "{note}");
    assert_eq!(t["step"], snap["step"], "the snapshot's step");
    assert_eq!(t["memory"], "step one done");
    assert_eq!(must(&d, &id, "cat /workspace/a; ls /workspace"), "saved\na\n", "exactly the snapshot's files");
    let log = d.json(&["log", &id]);
    assert!(log.as_array().unwrap().iter().any(|e| e["kind"] == "recovered"));
    // The suspended task stayed suspended and still wakes on its event.
    assert_eq!(d.state(&sleeper), "suspended");
    d.ok(&["event", &sleeper, "--name", "morning"]);
    d.wait_for_state(&sleeper, "running", Duration::from_secs(10));
    assert_eq!(must(&d, &sleeper, "cat /workspace/z"), "zzz\n");
}

/// A client that goes away while its wait suspends the task (a closed
/// terminal, or the node that forwarded the request lost) does not stop the
/// suspend halfway: the daemon carries the request out, and the task ends
/// `suspended` with its sandbox gone, not `suspending` with its lock free.
#[test]
fn a_client_gone_mid_suspend_leaves_the_task_suspended() {
    let d = Daemon::start_with_env(&[], &[("CAIRN_PAUSE_AT", "suspend.snapshot_taken:1500")]);
    let id = d.create(&[]);
    must(&d, &id, "echo kept > /workspace/kept");
    let init = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    let mut client = d.cmd().args(["wait", &id, "--timer", "1h"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // The snapshot is taken, the daemon pauses right after it: the client goes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.state(&id) != "suspending" {
        assert!(Instant::now() < deadline, "the wait did not begin to suspend");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    client.kill().unwrap();
    client.wait().unwrap();
    // The window shown, not assumed: the client went mid-suspend.
    assert_eq!(d.state(&id), "suspending", "the client was gone only after the suspend ended");
    d.wait_for_state(&id, "suspended", Duration::from_secs(30));
    let t = d.task(&id);
    assert_eq!((t["sandbox"].as_str(), t["sandbox_pid"].as_i64()), (Some("none"), None), "{t}");
    assert!(traces_besides_cache(&d, &id, init).is_empty(), "the sandbox is gone: {:?}", traces_besides_cache(&d, &id, init));
    // Positive control: the wait stands and the task wakes with its files.
    d.ok(&["wait", &id, "--cancel"]);
    assert_eq!(must(&d, &id, "cat /workspace/kept"), "kept\n");
}

/// `wait --webhook` prints a ready example of a signed post; run as printed
/// (sh, openssl, curl) it wakes the task. The same script with another
/// secret is refused and wakes nothing.
#[test]
fn the_signing_example_a_webhook_wait_prints_wakes_the_task() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let secret = d.task(&id)["webhook_secret"].as_str().unwrap().to_owned();
    let out = d.ok(&["wait", &id, "--webhook", "ci-done"]);
    let mut lines = out.lines().skip_while(|l| !l.starts_with("send it signed"));
    assert!(lines.next().is_some(), "no example printed: {out}");
    let script: String = lines.take_while(|l| l.starts_with("    ")).map(|l| format!("{}\n", l.trim_start())).collect();
    assert!(script.contains(&secret) && script.contains("/v1/hooks/"), "{script}");
    // Denial first: another secret's signature is refused.
    let forged = script.replace(&secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let refused = common::run(Command::new("sh").args(["-c", &forged]).stdin(Stdio::null())).unwrap();
    assert!(String::from_utf8_lossy(&refused.stdout).contains("signature"), "the forged post is refused: {refused:?}");
    assert_eq!(d.state(&id), "suspended", "a forged post wakes nothing");
    // The example as printed.
    let sent = common::run(Command::new("sh").args(["-c", &script]).stdin(Stdio::null())).unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let answer: Value = serde_json::from_slice(&sent.stdout).unwrap_or_else(|e| panic!("{e}: {sent:?}"));
    assert_eq!(answer["wakes"], true, "{answer}");
    d.wait_for_state(&id, "running", Duration::from_secs(60));
    let log = d.json(&["log", &id]);
    let received = log.as_array().unwrap().iter().find(|e| e["kind"] == "event_received").unwrap_or_else(|| panic!("{log}"));
    assert_eq!((&received["actor"], &received["args"]["name"]), (&Value::from("webhook"), &Value::from("ci-done")), "{received}");
    assert!(received["args"]["delivery"].as_str().unwrap().starts_with("msg_"), "the example's webhook-id: {received}");
}
