//! The daemon is a child subreaper: the inits of the sandboxes it starts are
//! reparented to it when their helper exits, so it collects their exit
//! status instead of leaving zombies on hosts whose pid 1 does not.
//!
//! Only pids the daemon knows to be sandbox inits are waited for (never
//! `waitpid(-1)`), so the runtime's own child processes are left alone.

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub fn become_subreaper() {
    // SAFETY: prctl with constant arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!("cannot become a child subreaper: {}", std::io::Error::last_os_error());
    }
}

/// Reaps `pid` if it is an exited child of ours. True when it was reaped.
pub fn reap(pid: i32) -> bool {
    matches!(
        waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..))
    )
}
