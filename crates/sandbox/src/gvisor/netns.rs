//! A network namespace of each gvisor task's own, for every runsc call.
//!
//! `runsc run` binds its sandbox's control socket, `@runsc-sandbox.<id>`,
//! as an abstract unix socket in the network namespace it is called from,
//! and every later call (exec, checkpoint, kill, state) connects to it
//! there. Abstract sockets have no permissions: in the host's namespace any
//! local user could connect and run commands as root inside the task. So
//! every call runs in a namespace nothing else joins, pinned by a bind
//! mount in the task's run directory (the sandbox outlives the daemon, and
//! the next daemon must reach it the same way); the teardown unmounts it
//! with the rest of the run directory.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::mount::{mount, MsFlags};

use crate::{Error, Result};

/// The pin's name in a task's run directory.
pub const PIN: &str = "runsc.netns";

/// Makes the task's namespace and pins it at `pin`, unless it is there.
pub fn ensure(pin: &Path) -> Result<()> {
    if crate::host::disk::is_mounted(pin) {
        return Ok(());
    }
    OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(pin).map_err(|e| Error::Io(pin.display().to_string(), e))?;
    let target = pin.to_owned();
    // A thread of its own: unshare(CLONE_NEWNET) changes only the calling
    // thread's namespace, which ends with it; the bind mount keeps the
    // namespace alive.
    std::thread::Builder::new()
        .name("runsc-netns".into())
        .spawn(move || -> Result<()> {
            // SAFETY: unshare(2) of this thread's network namespace only.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(Error::sys("unshare runsc's network namespace", std::io::Error::last_os_error()));
            }
            mount(Some("/proc/thread-self/ns/net"), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| Error::Mount { target: target.clone(), err: e.into() })
        })
        .map_err(|e| Error::Io("runsc-netns thread".into(), e))?
        .join()
        .map_err(|_| Error::Helper("the thread making runsc's network namespace panicked".into()))?
}

/// Makes `cmd` enter the namespace pinned at `pin` before it runs. A
/// sandbox started before namespaces were pinned has none: its calls run
/// where it was started.
pub fn join_on_exec(cmd: &mut Command, pin: &Path) {
    let Ok(path) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(pin.as_os_str())) else { return };
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe calls (open, setns, close) on data prepared
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                let e = std::io::Error::last_os_error();
                return if e.raw_os_error() == Some(libc::ENOENT) { Ok(()) } else { Err(e) };
            }
            let rc = libc::setns(fd, libc::CLONE_NEWNET);
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            if rc != 0 {
                return Err(e);
            }
            Ok(())
        });
    }
}

/// Makes `cmd` run in a new network namespace of its own, which ends with
/// it (the KVM probe: a `runsc run` that waits for its sandbox's end).
pub fn unshare_on_exec(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked, single-threaded child before
    // exec and makes one system call.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
