//! Sandboxes under gVisor (`runsc`): the second isolation backend. A task
//! created with `isolation: gvisor` gets the same disk, writable layer,
//! cgroups (limits), uid slot and egress proxy as a native one; what
//! differs is how the sandbox around it is built and entered:
//!
//! - the root overlay is mounted on the host (in the task's run directory)
//!   and runsc's gofer serves it to the sandbox; the sandbox's own kernel
//!   maps ids, so the writable layer holds the sandbox's ids as they are
//!   ([`IDENTITY`]);
//! - runsc is started inside the task's cgroups (`--ignore-cgroups`), so
//!   freeze, kill, OOM counts and limits work as for a native sandbox;
//! - the sandbox's first process is `cairn __gvisor-init` ([`init`]),
//!   bound in from the host; it relays the proxy port to the daemon over a
//!   unix socket ([`egress`]), since a sandbox that can be checkpointed has
//!   no network device;
//! - commands run with `runsc exec`; every runsc call runs in a network
//!   namespace of the task's own ([`netns`]), so its abstract control
//!   socket is out of reach of the host's users;
//! - a checkpoint of the sandbox's processes and memory goes into the
//!   task's disk as one more layer, [`MEMORY_LAYER`], so snapshots store it
//!   with the files (chunked and deduplicated); a start on a disk that
//!   holds one restores it instead of booting.
//!
//! What runsc does on these machines, measured: docs/gvisor-notes.md.

pub(crate) mod backend;
pub mod egress;
pub mod init;
pub mod netns;
pub mod runsc;
pub mod spec;

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cairn_core::TaskConfig;

use crate::driver::{InitProcess, RunningCommand};
use cairn_image::Image;
use crate::proto::{self, ExecRequest, Reply};
use crate::uidmap::IdRange;
use crate::{Error, Result};

use self::egress::EgressBridge;
use self::runsc::{Platform, Runsc};

/// The ids of a gvisor sandbox's files on the host: its own (see the
/// module's doc).
pub const IDENTITY: IdRange = IdRange { host_base: 0, count: crate::uidmap::IDS_PER_SANDBOX };

/// The task-disk layer that holds a checkpoint (`<disk>/memory/upper`):
/// captured with the others, never mounted.
pub use cairn_core::MEMORY_LAYER;

/// The file runsc writes a checkpoint into.
const CHECKPOINT_FILE: &str = "checkpoint.img";

/// How long a checkpoint waits for the sandbox's proxy connections to
/// close (the sentry cannot save an open host socket).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where one gvisor sandbox lives in its task's run directory.
#[derive(Debug)]
pub struct SandboxPaths {
    pub run_dir: PathBuf,
    /// The task's disk, mounted.
    pub disk: PathBuf,
    /// The cgroup directories runsc is started in (`cgroup.procs` of each).
    pub cgroup_procs: Vec<PathBuf>,
}

impl SandboxPaths {
    fn bundle(&self) -> PathBuf {
        self.run_dir.join("bundle")
    }
    fn state(&self) -> PathBuf {
        self.run_dir.join("runsc")
    }
    fn egress_dir(&self) -> PathBuf {
        self.run_dir.join("egress")
    }
    /// Pins the network namespace runsc is called in (see `netns`).
    fn netns(&self) -> PathBuf {
        self.run_dir.join(netns::PIN)
    }
    /// The root overlay, mounted.
    pub fn root(&self) -> PathBuf {
        self.run_dir.join("root")
    }
    fn memory_dir(&self) -> PathBuf {
        self.disk.join(MEMORY_LAYER).join("upper")
    }
}

/// True when `run_dir` is a gvisor sandbox's: how a run directory made
/// before the isolation was recorded in it tells.
pub fn is_gvisor(run_dir: &Path) -> bool {
    run_dir.join("bundle").is_dir()
}

/// True when the task's disk holds a checkpoint the next start restores.
pub fn has_checkpoint(disk: &Path) -> bool {
    disk.join(MEMORY_LAYER).join("upper").join(CHECKPOINT_FILE).is_file()
}

