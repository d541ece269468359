//! Cairn's isolation layer: everything that touches the kernel to build,
//! enter and tear down a task's sandbox.
//!
//! The daemon sees it through one trait, [`SandboxDriver`]: reserve a uid
//! slot, prepare a disk, start, exec, freeze, open the root, hand over the
//! egress proxy's listener, tear down. [`NativeDriver`] implements it; with
//! the `test-util` feature, `fake::FakeDriver` does too, with plain
//! directories and host processes, so the lifecycle engine can be tested
//! without root.
//!
//! Images (what a sandbox starts from) are the `cairn_image` crate's; a
//! driver gets an image's layers as overlay lowers.
//!
//! Public beside the trait: [`files`] (paths
//! resolved beneath a sandbox's root descriptor), [`proto`] (the exec
//! connection's frames) and [`inspect`] (what a sandbox leaves on the host,
//! for end-to-end checks).
//!
//! Inside, the native driver is built from:
//! - `cgroup`: per-task resource limits on cgroup v1 or v2;
//! - `seccomp` and `caps`: the syscall filter and capability bounds;
//! - `disk`: the per-task ext4 loop image that holds the writable layer;
//! - `disk_budget`: new disks admitted against the space that holds them;
//! - `rootfs`: the overlay root, `/dev`, `/proc`, `pivot_root`;
//! - `process`: the single-threaded helper that creates the namespaces and
//!   the sandbox's init, which runs commands on request;
//! - `slots`: the host-wide record of the uid slots sandboxes use;
//! - `home_mount`: the daemon's home mounted on itself `nosuid,nodev`;
//! - `watch`: directory watches with inotify, run inside the sandbox.
//!
//! The daemon is multithreaded, so it never forks into namespaces itself: it
//! runs `cairn __sandbox-start`, a short-lived single-threaded helper
//! ([`helper_main`]).

pub(crate) mod caps;
pub(crate) mod cgroup;
pub(crate) mod disk;
mod disk_budget;
mod driver;
mod error;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod files;
pub(crate) mod gvisor;
mod home_mount;
mod native;
pub(crate) mod net;
pub(crate) mod process;
pub mod proto;
pub(crate) mod rootfs;
pub(crate) mod seccomp;
mod slots;
pub(crate) mod traces;
pub(crate) mod uidmap;
pub mod watch;

pub use gvisor::init::{connect_main as gvisor_connect_main, exec_main as gvisor_exec_main, init_main as gvisor_init_main};
pub use disk_budget::DiskSpace;
pub use driver::{InitProcess, InitState, PortConnection, Prestarted, RunningCommand, SandboxDriver};
pub use error::{Error, Result};
pub use native::{NativeDriver, HELPER_SUBCOMMAND};
pub use net::PROXY_ADDR;
pub use process::exec::set_winsize;
pub use process::spawn::{helper_main, SANDBOX_NOFILE_ENV};
pub use uidmap::IdRange;

/// What the native driver puts on the host, for the demo and the end-to-end
/// tests that check a sandbox's limits and that nothing of it is left.
pub mod inspect {
    pub use crate::caps::SANDBOX_CAPS;
    pub use crate::cgroup::{CgroupLayout, CgroupVersion, TaskCgroup};
    pub use crate::traces::host_traces;
}
