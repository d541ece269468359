//! The HTTP API, under `/v1`, bearer-token authenticated; one file per
//! group of routes. Each handler parses its request, calls one
//! [`Runtime`] method and maps the result (errors through [`ApiError`]).
//!
//! Each handler carries its `#[utoipa::path]` (route, parameters, bodies,
//! answers), and [`openapi`] builds the OpenAPI document from them. Routes
//! are added through `served::Routes`, which records each (path, method)
//! it serves; a test holds that set against the document's, both ways, so
//! a route added without its documentation (or the reverse) fails it.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | /v1/health | daemon version and home |
//! | GET | /v1/nodes | the nodes sharing the task database: state, load, tasks |
//! | GET | /metrics | Prometheus metrics (OpenMetrics text) |
//! | GET, POST | /v1/tasks | list, create |
//! | GET, DELETE | /v1/tasks/{id} | show, destroy |
//! | GET | /v1/tasks/{id}/events | the event log |
//! | GET | /v1/tasks/{id}/watch?after=SEQ | the event log as server-sent events, live |
//! | GET (WebSocket), POST | /v1/tasks/{id}/exec | run a command ([`exec`]) |
//! | GET, PUT | /v1/tasks/{id}/files | tar out of / into the sandbox |
//! | GET, PUT | /v1/tasks/{id}/file?path=P | one file as raw bytes |
//! | GET, POST | /v1/tasks/{id}/snapshots | list, take |
//! | GET | /v1/tasks/{id}/snapshots/diff?a=S&b=S | added, changed, deleted paths |
//! | POST | /v1/tasks/{id}/rollback | roll back in place |
//! | POST | /v1/tasks/{id}/fork | new tasks from a snapshot |
//! | GET | /v1/tasks/{id}/progress | the snapshot or restore in progress, if any |
//! | POST | /v1/gc | retention, then mark and sweep |
//! | POST | /v1/check | `{read_data}`: verify the blob store |
//! | GET | /v1/backup | the node's store, blob store and keys as a tar |
//! | POST | /v1/tasks/{id}/waits | wait: suspends until satisfied |
//! | GET | /v1/waits/{id}?block_ms=N | a wait, optionally blocking until satisfied |
//! | POST | /v1/tasks/{id}/approve | approve or reject |
//! | GET, POST | /v1/tasks/{id}/inbox | the inbox; an operator's event |
//! | POST | /v1/tasks/{id}/suspend, /resume | suspend now; wake now |
//! | GET, POST | /v1/tasks/{id}/egress | the allowlist and decision log; change the allowlist |
//! | GET | /v1/tasks/{id}/ledger | walk the hash chain, check it against the signed checkpoints |
//! | POST | /v1/tasks/{id}/checkpoint | sign the chain's head now |
//! | POST | /v1/tasks/{id}/deliveries, /complete | deliver outputs; complete the task |
//! | GET | /v1/deliverables/{sha256}, /v1/records/{id} | stored deliverables and delivery records |
//! | GET | /v1/keys | the node's public keys, current first |
//! | POST | /v1/keys/rotate | a new signing key; the old public key stays |
//! | GET, POST | /v1/images | list, import `{name, path}` |
//! | POST | /v1/images/commit | a template from a task `{task, name, from?}` |
//! | DELETE | /v1/images/{name} | remove |
//! | GET | /v1/images/{name} | show: kind, layers, manifest, run config |
//! | POST | /mcp | the Model Context Protocol, streamable HTTP ([`cairn_mcp`]) |
//! | GET, POST | /v1/api-keys | the E2B-compatible API's keys: list, create `{name}` |
//! | GET, POST | /v1/tasks/{id}/processes | background commands: list, start (a handle) |
//! | GET | /v1/tasks/{id}/processes/{pid}?wait_ms= | one, with its output so far (waiting for its end) |
//! | POST | /v1/tasks/{id}/processes/{pid}/stdin, /resize, /kill | its stdin (`?close=true`), terminal, end |
//! | POST | /v1/tasks/{id}/port-links/{port}?ttl= | a signed link to a port, and the task's traffic token |
//! | any | /v1/tasks/{id}/ports/{port}/... | a task's port over HTTP or WebSocket ([`crate::ports`]; also by host name `{port}-{id}.{domain}`) |
//! | DELETE | /v1/api-keys/{name} | revoke |
//! | GET | /v1/secrets, /v1/secrets/{name} | the egress proxy's secrets: names and use, never values |
//! | PUT, DELETE | /v1/secrets/{name} | set (the raw value as the body), remove |
//! | GET, POST | /v1/outgoing-hooks | notification endpoints: list, add `{url, events?, task?, format?, secret?}` |
//! | GET, DELETE | /v1/outgoing-hooks/{id} | show, remove (with its outbox) |
//! | GET | /v1/outgoing-hooks/{id}/outbox | what it has not sent: pending, then failed |
//! | POST | /v1/outgoing-hooks/{id}/test | send a `hook.test` now; the receiver's answer |
//!
//! E2B's API ([`cairn_e2b`]) is served beside it: its control routes
//! (`/sandboxes`, `/v2/sandboxes`, `/templates`) with `X-API-Key`, and its
//! in-sandbox API for any request that names a sandbox in `E2b-Sandbox-Id`.
//!
//! Without the bearer token (their own checks), in [`gateway`], and the
//! document:
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | /v1/openapi.json | the OpenAPI 3.1 document ([`openapi`]) |
//! | POST | /v1/hooks/{task}/{name} | a webhook, signed per Standard Webhooks with the task's secret |
//! | GET, POST | /approve/{wait}?exp=&sig= | the approval page and its form (a signed link) |
//!
//! Errors are `{"error": {"code": "...", "message": "..."}}` with a 4xx/5xx
//! status; the codes are [`cairn_api::ErrorCode`].

