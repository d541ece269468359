//! Cairn's Model Context Protocol server: the tools an MCP client uses to
//! work in Cairn tasks ([`CairnTools`], over an `Arc<Runtime>`), and their
//! streamable HTTP service ([`http_service`]), which the daemon mounts at
//! `/mcp` behind its bearer token. `cairn mcp` bridges stdio to it.
//!
//! Built on the official Rust SDK (`rmcp`). The HTTP service is stateless
//! and answers plain JSON: each POST carries one JSON-RPC message and gets
//! its answer, so no session lives in the daemon between requests and the
//! stdio bridge stays a plain forwarder. The tools send nothing on their
//! own (no progress, no server requests), so nothing is lost without a
//! session's event stream.

pub mod args;
mod tools;
mod views;

use std::sync::Arc;

use cairn_runtime::Runtime;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

pub use tools::{error_line, CairnTools, ACTOR};

/// Largest JSON-RPC message `/mcp` takes: room for a `write_file` of a few
/// MiB in base64. Larger files go through the HTTP API's tar upload.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// The streamable HTTP service of the tools, to mount at `/mcp`.
pub fn http_service(rt: Arc<Runtime>) -> StreamableHttpService<CairnTools, NeverSessionManager> {
    let tools = CairnTools::new(rt);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(MAX_REQUEST_BYTES)
        // The Host check guards unauthenticated local servers against DNS
        // rebinding; here the bearer token does (a page cannot send it),
        // and the daemon may be reached by any name it listens on.
        .disable_allowed_hosts();
    StreamableHttpService::new(move || Ok(tools.clone()), Arc::new(NeverSessionManager::default()), config)
}
