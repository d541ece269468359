//! Base images: list, import, remove.

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use cairn_api::images::{ImportRequest, Removed};

use super::Rt;
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new().route("/v1/images", get(list).post(import)).route("/v1/images/{name}", delete(remove))
}

async fn list(rt: Rt) -> Result<Response, ApiError> {
    Ok(Json(rt.list_images().await?).into_response())
}

async fn import(rt: Rt, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ImportRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed image request: {e}")))?;
    let image = rt.import_image(req).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

async fn remove(rt: Rt, Path(name): Path<String>) -> Result<Json<Removed>, ApiError> {
    rt.remove_image(&name).await?;
    Ok(Json(Removed { removed: name }))
}
