//! The HTTP API, under `/v1`, bearer-token authenticated.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | /v1/health | daemon version and home |
//! | GET, POST | /v1/tasks | list, create ([`CreateRequest`]) |
//! | GET, DELETE | /v1/tasks/{id} | show, destroy |
//! | GET | /v1/tasks/{id}/events | the event log |
//! | GET (WebSocket) | /v1/tasks/{id}/exec | run a command ([`crate::exec`]) |
//! | GET, PUT | /v1/tasks/{id}/files | tar out of / into the sandbox |
//! | GET, POST | /v1/tasks/{id}/snapshots | list, take ([`SnapshotRequest`]) |
//! | GET | /v1/tasks/{id}/snapshots/diff?a=S&b=S | added, changed, deleted paths |
//! | POST | /v1/tasks/{id}/rollback | roll back in place ([`RollbackRequest`]) |
//! | POST | /v1/tasks/{id}/fork | new tasks from a snapshot ([`ForkRequest`]) |
//! | GET | /v1/tasks/{id}/progress | the snapshot or restore in progress, if any |
//! | POST | /v1/gc | retention, then mark and sweep ([`GcRequest`]) |
//! | POST | /v1/check | `{read_data}`: verify the blob store |
//! | GET, POST | /v1/images | list, import `{name, path}` |
//! | DELETE | /v1/images/{name} | remove |
//!
//! Errors are `{"error": "..."}` with a 4xx/5xx status.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use cairn_core::TaskState;
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use crate::snapshots::{ForkRequest, GcRequest, RollbackRequest, SnapshotRequest};
use crate::tasks::{CreateRequest, Tasks};
use crate::ApiError;

#[derive(Clone)]
struct AppState {
    tasks: Arc<Tasks>,
}

pub fn router(tasks: Arc<Tasks>, token: String) -> Router {
    let token = Arc::new(token);
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/tasks", get(list_tasks).post(create_task))
        .route("/v1/tasks/{id}", get(show_task).delete(destroy_task))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/tasks/{id}/exec", get(exec))
        .route("/v1/tasks/{id}/files", get(download).put(upload))
        .route("/v1/tasks/{id}/snapshots", get(list_snapshots).post(take_snapshot))
        .route("/v1/tasks/{id}/snapshots/diff", get(diff_snapshots))
        .route("/v1/tasks/{id}/rollback", axum::routing::post(rollback))
        .route("/v1/tasks/{id}/fork", axum::routing::post(fork))
        .route("/v1/tasks/{id}/progress", get(progress))
        .route("/v1/gc", axum::routing::post(gc))
        .route("/v1/check", axum::routing::post(check))
        .route("/v1/images", get(list_images).post(import_image))
        .route("/v1/images/{name}", delete(remove_image))
        .fallback(|| async { ApiError::not_found("no such API endpoint") })
        .layer(middleware::from_fn(move |req, next| auth(token.clone(), req, next)))
        .with_state(AppState { tasks })
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
        ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response()
    }
}

/// Who made a request, for the event log.
fn actor(headers: &HeaderMap) -> String {
    headers
        .get("x-cairn-actor")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(|v| v.chars().filter(|c| c.is_ascii_graphic()).collect())
        .unwrap_or_else(|| "api".to_owned())
}

async fn health(State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION"), "home": s.tasks.store.path().parent() }))
}

async fn list_tasks(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let tasks = s.tasks.store.list_tasks().await?;
    let views: Vec<_> = tasks.into_iter().map(|t| s.tasks.view(t)).collect();
    Ok(Json(json!(views)))
}

async fn create_task(State(s): State<AppState>, headers: HeaderMap, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: CreateRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("malformed task request: {e}")))?;
    let view = s.tasks.create(req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn show_task(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.view(task))))
}

async fn destroy_task(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let view = s.tasks.destroy(&id, &actor(&headers)).await?;
    Ok(Json(json!(view)))
}

async fn task_events(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.store.events(&task.id).await?)))
}

async fn exec(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, ws: WebSocketUpgrade) -> Result<Response, ApiError> {
    // Refuse before upgrading when the task cannot run anything.
    let task = s.tasks.find(&id).await?;
    if matches!(task.state, TaskState::Destroyed | TaskState::Completed | TaskState::Failed) {
        task.state.check_exec()?;
    }
    let actor = actor(&headers);
    let tasks = s.tasks.clone();
    Ok(ws.on_upgrade(move |socket| crate::exec::serve(tasks, id, actor, socket)))
}

/// Parses a JSON body, naming what was malformed.
fn body<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ApiError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("malformed {what} request: {e}")))
}

async fn take_snapshot(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: SnapshotRequest = body("snapshot", &b)?;
    let snap = s.tasks.snapshot(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(snap)).into_response())
}

async fn list_snapshots(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.list_snapshots(&id).await?)))
}

#[derive(Deserialize)]
struct DiffQuery {
    a: String,
    b: String,
}

async fn diff_snapshots(State(s): State<AppState>, Path(id): Path<String>, Query(q): Query<DiffQuery>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.diff(&id, &q.a, &q.b).await?)))
}

async fn rollback(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: RollbackRequest = body("rollback", &b)?;
    Ok(Json(s.tasks.rollback(&id, req, &actor(&headers)).await?))
}

async fn fork(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ForkRequest = body("fork", &b)?;
    let children = s.tasks.fork(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(json!(children))).into_response())
}

async fn progress(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.progress(&task.id))))
}

async fn gc(State(s): State<AppState>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: GcRequest = body("gc", &b)?;
    Ok(Json(s.tasks.gc(req, &actor(&headers)).await?))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    #[serde(default)]
    read_data: bool,
}

async fn check(State(s): State<AppState>, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: CheckRequest = body("check", &b)?;
    Ok(Json(json!(s.tasks.check(req.read_data).await?)))
}

#[derive(Deserialize)]
struct FileQuery {
    path: String,
    name: Option<String>,
}

async fn download(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Result<Response, ApiError> {
    crate::files::download(s.tasks.clone(), &id, q.path, actor(&headers)).await
}

async fn upload(
    State(s): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let name = q.name.ok_or_else(|| ApiError::bad_request("missing name= (the top-level entry of the tar)"))?;
    Ok(Json(crate::files::upload(s.tasks.clone(), &id, q.path, name, body, actor(&headers)).await?))
}

async fn list_images(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let images = s.tasks.images.clone();
    let list = tokio::task::spawn_blocking(move || images.list()).await??;
    Ok(Json(json!(list)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportRequest {
    name: String,
    path: PathBuf,
}

async fn import_image(State(s): State<AppState>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ImportRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("malformed image request: {e}")))?;
    let images = s.tasks.images.clone();
    let image = tokio::task::spawn_blocking(move || images.import(&req.name, &req.path)).await??;
    Ok((StatusCode::CREATED, Json(json!(image))).into_response())
}

async fn remove_image(State(s): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let users: Vec<String> = s
        .tasks
        .store
        .list_tasks()
        .await?
        .into_iter()
        .filter(|t| t.config.image == name && !t.state.is_terminal())
        .map(|t| t.id.to_string())
        .collect();
    if !users.is_empty() {
        return Err(ApiError::conflict(format!("image {name:?} is used by task(s) {}; destroy them first", users.join(", "))));
    }
    let images = s.tasks.images.clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || images.remove(&n)).await??;
    Ok(Json(json!({ "removed": name })))
}
