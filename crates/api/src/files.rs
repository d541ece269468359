//! `cairn cp`: copies out are a tar stream; a copy in answers JSON.

use serde::{Deserialize, Serialize};

/// The answer of `PUT /v1/tasks/{id}/files?path=P&name=N`: the tar was
/// unpacked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiedIn {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Where the copy's top entry is in the sandbox, symlinks in `P`
    /// resolved.
    pub path: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_in_keeps_the_daemons_field_names() {
        crate::assert_wire_shape(&CopiedIn { entries: 3, path: "/workspace/src".into() }, &["entries", "path"]);
    }
}
