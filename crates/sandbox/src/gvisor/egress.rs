//! The host's end of a gvisor sandbox's egress: the daemon serves every
//! task's proxy from a TCP listener on `127.0.0.1:3128` of a network
//! namespace that has only loopback (as for a native sandbox). A gvisor
//! sandbox cannot reach that namespace, so its init relays each connection
//! to a unix socket in the task's run directory, bound into the sandbox;
//! this bridge accepts there and connects to the proxy port.
//!
//! The bridge is one thread, which made the namespace and stays in it (a
//! network namespace is per thread), so every socket it opens is in it;
//! two threads per connection move the bytes. The namespace has no name on
//! the host: it lives as long as the proxy's listener.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// One task's bridge; stopped when dropped.
#[derive(Debug)]
pub struct EgressBridge {
    socket: PathBuf,
    /// The socket file's inode: a later bridge may have replaced it.
    socket_ino: u64,
    listener: Arc<UnixListener>,
    stopped: Arc<AtomicBool>,
    conns: Arc<Conns>,
}

/// The open connections, by number: both their sockets, to end them.
#[derive(Debug, Default)]
struct Conns {
    next: AtomicU64,
    open: Mutex<HashMap<u64, (UnixStream, TcpStream)>>,
}

impl EgressBridge {
    /// Binds `dir/<name>` (replacing a socket left there) and the proxy
    /// port in a new network namespace. Returns the bridge and the port's
    /// listener, which the daemon serves the task's proxy on.
    pub fn start(dir: &Path, name: &str) -> Result<(EgressBridge, TcpListener)> {
        let socket = dir.join(name);
        // The directory is the daemon's (the sandbox sees it read-only).
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(socket.display().to_string(), e)),
        }
        let listener = Arc::new(UnixListener::bind(&socket).map_err(|e| Error::Io(socket.display().to_string(), e))?);
        let socket_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::symlink_metadata(&socket).map_err(|e| Error::Io(socket.display().to_string(), e))?);
        let stopped = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Conns::default());
        let (tx, rx) = mpsc::channel();
        let (l, s, c) = (listener.clone(), stopped.clone(), conns.clone());
        thread::Builder::new()
            .name("gvisor-egress".into())
            .spawn(move || bridge(l, s, c, tx))
            .map_err(|e| Error::sys("start the egress bridge", e))?;
        let port = rx.recv().map_err(|_| Error::Helper("the egress bridge ended before it bound the proxy port".into()))??;
        Ok((EgressBridge { socket, socket_ino, listener, stopped, conns }, port))
    }

    /// Ends every open connection and waits (up to `within`) until the
    /// sandbox's side has closed each, so that no host socket is open in
    /// the sandbox. False when some stayed open.
    pub fn end_connections(&self, within: Duration) -> bool {
        // The sandbox's side reads the end and closes its socket; a
        // connection is gone once that close reached us (see `pipe`).
        for (sandbox, proxy) in self.conns.open.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let _ = sandbox.shutdown(Shutdown::Write);
            let _ = proxy.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.conns.open.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return true;
            }
            thread::sleep(Duration::from_millis(2));
        }
        false
    }
}

impl Drop for EgressBridge {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) on a descriptor the listener owns; it wakes
        // the bridge thread's accept, which then sees `stopped`.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for (sandbox, proxy) in self.conns.open.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let _ = sandbox.shutdown(Shutdown::Both);
            let _ = proxy.shutdown(Shutdown::Both);
        }
        let ours = std::fs::symlink_metadata(&self.socket).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == self.socket_ino);
        if ours {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

/// The bridge thread: makes its network namespace, binds the proxy port
/// there, reports it, then serves connections until stopped.
fn bridge(listener: Arc<UnixListener>, stopped: Arc<AtomicBool>, conns: Arc<Conns>, report: mpsc::Sender<Result<TcpListener>>) {
    let port = (|| -> Result<TcpListener> {
        // SAFETY: unshare(2) of this thread's network namespace only.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(Error::sys("unshare the egress network namespace", io::Error::last_os_error()));
        }
        crate::net::loopback_up()?;
        crate::net::proxy_listener()
    })();
    let port_ok = port.is_ok();
    if report.send(port).is_err() || !port_ok {
        return;
    }
    for conn in listener.incoming() {
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(from_sandbox) = conn else { continue };
        // Opened by this thread: in the namespace of the proxy port.
        let to_proxy = match TcpStream::connect(crate::net::PROXY_ADDR) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("egress bridge: cannot reach the proxy port: {e}");
                continue;
            }
        };
        let n = conns.next.fetch_add(1, Ordering::SeqCst);
        if let (Ok(a), Ok(b)) = (from_sandbox.try_clone(), to_proxy.try_clone()) {
            conns.open.lock().unwrap_or_else(|e| e.into_inner()).insert(n, (a, b));
        }
        let conns = conns.clone();
        let _ = thread::Builder::new().name("gvisor-egress-conn".into()).spawn(move || {
            pipe(from_sandbox, to_proxy);
            conns.open.lock().unwrap_or_else(|e| e.into_inner()).remove(&n);
        });
    }
}

/// Moves bytes both ways until both directions ended; a direction's end is
/// passed on as a half-close. The connection ends when the sandbox's side
/// stops sending, which the init does, closing its socket, once the proxy
/// ended (see `init`).
fn pipe(sandbox: UnixStream, proxy: TcpStream) {
    let (Ok(sandbox_r), Ok(proxy_w)) = (sandbox.try_clone(), proxy.try_clone()) else { return };
    let up = thread::spawn(move || {
        let _ = copy(sandbox_r, &proxy_w);
        let _ = proxy_w.shutdown(Shutdown::Write);
    });
    let _ = copy(&proxy, &sandbox);
    let _ = sandbox.shutdown(Shutdown::Write);
    let _ = up.join();
    let _ = proxy.shutdown(Shutdown::Both);
}

/// Copies until `from` ends (shared with the sandbox's side, `init`).
pub(crate) fn copy(mut from: impl Read, mut to: impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}
