//! The connection of a command started in a sandbox
//! ([`crate::RunningCommand::conn`]): it tells how the command ended, and
//! closing it first kills the command. What travels on it is the
//! backend's business (the native init's frames, [`crate::proto`]); the
//! daemon only asks for the end, blocking or from an event loop.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::proto::{self, Reply};
use crate::Result;

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandExit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl CommandExit {
    /// The shell's way of telling both: the code, or 128 + the signal.
    /// (The frame comes from the sandbox's side, so a signal number near
    /// `i32::MAX` saturates rather than overflows.)
    pub fn status(&self) -> i32 {
        self.code.unwrap_or_else(|| 128i32.saturating_add(self.signal.unwrap_or(0)))
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct CommandConnection {
    stream: UnixStream,
    /// What has come of the end's frame so far (a non-blocking read may
    /// stop in the middle of it).
    buf: Vec<u8>,
}

impl CommandConnection {
    // Public (hidden) only for the fuzz targets, which feed it frames.
    #[doc(hidden)]
    pub fn new(stream: UnixStream) -> CommandConnection {
        CommandConnection { stream, buf: Vec::new() }
    }

    /// Waits for the command's end. None when the connection ended without
    /// telling it (the sandbox went away).
    pub fn wait(&self) -> Result<Option<CommandExit>> {
        Ok(match proto::recv::<Reply>(&self.stream)? {
            Some((Reply::Exited { code, signal }, _)) => Some(CommandExit { code, signal }),
            _ => None,
        })
    }

    /// Makes reads non-blocking, for [`CommandConnection::try_exit`].
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        self.stream.set_nonblocking(nonblocking)
    }

    /// Reads what has come, for an event loop that polls the connection's
    /// descriptor: `Err(WouldBlock)` while the end is still to come,
    /// `Ok(None)` when the connection ended without telling it (or told
    /// something else), `Ok(Some)` the end. Cancel-safe: what was read of
    /// a frame is kept for the next call.
    pub fn try_exit(&mut self) -> std::io::Result<Option<CommandExit>> {
        loop {
            if let Some(header) = self.buf.first_chunk::<4>() {
                let len = u32::from_be_bytes(*header) as usize;
                if len > proto::MAX_FRAME {
                    return Ok(None);
                }
                if let Some(body) = self.buf.get(4..4 + len) {
                    return Ok(match serde_json::from_slice(body) {
                        Ok(Reply::Exited { code, signal }) => Some(CommandExit { code, signal }),
                        _ => None,
                    });
                }
            }
            let mut chunk = [0u8; 512];
            match (&self.stream).read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsFd for CommandConnection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl AsRawFd for CommandConnection {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_end_is_read_whole_however_it_comes() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = CommandConnection::new(ours);
        conn.set_nonblocking(true).unwrap();
        assert_eq!(conn.try_exit().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        let body = serde_json::to_vec(&Reply::Exited { code: None, signal: Some(9) }).unwrap();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        let (first, rest) = frame.split_at(6);
        (&theirs).write_all(first).unwrap();
        assert_eq!(conn.try_exit().unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "half a frame is not an end");
        (&theirs).write_all(rest).unwrap();
        let exit = conn.try_exit().unwrap().unwrap();
        assert_eq!((exit, exit.status()), (CommandExit { code: None, signal: Some(9) }, 137));
    }

    #[test]
    fn a_crafted_signal_number_saturates_the_status() {
        let exit = CommandExit { code: None, signal: Some(i32::MAX) };
        assert_eq!(exit.status(), i32::MAX);
        assert_eq!(CommandExit { code: Some(3), signal: Some(i32::MAX) }.status(), 3);
    }

    #[test]
    fn a_connection_that_ends_without_an_exit_tells_none() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = CommandConnection::new(ours);
        drop(theirs);
        assert_eq!(conn.try_exit().unwrap(), None);
        let (ours, theirs) = UnixStream::pair().unwrap();
        proto::send(&theirs, &Reply::Exited { code: Some(3), signal: None }, &[]).unwrap();
        assert_eq!(CommandConnection::new(ours).wait().unwrap(), Some(CommandExit { code: Some(3), signal: None }));
    }
}
