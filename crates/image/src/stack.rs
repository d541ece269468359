//! Reading an image's lower directories as overlayfs shows them merged,
//! without mounting anything.
//!
//! The lowers are looked at top first. For each name, the topmost lower
//! that has it decides: a whiteout (a character device 0/0) hides it and
//! everything below; a non-directory is what is seen; a directory is merged
//! with the same-named directories of the lowers below it, down to the
//! first one marked opaque (`trusted.overlay.opaque=y`), which hides the
//! rest. A lower that is not a directory at that name ends the merge.
//!
//! Every lookup goes one name at a time through directory descriptors
//! (`cairn_fsat`), never following a symlink: a link in an image never
//! leads the daemon out of it.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use cairn_fsat::{self as fsat, Kind, XattrAt};

/// The attribute overlayfs reads to tell an opaque directory.
pub const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

/// One directory of the merged view: the lower directories that make it
/// up, top first.
#[derive(Debug)]
pub struct LowerStack {
    dirs: Vec<OwnedFd>,
}

/// What the merged view holds at a name.
#[derive(Debug)]
pub enum Lookup {
    /// A directory, merged from one or more lowers.
    Dir(LowerStack),
    /// A non-directory: the directory holding it (in the lower that shows
    /// it), its name there and its kind.
    Other { parent: OwnedFd, name: CString, kind: Kind },
}

impl LowerStack {
    /// The merged root of `lowers` (top first). A lower that does not exist
    /// is left out; a lower that is a symlink is an error.
    pub fn open(lowers: &[PathBuf]) -> io::Result<LowerStack> {
        let mut dirs = Vec::with_capacity(lowers.len());
        for lower in lowers {
            match fsat::open_dir(lower) {
                Ok(fd) => dirs.push(fd),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(LowerStack { dirs })
    }

    /// True when no lower has anything here.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// The entry `name` of this directory, or `None` when the merged view
    /// has none (absent, or hidden by a whiteout).
    pub fn child(&self, name: &CStr) -> Option<Lookup> {
        let mut merged = Vec::new();
        for dir in &self.dirs {
            let Ok(st) = fsat::lstat_at(dir, name) else { continue };
            match fsat::kind(&st) {
                Kind::CharDevice { rdev: 0 } => break,
                Kind::Dir => {
                    let Ok(fd) = fsat::open_dir_at(dir, name) else { break };
                    let opaque = is_opaque(&fd);
                    merged.push(fd);
                    if opaque {
                        break;
                    }
                }
                kind if merged.is_empty() => {
                    let parent = dir.try_clone().ok()?;
                    return Some(Lookup::Other { parent, name: name.to_owned(), kind });
                }
                // A non-directory below a directory ends the merge.
                _ => break,
            }
        }
        (!merged.is_empty()).then_some(Lookup::Dir(LowerStack { dirs: merged }))
    }

    /// What is at the relative path `rel`, looked up one name at a time.
    /// `None` when absent, or when `rel` leaves the tree (`..`, absolute).
    pub fn lookup(&self, rel: &Path) -> Option<Lookup> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(fsat::cstr(n).ok()?),
                Component::CurDir => {}
                Component::RootDir | Component::ParentDir | Component::Prefix(_) => return None,
            }
        }
        let Some((last, parents)) = names.split_last() else {
            return Some(Lookup::Dir(self.try_clone().ok()?));
        };
        let mut dir: Option<LowerStack> = None;
        for name in parents {
            match dir.as_ref().unwrap_or(self).child(name)? {
                Lookup::Dir(d) => dir = Some(d),
                Lookup::Other { .. } => return None,
            }
        }
        dir.as_ref().unwrap_or(self).child(last)
    }

    /// True when `rel` is a directory of the merged view.
    pub fn is_dir(&self, rel: &Path) -> bool {
        matches!(self.lookup(rel), Some(Lookup::Dir(_)))
    }

    /// The names the merged directory shows, sorted, whiteouts left out.
    pub fn names(&self) -> Vec<CString> {
        let mut all: Vec<CString> = self.dirs.iter().flat_map(|d| fsat::read_dir(d).unwrap_or_default()).collect();
        all.sort_unstable();
        all.dedup();
        all.retain(|n| self.child(n).is_some());
        all
    }

    fn try_clone(&self) -> io::Result<LowerStack> {
        Ok(LowerStack { dirs: self.dirs.iter().map(|d| d.try_clone()).collect::<io::Result<_>>()? })
    }
}

