//! A [`SandboxDriver`] that plays sandboxes without root, namespaces or
//! cgroups, for tests of the lifecycle engine that must run anywhere and
//! in milliseconds.
//!
//! Under its root directory, a task's disk is `disks/<task>/` and its
//! sandbox's files are the root layer's writable directory on it
//! (`disks/<task>/root/upper`), so what a command writes is what a snapshot
//! reads and what a restore brings back. A started sandbox is a `sleep`
//! child standing in for the init (so its pid and start time are real) and
//! a `run/<task>/` directory. Commands run on the host, in the sandbox's
//! directory, and report their exit over the same framed connection the
//! native init uses. Freezing only counts; the proxy port is a loopback
//! listener; uid slots are held in memory and map to the current user.
//!
//! It is the dispatcher ([`crate::Dispatcher`]) over a plain host (a
//! directory per disk, slots in memory, no cgroups; see `host`) and
//! the fake backend, so what the dispatcher and the host do is what the
//! engine's tests see. Around it, every call is recorded
//! ([`FakeDriver::calls`]), and [`FakeDriver::fail_next`] makes the next
//! call of an operation fail, so a test can break a lifecycle operation at
//! any step.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::net::TcpListener;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_core::{Isolation, TaskConfig};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::backend::Backend;
use crate::dispatch::Dispatcher;
use crate::driver::SandboxDriver;
use cairn_image::Image;
use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand};
use crate::host::Host;
use crate::layers::TaskLayers;
use crate::process::spawn::process_start_time;
use crate::proto::{self, ExecRequest, Reply};
use cairn_image::Layer;
use crate::uidmap::IdRange;
use crate::{Error, Result};

/// How long a fake init lives at most, so a test process killed midway
/// leaves nothing lasting behind.
const INIT_LIFETIME_SECS: &str = "3600";

/// The driver operations, as recorded and as failed on request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    ReserveSlot,
    AdoptSlot,
    ReleaseSlot,
    TakePrestarted,
    RefillPrestarted,
    Close,
    RefillDiskPool,
    PrepareDisk,
    Start,
    Ping,
    ProxyListener,
    ConnectPort,
    Watch,
    Signal,
    Exec,
    OomKills,
    Freeze,
    Thaw,
    OpenRoot,
    Teardown,
    Destroy,
    Leftovers,
}

