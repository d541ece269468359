//! Starting one command inside the sandbox: pty or pipes, a new session,
//! the requested user and directory, then `execve` with a `PATH` search. Runs in the
//! init, which is single-threaded, so the child may allocate after fork.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::unistd::{fork, ForkResult};

use crate::proto::{ExecRequest, WinSize};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A started command: its pid, and the pty master when it has a terminal.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub pty_master: Option<OwnedFd>,
}

/// Why a command could not start.
#[derive(Debug)]
pub struct SpawnError {
    pub errno: i32,
    pub message: String,
}

impl SpawnError {
    fn new(errno: i32, message: impl Into<String>) -> Self {
        SpawnError { errno, message: message.into() }
    }
    fn last(what: &str) -> Self {
        let e = std::io::Error::last_os_error();
        SpawnError::new(e.raw_os_error().unwrap_or(0), format!("{what}: {e}"))
    }
}

/// Starts `req`. Without a tty, `stdio` holds stdin, stdout and stderr.
pub fn spawn(req: &ExecRequest, stdio: Vec<OwnedFd>) -> Result<Spawned, SpawnError> {
    if req.argv.is_empty() {
        return Err(SpawnError::new(libc::EINVAL, "empty command"));
    }
    let creds = match &req.user {
        Some(u) => Some(super::user::resolve(u).map_err(|m| SpawnError::new(libc::EINVAL, m))?),
        None => None,
    };
    let mut env_pairs = req.env.clone();
    if let Some(c) = &creds {
        // As `login` does: a user's HOME unless the command was given one.
        if !env_pairs.iter().any(|kv| kv.starts_with("HOME=")) {
            env_pairs.push(format!("HOME={}", c.home));
        }
    }
    let to_c = |s: &String| CString::new(s.as_bytes()).map_err(|_| SpawnError::new(libc::EINVAL, "argument contains NUL"));
    let argv: Vec<CString> = req.argv.iter().map(to_c).collect::<Result<_, _>>()?;
    let env: Vec<CString> = env_pairs.iter().map(to_c).collect::<Result<_, _>>()?;
    let cwd = to_c(&req.cwd)?;
    let candidates = exec_candidates(&req.argv[0], &req.env)?;

    // Descriptors the child inherits; the parent closes its copies after fork.
    let mut inherited = stdio;
    let (pty_master, child_stdio) = match req.tty {
        Some(size) => {
            let (master, slave) = open_pty(size)?;
            let s = slave.as_raw_fd();
            inherited = vec![slave];
            (Some(master), [s, s, s])
        }
        None => {
            if inherited.len() != 3 {
                return Err(SpawnError::new(libc::EINVAL, format!("expected 3 stdio descriptors, got {}", inherited.len())));
            }
            (None, [inherited[0].as_raw_fd(), inherited[1].as_raw_fd(), inherited[2].as_raw_fd()])
        }
    };
    let (err_r, err_w) = std::io::pipe().map_err(|e| SpawnError::new(e.raw_os_error().unwrap_or(0), "pipe"))?;

    // SAFETY: the init is single-threaded, so the child owns a consistent
    // copy of the address space and may allocate.
    match unsafe { fork() } {
        Err(e) => Err(SpawnError::new(e as i32, format!("fork: {e}"))),
        Ok(ForkResult::Child) => {
            drop(err_r);
            let (errno, what) = child_exec(err_w.as_raw_fd(), req.tty.is_some(), child_stdio, creds.as_ref(), &cwd, &argv, &env, &candidates);
            let mut w = File::from(OwnedFd::from(err_w));
            let _ = w.write_all(format!("{errno} {what}").as_bytes());
            // SAFETY: leave the failed child at once; 127 as a shell does.
            unsafe { libc::_exit(127) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(err_w);
            drop(inherited);
            let mut report = String::new();
            let _ = File::from(OwnedFd::from(err_r)).read_to_string(&mut report);
            if report.is_empty() {
                return Ok(Spawned { pid: child.as_raw(), pty_master });
            }
            let (errno, what) = report.split_once(' ').unwrap_or(("0", &report));
            let errno: i32 = errno.parse().unwrap_or(0);
            let desc = std::io::Error::from_raw_os_error(errno);
            let message = match what {
                "chdir" => format!("cannot change to directory {:?}: {desc}", req.cwd),
                "setgroups" | "setgid" | "setuid" => {
                    format!("cannot switch to user {:?} ({what}): {desc}", req.user.as_deref().unwrap_or_default())
                }
                "oom_score_adj" => format!("cannot reset the OOM score of {:?}: {desc}", req.argv[0]),
                _ => format!("cannot run {:?}: {desc}", req.argv[0]),
            };
            Err(SpawnError::new(errno, message))
        }
    }
}

/// The init runs at `oom_score_adj` -1000, never the OOM killer's choice
/// (`spawn::protect_from_oom_killer`); its command goes 1000 above it, to 0,
/// so that a workload over its memory limit loses its own processes first,
/// and it can never go below 0 again. Where the host let the init no lower
/// than the daemon's 0 (no CAP_SYS_RESOURCE), the command goes to 1000: it
/// still goes first. The file of a non-dumpable process (the init's
/// children are) belongs to the host's root, so it is opened while this
/// process is dumpable for that instant only, with nothing of the init's
/// open any more.
fn reset_oom_score() -> Result<(), i32> {
    let init: i32 = std::fs::read_to_string("/proc/self/oom_score_adj").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    let score = (init + 1000).min(1000);
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    let file = std::fs::OpenOptions::new().write(true).open("/proc/self/oom_score_adj");
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let mut file = file.map_err(|e| e.raw_os_error().unwrap_or(0))?;
    file.write_all(score.to_string().as_bytes()).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// In the child: never returns on success.
#[allow(clippy::too_many_arguments)]
fn child_exec(
    err_fd: RawFd,
    tty: bool,
    stdio: [RawFd; 3],
    creds: Option<&super::user::Creds>,
    cwd: &CString,
    argv: &[CString],
    env: &[CString],
    candidates: &[CString],
) -> (i32, &'static str) {
    // The init blocks SIGCHLD for its signalfd; commands start clean.
    let _ = nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&nix::sys::signal::SigSet::empty()), None);
    for sig in [nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::Signal::SIGCHLD] {
        // SAFETY: restoring the default disposition installs no handler.
        unsafe {
            let _ = nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl);
        }
    }
    if nix::unistd::setsid().is_err() {
        return (errno(), "setsid");
    }
    if tty {
        // SAFETY: TIOCSCTTY on the pty slave, an open terminal descriptor.
        if unsafe { libc::ioctl(stdio[0], libc::TIOCSCTTY, 0) } < 0 {
            return (errno(), "tiocsctty");
        }
    }
    for (i, fd) in stdio.iter().enumerate() {
        if nix::unistd::dup2(*fd, i as RawFd).is_err() {
            return (errno(), "dup2");
        }
    }
    for i in 0..3 {
        // SAFETY: clearing FD_CLOEXEC on our own stdio descriptors.
        unsafe { libc::fcntl(i, libc::F_SETFD, 0) };
    }
    // Everything else the init holds (its control socket, other commands'
    // connections) is closed now, not at exec: the command must not get it,
    // nor anyone who could look into this process before the exec (below).
    // The error pipe stays (close-on-exec) to report a failure.
    let keep = err_fd as u32;
    if keep > 3 {
        // SAFETY: close_range closes a range of descriptors; no pointers.
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32) };
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, keep.max(2) + 1, u32::MAX, 0u32) };
    if let Err(e) = reset_oom_score() {
        return (e, "oom_score_adj");
    }
    if let Some(c) = creds {
        // Groups first: once the uid is not 0 the capabilities they need
        // are gone.
        let groups: Vec<nix::unistd::Gid> = c.groups.iter().map(|g| nix::unistd::Gid::from_raw(*g)).collect();
        if nix::unistd::setgroups(&groups).is_err() {
            return (errno(), "setgroups");
        }
        if nix::unistd::setgid(nix::unistd::Gid::from_raw(c.gid)).is_err() {
            return (errno(), "setgid");
        }
        if nix::unistd::setuid(nix::unistd::Uid::from_raw(c.uid)).is_err() {
            return (errno(), "setuid");
        }
    }
    // As the command's user: a directory it may not enter fails here.
    // SAFETY: `cwd` is a valid C string.
    if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
        return (errno(), "chdir");
    }
    let mut last = libc::ENOENT;
    for path in candidates {
        let _ = nix::unistd::execve(path, argv, env);
        let e = errno();
        // Keep the most telling error, as execvp does: EACCES over ENOENT.
        if e != libc::ENOENT || last == libc::ENOENT {
            last = e;
        }
    }
    (last, "exec")
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The paths to try for `cmd`: itself when it has a `/`, else each `PATH`
/// entry of the command's own environment.
fn exec_candidates(cmd: &str, env: &[String]) -> Result<Vec<CString>, SpawnError> {
    let mk = |s: String| CString::new(s).map_err(|_| SpawnError::new(libc::EINVAL, "path contains NUL"));
    if cmd.contains('/') {
        return Ok(vec![mk(cmd.to_owned())?]);
    }
    if cmd.is_empty() {
        return Err(SpawnError::new(libc::ENOENT, "empty command name"));
    }
    let path = env.iter().find_map(|kv| kv.strip_prefix("PATH=")).unwrap_or(DEFAULT_PATH);
    path.split(':').filter(|d| !d.is_empty()).map(|d| mk(format!("{d}/{cmd}"))).collect()
}

