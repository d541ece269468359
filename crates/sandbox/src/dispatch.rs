//! The one [`SandboxDriver`]: the host's resources ([`crate::host`]) and a
//! backend per isolation ([`crate::backend`]). What concerns the host alone
//! (slots, disks, starts prepared ahead, leftovers) the dispatcher does
//! itself; what concerns a sandbox goes to the backend of the isolation
//! recorded for the task.
//!
//! The isolation is recorded at start, in the file `isolation` of the
//! task's run directory, so it outlives a daemon restart (tasks are adopted
//! after one) and is removed with the sandbox. A run directory from before
//! the record tells by its gvisor bundle; anything else is native.

use std::fs;
use std::net::TcpListener;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use cairn_core::{Isolation, TaskConfig};
use cairn_image::Image;

use crate::backend::Backend;
use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand, SandboxDriver};
use crate::gvisor::backend::GvisorBackend;
use crate::host::disk_budget::DiskSpace;
use crate::host::Host;
use crate::layers::TaskLayers;
use crate::native::Native;
use crate::proto::ExecRequest;
use crate::uidmap::IdRange;
use crate::{Error, Result};

/// The file of a run directory that names the isolation of its sandbox.
const ISOLATION_FILE: &str = "isolation";

/// The driver of the host's sandboxes: the host's resources and a backend
/// per isolation. Calls that concern the host alone it does itself; those
/// that concern a sandbox go to the backend of the isolation recorded for
/// the task at its start.
#[derive(Debug)]
pub struct Dispatcher {
    pub(crate) host: Host,
    /// The first one is the default: what a task with nothing recorded is
    /// torn down by, and whose ids images are owned by.
    backends: Vec<Box<dyn Backend>>,
}

/// The dispatcher under the name the daemon has always built it by.
pub type NativeDriver = Dispatcher;

impl Dispatcher {
    /// The host's driver, with the native and gvisor backends. `home` is
    /// `$CAIRN_HOME`; `helper` the `cairn` executable.
    pub fn new(home: &Path, helper: PathBuf, defaults: cairn_core::Limits, pool_target: usize, disk_space: DiskSpace) -> Result<Dispatcher> {
        let host = Host::new(home, helper, defaults, pool_target, disk_space)?;
        let gvisor = GvisorBackend::detect(&host);
        Ok(Dispatcher { host, backends: vec![Box::new(Native), Box::new(gvisor)] })
    }

    /// A dispatcher over `host` and `backends`, the first the default.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn with_backends(host: Host, backends: Vec<Box<dyn Backend>>) -> Dispatcher {
        Dispatcher { host, backends }
    }

    fn backend(&self, isolation: Isolation) -> Option<&dyn Backend> {
        self.backends.iter().find(|b| b.isolation() == isolation).map(|b| &**b)
    }

    fn backend_for(&self, isolation: Isolation) -> Result<&dyn Backend> {
        self.backend(isolation).ok_or_else(|| Error::Helper(format!("this driver has no {isolation} sandboxes")))
    }

    fn default_backend(&self) -> Result<&dyn Backend> {
        self.backends.first().map(|b| &**b).ok_or_else(|| Error::Helper("this driver has no backend".into()))
    }

    /// The isolation recorded for the task (see the module documentation).
    fn recorded(&self, task: &str) -> Option<Isolation> {
        let run_dir = self.host.paths(task).run_dir;
        match fs::read_to_string(run_dir.join(ISOLATION_FILE)) {
            Ok(name) => name.trim().parse().ok(),
            Err(_) if crate::gvisor::is_gvisor(&run_dir) => Some(Isolation::Gvisor),
            Err(_) => None,
        }
    }

    fn record(&self, task: &str, isolation: Isolation) -> Result<()> {
        let file = self.host.make_run_dir(task)?.join(ISOLATION_FILE);
        fs::write(&file, format!("{isolation}\n")).map_err(|e| Error::Io(file.display().to_string(), e))
    }

    /// The backend of the task's sandbox.
    fn of(&self, task: &str) -> Result<&dyn Backend> {
        match self.recorded(task) {
            None => self.default_backend(),
            Some(isolation) => self.backend(isolation).ok_or_else(|| Error::Helper(format!("task {task} has a {isolation} sandbox, which this driver cannot run"))),
        }
    }

    fn start_with(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let backend = self.backend_for(config.isolation)?;
        self.record(task, config.isolation)?;
        backend.start(&self.host, task, config, image, slot, ahead)
    }
}

impl SandboxDriver for Dispatcher {
    fn uid_range(&self, slot: u32, isolation: Isolation) -> Result<IdRange> {
        self.backend_for(isolation)?.uid_range(slot)
    }

    fn image_ids(&self) -> IdRange {
        match self.default_backend() {
            Ok(b) => b.image_ids(),
            Err(_) => IdRange { host_base: 0, count: 65536 },
        }
    }

