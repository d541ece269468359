//! Files of a sandbox:
//! - `cairn cp`: `GET /v1/tasks/{id}/files?path=P` answers a tar whose top
//!   entry is P's last component; `PUT ...?path=P&name=N` unpacks a tar
//!   whose top entry is N.
//! - One file as raw bytes: `GET /v1/tasks/{id}/file?path=P` answers its
//!   content, `PUT` with the content as the body writes it (at most
//!   `cairn_runtime::files::MAX_FILE` bytes either way).
//! - A directory's entries: `GET /v1/tasks/{id}/dir?path=P`.

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use cairn_sandbox::files::LinkPolicy;
use futures_util::TryStreamExt;
use serde::Deserialize;

use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/tasks/{id}/files", get(download).put(upload))
        .route(
            "/v1/tasks/{id}/file",
            get(read_one).put(write_one).layer(axum::extract::DefaultBodyLimit::max(cairn_runtime::files::MAX_FILE as usize)),
        )
        .route("/v1/tasks/{id}/dir", get(list_dir))
}

#[derive(Deserialize)]
struct FileQuery {
    path: String,
    name: Option<String>,
    /// Copying out: `refuse` (default), `keep` or `follow` symlinks.
    links: Option<String>,
}

async fn download(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Result<Response, ApiError> {
    let links = match q.links.as_deref() {
        None => LinkPolicy::Refuse,
        Some(l) => LinkPolicy::parse(l).ok_or_else(|| ApiError::bad_request(format!("links={l:?}: expected refuse, keep or follow")))?,
    };
    let tar = cairn_runtime::files::download(rt.0.clone(), &id, q.path, links, actor(&headers)).await?;
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-tar")
        .body(Body::from_stream(tar))
        .map_err(|e| ApiError::new(cairn_api::ErrorCode::Internal, e.to_string()))
}

async fn upload(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>, body: Body) -> Result<Json<cairn_api::files::CopiedIn>, ApiError> {
    let name = q.name.ok_or_else(|| ApiError::bad_request("missing name= (the top-level entry of the tar)"))?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(cairn_runtime::files::upload(rt.0.clone(), &id, q.path, name, stream, actor(&headers)).await?))
}

#[derive(Deserialize)]
struct OneFile {
    path: String,
}

async fn read_one(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<OneFile>) -> Result<Response, ApiError> {
    let data = cairn_runtime::files::read_one(rt.0.clone(), &id, q.path, actor(&headers)).await?;
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(Body::from(data))
        .map_err(|e| ApiError::new(cairn_api::ErrorCode::Internal, e.to_string()))
}

async fn write_one(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<OneFile>, body: axum::body::Bytes) -> Result<Json<serde_json::Value>, ApiError> {
    let bytes = body.len();
    cairn_runtime::files::write_one(rt.0.clone(), &id, q.path.clone(), body, actor(&headers)).await?;
    Ok(Json(serde_json::json!({ "path": q.path, "bytes": bytes })))
}

async fn list_dir(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<OneFile>) -> Result<Json<cairn_api::files::DirListing>, ApiError> {
    Ok(Json(cairn_runtime::files::list_dir(rt.0.clone(), &id, q.path, actor(&headers)).await?))
}
