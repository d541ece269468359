//! Filesystem access for trees the daemon does not trust: a task's writable
//! layer (written by code inside the sandbox, which may be hostile) and the
//! contents of an image being imported.
//!
//! Every call here works relative to a directory file descriptor and never
//! follows a symlink: a single name is opened with `O_NOFOLLOW`, a relative
//! path with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, and callers decide what they opened by `fstat`
//! on the descriptor, never by an earlier look at the name. A sandbox that
//! swaps a directory for a symlink while the daemon works therefore makes a
//! call fail (`ELOOP`, `ENOTDIR`), never reach the host.
//!
//! - [`open`]: opening names and relative paths.
//! - [`stat`]: what an opened or named entry is ([`Kind`]), and on which
//!   filesystem.
//! - [`dir`]: a directory's names.
//! - [`create`]: new directories, nodes, symlinks and hard links.
//! - [`attr`]: owner, mode and times.
//! - [`xattr`]: extended attributes.
//! - [`data`]: reading regular files, holes, syncing, renaming.
//! - [`remove`]: removing names and whole trees.
//! - `testing` (feature `test-util`): a racer that swaps a directory and a
//!   symlink, as a hostile sandbox does.
//!
//! Errors are plain `io::Error`s: this is the syscall layer, and the callers
//! know which path of theirs failed.

pub mod attr;
pub mod create;
pub mod data;
pub mod dir;
pub mod open;
pub mod remove;
pub mod stat;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod xattr;

pub use attr::{chmod_at, chown_at, fchmod, fchown, set_mtime_at, set_mtime_fd};
pub use create::{link_at, mkdir_at, mknod_at, readlink_at, readlink_fd, symlink_at};
pub use data::{exchange_at, read_regular_at, rename_noreplace, seek, syncfs, SeekFrom};
pub use dir::read_dir;
pub use open::{cstr, open_at, open_beneath, open_beneath_same_fs, open_dir, open_dir_at, open_regular_at, single_name};
pub use remove::{remove_tree_at, unlink_at};
pub use rustix::fs::{Mode, OFlags, Stat};
pub use stat::{fs_magic, fstat, is_kernel_fs, kind, lstat_at, Kind};
pub use xattr::XattrAt;
