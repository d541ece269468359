//! Background commands from the CLI: `cairn exec --detach` prints a
//! handle; `cairn process` lists, shows (waiting for the end), feeds stdin
//! and kills; bad handles fail in one line.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::Stdio;

use common::Daemon;

#[test]
fn detached_commands_are_listed_shown_fed_and_killed_from_the_cli() {
    let d = Daemon::start();
    let t = d.create(&[]);
    let sleeper = d.ok(&["exec", "--detach", "--tag", "nap", &t, "--", "sh", "-c", "echo begun; sleep 60"]).trim().to_owned();
    assert!(sleeper.parse::<u32>().is_ok(), "a handle: {sleeper}");
    let quick = d.ok(&["exec", "-d", &t, "--", "sh", "-c", "echo done; exit 3"]).trim().to_owned();
    let listed = d.ok(&["process", "list", &t]);
    assert!(listed.contains(&sleeper) && listed.contains("nap"), "{listed}");
    let shown = d.json(&["process", "show", &t, &quick, "--wait", "30s"]);
    assert_eq!((shown["running"].as_bool(), shown["exit"]["exit_code"].as_i64(), shown["stdout"].as_str()), (Some(false), Some(3), Some("done\n")), "{shown}");

    // stdin from this process, closed after it.
    let cat = d.ok(&["exec", "-d", "-i", &t, "--", "cat"]).trim().to_owned();
    let mut child = d.cmd().args(["process", "stdin", &t, &cat]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"through the cli").unwrap();
    assert!(common::output_of(child, common::CALL_DEADLINE).unwrap().status.success());
    let fed = d.json(&["process", "show", &t, &cat, "--wait", "30s"]);
    assert_eq!(fed["stdout"], "through the cli", "{fed}");

    let killed = d.json(&["process", "kill", &t, &sleeper]);
    assert_eq!((killed["running"].as_bool(), killed["exit"]["signal"].as_i64()), (Some(false), Some(9)), "{killed}");
    // Another signal reaches the command, which may handle it.
    let trapper = d.ok(&["exec", "-d", &t, "--", "sh", "-c", "trap 'echo got-term; exit 7' TERM; touch /tmp/trapping; while true; do sleep 0.1; done"]).trim().to_owned();
    d.ok(&["exec", &t, "--", "sh", "-c", "for i in $(seq 200); do [ -e /tmp/trapping ] && exit 0; sleep 0.05; done; exit 1"]);
    d.ok(&["process", "kill", &t, &trapper, "--signal", "TERM"]);
    let trapped = d.json(&["process", "show", &t, &trapper, "--wait", "30s"]);
    assert_eq!((trapped["exit"]["exit_code"].as_i64(), trapped["stdout"].as_str()), (Some(7), Some("got-term\n")), "{trapped}");
    let err = d.fails(&["process", "kill", &t, &trapper, "--signal", "STOP"]);
    assert!(err.contains("STOP") && err.contains("TERM"), "{err}");
    let err = d.fails(&["process", "show", &t, "999999"]);
    assert!(err.contains("no command 999999"), "{err}");
    let err = d.fails(&["process", "kill", &t, "nope"]);
    assert!(err.contains("not a command's handle"), "{err}");
    let term = d.ok(&["exec", "-d", "-t", &t, "--", "sh", "-c", "stty size"]).trim().to_owned();
    let shown = d.json(&["process", "show", &t, &term, "--wait", "30s"]);
    assert_eq!((shown["tty"].as_bool(), shown["stdout"].as_str().map(str::trim)), (Some(true), Some("24 80")), "{shown}");
    let err = d.fails(&["process", "list", "tnosuchtask1"]);
    assert!(err.contains("tnosuchtask1"), "{err}");
    d.ok(&["destroy", &t]);
}
