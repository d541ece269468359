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

/// What a copy out (`GET /v1/tasks/{id}/files?path=P&links=L`) does with a
/// symlink that is absolute or leads out of the copied tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Links {
    /// Refuse the copy, naming the link (the default): planted on the
    /// client's host, a later write through it would land outside the copy.
    #[default]
    Refuse,
    /// Copy the link as it is.
    Keep,
    /// Copy what it points to, resolved inside the sandbox.
    Follow,
}

impl Links {
    /// The word of the `links` query parameter.
    pub fn as_str(self) -> &'static str {
        match self {
            Links::Refuse => "refuse",
            Links::Keep => "keep",
            Links::Follow => "follow",
        }
    }

    pub fn parse(s: &str) -> Option<Links> {
        [Links::Refuse, Links::Keep, Links::Follow].into_iter().find(|l| l.as_str() == s)
    }
}

/// What an entry of a listing is (a symlink is listed, not followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A device, fifo or socket.
    Other,
}

/// One entry of `GET /v1/tasks/{id}/dir?path=P`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DirEntry {
    /// The entry's name; one that is not UTF-8 is shown with each byte
    /// outside valid UTF-8 written `\xNN`, and given exactly in `name_b64`.
    pub name: String,
    /// The name's bytes in base64, when they are not UTF-8 (absent
    /// otherwise): what a path naming this entry is made of (percent-encode
    /// the bytes in a `path=` query).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_b64: Option<String>,
    pub kind: EntryKind,
    /// Bytes, as `lstat` reports them.
    pub size: u64,
    /// Permission bits, e.g. `0o644` as 420.
    pub mode: u32,
    pub mtime_ms: i64,
    /// A symlink's target, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The answer of `GET /v1/tasks/{id}/dir?path=P`: a directory's entries,
/// sorted by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DirListing {
    /// The directory as resolved in the sandbox (symlinks followed inside
    /// it), shown as `name` is.
    pub path: String,
    /// The path's bytes in base64, when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_b64: Option<String>,
    pub entries: Vec<DirEntry>,
    /// True when the directory holds more than the listing's limit of
    /// entries, and the rest were left out.
    pub truncated: bool,
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

    #[test]
    fn link_modes_have_one_word_in_queries_and_json() {
        for l in [Links::Refuse, Links::Keep, Links::Follow] {
            assert_eq!(Links::parse(l.as_str()), Some(l));
            assert_eq!(serde_json::to_value(l).unwrap(), l.as_str());
        }
        assert_eq!(Links::parse("Follow"), None);
        assert_eq!(Links::default(), Links::Refuse);
    }

    #[test]
    fn a_listing_names_kinds_in_snake_case_and_leaves_out_absent_targets() {
        let entry = DirEntry { name: "a".into(), name_b64: None, kind: EntryKind::Symlink, size: 1, mode: 0o777, mtime_ms: 5, target: Some("b".into()) };
        let v = serde_json::to_value(&entry).unwrap();
        assert_eq!(v["kind"], "symlink");
        let file = DirEntry { kind: EntryKind::File, target: None, ..entry };
        assert!(serde_json::to_value(&file).unwrap().get("target").is_none());
        assert!(serde_json::to_value(&file).unwrap().get("name_b64").is_none(), "a UTF-8 name has no bytes beside it");
        crate::assert_wire_shape(&DirListing { path: "/w".into(), path_b64: None, entries: vec![file], truncated: false }, &["entries", "path", "truncated"]);
    }
}
