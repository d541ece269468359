//! API keys of the E2B-compatible API (bearer token required: keys are
//! made and revoked by the operator).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use cairn_api::api_keys::{ApiKeyView, CreateApiKey, NewApiKey};

use super::served::Routes;
use super::{body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/api-keys", list_api_keys).post("/v1/api-keys", create_api_key).delete("/v1/api-keys/{name}", revoke_api_key)
}

#[utoipa::path(get, path = "/v1/api-keys", tag = "api-keys", responses((status = 200, description = "Every key, oldest first (never the keys themselves)", body = [ApiKeyView])))]
async fn list_api_keys(rt: Rt) -> Result<Json<Vec<ApiKeyView>>, ApiError> {
    Ok(Json(rt.api_keys().await?))
}

#[utoipa::path(
    post,
    path = "/v1/api-keys",
    tag = "api-keys",
    request_body = CreateApiKey,
    responses((status = 201, description = "The new key: the only answer that holds it", body = NewApiKey), (status = 409, description = "A key of that name exists"))
)]
async fn create_api_key(rt: Rt, b: axum::body::Bytes) -> Result<(StatusCode, Json<NewApiKey>), ApiError> {
    let req: CreateApiKey = body("api-key", &b)?;
    let key = rt.create_api_key(&req.name).await?;
    Ok((StatusCode::CREATED, Json(NewApiKey { name: req.name, key })))
}

#[utoipa::path(
    delete,
    path = "/v1/api-keys/{name}",
    tag = "api-keys",
    params(("name" = String, Path, description = "The key's name")),
    responses((status = 200, description = "Revoked: `{\"revoked\": NAME}`", body = Object), (status = 404, description = "No key of that name"))
)]
async fn revoke_api_key(rt: Rt, Path(name): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    rt.revoke_api_key(&name).await?;
    Ok(Json(serde_json::json!({ "revoked": name })))
}
