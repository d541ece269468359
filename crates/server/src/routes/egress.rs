//! A task's egress allowlist and its decision log.

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cairn_api::egress::PolicyUpdate;

use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new().route("/v1/tasks/{id}/egress", get(show).post(update))
}

async fn show(rt: Rt, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(rt.egress_view(&id).await?).into_response())
}

async fn update(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let update: PolicyUpdate = body("egress policy", &b)?;
    Ok(Json(rt.update_egress(&id, update, &actor(&headers)).await?).into_response())
}
