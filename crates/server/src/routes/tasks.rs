//! Tasks: list, create, show, destroy, their event log (also live).

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::tasks::{CreateRequest, TaskView};
use cairn_api::ErrorBody;
use cairn_api::Event;
use futures_util::StreamExt;
use serde::Deserialize;

use super::served::Routes;
use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/tasks", list)
        .post("/v1/tasks", create)
        .get("/v1/tasks/{id}", show)
        .delete("/v1/tasks/{id}", destroy)
        .get("/v1/tasks/{id}/events", events)
        .get("/v1/tasks/{id}/watch", watch)
}

#[utoipa::path(
    get,
    path = "/v1/tasks",
    operation_id = "list_tasks",
    tag = "tasks",
    responses((status = 200, description = "Every task", body = [TaskView]))
)]
async fn list(rt: Rt) -> Result<Json<Vec<TaskView>>, ApiError> {
    Ok(Json(rt.list().await?))
}

#[utoipa::path(
    post,
    path = "/v1/tasks",
    operation_id = "create_task",
    tag = "tasks",
    request_body = CreateRequest,
    responses(
        (status = 201, description = "The task, created and started", body = TaskView),
        (status = 400, description = "A malformed body, a bad limit, rule or name", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    )
)]
async fn create(rt: Rt, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: CreateRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed task request: {e}")))?;
    let view = rt.create(req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}",
    operation_id = "show_task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task", body = TaskView), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn show(rt: Rt, Path(id): Path<String>) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.show(&id).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/tasks/{id}",
    operation_id = "destroy_task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task, in state `destroyed`", body = TaskView), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn destroy(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.destroy(&id, &actor(&headers)).await?))
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/events",
    operation_id = "task_events",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task's event log, oldest first", body = [Event]), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn events(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<Event>>, ApiError> {
    Ok(Json(rt.events(&id).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct WatchQuery {
    /// Start after this seq (default 0: the whole log).
    after: Option<u64>,
}

/// The task's event log as server-sent events: what is there after `after`,
/// then each new entry as it is written.
#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/watch",
    operation_id = "watch_task",
    tag = "tasks",
    params(("id" = String, Path, description = "The task's id or name"), WatchQuery),
    responses(
        (status = 200, description = "Server-sent events, live: one per log entry after `after` (event name: the entry's kind, id: its seq, data: the `Event`)", content_type = "text/event-stream", body = Event),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 429, description = "The task or the daemon already has as many open event streams as `[limits]` allows", body = ErrorBody),
    )
)]
async fn watch(rt: Rt, Path(id): Path<String>, Query(q): Query<WatchQuery>) -> Result<Response, ApiError> {
    let events = rt.watch(&id, q.after.unwrap_or(0)).await?;
    let stream = events.map(|e| match e {
        Ok(e) => Sse::default().event(e.kind.as_str()).id(e.seq.to_string()).json_data(&e).map_err(|e| std::io::Error::other(e.to_string())),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    });
    Ok(axum::response::sse::Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}
