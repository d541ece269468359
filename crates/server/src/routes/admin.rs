//! The daemon itself: health, Prometheus metrics, the blob store's gc and
//! check, and a backup of the node's state.

use axum::http::HeaderMap;
use axum::Json;
use cairn_api::health::Health;
use cairn_api::snapshots::{CheckReport, CheckRequest, GcAnswer, GcRequest};
use serde_json::Value;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/health", health).get("/metrics", metrics).post("/v1/gc", gc).post("/v1/check", check).get("/v1/backup", backup)
}

#[utoipa::path(get, path = "/v1/health", tag = "daemon", responses((status = 200, description = "The daemon's version and home", body = Health)))]
async fn health(rt: Rt) -> Json<Health> {
    let h = rt.health();
    Json(Health { version: h.version.to_owned(), home: h.home.map(|p| p.to_string_lossy().into_owned()) })
}

#[utoipa::path(
    post,
    path = "/v1/gc",
    tag = "daemon",
    request_body(content = Option<GcRequest>, description = "An empty body is `{}`"),
    responses((status = 200, description = "What retention expired, then what the mark and sweep freed (with `dry_run`: would free)", body = GcAnswer))
)]
async fn gc(rt: Rt, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<GcAnswer>, ApiError> {
    let req: GcRequest = body("gc", &b)?;
    Ok(Json(rt.gc(req, &actor(&headers)).await?))
}

#[utoipa::path(
    post,
    path = "/v1/check",
    tag = "daemon",
    request_body(content = Option<CheckRequest>, description = "An empty body is `{}`"),
    responses((status = 200, description = "The blob store verified; `problems` is empty when it is whole", body = CheckReport))
)]
async fn check(rt: Rt, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: CheckRequest = body("check", &b)?;
    Ok(Json(serde_json::json!(rt.check(req.read_data).await?)))
}

/// OpenMetrics text for Prometheus (bearer token required, as for the API).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "daemon",
    responses((status = 200, description = "Prometheus metrics (see docs/api.md)", content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String))
)]
async fn metrics(rt: Rt) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let text = rt.metrics_text().await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}

/// The node's store, blob store and keys as one tar stream, consistent
/// while the daemon runs (`cairn backup`; the runtime's `backup` module).
#[utoipa::path(
    get,
    path = "/v1/backup",
    tag = "daemon",
    responses(
        (status = 200, description = "A tar: cairn.db, the key files, blobs/KIND/ID, and cairn-backup.json last, listing every entry's size and SHA-256", content_type = "application/x-tar"),
        (status = 409, description = "The store is a database server several nodes share: its own tools back it up", body = cairn_api::ErrorBody),
    )
)]
async fn backup(rt: Rt) -> Result<axum::response::Response, ApiError> {
    let chunks = rt.backup().await?;
    axum::response::Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "application/x-tar")
        .body(axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(chunks)))
        .map_err(|e| ApiError::new(cairn_api::ErrorCode::Internal, e.to_string()))
}