impl Op {
    /// The trait method's name.
    pub fn name(self) -> &'static str {
        match self {
            Op::ReserveSlot => "reserve_slot",
            Op::AdoptSlot => "adopt_slot",
            Op::ReleaseSlot => "release_slot",
            Op::TakePrestarted => "take_prestarted",
            Op::RefillPrestarted => "refill_prestarted",
            Op::Close => "close",
            Op::RefillDiskPool => "refill_disk_pool",
            Op::PrepareDisk => "prepare_disk",
            Op::Start => "start",
            Op::Ping => "ping",
            Op::ProxyListener => "proxy_listener",
            Op::ConnectPort => "connect_port",
            Op::Watch => "watch",
            Op::Signal => "signal",
            Op::Exec => "exec",
            Op::OomKills => "oom_kills",
            Op::Freeze => "freeze",
            Op::Thaw => "thaw",
            Op::OpenRoot => "open_root",
            Op::Teardown => "teardown",
            Op::Destroy => "destroy",
            Op::Leftovers => "leftovers",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One recorded call: the operation, the task it concerns (empty for
/// operations on no task) and what else tells calls apart (a slot, an
/// argv, whether a teardown keeps the disk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub task: String,
    pub detail: String,
}

impl fmt::Display for Call {
    /// `start t1 (slot 0)`, `leftovers`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.op.name())?;
        if !self.task.is_empty() {
            write!(f, " {}", self.task)?;
        }
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

/// A started fake sandbox.
#[derive(Debug)]
struct Sandbox {
    /// The stand-in init; `None` once reaped.
    init_child: Option<Child>,
    init: InitProcess,
    frozen: bool,
}

impl Sandbox {
    /// Kills and reaps the stand-in init. It is only signalled while it is
    /// the very process started (a reaper elsewhere may have collected it).
    fn stop(&mut self) {
        if let Some(mut child) = self.init_child.take() {
            if self.init.alive() {
                let _ = kill(Pid::from_raw(self.init.pid), Signal::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

/// What the fake backend keeps of its sandboxes.
#[derive(Debug, Default)]
struct Sandboxes {
    started: HashMap<String, Sandbox>,
    oom_kills: HashMap<String, u64>,
    freezes: u64,
}

/// The recorded calls and the failures still to happen, by operation.
#[derive(Debug, Default)]
struct Calls {
    calls: Vec<Call>,
    failing: HashMap<Op, u32>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fake driver; see the module documentation.
#[derive(Debug)]
pub struct FakeDriver {
    inner: Dispatcher,
    sandboxes: Arc<Mutex<Sandboxes>>,
    calls: Mutex<Calls>,
}

impl FakeDriver {
    /// A driver keeping everything under `root` (a test's temporary
    /// directory).
    pub fn new(root: &Path) -> Result<FakeDriver> {
        let sandboxes = Arc::new(Mutex::new(Sandboxes::default()));
        let backend = FakeBackend { sandboxes: sandboxes.clone() };
        let inner = Dispatcher::with_backends(Host::plain(root)?, vec![Box::new(backend)]);
        Ok(FakeDriver { inner, sandboxes, calls: Mutex::default() })
    }

    /// Keeps `n` task ids ready for [`SandboxDriver::take_prestarted`]
    /// (none by default), filled by [`SandboxDriver::refill_prestarted`].
    pub fn with_prestart_target(mut self, n: usize) -> FakeDriver {
        self.inner.host.prestart_target = n;
        self
    }

    fn sandboxes(&self) -> MutexGuard<'_, Sandboxes> {
        lock(&self.sandboxes)
    }

    /// Makes the next call of `op` fail: a call that returns a result
    /// returns [`Error::Injected`]; one that cannot fail does nothing
    /// (`take_prestarted` gives none, `release_slot` keeps the slot).
    /// Repeated, it fails as many calls.
    pub fn fail_next(&self, op: Op) {
        *lock(&self.calls).failing.entry(op).or_default() += 1;
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).calls.clone()
    }

    /// The operations of [`FakeDriver::calls`] for `task`, in order.
    pub fn ops_for(&self, task: &str) -> Vec<Op> {
        lock(&self.calls).calls.iter().filter(|c| c.task == task).map(|c| c.op).collect()
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        lock(&self.calls).calls.clear();
    }

    /// Lets a sandbox of another home hold `slot`: reserving it fails.
    pub fn hold_slot_elsewhere(&self, slot: u32) {
        self.inner.host.hold_slot_elsewhere(slot);
    }

    /// The task of this home holding `slot`.
    pub fn slot_holder(&self, slot: u32) -> Option<String> {
        self.inner.host.slot_holder(slot)
    }

    /// The init of the task's sandbox while one is started.
    pub fn running(&self, task: &str) -> Option<InitProcess> {
        self.sandboxes().started.get(task).map(|s| s.init)
    }

    /// Kills the task's stand-in init, as if the sandbox died on its own;
    /// it stays unreaped until a reaper or the teardown collects it. False
    /// when the task has no sandbox.
    pub fn kill_init(&self, task: &str) -> bool {
        match self.sandboxes().started.get(task) {
            Some(s) if s.init.alive() => kill(Pid::from_raw(s.init.pid), Signal::SIGKILL).is_ok(),
            _ => false,
        }
    }

    /// Counts one more OOM kill in the task's sandbox.
    pub fn add_oom_kill(&self, task: &str) {
        *self.sandboxes().oom_kills.entry(task.to_owned()).or_default() += 1;
    }

    /// True between a freeze and a thaw of the task's sandbox.
    pub fn is_frozen(&self, task: &str) -> bool {
        self.sandboxes().started.get(task).is_some_and(|s| s.frozen)
    }

    /// How many freezes succeeded, over all tasks.
    pub fn freezes(&self) -> u64 {
        self.sandboxes().freezes
    }

    /// The sandbox's `/` on the host: the root layer's writable directory.
    pub fn root_dir(&self, task: &str) -> PathBuf {
        root_dir(&self.inner.host, task)
    }

    /// Where the task's disk is on the host: its layers' directories.
    pub fn disk_dir(&self, task: &str) -> PathBuf {
        self.inner.host.disk_dir(task)
    }

    #[cfg(test)]
    fn run_dir(&self, task: &str) -> PathBuf {
        self.inner.host.paths(task).run_dir
    }

    /// Records a call and takes an injected failure of it, if one is due.
    fn enter(&self, op: Op, task: &str, detail: impl Into<String>) -> Result<()> {
        let mut calls = lock(&self.calls);
        calls.calls.push(Call { op, task: task.to_owned(), detail: detail.into() });
        match calls.failing.get_mut(&op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(Error::Injected(op.name()))
            }
            _ => Ok(()),
        }
    }
}

/// The sandbox's `/` on the host: the root layer's writable directory.
fn root_dir(host: &Host, task: &str) -> PathBuf {
    host.disk_dir(task).join(root_layer_name()).join("upper")
}

/// The fake backend: a sandbox is a stand-in init and the root layer's
/// writable directory on the task's disk.
#[derive(Debug)]
struct FakeBackend {
    sandboxes: Arc<Mutex<Sandboxes>>,
}

impl FakeBackend {
    fn sandboxes(&self) -> MutexGuard<'_, Sandboxes> {
        lock(&self.sandboxes)
    }

    /// The init of a sandbox that is started and whose init still lives.
    fn live_init(&self, task: &str) -> Result<InitProcess> {
        match self.sandboxes().started.get(task) {
            Some(s) if s.init.alive() => Ok(s.init),
            _ => Err(Error::NotRunning(task.to_owned())),
        }
    }

    /// Starts `req` on the host in the sandbox's directory, as the daemon's
    /// own user (`req.user` is not applied: there is no user namespace).
    fn spawn_command(host: &Host, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        let Some(program) = req.argv.first() else {
            return Ok(Err("empty command".to_owned()));
        };
        let cwd = root_dir(host, task).join(req.cwd.trim_start_matches('/'));
        if !cwd.is_dir() {
            return Ok(Err(format!("cannot change to directory {:?}: no such directory", req.cwd)));
        }
        let mut cmd = Command::new(program);
        cmd.args(&req.argv[1..]).current_dir(&cwd).env_clear();
        cmd.envs(req.env.iter().filter_map(|kv| kv.split_once('=')));
        let pty_master = match req.tty {
            Some(size) => {
                let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
                let pty = nix::pty::openpty(Some(&ws), None).map_err(|e| Error::sys("openpty", e))?;
                for set in [Command::stdin, Command::stdout, Command::stderr] {
                    let slave = pty.slave.try_clone().map_err(|e| Error::sys("dup pty", e))?;
                    set(&mut cmd, Stdio::from(slave));
                }
                // SAFETY: the hook runs between fork and exec and calls only
                // setsid and ioctl, which are async-signal-safe.
                unsafe {
                    cmd.pre_exec(|| {
                        if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                Some(pty.master)
            }
            None => {
                let [stdin, stdout, stderr] = stdio else {
                    return Ok(Err(format!("expected 3 stdio descriptors, got {}", stdio.len())));
                };
                let mut owned = Vec::with_capacity(3);
                for fd in [stdin, stdout, stderr] {
                    // SAFETY: the caller keeps its stdio descriptors open for
                    // the duration of the exec call; they are duplicated here.
                    let borrowed = unsafe { BorrowedFd::borrow_raw(*fd) };
                    owned.push(borrowed.try_clone_to_owned().map_err(|e| Error::sys("dup stdio", e))?);
                }
                let mut owned = owned.into_iter().map(Stdio::from);
                cmd.stdin(owned.next().unwrap_or_else(Stdio::null));
                cmd.stdout(owned.next().unwrap_or_else(Stdio::null));
                cmd.stderr(owned.next().unwrap_or_else(Stdio::null));
                // Its own group, so a closed connection kills all of it.
                cmd.process_group(0);
                None
            }
        };
        let spawned = cmd.spawn();
        // The command holds its own copies of the stdio ends now.
        drop(cmd);
        let child = match spawned {
            Ok(c) => c,
            Err(e) => return Ok(Err(format!("cannot run {program:?}: {e}"))),
        };
        let pid = child.id() as i32;
        let (conn, init_side) = UnixStream::pair().map_err(Error::Control)?;
        std::thread::Builder::new()
            .name(format!("fake-exec-{pid}"))
            .spawn(move || report_exit(child, init_side))
            .map_err(|e| Error::sys("spawn the exec watcher", e))?;
        Ok(Ok(RunningCommand { conn: crate::CommandConnection::new(conn), pid, pty_master }))
    }
}

/// The part of the init that waits for a command: sends
/// [`Reply::Exited`] when it ends, or kills its process group when the
/// connection closes first.
fn report_exit(mut child: Child, conn: UnixStream) {
    let pid = child.id() as i32;
    let pidfd = rustix::process::Pid::from_raw(pid).and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let _ = proto::send(&conn, &Reply::Exited { code: status.code(), signal: status.signal() }, &[]);
                return;
            }
            Ok(None) => {}
            Err(_) => return,
        }
        let mut fds = vec![PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        // Without a pidfd (an old kernel), look at the child now and then.
        let timeout = if pidfd.is_some() { PollTimeout::NONE } else { PollTimeout::from(5u8) };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(_) => return,
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = child.wait();
            return;
        }
    }
}

/// The root layer's directory name on a task disk.
fn root_layer_name() -> String {
    Layer { lowers: Vec::new(), at: "/".into(), history: 0 }.disk_name()
}


impl Drop for FakeBackend {
    /// No stand-in init outlives the driver.
    fn drop(&mut self) {
        for s in self.sandboxes().started.values_mut() {
            s.stop();
        }
    }
}

impl Backend for FakeBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Native
    }

    /// The current user's own id: restores and copies can own files by it
    /// without privileges.
    fn uid_range(&self, slot: u32) -> Result<IdRange> {
        IdRange::for_slot(slot)?;
        Ok(IdRange { host_base: rustix::process::geteuid().as_raw(), count: 1 })
    }

    /// The fake's sandboxes see the files as the test's user owns them, so
    /// a template or fork base is that user's too (no root needed).
    fn image_ids(&self) -> IdRange {
        IdRange { host_base: rustix::process::geteuid().as_raw(), count: 1 }
    }

    /// Fails, like a real start, when the task holds no uid slot.
    fn start(&self, host: &Host, task: &str, config: &TaskConfig, _image: &Image, slot: u32, _ahead: Option<Prestarted>) -> Result<InitProcess> {
        if host.slot_holder(slot).is_none_or(|holder| holder != task) {
            return Err(Error::Helper(format!("task {task} starts on uid slot {slot}, which it has not reserved")));
        }
        host.prepare_disk(task, 0)?;
        let root = root_dir(host, task);
        let workdir = root.join(config.workdir.trim_start_matches('/'));
        fs::create_dir_all(&workdir).map_err(|e| Error::Io(workdir.display().to_string(), e))?;
        let child = Command::new("sleep")
            .arg(INIT_LIFETIME_SECS)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::Helper(format!("cannot run sleep as the fake init: {e}")))?;
        let pid = child.id() as i32;
        let init = InitProcess { pid, start_time: process_start_time(pid).unwrap_or_default() };
        self.sandboxes().started.insert(task.to_owned(), Sandbox { init_child: Some(child), init, frozen: false });
        Ok(init)
    }

    fn ping(&self, _host: &Host, task: &str) -> Result<i32> {
        self.live_init(task)?;
        Ok(1)
    }

    fn proxy_listener(&self, _host: &Host, task: &str) -> Result<TcpListener> {
        self.live_init(task)?;
        TcpListener::bind(("127.0.0.1", 0)).map_err(|e| Error::sys("bind the fake proxy port", e))
    }

    fn connect_port(&self, _host: &Host, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        self.live_init(task)?;
        Ok(Err(format!("the fake driver's sandboxes have no network of their own (port {port})")))
    }

    fn signal(&self, _host: &Host, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        self.live_init(task)?;
        // The fake's commands are host processes.
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::try_from(signal).map_err(|e| Error::sys("signal", e))?) {
            Ok(()) => Ok(Ok(())),
            Err(e) => Ok(Err(format!("cannot signal command {pid}: {e}"))),
        }
    }

    fn watch(&self, _host: &Host, task: &str, _path: &str, _recursive: bool, _out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        self.live_init(task)?;
        Ok(Err("the fake driver has no directory watches".into()))
    }

    fn exec(&self, host: &Host, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        self.live_init(task)?;
        FakeBackend::spawn_command(host, task, req, stdio)
    }

    fn oom_kills(&self, _host: &Host, task: &str) -> Result<u64> {
        Ok(self.sandboxes().oom_kills.get(task).copied().unwrap_or(0))
    }

    fn freeze(&self, _host: &Host, task: &str) -> Result<()> {
        self.live_init(task)?;
        let mut sandboxes = self.sandboxes();
        if let Some(s) = sandboxes.started.get_mut(task) {
            s.frozen = true;
        }
        sandboxes.freezes += 1;
        Ok(())
    }

    fn thaw(&self, _host: &Host, task: &str) -> Result<()> {
        if let Some(s) = self.sandboxes().started.get_mut(task) {
            s.frozen = false;
        }
        Ok(())
    }

    fn open_root(&self, host: &Host, task: &str, init: InitProcess) -> Result<OwnedFd> {
        if self.live_init(task)? != init {
            return Err(Error::NotRunning(task.to_owned()));
        }
        let root = root_dir(host, task);
        rustix::fs::open(&root, rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| Error::Io(root.display().to_string(), e.into()))
    }

    /// Stops the stand-in init (only the fake's own process is killed).
    fn stop(&self, _host: &Host, task: &str, _init: Option<InitProcess>) -> Result<()> {
        let sandbox = self.sandboxes().started.remove(task);
        if let Some(mut s) = sandbox {
            s.stop();
        }
        Ok(())
    }
}

/// Each call recorded, failed on request, then the dispatcher's.
impl SandboxDriver for FakeDriver {
    fn uid_range(&self, slot: u32, isolation: Isolation) -> Result<IdRange> {
        self.inner.uid_range(slot, isolation)
    }

