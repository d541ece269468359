//! envd's plain HTTP routes: `/files` (a file's bytes out, or files in as
//! multipart parts or one raw body), `/health` and `/envs`. `/files` takes
//! the sandbox's access token, or a URL signed with it (what the SDKs'
//! `download_url` and `upload_url` make). Files go through the runtime's
//! descriptor-relative file code (reads, within its single-file size
//! limit) or a command in the sandbox (writes, as the call's user).

use std::collections::BTreeMap;

use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD_NO_PAD as B64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::envd::Ctx;
use crate::filesystem::{absolute, workdir, write_file};
use crate::E2bError;

pub(crate) fn routes() -> Router<Ctx> {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/envs", get(envs))
        // Uploads stream into the sandbox: bounded by its disk, not here.
        .route("/files", get(download).post(upload).layer(DefaultBodyLimit::disable()))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// E2B's URL signature: `v1_` and the unpadded base64 of
/// SHA-256(`path:operation:user:token[:expiration]`).
fn signature(path: &str, operation: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(e) = expiration {
        raw.push_str(&format!(":{e}"));
    }
    format!("v1_{}", B64.encode(Sha256::digest(raw.as_bytes())))
}

/// The task, if the request carries its access token or a valid signature
/// for `operation` on the query's path.
fn authorized<'a>(ctx: &'a Ctx, headers: &HeaderMap, q: &FileQuery, operation: &str) -> Result<&'a str, E2bError> {
    if headers.contains_key("x-access-token") {
        return ctx.authorized(headers);
    }
    let Some(given) = &q.signature else {
        return Err(E2bError::unauthenticated("missing access token (X-Access-Token) or URL signature"));
    };
    if let Some(exp) = q.signature_expiration {
        if exp < now_s() {
            return Err(E2bError::unauthenticated("the signed URL has expired"));
        }
    }
    let token = ctx.rt.sandbox_access_token(&ctx.task);
    let path = q.path.as_deref().unwrap_or("");
    let user = q.username.as_deref().unwrap_or("");
    let expected = signature(path, operation, user, &token, q.signature_expiration);
    if subtle_eq(expected.as_bytes(), given.as_bytes()) {
        Ok(&ctx.task)
    } else {
        Err(E2bError::unauthenticated(format!("the URL signature is not valid for {operation} of {path:?}")))
    }
}

/// The live task whose access token signed the `/files` URL of `req`, if
/// any (the SDKs' signed URLs name no sandbox when `E2B_SANDBOX_URL` is one
/// address for all).
pub(crate) async fn signer(rt: &std::sync::Arc<cairn_runtime::Runtime>, method: axum::http::Method, query: Option<String>) -> Option<String> {
    let q: FileQuery = serde_urlencoded_query(&query?)?;
    let given = q.signature.as_deref()?;
    let operation = if method == axum::http::Method::POST { "write" } else { "read" };
    let (path, user) = (q.path.as_deref().unwrap_or(""), q.username.as_deref().unwrap_or(""));
    let tasks = rt.list().await.ok()?;
    tasks.into_iter().filter(|t| !t.task.state.is_terminal()).map(|t| t.task.id.to_string()).find(|id| {
        let token = rt.sandbox_access_token(id);
        subtle_eq(signature(path, operation, user, &token, q.signature_expiration).as_bytes(), given.as_bytes())
    })
}

