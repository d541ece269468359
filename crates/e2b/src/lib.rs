//! E2B's API over Cairn, so that agents written against the E2B SDKs run
//! on Cairn by changing `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY`.
//! A front end like `cairn-server`'s: each handler parses E2B's wire shape,
//! calls one [`Runtime`] action and maps the result back; nothing here
//! runs a command or opens a sandbox path itself.
//!
//! - `control.rs`: the control API (`/sandboxes`, `/v2/sandboxes`,
//!   `/templates`), authenticated by `X-API-Key` ([`cairn_runtime::api_keys`]).
//!   A sandbox is a task (the same id in both APIs).
//! - The in-sandbox API that E2B serves from `envd` inside each sandbox,
//!   served here by the daemon for every task, picked by the request's
//!   `E2b-Sandbox-Id` header and checked against the task's access token:
//!   `connect.rs` (the Connect protocol's JSON codec; `codec.rs` translates
//!   its binary codec, from the wire schema in `proto/`), `process.rs`
//!   (`process.Process`), `filesystem.rs` (`filesystem.Filesystem`) and
//!   `files.rs` (`/files`, `/health`, `/envs`).
//! - `error.rs`: errors in each protocol's own shape.

mod codec;
mod connect;
mod control;
mod error;
mod files;
mod filesystem;
mod process;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use cairn_runtime::Runtime;
use tower::ServiceExt;

pub use error::E2bError;

/// The header that names the sandbox of an in-sandbox API request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// The envd version Cairn answers as: every feature the SDKs gate on it.
pub const ENVD_VERSION: &str = "0.6.4";

/// The control API's routes, at the root of the daemon's address.
pub fn control_routes() -> Router<Arc<Runtime>> {
    // E2B's health check takes no key.
    control::routes().route("/health", axum::routing::get(|| async { axum::http::StatusCode::NO_CONTENT }))
}

/// Middleware for the daemon's router: a request that names a sandbox in
/// `E2b-Sandbox-Id` goes to that sandbox's in-sandbox API, whatever its path.
pub async fn route_sandbox_requests(State(rt): State<Arc<Runtime>>, req: Request, next: Next) -> Response {
    let named = req.headers().get(SANDBOX_ID_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let task = match named {
        Some(t) => t,
        // A signed `/files` URL carries no header: the sandbox is the one
        // whose access token signed it.
        None if is_signed_files_url(req.uri()) => match signed_files_sandbox(&rt, req.method(), req.uri()).await {
            Some(t) => t,
            None => return E2bError::unauthenticated("the URL signature is not valid for any sandbox (or has expired)").into_response(),
        },
        None => return next.run(req).await,
    };
    let envd = envd_routes().with_state(envd::Ctx { rt, task: Arc::from(task.as_str()) });
    match envd.oneshot(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    }
}

fn is_signed_files_url(uri: &axum::http::Uri) -> bool {
    uri.path() == "/files" && uri.query().is_some_and(|q| q.contains("signature="))
}

/// The sandbox whose access token signed a `/files` URL (E2B's
/// `download_url`, `upload_url`), which carries no header naming it.
pub async fn signed_files_sandbox(rt: &Arc<Runtime>, method: &axum::http::Method, uri: &axum::http::Uri) -> Option<String> {
    if !is_signed_files_url(uri) {
        return None;
    }
    files::signer(rt, method.clone(), uri.query().map(str::to_owned)).await
}

fn envd_routes() -> Router<envd::Ctx> {
    files::routes()
        .merge(process::routes())
        .merge(filesystem::routes())
        .fallback(|| async { E2bError::not_found("no such route of the sandbox API").into_response() })
        .layer(axum::middleware::from_fn(codec::translate_binary))
}

/// What an in-sandbox API handler gets.
mod envd {
    use std::sync::Arc;

    use axum::http::HeaderMap;
    use cairn_runtime::Runtime;

    use crate::E2bError;

    #[derive(Clone)]
    pub(crate) struct Ctx {
        pub rt: Arc<Runtime>,
        pub task: Arc<str>,
    }

    impl Ctx {
        /// The task, once the request's `X-Access-Token` is its own.
        pub(crate) fn authorized(&self, headers: &HeaderMap) -> Result<&str, E2bError> {
            let token = headers.get("x-access-token").and_then(|v| v.to_str().ok()).unwrap_or("");
            if token.is_empty() {
                return Err(E2bError::unauthenticated("missing access token (X-Access-Token)"));
            }
            if !self.rt.check_sandbox_access_token(&self.task, token) {
                return Err(E2bError::unauthenticated(format!("the access token is not sandbox {}'s", self.task)));
            }
            Ok(&self.task)
        }

        /// The user named by an `Authorization: Basic base64(user:)` header,
        /// as the SDKs send it when a call names one.
        pub(crate) fn user(headers: &HeaderMap) -> Option<String> {
            use base64::Engine as _;
            let basic = headers.get("authorization")?.to_str().ok()?.strip_prefix("Basic ")?;
            let decoded = base64::engine::general_purpose::STANDARD.decode(basic.trim()).ok()?;
            let text = String::from_utf8(decoded).ok()?;
            let user = text.split(':').next()?.to_owned();
            (!user.is_empty()).then_some(user)
        }
    }
}
