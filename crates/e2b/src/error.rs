//! Errors as E2B's clients read them. The control API and envd's plain
//! HTTP routes answer `{"code": <status>, "message": "..."}`; Connect calls
//! answer `{"code": "not_found", "message": "..."}` (a unary call) or carry
//! the same in a stream's last frame. Every message is one line.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// A failure of one request, with the kind the protocols name.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let message: String = message.into();
        E2bError { status, message: message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ") }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        E2bError::new(StatusCode::BAD_REQUEST, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        E2bError::new(StatusCode::NOT_FOUND, m)
    }
    pub fn unauthenticated(m: impl Into<String>) -> Self {
        E2bError::new(StatusCode::UNAUTHORIZED, m)
    }
    pub fn not_implemented(what: &str) -> Self {
        E2bError::new(StatusCode::NOT_IMPLEMENTED, format!("{what} is not served by Cairn (see docs/e2b.md)"))
    }

    /// The Connect protocol's code for this status.
    pub fn connect_code(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_argument",
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "permission_denied",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::CONFLICT => "already_exists",
            StatusCode::TOO_MANY_REQUESTS | StatusCode::INSUFFICIENT_STORAGE => "resource_exhausted",
            StatusCode::NOT_IMPLEMENTED => "unimplemented",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "unavailable",
            StatusCode::GATEWAY_TIMEOUT => "deadline_exceeded",
            _ => "internal",
        }
    }

    /// The error of a Connect unary call.
    pub fn connect_response(&self) -> Response {
        (self.status, Json(json!({ "code": self.connect_code(), "message": self.message }))).into_response()
    }

    /// The body of a Connect stream's last frame.
    pub fn connect_end_stream(&self) -> serde_json::Value {
        json!({ "error": { "code": self.connect_code(), "message": self.message } })
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, "{}", self.message);
        }
        (self.status, Json(json!({ "code": self.status.as_u16(), "message": self.message }))).into_response()
    }
}

impl From<cairn_runtime::Error> for E2bError {
    fn from(e: cairn_runtime::Error) -> Self {
        // The same status Cairn's own API gives the error.
        let status = StatusCode::from_u16(e.code().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        E2bError::new(status, e.to_string())
    }
}
