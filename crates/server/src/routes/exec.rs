//! `GET /v1/tasks/{id}/exec`: a command over a WebSocket. The protocol
//! (the start message, binary channel frames, text frames each way) is
//! [`cairn_api::exec`]; this file moves it between the socket and the
//! runtime's [`ExecChannel`]. Closing the socket early kills the command.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use cairn_api::exec::{ClientFrame, ExecStart, ServerFrame, STDIN};
use cairn_runtime::exec::{ExecChannel, ExecInput, ExecOutput};
use cairn_runtime::Runtime;
use futures_util::SinkExt;

use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<Arc<Runtime>> {
    Router::new().route("/v1/tasks/{id}/exec", get(exec))
}

async fn exec(rt: Rt, Path(id): Path<String>, headers: HeaderMap, ws: WebSocketUpgrade) -> Result<Response, ApiError> {
    // Refuse before upgrading when the task cannot run anything.
    rt.check_can_exec(&id).await?;
    let actor = actor(&headers);
    let rt = rt.0.clone();
    Ok(ws.on_upgrade(move |socket| serve(rt, id, actor, socket)))
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
async fn serve(rt: Arc<Runtime>, id: String, actor: String, mut ws: WebSocket) {
    let start = match ws.recv().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str::<ExecStart>(&t).map_err(|e| format!("malformed exec request: {e}")),
        _ => Err("expected an exec request as the first message".to_owned()),
    };
    let result = match start {
        Ok(start) => rt.exec(&id, &actor, start, &mut Socket(&mut ws)).await.map_err(ApiError::from),
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
