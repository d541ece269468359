//! The first process of a gvisor sandbox: `cairn __gvisor-init`, run inside
//! it through the host's dynamic loader, which is bound in read-only at
//! [`INIT_DIR`] with the `cairn` binary and its libraries (an image need not
//! have a C library, and this toolchain has no static target).
//!
//! It does two things: it reaps orphans, as pid 1 must, and it is the
//! sandbox's end of the egress proxy. A gvisor sandbox has no network
//! device (`--network=none`, which checkpoints need), so the proxy port on
//! its loopback is served here and each connection is relayed to the
//! daemon's unix socket bound in at [`EGRESS_SOCKET`]. A connection's
//! socket is closed as soon as the daemon ends its side, so the daemon can
//! make sure none is open when it checkpoints the sandbox (the sentry
//! cannot save an open host socket).

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

/// The hidden subcommand of the `cairn` binary that runs [`init_main`].
pub const INIT_SUBCOMMAND: &str = "__gvisor-init";

/// The hidden subcommand that starts each command inside ([`exec_main`]).
pub const EXEC_SUBCOMMAND: &str = "__gvisor-exec";

/// The hidden subcommand that relays one connection to a port of the
/// sandbox's loopback ([`connect_main`]).
pub const CONNECT_SUBCOMMAND: &str = "__gvisor-connect";

/// Where the loader, its libraries and `cairn` are bound in the sandbox
/// (inside its own `/dev`, so nothing is made in the task's layer).
pub const INIT_DIR: &str = "/dev/cairn/init";

/// The directory the daemon's egress socket is bound at in the sandbox.
pub const EGRESS_DIR: &str = "/dev/cairn/egress";

/// The socket's name in that directory.
pub const EGRESS_SOCKET_NAME: &str = "egress.sock";

/// The daemon's egress socket, as the sandbox sees it.
pub const EGRESS_SOCKET: &str = "/dev/cairn/egress/egress.sock";

/// Starts one command inside the sandbox, as `runsc exec` runs it (with
/// the native driver's capability bounds, which runsc set from the spec):
/// sets `no_new_privs` and the sandbox's syscall filter (the native one, and
/// the `statx` fallback this runsc needs: see
/// [`crate::seccomp::gvisor_filter`]), then becomes the command, found on
/// its `PATH`. A command that cannot start exits 127 (126: not
/// executable) with one line on stderr, as a shell's would.
pub fn exec_main(argv: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    let Some((cmd, args)) = argv.split_first() else {
        eprintln!("cairn: empty command");
        return 127;
    };
    let filter = match crate::seccomp::gvisor_filter() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cairn: cannot build the syscall filter: {e}");
            return 126;
        }
    };
    if let Err(e) = crate::seccomp::apply(&filter) {
        eprintln!("cairn: cannot install the syscall filter: {e}");
        return 126;
    }
    let mut command = std::process::Command::new(cmd);
    // An image with the GNU C library (it has `ld.so.cache`) gets the
    // `statx` wrappers this runsc needs (see `shim/statx.rs`).
    if std::path::Path::new("/etc/ld.so.cache").exists() {
        let shim = format!("{INIT_DIR}/{}", super::STATX_SHIM_NAME);
        let preload = match std::env::var("LD_PRELOAD") {
            Ok(p) if !p.is_empty() => format!("{shim}:{p}"),
            _ => shim,
        };
        command.env("LD_PRELOAD", preload);
    }
    // exec replaces this process; it returns only on failure.
    let err = command.args(args).exec();
    eprintln!("cairn: {}: {err}", cmd.to_string_lossy());
    match err.kind() {
        io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Relays one connection to `port` on the sandbox's loopback, run inside
/// by `runsc exec` with one socket of the daemon's as stdin, which carries
/// both ways (a gvisor sandbox has no network device the daemon could
/// reach, and the daemon cannot enter gVisor's network stack; why not as
/// stdout too: see `relay_port` in `native.rs`). Answers `+` once
/// connected, or `-` and why on one line; then copies both ways until the
/// port's side ends.
pub fn connect_main(port: u16) -> i32 {
    use std::io::Write;
    use std::os::fd::AsFd;
    let daemon = match io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("cairn: stdin: {e}");
            return 1;
        }
    };
    // The copies take an error for the end, so they must wait, whatever
    // runsc made of the descriptor (it may hand it over non-blocking).
    if let Err(e) = daemon.set_nonblocking(false) {
        eprintln!("cairn: stdin: {e}");
        return 1;
    }
    let refuse = |why: String| {
        let _ = writeln!(&mut &daemon, "-{why}");
        1
    };
    if let Err(e) = crate::seccomp::gvisor_filter().and_then(|f| crate::seccomp::apply(&f)) {
        return refuse(format!("cannot install the syscall filter: {e}"));
    }
    if port == 0 || port == crate::net::PROXY_ADDR.port() {
        return refuse(format!("port {port} is not a port of the task's own"));
    }
    let conn = match TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)) {
        Ok(c) => c,
        Err(e) => return refuse(format!("nothing listens on port {port} in the sandbox ({e})")),
    };
    if (&daemon).write_all(b"+").is_err() {
        return 1;
    }
    let (Ok(conn_w), Ok(daemon_in)) = (conn.try_clone(), daemon.try_clone()) else { return 1 };
    // Daemon to port: at the daemon's end of sending, pass the half-close on.
    thread::spawn(move || {
        let _ = io::copy(&mut &daemon_in, &mut &conn_w);
        let _ = conn_w.shutdown(Shutdown::Write);
    });
    // Port to daemon: when the port's side ends, so does the relay.
    let _ = io::copy(&mut &conn, &mut &daemon);
    0
}

