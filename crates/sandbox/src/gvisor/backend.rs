//! The `gvisor` isolation backend: [`Gvisor`] on the host's resources.
//! It is there on every host; where runsc cannot run, it says why
//! ([`Backend::check`]) and still tears down what a sandbox left.

use std::fs;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

use cairn_core::{Isolation, TaskConfig};
use cairn_image::Image;
use nix::unistd::Pid;

use super::{Gvisor, SandboxPaths};
use crate::backend::Backend;
use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand};
use crate::host::Host;
use crate::proto::ExecRequest;
use crate::uidmap::IdRange;
use crate::{Error, Result};

/// The backend of gvisor sandboxes; see [`Backend`].
#[derive(Debug)]
pub(crate) struct GvisorBackend {
    /// Sandboxes under gVisor, or why this host cannot run them.
    gvisor: std::result::Result<Gvisor, String>,
    /// runsc's sandbox and gofer processes, reparented to the daemon (a
    /// subreaper): reaped once they exited.
    processes: Mutex<Vec<i32>>,
}

impl GvisorBackend {
    /// Finds runsc; `helper` is the `cairn` executable, bound into every
    /// sandbox as its init.
    pub(crate) fn detect(host: &Host) -> GvisorBackend {
        let gvisor = match (host.helper(), host.cgroups()) {
            (Some(helper), Ok(cgroups)) => Gvisor::detect(helper, host.run_root(), cgroups),
            _ => Err("this host has no sandbox helper or cgroups".to_owned()),
        };
        if let Err(why) = &gvisor {
            tracing::info!("no gvisor sandboxes on this host: {why}");
        }
        GvisorBackend { gvisor, processes: Mutex::new(Vec::new()) }
    }

    fn gvisor(&self) -> Result<&Gvisor> {
        self.gvisor.as_ref().map_err(|why| Error::Helper(format!("gvisor: {why}")))
    }

    fn paths(host: &Host, task: &str) -> Result<SandboxPaths> {
        let paths = host.paths(task);
        let cgroup = host.cgroup(task)?;
        Ok(SandboxPaths {
            run_dir: paths.run_dir,
            disk: paths.disk_mount,
            cgroup_procs: cgroup.paths().into_iter().map(|p| p.join("cgroup.procs")).collect(),
        })
    }

    /// The root of the sandbox: its overlay, mounted in the run directory
    /// (the daemon's own).
    fn root(host: &Host, task: &str) -> Result<OwnedFd> {
        let path = Self::paths(host, task)?.root();
        cairn_fsat::open_dir(&path).map_err(|e| Error::Io(path.display().to_string(), e))
    }

    fn keep_processes(&self, host: &Host, task: &str) {
        if let Ok(pids) = host.cgroup(task).and_then(|c| c.pids()) {
            self.processes.lock().unwrap_or_else(|e| e.into_inner()).extend(pids);
        }
    }

