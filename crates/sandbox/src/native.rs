//! The `native` isolation driver: one sandbox per task from Linux
//! namespaces, an overlay root on a per-task ext4 disk, cgroup limits and a
//! seccomp filter.
//!
//! Called from the daemon (blocking calls; run them off the async runtime).
//! Building the namespaces happens in the `__sandbox-start` helper process,
//! never in the daemon's own threads.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cairn_core::{Isolation, TaskConfig};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cgroup::CgroupLayout;
use crate::disk::{self, DiskPool};
use crate::disk_budget::DiskSpace;
use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand, SandboxDriver};
use crate::home_mount::{self, HomeMount};
use cairn_image::Image;
use crate::process::spawn::{process_start_time, HelperReport, SandboxSpec};
use crate::proto::{self, ExecRequest, Reply, Request};
use crate::slots::HostSlots;
use crate::gvisor::{self, Gvisor};
use crate::uidmap::IdRange;
use crate::{Error, Result};

/// The hidden subcommand of the `cairn` binary that runs [`crate::helper_main`].
pub const HELPER_SUBCOMMAND: &str = "__sandbox-start";

/// Where one task's sandbox lives on the host.
#[derive(Clone, Debug)]
struct TaskPaths {
    /// Mount points, control socket, init log. Removed on destroy.
    run_dir: PathBuf,
    /// The ext4 image holding the writable layer.
    disk_image: PathBuf,
    /// Where that image is mounted on the host.
    disk_mount: PathBuf,
    control_socket: PathBuf,
}

/// The driver that builds real sandboxes; see [`SandboxDriver`] for what
/// each call does.
#[derive(Debug)]
pub struct NativeDriver {
    run_root: PathBuf,
    disk_root: PathBuf,
    cgroups: CgroupLayout,
    pool: DiskPool,
    helper: PathBuf,
    prestarted: std::sync::Mutex<Vec<Prestarted>>,
    prestart_target: usize,
    prestart_limits: cairn_core::Limits,
    slots: HostSlots,
    /// Set when the daemon stops: no more helpers are started ahead.
    closed: std::sync::atomic::AtomicBool,
    /// Sandboxes under gVisor, or why this host cannot run them.
    gvisor: std::result::Result<Gvisor, String>,
    /// runsc's sandbox and gofer processes, reparented to the daemon (a
    /// subreaper): reaped once they exited.
    gvisor_processes: std::sync::Mutex<Vec<i32>>,
    /// The home mounted on itself `nosuid,nodev`: what sandboxes made is
    /// never a privilege on the host.
    home_mount: HomeMount,
    /// How new task disks are admitted against the space that holds them.
    disk_space: DiskSpace,
    /// One admission at a time: two could each see room for one disk.
    admitting: std::sync::Mutex<()>,
}