    fn image_ids(&self) -> IdRange {
        self.inner.image_ids()
    }

    fn check_isolation(&self, isolation: Isolation) -> Result<()> {
        self.inner.check_isolation(isolation)
    }

    fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool> {
        self.enter(Op::ReserveSlot, task, format!("slot {slot}"))?;
        self.inner.reserve_slot(slot, task)
    }

    fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool> {
        self.enter(Op::AdoptSlot, task, format!("slot {slot}"))?;
        self.inner.adopt_slot(slot, task, init)
    }

    fn release_slot(&self, slot: u32, task: &str) {
        if self.enter(Op::ReleaseSlot, task, format!("slot {slot}")).is_ok() {
            self.inner.release_slot(slot, task);
        }
    }

    fn take_prestarted(&self) -> Option<Prestarted> {
        self.enter(Op::TakePrestarted, "", "").ok()?;
        self.inner.take_prestarted()
    }

    fn refill_prestarted(&self) -> Result<()> {
        self.enter(Op::RefillPrestarted, "", "")?;
        self.inner.refill_prestarted()
    }

    fn close(&self) {
        if self.enter(Op::Close, "", "").is_ok() {
            self.inner.close();
        }
    }

    fn refill_disk_pool(&self) -> Result<()> {
        self.enter(Op::RefillDiskPool, "", "")?;
        self.inner.refill_disk_pool()
    }

