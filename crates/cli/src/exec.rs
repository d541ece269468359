//! `cairn exec`: a command over the daemon's WebSocket, with its stdout and
//! stderr streamed separately as they come, stdin with `-i`, a pty with `-t`.

use std::io::{IsTerminal, Write};
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, bail, Result};
use futures_util::{SinkExt, StreamExt};
use cairn_api::exec::{ClientFrame, ExecStart, ServerFrame, WinSize};
use cairn_core::ExecExit;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{error_message, Client};

#[derive(Debug, Clone, Default)]
pub struct ExecArgs {
    pub task: String,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub timeout_ms: Option<u64>,
    pub stdin: bool,
    pub tty: bool,
    /// Take a `pre-risk` snapshot first.
    pub risky: bool,
    /// Run as this user instead of the task's.
    pub user: Option<String>,
}

/// A `pre-risk` snapshot the daemon took before the command.
#[derive(Debug, Clone)]
pub struct PreRisk {
    pub snapshot: String,
    pub reason: String,
}

/// How a command ended, as the daemon reported it.
#[derive(Debug, Clone)]
pub struct ExecResult {
    pub exit: ExecExit,
    /// With `oom_killed`: the task's memory limit.
    pub memory_limit: Option<String>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pre_risk: Option<PreRisk>,
}

impl ExecResult {
    pub fn code(&self) -> i32 {
        self.exit.exit_code
    }

    /// The exit frame as the daemon sent it (for `--json`).
    pub fn exit_frame(&self) -> ServerFrame {
        ServerFrame::Exit { exit: self.exit.clone(), memory_limit: self.memory_limit.clone() }
    }
}

/// Where output goes: straight to our stdout/stderr, or captured.
pub enum Sink {
    Terminal,
    Capture,
}

/// Puts the local terminal in raw mode for `-t`; restores it on drop.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enable() -> RawMode {
        let stdin = std::io::stdin();
        match nix::sys::termios::tcgetattr(stdin.as_fd()) {
            Ok(orig) => {
                let mut raw = orig.clone();
                nix::sys::termios::cfmakeraw(&mut raw);
                let _ = nix::sys::termios::tcsetattr(stdin.as_fd(), nix::sys::termios::SetArg::TCSANOW, &raw);
                RawMode(Some(orig))
            }
            Err(_) => RawMode(None),
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(orig) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin().as_fd(), nix::sys::termios::SetArg::TCSANOW, orig);
        }
    }
}

fn terminal_size() -> (u16, u16) {
    // SAFETY: winsize is plain old data; TIOCGWINSZ fills it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer for TIOCGWINSZ on stdout.
    if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
        (ws.ws_row, ws.ws_col)
    } else {
        (24, 80)
    }
}

