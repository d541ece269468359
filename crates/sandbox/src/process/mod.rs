//! The processes of a sandbox.
//!
//! - [`spawn`]: `cairn __sandbox-start`, the single-threaded helper that
//!   creates the namespaces, mounts the root and forks the init.
//! - [`init`]: pid 1 of the sandbox: reaps orphans and runs commands sent
//!   over its control socket.
//! - [`exec`]: what happens between `fork` and `execve` of one command.
//! - [`user`]: who a command runs as, resolved inside the sandbox.

pub mod exec;
pub mod init;
pub mod spawn;
pub mod user;
