//! One command in a task's sandbox, streamed as it runs over an
//! [`ExecChannel`] (the HTTP front end's WebSocket). Its frames are
//! [`cairn_api::exec`]; a client that goes away kills the command.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_core::{EnvVar, EventKind, ExecExit, NewEvent};
use cairn_sandbox::{CommandConnection, CommandExit, RunningCommand};
use cairn_sandbox::proto::{ExecRequest, WinSize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::admission::{Kind, Permit};
use crate::runtime::Runtime;
use crate::Error;

pub use cairn_api::exec::{STDERR, STDIN, STDOUT};

/// After the command exits, output still buffered (or held open by a
/// background child) is read for at most this long.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub use cairn_api::exec::ExecStart;
use cairn_api::exec::{ClientFrame, LiveOutput, ServerFrame};

/// What the runtime tells an exec's client: a frame, or output on a channel
/// ([`STDOUT`], [`STDERR`]).
#[derive(Debug)]
pub enum ExecOutput<'a> {
    Frame(&'a ServerFrame),
    Output(u8, &'a [u8]),
}

/// What an exec's client tells the runtime.
#[derive(Debug)]
pub enum ExecInput {
    /// Bytes for the command's stdin; empty is end of input.
    Stdin(Vec<u8>),
    /// A frame of [`ClientFrame`] (a terminal resize).
    Control(ClientFrame),
    /// Anything else, ignored.
    Other,
    /// The client went away: the command is killed.
    Gone,
}

/// The transport of one exec (a WebSocket, a plain HTTP request). `recv`
/// must be cancel-safe: it is raced against the command's output.
pub trait ExecChannel: Send {
    /// False when the client is gone.
    fn send(&mut self, out: ExecOutput<'_>) -> impl std::future::Future<Output = bool> + Send;
    fn recv(&mut self) -> impl std::future::Future<Output = ExecInput> + Send;
}

/// The full environment of a command: defaults, the proxy variables (when
/// the task has an allowlist), the task's (its image's under its own), the
/// exec's. `HOME` is `/root` for root; for another `user` the sandbox's init
/// sets it from `/etc/passwd` unless the task or the exec sets it.
pub(crate) fn environment(task: &cairn_core::TaskConfig, exec_env: &[String], hostname: &str, tty: bool, user: Option<&str>) -> Result<Vec<String>, Error> {
    let mut env: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
    if user.is_none_or(is_root) {
        env.push(("HOME".into(), "/root".into()));
    }
    env.extend([("HOSTNAME".into(), hostname.into()), ("LANG".into(), "C.UTF-8".into())]);
    if tty {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    let mut set = |k: String, v: String| match env.iter_mut().find(|(ek, _)| *ek == k) {
        Some(e) => e.1 = v,
        None => env.push((k, v)),
    };
    for (k, v) in crate::egress::proxy_environment(&task.egress).into_iter().chain(crate::intercept::trust_environment(&task.egress)) {
        set(k.to_owned(), v);
    }
    for e in &task.env {
        set(e.key.clone(), e.value.clone());
    }
    for s in exec_env {
        let e = EnvVar::parse(s)?;
        set(e.key, e.value);
    }
    Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// Whether a `user[:group]` is root, whose default environment is known.
fn is_root(user: &str) -> bool {
    matches!(user.split(':').next(), Some("0" | "root"))
}

/// What an exec runs: its own command as given (like `docker exec`), else
/// the task's default command, its image's `Entrypoint` and `Cmd`.
fn command_of(start: &ExecStart, task: &cairn_core::Task) -> Result<Vec<String>, Error> {
    if !start.argv.is_empty() {
        return Ok(start.argv.clone());
    }
    let default = task.config.default_command();
    if default.is_empty() {
        return Err(Error::invalid(format!(
            "no command given, and image {} has no Entrypoint or Cmd to run instead (usage: cairn exec ID -- CMD ARGS...)",
            task.config.image
        )));
    }
    Ok(default)
}

impl Runtime {
    /// Runs one command of the task to its end over `chan`. A high-risk
    /// command is preceded by a snapshot; the exit is logged. Admitted
    /// first, as [`Runtime::admit_exec`] does.
    pub async fn exec<C: ExecChannel>(self: &Arc<Self>, id: &str, actor: &str, start: ExecStart, chan: &mut C) -> Result<(), Error> {
        self.admit_exec(id).await?.exec(actor, start, chan).await
    }

    /// Lets an exec in before its transport is set up (a WebSocket
    /// upgraded, a stream of events begun), so that a refusal still has its
    /// own status: an unknown task, one that can never run a command again,
    /// or one past a bound of `[limits]` ([`Error::TooMany`]), checked
    /// before any pipe or connection is opened for it. The command itself
    /// is given to [`AdmittedExec::exec`].
    pub async fn admit_exec(self: &Arc<Self>, id_or_name: &str) -> Result<AdmittedExec, Error> {
        self.admission.precheck(Kind::Exec, id_or_name, &self.cells)?;
        let task = self.find(id_or_name).await?;
        if task.state.is_terminal() {
            task.state.check_exec()?;
        }
        let permit = self.admission.admit(Kind::Exec, &task.id, self.cells.of(&task.id))?;
        Ok(AdmittedExec { rt: self.clone(), task: id_or_name.to_owned(), permit })
    }
}

/// An exec [`Runtime::admit_exec`] let in, to run once its transport is up.
/// It holds its place among the task's and the daemon's commands until the
/// command has ended (or it is dropped unused).
#[derive(Debug)]
pub struct AdmittedExec {
    rt: Arc<Runtime>,
    task: String,
    permit: Permit,
}

impl AdmittedExec {
    /// [`Runtime::exec`] of the admitted task.
    pub async fn exec<C: ExecChannel>(self, actor: &str, start: ExecStart, chan: &mut C) -> Result<(), Error> {
        let AdmittedExec { rt, task, permit } = self;
        let result = run(&rt, &task, actor, start, chan).await;
        drop(permit);
        result
    }
}

/// Why a command takes a pre-risk snapshot: the pattern as written (not
/// debug-quoted, which doubled every backslash of a regex), or `--risky`.
fn risk_reason(matched: Option<&str>) -> String {
    match matched {
        Some(p) => format!("matches high-risk pattern `{p}`"),
        None => "--risky".to_owned(),
    }
}

async fn run<C: ExecChannel>(tasks: &Arc<Runtime>, id: &str, actor: &str, start: ExecStart, ws: &mut C) -> Result<(), Error> {
    if let Some(u) = &start.user {
        cairn_core::check_user(u)?;
    }
    let t0 = Instant::now();
    let (task, _live) = tasks.running(id, actor).await?;
    let t_found = t0.elapsed();
    let argv = command_of(&start, &task)?;
    let workdir = start.workdir.clone().unwrap_or_else(|| task.config.workdir.clone());
    cairn_core::check_workdir(&workdir)?;
    let user = start.user.clone().or_else(|| task.config.user.clone());
    let env = environment(&task.config, &start.env, task.id.as_str(), start.tty.is_some(), user.as_deref())?;
    let matched = tasks.risky_match(&task, &argv)?;
    if start.risky || matched.is_some() {
        let reason = risk_reason(matched.as_deref());
        let cmd: String = argv.join(" ").chars().take(200).collect();
        let req = crate::snapshot::SnapshotRequest {
            kind: Some("pre-risk".into()),
            note: Some(format!("before `{cmd}` ({reason})")),
            ..Default::default()
        };
        let snap = tasks.snapshot(task.id.as_str(), req, actor).await?;
        let frame = ServerFrame::PreRisk { snapshot: snap.id.to_string(), reason, freeze_ms: snap.freeze_ms };
        let _ = ws.send(ExecOutput::Frame(&frame)).await;
    }
    let step = tasks.store.bump_step(&task.id).await?;
    // Running from here on: an idle suspend must wait for it to end.
    let _busy = tasks.mark_busy(&task.id);
    let t_step = t0.elapsed();
    let begun = Instant::now();
    let oom_before = tasks.driver.oom_kills(task.id.as_str()).await.unwrap_or(0);

    let tty = start.tty.map(|t| WinSize { rows: t.rows, cols: t.cols });
    let req = ExecRequest { argv: argv.clone(), env, cwd: workdir.clone(), tty, user: user.clone() };
    let io = Stdio::new(start.stdin, start.tty.is_some()).map_err(|e| Error::internal_from(e).context("pipes"))?;
    let started = tasks.driver.exec(task.id.as_str(), req, io.child_fds()).await?;
    let mut io = io.parent_side();
    let t_started = t0.elapsed();
    let mut args = json!({ "argv": argv, "workdir": workdir, "tty": start.tty.is_some(), "step": step });
    if let Some(u) = &user {
        args["user"] = json!(u);
    }
    if let Some(t) = start.timeout_ms {
        args["timeout_ms"] = json!(t);
    }

    let outcome = match started {
        Err(message) => {
            let _ = ws.send(ExecOutput::Output(STDERR, format!("cairn: {message}\n").as_bytes())).await;
            args["error"] = json!(message);
            ExecExit { exit_code: 127, signal: None, oom_killed: false, timed_out: false, duration_ms: 0 }
        }
        Ok(cmd) => {
            let _ = ws.send(ExecOutput::Frame(&ServerFrame::Started { step })).await;
            let signaller = Signaller { driver: tasks.driver.clone(), task: task.id.to_string() };
            let mut teed = Teed { inner: ws, watchers: tasks.cells.of(&task.id).output(), step };
            teed.tell(LiveOutput::Started { step, argv: argv.clone() });
            let (code, signal, timed_out) = pump(cmd, &mut io, &mut teed, start.timeout_ms, signaller).await;
            // Any OOM kill in the task's cgroup while the command ran counts:
            // a shell reports its killed child as exit 137, not as a signal.
            let oom_killed = tasks.driver.oom_kills(task.id.as_str()).await.unwrap_or(0) > oom_before;
            let exit_code = if timed_out {
                ExecExit::TIMEOUT_CODE
            } else {
                code.unwrap_or_else(|| 128 + signal.unwrap_or(0))
            };
            ExecExit { exit_code, signal, oom_killed, timed_out, duration_ms: 0 }
        }
    };
    let outcome = ExecExit { duration_ms: begun.elapsed().as_millis() as u64, ..outcome };
    let _ = tasks.cells.of(&task.id).output().send(LiveOutput::Exited { step, exit_code: outcome.exit_code });
    tasks.metrics.exec_seconds.observe(begun.elapsed().as_secs_f64());
    let t_done = t0.elapsed();
    args["signal"] = json!(outcome.signal);
    args["oom_killed"] = json!(outcome.oom_killed);
    args["timed_out"] = json!(outcome.timed_out);
    // The end of a command counts as activity, recorded with its event while
    // the task still counts as busy: the idle suspender measures from here,
    // not from the command's start.
    tasks
        .store
        .end_command(&NewEvent {
            task: task.id.clone(),
            kind: EventKind::Exec,
            actor: actor.to_owned(),
            args,
            exit_code: Some(outcome.exit_code),
            duration_ms: Some(outcome.duration_ms),
        })
        .await?;
    tracing::debug!(found = ?t_found, step = ?t_step, started = ?t_started, done = ?t_done, logged = ?t0.elapsed(), "exec timings");
    let memory_limit = outcome.oom_killed.then(|| cairn_core::Bytes(task.config.limits.memory_bytes).to_string());
    let _ = ws.send(ExecOutput::Frame(&ServerFrame::Exit { exit: outcome, memory_limit })).await;
    Ok(())
}

/// The command's standard streams: pipes, or a pty the init allocates.
struct Stdio {
    stdin_child: Option<OwnedFd>,
    stdin_parent: Option<OwnedFd>,
    out: Option<(OwnedFd, OwnedFd)>,
    err: Option<(OwnedFd, OwnedFd)>,
}

struct ParentIo {
    stdin: Option<pipe::Sender>,
    out: Option<pipe::Receiver>,
    err: Option<pipe::Receiver>,
}

impl Stdio {
    fn new(stdin: bool, tty: bool) -> std::io::Result<Stdio> {
        if tty {
            return Ok(Stdio { stdin_child: None, stdin_parent: None, out: None, err: None });
        }
        let (stdin_child, stdin_parent) = if stdin {
            let (r, w) = std::io::pipe()?;
            (Some(OwnedFd::from(r)), Some(OwnedFd::from(w)))
        } else {
            (Some(std::fs::File::open("/dev/null")?.into()), None)
        };
        let (or, ow) = std::io::pipe()?;
        let (er, ew) = std::io::pipe()?;
        Ok(Stdio { stdin_child, stdin_parent, out: Some((or.into(), ow.into())), err: Some((er.into(), ew.into())) })
    }

    fn child_fds(&self) -> Vec<std::os::fd::RawFd> {
        match (&self.stdin_child, &self.out, &self.err) {
            (Some(i), Some((_, o)), Some((_, e))) => vec![i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()],
            _ => Vec::new(),
        }
    }

    /// Drops the child's ends (the init holds its own copies now).
    fn parent_side(self) -> ParentIo {
        ParentIo {
            stdin: self.stdin_parent.and_then(|fd| pipe::Sender::from_owned_fd(fd).ok()),
            out: self.out.and_then(|(r, _)| pipe::Receiver::from_owned_fd(r).ok()),
            err: self.err.and_then(|(r, _)| pipe::Receiver::from_owned_fd(r).ok()),
        }
    }
}

/// Moves bytes until the command exits (then drains briefly). Returns the
/// exit code or signal, and whether the timeout stopped it.
async fn pump<C: ExecChannel>(cmd: RunningCommand, io: &mut ParentIo, ws: &mut C, timeout_ms: Option<u64>, signaller: Signaller) -> (Option<i32>, Option<i32>, bool) {
    let RunningCommand { conn, pty_master, pid } = cmd;
    let _ = conn.set_nonblocking(true);
    // SAFETY: the connection owns its socket for as long as it lives, and
    // its `as_raw_fd` is always that socket's descriptor.
    let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(conn, tokio::io::Interest::READABLE) };
    let Ok(mut conn) = registered else { return (None, None, false) };
    let mut pty_out = None;
    let mut pty_in = None;
    let mut pty_fd = None;
    if let Some(m) = pty_master {
        pty_fd = Some(m.as_raw_fd());
        let dup = m.try_clone().ok();
        // The _unchecked constructors only skip the FIFO type check; a pty
        // master is pollable like a pipe.
        pty_out = pipe::Receiver::from_owned_fd_unchecked(m).ok();
        pty_in = dup.and_then(|d| pipe::Sender::from_owned_fd_unchecked(d).ok());
    }
    let deadline = timeout_ms.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let mut out_buf = vec![0u8; 64 * 1024];
    let mut err_buf = vec![0u8; 64 * 1024];
    let mut pty_buf = vec![0u8; 64 * 1024];
    let mut exited: Option<(Option<i32>, Option<i32>)> = None;
    let mut drain_until = None;
    let mut client_gone = false;
    loop {
        if exited.is_some() && (io.out.is_none() && io.err.is_none() && pty_out.is_none()) {
            break;
        }
        if client_gone && exited.is_none() {
            // Closing the control connection kills the command's group.
            return (None, Some(libc::SIGKILL), false);
        }
        tokio::select! {
            r = read_exit(&mut conn), if exited.is_none() => {
                exited = Some(match r {
                    Some(CommandExit { code, signal }) => (code, signal),
                    None => (None, Some(libc::SIGKILL)),
                });
                drain_until = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            }
            n = read_some(&mut io.out, &mut out_buf), if io.out.is_some() => {
                if !forward(ws, STDOUT, &out_buf, n, &mut io.out).await { client_gone = true; }
            }
            n = read_some(&mut io.err, &mut err_buf), if io.err.is_some() => {
                if !forward(ws, STDERR, &err_buf, n, &mut io.err).await { client_gone = true; }
            }
            n = read_some(&mut pty_out, &mut pty_buf), if pty_out.is_some() => {
                // A pty merges both streams; EIO means the last writer closed.
                if !forward(ws, STDOUT, &pty_buf, n, &mut pty_out).await { client_gone = true; }
            }
            msg = ws.recv(), if !client_gone => {
                match msg {
                    ExecInput::Stdin(b) => {
                        let data = &b[..];
                        let sink: Option<&mut pipe::Sender> = io.stdin.as_mut().or(pty_in.as_mut());
                        if data.is_empty() {
                            if pty_in.is_some() {
                                // EOF on a terminal is ^D.
                                if let Some(p) = pty_in.as_mut() { let _ = p.write_all(&[4]).await; }
                            } else {
                                io.stdin = None;
                            }
                        } else if let Some(s) = sink {
                            if s.write_all(data).await.is_err() { io.stdin = None; }
                        }
                    }
                    ExecInput::Control(ClientFrame::Resize { rows, cols }) => {
                        if let Some(fd) = pty_fd {
                            cairn_sandbox::set_winsize(fd, WinSize { rows, cols });
                        }
                    }
                    ExecInput::Control(ClientFrame::Signal { signal }) => {
                        // KILL is the control connection's own way; the
                        // others go to the command, which may handle them.
                        if signal == libc::SIGKILL {
                            client_gone = true;
                        } else if cairn_api::exec::SIGNALS.contains(&signal) {
                            signaller.send(pid, signal);
                        }
                    }
                    ExecInput::Other => {}
                    ExecInput::Gone => { client_gone = true; }
                }
            }
            _ = sleep_until(deadline), if exited.is_none() && deadline.is_some() => {
                drop(conn);
                return (None, Some(libc::SIGKILL), true);
            }
            _ = sleep_until(drain_until), if drain_until.is_some() => {
                break;
            }
        }
    }
    let (code, signal) = exited.unwrap_or((None, None));
    (code, signal, false)
}

/// The exec's channel, with its output also told to whoever watches the
/// task (only while someone does: a send without watchers costs nothing).
struct Teed<'a, C> {
    inner: &'a mut C,
    watchers: tokio::sync::broadcast::Sender<LiveOutput>,
    step: u64,
}

impl<C> Teed<'_, C> {
    fn tell(&self, out: LiveOutput) {
        if self.watchers.receiver_count() > 0 {
            let _ = self.watchers.send(out);
        }
    }
}

impl<C: ExecChannel> ExecChannel for Teed<'_, C> {
    fn send(&mut self, out: ExecOutput<'_>) -> impl std::future::Future<Output = bool> + Send {
        if let ExecOutput::Output(channel, bytes) = &out {
            let stream = if *channel == STDERR { "stderr" } else { "stdout" };
            self.tell(LiveOutput::Output { step: self.step, stream: stream.to_owned(), text: String::from_utf8_lossy(bytes).into_owned() });
        }
        self.inner.send(out)
    }

    fn recv(&mut self) -> impl std::future::Future<Output = ExecInput> + Send {
        self.inner.recv()
    }
}

/// Sends signals to a running command through the driver; a failure is
/// logged (the command may have just ended).
struct Signaller {
    driver: crate::driver::Driver,
    task: String,
}

impl Signaller {
    fn send(&self, pid: i32, signal: i32) {
        self.driver.signal(&self.task, pid, signal);
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn read_some(r: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Sends what was read; closes the stream on EOF or error. False when the
/// client is gone.
async fn forward<C: ExecChannel>(ws: &mut C, channel: u8, buf: &[u8], n: std::io::Result<usize>, stream: &mut Option<pipe::Receiver>) -> bool {
    match n {
        Ok(0) | Err(_) => {
            *stream = None;
            true
        }
        Ok(n) => ws.send(ExecOutput::Output(channel, &buf[..n])).await,
    }
}

/// The command's end, as its connection tells it, without blocking the
/// runtime; none when the connection ended without telling it.
async fn read_exit(conn: &mut tokio::io::unix::AsyncFd<CommandConnection>) -> Option<CommandExit> {
    loop {
        let mut ready = conn.readable_mut().await.ok()?;
        if let Ok(end) = ready.try_io(|c| c.get_mut().try_exit()) {
            return end.ok().flatten();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn risky_patterns_print_as_written() {
        assert_eq!(risk_reason(Some(r"\brm\s+-rf\b")), r"matches high-risk pattern `\brm\s+-rf\b`");
        assert_eq!(risk_reason(None), "--risky");
    }

    #[test]
    fn environment_layers_defaults_task_and_exec() {
        let mut task = cairn_core::TaskConfig {
            env: vec![EnvVar::parse("A=task").unwrap(), EnvVar::parse("PATH=/opt/bin").unwrap()],
            ..Default::default()
        };
        let env = environment(&task, &["A=exec".into(), "B=2".into()], "t1", true, None).unwrap();
        assert!(env.contains(&"A=exec".to_owned()) && env.contains(&"B=2".to_owned()));
        assert!(env.contains(&"PATH=/opt/bin".to_owned()) && env.contains(&"HOSTNAME=t1".to_owned()));
        assert!(env.contains(&"TERM=xterm-256color".to_owned()));
        assert!(!env.iter().any(|e| e.starts_with("HTTP_PROXY=")), "offline task gets no proxy: {env:?}");
        assert!(environment(&cairn_core::TaskConfig::default(), &["bad".into()], "t1", false, None).is_err());
        task.egress.allow = vec!["packages.example.com".into()];
        let env = environment(&task, &["NO_PROXY=*".into()], "t1", false, None).unwrap();
        assert!(env.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_owned()), "{env:?}");
        assert!(env.contains(&"NO_PROXY=*".to_owned()), "an exec's own variables win: {env:?}");
    }

    #[test]
    fn home_is_roots_only_for_root() {
        let task = cairn_core::TaskConfig::default();
        for root in [None, Some("0"), Some("root"), Some("0:0")] {
            let env = environment(&task, &[], "t1", false, root).unwrap();
            assert!(env.contains(&"HOME=/root".to_owned()), "{root:?}: {env:?}");
        }
        // Another user's HOME comes from the sandbox's /etc/passwd...
        let env = environment(&task, &[], "t1", false, Some("1000:1000")).unwrap();
        assert!(!env.iter().any(|e| e.starts_with("HOME=")), "{env:?}");
        // ...unless the exec sets it.
        let env = environment(&task, &["HOME=/h".into()], "t1", false, Some("app")).unwrap();
        assert!(env.contains(&"HOME=/h".to_owned()), "{env:?}");
    }

    #[test]
    fn an_exec_without_a_command_runs_the_images_entrypoint_and_cmd() {
        let mut task = cairn_core::Task::new(cairn_core::TaskId::random(), None, cairn_core::TaskConfig::default(), 0);
        let given = ExecStart { argv: vec!["ls".into()], ..Default::default() };
        let none = ExecStart::default();
        // Without a default command, an empty exec is refused in one line.
        let e = command_of(&none, &task).unwrap_err().to_string();
        assert!(e.contains("no command given") && e.contains("image host") && !e.contains('\n'), "{e}");
        assert_eq!(command_of(&given, &task).unwrap(), ["ls"]);
        task.config.entrypoint = vec!["/bin/sh".into(), "-c".into()];
        task.config.cmd = vec!["echo from-cmd".into()];
        assert_eq!(command_of(&none, &task).unwrap(), ["/bin/sh", "-c", "echo from-cmd"]);
        // A command given runs as given, as `docker exec` does: no Entrypoint.
        assert_eq!(command_of(&given, &task).unwrap(), ["ls"]);
    }
}