pub async fn run(client: &Client, args: &ExecArgs, sink: Sink) -> Result<ExecResult> {
    let ws_url = format!("{}/v1/tasks/{}/exec", client.base.replacen("http", "ws", 1), args.task);
    let mut req = ws_url.as_str().into_client_request().map_err(|e| anyhow!("bad daemon url {ws_url}: {e}"))?;
    let h = req.headers_mut();
    h.insert("authorization", format!("Bearer {}", client.token).parse().map_err(|_| anyhow!("token is not a valid header"))?);
    h.insert("x-cairn-actor", client.actor().parse().map_err(|_| anyhow!("bad actor"))?);
    let (mut ws, _) = match tokio_tungstenite::connect_async_with_config(req, None, true).await {
        Ok(x) => x,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            bail!("{}", error_message(resp.status(), &body));
        }
        Err(tokio_tungstenite::tungstenite::Error::Io(e)) => {
            bail!("daemon not running at {} (start it with `cairn serve`): {e}", client.base)
        }
        Err(e) => bail!("cannot reach the daemon at {}: {e}", client.base),
    };
    let tty = args.tty.then(terminal_size);
    let start = ExecStart {
        argv: args.argv.clone(),
        env: args.env.clone(),
        workdir: args.workdir.clone(),
        stdin: args.stdin,
        tty: tty.map(|(rows, cols)| WinSize { rows, cols }),
        timeout_ms: args.timeout_ms,
        risky: args.risky,
        user: args.user.clone(),
    };
    ws.send(Message::Text(serde_json::to_string(&start)?.into())).await?;
    let _raw = if args.tty && matches!(sink, Sink::Terminal) { Some(RawMode::enable()) } else { None };

    let (mut tx, mut rx) = ws.split();
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    if args.stdin || args.tty {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = stdin_tx.send(Vec::new()).await;
                        break;
                    }
                    Ok(n) => {
                        if stdin_tx.send(buf[..n].to_vec()).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
    } else {
        drop(stdin_tx);
    }
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    let mut result = ExecResult { exit: ExecExit { exit_code: 1, signal: None, oom_killed: false, timed_out: false, duration_ms: 0 }, memory_limit: None, stdout: Vec::new(), stderr: Vec::new(), pre_risk: None };
    let mut stdin_open = args.stdin || args.tty;
    loop {
        tokio::select! {
            msg = rx.next() => {
                match msg {
                    Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                        let data = &b[1..];
                        match (b[0], &sink) {
                            (1, Sink::Terminal) => {
                                // The reader has gone (`cairn exec ... | head`): stop, as a local command would.
                                let mut o = std::io::stdout().lock();
                                if let Err(e) = o.write_all(data).and_then(|_| o.flush()) {
                                    crate::output::stdout_failed(e);
                                }
                            }
                            (2, Sink::Terminal) => { let mut e = std::io::stderr().lock(); let _ = e.write_all(data); let _ = e.flush(); }
                            (1, Sink::Capture) => result.stdout.extend_from_slice(data),
                            (2, Sink::Capture) => result.stderr.extend_from_slice(data),
                            _ => {}
                        }
                    }
                    Some(Ok(Message::Text(t))) => {
                        match serde_json::from_str::<ServerFrame>(&t) {
                            Ok(ServerFrame::Exit { exit, memory_limit }) => {
                                result.exit = exit;
                                result.memory_limit = memory_limit;
                                break;
                            }
                            Ok(ServerFrame::Error { error, .. }) => bail!("{error}"),
                            Ok(ServerFrame::PreRisk { snapshot, reason, .. }) => {
                                if matches!(sink, Sink::Terminal) {
                                    eprintln!("cairn: took pre-risk snapshot {snapshot} ({reason})");
                                }
                                result.pre_risk = Some(PreRisk { snapshot, reason });
                            }
                            Ok(ServerFrame::Started { .. }) => {}
                            Err(e) => bail!("the daemon sent a frame this client does not understand ({e}): {t}"),
                        }
                    }
                    Some(Ok(Message::Close(_))) | None => bail!("the daemon closed the connection before the command ended"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => bail!("connection to the daemon broke: {e}"),
                }
            }
            data = stdin_rx.recv(), if stdin_open => {
                match data {
                    Some(d) => {
                        let eof = d.is_empty();
                        let mut frame = vec![0u8];
                        frame.extend_from_slice(&d);
                        let _ = tx.send(Message::Binary(frame.into())).await;
                        if eof { stdin_open = false; }
                    }
                    None => stdin_open = false,
                }
            }
            _ = async { match winch.as_mut() { Some(w) => { w.recv().await; } None => std::future::pending().await } }, if args.tty => {
                let (rows, cols) = terminal_size();
                let frame = serde_json::to_string(&ClientFrame::Resize { rows, cols }).unwrap_or_default();
                let _ = tx.send(Message::Text(frame.into())).await;
            }
        }
    }
    let _ = tx.close().await;
    Ok(result)
}

/// Whether our stdin holds input now that a command run without `-i`
/// would not get: "a file" with bytes left to read, or "a pipe" (or
/// socket) with bytes waiting. `None` for a terminal, `/dev/null`, a
/// closed stdin and an empty pipe.
fn pending_stdin() -> Option<&'static str> {
    let stdin = std::io::stdin();
    let fd = stdin.as_fd();
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).ok()?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {
            let at = nix::unistd::lseek(fd.as_raw_fd(), 0, nix::unistd::Whence::SeekCur).ok()?;
            (at < st.st_size).then_some("a file")
        }
        libc::S_IFIFO | libc::S_IFSOCK => {
            let mut waiting: libc::c_int = 0;
            // SAFETY: FIONREAD writes one c_int through a valid pointer.
            let ok = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut waiting) } == 0;
            (ok && waiting > 0).then_some("a pipe")
        }
        _ => None,
    }
}

