//! Zero-copy relay of one tunnel direction with `splice(2)`: socket to a
//! pipe to socket, so bulk bytes never pass through user space. A tunnel
//! copying through a buffer spent about a core per 1.5 GB/s here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes asked of one `splice` call (and the pipe's size, when the kernel
/// lets us grow it).
const CHUNK: usize = 1 << 20;

/// A pipe that carries one direction's bytes between two sockets.
#[derive(Debug)]
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A bigger pipe moves more per call; the default 64 KiB still works.
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
        Ok(Pipe { read, write })
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: plain descriptors and null offsets (both ends are a socket or
    // a pipe, which have no offset).
    let n = unsafe {
        libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Moves bytes from `from` to `to` until `from` ends, then shuts down the
/// writing side of `to` (a half-close passes through). `moved` is called
/// with each chunk's size once it reached `to`.
pub(crate) async fn relay(from: &TcpStream, to: &TcpStream, pipe: &Pipe, moved: impl Fn(usize)) -> io::Result<()> {
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || splice(from.as_raw_fd(), pipe.write.as_raw_fd(), CHUNK)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            // SAFETY: shutdown on a socket descriptor that `to` keeps open.
            unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        moved(n);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn moves_every_byte_then_passes_the_half_close_on() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut source, accepted) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async { listener.accept().await.unwrap().0 });
        let (sink_far, sink_near) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, async { listener.accept().await.unwrap().0 });
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            source.write_all(&sent).await.unwrap();
            source.shutdown().await.unwrap();
        });
        let total = std::sync::atomic::AtomicUsize::new(0);
        let pipe = Pipe::new().unwrap();
        let reader = tokio::spawn(async move {
            let mut far = sink_far;
            let mut got = Vec::new();
            far.read_to_end(&mut got).await.unwrap();
            got
        });
        relay(&accepted, &sink_near, &pipe, |n| {
            total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        })
        .await
        .unwrap();
        writer.await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the bytes arrive unchanged and in order");
        assert_eq!(total.into_inner(), data.len());
    }
}