/// runsc, its platform, and the egress bridges of the sandboxes this
/// daemon serves; the backend ([`backend::GvisorBackend`]) puts it on the
/// host's resources.
#[derive(Debug)]
pub struct Gvisor {
    exe: PathBuf,
    /// Probed at the first need (a daemon that runs no gvisor sandbox
    /// never probes), or read from the probe's answer kept in the home.
    platform: OnceLock<Platform>,
    /// The daemon's run directory: the probe's scratch space and answer.
    scratch: PathBuf,
    cgroups: crate::host::cgroup::CgroupLayout,
    /// The probe's cgroup while it runs, for a daemon that stops meanwhile.
    probing: Mutex<Option<crate::host::cgroup::TaskCgroup>>,
    /// Bound into every sandbox at `init::INIT_DIR`: the loader, its
    /// libraries and `cairn`.
    init_files: Vec<(String, PathBuf)>,
    bridges: Mutex<HashMap<String, EgressBridge>>,
}

/// The prefix of a KVM probe's cgroup (`gvisor-probe-<daemon pid>`): not
/// named like a task, so reconciling leaves it to [`Gvisor::detect`].
const PROBE_GROUP: &str = "gvisor-probe-";

impl Gvisor {
    /// The gvisor support of this host, or why there is none. `helper` is
    /// the `cairn` executable; `scratch` a directory of the daemon's. The
    /// cgroups of probes whose daemon died are removed with what runs in
    /// them.
    pub fn detect(helper: &Path, scratch: &Path, cgroups: &crate::host::cgroup::CgroupLayout) -> std::result::Result<Gvisor, String> {
        let exe = runsc::find().ok_or("runsc is not installed (apt-get install runsc)")?;
        let mut init_files = init_files(helper)?;
        let shim = scratch.join(STATX_SHIM_NAME);
        fs::write(&shim, STATX_SHIM).map_err(|e| format!("cannot write {}: {e}", shim.display()))?;
        init_files.push((STATX_SHIM_NAME.to_owned(), shim));
        for name in cgroups.list().unwrap_or_default() {
            let Some(pid) = name.strip_prefix(PROBE_GROUP).and_then(|p| p.parse::<u32>().ok()) else { continue };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if let Ok(group) = cgroups.open(&name) {
                let gone = group.kill_all().and_then(|()| group.remove());
                if let Err(e) = gone {
                    tracing::warn!("removing the cgroup of a dead daemon's gvisor probe, {name}: {e}");
                }
            }
        }
        Ok(Gvisor {
            exe,
            platform: OnceLock::new(),
            scratch: scratch.to_owned(),
            cgroups: cgroups.clone(),
            probing: Mutex::new(None),
            init_files,
            bridges: Mutex::new(HashMap::new()),
        })
    }

