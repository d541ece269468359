//! What the host gives every sandbox, whatever its isolation: a task's
//! paths (run directory, disk image and where it is mounted), its disk and
//! the pool that has disks formatted ahead, its cgroups, its uid slot and
//! the helpers started ahead of need. The backends (`native`, `gvisor`,
//! `fake`) build their sandboxes on these; the dispatcher (`dispatch`)
//! hands them out and takes them back.
//!
//! A host is real ([`Host::new`]: loop-mounted ext4 disks, cgroups, the
//! host-wide slot record, the home sealed `nosuid,nodev`) or plain
//! ([`Host::plain`]: a directory per disk, no cgroups, slots in memory),
//! which needs no root, for the fake backend.
//!
//! Inside:
//! - `cgroup`: per-task resource limits on cgroup v1 or v2;
//! - `disk`: the per-task ext4 loop image that holds the writable layer,
//!   and the pool of images formatted ahead;
//! - `disk_budget`: new disks admitted against the space that holds them;
//! - `slots`: the host-wide record of the uid slots sandboxes use;
//! - `home_mount`: the daemon's home mounted on itself `nosuid,nodev`.

pub(crate) mod cgroup;
pub(crate) mod disk;
pub(crate) mod disk_budget;
pub(crate) mod home_mount;
pub(crate) mod slots;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use self::cgroup::{CgroupLayout, TaskCgroup};
use self::disk::DiskPool;
use self::disk_budget::DiskSpace;
use self::home_mount::HomeMount;
use self::slots::HostSlots;
use crate::driver::{InitProcess, Prestarted};
use crate::process::spawn::process_start_time;
use crate::{Error, Result};

/// The hidden subcommand of the `cairn` binary that runs [`crate::helper_main`].
pub const HELPER_SUBCOMMAND: &str = "__sandbox-start";

/// Where one task's sandbox lives on the host.
#[derive(Clone, Debug)]
pub(crate) struct TaskPaths {
    /// Mount points, control socket, init log, the isolation it runs
    /// under. Removed on teardown.
    pub(crate) run_dir: PathBuf,
    /// The ext4 image holding the writable layer (on a plain host, the
    /// disk's directory itself).
    pub(crate) disk_image: PathBuf,
    /// Where that image is mounted on the host: the disk's directory.
    pub(crate) disk_mount: PathBuf,
    pub(crate) control_socket: PathBuf,
}

/// How the host makes and reaches its tasks' disks.
#[derive(Debug)]
enum Disks {
    /// An ext4 image per task (`<disks>/<task>.img`), taken from the pool
    /// of formatted ones, admitted against the space that holds them and
    /// loop-mounted in the task's run directory.
    Images {
        pool: DiskPool,
        space: DiskSpace,
        /// One admission at a time: two could each see room for one disk.
        admitting: Mutex<()>,
    },
    /// A directory per task (`<disks>/<task>/`).
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    Directories,
}

/// Who holds which uid slot.
#[derive(Debug)]
enum Slots {
    /// The host-wide record, shared by every daemon of the host.
    Host(HostSlots),
    /// Kept in memory, for this host value alone.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    Memory(Mutex<MemorySlots>),
}

#[derive(Debug, Default)]
struct MemorySlots {
    /// Slot -> the task of this home holding it.
    held: HashMap<u32, String>,
    /// Slots a sandbox of another home holds.
    foreign: HashSet<u32>,
}

/// The host's resources; see the module documentation.
#[derive(Debug)]
pub(crate) struct Host {
    run_root: PathBuf,
    disk_root: PathBuf,
    disks: Disks,
    /// None on a plain host.
    cgroups: Option<CgroupLayout>,
    slots: Slots,
    /// The `cairn` executable, whose helper starts sandboxes; on a plain
    /// host none, and a start prepared ahead is only a task id.
    helper: Option<PathBuf>,
    prestarted: Mutex<Vec<Prestarted>>,
    pub(crate) prestart_target: usize,
    prestart_limits: cairn_core::Limits,
    /// Set when the daemon stops: no more starts are prepared ahead.
    closed: AtomicBool,
    /// The home mounted on itself `nosuid,nodev`: what sandboxes made is
    /// never a privilege on the host.
    home_mount: Option<HomeMount>,
}

