//! Per-task resource limits with cgroups, on v1 (legacy or hybrid) and v2
//! hosts.
//!
//! Every task gets a group named after it under a `cairn` parent in each
//! hierarchy Cairn uses:
//!
//! - **v2** (`/sys/fs/cgroup` is cgroup2): `<root>/cairn/<name>`, with the
//!   memory, cpu and pids controllers enabled down to it.
//! - **v1**: `<hierarchy>/cairn/<name>` in the memory, cpu, pids and (when
//!   mounted) freezer hierarchies. On a hybrid host the cgroup2 mount
//!   (usually `/sys/fs/cgroup/unified`) has no controllers, but it still has
//!   `cgroup.kill` and `cgroup.freeze`, which are more reliable than killing
//!   pids one by one and the v1 freezer, so the task gets a group there too.
//!
//! Groups outlive the daemon: [`CgroupLayout::list`] and
//! [`CgroupLayout::open`] find them again after a restart.

mod detect;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use cairn_core::Limits;
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Error, Result};

/// The directory under each hierarchy's root that holds Cairn's groups.
const PARENT: &str = "cairn";
/// How often state files are re-read while waiting for the kernel.
const POLL: Duration = Duration::from_millis(10);
/// A freeze waits for every task to stop; one stuck in an uninterruptible
/// sleep (e.g. on a dead NFS server) could hold it forever.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long [`TaskCgroup::kill_all`] waits for the group to empty.
const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// While waiting, the kill is repeated this often in case a process was
/// moved in, or forked past a kill that could not freeze the group.
const KILL_RESEND: Duration = Duration::from_millis(200);
/// `rmdir` can briefly fail with `EBUSY` right after the last task exits.
const RMDIR_TIMEOUT: Duration = Duration::from_secs(1);
/// CFS period for CPU limits, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// Which cgroup interface the limits go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy or hybrid: limits in separate v1 hierarchies.
    V1,
    /// Unified: everything in one cgroup2 hierarchy.
    V2,
}

/// Paths of the hierarchies Cairn uses. The same shape describes the
/// hierarchies' roots (in [`CgroupLayout`]) and a task's groups inside them
/// (in [`TaskCgroup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Hierarchies {
    V1 {
        memory: PathBuf,
        /// May be the same hierarchy as another (`cpu,cpuacct` co-mounted).
        cpu: PathBuf,
        pids: PathBuf,
        freezer: Option<PathBuf>,
        /// The cgroup2 mount of a hybrid host, used for kill and freeze only.
        unified: Option<PathBuf>,
    },
    V2 {
        /// The cgroup2 root, or the task's group in it.
        dir: PathBuf,
        /// What the root offers (its `cgroup.controllers`).
        controllers: Vec<String>,
    },
}

impl Hierarchies {
    /// The same hierarchies with every path passed through `f`.
    fn map(&self, f: impl Fn(&Path) -> PathBuf) -> Hierarchies {
        match self {
            Hierarchies::V1 { memory, cpu, pids, freezer, unified } => Hierarchies::V1 {
                memory: f(memory),
                cpu: f(cpu),
                pids: f(pids),
                freezer: freezer.as_deref().map(&f),
                unified: unified.as_deref().map(&f),
            },
            Hierarchies::V2 { dir, controllers } => Hierarchies::V2 { dir: f(dir), controllers: controllers.clone() },
        }
    }

    /// Every distinct path, the main one (v1 memory, or the v2 group) first.
    fn paths(&self) -> Vec<PathBuf> {
        let all: Vec<&PathBuf> = match self {
            Hierarchies::V1 { memory, cpu, pids, freezer, unified } => {
                [Some(memory), Some(cpu), Some(pids), freezer.as_ref(), unified.as_ref()]
                    .into_iter()
                    .flatten()
                    .collect()
            }
            Hierarchies::V2 { dir, .. } => vec![dir],
        };
        let mut out: Vec<PathBuf> = Vec::with_capacity(all.len());
        for p in all {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        out
    }
}

/// Where the cgroup hierarchies of this host are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLayout {
    roots: Hierarchies,
}

