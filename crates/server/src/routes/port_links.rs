//! Signed links to a task's port (`cairn port TASK PORT`).

use axum::extract::{Path, Query};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::served::Routes;
use super::Rt;
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().post("/v1/tasks/{id}/port-links/{port}", create_link)
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default)]
struct LinkQuery {
    /// How long the link works (e.g. `1h`; default 1h, at most 7d).
    ttl: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/tasks/{id}/port-links/{port}",
    tag = "tasks",
    params(("id" = String, Path, description = "Task id or name"), ("port" = u16, Path, description = "The port inside the task"), LinkQuery),
    responses((status = 200, description = "`{url, expires_ms, traffic_token}`: a link to the port that works until it expires, and the token that reaches every port of the task", body = Object))
)]
async fn create_link(rt: Rt, Path((id, port)): Path<(String, String)>, Query(q): Query<LinkQuery>) -> Result<Json<Value>, ApiError> {
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| ApiError::bad_request(format!("port {port:?} is out of range: give 1 to 65535")))?;
    let ttl = match &q.ttl {
        Some(t) => cairn_api::parse_duration(t).map_err(|e| ApiError::bad_request(format!("ttl: {e}")))?,
        None => std::time::Duration::from_secs(3600),
    };
    if ttl.is_zero() || ttl > std::time::Duration::from_secs(7 * 24 * 3600) {
        return Err(ApiError::bad_request(format!("ttl {:?} is not between 1s and 7d", q.ttl.unwrap_or_default())));
    }
    Ok(Json(json!(rt.port_link(&id, port, ttl).await?)))
}
