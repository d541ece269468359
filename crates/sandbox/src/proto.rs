//! The control protocol between the daemon and a sandbox's init.
//!
//! One Unix stream connection per request. A frame is a 4-byte big-endian
//! length and a JSON body; file descriptors (a command's stdin, stdout and
//! stderr, or a pty master) travel with the frame as `SCM_RIGHTS`.
//!
//! For an exec the daemon sends [`Request::Exec`] and gets [`Reply::Started`]
//! (or [`Reply::Failed`]), then later [`Reply::Exited`]. Closing the
//! connection before `Exited` kills the command's process group: that is
//! how timeouts and cancelled clients stop a command.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Longest frame either side accepts (argv and env included).
pub const MAX_FRAME: usize = 1 << 20;
/// Most descriptors one frame carries.
pub const MAX_FDS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// `KEY=VALUE` pairs; the whole environment of the command.
    pub env: Vec<String>,
    pub cwd: String,
    /// With a pty, init allocates it inside the sandbox and returns the
    /// master; without, the frame carries stdin, stdout and stderr.
    pub tty: Option<WinSize>,
    /// Who to run as (`user[:group]`, names or numbers), resolved by the
    /// init from the sandbox's own `/etc/passwd` and `/etc/group`; `None`:
    /// root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Exec(ExecRequest),
    /// Liveness check: init answers with its pid in the sandbox.
    Ping,
    /// The listening socket of the egress proxy port, which init bound in
    /// the sandbox's network namespace; it travels with [`Reply::ProxyListener`].
    ProxyListener,
    /// A TCP connection to `port` on the sandbox's loopback, begun by init
    /// in its network namespace without waiting for it to complete; the
    /// socket travels with [`Reply::PortConnection`] (or the refusal comes
    /// as [`Reply::Failed`]).
    ConnectPort { port: u16 },
    /// A watch on a directory of the sandbox ([`crate::watch`]), run by a
    /// child of init that writes its lines to the one descriptor the frame
    /// carries. Answered like an exec: [`Reply::Started`], then
    /// [`Reply::Exited`]; closing the connection ends the watch.
    Watch { path: String, recursive: bool },
    /// `signal` for the process group of a command init started (`pid`,
    /// as [`Reply::Started`] gave it); answered [`Reply::Signalled`].
    Signal { pid: i32, signal: i32 },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The command runs (it passed `execve`); `pid` is in the sandbox's pid
    /// namespace. With a pty the master fd travels with this frame.
    Started { pid: i32 },
    /// The command could not start; `errno` is from `chdir` or `execve`.
    Failed { errno: i32, message: String },
    Exited { code: Option<i32>, signal: Option<i32> },
    Pong { pid: i32 },
    ProxyListener,
    PortConnection,
    Signalled,
}

/// Sends one frame with `fds` attached.
pub fn send<T: Serialize>(sock: &impl AsRawFd, msg: &T, fds: &[RawFd]) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| Error::Protocol(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(Error::Protocol(format!("frame of {} bytes is over the {MAX_FRAME}-byte limit", body.len())));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    let mut sent = 0;
    while sent < frame.len() {
        let iov = [IoSlice::new(&frame[sent..])];
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if sent == 0 && !fds.is_empty() { &rights } else { &[] };
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => sent += n,
            Err(nix::Error::EINTR) => {}
            Err(e) => return Err(Error::Control(e.into())),
        }
    }
    Ok(())
}

/// Receives one frame and the descriptors that came with it. `Ok(None)` on a
/// clean end of stream before any byte.
pub fn recv<T: DeserializeOwned>(sock: &impl AsRawFd) -> Result<Option<(T, Vec<OwnedFd>)>> {
    let mut fds = Vec::new();
    let mut header = [0u8; 4];
    if !read_exact(sock.as_raw_fd(), &mut header, &mut fds)? {
        return Ok(None);
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(Error::Protocol(format!("frame of {len} bytes is over the {MAX_FRAME}-byte limit")));
    }
    let mut body = vec![0u8; len];
    if !read_exact(sock.as_raw_fd(), &mut body, &mut fds)? {
        return Err(Error::Protocol("connection closed in the middle of a frame".into()));
    }
    let msg = serde_json::from_slice(&body).map_err(|e| Error::Protocol(format!("malformed frame: {e}")))?;
    Ok(Some((msg, fds)))
}

/// Fills `buf`, collecting any descriptors. False on EOF before the first byte.
fn read_exact(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = match recvmsg::<()>(fd, &mut iov, Some(&mut cmsg_space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => m,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(Error::Control(e.into())),
        };
        for c in msg.cmsgs().map_err(|e| Error::Control(e.into()))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: the kernel just installed `r` in our table for us;
                    // nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(Error::Protocol("connection closed in the middle of a frame".into()));
        }
        got += n;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn frames_carry_messages_and_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut pr, pw) = std::io::pipe().unwrap();
        let req = Request::Exec(ExecRequest {
            argv: vec!["echo".into(), "hi".into()],
            env: vec!["A=1".into()],
            cwd: "/".into(),
            tty: None,
            user: Some("1000:1000".into()),
        });
        send(&a, &req, &[pw.as_raw_fd()]).unwrap();
        drop(pw);
        let (back, fds): (Request, _) = recv(&b).unwrap().unwrap();
        assert_eq!(back, req);
        assert_eq!(fds.len(), 1);
        let mut w = std::fs::File::from(fds.into_iter().next().unwrap());
        w.write_all(b"through the passed fd").unwrap();
        drop(w);
        let mut s = String::new();
        pr.read_to_string(&mut s).unwrap();
        assert_eq!(s, "through the passed fd");
        drop(a);
        assert!(recv::<Request>(&b).unwrap().is_none(), "clean EOF");
    }

    #[test]
    fn an_exec_without_a_user_keeps_its_old_shape() {
        let req = ExecRequest { argv: vec!["true".into()], env: Vec::new(), cwd: "/".into(), tty: None, user: None };
        let json = serde_json::to_value(&req).unwrap();
        assert!(json.get("user").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<ExecRequest>(json).unwrap(), req);
    }

    #[test]
    fn refuses_oversized_and_malformed_frames() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(recv::<Request>(&b), Err(Error::Protocol(m)) if m.contains("limit")));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&3u32.to_be_bytes()).unwrap();
        a.write_all(b"{x}").unwrap();
        assert!(matches!(recv::<Request>(&b), Err(Error::Protocol(m)) if m.contains("malformed")));
    }
}
