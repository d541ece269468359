//! Waits and the events that satisfy them: approvals, operator events, the
//! inbox; suspend and resume by hand.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_api::tasks::TaskView;
use cairn_api::waits::{ApproveRequest, Delivered, EventRequest, WaitRequest};
use cairn_core::InboxEvent;
use serde::Deserialize;

use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/tasks/{id}/waits", post(create))
        .route("/v1/waits/{id}", get(show))
        .route("/v1/tasks/{id}/approve", post(approve))
        .route("/v1/tasks/{id}/inbox", get(inbox).post(operator_event))
        .route("/v1/tasks/{id}/suspend", post(suspend))
        .route("/v1/tasks/{id}/resume", post(resume))
}

/// The answer to an event: stored (or a duplicate), what it satisfied.
pub(super) fn delivered(d: &cairn_store::Delivered) -> Delivered {
    Delivered { event: d.event.clone(), duplicate: d.duplicate, satisfied: d.satisfied.clone(), wakes: d.wake }
}

async fn create(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: WaitRequest = body("wait", &b)?;
    let view = rt.wait(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[derive(Deserialize)]
struct WaitQuery {
    block_ms: Option<u64>,
}

async fn show(rt: Rt, Path(id): Path<String>, Query(q): Query<WaitQuery>) -> Result<Response, ApiError> {
    let block = q.block_ms.map(|ms| std::time::Duration::from_millis(ms.min(300_000)));
    Ok(Json(rt.get_wait(&id, block).await?).into_response())
}

async fn approve(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Delivered>, ApiError> {
    let req: ApproveRequest = body("approve", &b)?;
    Ok(Json(delivered(&rt.approve(&id, req, &actor(&headers)).await?)))
}

async fn inbox(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<InboxEvent>>, ApiError> {
    Ok(Json(rt.inbox(&id).await?))
}

async fn operator_event(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: EventRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed event request: {e}")))?;
    let d = rt.operator_event(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::ACCEPTED, Json(delivered(&d))).into_response())
}

async fn suspend(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.suspend(&id, &actor(&headers)).await?).into_response())
}

async fn resume(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.resume(&id, &actor(&headers)).await?))
}