impl CgroupLayout {
    /// Finds the hierarchies from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self> {
        let path = Path::new("/proc/self/mountinfo");
        let text = fs::read_to_string(path).map_err(|e| Error::Cgroup(path.to_owned(), e))?;
        Self::from_mountinfo(&text, None)
    }

    /// Finds the hierarchies in a mountinfo text. With `root_override`, mount
    /// points are taken relative to it (`/sys/fs/cgroup` becomes
    /// `<root_override>/sys/fs/cgroup`), which lets a directory tree stand in
    /// for the real cgroup filesystems.
    ///
    /// On a pure v2 host this reads the root's `cgroup.controllers`, and
    /// fails if the memory controller is not available.
    pub fn from_mountinfo(text: &str, root_override: Option<&Path>) -> Result<Self> {
        let mounts = detect::cgroup_mounts(text);
        let rebase = |p: &Path| match root_override {
            Some(root) => root.join(p.strip_prefix("/").unwrap_or(p)),
            None => p.to_owned(),
        };
        Ok(CgroupLayout { roots: detect::choose(&mounts, rebase)? })
    }

    pub fn version(&self) -> CgroupVersion {
        match self.roots {
            Hierarchies::V1 { .. } => CgroupVersion::V1,
            Hierarchies::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// Creates the task's group in every hierarchy and applies `limits`.
    ///
    /// Idempotent: on an existing group it only rewrites the limits, so it
    /// is safe to call again after a restart. If it fails half-way the
    /// group may be partly created; [`TaskCgroup::remove`] cleans that up.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<TaskCgroup> {
        let group = self.open(name)?;
        match (&self.roots, &group.dirs) {
            (Hierarchies::V2 { dir: root, controllers }, Hierarchies::V2 { dir, .. }) => {
                v2::prepare_parent(root, controllers)?;
                mkdir(dir)?;
                v2::apply_limits(dir, controllers, limits)?;
            }
            (_, Hierarchies::V1 { memory, cpu, pids, .. }) => {
                for dir in group.paths() {
                    mkdir(&dir)?;
                }
                v1::set_memory(memory, limits.memory_bytes)?;
                v1::set_cpu(cpu, limits.millicpus)?;
                write(&pids.join("pids.max"), &limits.pids.to_string())?;
            }
            (Hierarchies::V1 { .. }, Hierarchies::V2 { .. }) => unreachable!("open() keeps the layout's shape"),
        }
        tracing::debug!(name, paths = ?group.paths(), "cgroup ready");
        Ok(group)
    }

    /// The task's group, whether or not it exists (nothing is read or
    /// written). Used to find a group again after a daemon restart.
    pub fn open(&self, name: &str) -> Result<TaskCgroup> {
        check_name(name)?;
        Ok(TaskCgroup { name: name.to_owned(), dirs: self.roots.map(|p| p.join(PARENT).join(name)) })
    }

    /// Names of the groups under `cairn/`, in any hierarchy (so that a
    /// half-created or half-removed group is found too), sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for root in self.roots.paths() {
            let parent = root.join(PARENT);
            let entries = match fs::read_dir(&parent) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::Cgroup(parent, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| Error::Cgroup(parent.clone(), e))?;
                let is_dir = entry.file_type().map_err(|e| Error::Cgroup(entry.path(), e))?.is_dir();
                if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// One task's group, in every hierarchy Cairn uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCgroup {
    name: String,
    dirs: Hierarchies,
}

