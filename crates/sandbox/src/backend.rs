//! One isolation's way of building, entering and tearing down a sandbox on
//! the host's resources ([`crate::host`]). The dispatcher
//! ([`crate::Dispatcher`]) picks the backend of a task's isolation and calls
//! it; a backend never decides per call whether a task is its own.
//!
//! The methods are those of [`SandboxDriver`](crate::SandboxDriver) that
//! depend on how a sandbox is built, each given the host; what the default
//! methods do is what the host's cgroups do for any sandbox in them.

use std::fmt;
use std::net::TcpListener;
use std::os::fd::{OwnedFd, RawFd};

use cairn_core::{Isolation, TaskConfig};
use cairn_image::Image;

use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand};
use crate::host::Host;
use crate::layers::{HostLayers, TaskLayers};
use crate::proto::ExecRequest;
use crate::uidmap::IdRange;
use crate::{Error, Result};

pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// The isolation whose sandboxes this backend builds.
    fn isolation(&self) -> Isolation;

    /// Whether this host can run the backend's sandboxes; the error says
    /// why not.
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// The host ids a sandbox on `slot` runs as.
    fn uid_range(&self, slot: u32) -> Result<IdRange>;

    /// Makes the task's disk ready on the host (see
    /// [`SandboxDriver::prepare_disk`](crate::SandboxDriver::prepare_disk))
    /// and shows its layers. The host backends' layers are directories on
    /// the disk's mount.
    fn prepare_disk(&self, host: &Host, task: &str, disk_bytes: u64) -> Result<TaskLayers> {
        Ok(Box::new(HostLayers::new(host.prepare_disk(task, disk_bytes)?)))
    }

    /// The layers of a disk prepared or in use.
    fn layers(&self, host: &Host, task: &str) -> Result<TaskLayers> {
        Ok(Box::new(HostLayers::new(host.disk_dir(task))))
    }

    /// The host ids image contents are owned by (see
    /// [`SandboxDriver::image_ids`](crate::SandboxDriver::image_ids)).
    fn image_ids(&self) -> IdRange {
        IdRange { host_base: 0, count: 65536 }
    }

    /// Builds and starts the sandbox; the dispatcher has recorded the
    /// isolation in the run directory, and tears down what a failed start
    /// left.
    fn start(&self, host: &Host, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess>;

    fn ping(&self, host: &Host, task: &str) -> Result<i32>;

    fn proxy_listener(&self, host: &Host, task: &str) -> Result<TcpListener>;

    fn connect_port(&self, host: &Host, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>>;

    fn watch(&self, host: &Host, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>>;

    fn signal(&self, host: &Host, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>>;

    fn exec(&self, host: &Host, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>>;

    fn oom_kills(&self, host: &Host, task: &str) -> Result<u64> {
        host.cgroup(task)?.oom_kills()
    }

    /// Freezes the task's cgroups.
    fn freeze(&self, host: &Host, task: &str) -> Result<()> {
        host.cgroup(task)?.freeze()
    }

    fn thaw(&self, host: &Host, task: &str) -> Result<()> {
        host.cgroup(task)?.thaw()
    }

    fn checkpoint(&self, _host: &Host, task: &str) -> Result<()> {
        Err(Error::Helper(format!("the {} sandbox of task {task} cannot be checkpointed", self.isolation())))
    }

    /// True when the task's disk holds a checkpoint of this backend's.
    fn has_checkpoint(&self, _host: &Host, _task: &str) -> bool {
        false
    }

    fn open_root(&self, host: &Host, task: &str, init: InitProcess) -> Result<OwnedFd>;

    /// The first half of a teardown: kills every process of the sandbox.
    fn stop(&self, host: &Host, task: &str, init: Option<InitProcess>) -> Result<()> {
        host.kill_sandbox(task, init)
    }

    /// The second half, before the host removes the task's disk mount,
    /// cgroups and run directory: what the backend itself made on the host.
    fn release(&self, _host: &Host, _task: &str) -> Result<()> {
        Ok(())
    }

    /// The daemon is stopping.
    fn close(&self) {}
}
