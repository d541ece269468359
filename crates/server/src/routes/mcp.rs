//! `/mcp`: the Model Context Protocol over streamable HTTP (`cairn-mcp`),
//! behind the same bearer token as `/v1`. The service keeps no session, so
//! each request is served by a fresh instance over the daemon's runtime.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use cairn_runtime::Runtime;
use tower::ServiceExt;

use super::served::Routes;

pub(super) fn routes() -> Routes {
    Routes::new().post("/mcp", mcp)
}

#[utoipa::path(
    post,
    path = "/mcp",
    operation_id = "mcp",
    tag = "mcp",
    description = "The Model Context Protocol, streamable HTTP transport, without sessions and with JSON answers: one JSON-RPC message per request (at most 16 MiB). The tools are listed by `tools/list`; see docs/mcp.md.",
    request_body(description = "A JSON-RPC 2.0 request or notification", content = Object, content_type = "application/json"),
    responses(
        (status = 200, description = "The JSON-RPC answer", body = Object, content_type = "application/json"),
        (status = 202, description = "A notification, accepted"),
        (status = 401, description = "No or a wrong bearer token", body = cairn_api::ErrorBody),
    )
)]
async fn mcp(State(rt): State<Arc<Runtime>>, req: Request) -> Response {
    match cairn_mcp::http_service(rt).oneshot(req).await {
        Ok(answer) => answer.map(axum::body::Body::new).into_response(),
        Err(never) => match never {},
    }
}
