//! Two `cairn serve` daemons ("nodes") sharing one PostgreSQL store and
//! one S3 blob store (moto's server), through the real CLI, on one host.
//!
//! The contract under test (docs/architecture.md, "Nodes"): every node
//! uses the same API token and approval-link key; a task runs on at most
//! one node at a time, under a lease (here `--lease 4s`: heartbeats every
//! 0.8 s; 10 s by default); any
//! node accepts any call and forwards it to the node that runs the task;
//! an event wakes a suspended task on the node that accepted it, or on
//! another with room; a node that stops heartbeating has its running tasks
//! recovered elsewhere from their latest snapshot, with a recovery note
//! naming it.
//!
//! The nodes are named `node-a` and `node-b`, not `a` and `b`: a recovery
//! note must be checked for the lost node's name, and a one-letter name is
//! found in any sentence.
//!
//! Which node's sandbox a process belongs to is told from `/proc`, not
//! from what the daemons say: a sandbox's processes are in the cgroup of
//! its task (`/cairn/<task id>`, the same name whichever node made it) and
//! their root filesystem is an overlay built under the run directory of
//! the home of the daemon that made it (`<home>/run/<task id>/…`).
//!
//! A node is lost the way a machine is: its daemon and every process of
//! its sandboxes are killed at once, and what a reboot clears goes with
//! them (the mounts and loop devices of its home, its sandboxes' cgroups,
//! its uid slot records), while its home's files stay, as a disk would.
//! Both nodes share one kernel here, so leaving those behind would be
//! state that no real second machine could see.
//!
//! The clusters of this file run one at a time: the recovery tests count
//! seconds, and two clusters of sandboxes on a small host would blur them.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use cairn_blob::moto::Moto;
use cairn_store::testing::postgres::{fresh_database, TempDatabase};
use common::{Daemon, Rng};
use hmac::Mac as _;
use serde_json::Value;

const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";

/// The nodes' lease (`--lease`), shorter than the default 10 s so that
/// the losses and takeovers below take less time.
const LEASE_ARG: &str = "4s";
const LEASE: Duration = Duration::from_secs(4);

/// How long a lost node's tasks may take to run elsewhere: its leases
/// expire within a lease of its last heartbeat, then the next pass of the
/// recovering node (a heartbeat later); ample for a slow host.
const RECOVERY_LIMIT: Duration = Duration::from_secs(40);

/// How long a wake (a restore from the bucket) may take.
const WAKE_LIMIT: Duration = Duration::from_secs(60);

// --- the cluster --------------------------------------------------------

/// Two nodes on one fresh PostgreSQL database and one fresh bucket.
///
/// Dropping it (also when the test fails) starts again a node the test
/// killed (same home, same arguments), destroys every task through the
/// node that runs it and gives the other node a moment to drop what it
/// kept of them; then each [`Daemon`] stops and runs the leak scan over
/// its home and every task of the cluster, the database is dropped and
/// moto stops (when no other test holds it).
struct Cluster {
    // Dropped in this order: the daemons before the store and the bucket
    // they use.
    a: Daemon,
    b: Daemon,
    _db: TempDatabase,
    moto: Arc<Moto>,
    bucket: String,
    _turn: MutexGuard<'static, ()>,
}

/// The bucket prefix both nodes store their blobs under.
const BLOB_PREFIX: &str = "pool";

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

impl Cluster {
    fn start() -> Cluster {
        Self::start_with(&[], &[])
    }

    /// A cluster whose nodes get these arguments besides the shared ones.
    /// `node-a` starts first: it is the one whose token the cluster keeps.
    fn start_with(extra_a: &[&str], extra_b: &[&str]) -> Cluster {
        let turn = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let moto = Moto::shared();
        let bucket = format!("cairn-cluster-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        moto.create_bucket(&bucket);
        let db = fresh_database();
        let blob = format!("s3://{bucket}/{BLOB_PREFIX}");
        let env = moto.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let start = |node: &str, extra: &[&str]| {
            let mut args = vec!["--store", db.url.as_str(), "--blob", blob.as_str(), "--node", node, "--lease", LEASE_ARG];
            args.extend_from_slice(extra);
            Daemon::start_with_env(&args, &env)
        };
        let a = start(NODE_A, extra_a);
        let b = start(NODE_B, extra_b);
        Cluster { a, b, _db: db, moto, bucket, _turn: turn }
    }

    fn node(&self, name: &str) -> &Daemon {
        match name {
            NODE_A => &self.a,
            NODE_B => &self.b,
            _ => panic!("no node {name} in the cluster"),
        }
    }

    fn node_mut(&mut self, name: &str) -> &mut Daemon {
        match name {
            NODE_A => &mut self.a,
            NODE_B => &mut self.b,
            _ => panic!("no node {name} in the cluster"),
        }
    }

    /// (node name, home) of both nodes.
    fn homes(&self) -> Vec<(&'static str, PathBuf)> {
        vec![(NODE_A, self.a.home().to_owned()), (NODE_B, self.b.home().to_owned())]
    }

    /// The nodes that have processes of `task`'s sandbox right now (seen in
    /// /proc, whatever the daemons say).
    fn live_on(&self, task: &str) -> BTreeSet<&'static str> {
        let scan = scan_sandboxes(&[task.to_owned()], &self.homes());
        scan.live.get(task).map(|by_node| by_node.keys().copied().collect()).unwrap_or_default()
    }

