//! The sandbox's init (pid 1): reaps every orphan, and runs the commands the
//! daemon sends over the control socket.
//!
//! One `poll` loop over the listening socket, a signalfd for SIGCHLD, and
//! the connection of every running command. When a command exits its
//! connection gets [`Reply::Exited`]; when a connection closes first, the
//! command's process group is killed.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::exec;
use crate::proto::{self, Reply, Request};

/// A running command and the connection that asked for it.
struct Session {
    conn: UnixStream,
    /// Set once its client went away and its group was killed.
    abandoned: bool,
}

/// Serves until killed. Never returns.
pub fn serve(listener: &UnixListener, proxy: &TcpListener) -> ! {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    // Pid 1 of a namespace ignores signals it has no handler for, so only
    // SIGCHLD needs routing; block it and read it from a signalfd.
    let _ = mask.thread_block();
    let sigfd = match SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
        Ok(fd) => fd,
        Err(e) => fatal(&format!("signalfd: {e}")),
    };
    if let Err(e) = listener.set_nonblocking(true) {
        fatal(&format!("listener: {e}"));
    }
    let mut sessions: HashMap<i32, Session> = HashMap::new();
    loop {
        let watched: Vec<(i32, RawFd)> =
            sessions.iter().filter(|(_, s)| !s.abandoned).map(|(pid, s)| (*pid, s.conn.as_raw_fd())).collect();
        let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
        for (_, fd) in &watched {
            // SAFETY: the fd belongs to a session that outlives this poll call.
            fds.push(PollFd::new(unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }, PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => fatal(&format!("poll: {e}")),
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        if ready[1] {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            reap(&mut sessions);
        }
        for (i, (pid, _)) in watched.iter().enumerate() {
            if ready[2 + i] {
                // The client closed (or misbehaved): stop the command.
                if let Some(s) = sessions.get_mut(pid) {
                    s.abandoned = true;
                    let _ = killpg(Pid::from_raw(*pid), Signal::SIGKILL);
                }
            }
        }
        if ready[0] {
            while let Ok((conn, _)) = listener.accept() {
                if let Some((pid, conn)) = handle(conn, proxy, &sessions) {
                    sessions.insert(pid, Session { conn, abandoned: false });
                }
            }
            // A command may have exited before it was registered.
            reap(&mut sessions);
        }
    }
}

/// Reads one request; returns the session of a started command.
fn handle(conn: UnixStream, proxy: &TcpListener, sessions: &HashMap<i32, Session>) -> Option<(i32, UnixStream)> {
    // The daemon is the only client; a stuck one must not stall pid 1.
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let (req, fds): (Request, Vec<OwnedFd>) = match proto::recv(&conn) {
        Ok(Some(r)) => r,
        Ok(None) => return None,
        Err(e) => {
            let _ = proto::send(&conn, &Reply::Failed { errno: libc::EPROTO, message: e.to_string() }, &[]);
            return None;
        }
    };
    match req {
        Request::Ping => {
            let _ = proto::send(&conn, &Reply::Pong { pid: std::process::id() as i32 }, &[]);
            None
        }
        // Init keeps its copy: a restarted daemon asks again.
        Request::ProxyListener => {
            let _ = proto::send(&conn, &Reply::ProxyListener, &[proxy.as_raw_fd()]);
            None
        }
        Request::ConnectPort { port } => {
            match crate::net::connect_loopback(port) {
                Ok(socket) => {
                    let _ = proto::send(&conn, &Reply::PortConnection, &[socket.as_raw_fd()]);
                }
                Err(e) => {
                    let message = format!("nothing accepts connections on port {port} in the sandbox ({e})");
                    let _ = proto::send(&conn, &Reply::Failed { errno: e.raw_os_error().unwrap_or(libc::ECONNREFUSED), message }, &[]);
                }
            }
            None
        }
        Request::Signal { pid, signal } => {
            // Only a command of init's own, still running.
            let reply = match (sessions.get(&pid), Signal::try_from(signal)) {
                (Some(s), Ok(sig)) if !s.abandoned => match killpg(Pid::from_raw(pid), sig) {
                    Ok(()) => Reply::Signalled,
                    Err(e) => Reply::Failed { errno: e as i32, message: format!("cannot signal command {pid}: {e}") },
                },
                (_, Err(_)) => Reply::Failed { errno: libc::EINVAL, message: format!("{signal} is no signal") },
                _ => Reply::Failed { errno: libc::ESRCH, message: format!("no running command {pid}") },
            };
            let _ = proto::send(&conn, &reply, &[]);
            None
        }
        Request::Watch { path, recursive } => {
            let Some(out) = fds.into_iter().next() else {
                let _ = proto::send(&conn, &Reply::Failed { errno: libc::EINVAL, message: "a watch needs the descriptor its events go to".into() }, &[]);
                return None;
            };
            // SAFETY: init is single-threaded, so the child may run Rust
            // code after the fork; it leaves only through `_exit`.
            match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Child) => {
                    // Its own group, which init kills when the daemon hangs up.
                    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
                    let code = crate::watch::run(std::path::Path::new(&path), recursive, &mut std::fs::File::from(out));
                    // SAFETY: ends the forked child without running init's exit handlers.
                    unsafe { libc::_exit(code) }
                }
                Ok(nix::unistd::ForkResult::Parent { child }) => {
                    let _ = proto::send(&conn, &Reply::Started { pid: child.as_raw() }, &[]);
                    Some((child.as_raw(), conn))
                }
                Err(e) => {
                    let _ = proto::send(&conn, &Reply::Failed { errno: e as i32, message: format!("cannot start the watch: {e}") }, &[]);
                    None
                }
            }
        }
        Request::Exec(exec_req) => match exec::spawn(&exec_req, fds) {
            Ok(sp) => {
                let master: Vec<RawFd> = sp.pty_master.as_ref().map(|m| m.as_raw_fd()).into_iter().collect();
                let _ = proto::send(&conn, &Reply::Started { pid: sp.pid }, &master);
                drop(sp.pty_master);
                Some((sp.pid, conn))
            }
            Err(e) => {
                let _ = proto::send(&conn, &Reply::Failed { errno: e.errno, message: e.message }, &[]);
                None
            }
        },
    }
}

/// Collects every exited child; tells the waiting client about its command.
fn reap(sessions: &mut HashMap<i32, Session>) {
    loop {
        let (pid, code, signal) = match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, Some(code), None),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, None, Some(sig as i32)),
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if let Some(s) = sessions.remove(&pid.as_raw()) {
            let _ = proto::send(&s.conn, &Reply::Exited { code, signal }, &[]);
        }
    }
}

fn fatal(msg: &str) -> ! {
    eprintln!("cairn init: {msg}");
    // SAFETY: pid 1 giving up ends the sandbox, which is the only sane outcome.
    unsafe { libc::_exit(1) }
}
