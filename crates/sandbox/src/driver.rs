//! What the lifecycle engine needs from a sandbox driver, and nothing of
//! how it is done: no cgroup, mount, loop device or namespace shows through.
//!
//! Every method blocks (the daemon runs them on its blocking pool) and
//! takes plain data: a task id, its config, an image, a uid slot. The
//! [`crate::Dispatcher`] builds real sandboxes, with the backend of each
//! task's isolation; with the `test-util` feature, `fake::FakeDriver` is
//! the same dispatcher over plain directories and host processes, so the
//! engine's own tests need no root.
//!
//! The writable layer lives on the task's disk, one layer per overlay
//! layer ([`cairn_image::Image::layers`]), reached through the
//! [`LayerAccess`](crate::LayerAccess) the driver hands out
//! ([`SandboxDriver::layers`]). Snapshots read it there (between
//! [`SandboxDriver::freeze`] and [`SandboxDriver::thaw`]); restores write it
//! there after [`SandboxDriver::prepare_disk`], before the sandbox starts on
//! it.

use std::fmt;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::fd::{OwnedFd, RawFd};

use cairn_core::{Isolation, TaskConfig};

use cairn_image::Image;
use crate::process::spawn::parse_start_time;
use crate::layers::TaskLayers;
use crate::proto::ExecRequest;
use crate::uidmap::IdRange;
use crate::Result;