    /// The platform: what a probe found before on this kernel (a probe
    /// that fails takes seconds), else a probe now.
    fn platform(&self) -> Platform {
        *self.platform.get_or_init(|| {
            let cache = self.scratch.join("gvisor-platform");
            let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
            let cached = fs::read_to_string(&cache).ok().and_then(|text| match text.trim().split_once(' ') {
                Some((k, "kvm")) if k == kernel => Some(Platform::Kvm),
                Some((k, "ptrace")) if k == kernel => Some(Platform::Ptrace),
                _ => None,
            });
            if let Some(p) = cached {
                return p;
            }
            let name = format!("{PROBE_GROUP}{}", std::process::id());
            let group = match self.cgroups.create(&name, &cairn_core::Limits::default()) {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("cannot make the gvisor probe's cgroup ({e}): using ptrace");
                    return Platform::Ptrace;
                }
            };
            *self.probing.lock().unwrap_or_else(|e| e.into_inner()) = Some(group.clone());
            let found = runsc::detect_platform(&self.exe, &self.scratch.join(format!("kvm-probe-{}", std::process::id())), &group);
            self.probing.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Err(e) = group.remove() {
                tracing::warn!("removing the gvisor probe's cgroup: {e}");
            }
            tracing::info!(platform = found.as_str(), "gvisor platform");
            let _ = fs::write(&cache, format!("{kernel} {}\n", found.as_str()));
            found
        })
    }

    /// Stops a probe that runs (the daemon is stopping).
    pub fn stop(&self) {
        if let Some(group) = self.probing.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = group.kill_all();
            let _ = group.remove();
        }
    }

    fn runsc(&self, paths: &SandboxPaths) -> Runsc {
        Runsc { exe: self.exe.clone(), platform: self.platform(), state: paths.state(), netns: paths.netns() }
    }

    /// Builds and starts the sandbox on its disk as it is: restored from
    /// the checkpoint the disk holds, else booted. Returns its sentry as
    /// the init, and whether memory was restored.
    pub fn start(&self, task: &str, config: &TaskConfig, image: &Image, paths: &SandboxPaths) -> Result<(InitProcess, bool)> {
        let began = Instant::now();
        let root = crate::rootfs::build_overlays(
            &crate::rootfs::Kernel,
            &paths.run_dir,
            &paths.disk,
            &image.layers(),
            IDENTITY,
            crate::rootfs::LowerIds::AsTheyAre,
            &config.workdir,
        )?;
        for dir in [paths.bundle(), paths.state(), paths.egress_dir()] {
            fs::DirBuilder::new().recursive(true).mode(0o711).create(&dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
        }
        let spec = spec::runtime_spec(&spec::SandboxSpec {
            root: &root,
            workdir: &config.workdir,
            init_files: &self.init_files,
            egress_dir: &paths.egress_dir(),
        })?;
        let config_json = paths.bundle().join("config.json");
        spec.save(&config_json).map_err(|e| Error::Helper(format!("cannot write {}: {e}", config_json.display())))?;
        let checkpoint = has_checkpoint(&paths.disk).then(|| paths.memory_dir());
        let runsc = self.runsc(paths);
        netns::ensure(&paths.netns())?;
        let mut cmd = runsc.command();
        cmd.arg("--ignore-cgroups");
        runsc::join_cgroups_on_exec(&mut cmd, &paths.cgroup_procs).map_err(|e| Error::Io("cgroup path".into(), e))?;
        runsc::start_with(cmd, task, &paths.bundle(), checkpoint.as_deref(), &paths.run_dir.join("runsc.log"))?;
        let pid = runsc.sandbox_pid(task)?;
        let start_time = crate::process::spawn::process_start_time(pid).ok_or_else(|| Error::NotRunning(task.to_owned()))?;
        if let Some(dir) = &checkpoint {
            // Restored: the image is spent. Left on the disk it would be
            // restored again over files that have moved on.
            let _ = fs::remove_file(dir.join(CHECKPOINT_FILE));
        }
        tracing::debug!(task, restored = checkpoint.is_some(), took = ?began.elapsed(), "gvisor sandbox started");
        Ok((InitProcess { pid, start_time }, checkpoint.is_some()))
    }

    /// Checks that the sandbox runs (its init answers only through runsc).
    pub fn ping(&self, task: &str, paths: &SandboxPaths) -> Result<i32> {
        self.runsc(paths).sandbox_pid(task).map(|_| 1)
    }

    /// The egress bridge of the sandbox (a new one replaces the old) and
    /// the proxy port's listener.
    pub fn proxy_listener(&self, task: &str, paths: &SandboxPaths) -> Result<std::net::TcpListener> {
        let (bridge, listener) = EgressBridge::start(&paths.egress_dir(), init::EGRESS_SOCKET_NAME)?;
        self.bridges.lock().unwrap_or_else(|e| e.into_inner()).insert(task.to_owned(), bridge);
        Ok(listener)
    }

    /// Starts a command with `runsc exec`; see [`crate::SandboxDriver::exec`].
    pub fn exec(&self, task: &str, paths: &SandboxPaths, root: &OwnedFd, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        if req.argv.is_empty() {
            return Ok(Err("empty command".into()));
        }
        let mut env = req.env.clone();
        let (mut uid, mut gid, mut groups) = (0, 0, Vec::new());
        if let Some(u) = &req.user {
            let read = |name: &str| read_etc(root, name);
            let creds = match crate::process::user::resolve_in(u, read("passwd"), read("group")) {
                Ok(c) => c,
                Err(m) => return Ok(Err(m)),
            };
            if !env.iter().any(|kv| kv.starts_with("HOME=")) {
                env.push(format!("HOME={}", creds.home));
            }
            (uid, gid, groups) = (creds.uid, creds.gid, creds.groups);
        }
        let n = EXEC_SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let process_json = paths.run_dir.join(format!("exec-{n}.json"));
        let pid_file = paths.run_dir.join(format!("exec-{n}.pid"));
        // Root gets the bounded set; another user none, as after a
        // setuid under the native driver.
        let capabilities = if uid == 0 { spec::sandbox_capabilities()? } else { spec::no_capabilities()? };
        let process = oci_spec::runtime::ProcessBuilder::default()
            .capabilities(capabilities)
            .terminal(req.tty.is_some())
            .user(
                oci_spec::runtime::UserBuilder::default()
                    .uid(uid)
                    .gid(gid)
                    .additional_gids(groups)
                    .build()
                    .map_err(|e| Error::Helper(format!("exec user: {e}")))?,
            )
            // Through `cairn __gvisor-exec`, which installs the syscall
            // filter first (runsc gives it to the init only).
            .args(spec::cairn_args(init::EXEC_SUBCOMMAND).into_iter().chain(std::iter::once("--".to_owned())).chain(req.argv.iter().cloned()).collect::<Vec<_>>())
            .env(env)
            .cwd(req.cwd.clone())
            .build()
            .map_err(|e| Error::Helper(format!("exec process: {e}")))?;
        let json = serde_json::to_vec(&process).map_err(|e| Error::Helper(e.to_string()))?;
        fs::write(&process_json, json).map_err(|e| Error::Io(process_json.display().to_string(), e))?;
        let runsc = self.runsc(paths);
        let mut cmd = runsc.command();
        cmd.args(["exec", "-process"]).arg(&process_json).arg("-internal-pid-file").arg(&pid_file);
        let pty_master = match req.tty {
            Some(size) => {
                // runsc makes the sandbox side of a terminal when its own
                // stdio is one: a host pty, whose master the daemon gets.
                let ws = nix::pty::Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
                let pty = nix::pty::openpty(Some(&ws), None).map_err(|e| Error::sys("openpty", e))?;
                let slave = std::os::fd::AsRawFd::as_raw_fd(&pty.slave);
                cmd.stdin(dup_stdio(slave)?).stdout(dup_stdio(slave)?).stderr(dup_stdio(slave)?);
                // SAFETY: setsid and TIOCSCTTY on stdin in the forked child
                // are async-signal-safe; the terminal becomes runsc's, so
                // it gets (and forwards) the window size changes.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::setsid();
                        libc::ioctl(0, libc::TIOCSCTTY, 0);
                        Ok(())
                    });
                }
                Some(pty.master)
            }
            None => {
                let [i, o, e] = stdio else {
                    return Err(Error::Protocol(format!("exec without a tty needs 3 descriptors, got {}", stdio.len())));
                };
                cmd.stdin(dup_stdio(*i)?).stdout(dup_stdio(*o)?).stderr(dup_stdio(*e)?);
                None
            }
        };
        let mut child = cmd.arg(task).spawn().map_err(|e| Error::Helper(format!("cannot run runsc exec: {e}")))?;
        let cleanup = [process_json, pid_file.clone()];
        // Started once runsc wrote the command's pid; a runsc that ends
        // before could not start it.
        let pid = loop {
            if let Some(p) = fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                break p;
            }
            if let Ok(Some(status)) = child.try_wait() {
                cleanup.iter().for_each(|f| drop(fs::remove_file(f)));
                return Ok(Err(format!("{}: runsc exec could not start it ({status})", req.argv[0])));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let (ours, theirs) = UnixStream::pair().map_err(Error::Control)?;
        let (runsc2, task2) = (runsc.clone(), task.to_owned());
        std::thread::Builder::new()
            .name("gvisor-exec".into())
            .spawn(move || watch_exec(child, theirs, runsc2, task2, pid, cleanup))
            .map_err(|e| Error::sys("start the exec watcher", e))?;
        Ok(Ok(RunningCommand { conn: crate::CommandConnection::new(ours), pid, pty_master }))
    }

    /// Sends `signal` to process `pid` of the sandbox (`runsc kill -pid`).
    pub fn signal(&self, task: &str, paths: &SandboxPaths, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        let out = self
            .runsc(paths)
            .command()
            .args(["kill", "-pid", &pid.to_string(), task, &signal.to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Helper(format!("cannot run runsc kill: {e}")))?;
        if out.status.success() {
            Ok(Ok(()))
        } else {
            Ok(Err(format!("runsc kill: {}", String::from_utf8_lossy(&out.stderr).trim())))
        }
    }

    /// Checkpoints the sandbox into the memory layer of its disk: the
    /// proxy's connections are ended first; the sandbox stops.
    pub fn checkpoint(&self, task: &str, paths: &SandboxPaths) -> Result<()> {
        if let Some(b) = self.bridges.lock().unwrap_or_else(|e| e.into_inner()).get(task) {
            if !b.end_connections(DRAIN_TIMEOUT) {
                return Err(Error::Helper("a proxy connection of the sandbox did not close; not checkpointing".into()));
            }
        }
        let dir = paths.memory_dir();
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| Error::Io(dir.display().to_string(), e))?;
        let _ = fs::remove_file(dir.join(CHECKPOINT_FILE));
        self.runsc(paths).checkpoint(task, &dir)
    }

    /// Removes what the sandbox has on the host besides its cgroups (which
    /// the caller kills and removes first) and disk: the bridge, the
    /// overlay and lower mounts in the run directory, runsc's state.
    pub fn teardown(&self, task: &str, paths: &SandboxPaths) -> Result<()> {
        self.bridges.lock().unwrap_or_else(|e| e.into_inner()).remove(task);
        unmount_beneath(&paths.run_dir, &paths.disk)
    }
}