/// True when the directory `fd` is marked opaque.
pub fn is_opaque(fd: &OwnedFd) -> bool {
    XattrAt::Fd(fd.as_fd()).get(OPAQUE_XATTR).is_ok_and(|v| v == b"y")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::fs;

    fn whiteout(p: &Path) {
        nix::sys::stat::mknod(p, nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).unwrap();
    }

    fn opaque(p: &Path) {
        let fd = fsat::open_dir(p).unwrap();
        XattrAt::Fd(fd.as_fd()).set(OPAQUE_XATTR, b"y").unwrap();
    }

    fn names(s: &LowerStack, rel: &str) -> Vec<String> {
        let Some(Lookup::Dir(d)) = s.lookup(Path::new(rel)) else { panic!("{rel} is not a directory") };
        d.names().iter().map(|n| n.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn whiteouts_opaque_directories_and_replacements_merge_as_overlayfs_does() {
        let tmp = tempfile::tempdir().unwrap();
        let (top, base) = (tmp.path().join("top"), tmp.path().join("base"));
        for d in ["etc", "opt/old", "var/lib", "srv"] {
            fs::create_dir_all(base.join(d)).unwrap();
        }
        for f in ["etc/a", "etc/b", "etc/c", "opt/o", "var/lib/x", "srv/f"] {
            fs::write(base.join(f), format!("base {f}")).unwrap();
        }
        fs::write(base.join("file-then-dir"), "x").unwrap();
        for d in ["etc", "opt", "var", "file-then-dir"] {
            fs::create_dir_all(top.join(d)).unwrap();
        }
        fs::write(top.join("etc/a"), "top a").unwrap();
        whiteout(&top.join("etc/c"));
        fs::write(top.join("opt/n"), "top n").unwrap();
        opaque(&top.join("opt"));
        whiteout(&top.join("var/lib"));
        fs::write(top.join("srv"), "now a file").unwrap();
        let s = LowerStack::open(&[top.clone(), base.clone(), tmp.path().join("missing")]).unwrap();

        assert_eq!(names(&s, ""), ["etc", "file-then-dir", "opt", "srv", "var"]);
        assert_eq!(names(&s, "etc"), ["a", "b"]);
        assert_eq!(names(&s, "opt"), ["n"]);
        assert!(names(&s, "var").is_empty());
        assert!(names(&s, "file-then-dir").is_empty(), "a directory over a file shows only itself");
        let Some(Lookup::Other { parent, name, kind: Kind::File }) = s.lookup(Path::new("etc/a")) else { panic!() };
        assert_eq!(fsat::read_regular_at(&parent, &name, 100).unwrap(), b"top a");
        let Some(Lookup::Other { parent, name, .. }) = s.lookup(Path::new("etc/b")) else { panic!() };
        assert_eq!(fsat::read_regular_at(&parent, &name, 100).unwrap(), b"base etc/b");
        for gone in ["etc/c", "opt/o", "opt/old", "var/lib", "var/lib/x", "srv/f", "../etc", "/etc"] {
            assert!(s.lookup(Path::new(gone)).is_none(), "{gone} is hidden");
        }
        assert!(s.is_dir(Path::new("etc")) && s.is_dir(Path::new("")) && !s.is_dir(Path::new("srv")));
    }

    #[test]
    fn one_lower_reads_as_the_plain_directory_and_links_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (lower, host) = (tmp.path().join("lower"), tmp.path().join("host"));
        fs::create_dir_all(lower.join("d")).unwrap();
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(&host, lower.join("lib")).unwrap();
        let s = LowerStack::open(std::slice::from_ref(&lower)).unwrap();
        assert_eq!(names(&s, ""), ["d", "lib"]);
        assert!(matches!(s.lookup(Path::new("lib")), Some(Lookup::Other { kind: Kind::Symlink, .. })));
        assert!(s.lookup(Path::new("lib/secret")).is_none());
        assert!(!s.is_dir(Path::new("lib")));
    }
}
