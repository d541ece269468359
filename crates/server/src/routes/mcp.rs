//! `/mcp`: the Model Context Protocol over streamable HTTP (`cairn-mcp`),
//! behind the same bearer token as `/v1`.

use std::sync::Arc;

use axum::Router;
use cairn_runtime::Runtime;

pub(super) fn routes(rt: Arc<Runtime>) -> Router<Arc<Runtime>> {
    Router::new().route_service("/mcp", cairn_mcp::http_service(rt))
}