impl NativeDriver {
    /// `home` is `$CAIRN_HOME`; `helper` the `cairn` executable.
    pub fn new(home: &Path, helper: PathBuf, defaults: cairn_core::Limits, pool_target: usize, disk_space: DiskSpace) -> Result<NativeDriver> {
        let default_disk = defaults.disk_bytes;
        // Before anything is written or mounted in the home.
        let home_mount = home_mount::seal(home)?;
        let run_root = home.join("run");
        let disk_root = home.join("disks");
        for d in [&run_root, &disk_root] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(d).map_err(|e| Error::Io(d.display().to_string(), e))?;
        }
        let pool = DiskPool::new(disk_root.join("pool"), default_disk, pool_target)?;
        let cgroups = CgroupLayout::detect()?;
        let gvisor = Gvisor::detect(&helper, &run_root, &cgroups);
        if let Err(why) = &gvisor {
            tracing::info!("no gvisor sandboxes on this host: {why}");
        }
        Ok(NativeDriver {
            gvisor,
            gvisor_processes: std::sync::Mutex::new(Vec::new()),
            home_mount,
            disk_space,
            admitting: std::sync::Mutex::new(()),
            slots: HostSlots::new(&run_root),
            run_root,
            disk_root,
            cgroups,
            pool,
            helper,
            prestarted: std::sync::Mutex::new(Vec::new()),
            prestart_target: pool_target,
            prestart_limits: defaults,
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn paths(&self, task: &str) -> TaskPaths {
        let run_dir = self.run_root.join(task);
        TaskPaths {
            disk_image: self.disk_root.join(format!("{task}.img")),
            disk_mount: run_dir.join("disk"),
            control_socket: run_dir.join("ctl.sock"),
            run_dir,
        }
    }

    fn start_inner(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let began = Instant::now();
        let paths = self.paths(task);
        let ids = IdRange::for_slot(slot)?;
        self.prepare_disk(task, config.limits.disk_bytes)?;
        let t_mount = began.elapsed();
        let cgroup = self.cgroups.create(task, &config.limits)?;
        let t_cgroup = began.elapsed();
        let spec = SandboxSpec {
            hostname: task.to_owned(),
            ids,
            run_dir: paths.run_dir.clone(),
            disk: paths.disk_mount.clone(),
            layers: image.layers(),
            // A helper started ahead is in the task's cgroups already.
            cgroup_procs: if ahead.is_some() {
                Vec::new()
            } else {
                cgroup.paths().into_iter().map(|p| p.join("cgroup.procs")).collect()
            },
            workdir: config.workdir.clone(),
            // tmpfs pages are charged to the task's memory cgroup and stay
            // when their writer is killed: a /tmp as large as the limit,
            // once full, got every later command OOM-killed. Half of it is
            // left to processes.
            tmp_bytes: config.limits.memory_bytes / 2,
        };
        let child = match ahead {
            Some(mut p) => p.child.take().ok_or_else(|| Error::Helper("helper started ahead is gone".into()))?,
            None => self.spawn_helper(&[])?,
        };
        // The overlay's work directory needs inodes even on a full disk.
        disk::release_spares(&paths.disk_mount);
        let report = run_helper(child, &spec)?;
        disk::keep_spares(&paths.disk_mount);
        tracing::debug!(task, disk = ?t_mount, cgroup = ?t_cgroup, helper = ?began.elapsed(), "sandbox started");
        Ok(InitProcess { pid: report.init_pid, start_time: report.init_start_time })
    }

    /// Runs `cairn __sandbox-start`, joining `cgroup_procs` first; it then
    /// waits for its spec on stdin.
    fn spawn_helper(&self, cgroup_procs: &[PathBuf]) -> Result<std::process::Child> {
        Command::new(&self.helper)
            .arg(HELPER_SUBCOMMAND)
            .args(cgroup_procs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            // The one variable it needs: the descriptor limit sandboxes get.
            .envs(std::env::var_os(crate::SANDBOX_NOFILE_ENV).map(|v| (crate::SANDBOX_NOFILE_ENV, v)))
            .spawn()
            .map_err(|e| Error::Helper(format!("cannot run {}: {e}", self.helper.display())))
    }

    /// The gvisor half, for a task whose sandbox runs under it (or ran:
    /// its run directory says so).
    fn gvisor_of(&self, task: &str) -> Option<&Gvisor> {
        if !gvisor::is_gvisor(&self.paths(task).run_dir) {
            return None;
        }
        self.gvisor.as_ref().ok()
    }

    fn gvisor_paths(&self, task: &str) -> Result<gvisor::SandboxPaths> {
        let paths = self.paths(task);
        let cgroup = self.cgroups.open(task)?;
        Ok(gvisor::SandboxPaths {
            run_dir: paths.run_dir,
            disk: paths.disk_mount,
            cgroup_procs: cgroup.paths().into_iter().map(|p| p.join("cgroup.procs")).collect(),
        })
    }

    fn start_gvisor(&self, task: &str, config: &TaskConfig, image: &Image) -> Result<InitProcess> {
        let g = self.gvisor.as_ref().map_err(|why| Error::Helper(format!("gvisor: {why}")))?;
        self.prepare_disk(task, config.limits.disk_bytes)?;
        // The sentry's own threads count against the pids limit.
        let mut limits = config.limits;
        limits.pids = gvisor::spec::host_pids(limits.pids);
        let cgroup = self.cgroups.create(task, &limits)?;
        disk::release_spares(&self.paths(task).disk_mount);
        let (init, _restored) = g.start(task, config, image, &self.gvisor_paths(task)?)?;
        disk::keep_spares(&self.paths(task).disk_mount);
        if let Ok(pids) = cgroup.pids() {
            self.gvisor_processes.lock().unwrap_or_else(|e| e.into_inner()).extend(pids);
        }
        Ok(init)
    }

    /// Reaps runsc's processes that exited.
    fn reap_gvisor(&self) {
        let me = std::process::id() as i32;
        self.gvisor_processes.lock().unwrap_or_else(|e| e.into_inner()).retain(|&pid| {
            let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return false };
            let mut fields = rest.split(' ');
            let (state, ppid) = (fields.next(), fields.next().and_then(|p| p.parse::<i32>().ok()));
            if ppid != Some(me) {
                return false;
            }
            if state == Some("Z") {
                let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
                return false;
            }
            true
        });
    }

    /// A gvisor sandbox's port, through `cairn __gvisor-connect` run inside
    /// ([`gvisor::init::connect_main`]) with one end of a socket pair as its
    /// stdin, which carries both ways.
    fn relay_port(&self, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        let (ours, theirs) = UnixStream::pair().map_err(Error::Control)?;
        let mut argv = gvisor::spec::cairn_args(gvisor::init::CONNECT_SUBCOMMAND);
        argv.push(port.to_string());
        let req = ExecRequest { argv, env: Vec::new(), cwd: "/".into(), tty: None, user: None };
        let null = fs::File::open("/dev/null").map_err(|e| Error::Io("/dev/null".into(), e))?;
        // Not as stdout too: runsc imports each descriptor on its own and
        // makes the host's file non-blocking as it does, so a second import
        // of the socket began non-blocking inside (which one came second
        // varied), and the relay ended at the first read or write that had
        // to wait: a request cut off, an answer cut short.
        let relay = match self.exec(task, &req, &[theirs.as_raw_fd(), null.as_raw_fd(), null.as_raw_fd()])? {
            Ok(r) => r,
            Err(why) => return Ok(Err(why)),
        };
        drop(theirs);
        // The relay's first byte says whether it connected.
        ours.set_read_timeout(Some(Duration::from_secs(10))).map_err(Error::Control)?;
        let mut answer = [0u8; 1];
        match std::io::Read::read(&mut &ours, &mut answer) {
            Ok(1) if answer[0] == b'+' => {}
            Ok(1) if answer[0] == b'-' => {
                let mut why = String::new();
                let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(std::io::Read::take(&ours, 1024)), &mut why);
                return Ok(Err(why.trim().to_owned()));
            }
            Ok(_) => return Ok(Err(format!("the relay to port {port} ended before it connected"))),
            Err(e) => return Ok(Err(format!("the relay to port {port} did not answer ({e})"))),
        }
        ours.set_read_timeout(None).map_err(Error::Control)?;
        Ok(Ok(PortConnection::Relayed { stream: ours, relay }))
    }

    fn connect(&self, task: &str) -> Result<UnixStream> {
        let sock = self.paths(task).control_socket;
        UnixStream::connect(&sock).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => Error::NotRunning(task.to_owned()),
            _ => Error::Control(e),
        })
    }
}

