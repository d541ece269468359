//! `process.Process`: commands in the sandbox, as Cairn's background
//! commands ([`cairn_runtime::processes`]). A command's `pid` is its
//! handle, unique in the daemon. A client that drops a stream leaves the
//! command running; `SendSignal` sends `SIGTERM` to the command's process
//! group (the command may handle it), and `SIGKILL` kills the group.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use cairn_api::exec::{ExecStart, STDERR};
use cairn_runtime::processes::{Follower, Process, ProcessEvent, ProcessSelector};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use crate::connect::{self, StreamSender};
use crate::envd::Ctx;
use crate::E2bError;

pub(crate) fn routes() -> Router<Ctx> {
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect_to))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PtySize {
    cols: u16,
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Pty {
    size: Option<PtySize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// `{"pid": N}` or `{"tag": "..."}`; protobuf's JSON may write the number
/// as a string.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selector {
    pid: Option<serde_json::Value>,
    tag: Option<String>,
}

impl Selector {
    fn resolve(&self) -> Result<ProcessSelector, E2bError> {
        if let Some(tag) = &self.tag {
            return Ok(ProcessSelector::Tag(tag.clone()));
        }
        let pid = match &self.pid {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        match pid.and_then(|p| u32::try_from(p).ok()) {
            Some(p) => Ok(ProcessSelector::Id(p)),
            None => Err(E2bError::bad_request("the request names no process: give a pid or a tag")),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConnectRequest {
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

impl Input {
    fn bytes(&self) -> Result<Vec<u8>, E2bError> {
        let data = self.stdin.as_deref().or(self.pty.as_deref()).unwrap_or("");
        B64.decode(data).map_err(|e| E2bError::bad_request(format!("input is not base64: {e}")))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputRequest {
    process: Selector,
    input: Input,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignalRequest {
    process: Selector,
    signal: serde_json::Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

/// `Keepalive-Ping-Interval` (seconds): how often an idle stream says so.
pub(crate) fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get("keepalive-ping-interval")?.to_str().ok()?.trim().parse().ok()?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// `Connect-Timeout-Ms`: the command is killed when it runs out.
fn timeout_ms(headers: &HeaderMap) -> Option<u64> {
    headers.get("connect-timeout-ms")?.to_str().ok()?.trim().parse().ok().filter(|&ms| ms > 0)
}

async fn start(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let started = async {
        let task = ctx.authorized(&headers)?;
        let req: StartRequest = connect::stream_request("Start", &body)?;
        if req.process.cmd.is_empty() {
            return Err(E2bError::bad_request("Start: the process has no cmd"));
        }
        let tty = req.pty.as_ref().map(|p| {
            let size = p.size.as_ref();
            cairn_api::exec::WinSize { rows: size.map_or(24, |s| s.rows.max(1)), cols: size.map_or(80, |s| s.cols.max(1)) }
        });
        let start = ExecStart {
            argv: std::iter::once(req.process.cmd.clone()).chain(req.process.args.iter().cloned()).collect(),
            env: req.process.envs.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            workdir: req.process.cwd.clone().filter(|c| !c.is_empty()),
            stdin: req.stdin.unwrap_or(true),
            tty,
            timeout_ms: timeout_ms(&headers),
            risky: false,
            user: Ctx::user(&headers),
        };
        let pty = start.tty.is_some();
        let (process, follower) = ctx.rt.start_process(task, "e2b", start, req.tag).await?;
        Ok::<_, E2bError>((process, follower, pty))
    }
    .await;
    match started {
        Ok((process, follower, pty)) => follow(process, follower, pty, keepalive(&headers)).await,
        Err(e) => connect::stream_error(e).await,
    }
}

async fn connect_to(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let found = async {
        let task = ctx.authorized(&headers)?;
        let req: ConnectRequest = connect::stream_request("Connect", &body)?;
        let process = ctx.rt.process(task, &req.process.resolve()?).await?;
        Ok::<_, E2bError>(process)
    }
    .await;
    match found {
        Ok(process) => {
            let follower = process.follow();
            let pty = process.start.tty.is_some();
            follow(process, follower, pty, keepalive(&headers)).await
        }
        Err(e) => connect::stream_error(e).await,
    }
}

/// Streams a command's events as `ProcessEvent`s until it ends (or the
/// client goes away, which leaves it running).
async fn follow(process: std::sync::Arc<Process>, follower: Follower, pty: bool, keepalive: Option<Duration>) -> Response {
    let (response, sender) = connect::stream_response();
    tokio::spawn(async move {
        let Follower { so_far, mut live } = follower;
        let mut sent_start = false;
        for event in so_far {
            match forward(&sender, &process, event, pty, &mut sent_start).await {
                Step::Go => {}
                Step::Stop(end) => return finish(sender, end).await,
            }
        }
        loop {
            let next = match keepalive {
                Some(every) => match tokio::time::timeout(every, live.recv()).await {
                    Ok(r) => r,
                    Err(_) => {
                        if !sender.send(&json!({ "event": { "keepalive": {} } })).await {
                            return;
                        }
                        continue;
                    }
                },
                None => live.recv().await,
            };
            let event = match next {
                Ok(e) => e,
                Err(RecvError::Lagged(n)) => {
                    let e = E2bError::new(axum::http::StatusCode::TOO_MANY_REQUESTS, format!("the client fell {n} events behind command {}; reconnect to follow it", process.id));
                    return finish(sender, Some(e)).await;
                }
                Err(RecvError::Closed) => return finish(sender, None).await,
            };
            match forward(&sender, &process, event, pty, &mut sent_start).await {
                Step::Go => {}
                Step::Stop(end) => return finish(sender, end).await,
            }
        }
    });
    response
}

enum Step {
    Go,
    /// The stream ends, with this error if any.
    Stop(Option<E2bError>),
}

async fn finish(sender: StreamSender, error: Option<E2bError>) {
    sender.end(error.as_ref()).await
}

async fn forward(sender: &StreamSender, process: &Process, event: ProcessEvent, pty: bool, sent_start: &mut bool) -> Step {
    if !*sent_start && !matches!(event, ProcessEvent::Failed(_)) {
        *sent_start = true;
        if !sender.send(&json!({ "event": { "start": { "pid": process.id } } })).await {
            return Step::Stop(None);
        }
        if matches!(event, ProcessEvent::Started { .. }) {
            return Step::Go;
        }
    }
    let message = match event {
        ProcessEvent::Started { .. } => return Step::Go,
        ProcessEvent::Output { channel, data } => {
            let stream = if pty {
                "pty"
            } else if channel == STDERR {
                "stderr"
            } else {
                "stdout"
            };
            json!({ "event": { "data": { stream: B64.encode(&data) } } })
        }
        ProcessEvent::Ended(exit) => {
            if exit.timed_out {
                return Step::Stop(Some(E2bError::new(
                    axum::http::StatusCode::GATEWAY_TIMEOUT,
                    format!("command {} ran past its timeout and was killed", process.id),
                )));
            }
            let end = match exit.signal {
                Some(sig) => json!({ "exitCode": -1, "exited": false, "status": format!("signal: {}", signal_name(sig)), "error": format!("signal: {}", signal_name(sig)) }),
                None if exit.exit_code == 0 => json!({ "exitCode": 0, "exited": true, "status": "exit status 0" }),
                None => json!({ "exitCode": exit.exit_code, "exited": true, "status": format!("exit status {}", exit.exit_code), "error": format!("exit status {}", exit.exit_code) }),
            };
            // The stream ends after the end event, delivered or not.
            sender.send(&json!({ "event": { "end": end } })).await;
            return Step::Stop(None);
        }
        ProcessEvent::Failed(message) => return Step::Stop(Some(E2bError::new(axum::http::StatusCode::BAD_REQUEST, message))),
    };
    if sender.send(&message).await {
        Step::Go
    } else {
        Step::Stop(None)
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        6 => "aborted",
        11 => "segmentation fault",
        13 => "broken pipe",
        _ => "signal",
    }
}

async fn list(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let listed = async {
        let task = ctx.authorized(&headers)?;
        let _: serde_json::Value = connect::unary_request("List", &headers, &body)?;
        let processes = ctx.rt.processes(task).await?;
        let entries: Vec<_> = processes
            .iter()
            .filter(|p| !p.has_ended())
            .map(|p| {
                let (cmd, args) = p.start.argv.split_first().map(|(c, a)| (c.clone(), a.to_vec())).unwrap_or_default();
                let envs: BTreeMap<String, String> =
                    p.start.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
                let config = ProcessConfig { cmd, args, envs, cwd: p.start.workdir.clone() };
                let mut info = json!({ "config": config, "pid": p.id });
                if let Some(t) = &p.tag {
                    info["tag"] = json!(t);
                }
                info
            })
            .collect();
        Ok::<_, E2bError>(json!({ "processes": entries }))
    }
    .await;
    unary(listed)
}

fn unary(result: Result<serde_json::Value, E2bError>) -> Response {
    match result {
        Ok(v) => connect::unary_response(&v),
        Err(e) => e.connect_response(),
    }
}

async fn send_input(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let sent = async {
        let task = ctx.authorized(&headers)?;
        let req: SendInputRequest = connect::unary_request("SendInput", &headers, &body)?;
        let data = req.input.bytes()?;
        let process = ctx.rt.process(task, &req.process.resolve()?).await?;
        if !data.is_empty() {
            process.write_stdin(data)?;
        }
        Ok::<_, E2bError>(json!({}))
    }
    .await;
    unary(sent)
}

/// Client streaming: `start` names the process, then `data` events carry
/// its input. Read as the envelopes arrive.
async fn stream_input(State(ctx): State<Ctx>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let streamed = async {
        let task = ctx.authorized(&headers)?.to_owned();
        let mut frames = body.into_data_stream();
        let mut buffer = Vec::new();
        let mut process: Option<std::sync::Arc<Process>> = None;
        while let Some(chunk) = futures_util::StreamExt::next(&mut frames).await {
            let chunk = chunk.map_err(|e| E2bError::bad_request(format!("StreamInput: the request body broke off: {e}")))?;
            buffer.extend_from_slice(&chunk);
            loop {
                let mut rest = buffer.as_slice();
                let Some((flags, message)) = complete_envelope(&mut rest)? else { break };
                let consumed = buffer.len() - rest.len();
                if flags & 0x02 == 0 {
                    let event: serde_json::Value = serde_json::from_slice(message).map_err(|e| E2bError::bad_request(format!("StreamInput: malformed message: {e}")))?;
                    if let Some(start) = event.get("start") {
                        let selector: Selector = serde_json::from_value(start.get("process").cloned().unwrap_or_default()).map_err(|e| E2bError::bad_request(format!("StreamInput: {e}")))?;
                        process = Some(ctx.rt.process(&task, &selector.resolve()?).await?);
                    } else if let Some(data) = event.get("data") {
                        let input: Input = serde_json::from_value(data.get("input").cloned().unwrap_or_default()).map_err(|e| E2bError::bad_request(format!("StreamInput: {e}")))?;
                        let p = process.as_ref().ok_or_else(|| E2bError::bad_request("StreamInput: data before the start event"))?;
                        let bytes = input.bytes()?;
                        if !bytes.is_empty() {
                            p.write_stdin(bytes)?;
                        }
                    }
                }
                buffer.drain(..consumed);
            }
        }
        Ok::<_, E2bError>(json!({}))
    }
    .await;
    // A client stream is answered like a server stream: one message, then
    // the end (or only the end, with the error).
    let (response, sender) = connect::stream_response();
    match streamed {
        Ok(v) => {
            sender.send(&v).await;
            sender.end(None).await;
        }
        Err(e) => sender.end(Some(&e)).await,
    }
    response
}

/// The next envelope if it has arrived whole, else `None` (more to read).
fn complete_envelope<'a>(rest: &mut &'a [u8]) -> Result<Option<(u8, &'a [u8])>, E2bError> {
    if rest.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
    if rest.len() < 5 + len {
        return Ok(None);
    }
    connect::next_envelope(rest)
}

async fn send_signal(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let sent = async {
        let task = ctx.authorized(&headers)?;
        let req: SendSignalRequest = connect::unary_request("SendSignal", &headers, &body)?;
        let signal = match (&req.signal, req.signal.as_u64()) {
            (serde_json::Value::String(s), _) if s == "SIGNAL_SIGKILL" => 9,
            (serde_json::Value::String(s), _) if s == "SIGNAL_SIGTERM" => 15,
            (_, Some(n @ (9 | 15))) => n as i32,
            _ => return Err(E2bError::bad_request(format!("SendSignal: unknown signal {}; SIGNAL_SIGKILL and SIGNAL_SIGTERM are served", req.signal))),
        };
        let process = ctx.rt.process(task, &req.process.resolve()?).await?;
        process.signal(signal)?;
        Ok::<_, E2bError>(json!({}))
    }
    .await;
    unary(sent)
}

async fn close_stdin(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let closed = async {
        let task = ctx.authorized(&headers)?;
        let req: ConnectRequest = connect::unary_request("CloseStdin", &headers, &body)?;
        let process = ctx.rt.process(task, &req.process.resolve()?).await?;
        process.write_stdin(Vec::new())?;
        Ok::<_, E2bError>(json!({}))
    }
    .await;
    unary(closed)
}

async fn update(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let updated = async {
        let task = ctx.authorized(&headers)?;
        let req: UpdateRequest = connect::unary_request("Update", &headers, &body)?;
        let process = ctx.rt.process(task, &req.process.resolve()?).await?;
        if let Some(size) = req.pty.and_then(|p| p.size) {
            if size.rows == 0 || size.cols == 0 {
                return Err(E2bError::bad_request(format!("Update: a terminal of {}x{} has no room; rows and cols must be at least 1", size.cols, size.rows)));
            }
            process.resize(size.rows, size.cols)?;
        }
        Ok::<_, E2bError>(json!({}))
    }
    .await;
    unary(updated)
}
