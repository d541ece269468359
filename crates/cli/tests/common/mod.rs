//! Test harness: a real `cairn serve` in a temporary `CAIRN_HOME`, driven
//! through the real CLI. Every CLI call has a deadline. Dropping a
//! [`Daemon`] destroys every task it made, stops the daemon (SIGTERM, a
//! bounded wait, then SIGKILL), removes the home and then runs the
//! independent leak scanner of [`leaks`] over everything the tasks could
//! have left on the host: a leak fails the test. `Drop` never panics while
//! a test is already failing; it reports what it could not clean.

#![allow(dead_code)]

pub mod browser;
pub mod cut;
pub mod leaks;
pub mod registry;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

/// How long one CLI call may take before the test fails with its output.
pub const CALL_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion, killing it and failing with the command and
/// what it printed so far if it takes longer than `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    match try_output_within(cmd, limit) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

/// Runs `cmd` as `Command::output` does (stdin from /dev/null, the output
/// captured), within [`CALL_DEADLINE`]: the way every test runs a process
/// to its end (`tests/harness.rs` refuses a bare `.output()`).
pub fn run(cmd: &mut Command) -> Result<Output, String> {
    try_output_within(cmd.stdin(Stdio::null()), CALL_DEADLINE)
}

/// [`output_within`] that reports a timeout or a spawn failure as an error.
pub fn try_output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    use std::os::unix::process::CommandExt;
    let shown = format!("{cmd:?}");
    // Its own process group, so a timeout also ends what it started (which
    // would keep the output pipes open).
    let child = cmd.process_group(0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("cannot run {shown}: {e}"))?;
    collect(child, limit, &shown, true)
}

/// Waits for a child the test spawned itself (`wait_with_output` with a
/// deadline): its output if it ends within `limit`, else it is killed and
/// the error has what it printed so far.
pub fn output_of(child: Child, limit: Duration) -> Result<Output, String> {
    let shown = format!("process {}", child.id());
    collect(child, limit, &shown, false)
}

