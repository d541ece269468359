//! A task's egress allowlist and its decision log.

use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::egress::{EgressView, PolicyUpdate};
use cairn_api::ErrorBody;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/tasks/{id}/egress", show).post("/v1/tasks/{id}/egress", update)
}

#[utoipa::path(
    get,
    path = "/v1/tasks/{id}/egress",
    operation_id = "show_egress",
    tag = "egress",
    params(("id" = String, Path, description = "The task's id or name")),
    responses((status = 200, description = "The allowlist and every decision so far", body = EgressView), (status = 404, description = "No such task", body = ErrorBody))
)]
async fn show(rt: Rt, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(rt.egress_view(&id).await?).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/egress",
    operation_id = "update_egress",
    tag = "egress",
    params(("id" = String, Path, description = "The task's id or name")),
    request_body = PolicyUpdate,
    responses(
        (status = 200, description = "The policy now; open tunnels the new rules deny are cut", body = EgressView),
        (status = 400, description = "A malformed body or rule", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    )
)]
async fn update(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let update: PolicyUpdate = body("egress policy", &b)?;
    Ok(Json(rt.update_egress(&id, update, &actor(&headers)).await?).into_response())
}