    fn check_isolation(&self, isolation: Isolation) -> Result<()> {
        self.backend_for(isolation)?.check()
    }

    fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool> {
        self.host.reserve_slot(slot, task)
    }

    fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool> {
        self.host.adopt_slot(slot, task, init)
    }

    fn release_slot(&self, slot: u32, task: &str) {
        self.host.release_slot(slot, task);
    }

    fn take_prestarted(&self) -> Option<Prestarted> {
        self.host.take_prestarted()
    }

    fn refill_prestarted(&self) -> Result<()> {
        self.host.refill_prestarted()
    }

    /// Stops what the backends run of their own and the starts prepared
    /// ahead (no more are), removing their cgroups and run directories,
    /// then the home's own mount unless sandboxes are left in it.
    fn close(&self) {
        for b in &self.backends {
            b.close();
        }
        for p in self.host.stop_prestarting() {
            let task = p.task.clone();
            drop(p);
            if let Err(e) = self.destroy(&task, None) {
                tracing::warn!(task, "removing a helper started ahead: {e}");
            }
        }
        self.host.release_home();
    }

    fn refill_disk_pool(&self) -> Result<()> {
        self.host.refill_disk_pool()
    }

    fn prepare_disk(&self, task: &str, isolation: Isolation, disk_bytes: u64) -> Result<TaskLayers> {
        self.backend_for(isolation)?.prepare_disk(&self.host, task, disk_bytes)
    }

    fn admit_disks(&self, disk_bytes: u64) -> Result<()> {
        self.host.admit_disks(disk_bytes)
    }

    fn layers(&self, task: &str, isolation: Isolation) -> Result<TaskLayers> {
        self.backend_for(isolation)?.layers(&self.host, task)
    }

    fn has_disk(&self, task: &str) -> bool {
        self.host.has_disk(task)
    }

    fn discard_disk(&self, task: &str) -> Result<()> {
        self.host.discard_disk(task)
    }

    /// Records the task's isolation and starts it with that backend; a
    /// failed start is torn down (the disk kept).
    fn start(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let ahead = ahead.filter(|p| p.task == task);
        let result = self.start_with(task, config, image, slot, ahead);
        match &result {
            Ok(init) => {
                if let Err(e) = self.host.record_init(slot, task, *init) {
                    tracing::warn!(task, "recording uid slot {slot}: {e}");
                }
            }
            Err(_) => {
                let _ = self.teardown(task, None, true);
            }
        }
        result
    }

    fn ping(&self, task: &str) -> Result<i32> {
        self.of(task)?.ping(&self.host, task)
    }

    fn proxy_listener(&self, task: &str) -> Result<TcpListener> {
        self.of(task)?.proxy_listener(&self.host, task)
    }

    fn connect_port(&self, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        self.of(task)?.connect_port(&self.host, task, port)
    }

    fn watch(&self, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        self.of(task)?.watch(&self.host, task, path, recursive, out)
    }

    fn signal(&self, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        self.of(task)?.signal(&self.host, task, pid, signal)
    }

    fn exec(&self, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        self.of(task)?.exec(&self.host, task, req, stdio)
    }

    fn oom_kills(&self, task: &str) -> Result<u64> {
        self.of(task)?.oom_kills(&self.host, task)
    }

    fn freeze(&self, task: &str) -> Result<()> {
        self.of(task)?.freeze(&self.host, task)
    }

    fn thaw(&self, task: &str) -> Result<()> {
        self.of(task)?.thaw(&self.host, task)
    }

    fn checkpoint(&self, task: &str) -> Result<()> {
        self.of(task)?.checkpoint(&self.host, task)
    }

    /// Asked before a start, when nothing may be recorded yet: any
    /// backend's checkpoint on the disk counts.
    fn has_checkpoint(&self, task: &str) -> bool {
        self.backends.iter().any(|b| b.has_checkpoint(&self.host, task))
    }

    fn open_root(&self, task: &str, init: InitProcess) -> Result<OwnedFd> {
        self.of(task)?.open_root(&self.host, task, init)
    }

    /// The backend kills the sandbox's processes and removes what it made;
    /// then the host removes the disk's mount and loop device, the cgroups,
    /// the run directory (the record with it) and, without `keep_disk`, the
    /// disk.
    fn teardown(&self, task: &str, init: Option<InitProcess>, keep_disk: bool) -> Result<()> {
        let backend = self.of(task)?;
        backend.stop(&self.host, task, init)?;
        backend.release(&self.host, task)?;
        self.host.remove_task(task, keep_disk)
    }

    fn leftovers(&self) -> Result<Vec<String>> {
        self.host.leftovers()
    }

    fn has_local_state(&self, task: &str) -> bool {
        self.host.has_local_state(task)
    }
}
