//! Waits and the events that satisfy them: approvals, operator events, the
//! inbox; suspend and resume by hand.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::tasks::TaskView;
use cairn_api::waits::{ApproveRequest, Delivered, EventRequest, WaitRequest, WaitView};
use cairn_api::ErrorBody;
use cairn_api::InboxEvent;
use serde::Deserialize;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .post("/v1/tasks/{id}/waits", create)
        .delete("/v1/tasks/{id}/waits", cancel)
        .get("/v1/waits/{id}", show)
        .post("/v1/tasks/{id}/approve", approve)
        .get("/v1/tasks/{id}/inbox", inbox)
        .post("/v1/tasks/{id}/inbox", operator_event)
        .post("/v1/tasks/{id}/suspend", suspend)
        .post("/v1/tasks/{id}/resume", resume)
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/waits",
    operation_id = "create_wait",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body = WaitRequest,
    responses(
        (status = 201, description = "The wait; the task is suspended unless it is already satisfied", body = WaitView),
        (status = 400, description = "Not exactly one of `approval`, `webhook`, `timer`, or a bad duration or name", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task already waits, or cannot in its state", body = ErrorBody),
    )
)]
async fn create(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: WaitRequest = body("wait", &b)?;
    let view = rt.wait(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[utoipa::path(
    delete,
    path = "/v1/tasks/{id}/waits",
    operation_id = "cancel_wait",
    tag = "waits",
    description = "Cancels the task's pending wait: it ends without an event (state `cancelled`). A task suspended for it wakes; a running one runs on.",
    params(("id" = String, Path, description = "The task's id or name")),
    responses(
        (status = 200, description = "The cancelled wait", body = WaitView),
        (status = 404, description = "No such task, or it has no pending wait", body = ErrorBody),
    )
)]
async fn cancel(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<WaitView>, ApiError> {
    Ok(Json(rt.cancel_wait(&id, &actor(&headers)).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Wait up to this long (at most 300000; more is taken as 300000) for
    /// the wait to be satisfied.
    #[param(maximum = 300000)]
    block_ms: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/v1/waits/{id}",
    operation_id = "show_wait",
    tag = "waits",
    params(("id" = String, Path, description = "The wait's id"), WaitQuery),
    responses((status = 200, description = "The wait, once satisfied and the task runs, or after `block_ms`", body = WaitView), (status = 404, description = "No such wait", body = ErrorBody))
)]
async fn show(rt: Rt, Path(id): Path<String>, Query(q): Query<WaitQuery>) -> Result<Response, ApiError> {
    let block = q.block_ms.map(|ms| std::time::Duration::from_millis(ms.min(300_000)));
    Ok(Json(rt.get_wait(&id, block).await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/approve",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body(content = Option<ApproveRequest>, description = "An empty body approves"),
    responses(
        (status = 200, description = "The decision, delivered", body = Delivered),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "No approval is pending", body = ErrorBody),
    )
)]
async fn approve(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Delivered>, ApiError> {
    let req: ApproveRequest = body("approve", &b)?;
    Ok(Json(rt.approve(&id, req, &actor(&headers)).await?))
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/inbox",
    operation_id = "show_inbox",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task's inbox: every event received", body = [InboxEvent]), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn inbox(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<InboxEvent>>, ApiError> {
    Ok(Json(rt.inbox(&id).await?))
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/inbox",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body = EventRequest,
    responses(
        (status = 202, description = "The event was stored; what it satisfied", body = Delivered),
        (status = 400, description = "A malformed body or a bad event name", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
async fn operator_event(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: EventRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed event request: {e}")))?;
    let d = rt.operator_event(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::ACCEPTED, Json(d)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/suspend",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task, suspended", body = TaskView), (status = 404, description = "No such task", body = ErrorBody), (status = 409, description = "Not possible in the task's state", body = ErrorBody))
)]
async fn suspend(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.suspend(&id, &actor(&headers)).await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/resume",
    tag = "waits",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task, woken", body = TaskView), (status = 404, description = "No such task", body = ErrorBody), (status = 409, description = "Not possible in the task's state", body = ErrorBody))
)]
async fn resume(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(rt.resume(&id, &actor(&headers)).await?))
}
