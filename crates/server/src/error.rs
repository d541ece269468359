use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::ErrorCode;

/// An API error: a stable code (and the HTTP status it carries) and a
/// one-line message naming what was wrong; answered as
/// `{"error": {"code", "message"}}` (`cairn_api::error`).
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, m)
    }
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(%status, "{}", self.message);
        }
        (status, Json(cairn_api::ErrorBody::new(self.code, self.message))).into_response()
    }
}

/// The one mapping of the runtime's error kinds to the wire.
impl From<cairn_runtime::Error> for ApiError {
    fn from(e: cairn_runtime::Error) -> Self {
        if let cairn_runtime::Error::Internal { source: Some(source), .. } = &e {
            tracing::debug!("internal error caused by: {source:?}");
        }
        ApiError::new(e.code(), e.to_string())
    }
}
