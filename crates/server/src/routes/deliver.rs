//! Deliverables, delivery records, completion, the ledger and the node's
//! signing keys.

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_runtime::deliver::DeliverRequest;

use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/tasks/{id}/deliveries", post(deliver))
        .route("/v1/tasks/{id}/complete", post(complete))
        .route("/v1/deliverables/{sha256}", get(deliverable))
        .route("/v1/records/{id}", get(record))
        .route("/v1/tasks/{id}/ledger", get(ledger))
        .route("/v1/tasks/{id}/checkpoint", post(checkpoint))
        .route("/v1/keys", get(keys))
        .route("/v1/keys/rotate", post(rotate_key))
}

async fn deliver(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: DeliverRequest = body("delivery", &b)?;
    Ok(Json(rt.deliver_outputs(&id, req, &actor(&headers)).await?).into_response())
}

async fn complete(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.complete(&id, &actor(&headers)).await?).into_response())
}

async fn deliverable(rt: Rt, Path(sha): Path<String>) -> Result<axum::body::Bytes, ApiError> {
    Ok(rt.deliverable(&sha).await?)
}

async fn record(rt: Rt, Path(id): Path<String>) -> Result<axum::body::Bytes, ApiError> {
    Ok(rt.record(&id).await?)
}

async fn ledger(rt: Rt, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(rt.ledger_report(&id).await?).into_response())
}

async fn checkpoint(rt: Rt, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let view = rt.checkpoint_now(&id, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn keys(rt: Rt) -> Response {
    Json(rt.public_keys()).into_response()
}

async fn rotate_key(rt: Rt, headers: HeaderMap) -> Result<Response, ApiError> {
    Ok(Json(rt.rotate_key(&actor(&headers))?).into_response())
}