impl Host {
    /// The real host. `home` is `$CAIRN_HOME`; `helper` the `cairn`
    /// executable.
    pub(crate) fn new(home: &Path, helper: PathBuf, defaults: cairn_core::Limits, pool_target: usize, disk_space: DiskSpace) -> Result<Host> {
        // Before anything is written or mounted in the home.
        let home_mount = home_mount::seal(home)?;
        let run_root = home.join("run");
        let disk_root = home.join("disks");
        for d in [&run_root, &disk_root] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(d).map_err(|e| Error::Io(d.display().to_string(), e))?;
        }
        let pool = DiskPool::new(disk_root.join("pool"), defaults.disk_bytes, pool_target)?;
        let cgroups = CgroupLayout::detect()?;
        Ok(Host {
            disks: Disks::Images { pool, space: disk_space, admitting: Mutex::new(()) },
            cgroups: Some(cgroups),
            slots: Slots::Host(HostSlots::new(&run_root)),
            helper: Some(helper),
            prestarted: Mutex::new(Vec::new()),
            prestart_target: pool_target,
            prestart_limits: defaults,
            closed: AtomicBool::new(false),
            home_mount: Some(home_mount),
            run_root,
            disk_root,
        })
    }

    /// A plain host keeping everything under `root`: no root needed.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn plain(root: &Path) -> Result<Host> {
        let (run_root, disk_root) = (root.join("run"), root.join("disks"));
        for d in [&run_root, &disk_root] {
            fs::create_dir_all(d).map_err(|e| Error::Io(d.display().to_string(), e))?;
        }
        Ok(Host {
            disks: Disks::Directories,
            cgroups: None,
            slots: Slots::Memory(Mutex::default()),
            helper: None,
            prestarted: Mutex::new(Vec::new()),
            prestart_target: 0,
            prestart_limits: cairn_core::Limits::default(),
            closed: AtomicBool::new(false),
            home_mount: None,
            run_root,
            disk_root,
        })
    }

    /// The daemon's run directory (`$CAIRN_HOME/run`).
    pub(crate) fn run_root(&self) -> &Path {
        &self.run_root
    }

    /// The `cairn` executable, on a real host.
    pub(crate) fn helper(&self) -> Option<&Path> {
        self.helper.as_deref()
    }

    pub(crate) fn paths(&self, task: &str) -> TaskPaths {
        let run_dir = self.run_root.join(task);
        let (disk_image, disk_mount) = match self.disks {
            Disks::Images { .. } => (self.disk_root.join(format!("{task}.img")), run_dir.join("disk")),
            Disks::Directories => (self.disk_root.join(task), self.disk_root.join(task)),
        };
        TaskPaths { disk_image, disk_mount, control_socket: run_dir.join("ctl.sock"), run_dir }
    }

    /// Makes the task's run directory.
    pub(crate) fn make_run_dir(&self, task: &str) -> Result<PathBuf> {
        let dir = self.run_root.join(task);
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
        Ok(dir)
    }

    // --- cgroups ---

    pub(crate) fn cgroups(&self) -> Result<&CgroupLayout> {
        self.cgroups.as_ref().ok_or_else(|| Error::Helper("this host has no cgroups for sandboxes".into()))
    }

    /// The task's cgroups, whether or not they exist.
    pub(crate) fn cgroup(&self, task: &str) -> Result<TaskCgroup> {
        self.cgroups()?.open(task)
    }

    // --- uid slots ---

    fn memory_slots(m: &Mutex<MemorySlots>) -> MutexGuard<'_, MemorySlots> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool> {
        match &self.slots {
            Slots::Host(s) => s.reserve(slot, task),
            Slots::Memory(m) => {
                let mut m = Self::memory_slots(m);
                if m.foreign.contains(&slot) {
                    return Ok(false);
                }
                match m.held.get(&slot) {
                    Some(holder) => Ok(holder == task),
                    None => {
                        m.held.insert(slot, task.to_owned());
                        Ok(true)
                    }
                }
            }
        }
    }

    pub(crate) fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool> {
        match &self.slots {
            Slots::Host(s) => s.adopt(slot, task, init),
            Slots::Memory(_) => self.reserve_slot(slot, task),
        }
    }

    pub(crate) fn release_slot(&self, slot: u32, task: &str) {
        match &self.slots {
            Slots::Host(s) => s.release(slot, task),
            Slots::Memory(m) => {
                let mut m = Self::memory_slots(m);
                if m.held.get(&slot).is_some_and(|holder| holder == task) {
                    m.held.remove(&slot);
                }
            }
        }
    }

    /// Ties `slot` to the started sandbox's init.
    pub(crate) fn record_init(&self, slot: u32, task: &str, init: InitProcess) -> Result<()> {
        match &self.slots {
            Slots::Host(s) => s.record_init(slot, task, init),
            Slots::Memory(_) => Ok(()),
        }
    }

    /// The task of this home holding `slot`, when the slots are kept in
    /// memory (a real host's record is not read back).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn slot_holder(&self, slot: u32) -> Option<String> {
        match &self.slots {
            Slots::Host(_) => None,
            Slots::Memory(m) => Self::memory_slots(m).held.get(&slot).cloned(),
        }
    }

    /// Lets a sandbox of another home hold `slot` (slots kept in memory).
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn hold_slot_elsewhere(&self, slot: u32) {
        if let Slots::Memory(m) = &self.slots {
            Self::memory_slots(m).foreign.insert(slot);
        }
    }

    // --- starts prepared ahead ---

    fn prestarted(&self) -> MutexGuard<'_, Vec<Prestarted>> {
        self.prestarted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a start prepared ahead; a helper is in the cgroups of its
    /// task id.
    pub(crate) fn take_prestarted(&self) -> Option<Prestarted> {
        self.prestarted().pop()
    }

    /// Prepares starts ahead until there are as many as the target. On a
    /// real host each is a helper with a fresh task id, its cgroups
    /// (default limits, rewritten on use) and a run directory, so a daemon
    /// that dies leaves only ordinary leftovers of its own home; on a plain
    /// one a fresh task id.
    pub(crate) fn refill_prestarted(&self) -> Result<()> {
        while self.prestarted().len() < self.prestart_target && !self.closed.load(Ordering::SeqCst) {
            let task = cairn_core::TaskId::random().to_string();
            let child = match &self.cgroups {
                Some(cgroups) if self.helper.is_some() => {
                    self.make_run_dir(&task)?;
                    let cgroup = cgroups.create(&task, &self.prestart_limits)?;
                    let procs: Vec<PathBuf> = cgroup.paths().into_iter().map(|p| p.join("cgroup.procs")).collect();
                    Some(self.spawn_helper(&procs)?)
                }
                _ => None,
            };
            self.prestarted().push(Prestarted { task, child });
        }
        Ok(())
    }

    /// No more starts are prepared ahead; returns those left, for the
    /// caller to tear down.
    pub(crate) fn stop_prestarting(&self) -> Vec<Prestarted> {
        self.closed.store(true, Ordering::SeqCst);
        std::mem::take(&mut *self.prestarted())
    }

    /// Runs `cairn __sandbox-start`, joining `cgroup_procs` first; it then
    /// waits for its spec on stdin.
    pub(crate) fn spawn_helper(&self, cgroup_procs: &[PathBuf]) -> Result<std::process::Child> {
        let helper = self.helper.as_ref().ok_or_else(|| Error::Helper("this host has no sandbox helper".into()))?;
        Command::new(helper)
            .arg(HELPER_SUBCOMMAND)
            .args(cgroup_procs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            // The one variable it needs: the descriptor limit sandboxes get.
            .envs(std::env::var_os(crate::SANDBOX_NOFILE_ENV).map(|v| (crate::SANDBOX_NOFILE_ENV, v)))
            .spawn()
            .map_err(|e| Error::Helper(format!("cannot run {}: {e}", helper.display())))
    }

    /// Unmounts the home's own mount, unless sandboxes are left in it.
    pub(crate) fn release_home(&self) {
        if let Some(m) = &self.home_mount {
            m.release();
        }
    }

    // --- disks ---

    pub(crate) fn refill_disk_pool(&self) -> Result<()> {
        match &self.disks {
            Disks::Images { pool, .. } => pool.refill(),
            Disks::Directories => Ok(()),
        }
    }

    /// Makes the task's run directory and makes its disk reachable at
    /// [`TaskPaths::disk_mount`]: on a real host a formatted disk from the
    /// pool if it has none, mounted in the run directory.
    pub(crate) fn prepare_disk(&self, task: &str, disk_bytes: u64) -> Result<PathBuf> {
        let paths = self.paths(task);
        self.make_run_dir(task)?;
        match &self.disks {
            Disks::Images { pool, space, admitting } => {
                if !paths.disk_image.exists() {
                    let _one = admitting.lock().unwrap_or_else(|e| e.into_inner());
                    space.admit(&self.disk_root, disk_bytes)?;
                    pool.take(&paths.disk_image, disk_bytes)?;
                }
                if !disk::is_mounted(&paths.disk_mount) {
                    disk::attach_and_mount(&paths.disk_image, &paths.disk_mount)?;
                }
            }
            Disks::Directories => {
                fs::create_dir_all(&paths.disk_mount).map_err(|e| Error::Io(paths.disk_mount.display().to_string(), e))?;
            }
        }
        Ok(paths.disk_mount)
    }

    pub(crate) fn admit_disks(&self, disk_bytes: u64) -> Result<()> {
        match &self.disks {
            Disks::Images { space, .. } => space.admit(&self.disk_root, disk_bytes),
            Disks::Directories => Ok(()),
        }
    }

    pub(crate) fn disk_dir(&self, task: &str) -> PathBuf {
        self.paths(task).disk_mount
    }

    pub(crate) fn has_disk(&self, task: &str) -> bool {
        self.paths(task).disk_image.exists()
    }

    pub(crate) fn discard_disk(&self, task: &str) -> Result<()> {
        let paths = self.paths(task);
        match self.disks {
            Disks::Images { .. } => {
                disk::unmount(&paths.disk_mount)?;
                disk::detach_backing(&paths.disk_image)?;
                remove_path(&paths.disk_image)
            }
            Disks::Directories => match fs::remove_dir_all(&paths.disk_mount) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io(paths.disk_mount.display().to_string(), e)),
                _ => Ok(()),
            },
        }
    }

    /// Frees the disk's spare inodes before a start: the overlay's work
    /// directory needs some even on a full disk.
    pub(crate) fn release_spares(&self, task: &str) {
        if let Disks::Images { .. } = self.disks {
            disk::release_spares(&self.paths(task).disk_mount);
        }
    }

    /// Makes the spare inodes again after a start.
    pub(crate) fn keep_spares(&self, task: &str) {
        if let Disks::Images { .. } = self.disks {
            disk::keep_spares(&self.paths(task).disk_mount);
        }
    }

    // --- teardown ---

    /// Kills every process of the task's sandbox: all of its cgroups', and
    /// its init; returns once the init is gone (bounded), reaping it if it
    /// is the daemon's child.
    pub(crate) fn kill_sandbox(&self, task: &str, init: Option<InitProcess>) -> Result<()> {
        if let Some(cgroups) = &self.cgroups {
            let cgroup = cgroups.open(task)?;
            if cgroup.exists() {
                cgroup.kill_all()?;
            }
        }
        if let Some(init) = init.filter(|i| i.alive()) {
            let _ = kill(Pid::from_raw(init.pid), Signal::SIGKILL);
        }
        if let Some(init) = init {
            wait_gone(init);
        }
        Ok(())
    }

    /// Removes what the host holds of the task once its processes are
    /// gone: its disk's mount and loop device, its cgroups, its run
    /// directory and, without `keep_disk`, its disk.
    pub(crate) fn remove_task(&self, task: &str, keep_disk: bool) -> Result<()> {
        let paths = self.paths(task);
        if let Disks::Images { .. } = self.disks {
            disk::unmount(&paths.disk_mount)?;
            disk::detach_backing(&paths.disk_image)?;
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.open(task)?.remove()?;
        }
        remove_path(&paths.run_dir)?;
        if !keep_disk {
            remove_path(&paths.disk_image)?;
        }
        Ok(())
    }

    // --- after a restart ---

    /// Run directories, disks and cgroups named like tasks. Cgroups are
    /// host-wide: those of another home's tasks are listed too.
    pub(crate) fn leftovers(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = match &self.cgroups {
            Some(c) => c.list()?,
            None => Vec::new(),
        };
        for dir in [&self.run_root, &self.disk_root] {
            if let Ok(entries) = fs::read_dir(dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().trim_end_matches(".img").to_owned();
                    if cairn_core::TaskId::looks_like(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// A run directory or a disk in this home.
    pub(crate) fn has_local_state(&self, task: &str) -> bool {
        let paths = self.paths(task);
        paths.run_dir.exists() || paths.disk_image.exists()
    }
}

/// Waits (bounded) until the init has exited, reaping it if it is our child
/// (the daemon is a subreaper for the sandboxes it starts).
fn wait_gone(init: InitProcess) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(init.pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        if process_start_time(init.pid) != Some(init.start_time) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Removes a task's run directory or disk: a link in it is removed, never
/// followed, and a mount still inside (the task's disk, if its unmount
/// failed) stops the removal instead of being emptied.
fn remove_path(p: &Path) -> Result<()> {
    let err = |e| Error::Io(format!("remove {}", p.display()), e);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    };
    // The parent is the daemon's own ($CAIRN_HOME/run or /disks).
    let parent: OwnedFd = match fs::File::open(parent) {
        Ok(f) => f.into(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let name = cairn_fsat::cstr(name).map_err(err)?;
    cairn_fsat::remove_tree_at(&parent, &name).map_err(err)
}
