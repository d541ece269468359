//! Deliverables, delivery records, completion, the ledger and the node's
//! signing keys.

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::deliver::{DeliverRequest, DeliveryView};
use cairn_api::ledger::{CheckpointView, KeyInfo, LedgerView};
use cairn_api::tasks::TaskView;
use cairn_api::ErrorBody;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .post("/v1/tasks/{id}/deliveries", deliver)
        .post("/v1/tasks/{id}/complete", complete)
        .get("/v1/deliverables/{sha256}", deliverable)
        .get("/v1/records/{id}", record)
        .get("/v1/tasks/{id}/ledger", ledger)
        .post("/v1/tasks/{id}/checkpoint", checkpoint)
        .get("/v1/keys", keys)
        .post("/v1/keys/rotate", rotate_key)
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/deliveries",
    operation_id = "deliver_outputs",
    tag = "deliveries",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body(content = Option<DeliverRequest>, description = "Sandbox paths to deliver; an empty body is `{}`"),
    responses(
        (status = 200, description = "The deliverables stored and the signed record", body = DeliveryView),
        (status = 400, description = "A malformed body or a bad path", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not possible in the task's state", body = ErrorBody),
    )
)]
async fn deliver(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: DeliverRequest = body("delivery", &b)?;
    Ok(Json(rt.deliver_outputs(&id, req, &actor(&headers)).await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/complete",
    operation_id = "complete_task",
    tag = "deliveries",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task, in state `completed`", body = TaskView), (status = 404, description = "No such task", body = ErrorBody), (status = 409, description = "Not possible in the task's state", body = ErrorBody))
)]
async fn complete(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.complete(&id, &actor(&headers)).await?).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/deliverables/{sha256}",
    operation_id = "get_deliverable",
    tag = "deliveries",
    params(("sha256" = String, Path, description = "The deliverable's SHA-256, 64 hex characters")),
    responses((status = 200, description = "The deliverable's bytes", content_type = "application/octet-stream"), (status = 404, description = "No such deliverable", body = ErrorBody))
)]
async fn deliverable(rt: Rt, Path(sha): Path<String>) -> Result<axum::body::Bytes, ApiError> {
    Ok(rt.deliverable(&sha).await?)
}

#[utoipa::path(
    get,
    path = "/v1/records/{id}",
    operation_id = "get_record",
    tag = "deliveries",
    params(("id" = String, Path, description = "The record's id: the SHA-256 of its bytes")),
    responses((status = 200, description = "The delivery record (a DSSE envelope), its exact bytes", content_type = "application/octet-stream"), (status = 404, description = "No such record", body = ErrorBody))
)]
async fn record(rt: Rt, Path(id): Path<String>) -> Result<axum::body::Bytes, ApiError> {
    Ok(rt.record(&id).await?)
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/ledger",
    operation_id = "task_ledger",
    tag = "deliveries",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The hash chain walked and checked against every checkpoint", body = LedgerView), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn ledger(rt: Rt, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(rt.ledger_report(&id).await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/checkpoint",
    operation_id = "checkpoint_ledger",
    tag = "deliveries",
    params(("id" = String, Path, description = "The task's id or name")),
    responses(
        (status = 201, description = "A signed checkpoint of the chain's head now", body = CheckpointView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The ledger does not verify", body = ErrorBody),
    )
)]
async fn checkpoint(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let view = rt.checkpoint_now(&id, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/keys",
    operation_id = "list_keys",
    tag = "deliveries",
    responses((status = 200, description = "Every signing key the node has used, the current one first, then the other nodes' keys", body = [KeyInfo]))
)]
async fn keys(rt: Rt) -> Result<Response, ApiError> {
    Ok(Json(rt.public_keys().await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/keys/rotate",
    tag = "deliveries",
    responses((status = 200, description = "The new current key (old public keys stay)", body = KeyInfo))
)]
async fn rotate_key(rt: Rt, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.rotate_key(&actor(&headers)).await?).into_response())
}
