//! `cairn cp`: copies out are a tar stream; a copy in answers JSON. One
//! file is raw bytes either way; a write answers JSON.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The answer of `PUT /v1/tasks/{id}/files?path=P&name=N`: the tar was
/// unpacked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CopiedIn {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Where the copy's top entry is in the sandbox, symlinks in `P`
    /// resolved.
    pub path: String,
}

/// The answer of `PUT /v1/tasks/{id}/file?path=P`: the file was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Written {
    /// The path as the request gave it.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_in_keeps_the_daemons_field_names() {
        crate::assert_wire_shape(&CopiedIn { entries: 3, path: "/workspace/src".into() }, &["entries", "path"]);
        crate::assert_wire_shape(&Written { path: "/workspace/notes.md".into(), bytes: 12 }, &["path", "bytes"]);
    }
}