    fn prepare_disk(&self, task: &str, isolation: Isolation, disk_bytes: u64) -> Result<TaskLayers> {
        self.enter(Op::PrepareDisk, task, "")?;
        self.inner.prepare_disk(task, isolation, disk_bytes)
    }

    fn admit_disks(&self, disk_bytes: u64) -> Result<()> {
        self.inner.admit_disks(disk_bytes)
    }

    fn layers(&self, task: &str, isolation: Isolation) -> Result<TaskLayers> {
        self.inner.layers(task, isolation)
    }

    fn has_disk(&self, task: &str) -> bool {
        self.inner.has_disk(task)
    }

    fn discard_disk(&self, task: &str) -> Result<()> {
        self.inner.discard_disk(task)
    }

    fn start(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let prestarted = if ahead.as_ref().is_some_and(|p| p.task == task) { ", prestarted" } else { "" };
        self.enter(Op::Start, task, format!("slot {slot}{prestarted}"))?;
        self.inner.start(task, config, image, slot, ahead)
    }

    fn ping(&self, task: &str) -> Result<i32> {
        self.enter(Op::Ping, task, "")?;
        self.inner.ping(task)
    }

    fn proxy_listener(&self, task: &str) -> Result<TcpListener> {
        self.enter(Op::ProxyListener, task, "")?;
        self.inner.proxy_listener(task)
    }