    /// Reaps runsc's processes that exited.
    fn reap(&self) {
        let me = std::process::id() as i32;
        self.processes.lock().unwrap_or_else(|e| e.into_inner()).retain(|&pid| {
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
}

impl Backend for GvisorBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Gvisor
    }

    fn check(&self) -> Result<()> {
        match &self.gvisor {
            Ok(_) => Ok(()),
            Err(why) => Err(Error::Helper(format!("this host cannot run gvisor sandboxes: {why}"))),
        }
    }

    fn uid_range(&self, _slot: u32) -> Result<IdRange> {
        Ok(super::IDENTITY)
    }

    fn start(&self, host: &Host, task: &str, config: &TaskConfig, image: &Image, _slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        // A helper started ahead is a native one: not used (stopped before
        // anything else runs in the cgroups it is in).
        drop(ahead);
        let g = self.gvisor()?;
        host.prepare_disk(task, config.limits.disk_bytes)?;
        // The sentry's own threads count against the pids limit.
        let mut limits = config.limits;
        limits.pids = super::spec::host_pids(limits.pids);
        let cgroup = host.cgroups()?.create(task, &limits)?;
        host.release_spares(task);
        let (init, _restored) = g.start(task, config, image, &Self::paths(host, task)?)?;
        host.keep_spares(task);
        if let Ok(pids) = cgroup.pids() {
            self.processes.lock().unwrap_or_else(|e| e.into_inner()).extend(pids);
        }
        Ok(init)
    }

    fn ping(&self, host: &Host, task: &str) -> Result<i32> {
        self.gvisor()?.ping(task, &Self::paths(host, task)?)
    }

    fn proxy_listener(&self, host: &Host, task: &str) -> Result<TcpListener> {
        self.gvisor()?.proxy_listener(task, &Self::paths(host, task)?)
    }

    /// Through `cairn __gvisor-connect` run inside
    /// ([`super::init::connect_main`]) with one end of a socket pair as its
    /// stdin, which carries both ways.
    fn connect_port(&self, host: &Host, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        let (ours, theirs) = UnixStream::pair().map_err(Error::Control)?;
        let mut argv = super::spec::cairn_args(super::init::CONNECT_SUBCOMMAND);
        argv.push(port.to_string());
        let req = ExecRequest { argv, env: Vec::new(), cwd: "/".into(), tty: None, user: None };
        let null = fs::File::open("/dev/null").map_err(|e| Error::Io("/dev/null".into(), e))?;
        // Not as stdout too: runsc imports each descriptor on its own and
        // makes the host's file non-blocking as it does, so a second import
        // of the socket began non-blocking inside (which one came second
        // varied), and the relay ended at the first read or write that had
        // to wait: a request cut off, an answer cut short.
        let relay = match self.exec(host, task, &req, &[theirs.as_raw_fd(), null.as_raw_fd(), null.as_raw_fd()])? {
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

    /// gVisor's inotify, from `cairn __gvisor-watch` run inside.
    fn watch(&self, host: &Host, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        let mut argv = super::spec::cairn_args(crate::watch::WATCH_SUBCOMMAND);
        argv.push(path.to_owned());
        if recursive {
            argv.push("--recursive".to_owned());
        }
        let req = ExecRequest { argv, env: Vec::new(), cwd: "/".into(), tty: None, user: None };
        let null = fs::File::open("/dev/null").map_err(|e| Error::Io("/dev/null".into(), e))?;
        self.exec(host, task, &req, &[null.as_raw_fd(), out, null.as_raw_fd()])
    }

    fn signal(&self, host: &Host, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        self.gvisor()?.signal(task, &Self::paths(host, task)?, pid, signal)
    }

    fn exec(&self, host: &Host, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        let g = self.gvisor()?;
        let root = Self::root(host, task)?;
        g.exec(task, &Self::paths(host, task)?, &root, req, stdio)
    }

    fn checkpoint(&self, host: &Host, task: &str) -> Result<()> {
        let result = self.gvisor()?.checkpoint(task, &Self::paths(host, task)?);
        self.reap();
        result
    }

    fn has_checkpoint(&self, host: &Host, task: &str) -> bool {
        super::has_checkpoint(&host.disk_dir(task))
    }

    fn open_root(&self, host: &Host, task: &str, init: InitProcess) -> Result<OwnedFd> {
        if !init.alive() {
            return Err(Error::NotRunning(task.to_owned()));
        }
        Self::root(host, task)
    }

    /// runsc's processes are kept to be reaped once the cgroups killed them.
    fn stop(&self, host: &Host, task: &str, init: Option<InitProcess>) -> Result<()> {
        host.cgroup(task)?;
        self.keep_processes(host, task);
        host.kill_sandbox(task, init)
    }

    /// The egress bridge, the overlay and lower mounts in the run
    /// directory, runsc's state.
    fn release(&self, host: &Host, task: &str) -> Result<()> {
        self.reap();
        match &self.gvisor {
            Ok(g) => g.teardown(task, &Self::paths(host, task)?),
            Err(_) => {
                let paths = host.paths(task);
                super::unmount_beneath(&paths.run_dir, &paths.disk_mount)
            }
        }
    }

    /// Stops a platform probe that runs.
    fn close(&self) {
        if let Ok(g) = &self.gvisor {
            g.stop();
        }
    }
}
