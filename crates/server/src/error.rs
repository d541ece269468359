use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An API error: an HTTP status and a one-line message naming what was
/// wrong; answered as `{"error": {"code", "message"}}` (`cairn_api::error`).
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, m)
    }
    /// The stable code of the error body, from the status.
    pub fn code(&self) -> cairn_api::ErrorCode {
        cairn_api::ErrorCode::for_status(self.status.as_u16())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, "{}", self.message);
        }
        let body = cairn_api::ErrorBody::new(self.code(), self.message);
        (self.status, Json(body)).into_response()
    }
}

impl From<cairn_store::Error> for ApiError {
    fn from(e: cairn_store::Error) -> Self {
        use cairn_store::Error as E;
        match e {
            E::UnknownTask(_) => ApiError::not_found(e.to_string()),
            E::NameTaken(_) | E::StateChanged { .. } | E::Transition { .. } => ApiError::conflict(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl From<cairn_core::Error> for ApiError {
    fn from(e: cairn_core::Error) -> Self {
        match e {
            cairn_core::Error::Transition { .. } => ApiError::conflict(e.to_string()),
            _ => ApiError::bad_request(e.to_string()),
        }
    }
}

impl From<cairn_sandbox::Error> for ApiError {
    fn from(e: cairn_sandbox::Error) -> Self {
        use cairn_sandbox::Error as E;
        match e {
            E::UnknownImage(_) => ApiError::not_found(e.to_string()),
            E::ImageExists(_) | E::ImageBuiltIn(_) => ApiError::conflict(e.to_string()),
            E::UnsafeEntry { .. } | E::ImageSource(..) | E::PathEscape(_) => ApiError::bad_request(e.to_string()),
            E::NotRunning(_) => ApiError::conflict(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        ApiError::internal(format!("worker failed: {e}"))
    }
}
