//! Snapshots, rollback in place, forks and the progress of either.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_api::snapshots::{ForkRequest, OpProgress, RollbackAnswer, RollbackRequest, SnapshotRequest};
use cairn_core::Snapshot;
use serde::Deserialize;

use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/tasks/{id}/snapshots", get(list).post(take))
        .route("/v1/tasks/{id}/snapshots/diff", get(diff))
        .route("/v1/tasks/{id}/rollback", post(rollback))
        .route("/v1/tasks/{id}/fork", post(fork))
        .route("/v1/tasks/{id}/progress", get(progress))
}

async fn take(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: SnapshotRequest = body("snapshot", &b)?;
    let snap = rt.snapshot(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(snap)).into_response())
}

async fn list(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<Snapshot>>, ApiError> {
    Ok(Json(rt.list_snapshots(&id).await?))
}

#[derive(Deserialize)]
struct DiffQuery {
    a: String,
    b: String,
}

async fn diff(rt: Rt, Path(id): Path<String>, Query(q): Query<DiffQuery>) -> Result<Json<cairn_snapshot::Diff>, ApiError> {
    Ok(Json(rt.diff(&id, &q.a, &q.b).await?))
}

async fn rollback(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<RollbackAnswer>, ApiError> {
    let req: RollbackRequest = body("rollback", &b)?;
    Ok(Json(rt.rollback(&id, req, &actor(&headers)).await?))
}

async fn fork(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ForkRequest = body("fork", &b)?;
    let children = rt.fork(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(children)).into_response())
}

async fn progress(rt: Rt, Path(id): Path<String>) -> Result<Json<Option<OpProgress>>, ApiError> {
    Ok(Json(rt.progress_of(&id).await?))
}