/// The line `cairn exec` prints to stderr when a command did not simply exit.
pub fn exit_note(r: &ExecResult) -> Option<String> {
    if r.exit.timed_out {
        return Some(format!("cairn: command timed out and was killed (exit {})", r.exit.exit_code));
    }
    if r.exit.oom_killed {
        return Some(format!("cairn: command was killed: out of memory (task limit {})", r.memory_limit.as_deref().unwrap_or("?")));
    }
    None
}

#[derive(clap::Args, Debug)]
pub(crate) struct ExecCli {
    pub(crate) task: String,
    /// An environment variable of this command, over the task's (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub(crate) env: Vec<String>,
    /// Where the command starts (default: the task's workdir).
    #[arg(long)]
    pub(crate) workdir: Option<String>,
    /// Kill the command after this long (e.g. 30s); exits 124.
    #[arg(long)]
    pub(crate) timeout: Option<String>,
    /// Pass stdin to the command.
    #[arg(short = 'i', long)]
    pub(crate) interactive: bool,
    /// Run the command on a pty.
    #[arg(short = 't', long)]
    pub(crate) tty: bool,
    /// Take a pre-risk snapshot before running the command.
    #[arg(long)]
    pub(crate) risky: bool,
    /// Run as this user (uid, uid:gid, name or name:group, looked up in the
    /// sandbox) instead of the task's (its image's User, else root).
    #[arg(long, value_name = "USER[:GROUP]")]
    pub(crate) user: Option<String>,
    /// Start the command in the background and print its handle (see
    /// `cairn process`); it runs on when this client goes. With -i its
    /// stdin stays open for `cairn process stdin`; with -t it gets a
    /// terminal of 24x80 (resized through the API).
    #[arg(short = 'd', long)]
    pub(crate) detach: bool,
    /// With --detach: a tag to find the command by.
    #[arg(long, requires = "detach")]
    pub(crate) tag: Option<String>,
    /// The command; without one, the task's default command runs (its
    /// image's Entrypoint and Cmd).
    #[arg(last = true)]
    pub(crate) argv: Vec<String>,
}

/// `cairn exec`: runs the command, streams it here, exits with its code.
pub(crate) async fn cli(client: &Client, a: ExecCli, json_out: bool) -> Result<u8> {
    let timeout_ms = a
        .timeout
        .as_deref()
        .map(|t| cairn_core::parse_duration(t).map(|d| d.as_millis() as u64))
        .transpose()?;
    let args = ExecArgs {
        task: a.task,
        argv: a.argv,
        env: a.env,
        workdir: a.workdir,
        timeout_ms,
        stdin: a.interactive,
        tty: a.tty,
        risky: a.risky,
        user: a.user,
    };
    if a.detach {
        let start = cairn_api::exec::ExecStart {
            argv: args.argv,
            env: args.env,
            workdir: args.workdir,
            timeout_ms: args.timeout_ms,
            risky: args.risky,
            user: args.user,
            stdin: args.stdin || args.tty,
            tty: args.tty.then_some(cairn_api::exec::WinSize { rows: 24, cols: 80 }),
        };
        let body = cairn_api::processes::StartProcess { start, tag: a.tag };
        let v: crate::client::Answer<cairn_api::processes::ProcessView> = client.post(&format!("/v1/tasks/{}/processes", args.task), &body).await?;
        crate::verbs::Out { json: json_out }.print(&v, |p| p.id.to_string());
        return Ok(0);
    }
    if args.tty && !std::io::stdin().is_terminal() {
        bail!("-t needs a terminal on stdin, and stdin is not one: drop -t (with -i the command still gets piped input)");
    }
    if !args.stdin {
        if let Some(what) = pending_stdin() {
            bail!("stdin is {what} with input waiting, which the command would not get: pass -i to give it to the command, or run with </dev/null");
        }
    }
    let r = run(client, &args, Sink::Terminal).await?;
    if let Some(note) = exit_note(&r) {
        eprintln!("{note}");
    }
    if !args.stdin {
        // Input that arrived while the command ran was not given to it:
        // say so rather than drop it silently.
        if let Some(what) = pending_stdin() {
            eprintln!("cairn: stdin is {what} whose input the command did not get (pass -i to give it)");
        }
    }
    if json_out {
        outln!("{}", serde_json::to_string(&r.exit_frame())?);
    }
    Ok(r.code().clamp(0, 255) as u8)
}
