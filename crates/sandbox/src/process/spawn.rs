//! `cairn __sandbox-start`: builds one sandbox and leaves its init running.
//!
//! The daemon runs this as a child process with a [`SandboxSpec`] on stdin and
//! reads a [`HelperReport`] from stdout. It is single-threaded, which is what
//! makes `fork` and `unshare` safe here. The steps, in order:
//!
//! 1. H (this process, host root): private mount namespace; join the task's
//!    cgroups (children inherit them, and the cgroup namespace is rooted
//!    there); bind the control socket.
//! 2. H forks C. C unshares a user namespace; H writes its id maps, then
//!    builds the overlay root with lowers idmapped through C's namespace.
//! 3. C becomes root of its user namespace, unshares mount, pid, net, uts,
//!    ipc, cgroup and time namespaces (clocks set to start near zero) and forks I, pid 1 of the new pid namespace;
//!    C reports I's host pid and exits.
//! 4. I mounts `/proc`, `/dev`, `/tmp`, pivots into the root, sets hostname
//!    and `lo`, binds the egress proxy port, installs the seccomp filter,
//!    bounds its capabilities, says "ready" and serves commands
//!    ([`super::init`]). No `no_new_privs`: set-id programs of the image
//!    work inside (the root is the root overlay's, mounted without nosuid).

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use cairn_image::Layer;

use crate::rootfs::{self, Kernel};
use crate::uidmap::IdRange;
use crate::{caps, net, proto, seccomp, Error, Result};

/// Everything the helper needs to build a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxSpec {
    pub hostname: String,
    pub ids: IdRange,
    /// Host directory for this sandbox's mounts and control socket.
    pub run_dir: PathBuf,
    /// Mounted task disk holding the upper and work directories.
    pub disk: PathBuf,
    pub layers: Vec<Layer>,
    /// `cgroup.procs` files of the task's cgroups.
    pub cgroup_procs: Vec<PathBuf>,
    pub workdir: String,
    pub tmp_bytes: u64,
}

impl SandboxSpec {
    pub fn control_socket(&self) -> PathBuf {
        self.run_dir.join("ctl.sock")
    }
}

/// What the helper prints when the sandbox is ready.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HelperReport {
    /// Host pid of the sandbox's init.
    pub init_pid: i32,
    /// Its start time (clock ticks since boot), which tells it apart from a
    /// later process that reuses the pid.
    pub init_start_time: u64,
}

/// Entry point of `cairn __sandbox-start`. Returns the process exit code.
///
/// Arguments, if any, are `cgroup.procs` files to join before waiting for the
/// spec: the daemon keeps a few helpers started ahead this way, because
/// moving a process between cgroup v1 groups waits for an RCU grace period
/// (~15 ms) and should not be on the path of a `task create`.
pub fn helper_main(cgroup_procs: &[PathBuf]) -> i32 {
    restore_nofile();
    for procs in cgroup_procs {
        if let Err(e) = fs::write(procs, std::process::id().to_string()) {
            eprintln!("{}", Error::CgroupMove(procs.clone(), std::process::id() as i32, e));
            return 1;
        }
    }
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("cannot read sandbox spec: {e}");
        return 2;
    }
    let spec: SandboxSpec = match serde_json::from_str(&input) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("malformed sandbox spec: {e}");
            return 2;
        }
    };
    match build(&spec) {
        Ok(report) => {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Names the soft descriptor limit the daemon was started with, which it
/// raised for itself (`cairn serve`); the helper puts it back, so that
/// sandboxes get the limit they got before.
pub const SANDBOX_NOFILE_ENV: &str = "CAIRN_SANDBOX_NOFILE";

fn restore_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Some(soft) = std::env::var(SANDBOX_NOFILE_ENV).ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard), hard);
    }
}

