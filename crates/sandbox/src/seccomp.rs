//! The sandbox's syscall filter.
//!
//! A denylist: everything is allowed except what lets a process reach past
//! its sandbox or attack the kernel (mounts, namespaces, kernel modules,
//! keyrings, BPF, tracing other processes, clocks, swap, reboot, io_uring,
//! NUMA policy, vsock and packet sockets). It is modelled on what Docker's default profile
//! refuses a container without added capabilities: the syscalls Docker only
//! allows with `CAP_SYS_ADMIN`, `CAP_SYS_PTRACE` and similar are refused
//! here unconditionally, since the sandbox never holds those capabilities.
//! (Syscalls the kernel no longer implements, such as `afs_syscall`, fail
//! with `ENOSYS` anyway and are not listed.)
//!
//! Refused calls fail with `EPERM`, which programs handle as "not allowed
//! here", except `clone3`, which fails with `ENOSYS`: its flags live in
//! memory that a filter cannot read, and on `ENOSYS` the C library falls
//! back to `clone`, whose flags are a register the filter checks. A syscall
//! made through another ABI (32-bit `int 0x80`, x32) kills the process: the
//! numbers below only mean something for the native one.
//!
//! The filter is compiled by `seccompiler`, behind a short hand-written
//! prologue for the two things `seccompiler` cannot express: a range of
//! syscall numbers (the x32 ones) and a second errno.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::{Error, Result};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the sandbox's seccomp filter is written for x86_64 and aarch64 only");

/// Refused with EPERM whatever their arguments, on every architecture.
const DENIED: &[libc::c_long] = &[
    // Process accounting, clocks.
    libc::SYS_acct,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_settimeofday,
    // Kernel modules and replacing the kernel.
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    // Kernel keyrings are not namespaced.
    libc::SYS_add_key,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    // Kernel attack surface with a long history of privilege escalations.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_lookup_dcookie,
    libc::SYS_nfsservctl,
    // Mounts, old and new API, and namespaces.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_pivot_root,
    libc::SYS_setns,
    libc::SYS_unshare,
    // File handles bypass path-based checks (the "shocker" escape).
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    // Watching or touching other processes.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_fanotify_init,
    // Host-wide state.
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    // NUMA policy: lets a task steer the host's memory placement.
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_mbind,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
];

/// `open_tree_attr` (Linux 6.15) has the same number everywhere, and is not
/// in `libc` yet.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

#[cfg(target_arch = "x86_64")]
mod arch {
    use super::TargetArch;

    pub const TARGET: TargetArch = TargetArch::x86_64;
    /// `AUDIT_ARCH_X86_64`: EM_X86_64 | 64-bit | little endian.
    pub const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    /// x32 syscalls are native-arch syscalls with this bit set.
    pub const X32_SYSCALL_BIT: Option<u32> = Some(0x4000_0000);

    /// x86_64-only syscalls. `create_module`, `get_kernel_syms` and
    /// `query_module` are gone from the kernel (and from `libc`) but keep
    /// their numbers; `vm86` and `vm86old` only exist in the 32-bit ABI,
    /// which the prologue already refuses.
    pub const DENIED: &[libc::c_long] = &[
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_sysfs,
        libc::SYS__sysctl,
        libc::SYS_uselib,
        libc::SYS_ustat,
        174, // create_module
        177, // get_kernel_syms
        178, // query_module
    ];
}

#[cfg(target_arch = "aarch64")]
mod arch {
    use super::TargetArch;

    pub const TARGET: TargetArch = TargetArch::aarch64;
    /// `AUDIT_ARCH_AARCH64`: EM_AARCH64 | 64-bit | little endian.
    pub const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
    pub const X32_SYSCALL_BIT: Option<u32> = None;
    /// The generic syscall table has none of the legacy calls refused on
    /// x86_64 (`iopl`, `_sysctl`, `uselib`, ...).
    pub const DENIED: &[libc::c_long] = &[];
}

/// `clone` flags that create namespaces. A new user namespace in particular
/// would hand the process every capability again, inside it.
const CLONE_NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// `ioctl` requests refused: both push input into a terminal, which lets a
/// sandboxed process type commands into a shell outside it that shares the
/// terminal.
const DENIED_IOCTLS: [libc::Ioctl; 2] = [libc::TIOCSTI, libc::TIOCLINUX];

