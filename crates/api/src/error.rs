//! Every error answer is `{"error": {"code": "...", "message": "..."}}`
//! with a 4xx or 5xx status. The code is stable and meant for programs;
//! the message is one line meant for people.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What kind of failure an error answer reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed or names something invalid (400).
    Invalid,
    /// No or a wrong bearer token, or a webhook that does not verify (401).
    Unauthorized,
    /// Refused for what it is, not for who asks (403).
    Forbidden,
    /// No such task, snapshot, wait, image or endpoint (404).
    NotFound,
    /// Not possible in the current state (409), e.g. rolling back a
    /// suspended task or taking a name in use.
    Conflict,
    /// A body over its limit (413).
    TooLarge,
    /// More at once than a bound of the daemon allows (429), e.g. commands
    /// running in one task; the message names the bound. Try again later.
    TooManyRequests,
    /// The daemon cannot serve it right now (503).
    Unavailable,
    /// A disk or the blob store is full (507).
    NoSpace,
    /// A failure of the daemon itself (500); the message says what.
    Internal,
}

impl ErrorCode {
    /// The HTTP status an answer with this code carries.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::Invalid => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::TooManyRequests => 429,
            ErrorCode::Unavailable => 503,
            ErrorCode::NoSpace => 507,
            ErrorCode::Internal => 500,
        }
    }

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Invalid => "invalid",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::NoSpace => "no_space",
            ErrorCode::Internal => "internal",
        }
    }

    /// The code for an HTTP status (`internal` for any other 5xx,
    /// `invalid` for any other 4xx).
    pub fn for_status(status: u16) -> ErrorCode {
        match status {
            400 => ErrorCode::Invalid,
            401 => ErrorCode::Unauthorized,
            403 => ErrorCode::Forbidden,
            404 => ErrorCode::NotFound,
            409 => ErrorCode::Conflict,
            413 => ErrorCode::TooLarge,
            429 => ErrorCode::TooManyRequests,
            503 => ErrorCode::Unavailable,
            507 => ErrorCode::NoSpace,
            s if (400..500).contains(&s) => ErrorCode::Invalid,
            _ => ErrorCode::Internal,
        }
    }

    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 10] = [
        ErrorCode::Invalid,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::TooLarge,
        ErrorCode::TooManyRequests,
        ErrorCode::Unavailable,
        ErrorCode::NoSpace,
        ErrorCode::Internal,
    ];
}

/// The body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// One line naming what was wrong.
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code, message: message.into() } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses_map_both_ways_and_serialise_as_snake_case() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::for_status(code.status()), code, "{code:?}");
            assert_eq!(serde_json::to_value(code).unwrap_or_default(), code.as_str());
        }
        assert_eq!(ErrorCode::for_status(422), ErrorCode::Invalid);
        assert_eq!(ErrorCode::for_status(502), ErrorCode::Internal);
        let body = ErrorBody::new(ErrorCode::NoSpace, "the disk is full");
        let text = serde_json::to_string(&body).unwrap_or_default();
        assert_eq!(text, r#"{"error":{"code":"no_space","message":"the disk is full"}}"#);
        assert_eq!(serde_json::from_str::<ErrorBody>(&text).ok(), Some(body));
    }
}
