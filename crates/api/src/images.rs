//! Images.

use serde::{Deserialize, Serialize};

/// Body of `POST /v1/images`: import a directory or archive on the
/// daemon's host as an image.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    pub name: String,
    /// An absolute path on the daemon's host.
    pub path: String,
}
