//! A TCP relay a test can cut: it stands between a daemon and a server it
//! needs (S3, PostgreSQL), and on [`Cuttable::cut`] drops every open
//! connection and refuses new ones until [`Cuttable::restore`], as a
//! server that fails or restarts does to its clients.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Cuttable {
    pub addr: SocketAddr,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Bytes relayed towards the server so far.
    sent: AtomicU64,
    open: Mutex<Vec<TcpStream>>,
}

impl Cuttable {
    /// Starts relaying connections on a loopback port to `upstream`.
    pub fn start(upstream: SocketAddr) -> Cuttable {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let addr = listener.local_addr().expect("the relay's address");
        let state = Arc::new(State::default());
        let shared = state.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if shared.cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
                for s in [&client, &server] {
                    if let Ok(c) = s.try_clone() {
                        open.push(c);
                    }
                }
                drop(open);
                pump(client.try_clone().expect("clone"), server.try_clone().expect("clone"), Some(shared.clone()));
                pump(server, client, None);
            }
        });
        Cuttable { addr, state }
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for s in self.state.open.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
    }

    /// Bytes relayed towards the server so far.
    pub fn sent(&self) -> u64 {
        self.state.sent.load(Ordering::SeqCst)
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.cut();
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees `stopped`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` to `to` on a thread of its own until either side ends,
/// counting the bytes in `count` when given.
fn pump(mut from: TcpStream, mut to: TcpStream, count: Option<Arc<State>>) {
    thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(c) = &count {
                c.sent.fetch_add(n as u64, Ordering::SeqCst);
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
