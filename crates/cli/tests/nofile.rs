//! The daemon raises its own descriptor limit, and its sandboxes keep the
//! one it was started with. Alone in its binary: it lowers the test
//! process's own soft limit, which the daemon inherits.

#![allow(clippy::unwrap_used)]

mod common;

use common::Daemon;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The soft limit the daemon is started with.
const STARTED_WITH: u64 = 1536;

fn soft_limit_in(limits: &str) -> u64 {
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("no `Max open files` line");
    line.split_whitespace().nth(3).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("unreadable limit line: {line}"))
}

#[test]
fn the_daemon_raises_its_descriptor_limit_and_sandboxes_keep_the_one_it_was_given() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(hard > STARTED_WITH, "the hard descriptor limit ({hard}) must be above {STARTED_WITH} for this test");
    setrlimit(Resource::RLIMIT_NOFILE, STARTED_WITH, hard).unwrap();
    let d = Daemon::start();
    let daemon = std::fs::read_to_string(format!("/proc/{}/limits", d.pid())).unwrap();
    assert_eq!(soft_limit_in(&daemon), hard, "the daemon runs with the hard limit as its soft one");
    let task = d.create(&[]);
    let (code, out, err) = d.sh(&task, "ulimit -n");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), STARTED_WITH.to_string(), "a sandbox gets the limit the daemon was started with");
    // Control: the limit is the sandbox's own, raised inside up to its hard one.
    let (code, out, err) = d.sh(&task, &format!("ulimit -n {hard} && ulimit -n"));
    assert_eq!((code, out.trim()), (0, hard.to_string().as_str()), "{err}");
}