impl SandboxDriver for NativeDriver {
    fn uid_range(&self, slot: u32, isolation: Isolation) -> Result<IdRange> {
        match isolation {
            Isolation::Native => IdRange::for_slot(slot),
            Isolation::Gvisor => Ok(gvisor::IDENTITY),
        }
    }

    fn check_isolation(&self, isolation: Isolation) -> Result<()> {
        match (isolation, &self.gvisor) {
            (Isolation::Gvisor, Err(why)) => Err(Error::Helper(format!("this host cannot run gvisor sandboxes: {why}"))),
            _ => Ok(()),
        }
    }

    fn reserve_slot(&self, slot: u32, task: &str) -> Result<bool> {
        self.slots.reserve(slot, task)
    }

    fn adopt_slot(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool> {
        self.slots.adopt(slot, task, init)
    }

    fn release_slot(&self, slot: u32, task: &str) {
        self.slots.release(slot, task);
    }

    /// Takes a helper started ahead; it is in the cgroups of its task id.
    fn take_prestarted(&self) -> Option<Prestarted> {
        self.prestarted.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Starts helpers ahead until the pool holds its target number. Each one
    /// gets a fresh task id, its cgroups (default limits, rewritten on use)
    /// and a run directory, so a daemon that dies leaves only ordinary
    /// leftovers of its own home.
    fn refill_prestarted(&self) -> Result<()> {
        while self.prestarted.lock().unwrap_or_else(|e| e.into_inner()).len() < self.prestart_target
            && !self.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            let task = cairn_core::TaskId::random().to_string();
            let paths = self.paths(&task);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&paths.run_dir)
                .map_err(|e| Error::Io(paths.run_dir.display().to_string(), e))?;
            let cgroup = self.cgroups.create(&task, &self.prestart_limits)?;
            let procs: Vec<PathBuf> = cgroup.paths().into_iter().map(|p| p.join("cgroup.procs")).collect();
            let child = self.spawn_helper(&procs)?;
            self.prestarted.lock().unwrap_or_else(|e| e.into_inner()).push(Prestarted { task, child: Some(child) });
        }
        Ok(())
    }

