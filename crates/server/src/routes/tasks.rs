//! Tasks: list, create, show, destroy, their event log (also live).

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cairn_api::tasks::{CreateRequest, TaskView};
use cairn_core::Event;
use futures_util::StreamExt;
use serde::Deserialize;

use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/tasks", get(list).post(create))
        .route("/v1/tasks/{id}", get(show).delete(destroy))
        .route("/v1/tasks/{id}/events", get(events))
        .route("/v1/tasks/{id}/watch", get(watch))
}

async fn list(rt: Rt) -> Result<Json<Vec<TaskView>>, ApiError> {
    Ok(Json(rt.list().await?))
}

async fn create(rt: Rt, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: CreateRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed task request: {e}")))?;
    let view = rt.create(req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn show(rt: Rt, Path(id): Path<String>) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.show(&id).await?))
}

async fn destroy(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.destroy(&id, &actor(&headers)).await?))
}

async fn events(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<Event>>, ApiError> {
    Ok(Json(rt.events(&id).await?))
}

#[derive(Deserialize)]
struct WatchQuery {
    after: Option<u64>,
}

/// The task's event log as server-sent events: what is there after `after`,
/// then each new entry as it is written.
async fn watch(rt: Rt, Path(id): Path<String>, Query(q): Query<WatchQuery>) -> Result<Response, ApiError> {
    let events = rt.watch(&id, q.after.unwrap_or(0)).await?;
    let stream = events.map(|e| match e {
        Ok(e) => Sse::default().event(e.kind.as_str()).id(e.seq.to_string()).json_data(&e).map_err(|e| std::io::Error::other(e.to_string())),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    });
    Ok(axum::response::sse::Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}