static EXEC_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `libcairn-statx.so` (see `shim/statx.rs`), built with the crate.
const STATX_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcairn-statx.so"));

/// Its name in [`init::INIT_DIR`].
pub const STATX_SHIM_NAME: &str = "libcairn-statx.so";

/// The host files bound in as the init: `cairn` and what its loader needs,
/// from `ldd`'s answer about it.
fn init_files(helper: &Path) -> std::result::Result<Vec<(String, PathBuf)>, String> {
    let out = std::process::Command::new("ldd").arg(helper).output().map_err(|e| format!("cannot run ldd: {e}"))?;
    files_from_ldd(helper, &String::from_utf8_lossy(&out.stdout))
}

/// [`init_files`] from `ldd`'s answer.
fn files_from_ldd(helper: &Path, text: &str) -> std::result::Result<Vec<(String, PathBuf)>, String> {
    let mut files = vec![("cairn".to_owned(), helper.to_owned())];
    for line in text.lines() {
        let line = line.trim();
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, or the
        // loader alone: `/lib64/ld-linux-x86-64.so.2 (0x…)`.
        let path = match line.split_once(" => ") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else { continue };
        let path = PathBuf::from(path);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = if name.starts_with("ld-linux") { spec::LOADER.to_owned() } else { name };
        files.push((name, path));
    }
    if !files.iter().any(|(n, _)| n == spec::LOADER) {
        return Err(format!("cannot find the dynamic loader of {} (ldd said: {})", helper.display(), text.trim()));
    }
    Ok(files)
}