    /// Stops the helpers started ahead and removes their cgroups and run
    /// directories (no more are started), then the home's own mount unless
    /// sandboxes are left in it.
    fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(g) = &self.gvisor {
            g.stop();
        }
        let all: Vec<Prestarted> = std::mem::take(&mut *self.prestarted.lock().unwrap_or_else(|e| e.into_inner()));
        for p in all {
            let task = p.task.clone();
            drop(p);
            if let Err(e) = self.destroy(&task, None) {
                tracing::warn!(task, "removing a helper started ahead: {e}");
            }
        }
        self.home_mount.release();
    }

    fn refill_disk_pool(&self) -> Result<()> {
        self.pool.refill()
    }

    /// Mounts the task's disk in its run directory, taking a formatted disk
    /// from the pool if it has none.
    fn prepare_disk(&self, task: &str, disk_bytes: u64) -> Result<PathBuf> {
        let paths = self.paths(task);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&paths.run_dir)
            .map_err(|e| Error::Io(paths.run_dir.display().to_string(), e))?;
        if !paths.disk_image.exists() {
            let _one = self.admitting.lock().unwrap_or_else(|e| e.into_inner());
            self.disk_space.admit(&self.disk_root, disk_bytes)?;
            self.pool.take(&paths.disk_image, disk_bytes)?;
        }
        if !disk::is_mounted(&paths.disk_mount) {
            disk::attach_and_mount(&paths.disk_image, &paths.disk_mount)?;
        }
        Ok(paths.disk_mount)
    }

    fn admit_disks(&self, disk_bytes: u64) -> Result<()> {
        self.disk_space.admit(&self.disk_root, disk_bytes)
    }

    fn disk_dir(&self, task: &str) -> PathBuf {
        self.paths(task).disk_mount
    }

    fn has_disk(&self, task: &str) -> bool {
        self.paths(task).disk_image.exists()
    }

    fn discard_disk(&self, task: &str) -> Result<()> {
        let paths = self.paths(task);
        disk::unmount(&paths.disk_mount)?;
        disk::detach_backing(&paths.disk_image)?;
        remove_path(&paths.disk_image)
    }

    fn start(&self, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let ahead = ahead.filter(|p| p.task == task);
        let result = match config.isolation {
            Isolation::Native => self.start_inner(task, config, image, slot, ahead),
            Isolation::Gvisor => {
                // A helper started ahead is a native one: not used.
                drop(ahead);
                self.start_gvisor(task, config, image)
            }
        };
        match &result {
            Ok(init) => {
                if let Err(e) = self.slots.record_init(slot, task, *init) {
                    tracing::warn!(task, "recording uid slot {slot}: {e}");
                }
            }
            Err(_) => {
                let _ = self.teardown(task, None, true);
            }
        }
        result
    }

    fn ping(&self, task: &str) -> Result<i32> {
        if let Some(g) = self.gvisor_of(task) {
            return g.ping(task, &self.gvisor_paths(task)?);
        }
        let conn = self.connect(task)?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).map_err(Error::Control)?;
        proto::send(&conn, &Request::Ping, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Pong { pid }, _)) => Ok(pid),
            other => Err(Error::Protocol(format!("unexpected answer to ping: {other:?}"))),
        }
    }

    /// The init bound the port in the sandbox's network namespace (see
    /// `net`) and hands the socket over.
    fn proxy_listener(&self, task: &str) -> Result<TcpListener> {
        if let Some(g) = self.gvisor_of(task) {
            return g.proxy_listener(task, &self.gvisor_paths(task)?);
        }
        let conn = self.connect(task)?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).map_err(Error::Control)?;
        proto::send(&conn, &Request::ProxyListener, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::ProxyListener, fds)) if fds.len() == 1 => {
                let listener = TcpListener::from(fds.into_iter().next().ok_or_else(|| Error::Protocol("no proxy listener".into()))?);
                crate::net::check_proxy_listener(&listener)?;
                Ok(listener)
            }
            other => Err(Error::Protocol(format!("unexpected answer to a proxy listener request: {other:?}"))),
        }
    }

    fn connect_port(&self, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        if self.gvisor_of(task).is_some() {
            return self.relay_port(task, port);
        }
        let conn = self.connect(task)?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).map_err(Error::Control)?;
        proto::send(&conn, &Request::ConnectPort { port }, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::PortConnection, fds)) if fds.len() == 1 => {
                let fd = fds.into_iter().next().ok_or_else(|| Error::Protocol("no port connection".into()))?;
                let stream = std::net::TcpStream::from(fd);
                crate::net::check_port_connection(&stream, port)?;
                Ok(Ok(PortConnection::Socket(stream)))
            }
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            other => Err(Error::Protocol(format!("unexpected answer to a port connection request: {other:?}"))),
        }
    }

    fn signal(&self, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        if let Some(g) = self.gvisor_of(task) {
            return g.signal(task, &self.gvisor_paths(task)?, pid, signal);
        }
        let conn = self.connect(task)?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).map_err(Error::Control)?;
        proto::send(&conn, &Request::Signal { pid, signal }, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Signalled, _)) => Ok(Ok(())),
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            other => Err(Error::Protocol(format!("unexpected answer to a signal: {other:?}"))),
        }
    }

    fn watch(&self, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        if self.gvisor_of(task).is_some() {
            // gVisor's inotify, from `cairn __gvisor-watch` run inside.
            let mut argv = crate::gvisor::spec::cairn_args(crate::watch::WATCH_SUBCOMMAND);
            argv.push(path.to_owned());
            if recursive {
                argv.push("--recursive".to_owned());
            }
            let req = ExecRequest { argv, env: Vec::new(), cwd: "/".into(), tty: None, user: None };
            let null = std::fs::File::open("/dev/null").map_err(|e| Error::Io("/dev/null".into(), e))?;
            return self.exec(task, &req, &[null.as_raw_fd(), out, null.as_raw_fd()]);
        }
        let conn = self.connect(task)?;
        proto::send(&conn, &Request::Watch { path: path.to_owned(), recursive }, &[out])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Started { pid }, _)) => Ok(Ok(RunningCommand { conn, pid, pty_master: None })),
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            Some((other, _)) => Err(Error::Protocol(format!("unexpected answer to a watch: {other:?}"))),
            None => Err(Error::NotRunning(task.to_owned())),
        }
    }

    fn exec(&self, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        if let Some(g) = self.gvisor_of(task) {
            let root = self.gvisor_root(task)?;
            return g.exec(task, &self.gvisor_paths(task)?, &root, req, stdio);
        }
        let conn = self.connect(task)?;
        proto::send(&conn, &Request::Exec(req.clone()), stdio)?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Started { pid }, fds)) => {
                Ok(Ok(RunningCommand { conn, pid, pty_master: fds.into_iter().next() }))
            }
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            Some((other, _)) => Err(Error::Protocol(format!("unexpected answer to exec: {other:?}"))),
            None => Err(Error::NotRunning(task.to_owned())),
        }
    }

    fn oom_kills(&self, task: &str) -> Result<u64> {
        self.cgroups.open(task)?.oom_kills()
    }

    /// Freezes the task's cgroup.
    fn freeze(&self, task: &str) -> Result<()> {
        self.cgroups.open(task)?.freeze()
    }

    fn thaw(&self, task: &str) -> Result<()> {
        self.cgroups.open(task)?.thaw()
    }

    fn open_root(&self, task: &str, init: InitProcess) -> Result<OwnedFd> {
        if self.gvisor_of(task).is_some() {
            if !init.alive() {
                return Err(Error::NotRunning(task.to_owned()));
            }
            return self.gvisor_root(task);
        }
        // The /proc directory is opened first and the process checked
        // through it, so a pid recycled between the check and the open of
        // `root` cannot hand over another process's root (the host's).
        let path = format!("/proc/{}", init.pid);
        let proc_dir = cairn_fsat::open_dir(Path::new(&path)).map_err(|e| Error::Io(path.clone(), e))?;
        let stat = cairn_fsat::read_regular_at(&proc_dir, c"stat", 4096).map_err(|e| Error::Io(format!("{path}/stat"), e))?;
        let stat = String::from_utf8_lossy(&stat);
        let zombie = stat.rfind(')').is_some_and(|i| stat[i + 2..].starts_with('Z'));
        if crate::process::spawn::parse_start_time(&stat) != Some(init.start_time) || zombie {
            return Err(Error::NotRunning(task.to_owned()));
        }
        let root: OwnedFd = rustix::fs::openat(&proc_dir, c"root", rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(|e| Error::Io(format!("{path}/root"), e.into()))?;
        // Belt and braces: a sandbox's root is never the host's.
        if crate::files::is_host_root(&root).map_err(|e| Error::Io(format!("{path}/root"), e))? {
            return Err(Error::NotRunning(format!("{task} (pid {} has the host's root)", init.pid)));
        }
        Ok(root)
    }

    /// Removes the task's cgroups, mounts, loop device, run directory and,
    /// without `keep_disk`, its disk image.
    fn teardown(&self, task: &str, init: Option<InitProcess>, keep_disk: bool) -> Result<()> {
        let paths = self.paths(task);
        let cgroup = self.cgroups.open(task)?;
        let under_gvisor = gvisor::is_gvisor(&paths.run_dir);
        if under_gvisor {
            if let Ok(pids) = cgroup.pids() {
                self.gvisor_processes.lock().unwrap_or_else(|e| e.into_inner()).extend(pids);
            }
        }
        if cgroup.exists() {
            cgroup.kill_all()?;
        }
        if let Some(init) = init.filter(|i| i.alive()) {
            let _ = kill(Pid::from_raw(init.pid), Signal::SIGKILL);
        }
        if let Some(init) = init {
            wait_gone(init);
        }
        if under_gvisor {
            self.reap_gvisor();
            match &self.gvisor {
                Ok(g) => g.teardown(task, &self.gvisor_paths(task)?)?,
                Err(_) => gvisor::unmount_beneath(&paths.run_dir, &paths.disk_mount)?,
            }
        }
        disk::unmount(&paths.disk_mount)?;
        disk::detach_backing(&paths.disk_image)?;
        cgroup.remove()?;
        remove_path(&paths.run_dir)?;
        if !keep_disk {
            remove_path(&paths.disk_image)?;
        }
        Ok(())
    }

    fn checkpoint(&self, task: &str) -> Result<()> {
        let g = self.gvisor_of(task).ok_or_else(|| Error::Helper(format!("task {task} has no gvisor sandbox to checkpoint")))?;
        let result = g.checkpoint(task, &self.gvisor_paths(task)?);
        self.reap_gvisor();
        result
    }

    fn has_checkpoint(&self, task: &str) -> bool {
        gvisor::has_checkpoint(&self.paths(task).disk_mount)
    }

    /// Run directories, disks and cgroups named like tasks. Cgroups are
    /// host-wide: those of another home's tasks are listed too.
    fn leftovers(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self.cgroups.list()?;
        for dir in [&self.run_root, &self.disk_root] {
            if let Ok(entries) = fs::read_dir(dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().trim_end_matches(".img").to_owned();
                    if cairn_core::TaskId::looks_like(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// A run directory or a disk image in this home.
    fn has_local_state(&self, task: &str) -> bool {
        let paths = self.paths(task);
        paths.run_dir.exists() || paths.disk_image.exists()
    }
}

impl NativeDriver {
    /// The root of a gvisor sandbox: its overlay, mounted in the run
    /// directory (the daemon's own).
    fn gvisor_root(&self, task: &str) -> Result<OwnedFd> {
        let path = self.gvisor_paths(task)?.root();
        cairn_fsat::open_dir(&path).map_err(|e| Error::Io(path.display().to_string(), e))
    }
}

/// Sends the spec to a started helper and waits for its report.
fn run_helper(mut child: std::process::Child, spec: &SandboxSpec) -> Result<HelperReport> {
    let input = serde_json::to_vec(spec).map_err(|e| Error::Helper(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&input).map_err(|e| Error::Helper(format!("cannot send spec: {e}")))?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Helper(e.to_string()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let msg = stderr.trim().trim_start_matches("sandbox helper failed: ").to_owned();
        return Err(Error::Helper(if msg.is_empty() { format!("helper exited with {}", out.status) } else { msg }));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| Error::Helper(format!("malformed helper report: {e}")))
}

/// Waits (bounded) until the init has exited, reaping it if it is our child
/// (the daemon is a subreaper for the sandboxes it starts).
fn wait_gone(init: InitProcess) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(init.pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        if process_start_time(init.pid) != Some(init.start_time) {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Removes a task's run directory or disk image: a link in it is removed,
/// never followed, and a mount still inside (the task's disk, if its unmount
/// failed) stops the removal instead of being emptied.
fn remove_path(p: &Path) -> Result<()> {
    let err = |e| Error::Io(format!("remove {}", p.display()), e);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    };
    // The parent is the daemon's own ($CAIRN_HOME/run or /disks).
    let parent: OwnedFd = match fs::File::open(parent) {
        Ok(f) => f.into(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let name = cairn_fsat::cstr(name).map_err(err)?;
    cairn_fsat::remove_tree_at(&parent, &name).map_err(err)
}
