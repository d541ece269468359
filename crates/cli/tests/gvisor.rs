//! The gvisor driver end to end, through the real CLI and daemon on real
//! runsc: processes and memory kept across a wait, an approval and a wake,
//! a rollback to a snapshot with memory, a fork from one; without memory
//! they start over as under the native driver; bad input. The isolation,
//! limits, egress and delivery tests run on gvisor too (scripts/test.sh
//! runs them again with CAIRN_TEST_ISOLATION=gvisor).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Daemon;

/// A service that keeps a counter only in its shell's memory, with a boot
/// id drawn at its start, and writes both out every 100 ms.
const COUNTER: &str = "b=$(head -c6 /dev/urandom | od -An -tx1 | tr -d ' \\n'); i=0; \
    while true; do i=$((i+1)); echo \"$b $i\" > /workspace/counter.new && mv /workspace/counter.new /workspace/counter; sleep 0.1; done";

fn require_runsc() {
    let found = common::run(std::process::Command::new("runsc").arg("--version"));
    assert!(found.is_ok_and(|o| o.status.success()), "runsc is missing: apt-get install runsc (scripts/setup-debian.sh does)");
}

/// The service's boot id and count, as last written.
fn counter(d: &Daemon, task: &str) -> (String, u64) {
    let (code, out, err) = d.sh(task, "cat /workspace/counter");
    assert_eq!(code, 0, "reading the counter: {out}{err}");
    let (boot, n) = out.trim().split_once(' ').unwrap_or_else(|| panic!("counter file: {out:?}"));
    (boot.to_owned(), n.parse().unwrap_or_else(|_| panic!("counter: {out:?}")))
}