/// Start time of `pid` from `/proc/PID/stat` (field 22).
pub fn process_start_time(pid: i32) -> Option<u64> {
    parse_start_time(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The start time (field 22) of a `/proc/PID/stat` line.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after the last ')' are plain.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

fn build(spec: &SandboxSpec) -> Result<HelperReport> {
    protect_from_oom_killer();
    // When C exits, the init is reparented to us rather than to the daemon,
    // so a half-built one is reaped here; a ready one goes to the daemon
    // (also a subreaper) when we exit.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // Our mounts must not propagate back to the host.
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| Error::sys("unshare mount namespace", e))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| Error::sys("make / private", e))?;
    for procs in &spec.cgroup_procs {
        fs::write(procs, std::process::id().to_string())
            .map_err(|e| Error::CgroupMove(procs.clone(), std::process::id() as i32, e))?;
    }
    fs::create_dir_all(&spec.run_dir).map_err(|e| Error::Io(spec.run_dir.display().to_string(), e))?;
    let sock_path = spec.control_socket();
    let _ = fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| Error::Io(format!("bind {}", sock_path.display()), e))?;
    fs::set_permissions(&sock_path, fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Io(sock_path.display().to_string(), e))?;
    // Built before forking: the init applies it as its last step.
    let filter = seccomp::sandbox_filter()?;
    // Opened here, as host root: the run directory is closed to the
    // sandbox's own uids.
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(spec.run_dir.join("init.log"))
        .map_err(|e| Error::Io("init log".into(), e))?;

    let (ready_r, ready_w) = std::io::pipe().map_err(|e| Error::sys("pipe", e))?;
    // H hands C the merged root over this socket: C cannot reach it by
    // path, since the run directory is closed to the sandbox's uids.
    let (go_r, go_w) = UnixStream::pair().map_err(|e| Error::sys("socketpair", e))?;

    // SAFETY: this process is single-threaded (the helper never starts
    // threads), so the child may run arbitrary code after fork.
    let child = match unsafe { fork() }.map_err(|e| Error::sys("fork", e))? {
        ForkResult::Child => {
            drop(ready_r);
            drop(go_w);
            let code = match in_userns_child(spec, &listener, &filter, &log, ready_w.try_clone().ok().map(OwnedFd::from), go_r) {
                Ok(()) => 0,
                Err(e) => {
                    let _ = File::from(OwnedFd::from(ready_w)).write_all(format!("e{}\n", e.to_string().replace('\n', " ")).as_bytes());
                    1
                }
            };
            // SAFETY: _exit ends the child without running the parent's
            // atexit handlers or flushing its buffers twice.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(ready_w);
    drop(go_r);
    drop(listener);
    drop(log);

    let result = parent_side(spec, child, ready_r, go_w);
    let _ = waitpid(child, None);
    result
}

fn parent_side(spec: &SandboxSpec, child: Pid, ready_r: std::io::PipeReader, go_w: UnixStream) -> Result<HelperReport> {
    let mut lines = BufReader::new(ready_r);
    let mut line = String::new();
    lines.read_line(&mut line).map_err(|e| Error::sys("read from sandbox", e))?;
    if line.trim() != "u" {
        return Err(child_error(&line));
    }
    spec.ids.write_maps(child.as_raw())?;
    let userns = File::open(format!("/proc/{}/ns/user", child.as_raw())).map_err(|e| Error::sys("open user namespace", e))?;
    // The overlays' options name paths relative to the run directory.
    std::env::set_current_dir(&spec.run_dir).map_err(|e| Error::Io(spec.run_dir.display().to_string(), e))?;
    let root = rootfs::build_overlays(&Kernel, &spec.run_dir, &spec.disk, &spec.layers, spec.ids, rootfs::LowerIds::Idmapped(userns.as_raw_fd()), &spec.workdir)?;
    let root_dir = File::open(&root).map_err(|e| Error::Io(root.display().to_string(), e))?;
    proto::send(&go_w, &"go", &[root_dir.as_raw_fd()])?;
    drop(go_w);

    // C reports the init's pid and the init reports ready, each on its own
    // line, in either order.
    let mut init_pid = None;
    let mut ready = false;
    loop {
        if let (Some(pid), true) = (init_pid, ready) {
            let start = process_start_time(pid).ok_or_else(|| Error::Helper(format!("sandbox init {pid} vanished")))?;
            return Ok(HelperReport { init_pid: pid, init_start_time: start });
        }
        line.clear();
        if lines.read_line(&mut line).map_err(|e| Error::sys("read from sandbox", e))? == 0 {
            let why = if ready { "sandbox init did not report its pid" } else { "sandbox init exited before it was ready" };
            return Err(Error::Helper(why.into()));
        }
        let msg = line.trim_end();
        if let Some(pid) = msg.strip_prefix('p').and_then(|p| p.parse::<i32>().ok()) {
            init_pid = Some(pid);
        } else if msg == "r" {
            ready = true;
        } else {
            if let Some(pid) = init_pid {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(Pid::from_raw(pid), None);
            }
            return Err(child_error(msg));
        }
    }
}

fn child_error(line: &str) -> Error {
    let msg = line.trim().strip_prefix('e').unwrap_or(line.trim());
    Error::Helper(if msg.is_empty() { "sandbox process exited during setup".into() } else { msg.to_owned() })
}

/// Makes the init (forked below, and C) never the OOM killer's choice, so
/// that a workload over its memory limit loses its own processes, never the
/// sandbox: `oom_score_adj` -1000, inherited at fork. It is set through the
/// legacy `oom_adj`, which unlike `oom_score_adj` leaves the floor the
/// unprivileged may lower themselves to (`oom_score_adj_min`) at 0, first
/// reset to 0 here as host root. Every command goes 1000 above the init
/// before exec (`exec::spawn`), to 0, and can then never go below it. Best
/// effort: without CAP_SYS_RESOURCE the init keeps the daemon's score and
/// its commands go to 1000 instead.
fn protect_from_oom_killer() {
    let _ = fs::write("/proc/self/oom_score_adj", "0");
    let _ = fs::write("/proc/self/oom_adj", "-17");
}

/// C: enters the user namespace, then forks the init into the rest.
fn in_userns_child(
    spec: &SandboxSpec,
    listener: &UnixListener,
    filter: &seccompiler::BpfProgram,
    log: &File,
    ready_w: Option<OwnedFd>,
    go_r: UnixStream,
) -> Result<()> {
    let mut ready = File::from(ready_w.ok_or_else(|| Error::Helper("lost the ready pipe".into()))?);
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| Error::sys("unshare user namespace", e))?;
    ready.write_all(b"u\n").map_err(|e| Error::sys("report userns", e))?;
    let root_dir = match proto::recv::<String>(&go_r)? {
        Some((_, fds)) if fds.len() == 1 => fds.into_iter().next(),
        _ => None,
    }
    .ok_or_else(|| Error::Helper("helper gave up before the root was ready".into()))?;
    drop(go_r);
    become_root()?;
    // Unsharing the mount namespace carries the working directory over to
    // the new copy of its mount: from here on the root is ".".
    nix::unistd::fchdir(root_dir.as_raw_fd()).map_err(|e| Error::sys("enter sandbox root", e))?;
    drop(root_dir);
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWPID
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWCGROUP
            | CloneFlags::from_bits_retain(libc::CLONE_NEWTIME),
    )
    .map_err(|e| Error::sys("unshare namespaces", e))?;
    clocks_from_zero()?;
    // SAFETY: single-threaded process (forked from the single-threaded helper).
    match unsafe { fork() }.map_err(|e| Error::sys("fork init", e))? {
        ForkResult::Parent { child } => {
            // One write: the init writes to the same pipe at the same time,
            // and `writeln!` on a File may split a line into several writes.
            ready.write_all(format!("p{}\n", child.as_raw()).as_bytes()).map_err(|e| Error::sys("report init pid", e))?;
            Ok(())
        }
        ForkResult::Child => {
            let result = init_setup(spec, log, filter);
            match result {
                Ok(proxy) => {
                    let _ = ready.write_all(b"r\n");
                    drop(ready);
                    super::init::serve(listener, &proxy)
                }
                Err(e) => {
                    let _ = ready.write_all(format!("e{}\n", e.to_string().replace('\n', " ")).as_bytes());
                    // SAFETY: end the half-built init immediately.
                    unsafe { libc::_exit(1) }
                }
            }
        }
    }
}