impl TaskCgroup {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's directories, one per hierarchy.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.paths()
    }

    /// The directory that holds `controller`'s files (`memory`, `cpu`,
    /// `pids`, `freezer`) for this group: that controller's hierarchy on v1,
    /// the one group on v2 when the root offers the controller. `None` when
    /// this layout has no such controller (v2's freezer is `cgroup.freeze`
    /// in the group itself, not a controller).
    pub fn controller_dir(&self, controller: &str) -> Option<&Path> {
        match (&self.dirs, controller) {
            (Hierarchies::V1 { memory, .. }, "memory") => Some(memory),
            (Hierarchies::V1 { cpu, .. }, "cpu") => Some(cpu),
            (Hierarchies::V1 { pids, .. }, "pids") => Some(pids),
            (Hierarchies::V1 { freezer, .. }, "freezer") => freezer.as_deref(),
            (Hierarchies::V2 { dir, controllers }, "memory" | "cpu" | "pids") => {
                controllers.iter().any(|c| c == controller).then_some(dir.as_path())
            }
            _ => None,
        }
    }

    /// True if the group exists in at least one hierarchy.
    pub fn exists(&self) -> bool {
        self.paths().iter().any(|p| p.is_dir())
    }

    /// Moves a process (all its threads) into the group in every hierarchy.
    /// Its future children start there too.
    pub fn add_process(&self, pid: i32) -> Result<()> {
        for dir in self.paths() {
            write_raw(&dir.join("cgroup.procs"), &pid.to_string()).map_err(|e| Error::CgroupMove(dir, pid, e))?;
        }
        Ok(())
    }

    /// The processes in the group, in any of its hierarchies, sorted.
    /// Zombies are not listed: the kernel takes exited tasks out at once.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        for dir in self.paths() {
            let file = dir.join("cgroup.procs");
            let text = match fs::read_to_string(&file) {
                Ok(text) => text,
                // Only part of the group exists (a failed create, or a
                // remove that stopped half-way).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::Cgroup(file, e)),
            };
            for line in text.split_whitespace() {
                let pid = line.parse().map_err(|_| invalid_data(&file, "a pid"))?;
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// How many processes of the group the OOM killer has killed so far.
    pub fn oom_kills(&self) -> Result<u64> {
        match &self.dirs {
            Hierarchies::V1 { memory, .. } => keyed_value(&memory.join("memory.oom_control"), "oom_kill"),
            Hierarchies::V2 { dir, .. } => keyed_value(&dir.join("memory.events"), "oom_kill"),
        }
    }

    /// Stops every process of the group, and returns once they all are
    /// stopped.
    pub fn freeze(&self) -> Result<()> {
        if let Some(dir) = self.v2_freezer() {
            v2::freeze(dir)
        } else if let Some(dir) = self.v1_freezer() {
            v1::freeze(dir)
        } else {
            Err(Error::CgroupUnsupported(self.main_path().to_owned(), "freeze"))
        }
    }

    /// Lets the processes of a frozen group run again.
    pub fn thaw(&self) -> Result<()> {
        if let Some(dir) = self.v2_freezer() {
            v2::thaw(dir)
        } else if let Some(dir) = self.v1_freezer() {
            v1::thaw(dir)
        } else {
            Err(Error::CgroupUnsupported(self.main_path().to_owned(), "thaw"))
        }
    }

    /// Kills every process of the group and waits (at most two seconds)
    /// until none is left.
    ///
    /// With `cgroup.kill` (v2, or the unified mount of a hybrid host) the
    /// kernel does it atomically. Otherwise the group is frozen so that
    /// nothing can fork while each pid gets a SIGKILL, then thawed so the
    /// signals are delivered.
    pub fn kill_all(&self) -> Result<()> {
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut next_kill = Instant::now();
        let mut retry = false;
        loop {
            if self.pids()?.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::CgroupBusy(self.main_path().to_owned()));
            }
            if Instant::now() >= next_kill {
                self.kill_once(retry)?;
                retry = true;
                next_kill = Instant::now() + KILL_RESEND;
            }
            thread::sleep(POLL);
        }
    }

    /// One round of killing. A `retry` follows a round after which
    /// processes were left.
    fn kill_once(&self, retry: bool) -> Result<()> {
        if let Some(file) = self.v2_dir().map(|d| d.join("cgroup.kill")).filter(|f| f.exists()) {
            write(&file, "1")?;
            // What survives cgroup.kill on a hybrid host is a process that
            // is in the v1 groups but not in the unified one (a move that
            // failed half-way): signal it directly.
            if retry && matches!(self.dirs, Hierarchies::V1 { .. }) {
                for pid in self.pids()? {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            return Ok(());
        }
        let can_freeze = self.v2_freezer().is_some() || self.v1_freezer().is_some();
        // Even a freeze that timed out stops most of the group; kill anyway.
        let frozen = if can_freeze { self.freeze() } else { Ok(()) };
        if let Err(e) = &frozen {
            tracing::warn!(group = %self.name, "killing without a complete freeze: {e}");
        }
        let result = self.pids().map(|pids| {
            for pid in pids {
                // ESRCH: it exited since the list was read.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        });
        // Frozen processes (v1) only act on the signal once thawed.
        if can_freeze {
            self.thaw()?;
        }
        result
    }

    /// Kills the processes, then removes the group from every hierarchy.
    /// Removing a group that does not exist (or no longer does) succeeds.
    pub fn remove(&self) -> Result<()> {
        if !self.exists() {
            return Ok(());
        }
        self.kill_all()?;
        for dir in self.paths() {
            rmdir(&dir)?;
        }
        tracing::debug!(group = %self.name, "cgroup removed");
        Ok(())
    }

    /// The directory named in errors about the whole group.
    fn main_path(&self) -> &Path {
        match &self.dirs {
            Hierarchies::V1 { memory, .. } => memory,
            Hierarchies::V2 { dir, .. } => dir,
        }
    }

    /// The group's cgroup2 directory, if it has one.
    fn v2_dir(&self) -> Option<&Path> {
        match &self.dirs {
            Hierarchies::V1 { unified, .. } => unified.as_deref(),
            Hierarchies::V2 { dir, .. } => Some(dir),
        }
    }

    /// The cgroup2 directory if the kernel has the v2 freezer (5.2+).
    fn v2_freezer(&self) -> Option<&Path> {
        self.v2_dir().filter(|d| d.join("cgroup.freeze").exists())
    }

    fn v1_freezer(&self) -> Option<&Path> {
        match &self.dirs {
            Hierarchies::V1 { freezer, .. } => freezer.as_deref(),
            Hierarchies::V2 { .. } => None,
        }
    }
}

/// A group name must be one plain path component, so that a group can never
/// be created or removed outside `cairn/`.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.len() > 255 || name.contains(['/', '\0']) {
        return Err(Error::CgroupName(name.to_owned()));
    }
    Ok(())
}

/// Writes a control file. The file must exist: cgroupfs does not let files
/// be created, so a missing one means the controller is absent, and
/// creating it would only hide that.
fn write(path: &Path, value: &str) -> Result<()> {
    write_raw(path, value).map_err(|e| Error::Cgroup(path.to_owned(), e))
}

fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    // One write() per value: cgroupfs parses each write on its own. The
    // truncation is what a shell's `>` does; cgroupfs ignores it.
    fs::OpenOptions::new().write(true).truncate(true).open(path)?.write_all(value.as_bytes())
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| Error::Cgroup(path.to_owned(), e))
}

