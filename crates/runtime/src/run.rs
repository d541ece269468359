//! A command run over plain requests (`POST /v1/tasks/{id}/exec`, the SDK,
//! MCP): a [`RunRequest`] checked into the runtime's exec start, its stdin
//! given once, and the output kept up to [`RUN_OUTPUT_CAP`] for the answer.

use std::sync::Arc;

use cairn_api::exec::{ExecStart, RunAnswer, RunRequest, ServerFrame, RUN_OUTPUT_CAP, STDERR, STDOUT};
use cairn_core::ExecExit;

use crate::exec::{AdmittedExec, ExecChannel, ExecInput, ExecOutput};
use crate::runtime::Runtime;
use crate::Error;

/// Longest timeout a run may ask for.
const MAX_TIMEOUT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// The exec start of a run, and the stdin it gives; bad requests are
/// [`Error::Invalid`] with one line naming what was wrong.
pub(crate) fn start_of(req: RunRequest) -> Result<(ExecStart, RunStdin), Error> {
    // An empty cmd runs the task's default command; the exec refuses it
    // when the task has none.
    let timeout_ms = match req.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECS => Some((t * 1000.0).ceil() as u64),
        Some(t) => return Err(Error::invalid(format!("timeout must be a number of seconds above 0 and at most a week, not {t}"))),
    };
    if let Some(k) = req.env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        return Err(Error::invalid(format!("env name {k:?} is not a variable name")));
    }
    let start = ExecStart {
        argv: req.cmd,
        env: req.env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        workdir: req.cwd,
        stdin: req.stdin.is_some(),
        tty: None,
        timeout_ms,
        risky: false,
        user: req.user,
    };
    Ok((start, RunStdin::new(req.stdin.map(String::into_bytes))))
}

/// What a run's client gives: its stdin once, then end of input, then
/// nothing more.
#[derive(Debug, Default)]
pub struct RunStdin {
    data: Option<Vec<u8>>,
    closed: bool,
}

impl RunStdin {
    pub fn new(data: Option<Vec<u8>>) -> RunStdin {
        RunStdin { data, closed: false }
    }

    pub async fn next(&mut self) -> ExecInput {
        if let Some(data) = self.data.take().filter(|d| !d.is_empty()) {
            return ExecInput::Stdin(data);
        }
        if !self.closed {
            self.closed = true;
            return ExecInput::Stdin(Vec::new());
        }
        std::future::pending().await
    }
}

/// A run as the exec channel: output kept up to the cap.
#[derive(Default)]
struct Collect {
    stdin: RunStdin,
    out: [Vec<u8>; 2],
    truncated: bool,
    exit: Option<ExecExit>,
}

impl ExecChannel for Collect {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        match out {
            ExecOutput::Output(channel @ (STDOUT | STDERR), data) => {
                let buf = &mut self.out[usize::from(channel == STDERR)];
                let room = RUN_OUTPUT_CAP.saturating_sub(buf.len());
                self.truncated |= data.len() > room;
                buf.extend_from_slice(&data[..data.len().min(room)]);
            }
            ExecOutput::Frame(ServerFrame::Exit { exit, .. }) => self.exit = Some(exit.clone()),
            _ => {}
        }
        true
    }

    async fn recv(&mut self) -> ExecInput {
        self.stdin.next().await
    }
}

/// The answer of a run that ended with `exit`.
pub fn answer(exit: ExecExit, stdout: &[u8], stderr: &[u8], truncated: bool) -> RunAnswer {
    RunAnswer {
        exit_code: exit.exit_code,
        stdout: String::from_utf8_lossy(stdout).into_owned(),
        stderr: String::from_utf8_lossy(stderr).into_owned(),
        signal: exit.signal,
        oom_killed: exit.oom_killed,
        timed_out: exit.timed_out,
        duration_ms: exit.duration_ms,
        truncated,
    }
}

impl Runtime {
    /// Runs `req` in the task to its end and answers its exit and output.
    pub async fn run(self: &Arc<Self>, id: &str, actor: &str, req: RunRequest) -> Result<RunAnswer, Error> {
        let (start, stdin) = start_of(req)?;
        let mut chan = Collect { stdin, ..Default::default() };
        self.exec(id, actor, start, &mut chan).await?;
        let exit = chan.exit.ok_or_else(|| Error::internal("the command ended without an exit status"))?;
        Ok(answer(exit, &chan.out[0], &chan.out[1], chan.truncated))
    }

    /// Checks `req` and lets its run in before the stream of its output
    /// begins, as [`Runtime::admit_exec`] does; answers the run, and the
    /// stdin the caller's channel is to give it.
    pub async fn admit_run(self: &Arc<Self>, id_or_name: &str, req: RunRequest) -> Result<(AdmittedRun, RunStdin), Error> {
        let (start, stdin) = start_of(req)?;
        let exec = self.admit_exec(id_or_name).await?;
        Ok((AdmittedRun { exec, start }, stdin))
    }
}

/// A run [`Runtime::admit_run`] let in, to run over the caller's channel.
#[derive(Debug)]
pub struct AdmittedRun {
    exec: AdmittedExec,
    start: ExecStart,
}

impl AdmittedRun {
    /// Runs the command to its end over `chan` (see [`Runtime::exec`]).
    pub async fn exec<C: ExecChannel>(self, actor: &str, chan: &mut C) -> Result<(), Error> {
        self.exec.exec(actor, self.start, chan).await
    }
}