/// Opens a pty pair in the sandbox's own devpts and sets its size.
fn open_pty(size: WinSize) -> Result<(OwnedFd, OwnedFd), SpawnError> {
    // SAFETY: posix_openpt with constant flags; we own the result.
    let m = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if m < 0 {
        return Err(SpawnError::last("posix_openpt"));
    }
    // SAFETY: fresh descriptor, owned from here on.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    // SAFETY: grantpt/unlockpt on our pty master.
    if unsafe { libc::grantpt(m) } < 0 || unsafe { libc::unlockpt(m) } < 0 {
        return Err(SpawnError::last("unlockpt"));
    }
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: the buffer and its length are valid; ptsname_r NUL-terminates.
    if unsafe { libc::ptsname_r(m, name.as_mut_ptr(), name.len()) } != 0 {
        return Err(SpawnError::last("ptsname"));
    }
    // SAFETY: `name` holds a NUL-terminated path written by ptsname_r.
    let s = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if s < 0 {
        return Err(SpawnError::last("open pty slave"));
    }
    // SAFETY: fresh descriptor, owned from here on.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    set_winsize(master.as_raw_fd(), size);
    Ok((master, slave))
}

/// Sets a terminal's size (best effort: a wrong size is cosmetic).
pub fn set_winsize(fd: RawFd, size: WinSize) {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: `ws` is a valid winsize the kernel only reads.
    unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search_uses_the_commands_env() {
        let env = vec!["PATH=/a:/b".to_owned()];
        let c = exec_candidates("ls", &env).unwrap();
        assert_eq!(c, [CString::new("/a/ls").unwrap(), CString::new("/b/ls").unwrap()]);
        assert_eq!(exec_candidates("./x", &env).unwrap(), [CString::new("./x").unwrap()]);
        assert_eq!(exec_candidates("ls", &[]).unwrap().len(), 6);
        assert!(exec_candidates("", &env).is_err());
    }
}
