//! Snapshots, rollback in place, forks and the progress of either.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::snapshots::{Diff, ForkRequest, OpProgress, RollbackAnswer, RollbackRequest, SnapshotRequest};
use cairn_api::tasks::TaskView;
use cairn_api::ErrorBody;
use cairn_api::Snapshot;
use serde::Deserialize;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/tasks/{id}/snapshots", list)
        .post("/v1/tasks/{id}/snapshots", take)
        .get("/v1/tasks/{id}/snapshots/diff", diff)
        .post("/v1/tasks/{id}/rollback", rollback)
        .post("/v1/tasks/{id}/fork", fork)
        .get("/v1/tasks/{id}/progress", progress)
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/snapshots",
    operation_id = "take_snapshot",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body(content = Option<SnapshotRequest>, description = "An empty body is `{}`"),
    responses(
        (status = 201, description = "The snapshot taken", body = Snapshot),
        (status = 400, description = "A malformed body or an unknown kind", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has no running sandbox to snapshot", body = ErrorBody),
    )
)]
async fn take(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: SnapshotRequest = body("snapshot", &b)?;
    let snap = rt.snapshot(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(snap)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/snapshots",
    operation_id = "list_snapshots",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The task's snapshots, oldest first", body = [Snapshot]), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn list(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<Snapshot>>, ApiError> {
    Ok(Json(rt.list_snapshots(&id).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DiffQuery {
    /// The snapshot to compare from.
    a: String,
    /// The snapshot to compare to.
    b: String,
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/snapshots/diff",
    operation_id = "diff_snapshots",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name"), DiffQuery),
    responses((status = 200, description = "Sandbox paths added, changed and deleted from `a` to `b`", body = Diff), (status = 404, description = "No such task or snapshot", body = ErrorBody))
)]
async fn diff(rt: Rt, Path(id): Path<String>, Query(q): Query<DiffQuery>) -> Result<Json<Diff>, ApiError> {
    Ok(Json(rt.diff(&id, &q.a, &q.b).await?))
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/rollback",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body = RollbackRequest,
    responses(
        (status = 200, description = "The task rolled back in place", body = RollbackAnswer),
        (status = 400, description = "Not exactly one of `to` and `last_healthy`", body = ErrorBody),
        (status = 404, description = "No such task or snapshot", body = ErrorBody),
        (status = 409, description = "Not possible in the task's state", body = ErrorBody),
    )
)]
async fn rollback(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<RollbackAnswer>, ApiError> {
    let req: RollbackRequest = body("rollback", &b)?;
    Ok(Json(rt.rollback(&id, req, &actor(&headers)).await?))
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/fork",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body(content = Option<ForkRequest>, description = "An empty body is `{}`: one fork of the latest snapshot"),
    responses(
        (status = 201, description = "The new tasks", body = [TaskView]),
        (status = 400, description = "A count outside 1..128", body = ErrorBody),
        (status = 404, description = "No such task or snapshot", body = ErrorBody),
    )
)]
async fn fork(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ForkRequest = body("fork", &b)?;
    let children = rt.fork(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(children)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/progress",
    tag = "snapshots",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The snapshot or restore running on the task, or `null`", body = Option<OpProgress>), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn progress(rt: Rt, Path(id): Path<String>) -> Result<Json<Option<OpProgress>>, ApiError> {
    Ok(Json(rt.progress_of(&id).await?))
}
