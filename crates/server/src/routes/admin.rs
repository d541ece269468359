//! The daemon itself: health, Prometheus metrics, the blob store's gc and
//! check.

use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_api::snapshots::{CheckRequest, GcAnswer, GcRequest};
use cairn_runtime::Health;
use serde_json::Value;

use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/gc", post(gc))
        .route("/v1/check", post(check))
}

async fn health(rt: Rt) -> Json<Health> {
    Json(rt.health())
}

async fn gc(rt: Rt, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<GcAnswer>, ApiError> {
    let req: GcRequest = body("gc", &b)?;
    Ok(Json(rt.gc(req, &actor(&headers)).await?))
}

async fn check(rt: Rt, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: CheckRequest = body("check", &b)?;
    Ok(Json(serde_json::json!(rt.check(req.read_data).await?)))
}

/// OpenMetrics text for Prometheus (bearer token required, as for the API).
async fn metrics(rt: Rt) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let text = rt.metrics_text().await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}