/// The counter once a live writer changed it: right after a wake or a
/// rollback the file still holds what the disk had, whichever process runs
/// now; the next write tells which one (its boot id).
fn live_counter(d: &Daemon, task: &str) -> (String, u64) {
    let first = counter(d, task);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = counter(d, task);
        if now != first {
            return now;
        }
        assert!(Instant::now() < deadline, "nothing writes the counter: it stays at {first:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (at most 30 s) until the counter reached `at_least`.
fn counter_reaches(d: &Daemon, task: &str, at_least: u64) -> (String, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out, _) = d.sh(task, "cat /workspace/counter 2>/dev/null");
        if code == 0 {
            if let Some((b, n)) = out.trim().split_once(' ') {
                if n.parse::<u64>().is_ok_and(|n| n >= at_least) {
                    return (b.to_owned(), n.parse().unwrap());
                }
            }
        }
        assert!(Instant::now() < deadline, "the counter did not reach {at_least}: {out}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gvisor_task(d: &Daemon, extra: &[&str]) -> String {
    let mut args = vec!["--isolation", "gvisor", "--service", COUNTER];
    args.extend_from_slice(extra);
    d.create(&args)
}

fn destroy_clean(d: &Daemon, task: &str) {
    d.ok(&["destroy", task]);
    let left = d.leftovers(task, 0);
    assert!(left.is_empty(), "task {task} left {left:?}");
}

#[test]
fn a_counter_in_memory_continues_after_wait_approval_and_wake() {
    require_runsc();
    let d = Daemon::start();
    let id = gvisor_task(&d, &[]);
    let view = d.task(&id);
    assert_eq!(view["config"]["isolation"], "gvisor");
    assert_eq!(view["config"]["keep_memory"], true, "gvisor tasks keep memory by default");
    let (boot, before) = counter_reaches(&d, &id, 5);

    let w = d.json(&["wait", &id, "--approval", "go on?"]);
    assert_eq!(w["task_state"], "suspended", "{w}");
    // Suspended: no process of the sandbox is left, only the cached disk.
    let left: Vec<String> = d.leftovers(&id, 0).into_iter().filter(|t| !t.contains(&format!("{id}.img"))).collect();
    assert!(left.is_empty(), "a suspended gvisor task left {left:?}");
    let snaps = d.json(&["snapshot", "list", &id]);
    let suspend = snaps.as_array().unwrap().last().unwrap();
    assert_eq!((suspend["kind"].as_str(), suspend["with_memory"].as_bool()), (Some("suspend"), Some(true)), "{suspend}");

    d.ok(&["approve", &id]);
    d.wait_for_state(&id, "running", Duration::from_secs(30));
    let (boot_after, after) = live_counter(&d, &id);
    assert_eq!(boot_after, boot, "the service was started again instead of continued");
    assert!(after >= before, "the counter went back from {before} to {after}");
    assert!(after < before + 50, "the counter ran on while suspended: {before} -> {after}");
    let (_, later) = counter_reaches(&d, &id, after + 3);
    assert!(later > after, "the counter stopped after the wake");
    let log = d.json(&["log", &id]);
    let wake = log.as_array().unwrap().iter().rev().find(|e| e["kind"] == "wake").unwrap();
    assert_eq!(wake["args"]["resumed_processes"], true, "{wake}");
    destroy_clean(&d, &id);
}

#[test]
fn without_keep_memory_a_wake_starts_the_services_again() {
    require_runsc();
    let d = Daemon::start();
    let id = gvisor_task(&d, &["--keep-memory", "false"]);
    assert_eq!(d.task(&id)["config"]["keep_memory"], false);
    let (boot, _) = counter_reaches(&d, &id, 3);
    d.ok(&["suspend", &id]);
    d.ok(&["resume", &id]);
    let (boot_after, _) = live_counter(&d, &id);
    assert_ne!(boot_after, boot, "no memory was kept: the service starts over");
    let snaps = d.json(&["snapshot", "list", &id]);
    assert!(snaps.as_array().unwrap().iter().all(|s| s["with_memory"] == false), "{snaps}");
    destroy_clean(&d, &id);
}

#[test]
fn a_rollback_to_a_snapshot_with_memory_restores_its_processes() {
    require_runsc();
    let d = Daemon::start();
    let id = gvisor_task(&d, &[]);
    let (boot, _) = counter_reaches(&d, &id, 3);
    let snap = d.json(&["snapshot", &id, "--with-memory", "--note", "counting"]);
    assert_eq!(snap["with_memory"], true, "{snap}");
    let sid = snap["id"].as_str().unwrap().to_owned();
    // The snapshot restored the sandbox from its checkpoint at once.
    let (boot_now, at_snapshot) = live_counter(&d, &id);
    assert_eq!(boot_now, boot, "the snapshot restarted the service");
    let (_, moved_on) = counter_reaches(&d, &id, at_snapshot + 40);

    d.ok(&["rollback", &id, "--to", &sid, "--reason", "that went nowhere"]);
    let (boot_back, back) = live_counter(&d, &id);
    assert_eq!(boot_back, boot, "the rollback started the service again instead of restoring it");
    // Back at the snapshot's count, plus what ran since the rollback.
    assert!(back < moved_on, "the counter did not go back: {moved_on} -> {back}");
    let (_, later) = counter_reaches(&d, &id, back + 3);
    assert!(later > back);

    // To a snapshot without memory: files only, the service starts over.
    let plain = d.json(&["snapshot", &id, "--note", "files only"]);
    assert_eq!(plain["with_memory"], false);
    d.ok(&["rollback", &id, "--to", plain["id"].as_str().unwrap(), "--reason", "files only"]);
    let (boot_plain, _) = live_counter(&d, &id);
    assert_ne!(boot_plain, boot, "a snapshot without memory cannot continue processes");
    destroy_clean(&d, &id);
}

#[test]
fn forks_from_a_snapshot_with_memory_continue_its_processes_side_by_side() {
    require_runsc();
    let d = Daemon::start();
    let id = gvisor_task(&d, &[]);
    let (boot, _) = counter_reaches(&d, &id, 3);
    let snap = d.json(&["snapshot", &id, "--with-memory"]);
    let (_, at_snapshot) = counter(&d, &id);
    // The source runs on well past the snapshot, then holds still.
    let (_, source_at) = counter_reaches(&d, &id, at_snapshot + 40);
    d.ok(&["suspend", &id]);
    let children = d.json(&["fork", &id, "--from", snap["id"].as_str().unwrap(), "--count", "2"]);
    let children: Vec<String> = children.as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(children.len(), 2);
    for child in &children {
        let (child_boot, n) = live_counter(&d, child);
        assert_eq!(child_boot, boot, "fork {child} started the service again");
        assert!(n >= at_snapshot && n < source_at, "fork {child} is at {n}: not from the snapshot (about {at_snapshot}; the source went on to {source_at})");
        counter_reaches(&d, child, n + 3);
        let branch = d.json(&["snapshot", "list", child]);
        assert_eq!(branch[0]["with_memory"], true, "{branch}");
    }
    // Each fork's counter is its own.
    d.ok(&["exec", &children[0], "--", "sh", "-c", "echo mine > /workspace/own"]);
    let (code, _, _) = d.sh(&children[1], "test -e /workspace/own");
    assert_ne!(code, 0, "forks share a file");
    for child in &children {
        destroy_clean(&d, child);
    }
    destroy_clean(&d, &id);
}

#[test]
fn bad_isolation_requests_are_refused_with_one_line() {
    require_runsc();
    let d = Daemon::start();
    let err = d.fails(&["task", "create", "--isolation", "vm"]);
    assert!(err.contains("invalid isolation \"vm\"") && err.lines().count() == 1, "{err}");
    let err = d.fails(&["task", "create", "--isolation", "native", "--keep-memory", "true"]);
    assert!(err.contains("--keep-memory needs --isolation gvisor"), "{err}");
    assert_eq!(d.json(&["task", "list"]).as_array().unwrap().len(), 0, "a refused create made a task");
    // A native task has no memory to keep.
    let native = d.create(&["--isolation", "native"]);
    let err = d.fails(&["snapshot", &native, "--with-memory"]);
    assert!(err.contains("--with-memory needs a gvisor task"), "{err}");
    assert_eq!(d.json(&["snapshot", "list", &native]).as_array().unwrap().len(), 0, "a refused snapshot was taken");
    let other_home = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let out = common::run(std::process::Command::new(common::CAIRN).args(["serve", "--isolation", "vm"]).env("CAIRN_HOME", other_home.path())).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--isolation") && err.contains("\"vm\""), "{err}");
    destroy_clean(&d, &native);
}

