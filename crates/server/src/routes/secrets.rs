//! Secrets of the egress proxy (bearer token required): set from a raw
//! body, listed and removed by name; no route answers a value.

use axum::body::Bytes;
use axum::extract::Path;
use axum::Json;
use cairn_api::secrets::SecretView;

use super::served::Routes;
use super::Rt;
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/secrets", list_secrets)
        .get("/v1/secrets/{name}", show_secret)
        .put("/v1/secrets/{name}", set_secret)
        .delete("/v1/secrets/{name}", remove_secret)
}

#[utoipa::path(get, path = "/v1/secrets", tag = "secrets", responses((status = 200, description = "Every secret by name, with its use: never a value", body = [SecretView])))]
async fn list_secrets(rt: Rt) -> Result<Json<Vec<SecretView>>, ApiError> {
    Ok(Json(rt.secrets().await?))
}

#[utoipa::path(
    get,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "The secret's name")),
    responses((status = 200, description = "The secret, without its value", body = SecretView), (status = 404, description = "No secret of that name"))
)]
async fn show_secret(rt: Rt, Path(name): Path<String>) -> Result<Json<SecretView>, ApiError> {
    Ok(Json(rt.secret(&name).await?))
}

#[utoipa::path(
    put,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "The secret's name: letters, digits and '_', not starting with a digit")),
    request_body(content = Vec<u8>, description = "The value, as raw bytes (at most 64 KiB)", content_type = "application/octet-stream"),
    responses((status = 200, description = "Set: the secret, without its value", body = SecretView), (status = 400, description = "A bad name or an empty value"), (status = 413, description = "A value over 64 KiB"))
)]
async fn set_secret(rt: Rt, Path(name): Path<String>, value: Bytes) -> Result<Json<SecretView>, ApiError> {
    Ok(Json(rt.set_secret(&name, &value).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "The secret's name")),
    responses((status = 200, description = "Removed: `{\"removed\": NAME}`", body = Object), (status = 404, description = "No secret of that name"))
)]
async fn remove_secret(rt: Rt, Path(name): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    rt.remove_secret(&name).await?;
    Ok(Json(serde_json::json!({ "removed": name })))
}
