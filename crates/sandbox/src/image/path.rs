//! Validated paths inside an image.

use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;

/// A path relative to an image's root, split into components that are never
/// empty, `.` or `..` and never contain `/` or NUL. The empty path is the
/// root itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RelPath {
    parts: Vec<CString>,
}

/// Why a path read from an archive is not acceptable as a [`RelPath`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PathFault {
    Absolute,
    DotDot,
    Nul,
}

impl RelPath {
    pub(super) fn root() -> RelPath {
        RelPath { parts: Vec::new() }
    }

    /// Parses a `/`-separated path as archives store it. Leading `./`,
    /// repeated slashes and `.` components are harmless and dropped; an
    /// absolute path or any `..` is refused outright rather than "fixed",
    /// because an archive that contains one was built to escape.
    pub(super) fn parse(raw: &[u8]) -> Result<RelPath, PathFault> {
        if raw.contains(&0) {
            return Err(PathFault::Nul);
        }
        if raw.starts_with(b"/") {
            return Err(PathFault::Absolute);
        }
        let mut parts = Vec::new();
        for comp in raw.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => return Err(PathFault::DotDot),
                // No NUL inside, checked above.
                name => parts.push(CString::new(name).map_err(|_| PathFault::Nul)?),
            }
        }
        Ok(RelPath { parts })
    }

    /// This path with one more component. `name` comes from `readdir`, so it
    /// has no `/` or NUL and is not `.` or `..`.
    pub(super) fn child(&self, name: &CStr) -> RelPath {
        let mut parts = self.parts.clone();
        parts.push(name.to_owned());
        RelPath { parts }
    }

    /// The parent's components and the last one; `None` for the root.
    pub(super) fn split_last(&self) -> Option<(&[CString], &CStr)> {
        let (last, parents) = self.parts.split_last()?;
        Some((parents, last.as_c_str()))
    }

    /// The components, outermost first.
    pub(super) fn parts(&self) -> &[CString] {
        &self.parts
    }

    /// The directory holding this path (the root for the root).
    pub(super) fn parent(&self) -> RelPath {
        RelPath { parts: self.split_last().map(|(p, _)| p.to_vec()).unwrap_or_default() }
    }

    /// The whole path as one relative C string (`.` for the root).
    pub(super) fn to_cstring(&self) -> CString {
        join(&self.parts)
    }

    /// The last component as text, for name-based filters.
    pub(super) fn file_name(&self) -> Option<&OsStr> {
        self.parts.last().map(|c| OsStr::from_bytes(c.to_bytes()))
    }
}

/// Joins components with `/`; no components gives `.`.
pub(super) fn join(parts: &[CString]) -> CString {
    if parts.is_empty() {
        return c".".to_owned();
    }
    let bytes = parts.iter().map(|p| p.to_bytes()).collect::<Vec<_>>().join(&b'/');
    // Components have no NUL, so neither has their join.
    CString::new(bytes).unwrap_or_default()
}

impl fmt::Display for RelPath {
    /// Shown as the absolute path it will have inside the sandbox.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("/");
        }
        for part in &self.parts {
            write!(f, "/{}", String::from_utf8_lossy(part.to_bytes()))?;
        }
        Ok(())
    }
}