/// Runs the init; returns only if it cannot serve the proxy port.
pub fn init_main() -> i32 {
    // The same filter as every command (it has no children, but it reads
    // what the workload sends it).
    match crate::seccomp::gvisor_filter().and_then(|f| crate::seccomp::apply(&f)) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("cairn gvisor init: cannot install the syscall filter: {e}");
            return 1;
        }
    }
    let listener = match TcpListener::bind(crate::net::PROXY_ADDR) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cairn gvisor init: cannot bind the egress proxy port: {e}");
            return 1;
        }
    };
    thread::spawn(reap_orphans);
    for conn in listener.incoming() {
        match conn {
            Ok(client) => {
                thread::spawn(move || relay(client));
            }
            Err(e) => {
                eprintln!("cairn gvisor init: accept: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    0
}

/// Waits for every child, forever (processes whose parent exited are
/// handed to pid 1).
fn reap_orphans() {
    loop {
        // SAFETY: waitpid with a null status pointer only reaps.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) };
        if pid < 0 {
            // No child right now; every syscall is dear under ptrace.
            thread::sleep(Duration::from_secs(1));
        }
    }
}

/// One proxy connection: bytes both ways between the workload's TCP
/// connection and a fresh connection to the daemon's socket.
fn relay(client: TcpStream) {
    let upstream = match UnixStream::connect(EGRESS_SOCKET) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("cairn gvisor init: cannot reach the egress proxy: {e}");
            return;
        }
    };
    let (Ok(client_r), Ok(upstream_w)) = (client.try_clone(), upstream.try_clone()) else { return };
    // Workload to daemon: at the workload's end of sending, pass the
    // half-close on and keep reading the answer.
    let outbound = thread::spawn(move || {
        let _ = super::egress::copy(client_r, &upstream_w);
        let _ = upstream_w.shutdown(Shutdown::Write);
    });
    // Daemon to workload: when the daemon ends, everything ends, so the
    // unix socket is closed at once (see the module's doc).
    let _ = super::egress::copy(&upstream, &client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = upstream.shutdown(Shutdown::Both);
    let _ = outbound.join();
}