/// `personality` values allowed, as in Docker: Linux, its 32-bit variant,
/// each with the 2.6-style uname, and 0xffffffff, which only queries.
/// Others (e.g. `ADDR_NO_RANDOMIZE`) would weaken the process's defences.
const ALLOWED_PERSONAS: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Where `struct seccomp_data` keeps the syscall number and the audit arch.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

/// Builds the sandbox's filter for the architecture Cairn runs on.
pub fn sandbox_filter() -> Result<BpfProgram> {
    filter(false)
}

/// The filter of a gvisor sandbox's commands (installed inside, where the
/// sandbox's own kernel enforces it): the same, and `statx` calls passing
/// `AT_NO_AUTOMOUNT` answered with ENOSYS. The runsc of Debian 12 refuses
/// that flag with EINVAL, and GNU coreutils 9 passes it on every `ls` or
/// `stat`; on ENOSYS the C library (and Rust's) does what it did before
/// `statx` existed (`fstatat`), which works.
pub fn gvisor_filter() -> Result<BpfProgram> {
    filter(true)
}

fn filter(statx_fallback: bool) -> Result<BpfProgram> {
    let err = |e: seccompiler::BackendError| Error::Seccomp(e.to_string());
    let filter = SeccompFilter::new(
        rules().map_err(err)?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch::TARGET,
    )
    .map_err(err)?;
    let body: BpfProgram = filter.try_into().map_err(err)?;

    let mut program = prologue(statx_fallback);
    program.extend(body);
    // The kernel's limit on a filter's length (BPF_MAXINSNS).
    if program.len() > 4096 {
        return Err(Error::Seccomp(format!("filter too long: {} instructions", program.len())));
    }
    Ok(program)
}

/// The per-syscall rules: a syscall mapped to no rule is always refused;
/// one mapped to rules is refused when any rule matches (all the
/// conditions of a rule must hold).
fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().chain(arch::DENIED).map(|&nr| (nr, Vec::new())).collect();

    // The kernel reads clone's flags, ioctl's request and the persona as
    // 32-bit values, so comparing the low 32 bits (Dword) is exact, and
    // garbage in the high half cannot slip past.
    let clone = CLONE_NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u32 as u64;
            SeccompRule::new(vec![SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?])
        })
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_clone, clone);

    let ioctl = DENIED_IOCTLS
        .iter()
        .map(|&request| {
            let request = request as u32 as u64;
            SeccompRule::new(vec![SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)?])
        })
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctl);

    let not_allowed = ALLOWED_PERSONAS
        .iter()
        .map(|&p| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(not_allowed)?]);

    // vsock is not confined by network namespaces: from inside a VM it
    // reaches the hypervisor's and the host's vsock services.
    // Packet sockets only ever see the sandbox's loopback, but their code
    // in the kernel has been the way to host root from a user namespace
    // more than once (CVE-2016-8655, CVE-2017-7308, CVE-2020-14386).
    let family = |af: libc::c_int| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, af as u64);
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![family(libc::AF_VSOCK)?])?, SeccompRule::new(vec![family(libc::AF_PACKET)?])?],
    );

    Ok(rules)
}

/// `AT_NO_AUTOMOUNT`, see [`gvisor_filter`].
const AT_NO_AUTOMOUNT: u32 = 0x800;

/// Where the low 32 bits of a syscall's third argument are in
/// `seccomp_data` (little-endian).
const DATA_ARG2_LOW: u32 = 16 + 2 * 8;