    fn connect_port(&self, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        self.enter(Op::ConnectPort, task, port.to_string())?;
        self.inner.connect_port(task, port)
    }

    fn watch(&self, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        self.enter(Op::Watch, task, path.to_owned())?;
        self.inner.watch(task, path, recursive, out)
    }

    fn signal(&self, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        self.enter(Op::Signal, task, format!("{pid} {signal}"))?;
        self.inner.signal(task, pid, signal)
    }

    fn exec(&self, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        self.enter(Op::Exec, task, req.argv.join(" "))?;
        self.inner.exec(task, req, stdio)
    }

    fn oom_kills(&self, task: &str) -> Result<u64> {
        self.enter(Op::OomKills, task, "")?;
        self.inner.oom_kills(task)
    }

    fn freeze(&self, task: &str) -> Result<()> {
        self.enter(Op::Freeze, task, "")?;
        self.inner.freeze(task)
    }

    fn thaw(&self, task: &str) -> Result<()> {
        self.enter(Op::Thaw, task, "")?;
        self.inner.thaw(task)
    }

    fn checkpoint(&self, task: &str) -> Result<()> {
        self.inner.checkpoint(task)
    }

    fn has_checkpoint(&self, task: &str) -> bool {
        self.inner.has_checkpoint(task)
    }

