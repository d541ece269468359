//! `GET /metrics`: Prometheus metrics from a real daemon after real work
//! (an exec, a snapshot, a suspend and a wake, a webhook refused), and the
//! bearer token it needs.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::Daemon;

/// GET /metrics, with or without the token: (status, body).
fn scrape(d: &Daemon, with_token: bool) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}"]);
    if with_token {
        let token = std::fs::read_to_string(d.home().join("token")).unwrap();
        cmd.args(["-H", &format!("authorization: Bearer {}", token.trim())]);
    }
    cmd.arg(format!("{}/metrics", d.url));
    let out = common::output_within(&mut cmd, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

/// The value of the sample named exactly `name` (with its labels).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn metrics_count_the_work_done_and_need_the_token() {
    common::require_root();
    let d = Daemon::start();
    let (code, _) = scrape(&d, false);
    assert_eq!(code, 401, "no token, no metrics");
    let (code, before) = scrape(&d, true);
    assert_eq!(code, 200, "{before}");
    assert_eq!(sample(&before, "cairn_tasks{state=\"running\"}"), 0.0);
    assert_eq!(sample(&before, "cairn_exec_duration_seconds_count"), 0.0);

    let t = d.create(&[]);
    d.sh(&t, "echo data > /workspace/f");
    d.ok(&["snapshot", &t]);
    d.ok(&["suspend", &t]);
    assert_eq!(scrape(&d, true).1.lines().filter(|l| l.starts_with("cairn_live_sandboxes ")).collect::<Vec<_>>(), ["cairn_live_sandboxes 0"]);
    d.ok(&["resume", &t]);
    // A webhook with no signature is refused, and counted.
    let out = common::run(Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-d", "{}", &format!("{}/v1/hooks/{t}/go", d.url)])).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401");

    let (_, text) = scrape(&d, true);
    assert_eq!(sample(&text, "cairn_tasks{state=\"running\"}"), 1.0);
    assert_eq!(sample(&text, "cairn_tasks{state=\"suspended\"}"), 0.0);
    assert_eq!(sample(&text, "cairn_live_sandboxes"), 1.0);
    assert!(sample(&text, "cairn_exec_duration_seconds_count") >= 1.0);
    // The explicit snapshot and the suspend's own.
    assert_eq!(sample(&text, "cairn_snapshot_duration_seconds_count"), 2.0);
    assert_eq!(sample(&text, "cairn_suspend_duration_seconds_count"), 1.0);
    assert_eq!(sample(&text, "cairn_wake_duration_seconds_count"), 1.0);
    assert!(sample(&text, "cairn_snapshot_added_bytes_total") > 0.0);
    assert!(sample(&text, "cairn_blob_store_bytes") > 0.0);
    assert_eq!(sample(&text, "cairn_webhooks_total{result=\"refused\"}"), 1.0);
    assert!(text.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
}