/// Runs before the compiled rules: kills on a foreign ABI, and answers
/// `clone3` (and, with `statx_fallback`, `statx` with `AT_NO_AUTOMOUNT`)
/// with ENOSYS.
fn prologue(statx_fallback: bool) -> Vec<sock_filter> {
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let mut p = vec![
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_ARCH),
        jump(libc::BPF_JEQ, arch::AUDIT_ARCH, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, kill),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_NR),
    ];
    if let Some(x32) = arch::X32_SYSCALL_BIT {
        p.push(jump(libc::BPF_JGE, x32, 0, 1));
        p.push(stmt(libc::BPF_RET | libc::BPF_K, kill));
    }
    p.push(jump(libc::BPF_JEQ, libc::SYS_clone3 as u32, 0, 1));
    p.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    if statx_fallback {
        // Not statx: skip the four checks (the number stays loaded).
        p.push(jump(libc::BPF_JEQ, libc::SYS_statx as u32, 0, 4));
        p.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_ARG2_LOW));
        p.push(jump(libc::BPF_JSET, AT_NO_AUTOMOUNT, 0, 1));
        p.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
        p.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_NR));
    }
    p
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

/// A conditional jump comparing the accumulator with `k`; `jt` and `jf`
/// count the instructions skipped.
fn jump(op: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code: (libc::BPF_JMP | op | libc::BPF_K) as u16, jt, jf, k }
}

/// Installs `prog` on the calling thread, for it and everything it will
/// run. Meant for a single-threaded process: other threads stay unfiltered.
///
/// Sets `no_new_privs` first (the kernel requires it, or `CAP_SYS_ADMIN`,
/// to install a filter; setting it again is harmless). Allocates nothing
/// on success, so it may run between `fork` and `exec`.
pub fn apply(prog: &BpfProgram) -> Result<()> {
    seccompiler::apply_filter(prog).map_err(|e| match e {
        seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => Error::SeccompInstall(e),
        other => Error::Seccomp(other.to_string()),
    })
}

