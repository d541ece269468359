//! Secrets of the egress proxy: `/v1/secrets`. A value goes in (`PUT`
//! with the raw value as the body) and never comes out.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A secret as listed: its name and use, never its value.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct SecretView {
    pub name: String,
    /// Unix time in milliseconds.
    pub created_ms: i64,
    /// When its value was last set.
    pub updated_ms: i64,
    /// The latest request that used it.
    pub last_used_ms: Option<i64>,
    /// How many requests used it.
    pub uses: i64,
}
