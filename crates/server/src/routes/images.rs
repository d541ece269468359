//! Base images: list, show, import, pull, commit (templates), remove.

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::images::{CommitRequest, Image, ImageDetail, ImportProgress, ImportRequest, PullProgress, PullRequest, Removed};
use cairn_api::ErrorBody;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/images", list)
        .post("/v1/images", import)
        .post("/v1/images/pull", pull)
        .get("/v1/images/pull/progress", pull_progress)
        .get("/v1/images/import/progress", import_progress)
        .post("/v1/images/commit", commit)
        .delete("/v1/images/{name}", remove)
        .get("/v1/images/{name}", show)
}

#[utoipa::path(
    get,
    path = "/v1/images/{name}",
    operation_id = "show_image",
    tag = "images",
    params(("name" = String, Path, description = "The image's name")),
    responses(
        (status = 200, description = "The image: kind, layers, manifest digest and run config", body = ImageDetail),
        (status = 404, description = "No such image", body = ErrorBody),
    )
)]
async fn show(rt: Rt, Path(name): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(rt.image_detail(&name).await?).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/images",
    operation_id = "list_images",
    tag = "images",
    responses((status = 200, description = "Every image", body = [Image]))
)]
async fn list(rt: Rt) -> Result<Response, ApiError> {
    Ok(Json(rt.list_images().await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/images",
    operation_id = "import_image",
    tag = "images",
    request_body = ImportRequest,
    responses(
        (status = 201, description = "The image, imported", body = Image),
        (status = 400, description = "A malformed body, a bad name or path", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    )
)]
async fn import(rt: Rt, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ImportRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed image request: {e}")))?;
    let image = rt.import_image(req).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/images/pull",
    operation_id = "pull_image",
    tag = "images",
    request_body = PullRequest,
    responses(
        (status = 201, description = "The image, pulled", body = Image),
        (status = 400, description = "A malformed body, a bad name or reference, a registry that refused access or sent corrupt data", body = ErrorBody),
        (status = 404, description = "The registry has no such image, or none for this host's platform", body = ErrorBody),
        (status = 409, description = "The name is taken or being pulled", body = ErrorBody),
        (status = 507, description = "The image does not fit on the disk", body = ErrorBody),
    )
)]
async fn pull(rt: Rt, b: axum::body::Bytes) -> Result<Response, ApiError> {
    // Not echoed in the error: the body may carry a password.
    let req: PullRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed pull request at line {} column {}", e.line(), e.column())))?;
    let image = rt.pull_image(req).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/images/commit",
    operation_id = "commit_image",
    tag = "images",
    request_body = CommitRequest,
    responses(
        (status = 201, description = "The template: the task's image with the task's writable layer on top", body = Image),
        (status = 400, description = "A malformed body or a bad name", body = ErrorBody),
        (status = 404, description = "No such task or snapshot", body = ErrorBody),
        (status = 409, description = "The name is taken, or the task has nothing to commit", body = ErrorBody),
        (status = 507, description = "The template does not fit on the disk", body = ErrorBody),
    )
)]
async fn commit(rt: Rt, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: CommitRequest = body("commit", &b)?;
    let image = rt.commit_image(req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

/// Which pull or import `GET /v1/images/pull/progress` or
/// `GET /v1/images/import/progress` reports.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PullQuery {
    /// The image's name: the import's or pull's `name` (a pull's
    /// reference when it gave none).
    name: String,
}

#[utoipa::path(
    get,
    path = "/v1/images/pull/progress",
    operation_id = "pull_progress",
    tag = "images",
    params(PullQuery),
    responses(
        (status = 200, description = "The pull's downloads so far", body = PullProgress),
        (status = 404, description = "No pull of this name is going on", body = ErrorBody),
    )
)]
async fn pull_progress(rt: Rt, Query(q): Query<PullQuery>) -> Result<Json<PullProgress>, ApiError> {
    Ok(Json(rt.pull_progress(&q.name)?))
}

#[utoipa::path(
    get,
    path = "/v1/images/import/progress",
    operation_id = "import_progress",
    tag = "images",
    params(PullQuery),
    responses(
        (status = 200, description = "How far the import has got", body = ImportProgress),
        (status = 404, description = "No import of this name is going on", body = ErrorBody),
    )
)]
async fn import_progress(rt: Rt, Query(q): Query<PullQuery>) -> Result<Json<ImportProgress>, ApiError> {
    Ok(Json(rt.import_progress(&q.name)?))
}

#[utoipa::path(
    delete,
    path = "/v1/images/{name}",
    operation_id = "remove_image",
    tag = "images",
    params(("name" = String, Path, description = "The image's name")),
    responses(
        (status = 200, description = "The image was removed", body = Removed),
        (status = 404, description = "No such image", body = ErrorBody),
        (status = 409, description = "A task or a template uses it", body = ErrorBody),
    )
)]
async fn remove(rt: Rt, Path(name): Path<String>) -> Result<Json<Removed>, ApiError> {
    rt.remove_image(&name).await?;
    Ok(Json(Removed { removed: name }))
}
