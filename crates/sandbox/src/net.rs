//! The sandbox's network: a fresh network namespace with only `lo`, brought
//! up here. No interface, no route, no DNS: nothing leaves the namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{Error, Result};

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