/// Installs `prog` like [`apply`], but without setting `no_new_privs`, so
/// that set-id programs and file capabilities of the image still work
/// inside the sandbox (they reach at most the sandbox's own root and its
/// bounded capabilities). The kernel then requires `CAP_SYS_ADMIN` in the
/// caller's user namespace: call it as the sandbox's root before its
/// capabilities are bounded.
pub fn apply_keeping_setid(prog: &BpfProgram) -> Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| Error::Seccomp(format!("a filter of {} instructions is too long", prog.len())))?,
        filter: prog.as_ptr().cast_mut().cast(),
    };
    // SAFETY: `fprog` points at `prog`'s instructions, which outlive the
    // call; the kernel copies the program and keeps no pointer to it.
    let rc = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &fprog as *const libc::sock_fprog) };
    if rc != 0 {
        return Err(Error::SeccompInstall(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Output, Stdio};

    use super::*;

    /// Runs `cmd` with or without the filter, stdin from /dev/null.
    fn run(filter: Option<&BpfProgram>, cmd: &str, args: &[&str]) -> Output {
        let mut command = Command::new(cmd);
        command.args(args).stdin(Stdio::null());
        if let Some(prog) = filter {
            let prog = prog.clone();
            // SAFETY: the closure only makes two syscalls (prctl, seccomp)
            // and allocates nothing unless they fail, so it is sound in the
            // forked child of this multithreaded test process.
            unsafe {
                command.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    apply(&prog).map_err(|e| match e {
                        Error::SeccompInstall(e) => e,
                        _ => io::Error::from_raw_os_error(libc::EINVAL),
                    })
                });
            }
        }
        command.output().unwrap_or_else(|e| panic!("{cmd}: {e}"))
    }

    fn stdout(out: &Output) -> String {
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A Python interpreter, for probes that need raw syscalls.
    fn python() -> Option<&'static str> {
        let found = ["/usr/bin/python3", "python3"]
            .into_iter()
            .find(|p| Command::new(p).arg("-c").arg("").output().is_ok_and(|o| o.status.success()));
        assert!(found.is_some(), "the syscall probes need python3 (apt-get install python3)");
        found
    }

    fn root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        assert!(root, "the positive controls need root");
        root
    }

    #[test]
    fn filter_compiles() {
        let prog = sandbox_filter().unwrap();
        assert!(prog.len() > DENIED.len() && prog.len() <= 4096, "{} instructions", prog.len());
        // The architecture is checked before anything else.
        assert_eq!(prog[0], stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, DATA_ARCH));
        assert_eq!(prog[2].k, libc::SECCOMP_RET_KILL_PROCESS);
    }

    #[test]
    fn filtered_process_is_in_filter_mode() {
        let prog = sandbox_filter().unwrap();
        let status = stdout(&run(Some(&prog), "cat", &["/proc/self/status"]));
        assert!(status.contains("\nSeccomp:\t2\n"), "{status}");
        assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");
        let plain = stdout(&run(None, "cat", &["/proc/self/status"]));
        assert!(plain.contains("\nSeccomp:\t0\n"), "{plain}");
    }

    /// The gvisor filter answers `statx` with `AT_NO_AUTOMOUNT` with ENOSYS
    /// and lets every other `statx` through (the same call without the
    /// flag, and both calls under the native filter, are the controls).
    #[test]
    fn the_gvisor_filter_diverts_statx_with_at_no_automount_only() {
        let py = python().unwrap();
        let script = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(256)\n\
                      for flags in (0x800, 0x900, 0, 0x100):\n    ctypes.set_errno(0)\n    \
                      r = libc.syscall(332, -100, b'/', flags, 0x7ff, buf)\n    print(flags, ctypes.get_errno() if r else 0)\n";
        let gvisor = stdout(&run(Some(&gvisor_filter().unwrap()), py, &["-c", script]));
        assert_eq!(gvisor, format!("2048 {e}\n2304 {e}\n0 0\n256 0\n", e = libc::ENOSYS), "under the gvisor filter");
        let native = stdout(&run(Some(&sandbox_filter().unwrap()), py, &["-c", script]));
        assert_eq!(native, "2048 0\n2304 0\n0 0\n256 0\n", "under the native filter");
    }

    #[test]
    fn namespaces_cannot_be_created() {
        let prog = sandbox_filter().unwrap();
        assert!(run(Some(&prog), "true", &[]).status.success(), "ordinary programs run");
        for flag in ["-U", "-m", "-n", "-p", "-i", "-u", "-C"] {
            let out = run(Some(&prog), "unshare", &[flag, "true"]);
            assert!(!out.status.success(), "unshare {flag} succeeded under the filter");
            assert!(String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"), "{out:?}");
        }
        if root() {
            for flag in ["-U", "-m"] {
                let out = run(None, "unshare", &[flag, "true"]);
                assert!(out.status.success(), "control: unshare {flag} without the filter: {out:?}");
            }
        }
    }

    /// Prints `name errno` for raw syscalls made through ctypes (0 when the
    /// call succeeded). Arguments are chosen to fail harmlessly, with an
    /// error other than EPERM, when nothing filters them.
    fn probe_script() -> String {
        let nr = |n: libc::c_long| n.to_string();
        let flags: Vec<String> = CLONE_NAMESPACE_FLAGS.iter().map(|f| f.to_string()).collect();
        format!(
            r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(*args):
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return r, (ctypes.get_errno() if r == -1 else 0)
def probe(name, *args):
    print(name, call(*args)[1])
def clone(name, flags):
    r, e = call({clone}, flags | 17, 0, 0, 0, 0)  # 17: SIGCHLD
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    print(name, e)
c = ctypes.c_char(b"x")
probe("mount", {mount}, None, None, None, 0, None)
probe("umount2", {umount2}, b"/nonexistent", 0)
probe("ptrace", {ptrace}, 2, 0x7ffffff0, 0, 0)
probe("keyctl", {keyctl}, 9999, 0, 0, 0, 0)
probe("bpf", {bpf}, 9999, None, 0)
probe("setns", {setns}, -1, 0)
probe("perf_event_open", {perf}, None, 0, -1, -1, 0)
probe("io_uring_setup", {uring}, 1, None)
probe("open_by_handle_at", {obha}, -1, None, 0)
probe("tiocsti", {ioctl}, 0, {tiocsti}, ctypes.byref(c))
probe("tiocsti_high_bits", {ioctl}, 0, (1 << 32) | {tiocsti}, ctypes.byref(c))
probe("tioclinux", {ioctl}, 0, {tioclinux}, ctypes.byref(c))
probe("personality_no_aslr", {personality}, 0x0040000)
probe("personality_query", {personality}, 0xffffffff)
for i, f in enumerate([{flags}]):
    clone("clone_ns%d" % i, f)
clone("clone_plain", 0)
probe("clone3", {clone3}, None, 0)
probe("ioctl_other", {ioctl}, 0, 0x5451)  # FIOCLEX works on any fd
probe("socket_vsock", {socket}, {af_vsock}, 1, 0)
probe("socket_packet", {socket}, {af_packet}, 3, 0)
probe("socket_unix", {socket}, 1, 1, 0)
"#,
            clone = nr(libc::SYS_clone),
            mount = nr(libc::SYS_mount),
            umount2 = nr(libc::SYS_umount2),
            ptrace = nr(libc::SYS_ptrace),
            keyctl = nr(libc::SYS_keyctl),
            bpf = nr(libc::SYS_bpf),
            setns = nr(libc::SYS_setns),
            perf = nr(libc::SYS_perf_event_open),
            uring = nr(libc::SYS_io_uring_setup),
            obha = nr(libc::SYS_open_by_handle_at),
            ioctl = nr(libc::SYS_ioctl),
            tiocsti = libc::TIOCSTI,
            tioclinux = libc::TIOCLINUX,
            personality = nr(libc::SYS_personality),
            clone3 = nr(libc::SYS_clone3),
            socket = nr(libc::SYS_socket),
            af_vsock = libc::AF_VSOCK,
            af_packet = libc::AF_PACKET,
            flags = flags.join(", "),
        )
    }

    fn probe(filter: Option<&BpfProgram>, python: &str) -> BTreeMap<String, i32> {
        let out = run(filter, python, &["-c", &probe_script()]);
        assert!(out.status.success(), "probe failed: {out:?}");
        stdout(&out)
            .lines()
            .map(|l| {
                let (name, errno) = l.split_once(' ').unwrap();
                (name.to_owned(), errno.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn dangerous_syscalls_fail_with_eperm() {
        let Some(python) = python() else { return };
        let prog = sandbox_filter().unwrap();
        let filtered = probe(Some(&prog), python);
        let plain = probe(None, python);
        assert_eq!(filtered.len(), 27, "{filtered:?}");
        let allowed = ["personality_query", "clone_plain", "ioctl_other", "socket_unix"];
        for (name, &errno) in &filtered {
            let expected = match name.as_str() {
                n if allowed.contains(&n) => 0,
                "clone3" => libc::ENOSYS,
                _ => libc::EPERM,
            };
            assert_eq!(errno, expected, "{name} under the filter");
        }
        // Controls: without the filter the same calls get through to the
        // kernel, which answers something else (or succeeds).
        if root() {
            for (name, &errno) in &plain {
                assert_ne!(errno, libc::EPERM, "control: {name} without the filter");
            }
            assert_eq!(plain["clone_ns4"], 0, "control: a new user namespace without the filter");
            assert_eq!(plain["tiocsti"], libc::ENOTTY);
            assert_ne!(plain["clone3"], libc::ENOSYS);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn foreign_abis_are_killed() {
        use std::os::unix::process::ExitStatusExt;

        let Some(python) = python() else { return };
        let prog = sandbox_filter().unwrap();
        // getpid with the x32 bit set.
        let x32 = format!(
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
             r = libc.syscall({})\nprint(ctypes.get_errno() if r == -1 else 0)",
            0x4000_0000 | libc::SYS_getpid
        );
        // getpid (20 in the i386 table) through int 0x80, from a page of
        // machine code: mov eax, 20; int 0x80; ret.
        let i386 = "import ctypes, mmap\n\
            m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n\
            m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n\
            f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n\
            print(f())";
        for (what, script) in [("x32", x32.as_str()), ("i386", i386)] {
            let out = run(Some(&prog), python, &["-c", script]);
            assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{what}: {out:?}");
            let control = run(None, python, &["-c", script]);
            assert!(control.status.success(), "control: {what} without the filter: {control:?}");
        }
    }

    #[test]
    fn forks_and_execs_still_work() {
        let prog = sandbox_filter().unwrap();
        // The shell forks (clone without namespace flags, or clone3 falling
        // back to clone) for the pipeline and the subshell.
        let out = run(Some(&prog), "sh", &["-c", "(echo hello | tr a-z A-Z) && uname -s"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(stdout(&out), "HELLO\nLinux\n");
    }
}