    fn open_root(&self, task: &str, init: InitProcess) -> Result<OwnedFd> {
        self.enter(Op::OpenRoot, task, "")?;
        self.inner.open_root(task, init)
    }

    fn teardown(&self, task: &str, init: Option<InitProcess>, keep_disk: bool) -> Result<()> {
        self.enter(Op::Teardown, task, if keep_disk { "keep disk" } else { "" })?;
        self.inner.teardown(task, init, keep_disk)
    }

    fn destroy(&self, task: &str, init: Option<InitProcess>) -> Result<()> {
        self.enter(Op::Destroy, task, "")?;
        self.inner.teardown(task, init, false)
    }

    fn leftovers(&self) -> Result<Vec<String>> {
        self.enter(Op::Leftovers, "", "")?;
        self.inner.leftovers()
    }

    fn has_local_state(&self, task: &str) -> bool {
        self.inner.has_local_state(task)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::files::SandboxRoot;
    use crate::proto::WinSize;

    const TASK: &str = "t-fake";

    fn image() -> Image {
        Image {
            name: "test".into(),
            kind: cairn_image::ImageKind::Rootfs,
            rootfs: "/nonexistent".into(),
            projections: Vec::new(),
            size_bytes: 0,
            files: 0,
            created_ms: 0,
            source: "test".into(),
            dropped: Default::default(),
            layers: Vec::new(),
            config: None,
            manifest_digest: None,
            lowers: Vec::new(),
            parent: None,
            committed: Vec::new(),
            fork_of: None,
            stack: Vec::new(),
            trust: None,
        }
    }

    fn started(driver: &FakeDriver, slot: u32) -> InitProcess {
        assert!(driver.reserve_slot(slot, TASK).unwrap());
        driver.start(TASK, &TaskConfig::default(), &image(), slot, None).unwrap()
    }

    /// Runs `argv` with pipes; returns the exit reply and what it printed.
    fn run(driver: &FakeDriver, argv: &[&str], cwd: &str) -> (Reply, String) {
        let (mut out_r, out_w) = std::io::pipe().unwrap();
        let null = fs::File::open("/dev/null").unwrap();
        let req = ExecRequest { argv: argv.iter().map(|s| s.to_string()).collect(), env: vec!["PATH=/usr/bin:/bin".into(), "GREETING=hi".into()], cwd: cwd.into(), tty: None, user: None };
        let cmd = driver.exec(TASK, &req, &[null.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()]).unwrap().unwrap();
        drop(out_w);
        let (reply, _) = proto::recv::<Reply>(&cmd.conn).unwrap().unwrap();
        let mut out = String::new();
        out_r.read_to_string(&mut out).unwrap();
        (reply, out)
    }

    #[test]
    fn start_exec_teardown_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap();
        let init = started(&driver, 4);
        assert!(init.alive());
        assert_eq!(driver.ping(TASK).unwrap(), 1);
        assert_eq!(driver.slot_holder(4).as_deref(), Some(TASK));

        let (reply, out) = run(&driver, &["sh", "-c", "echo $GREETING > made.txt; pwd; exit 3"], "/workspace");
        assert_eq!(reply, Reply::Exited { code: Some(3), signal: None });
        assert_eq!(out.trim(), driver.root_dir(TASK).join("workspace").display().to_string());
        // What the command wrote is in the writable layer, and reachable
        // through the sandbox's root descriptor.
        let upper = driver.disk_dir(TASK).join("root/upper/workspace/made.txt");
        assert_eq!(fs::read_to_string(&upper).unwrap(), "hi\n");
        let root = SandboxRoot::new(driver.open_root(TASK, init).unwrap());
        let l = root.locate("/workspace/made.txt").unwrap();
        assert_eq!(crate::files::read_file(&l.dir, &l.name, 100).unwrap(), b"hi\n");

        let (reply, _) = run(&driver, &["sh", "-c", "kill -TERM $$"], "/");
        assert_eq!(reply, Reply::Exited { code: None, signal: Some(libc::SIGTERM) });
        assert!(driver.exec(TASK, &ExecRequest { argv: vec!["true".into()], env: vec![], cwd: "/missing".into(), tty: None, user: None }, &[0, 1, 2]).unwrap().is_err());
        assert!(driver.exec(TASK, &ExecRequest { argv: vec!["/no/such/program".into()], env: vec![], cwd: "/".into(), tty: None, user: None }, &[0, 1, 2]).unwrap().is_err());

        driver.teardown(TASK, Some(init), true).unwrap();
        assert!(!init.alive() && driver.running(TASK).is_none());
        assert!(driver.has_disk(TASK), "the disk stays for a later start");
        assert!(matches!(driver.ping(TASK), Err(Error::NotRunning(_))));
        driver.release_slot(4, TASK);
        assert_eq!(driver.slot_holder(4), None);
        driver.destroy(TASK, None).unwrap();
        assert!(!driver.has_local_state(TASK) && driver.leftovers().unwrap().is_empty());
    }