/// `program`, run in the network namespace pinned at `netns`, or in this
/// test's (the host's, where the daemon runs) when `None`.
fn in_netns(netns: Option<&std::path::Path>, program: &str) -> std::process::Command {
    match netns {
        Some(pin) => {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net={}", pin.display())).arg(program);
            c
        }
        None => std::process::Command::new(program),
    }
}

/// `python3` connecting to the abstract unix socket `name` (NULs written
/// `@`, as /proc/net/unix shows them) as uid 65534,
/// in the network namespace pinned at `netns` (the host's when `None`):
/// "connected", or the error.
fn connect_as_nobody(netns: Option<&std::path::Path>, name: &str) -> String {
    const CONNECT: &str = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(2)\n\
        try:\n    s.connect('\\0' + sys.argv[1].replace('@', '\\0')); print('connected')\nexcept OSError as e:\n    print(e.strerror)";
    let mut cmd = in_netns(netns, "setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", CONNECT, name]);
    let out = common::output_within(&mut cmd, Duration::from_secs(30));
    assert!(out.status.success(), "connect probe: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The abstract unix sockets listed in `/proc/net/unix` of the network
/// namespace pinned at `netns` (the host's when `None`).
fn abstract_sockets(netns: Option<&std::path::Path>) -> Vec<String> {
    let mut cmd = in_netns(netns, "cat");
    let out = common::output_within(cmd.arg("/proc/net/unix"), Duration::from_secs(30));
    assert!(out.status.success(), "reading /proc/net/unix: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().skip(1).filter_map(|l| l.split_whitespace().nth(7)).filter_map(|p| p.strip_prefix('@')).map(str::to_owned).collect()
}

/// runsc's control socket is an abstract unix socket, which has no
/// permissions: bound in the host's network namespace, any local user
/// could run commands in the sandbox through it. Every runsc call runs in
/// a namespace of the task's own, so on the host there is nothing to reach,
/// neither for a host user nor for runsc itself; in that namespace (the
/// positive control) the same probes do reach it.
#[test]
fn no_control_socket_of_a_gvisor_task_is_reachable_from_the_host() {
    require_runsc();
    let d = Daemon::start();
    let id = gvisor_task(&d, &[]);
    counter_reaches(&d, &id, 2);
    let pin = d.home().join("run").join(&id).join("runsc.netns");
    // As /proc/net/unix shows it: runsc's name ends in a NUL, shown as `@`.
    let control = format!("runsc-sandbox.{id}@");

    let on_host = abstract_sockets(None);
    assert!(!on_host.iter().any(|s| s.contains(&id)), "an abstract socket of task {id} is in the host's namespace: {on_host:?}");
    assert_eq!(connect_as_nobody(None, &control), "Connection refused", "the control socket answers a host user");
    // Every abstract socket a host user can see: none is the task's, and
    // connecting to each changes nothing in the task.
    let before = counter(&d, &id).0;
    for name in &on_host {
        let said = connect_as_nobody(None, name);
        assert!(!said.is_empty());
    }
    // runsc itself, run where it is not told to go, finds no sandbox.
    let state = d.home().join("run").join(&id).join("runsc");
    let ps = |netns: Option<&std::path::Path>| {
        let mut cmd = in_netns(netns, "runsc");
        cmd.arg("--root").arg(&state).args(["--network=none", "ps", &id]);
        common::output_within(&mut cmd, Duration::from_secs(30))
    };
    let from_host = ps(None);
    assert!(!from_host.status.success(), "runsc reached the sandbox from the host's namespace: {}", String::from_utf8_lossy(&from_host.stdout));

    // Positive controls: in the task's own namespace the socket is there,
    // a host user's connect is accepted, and runsc lists the processes.
    let inside = abstract_sockets(Some(&pin));
    assert!(inside.contains(&control), "{control} in the task's namespace: {inside:?}");
    assert_eq!(connect_as_nobody(Some(&pin), &control), "connected");
    let listed = ps(Some(&pin));
    assert!(listed.status.success() && String::from_utf8_lossy(&listed.stdout).contains("PID"), "runsc ps in the task's namespace: {}", String::from_utf8_lossy(&listed.stderr));
    assert_eq!(counter(&d, &id).0, before, "the task's service is the one it was");
    destroy_clean(&d, &id);
}