mod admin;
mod api_keys;
mod secrets;
mod outgoing_hooks;
mod deliver;
mod egress;
pub mod exec;
mod files;
mod gateway;
mod images;
pub(crate) mod mcp;
mod nodes;
mod port_links;
mod processes;
pub mod openapi;
mod served;
mod snapshots;
mod tasks;
mod waits;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use cairn_api::ErrorCode;
use cairn_runtime::Runtime;
use subtle::ConstantTimeEq;

use crate::ApiError;
use served::Routes;

/// What every handler gets: the runtime.
pub(crate) type Rt = State<Arc<Runtime>>;

pub fn router(rt: Arc<Runtime>, token: String) -> Router {
    let token = Arc::new(token);
    routes(token.clone())
        .into_router()
        // E2B's control API, under its own paths and keys (`X-API-Key`).
        .merge(cairn_e2b::control_routes())
        // The web console: pages at `/` and under `/console/`, with their
        // own login (a session cookie) instead of the bearer token.
        .merge(cairn_console::router(rt.clone(), token.clone()))
        .fallback(|| async { ApiError::not_found("no such API endpoint") })
        .layer(middleware::map_response(json_errors))
        // A task's ports, by path or by host name, with their own checks
        // (after forwarding: a port is reached on the node of its task).
        .layer(middleware::from_fn_with_state((rt.clone(), token.clone()), crate::ports::serve_ports))
        // A request naming a sandbox (`E2b-Sandbox-Id`) is for E2B's
        // in-sandbox API, whatever its path (after forwarding: it is served
        // on the node of its sandbox).
        .layer(middleware::from_fn_with_state(rt.clone(), cairn_e2b::route_sandbox_requests))
        .layer(middleware::from_fn_with_state((rt.clone(), token), crate::forward::forward_to_owner))
        .layer(middleware::from_fn(run_to_completion))
        .with_state(rt)
}

/// Every route: the gateway's and the document without the bearer token,
/// the rest behind it.
fn routes(token: Arc<String>) -> Routes {
    let private = Routes::new()
        .merge(admin::routes())
        .merge(api_keys::routes())
        .merge(secrets::routes())
        .merge(outgoing_hooks::routes())
        .merge(nodes::routes())
        .merge(port_links::routes())
        .merge(processes::routes())
        .merge(tasks::routes())
        .merge(exec::routes())
        .merge(files::routes())
        .merge(snapshots::routes())
        .merge(waits::routes())
        .merge(egress::routes())
        .merge(deliver::routes())
        .merge(images::routes())
        .merge(mcp::routes())
        .wrap(|r| r.layer(middleware::from_fn(move |req, next| auth(token.clone(), req, next))));
    gateway::routes().merge(openapi::routes()).merge(private)
}

/// The errors the HTTP layer makes itself (a body over its limit, a
/// malformed query string, form or JSON, a wrong content type) come as
/// plain text: they get the API's JSON error body, with the code of their
/// status. Inside the router only, so a task's port (served around it)
/// answers as its own server does.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let message = String::from_utf8_lossy(&text).trim().to_owned();
    let json = serde_json::to_vec(&cairn_api::ErrorBody::new(ErrorCode::for_status(status.as_u16()), message)).unwrap_or_default();
    parts.headers.insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(json))
}

/// Carries out every request to its end on a task of its own, even when
/// the client goes away meanwhile (a closed connection, a node that was
/// forwarding it lost): a handler dropped at an await point would stop a
/// lifecycle step halfway (a task left `suspending` with its lock
/// released), which no client can ask for.
async fn run_to_completion(req: Request, next: Next) -> Response {
    match tokio::spawn(next.run(req)).await {
        Ok(resp) => resp,
        Err(e) => ApiError::from(cairn_runtime::Error::internal(format!("the request's handler failed: {e}"))).into_response(),
    }
}

async fn auth(token: Arc<String>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if given.as_bytes().ct_eq(token.as_bytes()).into() {
        next.run(req).await
    } else {
        let msg = if given.is_empty() { "missing bearer token" } else { "wrong bearer token" };
        ApiError::new(ErrorCode::Unauthorized, msg).into_response()
    }
}

/// Who made a request, for the event log.
pub(crate) fn actor(headers: &HeaderMap) -> String {
    headers
        .get("x-cairn-actor")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(|v| v.chars().filter(|c| c.is_ascii_graphic()).collect())
        .unwrap_or_else(|| "api".to_owned())
}

/// Parses a JSON body, naming what was malformed; an empty body is `{}`.
pub(crate) fn body<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ApiError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("malformed {what} request: {e}")))
}
