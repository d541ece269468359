//! Forwarding: a request about a task that another node runs goes to that
//! node, as it came (method, path, headers, body; a WebSocket exec's
//! upgrade too), and its answer comes back as that node gave it. The
//! client talks to any node and never learns where its task runs.
//!
//! A forwarded request carries [`FORWARDED`]; a node serves such a request
//! itself whatever it thinks of the task, so a request never travels
//! twice (a lease that moves meanwhile makes the other node answer with
//! the store's conflict, not with another hop).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cairn_runtime::Runtime;
use hyper_util::rt::TokioIo;

use crate::ApiError;

/// Marks a request one node forwarded to another (its value: the sender).
pub const FORWARDED: &str = "cairn-forwarded-by";

/// The task a request path is about: `/v1/tasks/{id}` and everything
/// under it.
fn task_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/tasks/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The most an MCP message may be (as `/mcp` itself takes).
const MCP_BODY_LIMIT: usize = 16 << 20;

/// The task an MCP `tools/call` names in its `task` argument, if any.
fn mcp_task(body: &[u8]) -> Option<String> {
    let msg: serde_json::Value = serde_json::from_slice(body).ok()?;
    if msg["method"] != "tools/call" {
        return None;
    }
    msg["params"]["arguments"]["task"].as_str().map(str::to_owned)
}

/// Serves the request here, or forwards it to the node that runs its task.
pub(crate) async fn forward_to_owner(State((rt, token)): State<(Arc<Runtime>, Arc<String>)>, req: Request, next: Next) -> Response {
    // Unauthenticated requests are refused here, not forwarded (nor told
    // where a task runs).
    if req.headers().contains_key(FORWARDED) {
        return next.run(req).await;
    }
    // E2B's in-sandbox API names its sandbox in a header and carries that
    // sandbox's access token, checked before anything is forwarded.
    let sandbox = req.headers().get(cairn_e2b::SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(task) = sandbox {
        let token = req.headers().get("x-access-token").and_then(|v| v.to_str().ok()).unwrap_or("");
        if rt.is_clustered() && rt.check_sandbox_access_token(&task, token) {
            return route(&rt, &task, req, next).await;
        }
        return next.run(req).await;
    }
    if rt.is_clustered() {
        // A port's request (by path or host name), with any of its
        // credentials, checked here: served on the node of its task.
        if let Some(task) = crate::ports::authorized_port_task(&rt, &token, req.uri(), req.headers()).await {
            return route(&rt, &task, req, next).await;
        }
        // A signed `/files` URL of E2B's: the sandbox whose token signed it.
        if let Some(task) = cairn_e2b::signed_files_sandbox(&rt, req.method(), req.uri()).await {
            return route(&rt, &task, req, next).await;
        }
    }
    if !req.headers().contains_key(axum::http::header::AUTHORIZATION) {
        return next.run(req).await;
    }
    // An MCP tool call is about the task in its arguments.
    if req.uri().path() == "/mcp" && rt.is_clustered() {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, MCP_BODY_LIMIT).await {
            Ok(b) => b,
            Err(e) => return ApiError::bad_request(format!("reading the MCP message: {e}")).into_response(),
        };
        let task = mcp_task(&bytes);
        let req = Request::from_parts(parts, Body::from(bytes));
        return match task {
            Some(task) => route(&rt, &task, req, next).await,
            None => next.run(req).await,
        };
    }
    let Some(task) = task_of(req.uri().path()).map(str::to_owned) else { return next.run(req).await };
    route(&rt, &task, req, next).await
}