fn serde_urlencoded_query(query: &str) -> Option<FileQuery> {
    Query::<FileQuery>::try_from_uri(&format!("/?{query}").parse().ok()?).ok().map(|Query(q)| q)
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn subtle_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

async fn envs(State(ctx): State<Ctx>, headers: HeaderMap) -> Response {
    let listed = async {
        let task = ctx.authorized(&headers)?;
        let view = ctx.rt.show(task).await?;
        let env: BTreeMap<String, String> = view.task.config.env.iter().map(|e| (e.key.clone(), e.value.clone())).collect();
        Ok::<_, E2bError>(Json(env))
    }
    .await;
    match listed {
        Ok(j) => j.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn download(State(ctx): State<Ctx>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Response {
    let read = async {
        let task = authorized(&ctx, &headers, &q, "read")?;
        let path = absolute(q.path.as_deref().unwrap_or(""), &workdir(&ctx, task).await?)?;
        let data = cairn_runtime::files::read_one(ctx.rt.clone(), task, path, "e2b".into()).await?;
        Ok::<_, E2bError>(data)
    }
    .await;
    match read {
        Ok(data) => ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn upload(State(ctx): State<Ctx>, headers: HeaderMap, Query(q): Query<FileQuery>, req: Request) -> Response {
    let written = async {
        let task = authorized(&ctx, &headers, &q, "write")?.to_owned();
        let wd = workdir(&ctx, &task).await?;
        let multipart = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|t| t.starts_with("multipart/form-data"));
        let mut written = Vec::new();
        if multipart {
            let mut form = Multipart::from_request(req, &()).await.map_err(|e| E2bError::bad_request(format!("malformed multipart upload: {e}")))?;
            while let Some(mut field) = form.next_field().await.map_err(|e| E2bError::bad_request(format!("malformed multipart upload: {e}")))? {
                // One file: the query's path; several: each part's file name.
                let target = match (&q.path, field.file_name()) {
                    (Some(p), _) if !p.is_empty() => p.clone(),
                    (_, Some(name)) if !name.is_empty() => name.to_owned(),
                    _ => return Err(E2bError::bad_request("an uploaded part has no path: give ?path= or the part's file name")),
                };
                let path = absolute(&target, &wd)?;
                let (tx, rx) = mpsc::channel(8);
                let feed = async move {
                    let mut drain = Drain::default();
                    while let Some(chunk) = field.chunk().await.map_err(|e| E2bError::bad_request(format!("the upload broke off: {e}")))? {
                        if drain.give(&tx, chunk).await {
                            break;
                        }
                    }
                    Ok::<_, E2bError>(())
                };
                let (w, f) = tokio::join!(write_file(&ctx, &task, &headers, &path, rx), feed);
                w?;
                f?;
                written.push(entry(&path));
            }
        } else {
            let Some(target) = q.path.clone().filter(|p| !p.is_empty()) else {
                return Err(E2bError::bad_request("a raw upload needs ?path="));
            };
            let path = absolute(&target, &wd)?;
            let (tx, rx) = mpsc::channel(8);
            let mut body = req.into_body().into_data_stream();
            let feed = async move {
                let mut drain = Drain::default();
                while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
                    let chunk = chunk.map_err(|e| E2bError::bad_request(format!("the upload broke off: {e}")))?;
                    if drain.give(&tx, chunk).await {
                        break;
                    }
                }
                Ok::<_, E2bError>(())
            };
            let (w, f) = tokio::join!(write_file(&ctx, &task, &headers, &path, rx), feed);
            w?;
            f?;
            written.push(entry(&path));
        }
        if written.is_empty() {
            return Err(E2bError::bad_request("the upload holds no file"));
        }
        Ok::<_, E2bError>(written)
    }
    .await;
    match written {
        Ok(w) => Json(w).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Most bytes of an upload read and dropped after its write failed.
const MAX_DRAIN: u64 = 1 << 30;

/// Feeds an upload's chunks to its write; once the write has ended (a full
/// disk, say), reads the rest of the body and drops it, so that the client,
/// still sending, gets the answer instead of a reset connection: up to
/// [`MAX_DRAIN`] bytes, then the connection may go.
#[derive(Default)]
struct Drain {
    dropped: Option<u64>,
}

impl Drain {
    /// Gives `chunk` to the write, or drops it once the write is gone;
    /// true when no more of the body need be read.
    async fn give(&mut self, tx: &mpsc::Sender<axum::body::Bytes>, chunk: axum::body::Bytes) -> bool {
        let len = chunk.len() as u64;
        match &mut self.dropped {
            None if tx.send(chunk).await.is_ok() => false,
            None => {
                self.dropped = Some(len);
                false
            }
            Some(n) => {
                *n += len;
                *n > MAX_DRAIN
            }
        }
    }
}

fn entry(path: &str) -> serde_json::Value {
    json!({ "name": path.rsplit('/').next().unwrap_or_default(), "type": "file", "path": path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_e2bs() {
        // The same construction as the SDK's: sha256 of the colon-joined
        // fields, standard base64 without padding, "v1_" in front.
        let s = signature("/home/user/a.txt", "read", "", "tok", Some(1700000000));
        let raw = "/home/user/a.txt:read::tok:1700000000";
        assert_eq!(s, format!("v1_{}", B64.encode(Sha256::digest(raw.as_bytes()))));
        assert!(!s.ends_with('='));
        assert_ne!(s, signature("/home/user/a.txt", "write", "", "tok", Some(1700000000)));
    }
}
