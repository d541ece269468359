//! Commands in a task, over two transports of the runtime's [`ExecChannel`]:
//! - `GET /v1/tasks/{id}/exec`: a WebSocket. The protocol (the start
//!   message, binary channel frames, text frames each way) is
//!   [`cairn_api::exec`]. Closing the socket early kills the command.
//! - `POST /v1/tasks/{id}/exec`: plain HTTP, a [`RunRequest`] answered with
//!   a [`RunAnswer`] once the command ends (output capped); with
//!   `Accept: text/event-stream`, the output as server-sent events as it
//!   comes, then an `exit` event. A streaming client that goes away kills
//!   the command.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::IntoResponse;
use axum::Json;
use cairn_api::ErrorBody;
use cairn_api::exec::{ClientFrame, ExecStart, RunAnswer, RunOutput, RunRequest, ServerFrame, STDERR, STDIN, STDOUT};
use cairn_api::ExecExit;
use cairn_runtime::exec::{AdmittedExec, ExecChannel, ExecInput, ExecOutput};
use cairn_runtime::run::{self, RunStdin};
use futures_util::{SinkExt, StreamExt};

use super::served::Routes;
use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/tasks/{id}/exec", exec).post("/v1/tasks/{id}/exec", run)
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/exec",
    operation_id = "exec_websocket",
    tag = "exec",
    description = "A command over a WebSocket (`Upgrade: websocket`). The first client message is a text frame of an `ExecStart`; then binary frames `[channel, bytes...]` each way (0 stdin, 1 stdout, 2 stderr) and text frames of `ServerFrame` and `ClientFrame` (see docs/api.md). Closing the socket before the exit frame kills the command.",
    params(("id" = String, Path, description = "The task's id or name")),
    responses(
        (status = 101, description = "Switching Protocols: the exec WebSocket"),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task cannot run anything (destroyed, completed, failed)", body = ErrorBody),
        (status = 429, description = "The task or the daemon already runs as many commands as `[limits]` allows", body = ErrorBody),
    )
)]
async fn exec(rt: Rt, Path(id): Path<String>, headers: HeaderMap, ws: WebSocketUpgrade) -> Result<Response, ApiError> {
    // Refused before upgrading when the task cannot run anything.
    let admitted = rt.admit_exec(&id).await?;
    let actor = actor(&headers);
    Ok(ws.on_upgrade(move |socket| serve(admitted, actor, socket)))
}

/// A WebSocket as the runtime's exec channel.
struct Socket<'a>(&'a mut WebSocket);

impl ExecChannel for Socket<'_> {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        let msg = match out {
            ExecOutput::Frame(f) => Message::Text(text(f).into()),
            ExecOutput::Output(channel, data) => {
                let mut v = Vec::with_capacity(data.len() + 1);
                v.push(channel);
                v.extend_from_slice(data);
                Message::Binary(v.into())
            }
        };
        self.0.send(msg).await.is_ok()
    }

    async fn recv(&mut self) -> ExecInput {
        match self.0.recv().await {
            Some(Ok(Message::Binary(b))) if b.first() == Some(&STDIN) => ExecInput::Stdin(b[1..].to_vec()),
            Some(Ok(Message::Text(t))) => match serde_json::from_str::<ClientFrame>(&t) {
                Ok(f) => ExecInput::Control(f),
                Err(_) => ExecInput::Other,
            },
            Some(Ok(_)) => ExecInput::Other,
            None | Some(Err(_)) => ExecInput::Gone,
        }
    }
}

/// Serves one exec connection to its end.
async fn serve(admitted: AdmittedExec, actor: String, mut ws: WebSocket) {
    let start = match ws.recv().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str::<ExecStart>(&t).map_err(|e| format!("malformed exec request: {e}")),
        _ => Err("expected an exec request as the first message".to_owned()),
    };
    let result = match start {
        Ok(start) => admitted.exec(&actor, start, &mut Socket(&mut ws)).await.map_err(ApiError::from),
        Err(e) => Err(ApiError::bad_request(e)),
    };
    if let Err(e) = result {
        let frame = ServerFrame::Error { code: e.code, status: e.code.status(), error: e.message };
        let _ = ws.send(Message::Text(text(&frame).into())).await;
    }
    let _ = ws.close().await;
    // Read what the client still sends (late stdin, its close) until it
    // answers the close: dropping a socket with unread data resets the
    // connection, and the client may then lose the exit message.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(m)) = ws.recv().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// A frame as the text of a WebSocket message.
fn text(frame: &ServerFrame) -> String {
    serde_json::to_string(frame).unwrap_or_default()
}

/// A streamed run as the exec channel: each piece of output becomes an
/// event; a client gone (the stream dropped) ends the command.
struct Stream {
    stdin: RunStdin,
    events: tokio::sync::mpsc::Sender<Sse>,
    exit: Option<ExecExit>,
}

impl ExecChannel for Stream {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        let event = match out {
            ExecOutput::Output(channel @ (STDOUT | STDERR), data) => {
                let name = if channel == STDOUT { "stdout" } else { "stderr" };
                Sse::default().event(name).json_data(RunOutput { data: String::from_utf8_lossy(data).into_owned() })
            }
            ExecOutput::Frame(ServerFrame::Exit { exit, .. }) => {
                self.exit = Some(exit.clone());
                return true;
            }
            _ => return true,
        };
        match event {
            Ok(e) => self.events.send(e).await.is_ok(),
            Err(_) => true,
        }
    }

    async fn recv(&mut self) -> ExecInput {
        tokio::select! {
            input = self.stdin.next() => input,
            _ = self.events.closed() => ExecInput::Gone,
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/exec",
    operation_id = "exec_run",
    tag = "exec",
    description = "A command run to its end over plain HTTP. With `Accept: text/event-stream` the answer is server-sent events as the command writes: `stdout` and `stderr` events of `RunOutput`, then one `exit` event of a `RunAnswer` (with empty output) or an `error` event of an `ErrorBody`. A streaming client that disconnects kills the command.",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body = RunRequest,
    responses(
        (status = 200, description = "How the command ended and what it wrote (each stream capped at 1 MiB); or the stream of events", content(
            (RunAnswer = "application/json"),
            (RunOutput = "text/event-stream"),
        )),
        (status = 400, description = "A malformed request: empty `cmd`, a bad timeout or variable name", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task cannot run anything", body = ErrorBody),
        (status = 429, description = "The task or the daemon already runs as many commands as `[limits]` allows", body = ErrorBody),
    )
)]
async fn run(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: RunRequest = super::body("exec", &b)?;
    let actor = actor(&headers);
    let streamed = headers.get("accept").and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/event-stream"));
    if !streamed {
        return Ok(Json(rt.run(&id, &actor, req).await?).into_response());
    }
    // Refused before the stream starts when the task cannot run anything,
    // so those errors keep their status.
    let (admitted, stdin) = rt.admit_run(&id, req).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut chan = Stream { stdin, events: tx.clone(), exit: None };
        let last = match admitted.exec(&actor, &mut chan).await {
            Ok(()) => chan.exit.map(|exit| Sse::default().event("exit").json_data(run::answer(exit, &[], &[], false))),
            Err(e) => {
                let e = ApiError::from(e);
                Some(Sse::default().event("error").json_data(cairn_api::ErrorBody::new(e.code, e.message)))
            }
        };
        if let Some(Ok(event)) = last {
            let _ = tx.send(event).await;
        }
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>);
    Ok(axum::response::sse::Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}