/// Serves `req` here unless `task` runs on another node, then forwards it there.
async fn route(rt: &Runtime, task: &str, req: Request, next: Next) -> Response {
    match rt.runs_elsewhere(task).await {
        Ok(None) => next.run(req).await,
        Ok(Some(base)) => {
            // A node that stops answering (stopped, hung) still accepts
            // connections in its kernel: the answer is awaited only as long
            // as the node keeps its lease on the task, and no longer.
            tokio::select! {
                answer = forward(req, &base, rt.node_name()) => match answer {
                    Ok(resp) => resp,
                    Err(e) => ApiError::from(cairn_runtime::Error::Unavailable(format!("forwarding to {base}: {e}"))).into_response(),
                },
                lost = owner_lost(rt, task, &base) => ApiError::from(lost).into_response(),
            }
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// How often a forwarded request checks that its node still holds the task.
const OWNER_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Returns once the node at `base` no longer holds `task` (its heartbeat
/// stopped, or the task moved): why, for the client, who may retry.
async fn owner_lost(rt: &Runtime, task: &str, base: &str) -> cairn_runtime::Error {
    loop {
        tokio::time::sleep(OWNER_CHECK).await;
        match rt.runs_elsewhere(task).await {
            Ok(Some(now)) if now == base => continue,
            Ok(_) => {
                return cairn_runtime::Error::Unavailable(format!(
                    "the node at {base} stopped answering and task {task} has moved since; retry"
                ))
            }
            Err(e) => return e,
        }
    }
}

/// Sends `req` to the node at `base` over a new HTTP/1.1 connection and
/// relays its answer ([`relay`]).
async fn forward(mut req: Request, base: &str, from: &str) -> Result<Response, String> {
    let target: Uri = base.parse().map_err(|e| format!("bad node URL {base:?}: {e}"))?;
    let authority = target.authority().ok_or_else(|| format!("node URL {base:?} has no host"))?.to_string();
    let stream = tokio::net::TcpStream::connect(&authority).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    req.headers_mut().insert(FORWARDED, HeaderValue::from_str(from).map_err(|e| e.to_string())?);
    // The client's own host name goes along: a port may be addressed by it.
    let host = req.headers().get(axum::http::header::HOST).and_then(|v| v.to_str().ok()).map(str::to_owned).unwrap_or(authority);
    relay(stream, req, &host).await
}

/// Sends `req` over `stream` (HTTP/1.1, its path and query only, `Host:
/// host`) and relays the answer; after a `101 Switching Protocols` (a
/// WebSocket), relays the bytes both ways until either side closes.
pub(crate) async fn relay<S>(stream: S, mut req: Request, host: &str) -> Result<Response, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("relayed connection: {e}");
        }
    });
    let upgrading = req.headers().contains_key(axum::http::header::UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "/".into());
    parts.uri = path.parse().map_err(|e| format!("{e}"))?;
    parts.headers.insert(axum::http::header::HOST, HeaderValue::from_str(host).map_err(|e| e.to_string())?);
    let mut resp = sender.send_request(Request::from_parts(parts, body)).await.map_err(|e| e.to_string())?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let far_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match tokio::try_join!(client_side, far_side) {
                    Ok((client, far)) => {
                        let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(far)).await;
                    }
                    Err(e) => tracing::warn!("relayed upgrade: {e}"),
                }
            });
        }
    }
    Ok(resp.map(Body::new))
}

#[cfg(test)]
mod tests {
    use super::{mcp_task, task_of};

    #[test]
    fn an_mcp_tool_call_is_about_the_task_in_its_arguments() {
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"task":"t-1","command":"ls"}}}"#;
        assert_eq!(mcp_task(call).as_deref(), Some("t-1"));
        let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        assert_eq!(mcp_task(list), None);
        let create = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_task","arguments":{}}}"#;
        assert_eq!(mcp_task(create), None);
        assert_eq!(mcp_task(b"not json"), None);
    }

    #[test]
    fn requests_about_one_task_are_the_ones_forwarded() {
        assert_eq!(task_of("/v1/tasks/t-1"), Some("t-1"));
        assert_eq!(task_of("/v1/tasks/build/exec"), Some("build"));
        assert_eq!(task_of("/v1/tasks/"), None);
        assert_eq!(task_of("/v1/tasks"), None);
        assert_eq!(task_of("/v1/nodes"), None);
        assert_eq!(task_of("/v1/hooks/t-1/ci"), None, "events are taken in by any node");
    }
}
