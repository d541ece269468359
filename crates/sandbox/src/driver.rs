//! What the lifecycle engine needs from a sandbox driver, and nothing of
//! how it is done: no cgroup, mount, loop device or namespace shows through.
//!
//! Every method blocks (the daemon runs them on its blocking pool) and
//! takes plain data: a task id, its config, an image, a uid slot. The
//! [`crate::NativeDriver`] builds real sandboxes; with the `test-util`
//! feature, `fake::FakeDriver` plays one with plain directories
//! and host processes, so the engine's own tests need no root.
//!
//! The writable layer lives on the task's disk, one directory per overlay
//! layer ([`crate::Image::layers`]): `<disk_dir>/<Layer::disk_name>/upper`.
//! Snapshots read it there (between [`SandboxDriver::freeze`] and
//! [`SandboxDriver::thaw`]); restores write it there after
//! [`SandboxDriver::prepare_disk`], before the sandbox starts on it.

use std::fmt;
use std::fs;
use std::net::TcpListener;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use cairn_core::{Isolation, TaskConfig};

use crate::image::Image;
use crate::process::spawn::process_start_time;
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

    /// Makes sure the task's disk exists and is reachable at
    /// [`SandboxDriver::disk_dir`] (a new one of `disk_bytes` if it has
    /// none), so its writable layer can be restored before a start. Returns
    /// that directory.
    fn prepare_disk(&self, task: &str, disk_bytes: u64) -> Result<PathBuf>;

    /// Whether new disks of `disk_bytes` in all would be admitted now
    /// (checked before a task is recorded; `prepare_disk` decides again).
    fn admit_disks(&self, _disk_bytes: u64) -> Result<()> {
        Ok(())
    }

    /// Where the task's disk is reachable while it is prepared or running.
    fn disk_dir(&self, task: &str) -> PathBuf;

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

    /// Starts a command. `stdio` (stdin, stdout, stderr) is empty when the
    /// request asks for a tty. The inner error is why the command could not
    /// start (its own fault, not the sandbox's). The returned connection
    /// carries one [`crate::proto::Reply::Exited`] when it ends; closing it
    /// first kills the command.
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

impl InitProcess {
    /// True while the very process we started (not a pid reuser) is alive
    /// and not a zombie.
    pub fn alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time) && !is_zombie(self.pid)
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('Z')))
        .unwrap_or(false)
}

/// A command started in a sandbox: the connection to await its exit on, and
/// the pty master if it has a terminal.
#[derive(Debug)]
pub struct RunningCommand {
    pub conn: UnixStream,
    pub pid: i32,
    pub pty_master: Option<OwnedFd>,
}

/// A sandbox start prepared ahead of need, for a fresh task id. The native
/// driver's is a helper already in that task's cgroups, waiting for its
/// spec on stdin.
#[derive(Debug)]
pub struct Prestarted {
    pub task: String,
    /// The native driver's helper; none for a driver that starts nothing ahead.
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
