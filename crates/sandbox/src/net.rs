//! The sandbox's network: a fresh network namespace with only `lo`, brought
//! up here. No interface, no route, no DNS: nothing leaves the namespace.
//! The one way out is the egress proxy's port on `lo`, whose listening
//! socket the init creates here and hands to the daemon, which serves it
//! from outside the namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::{Error, Result};

/// Where the egress proxy listens inside every sandbox.
pub const PROXY_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 3128);

/// Binds the proxy port in the calling process's network namespace. Done by
/// the init before any command runs, so no workload can take the port first.
pub fn proxy_listener() -> Result<TcpListener> {
    TcpListener::bind(PROXY_ADDR).map_err(|e| Error::sys("bind the egress proxy port", e))
}

/// Checks that a descriptor received from an init is what it should be: a
/// listening TCP socket on [`PROXY_ADDR`].
pub fn check_proxy_listener(listener: &TcpListener) -> Result<()> {
    let addr = listener.local_addr().map_err(|e| Error::sys("proxy listener address", e))?;
    let mut accepting: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `accepting`, an int.
    let rc = unsafe {
        libc::getsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut accepting as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Error::sys("SO_ACCEPTCONN", std::io::Error::last_os_error()));
    }
    if addr != PROXY_ADDR || accepting == 0 {
        return Err(Error::Protocol(format!("the sandbox handed over {addr} (listening: {}) as its proxy port", accepting != 0)));
    }
    Ok(())
}

/// Begins a TCP connection to `port` on the loopback of the calling
/// process's network namespace (the init's: the sandbox's), without waiting
/// for it to complete. The egress proxy's own port is not a sandbox port.
pub fn connect_loopback(port: u16) -> std::io::Result<OwnedFd> {
    if port == 0 || port == PROXY_ADDR.port() {
        return Err(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
    }
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: connect with a valid sockaddr_in and its exact length.
    let rc = unsafe { libc::connect(sock.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(sock)
}

/// Checks that a descriptor received from an init is a TCP socket bound
/// for `port` on the loopback (connected, or still connecting).
pub fn check_port_connection(stream: &std::net::TcpStream, port: u16) -> Result<()> {
    match stream.peer_addr() {
        Ok(peer) if peer == SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), port) => Ok(()),
        Ok(peer) => Err(Error::Protocol(format!("the sandbox handed over a connection to {peer} for port {port}"))),
        // Still connecting: the daemon finds out when it completes.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(()),
        Err(e) => Err(Error::sys("the port connection's peer", e)),
    }
}

/// Sets `lo` up in the calling process's network namespace.
pub fn loopback_up() -> Result<()> {
    // SAFETY: socket(2) with constant arguments; the fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(Error::sys("socket for lo", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain old data; zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq naming "lo"; the kernel fills the flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(Error::sys("SIOCGIFFLAGS lo", std::io::Error::last_os_error()));
    }
    // SAFETY: reading and writing the flags member of the union the kernel
    // just filled.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; the kernel only reads `ifr`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(Error::sys("SIOCSIFFLAGS lo", std::io::Error::last_os_error()));
    }
    Ok(())
}