/// Sets the new time namespace's clocks, before the init enters it, so
/// that its monotonic and boot-time clocks start near zero: uptime inside
/// says nothing of the host's. Only allowed while no process is inside.
fn clocks_from_zero() -> Result<()> {
    let mut offsets = String::new();
    for (name, clock) in [("monotonic", libc::CLOCK_MONOTONIC), ("boottime", libc::CLOCK_BOOTTIME)] {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec we own.
        if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
            return Err(Error::sys("read the clocks", std::io::Error::last_os_error()));
        }
        // One second short of the host's: a clock never reads negative.
        offsets.push_str(&format!("{name} -{} 0\n", (now.tv_sec - 1).max(0)));
    }
    // The switch to the namespace's root left the process non-dumpable, so
    // its /proc files are the host root's; dumpable, they are its own (the
    // init makes itself non-dumpable again).
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    fs::write("/proc/self/timens_offsets", offsets).map_err(|e| Error::sys("set the time namespace's offsets", e))
}

/// Switches to uid and gid 0 of the new user namespace, dropping the host's
/// supplementary groups.
fn become_root() -> Result<()> {
    nix::unistd::setgroups(&[]).map_err(|e| Error::sys("setgroups", e))?;
    let root_g = nix::unistd::Gid::from_raw(0);
    let root_u = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresgid(root_g, root_g, root_g).map_err(|e| Error::sys("setresgid", e))?;
    nix::unistd::setresuid(root_u, root_u, root_u).map_err(|e| Error::sys("setresuid", e))?;
    Ok(())
}

/// I, before serving: filesystems, identity, then the security bounds.
fn init_setup(spec: &SandboxSpec, log: &File, filter: &seccompiler::BpfProgram) -> Result<std::net::TcpListener> {
    // The init must not hold the daemon's pipes open: its stdio goes to a log.
    let null = File::open("/dev/null").map_err(|e| Error::Io("/dev/null".into(), e))?;
    for (src, dst) in [(null.as_raw_fd(), 0), (log.as_raw_fd(), 1), (log.as_raw_fd(), 2)] {
        nix::unistd::dup2(src, dst).map_err(|e| Error::sys("dup2 init stdio", e))?;
    }
    rootfs::build_inner(&Kernel, Path::new("."), spec.tmp_bytes)?;
    nix::unistd::sethostname(&spec.hostname).map_err(|e| Error::sys("sethostname", e))?;
    net::loopback_up()?;
    let proxy = net::proxy_listener()?;
    // The filter first, while the init still holds CAP_SYS_ADMIN of its
    // user namespace: installed so, it needs no `no_new_privs`, and the
    // image's set-id programs (sudo, ping) work inside, up to the sandbox's
    // root and its bounded capabilities, never more.
    seccomp::apply_keeping_setid(filter)?;
    caps::restrict()?;
    // Not dumpable: processes in the sandbox cannot ptrace the init or open
    // its /proc/1/fd, which holds the control socket.
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    Ok(proxy)
}