    /// Waits until `task show` through `via` says the task runs on `node`,
    /// and checks that its sandbox's processes are there and nowhere else.
    fn wait_running_on(&self, via: &str, task: &str, node: &str, limit: Duration) -> Value {
        let d = self.node(via);
        let deadline = Instant::now() + limit;
        loop {
            let last = match d.try_cairn(&["--json", "task", "show", task]) {
                Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
                Ok(out) => serde_json::json!({ "error": String::from_utf8_lossy(&out.stderr).trim() }),
                Err(e) => serde_json::json!({ "error": e }),
            };
            assert!(last.get("state").is_none() || last.get("node").is_some(), "task show has no `node` field: {last}");
            if last["state"] == "running" && last["node"] == node {
                let live = self.live_on(task);
                assert_eq!(live, BTreeSet::from([node]), "task {task} runs on {node} by the store, but its sandbox processes are on {live:?}: {last}");
                return last;
            }
            assert!(
                Instant::now() < deadline,
                "task {task} is not running on {node} after {limit:?} (its sandbox processes are on {:?}); task show through {via}: {last}\n{}",
                self.live_on(task),
                self.log_tails()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of both daemons' logs, for a failure message.
    fn log_tails(&self) -> String {
        [(NODE_A, &self.a), (NODE_B, &self.b)].iter().map(|(n, d)| format!("--- {n}'s log, last lines:\n{}", tail(&d.log(), 30))).collect::<Vec<_>>().join("\n")
    }

    /// Loses `node` as a machine is lost (see the top of this file).
    /// Returns the names of the cgroups its sandboxes were in: the ids of
    /// its tasks, and of the sandboxes it had started ahead.
    fn lose(&mut self, node: &str) -> BTreeSet<String> {
        let d = self.node_mut(node);
        assert!(d.is_running(), "{node} is not running: there is nothing to lose");
        let home = d.home().to_owned();
        let daemon = d.pid() as i32;
        // Everything of the node, found before anything dies (a killed
        // daemon's children are reparented, and no longer found from it).
        let mut doomed: Vec<Proc> = descendants(daemon).into_iter().chain(in_sandboxes_of(&home)).filter_map(Proc::of).collect();
        let mut cgroups: BTreeSet<String> = doomed.iter().filter_map(|p| cairn_cgroup_name(p.pid)).collect();
        d.kill();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for p in &doomed {
                p.kill();
            }
            for p in &doomed {
                common::reap(p.pid);
            }
            // A process forked meanwhile by a sandbox that was still alive.
            doomed = in_sandboxes_of(&home).into_iter().filter_map(Proc::of).collect();
            if doomed.is_empty() {
                break;
            }
            cgroups.extend(doomed.iter().filter_map(|p| cairn_cgroup_name(p.pid)));
            assert!(Instant::now() < deadline, "processes of {node}'s sandboxes still run 20 s after SIGKILL: {doomed:?}");
        }
        forget_as_a_reboot_does(&home, &cgroups);
        cgroups
    }

    /// Every task of the cluster with the node that runs its sandbox, by
    /// the node list of whichever node answers.
    fn tasks_by_node(&self) -> Result<Vec<(String, String, Option<String>)>, String> {
        let mut last = String::new();
        for d in [&self.a, &self.b] {
            let tasks = match d.try_cairn(&["--json", "task", "list", "--all"]) {
                Ok(out) if out.status.success() => serde_json::from_slice::<Value>(&out.stdout).map_err(|e| e.to_string())?,
                Ok(out) => {
                    last = format!("task list: {}", String::from_utf8_lossy(&out.stderr).trim());
                    continue;
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let nodes = d.try_cairn(&["--json", "node", "list"]).ok().and_then(|out| serde_json::from_slice::<Value>(&out.stdout).ok()).unwrap_or(Value::Null);
            let runs = |task: &str| {
                nodes.as_array().into_iter().flatten().find(|n| n["tasks"].as_array().is_some_and(|ts| ts.iter().any(|t| t == task))).and_then(|n| n["name"].as_str().map(str::to_owned))
            };
            return Ok(tasks
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| {
                    let id = t["id"].as_str()?.to_owned();
                    let node = runs(&id);
                    Some((id, t["state"].as_str().unwrap_or_default().to_owned(), node))
                })
                .collect());
        }
        Err(format!("no node lists the tasks: {last}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut problems = Vec::new();
        for node in [NODE_A, NODE_B] {
            let d = self.node_mut(node);
            if !d.is_running() {
                if let Err(e) = d.try_respawn() {
                    problems.push(format!("starting {node} again to clean up: {e}"));
                }
            }
        }
        // Through the node that runs each task: the other one may not be
        // able to reach its sandbox. Each daemon's own cleanup then finds
        // nothing left to destroy, stops it and scans for leaks.
        let mut ids = Vec::new();
        match self.tasks_by_node() {
            Ok(tasks) => {
                ids = tasks.iter().map(|(id, ..)| id.clone()).collect();
                for (id, state, node) in tasks.into_iter().filter(|(_, state, _)| state != "destroyed") {
                    let first = node.as_deref().unwrap_or(NODE_A);
                    let second = if first == NODE_A { NODE_B } else { NODE_A };
                    let mut why = Vec::new();
                    for via in [first, second] {
                        match self.node(via).try_cairn(&["destroy", &id]) {
                            Ok(out) if out.status.success() => {
                                why.clear();
                                break;
                            }
                            Ok(out) => why.push(format!("through {via}: {}", String::from_utf8_lossy(&out.stderr).trim())),
                            Err(e) => why.push(format!("through {via}: {e}")),
                        }
                    }
                    if !why.is_empty() {
                        problems.push(format!("destroy {id} ({state}, on {node:?}): {}", why.join("; ")));
                    }
                }
            }
            Err(e) => problems.push(e),
        }
        // A destroyed task leaves nothing on any node, not even a disk a
        // node kept of it after it moved elsewhere; a node may notice the
        // destroy a moment after the one that did it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while [&self.a, &self.b].iter().any(|d| !common::leaks::scan_while_running(d.home(), &ids).is_empty()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for (node, d) in [(NODE_A, &self.a), (NODE_B, &self.b)] {
            let left = common::leaks::scan_while_running(d.home(), &ids);
            if !left.is_empty() {
                problems.push(format!("10 s after every task was destroyed, {node} ({}) still has: {}", d.home().display(), left.join("; ")));
            }
        }
        if !problems.is_empty() {
            // The daemons' own cleanup runs next and fails the test on what
            // is left; this says why it may be.
            eprintln!("cleaning up the cluster:\n  {}", problems.join("\n  "));
        }
    }
}

// --- sandbox processes in /proc ------------------------------------------

/// The sandboxes of some tasks as /proc shows them.
#[derive(Debug, Default)]
struct Scan {
    /// task -> node -> pids: the processes in the task's cgroup whose root
    /// filesystem was built in that node's home.
    live: BTreeMap<String, BTreeMap<&'static str, Vec<i32>>>,
    /// Processes in a task's cgroup with a root of no node's sandbox (being
    /// set up, or already a zombie).
    unplaced: usize,
}

fn scan_sandboxes(tasks: &[String], homes: &[(&'static str, PathBuf)]) -> Scan {
    let mut scan = Scan::default();
    for pid in pids() {
        // A process may end between the listing and the read.
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { continue };
        let Some(task) = tasks.iter().find(|t| cgroup.contains(&format!("/{t}"))) else { continue };
        match slot_owner(pid).and_then(|owner| homes.iter().find(|(_, home)| owner.starts_with(&format!("{}/run\t", home.display())))) {
            Some((node, _)) => scan.live.entry(task.clone()).or_default().entry(node).or_default().push(pid),
            None => scan.unplaced += 1,
        }
    }
    scan
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// The owner line of the host's uid slot record of the user namespace
/// `pid` is in ("HOME/run<TAB>TASK"), found from the kernel's uid map of
/// the process: the sandbox's mount table names no host path.
fn slot_owner(pid: i32) -> Option<String> {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).ok()?;
    // Fields: first id inside, first id outside, count.
    let outside: u32 = map.split_whitespace().nth(1)?.parse().ok()?;
    let first = cairn_sandbox::IdRange::for_slot(0).ok()?;
    let slot = outside.checked_sub(first.host_base)? / first.count;
    let record = std::fs::read_to_string(format!("/run/cairn/uid-slots/{slot}")).ok()?;
    record.lines().next().map(str::to_owned)
}

/// Processes of sandboxes whose uid slot `home` holds.
fn in_sandboxes_of(home: &Path) -> Vec<i32> {
    let owner = format!("{}/run\t", home.display());
    pids().into_iter().filter(|&pid| slot_owner(pid).is_some_and(|o| o.starts_with(&owner))).collect()
}

/// A process as it was seen: its pid and start time, so that a pid taken
/// by a new process meanwhile is not killed in its place.
#[derive(Debug)]
struct Proc {
    pid: i32,
    start: u64,
}

impl Proc {
    fn of(pid: i32) -> Option<Proc> {
        Some(Proc { pid, start: start_time(pid)? })
    }

    fn kill(&self) {
        if start_time(self.pid) == Some(self.start) {
            // SAFETY: kill with the pid of the process seen, still that one.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// When the process started (field 22 of its stat), in clock ticks.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis, from field 3 (the state).
    stat[stat.rfind(')')? + 2..].split(' ').nth(19)?.parse().ok()
}

/// `pid` and every process below it.
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = pids()
        .into_iter()
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            // After the command's closing parenthesis: state, then the parent.
            let ppid = stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found
}

/// The name of the cairn cgroup the process is in (its task's id, or the
/// id a sandbox started ahead holds), if any.
fn cairn_cgroup_name(pid: i32) -> Option<String> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?;
        let mut parts = path.split('/').skip_while(|p| *p != "cairn");
        parts.next()?;
        parts.next().filter(|n| !n.is_empty()).map(str::to_owned)
    })
}

/// What a reboot of a lost node's machine would clear, the processes being
/// dead already: the mounts and loop devices of its home, the cgroups its
/// sandboxes were in, its uid slot records. Its home's files stay.
fn forget_as_a_reboot_does(home: &Path, cgroups: &BTreeSet<String>) {
    let home_s = home.display().to_string();
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let mut mounts: Vec<&str> = table.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&home_s)).collect();
    // Deepest first.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    // Failures are reported, not fatal: what stays is found by the leak
    // scan at the end.
    for m in mounts {
        let out = common::run(Command::new("umount").arg("-l").arg(m)).unwrap();
        if !out.status.success() {
            eprintln!("umount -l {m}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).unwrap_or_default();
        if name.starts_with("loop") && backing.contains(&home_s) {
            let out = common::run(Command::new("losetup").args(["-d", &format!("/dev/{name}")])).unwrap();
            if !out.status.success() {
                eprintln!("losetup -d /dev/{name}: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
        }
    }
    for name in cgroups {
        for dir in common::task_cgroup(name).paths() {
            remove_cgroup(&dir);
        }
    }
    if let Ok(slots) = std::fs::read_dir("/run/cairn/uid-slots") {
        for e in slots.flatten() {
            if std::fs::read_to_string(e.path()).is_ok_and(|owner| owner.contains(&home_s)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Removes an emptied cgroup and the groups below it, deepest first. One
/// that another node's sandbox now uses is busy and stays.
fn remove_cgroup(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&e.path());
        }
    }
    // The last killed processes leave their cgroup a moment after they die.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::remove_dir(dir).is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- helpers -----------------------------------------------------------

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}\n--- daemon log:\n{}", tail(&d.log(), 30));
    out
}

/// What the task's files are: names, sizes and hashes.
fn files(d: &Daemon, task: &str) -> String {
    must(d, task, "cd /workspace && find . -type f | sort | xargs -r sha256sum")
}

/// Polls `task show` through `d` until the task is in state `want`.
fn wait_for_state(d: &Daemon, task: &str, want: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let t = d.task(task);
        if t["state"] == want {
            return t;
        }
        assert!(Instant::now() < deadline, "task {task} is {} after {limit:?}, not {want}: {t}\n{}", t["state"], tail(&d.log(), 30));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `curl` with a status line: (status, body); status 0 when no answer came.
fn curl(args: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"]).args(args);
    let out = common::output_within(&mut cmd, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A Standard Webhooks signature (HMAC-SHA256 over `id.timestamp.body`
/// with the secret after `whsec_`); checked against the Python reference
/// package by the load test.
fn sign(secret: &str, msg_id: &str, ts: i64, body: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.trim_start_matches("whsec_")).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{msg_id}.{ts}.{body}").as_bytes());
    format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
}

/// The same signature made by the Python `standardwebhooks` package.
fn reference_sign(secret: &str, msg_id: &str, ts: i64, body: &str) -> String {
    const SIGN: &str = "import sys, datetime\nfrom standardwebhooks import Webhook\n\
                        s, i, t, b = sys.argv[1:5]\n\
                        print(Webhook(s).sign(i, datetime.datetime.fromtimestamp(int(t), tz=datetime.timezone.utc), b))";
    let out = common::run(Command::new("python3").args(["-c", SIGN, secret, msg_id, &ts.to_string(), body]).stdin(Stdio::null())).unwrap();
    assert!(out.status.success(), "signing with standardwebhooks failed (pip install standardwebhooks): {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// --- the tests ---------------------------------------------------------

#[test]
fn two_nodes_share_one_store_and_each_lists_both() {
    let c = Cluster::start();
    for (via, d) in [(NODE_A, &c.a), (NODE_B, &c.b)] {
        let nodes = d.json(&["node", "list"]);
        let seen: BTreeMap<&str, (&str, &str)> = nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["name"].as_str().unwrap(), (n["state"].as_str().unwrap(), n["url"].as_str().unwrap())))
            .collect();
        let want = BTreeMap::from([(NODE_A, ("up", c.a.url.as_str())), (NODE_B, ("up", c.b.url.as_str()))]);
        assert_eq!(seen, want, "node list through {via}: {nodes}");
    }
    // One store: a task made through one node is listed by the other, as
    // running on the node that made it; one bucket: its snapshot is there.
    let id = c.a.create(&[]);
    wait_for_state(&c.a, &id, "running", WAKE_LIMIT);
    let tasks = c.b.json(&["task", "list"]);
    assert!(tasks.as_array().unwrap().iter().any(|t| t["id"] == id.as_str()), "node-b does not list {id}: {tasks}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes = c.b.json(&["node", "list"]);
        let runs_it: Vec<&str> = nodes.as_array().unwrap().iter().filter(|n| n["tasks"].as_array().unwrap().iter().any(|t| t == id.as_str())).map(|n| n["name"].as_str().unwrap()).collect();
        if runs_it == [NODE_A] {
            break;
        }
        assert!(Instant::now() < deadline, "node-b's node list does not show {id} on node-a: {nodes}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.live_on(&id), BTreeSet::from([NODE_A]), "the sandbox's processes are node-a's");
    must(&c.a, &id, "head -c 100000 /dev/urandom > /workspace/data");
    c.a.ok(&["snapshot", &id]);
    assert!(!c.moto.keys(&c.bucket, &format!("{BLOB_PREFIX}/packs/")).is_empty(), "the snapshot's packs are in the shared bucket");
}

#[test]
fn every_node_uses_the_token_and_approval_key_of_the_first() {
    let c = Cluster::start();
    let token = |d: &Daemon| std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned();
    assert_eq!(token(&c.b), token(&c.a), "node-b adopted node-a's API token into its home");
    // The CLI of either home works against either daemon.
    for (home, other) in [(&c.a, &c.b), (&c.b, &c.a)] {
        let out = common::output_within(home.cmd().env("CAIRN_URL", &other.url).args(["task", "list"]).stdin(Stdio::null()), common::CALL_DEADLINE);
        assert!(out.status.success(), "the CLI of {} against {}: {}", home.home().display(), other.url, String::from_utf8_lossy(&out.stderr));
    }
    // An approval link one node signed opens on the other.
    let id = c.a.create(&[]);
    let w = c.a.json(&["wait", &id, "--approval", "Deploy the release?"]);
    let link = w["approval_url"].as_str().unwrap();
    assert!(link.starts_with(&c.a.url), "{link}");
    let (code, page) = curl(&[&link.replacen(&c.a.url, &c.b.url, 1)]);
    assert_eq!(code, 200, "node-b refuses node-a's approval link: {page}");
    assert!(page.contains("Deploy the release?"), "{page}");
}

#[test]
fn a_task_suspended_on_a_wakes_on_b_with_its_files() {
    let c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "mkdir -p /workspace/src && head -c 3000000 /dev/urandom > /workspace/data.bin && seq 1 20000 > /workspace/src/numbers");
    c.a.ok(&["snapshot", &id]);
    // Changed after the snapshot: the wake must bring the files as they
    // were at the wait, not at the last snapshot.
    must(&c.a, &id, "echo after the snapshot > /workspace/notes && rm /workspace/src/numbers && seq 1 7 > /workspace/src/seven");
    let before = files(&c.a, &id);

    let w = c.a.json(&["wait", &id, "--approval", "Publish the report?"]);
    assert_eq!(w["state"], "pending", "{w}");
    let t = wait_for_state(&c.a, &id, "suspended", WAKE_LIMIT);
    assert!(t["node"].is_null(), "a suspended task runs on no node: {t}");
    assert_eq!(c.live_on(&id), BTreeSet::new(), "no process of the suspended task is left");

    // Approved through node-b, which has room: it wakes there, from the bucket.
    c.b.ok(&["approve", &id, "--comment", "looks good"]);
    c.wait_running_on(NODE_B, &id, NODE_B, WAKE_LIMIT);
    assert_eq!(files(&c.b, &id), before, "the files as they were at the wait, on node-b");
    // Through node-a, which forwards to node-b (the sandbox stays there).
    assert_eq!(files(&c.a, &id), before, "exec through node-a");
    let t = c.a.task(&id);
    assert_eq!((t["state"].as_str(), t["node"].as_str()), (Some("running"), Some(NODE_B)), "{t}");
    assert_eq!(c.live_on(&id), BTreeSet::from([NODE_B]));
    let log = c.a.json(&["log", &id]);
    let approvals = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["source"] == "approval").count();
    assert_eq!(approvals, 1, "the approval took effect once: {log}");
}

#[test]
fn an_mcp_call_and_a_blocking_wait_reach_a_task_through_the_other_node() {
    let c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo from-node-a > /workspace/where");
    // An MCP tool call sent to node-b about a task node-a runs is carried
    // out there (node-b has no sandbox of it).
    let call = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"run_command","arguments":{{"task":"{id}","cmd":["cat","/workspace/where"]}}}}}}"#);
    let auth = format!("authorization: Bearer {}", std::fs::read_to_string(c.b.home().join("token")).unwrap().trim());
    let mcp = |body: &str| {
        curl(&["-X", "POST", "-H", &auth, "-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream", "--data", body, &format!("{}/mcp", c.b.url)])
    };
    let (code, answer) = mcp(&call);
    assert_eq!(code, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert!(answer.to_string().contains("from-node-a"), "the command ran in node-a's sandbox: {answer}");
    // Negative control: a call about a task no node has is answered where it arrives.
    let (_, unknown) = mcp(r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run_command","arguments":{"task":"tnosuchtask0","cmd":["true"]}}}"#);
    assert!(unknown.contains("not_found"), "{unknown}");

    // A blocking wait through node-b sees an approval given through node-a:
    // node-b is not told of node-a's writes, its heartbeat looks again.
    let w = c.a.json(&["wait", &id, "--approval", "Go on?"]);
    let wait_id = w["id"].as_str().unwrap().to_owned();
    let url = format!("{}/v1/waits/{wait_id}?block_ms=30000", c.b.url);
    let waiter = std::thread::spawn(move || curl(&["-H", &auth, &url]));
    std::thread::sleep(Duration::from_millis(500));
    // The window shown, not assumed: the long poll is still blocked.
    assert!(!waiter.is_finished(), "node-b's blocking wait answered before the approval");
    let approved = Instant::now();
    c.a.ok(&["approve", &id]);
    let (code, seen) = waiter.join().unwrap();
    assert_eq!(code, 200, "{seen}");
    let seen: Value = serde_json::from_str(&seen).unwrap();
    assert_eq!(seen["state"], "satisfied", "node-b's blocking wait ended with the approval: {seen}");
    assert!(approved.elapsed() < Duration::from_secs(15), "node-b's waiter saw the approval late: {:?}", approved.elapsed());
}

/// E2B's API on a cluster: a key made on one node works on the other, and
/// an in-sandbox call that reaches node-b about a sandbox node-a runs is
/// carried out on node-a (streams too); one with a wrong token is refused
/// where it arrives.
#[test]
fn e2b_calls_reach_a_sandbox_through_the_other_node() {
    let c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo from-node-a > /workspace/where");
    let key = c.a.ok(&["api-key", "create", "cluster"]).trim().to_owned();
    let (code, detail) = curl(&["-H", &format!("X-API-Key: {key}"), &format!("{}/sandboxes/{id}", c.b.url)]);
    assert_eq!(code, 200, "the key made on node-a works on node-b: {detail}");
    let detail: Value = serde_json::from_str(&detail).unwrap();
    let token = detail["envdAccessToken"].as_str().unwrap().to_owned();
    let call = |token: &str, method: &str, content_type: &str, body: &[u8]| {
        let body_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(body_file.path(), body).unwrap();
        curl(&[
            "-X", "POST",
            "-H", &format!("E2b-Sandbox-Id: {id}"),
            "-H", &format!("X-Access-Token: {token}"),
            "-H", "Connect-Protocol-Version: 1",
            "-H", &format!("Content-Type: {content_type}"),
            "--data-binary", &format!("@{}", body_file.path().display()),
            &format!("{}/{method}", c.b.url),
        ])
    };
    let (code, stat) = call(&token, "filesystem.Filesystem/Stat", "application/json", br#"{"path":"/workspace/where"}"#);
    assert_eq!(code, 200, "{stat}");
    assert!(stat.contains("\"name\":\"where\""), "{stat}");
    // A server stream through node-b: the command runs in node-a's sandbox.
    let start = br#"{"process":{"cmd":"cat","args":["/workspace/where"]},"stdin":false}"#;
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(start.len() as u32).to_be_bytes());
    frame.extend_from_slice(start);
    let (code, stream) = call(&token, "process.Process/Start", "application/connect+json", &frame);
    assert_eq!(code, 200, "{stream}");
    let encoded = base64::engine::general_purpose::STANDARD.encode("from-node-a\n");
    assert!(stream.contains(&encoded) && stream.contains("\"end\":{\"exitCode\":0"), "the output and the end of the command: {stream}");
    // Negative control: a wrong token is refused on node-b, not forwarded.
    let (code, refused) = call(&"0".repeat(64), "filesystem.Filesystem/Stat", "application/json", br#"{"path":"/workspace/where"}"#);
    assert_eq!(code, 401, "{refused}");
    c.a.ok(&["destroy", &id]);
}

/// A port of a task on node-a is reached through node-b with each of its
/// credentials (a traffic token, a signed link, by host name), and an
/// E2B signed `/files` URL (no header names its sandbox) too; a wrong
/// token is refused on node-b.
#[test]
fn ports_and_signed_file_urls_reach_a_task_through_the_other_node() {
    let c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "mkdir -p /workspace/www && echo served-by-node-a > /workspace/www/f.txt");
    must(&c.a, &id, "cd /workspace/www && setsid python3 -m http.server 8000 >/dev/null 2>&1 < /dev/null &");
    must(&c.a, &id, "for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1");
    let link = c.a.json(&["port", &id, "8000"]);
    let traffic = link["traffic_token"].as_str().unwrap().to_owned();
    let page = format!("{}/v1/tasks/{id}/ports/8000/f.txt", c.b.url);
    let (code, body) = curl(&["-H", &format!("X-Cairn-Traffic-Token: {traffic}"), &page]);
    assert_eq!((code, body.as_str()), (200, "served-by-node-a\n"), "by path with the traffic token");
    // The signed link, sent to node-b.
    let url = link["url"].as_str().unwrap();
    let on_b = format!("{}{}", c.b.url, &url[url.find("/v1/").unwrap()..]).replace("/ports/8000/", "/ports/8000/f.txt");
    let (code, body) = curl(&[&on_b]);
    assert_eq!((code, body.as_str()), (200, "served-by-node-a\n"), "a signed link: {on_b}");
    // By host name (E2B's get_host), through node-b.
    let host = format!("Host: 8000-{id}.sandbox.example.com");
    let (code, body) = curl(&["-H", &host, "-H", &format!("E2b-Traffic-Access-Token: {traffic}"), &format!("{}/f.txt", c.b.url)]);
    assert_eq!((code, body.as_str()), (200, "served-by-node-a\n"), "by host name");
    // Negative control: a wrong token is refused where it arrives.
    let (code, _) = curl(&["-H", &format!("X-Cairn-Traffic-Token: {}", "0".repeat(64)), &page]);
    assert_eq!(code, 401);
    // An E2B signed download URL, sent to node-b.
    let key = c.a.ok(&["api-key", "create", "cluster-files"]).trim().to_owned();
    let (_, detail) = curl(&["-H", &format!("X-API-Key: {key}"), &format!("{}/sandboxes/{id}", c.b.url)]);
    let token = serde_json::from_str::<Value>(&detail).unwrap()["envdAccessToken"].as_str().unwrap().to_owned();
    let path = "/workspace/www/f.txt";
    let raw = format!("{path}:read:root:{token}");
    let signature = format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(<sha2::Sha256 as sha2::Digest>::digest(raw.as_bytes())));
    // As the SDK sends it: URL-encoded (base64 has `+` and `/`).
    let signature = signature.replace('+', "%2B").replace('/', "%2F");
    let (code, body) = curl(&[&format!("{}/files?path={path}&username=root&signature={signature}", c.b.url)]);
    assert_eq!((code, body.as_str()), (200, "served-by-node-a\n"), "a signed /files URL");
    let (code, _) = curl(&[&format!("{}/files?path={path}&username=root&signature=v1_forged", c.b.url)]);
    assert_eq!(code, 401, "a forged signature");
    c.a.ok(&["destroy", &id]);
}

/// Secrets on a cluster: nodes holding the same cluster key share one
/// secrets key through the store; a node with another key refuses to
/// start, and one without the setting serves no secrets (each saying so).
#[test]
fn secrets_are_shared_under_the_cluster_key_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str, key: &str| {
        let key_file = dir.path().join(format!("{name}.key"));
        std::fs::write(&key_file, key).unwrap();
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, format!("[secrets]\ncluster_key_file = \"{}\"\n", key_file.display())).unwrap();
        cfg.display().to_string()
    };
    let shared = config("shared", &"ab".repeat(32));
    let c = Cluster::start_with(&["--config", &shared], &["--config", &shared]);
    let mut set = c.a.cmd().args(["secret", "set", "CLUSTER_TOKEN"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut set.stdin.take().unwrap(), b"cluster-secret-value").unwrap();
    let out = common::output_of(set, common::CALL_DEADLINE).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = c.b.json(&["secret", "list"]);
    assert_eq!(listed[0]["name"], "CLUSTER_TOKEN", "node-b lists node-a's secret: {listed}");
    let blob = format!("s3://{}/{BLOB_PREFIX}", c.bucket);
    let env = c.moto.env();
    // Another cluster key: the node refuses to start, in one line.
    let other = config("other", &"cd".repeat(32));
    let home = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let mut serve = Command::new(common::CAIRN);
    serve.args(["serve", "--listen", "127.0.0.1:0", "--store", &c._db.url, "--blob", &blob, "--node", "node-c", "--config", &other]).env("CAIRN_HOME", home.path()).envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let refused = common::output_within(&mut serve, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("does not open the cluster's secrets key"), "{err}");
    // Without the setting: the node runs, and says why it has no secrets.
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let plain = Daemon::start_with_env(&["--store", &c._db.url, "--blob", &blob, "--node", "node-d"], &env);
    let err = plain.fails(&["secret", "set", "ANOTHER", "--file", &shared]);
    assert!(err.contains("cluster_key_file"), "{err}");
    assert_eq!(plain.json(&["secret", "list"])[0]["name"], "CLUSTER_TOKEN", "names are listed all the same");
}

#[test]
fn a_timer_set_on_a_lost_node_fires_on_the_other() {
    let mut c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo before the timer > /workspace/state");
    let w = c.a.json(&["wait", &id, "--timer", "6s"]);
    assert_eq!(w["state"], "pending", "{w}");
    wait_for_state(&c.a, &id, "suspended", WAKE_LIMIT);
    // node-a goes before its timer is due; node-b's timer loop fires it.
    c.lose(NODE_A);
    let t = c.wait_running_on(NODE_B, &id, NODE_B, RECOVERY_LIMIT);
    assert_eq!(must(&c.b, &id, "cat /workspace/state"), "before the timer\n", "{t}");
    let log = c.b.json(&["log", &id]);
    let fired = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received" && e["args"]["source"] == "timer").count();
    assert_eq!(fired, 1, "the timer fired once: {log}");
}

#[test]
fn a_node_killed_with_its_sandboxes_is_recovered_by_the_other() {
    let mut c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "mkdir -p /workspace/keep && head -c 2000000 /dev/urandom > /workspace/keep/data && echo saved > /workspace/state");
    let at_snapshot = files(&c.a, &id);
    let snap = c.a.json(&["snapshot", &id, "--memory", "data kept"]);
    must(&c.a, &id, "echo unsaved > /workspace/state && echo later > /workspace/later");
    assert_ne!(files(&c.a, &id), at_snapshot);

    let lost = Instant::now();
    let had = c.lose(NODE_A);
    assert!(had.contains(&id), "node-a had the task's sandbox: {had:?}");
    assert_eq!(c.live_on(&id), BTreeSet::new());

    let mut t = c.wait_running_on(NODE_B, &id, NODE_B, RECOVERY_LIMIT);
    eprintln!("recovered on node-b {:.1} s after node-a was lost", lost.elapsed().as_secs_f64());
    // The note is written once the services have started again, a moment
    // after the sandbox is ready.
    let noted_by = Instant::now() + Duration::from_secs(30);
    while t["recovery_note"].is_null() && Instant::now() < noted_by {
        std::thread::sleep(Duration::from_millis(100));
        t = c.b.json(&["task", "show", &id]);
    }
    let note = t["recovery_note"].as_str().unwrap_or_else(|| panic!("no recovery note: {t}"));
    assert!(note.contains(NODE_A), "the recovery note names the lost node: {note}");
    assert_eq!(t["memory"], "data kept", "{t}");
    assert_eq!(t["step"], snap["step"], "the snapshot's step: {t}");
    assert_eq!(files(&c.b, &id), at_snapshot, "exactly the snapshot's files");
    let log = c.b.json(&["log", &id]);
    assert!(log.as_array().unwrap().iter().any(|e| e["kind"] == "recovered"), "{log}");

    // node-a comes back on the same home with the same arguments: it finds
    // its old copy of the task but must leave the task to node-b, for
    // longer than a lease lives.
    c.a.respawn();
    let until = Instant::now() + LEASE + Duration::from_secs(5);
    while Instant::now() < until {
        let t = c.a.task(&id);
        assert_eq!((t["state"].as_str(), t["node"].as_str()), (Some("running"), Some(NODE_B)), "after node-a's restart: {t}\n{}", c.log_tails());
        assert_eq!(c.live_on(&id), BTreeSet::from([NODE_B]), "after node-a's restart\n{}", c.log_tails());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(files(&c.a, &id), at_snapshot, "exec through node-a");
    must(&c.b, &id, "echo still here > /workspace/after-restart");
    assert_eq!(must(&c.a, &id, "cat /workspace/after-restart"), "still here\n");
    let nodes = c.a.json(&["node", "list"]);
    assert!(nodes.as_array().unwrap().iter().all(|n| n["state"] == "up"), "both nodes are up again: {nodes}");
}

/// The crash point `takeover.leased` (crash_points.rs lists it): node-b
/// dies right after it took the lease of a task lost with node-a, before
/// it recorded the loss. Started again, it finishes the takeover: the
/// task runs on node-b with the snapshot's files, its loss and recovery
/// recorded once each.
#[test]
fn a_node_killed_as_it_takes_over_a_lost_task_finishes_the_takeover_when_restarted() {
    let mut c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo saved > /workspace/state");
    c.a.ok(&["snapshot", &id]);
    let at_snapshot = files(&c.a, &id);
    c.b.kill();
    c.b.spawn_armed("takeover.leased");
    let marker = "crash point takeover.leased reached";
    c.lose(NODE_A);
    let status = c.b.wait_exit(RECOVERY_LIMIT).unwrap_or_else(|e| panic!("node-b never took the task over: {e}\n{}", c.log_tails()));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "node-b ended with {status}\n{}", c.log_tails());
    assert_eq!(c.b.log().matches(marker).count(), 1, "the kill landed at the point\n{}", c.log_tails());

    c.b.restart();
    c.wait_running_on(NODE_B, &id, NODE_B, RECOVERY_LIMIT);
    assert_eq!(files(&c.b, &id), at_snapshot, "the snapshot's files");
    c.b.ok(&["log", &id, "--verify"]);
    let log = c.b.json(&["log", &id]);
    let count = |kind: &str| log.as_array().unwrap().iter().filter(|e| e["kind"] == kind).count();
    assert_eq!((count("sandbox_lost"), count("recovered")), (1, 1), "{log}");
}

#[test]
fn an_event_accepted_by_a_node_without_room_wakes_the_task_on_one_with_room() {
    let c = Cluster::start_with(&[], &["--capacity", "0"]);
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo hello > /workspace/greeting");
    let w = c.a.json(&["wait", &id, "--webhook", "go"]);
    assert_eq!(w["state"], "pending", "{w}");
    wait_for_state(&c.a, &id, "suspended", WAKE_LIMIT);
    c.b.ok(&["event", &id, "--name", "go", "--data", r#"{"from":"node-b"}"#]);
    c.wait_running_on(NODE_B, &id, NODE_A, WAKE_LIMIT);
    assert_eq!(must(&c.b, &id, "cat /workspace/greeting"), "hello\n", "exec through node-b");
}

// --- the load test -----------------------------------------------------

/// One node as the load's threads reach it: a restart moves it to another
/// port, which the test updates here.
struct Endpoint {
    name: &'static str,
    home: PathBuf,
    url: Mutex<String>,
}

impl Endpoint {
    fn of(name: &'static str, d: &Daemon) -> Endpoint {
        Endpoint { name, home: d.home().to_owned(), url: Mutex::new(d.url.clone()) }
    }

    fn url(&self) -> String {
        self.url.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The CLI of this node's home against this node.
    fn cli(&self, args: &[&str]) -> Result<Output, String> {
        let mut cmd = Command::new(common::CAIRN);
        cmd.env("CAIRN_HOME", &self.home).env("CAIRN_URL", self.url()).env_remove("CAIRN_TOKEN").args(args).stdin(Stdio::null());
        common::try_output_within(&mut cmd, Duration::from_secs(60))
    }
}

struct LoadTask {
    id: String,
    secret: String,
}

/// What the senders did, to be found in the tasks' logs at the end.
#[derive(Default)]
struct Sent {
    /// (task, delivery id, tries) of webhooks answered 2xx.
    hooks_acked: Vec<(String, String, u32)>,
    /// (task, delivery id, why) of webhooks refused with a 4xx.
    hooks_refused: Vec<(String, String, String)>,
    /// (task, delivery id, last answer) of webhooks no node answered 2xx
    /// or 4xx within a minute of retries.
    hooks_unanswered: Vec<(String, String, String)>,
    /// (task, inbox event id) of `cairn event` calls that succeeded.
    events_acked: Vec<(String, String)>,
    /// `cairn event` calls that failed, by task: each may or may not have
    /// been stored (the CLI has no delivery id to retry with).
    events_failed: BTreeMap<String, usize>,
}

/// Posts a signed webhook as a sender does: a transport error or a 5xx is
/// retried with the same delivery id, on the other node each time, for up
/// to a minute; a 2xx or a 4xx is final.
fn deliver_hook(nodes: &[Endpoint; 2], first: usize, task: &LoadTask, name: &str, delivery: &str, sent: &Mutex<Sent>) {
    let body = format!("{{\"delivery\":\"{delivery}\"}}");
    let ts = now_secs();
    let sig = sign(&task.secret, delivery, ts, &body);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    let last = loop {
        let via = &nodes[(first + tries as usize) % 2];
        tries += 1;
        let url = format!("{}/v1/hooks/{}/{name}", via.url(), task.id);
        let (code, answer) = curl(&[
            "-X",
            "POST",
            "-H",
            &format!("webhook-id: {delivery}"),
            "-H",
            &format!("webhook-timestamp: {ts}"),
            "-H",
            &format!("webhook-signature: {sig}"),
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            &url,
        ]);
        let mut sent = sent.lock().unwrap_or_else(PoisonError::into_inner);
        match code {
            200..=299 => {
                sent.hooks_acked.push((task.id.clone(), delivery.to_owned(), tries));
                return;
            }
            400..=499 => {
                sent.hooks_refused.push((task.id.clone(), delivery.to_owned(), format!("{code} from {}: {answer}", via.name)));
                return;
            }
            _ => {}
        }
        drop(sent);
        if Instant::now() > deadline {
            break format!("{code} from {}: {answer}", via.name);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    sent.lock().unwrap_or_else(PoisonError::into_inner).hooks_unanswered.push((task.id.clone(), delivery.to_owned(), last));
}

/// Sets the flags when dropped: the load's threads stop also when the test
/// fails in the middle.
struct StopOnDrop<'a>(&'a [&'a AtomicBool]);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        for f in self.0 {
            f.store(true, Ordering::SeqCst);
        }
    }
}

/// What the sampler saw.
#[derive(Debug, Default)]
struct Sampled {
    samples: u64,
    /// Samples in which some task had a sandbox process on some node.
    with_a_sandbox: u64,
    unplaced: usize,
    /// Each sample in which a task had processes on both nodes.
    on_two_nodes: Vec<String>,
}

#[test]
fn no_task_is_live_on_two_nodes_and_each_event_counts_once() {
    let mut c = Cluster::start();
    let mut rng = Rng::seeded("no_task_is_live_on_two_nodes");
    let tasks: Vec<LoadTask> = (0..3)
        .map(|i| {
            let d = if i % 2 == 0 { &c.a } else { &c.b };
            let id = d.create(&[]);
            let secret = d.task(&id)["webhook_secret"].as_str().unwrap().to_owned();
            LoadTask { id, secret }
        })
        .collect();
    // The signatures made here are the reference package's.
    let ts = now_secs();
    assert_eq!(sign(&tasks[0].secret, "msg_check", ts, "{\"a\":1}"), reference_sign(&tasks[0].secret, "msg_check", ts, "{\"a\":1}"));

    let nodes = [Endpoint::of(NODE_A, &c.a), Endpoint::of(NODE_B, &c.b)];
    let homes = c.homes();
    let ids: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
    let sent = Mutex::new(Sent::default());
    let failed_calls = AtomicU32::new(0);
    let (stop_load, stop_sampling) = (AtomicBool::new(false), AtomicBool::new(false));
    let begun = Instant::now();
    let mut seeds: Vec<u64> = (0..tasks.len() + 2).map(|_| rng.below(u64::MAX)).collect();

    let (sampled, unsettled) = std::thread::scope(|s| {
        let flags = [&stop_load, &stop_sampling];
        let _stop = StopOnDrop(&flags);
        let sampler = s.spawn(|| {
            let mut seen = Sampled::default();
            while !stop_sampling.load(Ordering::SeqCst) {
                let scan = scan_sandboxes(&ids, &homes);
                seen.samples += 1;
                seen.unplaced += scan.unplaced;
                if !scan.live.is_empty() {
                    seen.with_a_sandbox += 1;
                }
                for (task, by_node) in scan.live.iter().filter(|(_, by_node)| by_node.len() > 1) {
                    seen.on_two_nodes.push(format!("{:.1} s: {task} has processes on {by_node:?}", begun.elapsed().as_secs_f64()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        });
        let mut workers = Vec::new();
        // One agent per task: waits (webhook and timer), commands (which
        // wake a suspended task), suspends, through either node.
        for (i, task) in tasks.iter().enumerate() {
            let mut rng = Rng::from_seed(seeds.pop().unwrap());
            let (nodes, failed_calls, stop_load) = (&nodes, &failed_calls, &stop_load);
            workers.push(s.spawn(move || {
                let mut round = i;
                while !stop_load.load(Ordering::SeqCst) {
                    let via = &nodes[round % 2];
                    round += 1;
                    let id = task.id.as_str();
                    let args: &[&str] = match rng.below(10) {
                        0..=4 => &["--json", "wait", id, "--webhook", "go"],
                        5 => &["--json", "wait", id, "--timer", "2s"],
                        6..=8 => &["exec", id, "--", "sh", "-c", "echo x >> /workspace/log"],
                        _ => &["suspend", id],
                    };
                    // Refusals are part of the load (a wait while one is
                    // pending, a node that is down): counted, not checked.
                    if !via.cli(args).is_ok_and(|out| out.status.success()) {
                        failed_calls.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
                }
            }));
        }
        // Two senders: signed webhooks and `cairn event`, to either node in
        // turn, each webhook with a delivery id of its own.
        for sender in 0..2 {
            let mut rng = Rng::from_seed(seeds.pop().unwrap());
            let (nodes, tasks, sent, stop_load) = (&nodes, &tasks, &sent, &stop_load);
            workers.push(s.spawn(move || {
                let mut n = 0usize;
                while !stop_load.load(Ordering::SeqCst) {
                    n += 1;
                    let task = &tasks[rng.below(tasks.len() as u64) as usize];
                    let name = if rng.below(3) == 0 { "note" } else { "go" };
                    if rng.below(3) == 0 {
                        let via = &nodes[(n + sender) % 2];
                        let answer = via.cli(&["--json", "event", &task.id, "--name", name, "--data", &format!("{{\"n\":{n}}}")]);
                        let event = answer.ok().filter(|out| out.status.success()).and_then(|out| serde_json::from_slice::<Value>(&out.stdout).ok());
                        let mut sent = sent.lock().unwrap_or_else(PoisonError::into_inner);
                        match event.as_ref().and_then(|v| v["event"]["id"].as_str()) {
                            Some(event) => sent.events_acked.push((task.id.clone(), event.to_owned())),
                            None => *sent.events_failed.entry(task.id.clone()).or_default() += 1,
                        }
                    } else {
                        deliver_hook(nodes, n + sender, task, name, &format!("msg_{sender}_{n}"), sent);
                    }
                    std::thread::sleep(Duration::from_millis(rng.below(150)));
                }
            }));
        }

        // Chaos: each node lost, then back on its home, while the load runs.
        let at = |secs: u64| {
            let t = Duration::from_secs(secs);
            if let Some(wait) = t.checked_sub(begun.elapsed()) {
                std::thread::sleep(wait);
            }
        };
        for (node, i, lose_at) in [(NODE_A, 0, 5), (NODE_B, 1, 20)] {
            at(lose_at);
            let had = c.lose(node);
            eprintln!("{:.1} s: {node} lost, with the sandboxes of {had:?}", begun.elapsed().as_secs_f64());
            at(lose_at + 4);
            c.node_mut(node).respawn();
            *nodes[i].url.lock().unwrap_or_else(PoisonError::into_inner) = c.node(node).url.clone();
            eprintln!("{:.1} s: {node} back", begun.elapsed().as_secs_f64());
        }
        at(32);
        stop_load.store(true, Ordering::SeqCst);
        for w in workers {
            w.join().unwrap();
        }
        eprintln!("{:.1} s: load stopped", begun.elapsed().as_secs_f64());

        // Settled: every task runs (on one node) or sleeps, and answers
        // through either node. Reported after what the sampler saw.
        let mut unsettled = Vec::new();
        for task in &tasks {
            let deadline = Instant::now() + RECOVERY_LIMIT + WAKE_LIMIT;
            loop {
                let t = c.a.task(&task.id);
                assert!(t.get("node").is_some(), "task show has no `node` field: {t}");
                if (t["state"] == "running" && t["node"].is_string()) || t["state"] == "suspended" {
                    break;
                }
                if Instant::now() > deadline {
                    let log = c.a.json(&["log", &task.id]);
                    let all: Vec<String> = log.as_array().into_iter().flatten().filter(|e| e["kind"] != "event_received").map(|e| e.to_string()).collect();
                    let last = &all[all.len().saturating_sub(12)..];
                    let said: Vec<String> = [(NODE_A, &c.a), (NODE_B, &c.b)]
                        .iter()
                        .flat_map(|(n, d)| d.log().lines().filter(|l| l.contains(&task.id) || l.contains("ERROR") || l.contains("WARN") || l.contains("panick")).map(|l| format!("{n}: {l}")).collect::<Vec<_>>())
                        .collect();
                    unsettled.push(format!(
                        "task {} has not settled {:?} after the load: {t}\nits last events:\n{}\nwhat the nodes logged of it:\n{}",
                        task.id,
                        RECOVERY_LIMIT + WAKE_LIMIT,
                        last.join("\n"),
                        said.join("\n")
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            // A pending wait (there may be none) would keep it asleep.
            let _ = c.a.try_cairn(&["wait", &task.id, "--cancel"]);
            for (node, d) in [(NODE_A, &c.a), (NODE_B, &c.b)] {
                let (code, out, err) = d.sh(&task.id, "test -d /workspace");
                if code != 0 {
                    unsettled.push(format!("task {}: a command through {node} failed ({code}): {out}{err}", task.id));
                }
            }
        }
        if !unsettled.is_empty() {
            unsettled.push(c.log_tails());
        }
        stop_sampling.store(true, Ordering::SeqCst);
        (sampler.join().unwrap(), unsettled)
    });

    let sent = sent.into_inner().unwrap_or_else(PoisonError::into_inner);
    eprintln!(
        "{} webhooks answered 2xx ({} after a retry), {} refused, {} unanswered; {} `cairn event` acknowledged, {} failed; {} agent calls refused; {} samples, {} with a sandbox, {} processes unplaced",
        sent.hooks_acked.len(),
        sent.hooks_acked.iter().filter(|(_, _, tries)| *tries > 1).count(),
        sent.hooks_refused.len(),
        sent.hooks_unanswered.len(),
        sent.events_acked.len(),
        sent.events_failed.values().sum::<usize>(),
        failed_calls.load(Ordering::Relaxed),
        sampled.samples,
        sampled.with_a_sandbox,
        sampled.unplaced,
    );
    assert!(sampled.on_two_nodes.is_empty(), "tasks live on two nodes at once:\n{}", sampled.on_two_nodes.join("\n"));
    assert!(sampled.with_a_sandbox > 0, "the sampler never saw a sandbox process: it cannot tell the nodes' sandboxes apart on this host");
    assert!(unsettled.is_empty(), "after the load:\n{}", unsettled.join("\n"));
    assert!(sent.hooks_acked.len() >= 20, "too little load to tell anything: {} webhooks acknowledged", sent.hooks_acked.len());

    let mut wrong = Vec::new();
    for (task, delivery, last) in &sent.hooks_unanswered {
        wrong.push(format!("{task}: webhook {delivery} got no 2xx from either node within a minute of retries; last: {last}"));
    }
    for task in &tasks {
        let log = c.a.json(&["log", &task.id]);
        let received: Vec<&Value> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "event_received").collect();
        let count = |key: &str, value: &str| received.iter().filter(|e| e["args"][key] == value).count();
        for (_, delivery, tries) in sent.hooks_acked.iter().filter(|(t, ..)| *t == task.id) {
            let n = count("delivery", delivery);
            if n != 1 {
                wrong.push(format!("{}: webhook {delivery} (answered 2xx after {tries} tries) is in the log {n} times", task.id));
            }
        }
        for (_, delivery, why) in sent.hooks_refused.iter().filter(|(t, ..)| *t == task.id) {
            let n = count("delivery", delivery);
            if n != 0 {
                wrong.push(format!("{}: webhook {delivery} was refused ({why}) but is in the log {n} times", task.id));
            }
        }
        let mut acked_events = 0;
        for (_, event) in sent.events_acked.iter().filter(|(t, _)| *t == task.id) {
            acked_events += 1;
            let n = count("event", event);
            if n != 1 {
                wrong.push(format!("{}: `cairn event` {event} (acknowledged) is in the log {n} times", task.id));
            }
        }
        let operator = received.iter().filter(|e| e["args"]["source"] == "operator").count();
        let failed = sent.events_failed.get(&task.id).copied().unwrap_or(0);
        if operator > acked_events + failed {
            wrong.push(format!("{}: {operator} operator events in the log, but only {acked_events} acknowledged and {failed} failed calls", task.id));
        }
    }
    assert!(wrong.is_empty(), "events lost, doubled or taken from refusals:\n{}", wrong.join("\n"));
}


/// A daemon stopped with SIGSTOP, continued when this is dropped (also
/// when the test fails, so the cluster's cleanup can reach it).
struct Stopped {
    pid: nix::unistd::Pid,
    since: Instant,
}

impl Stopped {
    fn new(pid: u32) -> Stopped {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        Stopped { pid, since: Instant::now() }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A zombie node: node-a is stopped (SIGSTOP) with a command running in
/// its sandbox, past its lease, while node-b recovers the task; then it
/// continues. It must write nothing (its leases are fenced): the task
/// stays node-b's, its log gains nothing of node-a's command, node-a
/// removes its stale sandbox, and the command's file is only in node-a's
/// old copy, never in the task.
#[test]
fn a_node_stopped_past_its_lease_then_continued_writes_nothing() {
    let c = Cluster::start();
    let id = c.a.create(&[]);
    c.wait_running_on(NODE_A, &id, NODE_A, WAKE_LIMIT);
    must(&c.a, &id, "echo before > /workspace/state");
    c.a.json(&["snapshot", &id]);
    let before = c.b.json(&["log", &id]).as_array().unwrap().len();

    // A command through node-a that ends while node-a is stopped.
    let late = std::thread::scope(|s| {
        let run = s.spawn(|| c.a.try_cairn(&["exec", &id, "--", "sh", "-c", "sleep 4; echo zombie > /workspace/zombie; echo done"]));
        // The command has started once its shell is in the sandbox.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !must(&c.a, &id, "ps -eo args").contains("sleep 4") {
            assert!(Instant::now() < deadline, "the command never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        let stop = Stopped::new(c.a.pid());
        // node-b takes the task over once node-a's lease has run out (its
        // stale sandbox still runs meanwhile: a stopped daemon is not a
        // lost machine).
        let deadline = Instant::now() + RECOVERY_LIMIT;
        let t = loop {
            // Until node-a's heartbeat is seen to stop, node-b forwards the
            // question to it, and answers 503 once it is.
            let t = match c.b.try_cairn(&["--json", "task", "show", &id]) {
                Ok(out) if out.status.success() => serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
                Ok(out) => serde_json::json!({ "error": String::from_utf8_lossy(&out.stderr).trim() }),
                Err(e) => serde_json::json!({ "error": e }),
            };
            if t["state"] == "running" && t["node"] == NODE_B {
                break t;
            }
            assert!(Instant::now() < deadline, "node-b never took the task over: {t}\n{}", c.log_tails());
            std::thread::sleep(Duration::from_millis(100));
        };
        // Its last renewal came at most a heartbeat (a fifth of the lease)
        // before the stop.
        assert!(stop.since.elapsed() > LEASE * 4 / 5, "node-b took over before node-a's lease could end");
        eprintln!("taken over {:.1} s after node-a stopped: {t}", stop.since.elapsed().as_secs_f64());
        let taken = c.b.json(&["log", &id]).as_array().unwrap().len();
        drop(stop);
        (run.join().unwrap(), taken)
    });
    let (client, taken) = late;
    // The command ran on in node-a's stale sandbox, but its end was not
    // recorded: node-a's write was refused (its stale token, or, once its
    // heartbeat has forgotten it, node-b's live lease), and its client
    // is told so.
    let client = client.unwrap();
    let stderr = String::from_utf8_lossy(&client.stderr);
    assert!(!client.status.success() && stderr.contains(NODE_B), "the client of node-a: {client:?}");

    // For longer than a lease: node-a writes nothing, and lets go of its
    // stale sandbox. (Both nodes run on this one host, where the task's
    // cgroup is named by its id alone: node-a's removal of its stale
    // sandbox ends node-b's too, which node-b records as lost and
    // recovers at the next command. Nodes on separate hosts share no
    // cgroup; see docs/testing.md, "Two nodes".)
    let until = Instant::now() + LEASE + Duration::from_secs(5);
    while Instant::now() < until {
        for via in [&c.a, &c.b] {
            let t = via.task(&id);
            assert_eq!(t["state"], "running", "after node-a continued: {t}\n{}", c.log_tails());
            assert_ne!(t["node"], NODE_A, "after node-a continued: {t}\n{}", c.log_tails());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(!c.live_on(&id).contains(NODE_A), "node-a's stale sandbox is still there 15 s after it continued\n{}", c.log_tails());
    let log = c.b.json(&["log", &id]);
    let events = log.as_array().unwrap();
    assert!(taken > before, "node-b's recovery is in the log: {log}");
    let late: Vec<&Value> = events[before..].iter().filter(|e| e.to_string().contains("zombie")).collect();
    assert!(late.is_empty(), "node-a's command was recorded after node-b took over: {late:?}");
    let after: Vec<&str> = events[taken..].iter().map(|e| e["kind"].as_str().unwrap_or("?")).collect();
    assert!(after.iter().all(|k| *k == "sandbox_lost"), "written after node-b took over, with nothing asked of the task: {:?}", &events[taken..]);
    let (code, out, _) = c.b.sh(&id, "cat /workspace/state; test -e /workspace/zombie");
    assert_eq!((code, out.as_str()), (1, "before\n"), "the task is its snapshot, without node-a's late file");
}