/// The value of `key` in a flat-keyed file (`key value` lines, such as
/// `memory.events`).
fn keyed_value(path: &Path, key: &str) -> Result<u64> {
    let text = read(path)?;
    let value = text.lines().find_map(|line| line.strip_prefix(key)?.strip_prefix(' '));
    value.and_then(|v| v.trim().parse().ok()).ok_or_else(|| invalid_data(path, key))
}

fn invalid_data(path: &Path, what: &str) -> Error {
    let msg = format!("unexpected content: expected {what}");
    Error::Cgroup(path.to_owned(), io::Error::new(io::ErrorKind::InvalidData, msg))
}

fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) => Err(Error::Cgroup(path.to_owned(), e)),
    }
}

fn rmdir(path: &Path) -> Result<()> {
    let deadline = Instant::now() + RMDIR_TIMEOUT;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(Errno::EBUSY as i32) && Instant::now() < deadline => thread::sleep(POLL),
            Err(e) => return Err(Error::Cgroup(path.to_owned(), e)),
        }
    }
}

/// Polls `done` until it returns true or `timeout` passes: first after
/// 100 µs, then twice as long each time up to [`POLL`]. A freeze is usually
/// done within a millisecond, and a snapshot's sandbox is frozen while this
/// waits.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(100);
    loop {
        if done()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        thread::sleep(pause);
        pause = (pause * 2).min(POLL);
    }
}

/// CFS quota, in microseconds per [`CPU_PERIOD_US`], for a CPU limit in
/// thousandths of a CPU.
fn cpu_quota_us(millicpus: u32) -> u64 {
    u64::from(millicpus) * CPU_PERIOD_US / 1000
}
