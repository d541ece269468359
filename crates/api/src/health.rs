//! The daemon itself.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// The daemon's version.
    pub version: String,
    /// The daemon's home directory.
    pub home: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_keeps_the_daemons_field_names() {
        crate::assert_wire_shape(&Health { version: "0.1.0".into(), home: Some("/var/lib/cairn".into()) }, &["version", "home"]);
    }
}
