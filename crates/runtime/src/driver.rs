//! The sandbox driver as the async engine calls it. A driver's methods
//! block (they mount, start a helper, wait on a sandbox's socket), so each
//! call that touches the host runs on tokio's blocking pool: here, and
//! nowhere else in the engine. The few calls that only read what the
//! driver holds in memory run inline.

use std::net::TcpListener;
use std::os::fd::RawFd;
use std::sync::Arc;

use cairn_core::{Isolation, TaskConfig};
use cairn_image::Image;
use cairn_sandbox::proto::ExecRequest;
use cairn_sandbox::{IdRange, InitProcess, PortConnection, Prestarted, RunningCommand, SandboxDriver, TaskLayers};

use crate::Error;

/// What a sandbox refused, in its own words (a command that cannot start,
/// a port nothing listens on), as against a failure of the driver.
pub(crate) type Refusal<T> = std::result::Result<T, String>;

/// The engine's handle on its sandbox driver; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Driver(Arc<dyn SandboxDriver>);

impl Driver {
    pub(crate) fn new(driver: Arc<dyn SandboxDriver>) -> Self {
        Driver(driver)
    }

    /// Runs `work` with the driver on the blocking pool: several driver
    /// calls and the host work between them that belong together (a
    /// sandbox's files read through its root, a freeze around a capture).
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl FnOnce(&dyn SandboxDriver) -> T + Send + 'static) -> Result<T, Error> {
        let driver = self.0.clone();
        Ok(tokio::task::spawn_blocking(move || work(driver.as_ref())).await?)
    }

    /// [`Driver::run`] for one call that fails with the driver's error.
    async fn call<T: Send + 'static>(&self, work: impl FnOnce(&dyn SandboxDriver) -> cairn_sandbox::Result<T> + Send + 'static) -> Result<T, Error> {
        Ok(self.run(work).await??)
    }

    // --- inline: no host work ---

    pub(crate) fn uid_range(&self, slot: u32, isolation: Isolation) -> Result<IdRange, Error> {
        Ok(self.0.uid_range(slot, isolation)?)
    }

    pub(crate) fn image_ids(&self) -> IdRange {
        self.0.image_ids()
    }

    pub(crate) fn check_isolation(&self, isolation: Isolation) -> cairn_sandbox::Result<()> {
        self.0.check_isolation(isolation)
    }

    pub(crate) fn take_prestarted(&self) -> Option<Prestarted> {
        self.0.take_prestarted()
    }

    // --- on the blocking pool ---

    pub(crate) async fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool, Error> {
        let task = task.to_owned();
        self.call(move |d| d.reserve_slot(slot, &task)).await
    }

    pub(crate) async fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool, Error> {
        let task = task.to_owned();
        self.call(move |d| d.adopt_slot(slot, &task, init)).await
    }

    pub(crate) async fn release_slot(&self, slot: u32, task: &str) {
        let task = task.to_owned();
        if let Err(e) = self.run(move |d| d.release_slot(slot, &task)).await {
            tracing::warn!("releasing uid slot {slot}: {e}");
        }
    }

    /// Prepares sandbox starts and disks ahead, in the background.
    pub(crate) fn refill(&self) {
        let driver = self.0.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = driver.refill_disk_pool() {
                tracing::warn!("disk pool refill: {e}");
            }
            if let Err(e) = driver.refill_prestarted() {
                tracing::warn!("helper pool refill: {e}");
            }
        });
    }

    pub(crate) async fn close(&self) {
        let _ = self.run(|d| d.close()).await;
    }

    pub(crate) async fn admit_disks(&self, disk_bytes: u64) -> Result<(), Error> {
        self.call(move |d| d.admit_disks(disk_bytes)).await
    }

    pub(crate) async fn has_disk(&self, task: &str) -> Result<bool, Error> {
        let task = task.to_owned();
        self.run(move |d| d.has_disk(&task)).await
    }

    pub(crate) async fn has_checkpoint(&self, task: &str) -> Result<bool, Error> {
        let task = task.to_owned();
        self.run(move |d| d.has_checkpoint(&task)).await
    }

    pub(crate) async fn has_local_state(&self, task: &str) -> Result<bool, Error> {
        let task = task.to_owned();
        self.run(move |d| d.has_local_state(&task)).await
    }

    pub(crate) async fn discard_disk(&self, task: &str) -> Result<(), Error> {
        let task = task.to_owned();
        self.call(move |d| d.discard_disk(&task)).await
    }

    pub(crate) async fn start(&self, task: &str, config: TaskConfig, image: Image, slot: u32, ahead: Option<Prestarted>) -> Result<cairn_sandbox::Result<InitProcess>, Error> {
        let task = task.to_owned();
        self.run(move |d| d.start(&task, &config, &image, slot, ahead)).await
    }

    pub(crate) async fn proxy_listener(&self, task: &str) -> Result<TcpListener, Error> {
        let task = task.to_owned();
        self.call(move |d| d.proxy_listener(&task)).await
    }

    pub(crate) async fn connect_port(&self, task: &str, port: u16) -> Result<Refusal<PortConnection>, Error> {
        let task = task.to_owned();
        self.call(move |d| d.connect_port(&task, port)).await
    }

    /// Starts a watch writing to `out`, which is closed here once the
    /// watcher has its own copy (so the watcher's end is the pipe's last).
    pub(crate) async fn watch(&self, task: &str, path: &str, recursive: bool, out: std::os::fd::OwnedFd) -> Result<Refusal<RunningCommand>, Error> {
        let (task, path) = (task.to_owned(), path.to_owned());
        self.call(move |d| {
            use std::os::fd::AsRawFd;
            let started = d.watch(&task, &path, recursive, out.as_raw_fd());
            drop(out);
            started
        })
        .await
    }

    /// Starts a command on `stdio`, descriptors the caller keeps open
    /// until this returns.
    pub(crate) async fn exec(&self, task: &str, req: ExecRequest, stdio: Vec<RawFd>) -> Result<Refusal<RunningCommand>, Error> {
        let task = task.to_owned();
        self.call(move |d| d.exec(&task, &req, &stdio)).await
    }

    /// Sends `signal` to a running command in the background; a refusal
    /// (the command has ended) is only logged.
    pub(crate) fn signal(&self, task: &str, pid: i32, signal: i32) {
        let (driver, task) = (self.0.clone(), task.to_owned());
        tokio::task::spawn_blocking(move || match driver.signal(&task, pid, signal) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => tracing::debug!("signal {signal} for command {pid} of task {task}: {why}"),
            Err(e) => tracing::warn!("signal {signal} for command {pid} of task {task}: {e}"),
        });
    }

    pub(crate) async fn oom_kills(&self, task: &str) -> Result<u64, Error> {
        let task = task.to_owned();
        self.call(move |d| d.oom_kills(&task)).await
    }

    pub(crate) async fn checkpoint(&self, task: &str) -> Result<cairn_sandbox::Result<()>, Error> {
        let task = task.to_owned();
        self.run(move |d| d.checkpoint(&task)).await
    }

    pub(crate) async fn prepare_disk(&self, task: &str, isolation: Isolation, disk_bytes: u64) -> Result<TaskLayers, Error> {
        let task = task.to_owned();
        self.call(move |d| d.prepare_disk(&task, isolation, disk_bytes)).await
    }

    /// The layers of the task's disk (prepared or in use).
    pub(crate) async fn layers(&self, task: &str, isolation: Isolation) -> Result<TaskLayers, Error> {
        let task = task.to_owned();
        self.call(move |d| d.layers(&task, isolation)).await
    }

    pub(crate) async fn teardown(&self, task: &str, init: Option<InitProcess>, keep_disk: bool) -> Result<cairn_sandbox::Result<()>, Error> {
        let task = task.to_owned();
        self.run(move |d| d.teardown(&task, init, keep_disk)).await
    }

    pub(crate) async fn destroy(&self, task: &str, init: Option<InitProcess>) -> Result<cairn_sandbox::Result<()>, Error> {
        let task = task.to_owned();
        self.run(move |d| d.destroy(&task, init)).await
    }

    pub(crate) async fn leftovers(&self) -> Result<Vec<String>, Error> {
        self.call(|d| d.leftovers()).await
    }
}