/// Reads the child's piped output while it runs, for up to `limit`; past
/// it, kills the child (and its process group when it leads one).
fn collect(mut child: Child, limit: Duration, shown: &str, group: bool) -> Result<Output, String> {
    use std::io::Read;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut b);
            }
            b
        })
    };
    let out_reader = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err_reader = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let target = if group { -(child.id() as i32) } else { child.id() as i32 };
                // SAFETY: kill of a child we spawned (or of its process group).
                unsafe { libc::kill(target, libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output { status, stdout, stderr }),
        None => Err(format!(
            "{shown} did not finish within {limit:?}; it printed: {}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

pub struct Daemon {
    pub home: tempfile::TempDir,
    child: Option<Child>,
    pub url: String,
    /// What [`Daemon::start_with_env`] started it with, so that it can be
    /// started again the same way ([`Daemon::respawn`], and the cleanup of
    /// a daemon the test killed: its store and blob store are in there).
    launch: Option<Launch>,
    /// Mounts the test made in the home before the start, unmounted once
    /// the daemon has stopped (until then its nosuid bind of the home holds
    /// a copy of each).
    test_mounts: Vec<PathBuf>,
}

/// The arguments and environment a daemon was started with.
#[derive(Clone, Debug)]
struct Launch {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// Makes the test process a subreaper, so sandbox inits orphaned by a
/// killed daemon are reparented here and can be reaped (some hosts' pid 1
/// never reaps).
pub fn become_subreaper() {
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// Reaps `pid` if it is an exited child of this process.
pub fn reap(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid || r < 0 {
            return;
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The isolation driver the daemons of this test run give tasks by
/// default: `CAIRN_TEST_ISOLATION` (scripts/test.sh runs the isolation,
/// limits, egress and delivery tests once more with `gvisor`), else native.
pub fn test_isolation() -> String {
    std::env::var("CAIRN_TEST_ISOLATION").unwrap_or_else(|_| "native".into())
}

/// True when this test run's tasks run under gvisor.
pub fn under_gvisor() -> bool {
    test_isolation() == "gvisor"
}

fn isolation_args() -> Vec<String> {
    match test_isolation().as_str() {
        "native" => Vec::new(),
        other => vec!["--isolation".into(), other.into()],
    }
}

pub fn require_root() {
    assert!(nix_is_root(), "these tests build real sandboxes and must run as root");
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Daemon {
        Self::start_prepared(|_| {}, extra)
    }

    /// Starts a daemon with `extra` arguments and `env` added to its
    /// environment (e.g. the settings of an S3-compatible store).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        require_root();
        become_subreaper();
        let home = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").expect("temp home");
        let launch = Launch { args: extra.iter().map(|a| a.to_string()).collect(), env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() };
        let mut d = Daemon { home, child: None, url: String::new(), launch: Some(launch), test_mounts: Vec::new() };
        if let Err(e) = d.try_respawn() {
            panic!("{e}");
        }
        d
    }

    /// Starts a daemon that [`Daemon::start_with_env`] started, and that
    /// has stopped since (killed), again on its home with the same
    /// arguments and environment.
    pub fn respawn(&mut self) {
        if let Err(e) = self.try_respawn() {
            panic!("{e}");
        }
    }

    /// [`Self::respawn`] that reports a daemon that does not start.
    pub fn try_respawn(&mut self) -> Result<(), String> {
        let launch = self.launch.clone().ok_or("only a daemon started by start_with_env can be respawned")?;
        if self.is_running() {
            return Err(format!("the daemon (pid {}) still runs", self.pid()));
        }
        let args: Vec<&str> = launch.args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.try_spawn_with_env(&args, &env)
    }

    /// Whether the daemon process runs (it may have exited by itself).
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts a daemon on a new home that `prepare` has set up first.
    pub fn start_prepared(prepare: impl FnOnce(&Path), extra: &[&str]) -> Daemon {
        require_root();
        become_subreaper();
        let home = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").expect("temp home");
        prepare(home.path());
        let mut d = Daemon { home, child: None, url: String::new(), launch: None, test_mounts: Vec::new() };
        d.spawn(extra);
        d
    }

    /// Starts `cairn serve` on this home and waits until it answers.
    pub fn spawn(&mut self, extra: &[&str]) {
        if let Err(e) = self.try_spawn(extra) {
            panic!("{e}");
        }
    }

    /// [`Self::spawn`] that reports a daemon that does not start.
    pub fn try_spawn(&mut self, extra: &[&str]) -> Result<(), String> {
        self.try_spawn_with_env(extra, &[])
    }

    /// Starts the daemon with one crash point armed (`CAIRN_CRASH_AT`, see
    /// docs/testing.md): it kills itself when it first gets there.
    /// A daemon started by [`Daemon::start_with_env`] keeps its arguments
    /// and environment (its store, its blob store).
    pub fn spawn_armed(&mut self, point: &str) {
        let launch = self.launch.clone().unwrap_or(Launch { args: Vec::new(), env: Vec::new() });
        let args: Vec<&str> = launch.args.iter().map(String::as_str).collect();
        let mut env: Vec<(&str, &str)> = launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.push(("CAIRN_CRASH_AT", point));
        if let Err(e) = self.try_spawn_with_env(&args, &env) {
            panic!("{e}");
        }
    }

    /// Starts the stopped daemon again as it was first started: with the
    /// arguments and environment of [`Daemon::start_with_env`], else none.
    pub fn restart(&mut self) {
        if self.launch.is_some() {
            self.respawn();
        } else {
            self.spawn(&[]);
        }
    }

    /// Waits (at most `limit`) for the daemon to exit by itself; returns how.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<std::process::ExitStatus, String> {
        let c = self.child.as_mut().ok_or("no daemon is running")?;
        let deadline = Instant::now() + limit;
        loop {
            match c.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    return Ok(status);
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => return Err(format!("the daemon still runs after {limit:?}")),
                Err(e) => return Err(format!("waiting for the daemon: {e}")),
            }
        }
    }

    fn try_spawn_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
        let _ = std::fs::remove_file(self.home.path().join("url"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.home.path().join("daemon.log"))
            .map_err(|e| format!("daemon log: {e}"))?;
        // The default reserve is a share of the filesystem; test tasks
        // write little, and a machine with a large, fairly full disk
        // would otherwise refuse their disks.
        let reserve: &[&str] = if extra.contains(&"--disk-reserve") { &[] } else { &["--disk-reserve", "1G"] };
        let child = Command::new(CAIRN)
            .args(["serve", "--listen", "127.0.0.1:0", "--disk-pool", "1"])
            .args(reserve)
            .args(isolation_args())
            .args(extra)
            .env("CAIRN_HOME", self.home.path())
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn cairn serve: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(url) = std::fs::read_to_string(self.home.path().join("url")) {
                self.url = url.trim().to_owned();
                if self.try_cairn(&["task", "list"]).is_ok_and(|out| out.status.success()) {
                    return Ok(());
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Err(format!("daemon exited with {status}: {}", self.log()));
            }
            if Instant::now() >= deadline {
                return Err(format!("daemon did not start within 30 s: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.home.path().join("daemon.log")).unwrap_or_default()
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Kills the daemon with SIGKILL (sandboxes keep running).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(CAIRN);
        c.env("CAIRN_HOME", self.home.path()).env_remove("CAIRN_URL").env_remove("CAIRN_TOKEN");
        c
    }

    /// Runs the CLI; fails the test if it takes over [`CALL_DEADLINE`].
    pub fn cairn(&self, args: &[&str]) -> Output {
        output_within(self.cmd().args(args).stdin(Stdio::null()), CALL_DEADLINE)
    }

    /// [`Self::cairn`] that reports a timeout instead of failing.
    pub fn try_cairn(&self, args: &[&str]) -> Result<Output, String> {
        try_output_within(self.cmd().args(args).stdin(Stdio::null()), CALL_DEADLINE)
    }

    /// Runs a command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cairn(args);
        assert!(
            out.status.success(),
            "cairn {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command that must fail with one clear line on stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.cairn(args);
        assert!(!out.status.success(), "cairn {args:?} should have failed: {}", String::from_utf8_lossy(&out.stdout));
        let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        assert!(err.starts_with("cairn: ") && !err.contains('\n'), "want one line starting with 'cairn: ', got {err:?}");
        err
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&self.ok(&a)).expect("json output")
    }

    /// Creates a task and returns its id.
    pub fn create(&self, extra: &[&str]) -> String {
        let mut a = vec!["task", "create"];
        a.extend_from_slice(extra);
        let v = self.json(&a);
        v["id"].as_str().expect("id").to_owned()
    }

    /// `cairn exec ID -- sh -c SCRIPT`, returning (exit code, stdout, stderr).
    pub fn sh(&self, task: &str, script: &str) -> (i32, String, String) {
        let out = self.cairn(&["exec", task, "--", "sh", "-c", script]);
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    pub fn task(&self, id: &str) -> serde_json::Value {
        self.json(&["task", "show", id])
    }

    /// The task's state (`running`, `suspended`, ...).
    pub fn state(&self, id: &str) -> String {
        self.task(id)["state"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits (at most `limit`) until the task is in state `want`.
    pub fn wait_for_state(&self, id: &str, want: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.state(id) != want {
            assert!(Instant::now() < deadline, "task {id} is {} after {limit:?}, not {want}: {}", self.state(id), self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything of `task` still on the host (see `leaks` in the binary).
    pub fn leftovers(&self, task: &str, init_pid: i32) -> Vec<String> {
        if init_pid > 0 {
            reap(init_pid);
        }
        leftovers(self.home.path(), task, init_pid)
    }
}

pub fn leftovers(home: &Path, task: &str, init_pid: i32) -> Vec<String> {
    cairn_sandbox::inspect::host_traces(home, task, init_pid)
}

/// Pseudo-random numbers for the crash loops from a seed that is printed
/// (`CAIRN_TEST_SEED` replays one), so a failing run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn seeded(what: &str) -> Rng {
        let seed = std::env::var("CAIRN_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("{what}: CAIRN_TEST_SEED={seed}");
        Rng(seed)
    }

    /// Numbers from a seed drawn from another [`Rng`] (one per thread).
    pub fn from_seed(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Where a crash loop's kill landed against the operation it meant to cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// Before the operation left a trace.
    Before,
    /// In the middle: the operation had begun and was not acknowledged.
    Mid,
    /// After it was acknowledged.
    After,
}

/// A crash loop's delay before each kill, steered toward the middle of
/// the operation: it keeps the longest delay whose kill came before the
/// operation and the shortest whose kill came after, and tries halfway
/// between (or grows or shrinks while only one side is known), with a
/// jitter from the loop's seed. It counts where the kills landed, so the
/// loop can show that it cut an operation at least once rather than
/// assume so.
pub struct KillWindow {
    delay_ms: u64,
    too_early_ms: Option<u64>,
    too_late_ms: Option<u64>,
    landed: Vec<Landed>,
}

impl KillWindow {
    pub fn new(first_ms: u64) -> KillWindow {
        KillWindow { delay_ms: first_ms.max(1), too_early_ms: None, too_late_ms: None, landed: Vec::new() }
    }

    /// The next round's delay.
    pub fn delay(&self, rng: &mut Rng) -> Duration {
        Duration::from_millis(self.delay_ms + rng.below(self.delay_ms / 8 + 1))
    }

    /// Records where this round's kill landed and moves the next one.
    pub fn landed(&mut self, at: Landed) {
        self.landed.push(at);
        let d = self.delay_ms;
        // A bound the machine's timing has since contradicted is dropped.
        match at {
            Landed::Before => {
                self.too_early_ms = Some(self.too_early_ms.map_or(d, |e| e.max(d)));
                self.too_late_ms = self.too_late_ms.filter(|&l| l > d);
            }
            Landed::After => {
                self.too_late_ms = Some(self.too_late_ms.map_or(d, |l| l.min(d)));
                self.too_early_ms = self.too_early_ms.filter(|&e| e < d);
            }
            Landed::Mid => return,
        }
        self.delay_ms = match (self.too_early_ms, self.too_late_ms) {
            (Some(e), Some(l)) => (e + l) / 2,
            (Some(e), None) => e * 3 / 2 + 5,
            (None, Some(l)) => l * 2 / 3,
            (None, None) => d,
        }
        .max(1);
    }

    /// Fails unless at least one kill landed mid-operation.
    pub fn assert_cut_one(&self, what: &str) {
        assert!(self.landed.contains(&Landed::Mid), "{what}: no kill landed mid-operation: {:?}", self.landed);
        eprintln!("{what}: kills landed {:?}", self.landed);
    }
}

impl Daemon {
    /// `path` is a mount the test made in the home before the daemon
    /// started: unmounted after the daemon stops, before the leak scan.
    #[allow(dead_code)]
    pub fn unmount_after_stop(&mut self, path: &Path) {
        self.test_mounts.push(path.to_owned());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let mut problems = Vec::new();
        if self.child.is_none() && self.home.path().join("url").exists() {
            // The test killed it; bring it back to clean up.
            let restarted = if self.launch.is_some() { self.try_respawn() } else { self.try_spawn(&[]) };
            if let Err(e) = restarted {
                problems.push(format!("restarting the daemon to clean up: {e}"));
            }
        }
        let mut tasks = Vec::new();
        match self.try_cairn(&["--json", "task", "list", "--all"]) {
            Ok(out) if out.status.success() => match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
                Ok(serde_json::Value::Array(ts)) => tasks = ts,
                other => problems.push(format!("task list answered {other:?}")),
            },
            Ok(out) => problems.push(format!("task list failed: {}", String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => problems.push(e),
        }
        let ids: Vec<String> = tasks.iter().filter_map(|t| t["id"].as_str().map(str::to_owned)).collect();
        for t in &tasks {
            if t["state"] != "destroyed" {
                let id = t["id"].as_str().unwrap_or_default();
                let pid = t["sandbox_pid"].as_i64().unwrap_or(0) as i32;
                match self.try_cairn(&["destroy", id]) {
                    Ok(out) if out.status.success() => {}
                    Ok(out) => problems.push(format!("destroy {id}: {}", String::from_utf8_lossy(&out.stderr).trim())),
                    Err(e) => problems.push(e),
                }
                if pid > 0 {
                    reap(pid);
                }
            }
        }
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill with a pid we spawned and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(c.try_wait(), Ok(None)) {
                problems.push("the daemon did not stop within 20 s of SIGTERM; killed".into());
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for m in &self.test_mounts {
            if let Err(e) = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH) {
                problems.push(format!("unmounting the test's {}: {e}", m.display()));
            }
        }
        problems.extend(leaks::scan(self.home.path(), &ids));
        if !problems.is_empty() {
            let report = format!("cleaning up after the test:\n  {}\n{}", problems.join("\n  "), self.log());
            if std::thread::panicking() {
                eprintln!("{report}");
            } else {
                panic!("{report}");
            }
        }
    }
}

/// The task's cgroup where the product's own layout detection finds it on
/// this host (legacy v1, hybrid or pure v2), so no path is hard-coded.
pub fn task_cgroup(id: &str) -> cairn_sandbox::inspect::TaskCgroup {
    let layout = cairn_sandbox::inspect::CgroupLayout::detect().unwrap_or_else(|e| panic!("detect the host's cgroup layout: {e}"));
    layout.open(id).unwrap_or_else(|e| panic!("{id} as a cgroup name: {e}"))
}

/// A file of `controller` in the task's cgroup (its v1 hierarchy, or the
/// one v2 group).
pub fn cgroup_file(id: &str, controller: &str, file: &str) -> std::path::PathBuf {
    let g = task_cgroup(id);
    let dir = g.controller_dir(controller).unwrap_or_else(|| panic!("the {controller} controller is not available here: {:?}", g.paths()));
    dir.join(file)
}

impl Daemon {
    /// `GET` or `PUT /v1/tasks/{task}/file?path=P` with curl and the
    /// daemon's token: (status, body bytes).
    pub fn http_file(&self, task: &str, method: &str, path: &str, data: Option<&[u8]>) -> (u16, Vec<u8>) {
        self.http_path(task, method, "file", path, data)
    }

    /// `GET /v1/tasks/{task}/dir?path=P`: (status, body bytes).
    pub fn http_dir(&self, task: &str, path: &str) -> (u16, Vec<u8>) {
        self.http_path(task, "GET", "dir", path, None)
    }

    /// `METHOD /v1/tasks/{task}/{route}?path=P` with curl and the daemon's
    /// token: (status, body bytes).
    pub fn http_path(&self, task: &str, method: &str, route: &str, path: &str, data: Option<&[u8]>) -> (u16, Vec<u8>) {
        let token = std::fs::read_to_string(self.home().join("token")).expect("the daemon's token");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let body = dir.path().join("body");
        let query: String = path
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "-o", &body.display().to_string(), "-w", "%{http_code}", "-X", method])
            .args(["-H", &format!("authorization: Bearer {}", token.trim())]);
        if let Some(data) = data {
            let input = dir.path().join("input");
            std::fs::write(&input, data).expect("write the request body");
            cmd.args(["-H", "content-type: application/octet-stream", "--data-binary", &format!("@{}", input.display())]);
        }
        cmd.arg(format!("{}/v1/tasks/{task}/{route}?path={query}", self.url));
        let out = output_within(&mut cmd, CALL_DEADLINE);
        let code = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
        (code, std::fs::read(&body).unwrap_or_default())
    }
}
