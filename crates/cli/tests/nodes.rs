//! `cairn node list` through the real CLI and daemon: the daemon registers
//! itself under its `--node` name with its API URL, is up while it
//! heartbeats, and its load is the tasks whose sandbox it runs.
//!
//! Two daemons sharing a PostgreSQL store are tested in `cluster.rs`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::Value;

/// The one node `d` knows of (its own).
fn only_node(d: &Daemon) -> Value {
    let nodes = d.json(&["node", "list"]);
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    nodes[0].clone()
}

/// Waits (at most `limit`) until the node's load is `want`.
fn wait_for_load(d: &Daemon, want: u64, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let n = only_node(d);
        if n["load"] == want {
            return n;
        }
        assert!(Instant::now() < deadline, "load is not {want} after {limit:?}: {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_daemon_is_listed_up_under_its_name_with_the_tasks_it_runs() {
    let d = Daemon::start_with(&["--node", "alpha"]);
    let n = only_node(&d);
    assert_eq!((n["name"].as_str(), n["url"].as_str(), n["state"].as_str()), (Some("alpha"), Some(d.url.as_str()), Some("up")), "{n}");
    assert_eq!((n["load"].as_u64(), n["tasks"].as_array().map(Vec::len)), (Some(0), Some(0)), "{n}");
    assert!(n["heartbeat_age_ms"].as_i64().unwrap() < 6000, "{n}");
    let table = d.ok(&["node", "list"]);
    let mut lines = table.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["NAME", "STATE", "HEARTBEAT", "LOAD", "URL", "TASKS"], "{table}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    // HEARTBEAT is two words ("0.4s ago").
    assert_eq!(row.len(), 7, "{table}");
    assert_eq!((row[0], row[1], row[3], row[4], row[5], row[6]), ("alpha", "up", "ago", "0", d.url.as_str(), "-"), "{table}");

    // Heartbeats keep it up: after more than three periods it still is.
    std::thread::sleep(Duration::from_millis(6500));
    let n = only_node(&d);
    assert_eq!(n["state"], "up", "{n}");
    assert!(n["heartbeat_age_ms"].as_i64().unwrap() < 2500, "a heartbeat every 2 s: {n}");

    let id = d.create(&[]);
    d.wait_for_state(&id, "running", Duration::from_secs(30));
    let n = wait_for_load(&d, 1, Duration::from_secs(10));
    assert_eq!(n["tasks"], serde_json::json!([id]), "{n}");
    assert!(d.ok(&["node", "list"]).contains(&id));

    d.ok(&["suspend", &id]);
    d.wait_for_state(&id, "suspended", Duration::from_secs(30));
    let n = wait_for_load(&d, 0, Duration::from_secs(10));
    assert_eq!(n["tasks"], serde_json::json!([]), "{n}");

    // Woken, it runs on this node again; destroyed, on none.
    d.ok(&["resume", &id]);
    d.wait_for_state(&id, "running", Duration::from_secs(30));
    wait_for_load(&d, 1, Duration::from_secs(10));
    d.ok(&["destroy", &id]);
    wait_for_load(&d, 0, Duration::from_secs(10));

    // A restart under the same name replaces its row: still one node.
    let mut d = d;
    d.kill();
    let err = d.try_spawn(&["--node", "no spaces"]).unwrap_err();
    assert!(err.contains("--node") && err.contains("not a node name"), "{err}");
    d.spawn(&["--node", "alpha"]);
    let n = only_node(&d);
    assert_eq!((n["name"].as_str(), n["state"].as_str(), n["url"].as_str()), (Some("alpha"), Some("up"), Some(d.url.as_str())), "{n}");
}
