//! Cairn's isolation layer: everything that touches the kernel to build,
//! enter and tear down a task's sandbox.
//!
//! - [`image`]: read-only base filesystems (the built-in `host` image, imports).
//! - [`cgroup`]: per-task resource limits on cgroup v1 or v2.
//! - [`seccomp`] and [`caps`]: the syscall filter and capability bounds.
//! - [`disk`]: the per-task ext4 loop image that holds the writable layer.
//! - [`rootfs`]: the overlay root, `/dev`, `/proc`, `pivot_root`.
//! - [`process`]: the single-threaded helper that creates the namespaces and
//!   the sandbox's init, which runs commands on request.
//! - [`native`]: the `native` isolation driver tying these together.
//!
//! The daemon is multithreaded, so it never forks into namespaces itself: it
//! runs `cairn __sandbox-start`, a short-lived single-threaded helper
//! (see [`process::spawn`]).

pub mod caps;
pub mod cgroup;
pub mod disk;
pub mod files;
mod error;
pub mod image;
pub mod native;
pub mod net;
pub mod process;
pub mod proto;
pub mod rootfs;
pub mod seccomp;
pub mod traces;
pub mod uidmap;

pub use error::{Error, Result};
