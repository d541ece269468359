//! Outgoing hooks (bearer token required): the operator's notification
//! endpoints, their outbox and a test send. (Incoming webhooks, which
//! satisfy waits, are the gateway's `/v1/hooks/{task}/{name}`.)

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use cairn_api::hooks::{CreatedHook, HookTestAnswer, HookView, NewHook, NotificationView};

use super::served::Routes;
use super::{body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .get("/v1/outgoing-hooks", list_hooks)
        .post("/v1/outgoing-hooks", add_hook)
        .get("/v1/outgoing-hooks/{id}", show_hook)
        .delete("/v1/outgoing-hooks/{id}", remove_hook)
        .get("/v1/outgoing-hooks/{id}/outbox", hook_outbox)
        .post("/v1/outgoing-hooks/{id}/test", test_hook)
}

#[utoipa::path(get, path = "/v1/outgoing-hooks", tag = "hooks", responses((status = 200, description = "Every hook, oldest first, with its outbox's counts (never a secret)", body = [HookView])))]
async fn list_hooks(rt: Rt) -> Result<Json<Vec<HookView>>, ApiError> {
    Ok(Json(rt.hooks().await?))
}

#[utoipa::path(
    post,
    path = "/v1/outgoing-hooks",
    tag = "hooks",
    request_body = NewHook,
    responses(
        (status = 201, description = "The new hook and its secret: the only answer that holds it", body = CreatedHook),
        (status = 400, description = "A bad URL, an unknown event type or a bad secret"),
        (status = 404, description = "No such task")
    )
)]
async fn add_hook(rt: Rt, b: axum::body::Bytes) -> Result<(StatusCode, Json<CreatedHook>), ApiError> {
    let req: NewHook = body("hook", &b)?;
    Ok((StatusCode::CREATED, Json(rt.add_hook(req).await?)))
}

#[utoipa::path(
    get,
    path = "/v1/outgoing-hooks/{id}",
    tag = "hooks",
    params(("id" = String, Path, description = "The hook's id")),
    responses((status = 200, description = "The hook", body = HookView), (status = 404, description = "No such hook"))
)]
async fn show_hook(rt: Rt, Path(id): Path<String>) -> Result<Json<HookView>, ApiError> {
    Ok(Json(rt.hook(&id).await?))
}

#[utoipa::path(
    delete,
    path = "/v1/outgoing-hooks/{id}",
    tag = "hooks",
    params(("id" = String, Path, description = "The hook's id")),
    responses((status = 200, description = "Removed with its outbox: `{\"removed\": ID}`", body = Object), (status = 404, description = "No such hook"))
)]
async fn remove_hook(rt: Rt, Path(id): Path<String>) -> Result<Json<serde_json::Value>, ApiError> {
    rt.remove_hook(&id).await?;
    Ok(Json(serde_json::json!({ "removed": id })))
}

#[utoipa::path(
    get,
    path = "/v1/outgoing-hooks/{id}/outbox",
    tag = "hooks",
    params(("id" = String, Path, description = "The hook's id")),
    responses((status = 200, description = "What it has not sent: pending, then failed, oldest first", body = [NotificationView]), (status = 404, description = "No such hook"))
)]
async fn hook_outbox(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<NotificationView>>, ApiError> {
    Ok(Json(rt.hook_notifications(&id).await?))
}

#[utoipa::path(
    post,
    path = "/v1/outgoing-hooks/{id}/test",
    tag = "hooks",
    params(("id" = String, Path, description = "The hook's id")),
    responses((status = 200, description = "What the receiver answered a `hook.test` notification sent now", body = HookTestAnswer), (status = 404, description = "No such hook"))
)]
async fn test_hook(rt: Rt, Path(id): Path<String>) -> Result<Json<HookTestAnswer>, ApiError> {
    Ok(Json(rt.test_hook(&id).await?))
}