    #[test]
    fn calls_are_recorded_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap();
        let init = started(&driver, 0);
        driver.freeze(TASK).unwrap();
        assert!(driver.is_frozen(TASK));
        driver.thaw(TASK).unwrap();
        assert!(!driver.is_frozen(TASK) && driver.freezes() == 1);
        driver.teardown(TASK, Some(init), false).unwrap();
        let calls: Vec<String> = driver.calls().iter().map(ToString::to_string).collect();
        assert_eq!(calls, ["reserve_slot t-fake (slot 0)", "start t-fake (slot 0)", "freeze t-fake", "thaw t-fake", "teardown t-fake"]);
        assert_eq!(driver.ops_for(TASK), [Op::ReserveSlot, Op::Start, Op::Freeze, Op::Thaw, Op::Teardown]);
    }

    #[test]
    fn injected_failures_hit_the_next_call_only() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap();
        assert!(driver.reserve_slot(0, TASK).unwrap());
        driver.fail_next(Op::Start);
        assert!(matches!(driver.start(TASK, &TaskConfig::default(), &image(), 0, None), Err(Error::Injected("start"))));
        assert!(driver.running(TASK).is_none() && !driver.run_dir(TASK).exists(), "a failed start leaves no sandbox");
        let init = driver.start(TASK, &TaskConfig::default(), &image(), 0, None).unwrap();

