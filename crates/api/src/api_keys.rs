//! API keys of the E2B-compatible API: `/v1/api-keys`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/api-keys`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    pub name: String,
}

/// A key just made: the only answer that holds the key itself.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct NewApiKey {
    pub name: String,
    /// `e2b_` and 40 hex digits, as E2B's SDKs expect.
    pub key: String,
}

/// A key as listed: never the key.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct ApiKeyView {
    pub name: String,
    /// Unix time in milliseconds.
    pub created_ms: i64,
    pub last_used_ms: Option<i64>,
}
