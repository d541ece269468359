//! Cairn's isolation layer: everything that touches the kernel to build,
//! enter and tear down a task's sandbox.
//!
//! The daemon sees it through one trait, [`SandboxDriver`]: reserve a uid
//! slot, prepare a disk, start, exec, freeze, open the root, hand over the
//! egress proxy's listener, tear down. One type implements it,
//! [`Dispatcher`] (also known by its older name, [`NativeDriver`]), in
//! three parts:
//!
//! - `host`: what the host gives every sandbox, whatever its isolation:
//!   the task's paths, its disk and the pool of disks formatted ahead
//!   (`host::disk`, `host::disk_budget`), its cgroups (`host::cgroup`),
//!   its uid slot (`host::slots`), the helpers started ahead, and the home
//!   sealed `nosuid,nodev` (`host::home_mount`);
//! - `backend`: the `Backend` trait, one implementation per isolation:
//!   `native` (namespaces, an overlay root, seccomp; the sandbox's init
//!   answers on a control socket), `gvisor` (`runsc`, with checkpoints of
//!   memory) and, for tests, `fake` (plain directories and host processes);
//! - `dispatch`: the [`Dispatcher`], which does what concerns the host
//!   itself and hands what concerns a sandbox to the backend of the
//!   isolation recorded for the task in its run directory.
//!
//! With the `test-util` feature, `fake::FakeDriver` is the dispatcher over
//! a plain host (no root needed) and the fake backend, recording every
//! call and failing one on request, so the lifecycle engine, the dispatch
//! and the host's bookkeeping are tested without root.
//!
//! Images (what a sandbox starts from) are the `cairn_image` crate's; a
//! backend gets an image's layers as overlay lowers.
//!
//! A task's writable layers reach the daemon as a [`LayerAccess`] the
//! backend hands out, for snapshots, restores, commits and patches: a
//! directory on the host for the host backends, whatever view of its disk
//! another backend can give.
//!
//! A command started in a sandbox comes with its [`CommandConnection`],
//! which tells how it ended (the backend's frames decoded here, never by
//! the daemon) and kills it when closed first.
//!
//! Public beside the trait: [`files`] (paths
//! resolved beneath a sandbox's root descriptor), [`proto`] (the native
//! init's frames) and [`inspect`] (what a sandbox leaves on the host,
//! for end-to-end checks).
//!
//! The backends are built from:
//! - `seccomp` and `caps`: the syscall filter and capability bounds;
//! - `rootfs`: the overlay root, `/dev`, `/proc`, `pivot_root`;
//! - `process`: the single-threaded helper that creates the namespaces and
//!   the sandbox's init, which runs commands on request;
//! - `watch`: directory watches with inotify, run inside the sandbox.
//!
//! The daemon is multithreaded, so it never forks into namespaces itself: it
//! runs `cairn __sandbox-start`, a short-lived single-threaded helper
//! ([`helper_main`]).

mod backend;
pub(crate) mod caps;
mod connection;
mod dispatch;
mod driver;
mod error;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod files;
pub(crate) mod gvisor;
pub(crate) mod host;
mod layers;
mod native;
pub(crate) mod net;
pub(crate) mod process;
pub mod proto;
pub(crate) mod rootfs;
pub(crate) mod seccomp;
pub(crate) mod traces;
pub(crate) mod uidmap;
pub mod watch;

pub use gvisor::runsc::find as find_runsc;
pub use gvisor::init::{connect_main as gvisor_connect_main, exec_main as gvisor_exec_main, init_main as gvisor_init_main};
pub use connection::{CommandConnection, CommandExit};
pub use dispatch::{Dispatcher, NativeDriver};
pub use host::disk_budget::DiskSpace;
pub use host::HELPER_SUBCOMMAND;
pub use layers::{HostLayers, LayerAccess, TaskLayers};
pub use driver::{InitProcess, InitState, PortConnection, Prestarted, RunningCommand, SandboxDriver};
pub use error::{Error, Result};
pub use net::PROXY_ADDR;
pub use process::exec::set_winsize;
pub use process::spawn::{helper_main, SANDBOX_NOFILE_ENV};
pub use uidmap::IdRange;

/// What the native driver puts on the host, for the demo and the end-to-end
/// tests that check a sandbox's limits and that nothing of it is left.
pub mod inspect {
    pub use crate::caps::SANDBOX_CAPS;
    pub use crate::host::cgroup::{CgroupLayout, CgroupVersion, TaskCgroup};
    pub use crate::traces::host_traces;
}