        driver.fail_next(Op::Freeze);
        assert!(driver.freeze(TASK).is_err());
        assert!(!driver.is_frozen(TASK));
        driver.fail_next(Op::Teardown);
        assert!(driver.teardown(TASK, Some(init), true).is_err());
        assert!(init.alive(), "a failed teardown leaves the sandbox");
        driver.fail_next(Op::ReleaseSlot);
        driver.release_slot(0, TASK);
        assert_eq!(driver.slot_holder(0).as_deref(), Some(TASK), "a lost release keeps the slot");
        driver.destroy(TASK, Some(init)).unwrap();
        assert!(!init.alive());
    }

    #[test]
    fn slots_held_elsewhere_or_unreserved_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap();
        driver.hold_slot_elsewhere(1);
        assert!(!driver.reserve_slot(1, TASK).unwrap());
        assert!(driver.reserve_slot(2, "other").unwrap());
        assert!(!driver.reserve_slot(2, TASK).unwrap());
        assert!(driver.start(TASK, &TaskConfig::default(), &image(), 2, None).is_err(), "not its slot");
        assert!(driver.reserve_slot(3, TASK).unwrap());
        assert!(driver.start(TASK, &TaskConfig::default(), &image(), 1, None).is_err(), "not the slot it reserved");
        let ids = driver.uid_range(2, cairn_core::Isolation::Native).unwrap();
        assert_eq!((ids.host_base, ids.count), (rustix::process::geteuid().as_raw(), 1));
    }

    #[test]
    fn a_closed_connection_kills_the_command_and_a_dead_init_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap();
        let init = started(&driver, 0);
        let req = ExecRequest { argv: vec!["sleep".into(), "30".into()], env: vec!["PATH=/usr/bin:/bin".into()], cwd: "/".into(), tty: Some(WinSize { rows: 24, cols: 80 }), user: None };
        let cmd = driver.exec(TASK, &req, &[]).unwrap().unwrap();
        assert!(cmd.pty_master.is_some());
        let pid = cmd.pid;
        drop(cmd);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while process_start_time(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(process_start_time(pid).is_none(), "the command was killed and reaped");

        assert!(driver.kill_init(TASK));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while init.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(matches!(driver.exec(TASK, &req, &[]), Err(Error::NotRunning(_))));
        driver.destroy(TASK, Some(init)).unwrap();
    }

    #[test]
    fn serves_as_a_shared_driver() {
        let dir = tempfile::tempdir().unwrap();
        let fake = std::sync::Arc::new(FakeDriver::new(dir.path()).unwrap());
        let driver: std::sync::Arc<dyn SandboxDriver> = fake.clone();
        assert!(driver.reserve_slot(0, TASK).unwrap());
        assert_eq!(fake.slot_holder(0).as_deref(), Some(TASK));
    }

    #[test]
    fn prestarted_ids_are_handed_out_once() {
        let dir = tempfile::tempdir().unwrap();
        let driver = FakeDriver::new(dir.path()).unwrap().with_prestart_target(2);
        assert!(driver.take_prestarted().is_none());
        driver.refill_prestarted().unwrap();
        let a = driver.take_prestarted().unwrap();
        let b = driver.take_prestarted().unwrap();
        assert_ne!(a.task, b.task);
        assert!(driver.take_prestarted().is_none());
        driver.refill_prestarted().unwrap();
        driver.close();
        assert!(driver.take_prestarted().is_none());
    }
}
