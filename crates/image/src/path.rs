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

/// An untrusted name (an archive entry, a member or layer an archive
/// lists) as error messages show it: escaped as `{:?}` would, and when
/// long, only its start and end around an ellipsis, then its length
/// (`aaaa…aaaa (5000 bytes)`), so that an error stays one short line
/// whatever the archive holds.
pub(crate) fn short(name: &str) -> String {
    match cut(name) {
        (text, Some(len)) => format!("{text} ({len} bytes)"),
        (text, None) => text,
    }
}

/// [`short`], quoted as `{:?}` quotes: `"aaaa…aaaa" (5000 bytes)`.
pub(crate) fn quoted(name: &str) -> String {
    match cut(name) {
        (text, Some(len)) => format!("\"{text}\" ({len} bytes)"),
        (text, None) => format!("\"{text}\""),
    }
}

/// `name` escaped, and cut in the middle when long (then with its length
/// in bytes).
fn cut(name: &str) -> (String, Option<usize>) {
    /// Escaped characters kept at either end of a long name.
    const KEEP: usize = 48;
    // As `{:?}` escapes a string: a double quote, not a single one.
    let escape = |c: char| -> String {
        match c {
            '\'' => "'".to_owned(),
            c => c.escape_debug().collect(),
        }
    };
    let whole: String = name.chars().map(escape).collect();
    if whole.chars().count() <= 2 * KEEP + 16 {
        return (whole, None);
    }
    let fit = |chars: &mut dyn Iterator<Item = char>| -> Vec<String> {
        let mut used = 0;
        chars
            .map(escape)
            .take_while(|e| {
                used += e.chars().count();
                used <= KEEP
            })
            .collect()
    };
    let head = fit(&mut name.chars()).concat();
    let mut tail = fit(&mut name.chars().rev());
    tail.reverse();
    (format!("{head}…{}", tail.concat()), Some(name.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_in_the_middle_with_their_length() {
        assert_eq!(quoted("etc/passwd"), "\"etc/passwd\"");
        assert_eq!(quoted("a\"b'c\n"), format!("{:?}", "a\"b'c\n"));
        let long = format!("{}{}", "a".repeat(2500), "z".repeat(2500));
        let shown = quoted(&long);
        assert_eq!(shown, format!("\"{}…{}\" (5000 bytes)", "a".repeat(48), "z".repeat(48)));
        // Escapes count: a name of control bytes stays as short.
        let shown = quoted(&"\u{1}".repeat(5000));
        assert!(shown.chars().count() < 130 && !shown.contains('\n'), "{shown}");
        assert!(quoted(&"é".repeat(3000)).ends_with("\" (6000 bytes)"), "cut on character boundaries");
        assert_eq!(short("0123/layer.tar"), "0123/layer.tar");
        assert_eq!(short(&long), format!("{}…{} (5000 bytes)", "a".repeat(48), "z".repeat(48)));
        assert_eq!(short("a\nb"), "a\\nb", "one line");
    }
}
