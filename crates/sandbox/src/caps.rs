//! The capabilities a sandbox keeps.
//!
//! Root inside the sandbox's user namespace starts with every capability
//! (over that namespace only). [`restrict`] cuts that down to Docker's
//! default set: enough for package managers and ordinary root work (owning
//! files, binding low ports, switching users, ping), without the
//! administration capabilities (`SYS_ADMIN`, `NET_ADMIN`, `SYS_PTRACE`, ...)
//! that widen the kernel attack surface reachable from inside.

use ::caps::{CapSet, Capability, CapsHashSet};

use crate::{Error, Result};

/// Docker's default capability set.
pub const SANDBOX_CAPS: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_MKNOD,
    Capability::CAP_NET_RAW,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

/// Capability numbers go up to 63 in the kernel's 64-bit sets.
const MAX_CAP: u32 = 63;

/// Limits the calling thread to [`SANDBOX_CAPS`]: drops every other
/// capability from the bounding set (so no later `execve`, even of a
/// set-uid or file-capability binary, can regain it), sets the effective
/// and permitted sets to exactly `SANDBOX_CAPS`, and clears the inheritable
/// and ambient sets.
///
/// The thread must hold all of `SANDBOX_CAPS` and `CAP_SETPCAP` (root in a
/// fresh user namespace does). Meant for a single-threaded process: other
/// threads keep their capabilities.
pub fn restrict() -> Result<()> {
    let keep: u64 = SANDBOX_CAPS.iter().map(Capability::bitmask).fold(0, |a, b| a | b);

    // The bounding set first, while CAP_SETPCAP, which dropping needs, is
    // certainly effective. Capabilities are probed by number rather than
    // taken from the `caps` crate's list, so ones newer than the crate are
    // dropped too.
    for cap in 0..=MAX_CAP {
        // SAFETY: PR_CAPBSET_READ takes an integer and touches no memory.
        let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) };
        if present < 0 {
            // EINVAL: past the last capability this kernel knows.
            break;
        }
        if present == 1 && keep & (1 << cap) == 0 {
            // SAFETY: PR_CAPBSET_DROP takes an integer and touches no memory.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0 {
                let err = std::io::Error::last_os_error();
                return Err(Error::Caps(format!("drop capability {cap} from the bounding set: {err}")));
            }
        }
    }

    ::caps::clear(None, CapSet::Ambient).map_err(|e| Error::Caps(format!("clear the ambient set: {e}")))?;

    let set: CapsHashSet = SANDBOX_CAPS.iter().copied().collect();
    // Effective before permitted: the kernel refuses an effective set that
    // is not within the permitted one.
    for which in [CapSet::Effective, CapSet::Permitted] {
        ::caps::set(None, which, &set).map_err(|e| {
            Error::Caps(format!("set the {which:?} set (the process must hold every sandbox capability): {e}"))
        })?;
    }
    // An empty inheritable set, as Docker uses since CVE-2022-24769: file
    // capabilities of a program cannot be raised through it.
    ::caps::clear(None, CapSet::Inheritable).map_err(|e| Error::Caps(format!("clear the inheritable set: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Output, Stdio};

    use super::*;

    /// Docker's default set as the kernel prints it in /proc/<pid>/status.
    const DOCKER_DEFAULT_MASK: u64 = 0xa804_25fb;

    /// Runs `cmd` in a child that first runs `setup` (after fork, before
    /// exec).
    fn run_with(setup: fn() -> Result<()>, cmd: &str, args: &[&str]) -> Output {
        let mut command = Command::new(cmd);
        command.args(args).stdin(Stdio::null());
        // SAFETY: the closure makes prctl/capget/capset calls and small
        // allocations; glibc's fork leaves the allocator usable in the child.
        unsafe {
            command.pre_exec(move || setup().map_err(|e| io::Error::other(e.to_string())));
        }
        command.output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }

    /// The capability masks (`CapInh`, `CapPrm`, `CapEff`, `CapBnd`,
    /// `CapAmb`) in a /proc/<pid>/status text.
    fn masks(status: &str) -> [u64; 5] {
        ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"].map(|key| {
            let line = status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(":\t")).unwrap();
            u64::from_str_radix(line.trim(), 16).unwrap()
        })
    }

    fn as_root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        assert!(root, "capability tests need root (all capabilities to start with)");
        root
    }

    #[test]
    fn sandbox_set_is_dockers() {
        let mask = SANDBOX_CAPS.iter().map(Capability::bitmask).fold(0, |a, b| a | b);
        assert_eq!(mask, DOCKER_DEFAULT_MASK);
        assert_eq!(SANDBOX_CAPS.len(), 14);
    }

    #[test]
    fn restrict_leaves_exactly_the_sandbox_set() {
        if !as_root() {
            return;
        }
        let out = run_with(restrict, "cat", &["/proc/self/status"]);
        assert!(out.status.success(), "{out:?}");
        let [inh, prm, eff, bnd, amb] = masks(&String::from_utf8_lossy(&out.stdout));
        // The bounding set survives execve as is. Root's permitted and
        // effective sets are recomputed by execve from the bounding set, so
        // they come out the same; inheritable stays empty.
        assert_eq!(bnd, DOCKER_DEFAULT_MASK, "CapBnd {bnd:x}");
        assert_eq!((inh, prm, eff, amb), (0, DOCKER_DEFAULT_MASK, DOCKER_DEFAULT_MASK, 0));

        let control = run_with(|| Ok(()), "cat", &["/proc/self/status"]);
        let [_, _, _, bnd, _] = masks(&String::from_utf8_lossy(&control.stdout));
        assert_ne!(bnd, DOCKER_DEFAULT_MASK, "control: an unrestricted child has more");
    }

    #[test]
    fn restrict_clears_ambient_and_is_repeatable() {
        if !as_root() {
            return;
        }
        fn raise_ambient() -> Result<()> {
            let err = |e: ::caps::errors::CapsError| Error::Caps(e.to_string());
            // An ambient capability must be inheritable (and permitted).
            ::caps::raise(None, CapSet::Inheritable, Capability::CAP_NET_ADMIN).map_err(err)?;
            ::caps::raise(None, CapSet::Ambient, Capability::CAP_NET_ADMIN).map_err(err)
        }
        fn ambient_then_restrict_twice() -> Result<()> {
            raise_ambient()?;
            restrict()?;
            restrict()
        }
        let control = run_with(raise_ambient, "cat", &["/proc/self/status"]);
        let [_, _, _, _, amb] = masks(&String::from_utf8_lossy(&control.stdout));
        assert_eq!(amb, Capability::CAP_NET_ADMIN.bitmask(), "control: the ambient capability is there");

        let out = run_with(ambient_then_restrict_twice, "cat", &["/proc/self/status"]);
        assert!(out.status.success(), "{out:?}");
        let [_, _, eff, bnd, amb] = masks(&String::from_utf8_lossy(&out.stdout));
        assert_eq!((eff, bnd, amb), (DOCKER_DEFAULT_MASK, DOCKER_DEFAULT_MASK, 0));
    }

    #[test]
    fn restricted_root_cannot_administer() {
        if !as_root() {
            return;
        }
        // unshare(CLONE_NEWNS) needs CAP_SYS_ADMIN.
        let out = run_with(restrict, "unshare", &["-m", "true"]);
        assert!(!out.status.success(), "{out:?}");
        let control = run_with(|| Ok(()), "unshare", &["-m", "true"]);
        assert!(control.status.success(), "control: {control:?}");
    }
}
