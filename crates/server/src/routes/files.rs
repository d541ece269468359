//! Files of a sandbox:
//! - `cairn cp`: `GET /v1/tasks/{id}/files?path=P` answers a tar whose top
//!   entry is P's last component; `PUT ...?path=P&name=N` unpacks a tar
//!   whose top entry is N.
//! - One file as raw bytes: `GET /v1/tasks/{id}/file?path=P` answers its
//!   content, `PUT` with the content as the body writes it (at most
//!   `cairn_runtime::files::MAX_FILE` bytes either way).
//! - A directory's entries: `GET /v1/tasks/{id}/dir?path=P`.

use axum::body::Body;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use axum::extract::{Path, Query, RawQuery};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use cairn_api::files::{CopiedIn, DirListing, Links, Written};
use cairn_api::ErrorBody;
use futures_util::TryStreamExt;
use serde::Deserialize;

use super::served::Routes;
use super::{actor, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    let one_file = Routes::new()
        .get("/v1/tasks/{id}/file", read_one)
        .put("/v1/tasks/{id}/file", write_one)
        .wrap(|r| r.layer(axum::extract::DefaultBodyLimit::max(cairn_runtime::files::MAX_FILE as usize)));
    Routes::new().get("/v1/tasks/{id}/files", download).put("/v1/tasks/{id}/files", upload).get("/v1/tasks/{id}/dir", list_dir).merge(one_file)
}

/// The `path` parameter of the query, decoded to its bytes: a sandbox path
/// is a Linux name, which need not be UTF-8 (`%E9` stays the byte 0xE9,
/// where a text parameter would turn it into U+FFFD).
fn path_param(query: Option<&str>) -> Result<OsString, ApiError> {
    for pair in query.unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "path" {
            let value = value.replace('+', " ");
            return Ok(OsString::from_vec(percent_encoding::percent_decode_str(&value).collect()));
        }
    }
    Err(ApiError::bad_request("missing path= (the sandbox path)"))
}

/// The text parameters of a copy ([`path_param`] reads the path).
#[derive(Deserialize)]
struct FileQuery {
    name: Option<String>,
    /// Copying out: `refuse` (default), `keep` or `follow` symlinks.
    links: Option<String>,
}

/// The query of a copy out, as documented ([`FileQuery`] parses both ways).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct TarOutQuery {
    /// The sandbox path to copy out.
    path: String,
    /// Symlinks that are absolute or leave the tree: `refuse` (400, the
    /// default), `keep` (copied as links) or `follow` (their targets,
    /// resolved inside the sandbox).
    links: Option<String>,
}

/// The query of a copy in, as documented.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct TarInQuery {
    /// The sandbox directory to unpack into.
    path: String,
    /// The tar's top-level entry.
    name: String,
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/files",
    operation_id = "copy_out",
    tag = "files",
    params(("id" = String, Path, description = "The task's id or name"), TarOutQuery),
    responses(
        (status = 200, description = "A tar whose top entry is the last component of `path`", content_type = "application/x-tar"),
        (status = 400, description = "A bad path, or a symlink that is absolute or leaves the tree (unless `links` says otherwise)", body = ErrorBody),
        (status = 404, description = "No such task or path", body = ErrorBody),
    )
)]
async fn download(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let links = match q.links.as_deref() {
        None => Links::Refuse,
        Some(l) => Links::parse(l).ok_or_else(|| ApiError::bad_request(format!("links={l:?}: expected refuse, keep or follow")))?,
    };
    let tar = cairn_runtime::files::download(rt.0.clone(), &id, path_param(raw.as_deref())?, links, actor(&headers)).await?;
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-tar")
        .body(Body::from_stream(tar))
        .map_err(|e| ApiError::new(cairn_api::ErrorCode::Internal, e.to_string()))
}

#[utoipa::path(
    put,
    path = "/v1/tasks/{id}/files",
    operation_id = "copy_in",
    tag = "files",
    params(("id" = String, Path, description = "The task's id or name"), TarInQuery),
    request_body(description = "A tar whose top entry is `name`", content_type = "application/x-tar"),
    responses(
        (status = 200, description = "The tar was unpacked", body = CopiedIn),
        (status = 400, description = "A bad path or tar, or no `name`", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
async fn upload(rt: Rt, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>, RawQuery(raw): RawQuery, body: Body) -> Result<Json<CopiedIn>, ApiError> {
    let name = q.name.ok_or_else(|| ApiError::bad_request("missing name= (the top-level entry of the tar)"))?;
    let path = path_param(raw.as_deref())?;
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    Ok(Json(cairn_runtime::files::upload(rt.0.clone(), &id, path, name, stream, actor(&headers)).await?))
}

/// The query of the one-file and directory routes, as documented
/// ([`path_param`] reads it as bytes).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct OneFile {
    /// The path in the sandbox, percent-encoded as bytes (a name that is
    /// not UTF-8 is given byte for byte, e.g. `caf%E9`).
    path: String,
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/file",
    operation_id = "read_file",
    tag = "files",
    params(("id" = String, Path, description = "The task's id or name"), OneFile),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 400, description = "The path is a symlink, a directory or a special file", body = ErrorBody),
        (status = 404, description = "No such task or file", body = ErrorBody),
        (status = 413, description = "The file is over 64 MiB", body = ErrorBody),
    )
)]
async fn read_one(rt: Rt, Path(id): Path<String>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let data = cairn_runtime::files::read_one(rt.0.clone(), &id, path_param(raw.as_deref())?, actor(&headers)).await?;
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(Body::from(data))
        .map_err(|e| ApiError::new(cairn_api::ErrorCode::Internal, e.to_string()))
}

#[utoipa::path(
    put,
    path = "/v1/tasks/{id}/file",
    operation_id = "write_file",
    tag = "files",
    params(("id" = String, Path, description = "The task's id or name"), OneFile),
    request_body(description = "The file's bytes (at most 64 MiB)", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "The file was written (made, or a regular file replaced)", body = Written),
        (status = 400, description = "The path is a symlink, a directory or a special file", body = ErrorBody),
        (status = 404, description = "No such task, or the file's directory does not exist", body = ErrorBody),
        (status = 413, description = "The body is over 64 MiB", body = ErrorBody),
    )
)]
async fn write_one(rt: Rt, Path(id): Path<String>, headers: HeaderMap, RawQuery(raw): RawQuery, body: axum::body::Bytes) -> Result<Json<Written>, ApiError> {
    let bytes = body.len() as u64;
    let path = path_param(raw.as_deref())?;
    let shown = cairn_runtime::files::write_one(rt.0.clone(), &id, path, body, actor(&headers)).await?;
    Ok(Json(Written { path: shown, bytes }))
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/dir",
    operation_id = "list_dir",
    tag = "files",
    description = "A directory's entries, sorted by name, at most 10,000 (then `truncated`). The path is resolved inside the sandbox; a symlink entry is listed with its target, not followed.",
    params(("id" = String, Path, description = "The task's id or name"), OneFile),
    responses(
        (status = 200, description = "The directory's entries", body = DirListing),
        (status = 400, description = "The path is not a directory, or leaves the sandbox", body = ErrorBody),
        (status = 404, description = "No such task or directory", body = ErrorBody),
        (status = 409, description = "The task has no running sandbox", body = ErrorBody),
    )
)]
async fn list_dir(rt: Rt, Path(id): Path<String>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Result<Json<DirListing>, ApiError> {
    Ok(Json(cairn_runtime::files::list_dir(rt.0.clone(), &id, path_param(raw.as_deref())?, actor(&headers)).await?))
}
