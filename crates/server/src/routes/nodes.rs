//! The nodes sharing the task database.

use axum::Json;
use cairn_api::nodes::Node;

use super::served::Routes;
use super::Rt;
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new().get("/v1/nodes", list)
}

#[utoipa::path(
    get,
    path = "/v1/nodes",
    tag = "nodes",
    responses((status = 200, description = "Every node registered in the task database, by name: its URL, whether it is up (a heartbeat younger than three periods of 2 s), its heartbeat's age, its load and the tasks whose sandbox it runs", body = Vec<Node>))
)]
async fn list(rt: Rt) -> Result<Json<Vec<Node>>, ApiError> {
    Ok(Json(rt.nodes().await?))
}