/// A sandbox driver, shared by the daemon as `Arc<dyn SandboxDriver>`.
pub trait SandboxDriver: Send + Sync + fmt::Debug + 'static {
    // --- uid slots (the host side; the store hands them out per home) ---

    /// The host ids a sandbox on `slot` runs as under `isolation`. Restores
    /// own their files by it, and copies into the sandbox use its root
    /// (`host_id(0)`).
    fn uid_range(&self, slot: u32, isolation: Isolation) -> Result<IdRange>;

    /// The host ids image contents are owned by: a tree committed into the
    /// layer store (a template, a fork base) is restored with them. The
    /// native backend idmaps an image's layers into each sandbox, so they
    /// keep the ids the sandbox saw (0 is root).
    fn image_ids(&self) -> IdRange {
        IdRange { host_base: 0, count: 65536 }
    }

    /// Whether this host can run sandboxes under `isolation`; the error
    /// says why not.
    fn check_isolation(&self, isolation: Isolation) -> Result<()> {
        match isolation {
            Isolation::Native => Ok(()),
            Isolation::Gvisor => Err(crate::Error::Helper("this driver has no gvisor sandboxes".into())),
        }
    }

    /// Takes `slot` host-wide for `task` before anything is built with its
    /// ids. False when a sandbox of another daemon on this host holds it.
    /// [`SandboxDriver::start`] then ties the slot to the sandbox's init.
    fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool>;

    /// Takes `slot` for a sandbox found running after a restart, tied to
    /// its `init`. False when another daemon's sandbox holds the slot.
    fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool>;

    /// Gives `slot` back if `task` holds it (after a teardown, or when a
    /// start or restore failed).
    fn release_slot(&self, slot: u32, task: &str);

    // --- work done ahead of need ---

    /// A sandbox start prepared ahead; its task id becomes the new task's.
    fn take_prestarted(&self) -> Option<Prestarted>;

    /// Prepares starts ahead until the driver's target is reached.
    fn refill_prestarted(&self) -> Result<()>;

    /// The daemon is stopping: drops every start prepared ahead and
    /// releases what the driver holds on the host that nothing uses any more.
    fn close(&self);

    /// Makes task disks ahead until the pool holds its target.
    fn refill_disk_pool(&self) -> Result<()>;

    // --- the task's disk (its writable layer) ---

    /// Makes sure the task's disk exists and is reachable (a new one of
    /// `disk_bytes` if it has none), so its writable layer can be restored
    /// before a sandbox of `isolation` starts on it. Returns the layers.
    fn prepare_disk(&self, task: &str, isolation: Isolation, disk_bytes: u64) -> Result<TaskLayers>;

    /// Whether new disks of `disk_bytes` in all would be admitted now
    /// (checked before a task is recorded; `prepare_disk` decides again).
    fn admit_disks(&self, _disk_bytes: u64) -> Result<()> {
        Ok(())
    }

    /// The layers of the task's disk while it is prepared or running, as
    /// the backend of `isolation` shows them.
    fn layers(&self, task: &str, isolation: Isolation) -> Result<TaskLayers>;

    /// True when the task's disk is kept on this host (a wake can start on
    /// it instead of restoring).
    fn has_disk(&self, task: &str) -> bool;

    /// Removes the task's disk kept on this host, which is stale once
    /// another node ran the task. Only for a task without a sandbox here.
    fn discard_disk(&self, task: &str) -> Result<()>;

    // --- a sandbox's life ---

    /// Builds and starts the sandbox of `task` on `image`, with the ids of
    /// `slot` (reserved by [`SandboxDriver::reserve_slot`]), on its disk as
    /// it is. `ahead` is used when it was prepared for this very task. On
    /// failure everything it made is removed again, except the disk.
    fn start(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess>;

    /// Checks that the sandbox answers; returns its init's pid inside it.
    fn ping(&self, task: &str) -> Result<i32>;

    /// The listening socket of the sandbox's egress proxy port, for the
    /// daemon to serve from outside.
    fn proxy_listener(&self, task: &str) -> Result<TcpListener>;

    /// A connection to `port` on the sandbox's own loopback (its network
    /// stays its own: nothing is bridged). The inner error is why the
    /// sandbox refused it (nothing listens there).
    fn connect_port(&self, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>>;

    /// Watches directory `path` of the sandbox with the sandbox's own
    /// inotify ([`crate::watch`]), writing its lines to `out`; the watch
    /// lasts while the returned command's connection stays open. The inner
    /// error is why it could not start.
    fn watch(&self, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>>;

    /// Sends `signal` to a running command (its `RunningCommand::pid`):
    /// its process group under the native backend, the process under
    /// gvisor. The inner error is why it was not sent.
    fn signal(&self, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>>;

    /// Starts a command. `stdio` (stdin, stdout, stderr) is empty when the
    /// request asks for a tty. The inner error is why the command could not
    /// start (its own fault, not the sandbox's). The returned connection
    /// tells when it ends ([`crate::CommandConnection`]); closing it first
    /// kills the command.
    fn exec(&self, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>>;

    /// How many of the sandbox's processes the OOM killer has killed so far.
    fn oom_kills(&self, task: &str) -> Result<u64>;

    /// Stops every process of the sandbox, so its writable layer holds
    /// still; returns once they all are stopped.
    fn freeze(&self, task: &str) -> Result<()>;

    /// Lets a frozen sandbox run again (harmless when it is not frozen).
    fn thaw(&self, task: &str) -> Result<()>;

    // --- memory (gvisor) ---

    /// Saves the sandbox's processes and memory into its disk, as the
    /// layer `memory` (`<disk_dir>/memory/upper`), and stops the sandbox:
    /// its writable layer holds still from here on. Only a sandbox that
    /// can (gvisor) does.
    fn checkpoint(&self, task: &str) -> Result<()> {
        Err(crate::Error::Helper(format!("the sandbox of task {task} cannot be checkpointed")))
    }

    /// True when the task's disk holds a checkpoint: its next start
    /// restores the processes instead of booting (and spends it).
    fn has_checkpoint(&self, _task: &str) -> bool {
        false
    }

    /// A descriptor of the root directory of the sandbox whose init is
    /// `init`, for resolving paths inside it with [`crate::files`].
    fn open_root(&self, task: &str, init: InitProcess) -> Result<OwnedFd>;

    /// Kills every process of the sandbox and removes everything of it from
    /// the host; with `keep_disk` its disk (the writable layer) stays for a
    /// later start. Safe to repeat, and on a half-built sandbox.
    fn teardown(&self, task: &str, init: Option<InitProcess>, keep_disk: bool) -> Result<()>;

    /// [`SandboxDriver::teardown`] without keeping the disk.
    fn destroy(&self, task: &str, init: Option<InitProcess>) -> Result<()> {
        self.teardown(task, init, false)
    }

    // --- after a restart ---

    /// Tasks that have something on this host, for reconciling with the
    /// store after a restart. May name tasks of other daemons' homes (see
    /// [`SandboxDriver::has_local_state`]).
    fn leftovers(&self) -> Result<Vec<String>>;

    /// True when this daemon's home holds something of the task (beyond
    /// what is shared host-wide and may be another home's).
    fn has_local_state(&self, task: &str) -> bool;
}

/// A live sandbox's init, as recorded in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitProcess {
    pub pid: i32,
    pub start_time: u64,
}

/// What a look at a sandbox's init found.
#[derive(Debug)]
pub enum InitState {
    /// The very process we started (not a pid reuser) runs.
    Running,
    /// It exited: a zombie, gone from `/proc`, or its pid now another
    /// process's (another start time).
    Exited,
    /// It could not be told: reading its `/proc` entry failed for another
    /// reason than its absence (EMFILE, ENFILE, ENOMEM: the daemon is short
    /// of descriptors or memory). Never evidence that it exited; ask again
    /// later. An overloaded daemon once tore down every sandbox this way.
    Unknown(io::Error),
}

impl InitProcess {
    /// Looks once at the init's `/proc/PID/stat`.
    pub fn state(&self) -> InitState {
        init_state(fs::read(format!("/proc/{}/stat", self.pid)), self.start_time)
    }

    /// True only while the init is known to run: also false when that cannot
    /// be told. Whoever would act on its death asks [`InitProcess::exited`].
    pub fn alive(&self) -> bool {
        matches!(self.state(), InitState::Running)
    }

    /// True only when the init is known to have exited.
    pub fn exited(&self) -> bool {
        matches!(self.state(), InitState::Exited)
    }
}

/// The state a read of `/proc/PID/stat` tells (the seam the tests inject
/// failed reads through).
fn init_state(read: io::Result<Vec<u8>>, start_time: u64) -> InitState {
    let stat = match read {
        Ok(stat) => stat,
        // ENOENT: no such pid; ESRCH: it went away between open and read.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => return InitState::Exited,
        Err(e) => return InitState::Unknown(e),
    };
    let stat = String::from_utf8_lossy(&stat);
    let zombie = stat.rfind(')').and_then(|i| stat.get(i + 2..)).is_some_and(|rest| rest.starts_with('Z'));
    match parse_start_time(&stat) {
        Some(t) if t != start_time || zombie => InitState::Exited,
        Some(_) => InitState::Running,
        None => InitState::Unknown(io::Error::new(io::ErrorKind::InvalidData, format!("unreadable /proc stat line {stat:?}"))),
    }
}

/// A command started in a sandbox: the connection to await its exit on, and
/// the pty master if it has a terminal.
#[derive(Debug)]
pub struct RunningCommand {
    pub conn: crate::CommandConnection,
    pub pid: i32,
    pub pty_master: Option<OwnedFd>,
}

/// A connection to a port inside a sandbox.
#[derive(Debug)]
pub enum PortConnection {
    /// A TCP socket made inside the sandbox's network namespace and handed
    /// out (native), non-blocking and perhaps still completing.
    Socket(std::net::TcpStream),
    /// A relay running inside the sandbox (gvisor), already connected; its
    /// bytes travel over `stream` for as long as `relay` is kept.
    Relayed { stream: std::os::unix::net::UnixStream, relay: RunningCommand },
}

/// A sandbox start prepared ahead of need, for a fresh task id. The native
/// driver's is a helper already in that task's cgroups, waiting for its
/// spec on stdin.
#[derive(Debug)]
pub struct Prestarted {
    pub task: String,
    /// The native backend's helper; none on a host that starts nothing ahead.
    pub(crate) child: Option<std::process::Child>,
}

impl Drop for Prestarted {
    /// An unused helper is stopped and reaped; its empty cgroups and run
    /// directory are leftovers the next reconcile removes.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::spawn::process_start_time;

    /// A `/proc/PID/stat` line of a process started at `start`, in `state`.
    fn stat(state: char, start: u64) -> Vec<u8> {
        // Fields 4 to 21, then the start time (22).
        let mut fields = vec!["0".to_owned(); 18];
        fields.push(start.to_string());
        format!("42 (a (tricky) name) {state} {}", fields.join(" ")).into_bytes()
    }

    fn errno(e: i32) -> io::Result<Vec<u8>> {
        Err(io::Error::from_raw_os_error(e))
    }

    #[test]
    fn only_a_read_that_says_the_process_is_gone_means_exited() {
        assert!(matches!(init_state(Ok(stat('S', 7)), 7), InitState::Running));
        assert!(matches!(init_state(Ok(stat('R', 7)), 7), InitState::Running));
        assert!(matches!(init_state(Ok(stat('Z', 7)), 7), InitState::Exited), "a zombie exited");
        assert!(matches!(init_state(Ok(stat('S', 8)), 7), InitState::Exited), "the pid is another process's");
        assert!(matches!(init_state(errno(libc::ENOENT), 7), InitState::Exited));
        assert!(matches!(init_state(errno(libc::ESRCH), 7), InitState::Exited));
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EIO, libc::EACCES, libc::EINTR] {
            match init_state(errno(e), 7) {
                InitState::Unknown(err) => assert_eq!(err.raw_os_error(), Some(e)),
                other => panic!("errno {e} read as {other:?}"),
            }
        }
        assert!(matches!(init_state(Ok(b"42 (cut".to_vec()), 7), InitState::Unknown(_)));
        assert!(matches!(init_state(Ok(Vec::new()), 7), InitState::Unknown(_)));
    }

    /// A process started and killed: its pid and start time, and it is reaped.
    fn dead_process() -> InitProcess {
        let mut child = std::process::Command::new("sleep").arg("1000").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        let start_time = process_start_time(pid).expect("a live child's start time");
        let _ = child.kill();
        let _ = child.wait();
        InitProcess { pid, start_time }
    }

    fn me() -> InitProcess {
        let pid = std::process::id() as i32;
        InitProcess { pid, start_time: process_start_time(pid).expect("own start time") }
    }

    #[test]
    fn live_exited_zombie_and_reused_processes() {
        let me = me();
        assert!(matches!(me.state(), InitState::Running) && me.alive() && !me.exited());
        assert!(matches!(InitProcess { start_time: me.start_time + 1, ..me }.state(), InitState::Exited), "pid reused");
        let dead = dead_process();
        assert!(matches!(dead.state(), InitState::Exited) && dead.exited() && !dead.alive());
        // Killed, not yet reaped: a zombie has exited.
        let mut child = std::process::Command::new("sleep").arg("1000").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        let zombie = InitProcess { pid, start_time: process_start_time(pid).expect("start time") };
        assert!(zombie.alive());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).expect("kill");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie.exited() {
            assert!(std::time::Instant::now() < deadline, "the killed child never read as exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.wait();
    }

    const PROBE: &str = "CAIRN_TEST_INIT_STATE_PROBE";

    /// How a state reads in the probe's report.
    fn word(s: &InitState) -> String {
        match s {
            InitState::Running => "running".into(),
            InitState::Exited => "exited".into(),
            InitState::Unknown(e) => format!("unknown:{}", e.raw_os_error().unwrap_or(-1)),
        }
    }

    /// Run as a child of itself (the soft limit is the whole process's): in
    /// the child, with every descriptor taken, a live and a dead process both
    /// read as unknown, never exited; with one free again, as they are.
    #[test]
    fn a_daemon_out_of_descriptors_reads_unknown_not_exited() {
        if let Ok(arg) = std::env::var(PROBE) {
            let n: Vec<u64> = arg.split(' ').map(|v| v.parse().expect("probe argument")).collect();
            let live = InitProcess { pid: n[0] as i32, start_time: n[1] };
            let dead = InitProcess { pid: n[2] as i32, start_time: n[3] };
            let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).expect("getrlimit");
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 64, hard).expect("setrlimit");
            let mut held = Vec::new();
            let err = loop {
                match fs::File::open("/dev/null") {
                    Ok(f) => held.push(f),
                    Err(e) => break e,
                }
            };
            let full = [live.state(), dead.state()];
            held.truncate(held.len().saturating_sub(2));
            let freed = [live.state(), dead.state()];
            println!("probe: open {} full {} {} freed {} {}", err.raw_os_error().unwrap_or(-1), word(&full[0]), word(&full[1]), word(&freed[0]), word(&freed[1]));
            return;
        }
        let (live, dead) = (me(), dead_process());
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .args(["driver::tests::a_daemon_out_of_descriptors_reads_unknown_not_exited", "--exact", "--nocapture", "--test-threads=1"])
            .env(PROBE, format!("{} {} {} {}", live.pid, live.start_time, dead.pid, dead.start_time))
            .output()
            .expect("run the probe");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "the probe failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        let line = text.lines().find_map(|l| l.find("probe: ").map(|i| &l[i..])).unwrap_or_else(|| panic!("no probe report in {text}"));
        let emfile = libc::EMFILE;
        assert_eq!(line, format!("probe: open {emfile} full unknown:{emfile} unknown:{emfile} freed running exited"));
    }
}
