//! The `native` isolation backend: one sandbox per task from Linux
//! namespaces, an overlay root on the task's disk, cgroup limits and a
//! seccomp filter.
//!
//! Called from the daemon (blocking calls; run them off the async runtime).
//! Building the namespaces happens in the `__sandbox-start` helper process,
//! never in the daemon's own threads. The sandbox's init answers on the
//! control socket in the run directory ([`crate::proto`]).

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_core::{Isolation, TaskConfig};

use crate::backend::Backend;
use crate::connection::CommandConnection;
use crate::driver::{InitProcess, PortConnection, Prestarted, RunningCommand};
use crate::host::Host;
use cairn_image::Image;
use crate::process::spawn::{HelperReport, SandboxSpec};
use crate::proto::{self, ExecRequest, Reply, Request};
use crate::uidmap::IdRange;
use crate::{Error, Result};

/// The backend of native sandboxes; see [`Backend`].
#[derive(Debug, Default)]
pub(crate) struct Native;

impl Native {
    /// Starts the helper (the one started ahead for this task, if any) on
    /// the task's disk and cgroups, and waits for its report.
    fn start_on(host: &Host, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        let began = Instant::now();
        let paths = host.paths(task);
        let ids = IdRange::for_slot(slot)?;
        host.prepare_disk(task, config.limits.disk_bytes)?;
        let t_mount = began.elapsed();
        let cgroup = host.cgroups()?.create(task, &config.limits)?;
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
            None => host.spawn_helper(&[])?,
        };
        // The overlay's work directory needs inodes even on a full disk.
        host.release_spares(task);
        let report = run_helper(child, &spec)?;
        host.keep_spares(task);
        tracing::debug!(task, disk = ?t_mount, cgroup = ?t_cgroup, helper = ?began.elapsed(), "sandbox started");
        Ok(InitProcess { pid: report.init_pid, start_time: report.init_start_time })
    }
}

impl Backend for Native {
    fn isolation(&self) -> Isolation {
        Isolation::Native
    }

    fn uid_range(&self, slot: u32) -> Result<IdRange> {
        IdRange::for_slot(slot)
    }

    fn start(&self, host: &Host, task: &str, config: &TaskConfig, image: &Image, slot: u32, ahead: Option<Prestarted>) -> Result<InitProcess> {
        Native::start_on(host, task, config, image, slot, ahead)
    }

    fn ping(&self, host: &Host, task: &str) -> Result<i32> {
        let conn = connect(host, task)?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).map_err(Error::Control)?;
        proto::send(&conn, &Request::Ping, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Pong { pid }, _)) => Ok(pid),
            other => Err(Error::Protocol(format!("unexpected answer to ping: {other:?}"))),
        }
    }

    /// The init bound the port in the sandbox's network namespace (see
    /// `net`) and hands the socket over.
    fn proxy_listener(&self, host: &Host, task: &str) -> Result<TcpListener> {
        let conn = connect(host, task)?;
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

    fn connect_port(&self, host: &Host, task: &str, port: u16) -> Result<std::result::Result<PortConnection, String>> {
        let conn = connect(host, task)?;
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

    fn signal(&self, host: &Host, task: &str, pid: i32, signal: i32) -> Result<std::result::Result<(), String>> {
        let conn = connect(host, task)?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).map_err(Error::Control)?;
        proto::send(&conn, &Request::Signal { pid, signal }, &[])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Signalled, _)) => Ok(Ok(())),
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            other => Err(Error::Protocol(format!("unexpected answer to a signal: {other:?}"))),
        }
    }

    fn watch(&self, host: &Host, task: &str, path: &str, recursive: bool, out: RawFd) -> Result<std::result::Result<RunningCommand, String>> {
        let conn = connect(host, task)?;
        proto::send(&conn, &Request::Watch { path: path.to_owned(), recursive }, &[out])?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Started { pid }, _)) => Ok(Ok(RunningCommand { conn: CommandConnection::new(conn), pid, pty_master: None })),
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            Some((other, _)) => Err(Error::Protocol(format!("unexpected answer to a watch: {other:?}"))),
            None => Err(Error::NotRunning(task.to_owned())),
        }
    }

    fn exec(&self, host: &Host, task: &str, req: &ExecRequest, stdio: &[RawFd]) -> Result<std::result::Result<RunningCommand, String>> {
        let conn = connect(host, task)?;
        proto::send(&conn, &Request::Exec(req.clone()), stdio)?;
        match proto::recv::<Reply>(&conn)? {
            Some((Reply::Started { pid }, fds)) => {
                Ok(Ok(RunningCommand { conn: CommandConnection::new(conn), pid, pty_master: fds.into_iter().next() }))
            }
            Some((Reply::Failed { message, .. }, _)) => Ok(Err(message)),
            Some((other, _)) => Err(Error::Protocol(format!("unexpected answer to exec: {other:?}"))),
            None => Err(Error::NotRunning(task.to_owned())),
        }
    }

    fn open_root(&self, _host: &Host, task: &str, init: InitProcess) -> Result<OwnedFd> {
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
}

/// A connection to the sandbox's init.
fn connect(host: &Host, task: &str) -> Result<UnixStream> {
    let sock = host.paths(task).control_socket;
    UnixStream::connect(&sock).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => Error::NotRunning(task.to_owned()),
        _ => Error::Control(e),
    })
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