/// A copy of one of the client's descriptors, for runsc exec's stdio.
fn dup_stdio(fd: RawFd) -> Result<Stdio> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) of a descriptor the caller holds open.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(Error::sys("dup a command's stdio", std::io::Error::last_os_error()));
    }
    // SAFETY: `new` is a fresh descriptor nothing else owns.
    Ok(Stdio::from(unsafe { OwnedFd::from_raw_fd(new) }))
}

/// Reads one of the sandbox's `/etc` files through its root, beneath it
/// and following no link, at most 1 MiB.
fn read_etc(root: &OwnedFd, name: &str) -> std::result::Result<String, String> {
    let etc = cairn_fsat::open_beneath(root, "etc", rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, 0)
        .map_err(|e| format!("/etc: {e}"))?;
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let bytes = cairn_fsat::read_regular_at(&etc, &c, 1 << 20).map_err(|e| format!("/etc/{name}: {e}"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Waits for `runsc exec` to end and reports the command's exit on the
/// connection; the daemon closing the connection first kills the command
/// inside the sandbox.
fn watch_exec(mut child: std::process::Child, conn: UnixStream, runsc: Runsc, task: String, pid: i32, cleanup: [PathBuf; 2]) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, conn) = (done.clone(), conn.try_clone());
        std::thread::spawn(move || {
            let Ok(mut conn) = conn else { return };
            let mut b = [0u8; 1];
            // Nothing is ever sent this way: a read returns at the close.
            let _ = conn.read(&mut b);
            if !done.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = runsc.command().args(["kill", "-pid", &pid.to_string(), &task, "KILL"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
            }
        })
    };
    let status = child.wait();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    cleanup.iter().for_each(|f| drop(fs::remove_file(f)));
    let reply = match status {
        Ok(s) => Reply::Exited { code: s.code(), signal: s.signal() },
        Err(_) => Reply::Exited { code: None, signal: None },
    };
    let _ = proto::send(&conn, &reply, &[]);
    drop(conn);
    let _ = watcher.join();
}

/// Unmounts everything mounted beneath `run_dir` except the disk, deepest
/// first (the overlays, then the lower directories bound for them), each
/// as [`crate::host::disk::unmount`] does (waiting out a brief EBUSY).
pub fn unmount_beneath(run_dir: &Path, disk: &Path) -> Result<()> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else { return Ok(()) };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(crate::host::disk::unescape_mountinfo(p))))
        .filter(|p| p.starts_with(run_dir) && p != run_dir && !p.starts_with(disk))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        // Unmounted for real, not detached: the task's disk is unmounted
        // next, and a detached overlay still holding its upper would keep
        // the disk's loop device past the teardown.
        crate::host::disk::unmount(&p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
