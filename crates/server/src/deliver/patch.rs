//! The `--patch` deliverable: a unified diff of what the task changed.
//!
//! With a git repository in the working directory it is that repository's
//! `git diff HEAD` plus its untracked files, made by git inside the
//! sandbox. Otherwise it is the writable layer against the base image, made
//! here from the task disk's upper directories, in the same `diff --git`
//! form so `git apply` and `patch -p1` take it.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use cairn_sandbox::rootfs::Layer;

/// Files larger than this are listed as changed, not diffed.
const MAX_DIFFED: u64 = 8 << 20;

/// The script git runs in the sandbox: exit 3 when the directory is not in
/// a work tree, so the caller falls back to the layer diff.
pub const GIT_DIFF: &str = r#"cd "$1" 2>/dev/null || exit 3
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 3
if git rev-parse --verify -q HEAD >/dev/null; then
  git -c core.quotepath=off diff --binary HEAD || exit 4
else
  git -c core.quotepath=off diff --binary --cached || exit 4
fi
git ls-files -z --others --exclude-standard | xargs -0 -r -n1 sh -c 'git -c core.quotepath=off diff --binary --no-index /dev/null "$1"; true' cairn-patch
"#;

/// One layer of a task's disk: its upper directory on the host, the image
/// directory under it, and where it appears in the sandbox.
#[derive(Debug)]
pub struct LayerDirs {
    pub upper: PathBuf,
    pub lower: PathBuf,
    pub at: PathBuf,
}

impl LayerDirs {
    pub fn of(disk_mount: &Path, layer: &Layer) -> LayerDirs {
        LayerDirs { upper: disk_mount.join(layer.disk_name()).join("upper"), lower: layer.lower.clone(), at: layer.at.clone() }
    }
}

/// The diff of every layer's upper directory against its lower one, paths
/// relative to the sandbox root, sorted.
pub fn layer_diff(layers: &[LayerDirs]) -> io::Result<String> {
    let mut out = String::new();
    for layer in layers {
        if !layer.upper.is_dir() {
            continue;
        }
        let mut entries = Vec::new();
        let mut opaque = Vec::new();
        walk(&layer.upper, Path::new(""), &mut entries, &mut opaque)?;
        // Lower files an opaque directory hides were deleted, unless the
        // upper layer has its own file of that name (then it is a change).
        for dir in &opaque {
            let mut hidden = Vec::new();
            lower_files(&layer.lower, dir, &mut hidden);
            entries.extend(hidden.into_iter().filter(|f| fs::symlink_metadata(layer.upper.join(f)).is_err()));
        }
        entries.sort();
        entries.dedup();
        for rel in entries {
            let shown = |rel: &Path| {
                let p = layer.at.join(rel);
                p.strip_prefix("/").unwrap_or(&p).to_string_lossy().into_owned()
            };
            let before = lower_content(&layer.lower, &rel);
            let Ok(meta) = fs::symlink_metadata(layer.upper.join(&rel)) else {
                // Hidden by an opaque directory.
                if let Some(old) = before {
                    out.push_str(&file_diff(&shown(&rel), Some(&old), None));
                }
                continue;
            };
            if meta.file_type().is_char_device() && meta.rdev() == 0 {
                // An overlay whiteout: the file, or the whole directory, was deleted.
                let mut gone = Vec::new();
                lower_files(&layer.lower, &rel, &mut gone);
                gone.sort();
                for f in gone {
                    if let Some(old) = lower_content(&layer.lower, &f) {
                        out.push_str(&file_diff(&shown(&f), Some(&old), None));
                    }
                }
                continue;
            }
            let after = if meta.file_type().is_symlink() {
                Some(fs::read_link(layer.upper.join(&rel))?.into_os_string().into_encoded_bytes())
            } else if meta.len() > MAX_DIFFED {
                None
            } else {
                Some(fs::read(layer.upper.join(&rel))?)
            };
            let shown = shown(&rel);
            match after {
                Some(new) if before.as_deref() == Some(new.as_slice()) => {}
                Some(new) => out.push_str(&file_diff(&shown, before.as_deref(), Some(&new))),
                None => out.push_str(&format!("diff --git a/{shown} b/{shown}\nFiles a/{shown} and b/{shown} differ (over {MAX_DIFFED} bytes)\n")),
            }
        }
    }
    Ok(out)
}

/// Whether overlayfs marked this upper directory opaque (it hides the
/// lower directory of the same name).
fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return false };
    let mut value = [0u8; 1];
    // SAFETY: valid C strings; the kernel writes at most one byte into `value`.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), c"trusted.overlay.opaque".as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    n == 1 && value[0] == b'y'
}

/// Regular files, symlinks and whiteouts under `rel` of the upper root,
/// and the opaque directories among its directories.
fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>, opaque: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let path = rel.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if is_opaque(&root.join(&path)) {
                opaque.push(path.clone());
            }
            walk(root, &path, out, opaque)?;
        } else if kind.is_file() || kind.is_symlink() || kind.is_char_device() {
            out.push(path);
        }
    }
    Ok(())
}

/// Files and symlinks of the lower layer at or under `rel` (a file, or a
/// directory walked without following symlinks); nothing when a directory
/// on the way there is a symlink.
fn lower_files(lower: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
    let Some(path) = lower_path(lower, rel) else { return };
    let Ok(meta) = fs::symlink_metadata(&path) else { return };
    if !meta.is_dir() {
        if meta.is_file() || meta.file_type().is_symlink() {
            out.push(rel.to_path_buf());
        }
        return;
    }
    for entry in fs::read_dir(&path).into_iter().flatten().flatten() {
        lower_files(lower, &rel.join(entry.file_name()), out);
    }
}

/// `lower/rel` when every directory on the way is a real directory.
fn lower_path(lower: &Path, rel: &Path) -> Option<PathBuf> {
    let mut cur = lower.to_path_buf();
    let comps: Vec<Component> = rel.components().collect();
    for (i, c) in comps.iter().enumerate() {
        let Component::Normal(name) = c else { return None };
        cur.push(name);
        if i + 1 < comps.len() && !fs::symlink_metadata(&cur).ok()?.is_dir() {
            return None;
        }
    }
    Some(cur)
}

/// The content of `rel` in the lower layer: a file's bytes or a symlink's
/// target. `None` when it does not exist there or a directory on its way is
/// a symlink (which would lead out of the image, into the host).
fn lower_content(lower: &Path, rel: &Path) -> Option<Vec<u8>> {
    let path = lower_path(lower, rel)?;
    let meta = fs::symlink_metadata(&path).ok()?;
    if meta.file_type().is_symlink() {
        fs::read_link(&path).ok().map(|t| t.into_os_string().into_encoded_bytes())
    } else if meta.is_file() && meta.len() <= MAX_DIFFED {
        fs::read(&path).ok()
    } else {
        None
    }
}

fn is_text(b: &[u8]) -> bool {
    !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

/// One file's `diff --git` section; `None` on a side means absent.
pub fn file_diff(path: &str, old: Option<&[u8]>, new: Option<&[u8]>) -> String {
    let mut out = format!("diff --git a/{path} b/{path}\n");
    match (old, new) {
        (None, Some(_)) => out.push_str("new file mode 100644\n"),
        (Some(_), None) => out.push_str("deleted file mode 100644\n"),
        _ => {}
    }
    let (a, b) = (old.unwrap_or_default(), new.unwrap_or_default());
    if !is_text(a) || !is_text(b) {
        let (la, lb) = (if old.is_some() { format!("a/{path}") } else { "/dev/null".into() }, if new.is_some() { format!("b/{path}") } else { "/dev/null".into() });
        out.push_str(&format!("Binary files {la} and {lb} differ\n"));
        return out;
    }
    let (a, b) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    let (ha, hb) = (if old.is_some() { format!("a/{path}") } else { "/dev/null".into() }, if new.is_some() { format!("b/{path}") } else { "/dev/null".into() });
    let diff = similar::TextDiff::from_lines(a.as_ref(), b.as_ref());
    out.push_str(&diff.unified_diff().context_radius(3).header(&ha, &hb).missing_newline_hint(true).to_string());
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn changed_added_deleted_and_unchanged_files() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        fs::create_dir_all(lower.join("etc")).unwrap();
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::write(lower.join("etc/motd"), "hello\nworld\n").unwrap();
        fs::write(upper.join("etc/motd"), "hello\nthere\n").unwrap();
        fs::write(lower.join("etc/same"), "x\n").unwrap();
        fs::write(upper.join("etc/same"), "x\n").unwrap();
        fs::write(lower.join("etc/gone"), "bye\n").unwrap();
        nix::sys::stat::mknod(&upper.join("etc/gone"), nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).unwrap();
        fs::create_dir_all(upper.join("workspace")).unwrap();
        fs::write(upper.join("workspace/new.txt"), "fresh\n").unwrap();
        fs::write(upper.join("workspace/blob.bin"), [0u8, 1, 2]).unwrap();
        let d = layer_diff(&[LayerDirs { upper, lower, at: "/".into() }]).unwrap();
        assert!(d.contains("diff --git a/etc/motd b/etc/motd\n--- a/etc/motd\n+++ b/etc/motd\n@@ -1,2 +1,2 @@\n hello\n-world\n+there\n"), "{d}");
        assert!(d.contains("deleted file mode 100644\n--- a/etc/gone\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"), "{d}");
        assert!(d.contains("new file mode 100644\n--- /dev/null\n+++ b/workspace/new.txt\n@@ -0,0 +1 @@\n+fresh\n"), "{d}");
        assert!(d.contains("Binary files /dev/null and b/workspace/blob.bin differ"), "{d}");
        assert!(!d.contains("etc/same"), "{d}");
    }

    #[test]
    fn deleted_and_opaque_directories_list_the_lower_files_they_hide() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        for d in ["gone/sub", "redone", "kept"] {
            fs::create_dir_all(lower.join(d)).unwrap();
        }
        fs::write(lower.join("gone/a"), "a\n").unwrap();
        fs::write(lower.join("gone/sub/b"), "b\n").unwrap();
        fs::write(lower.join("redone/old"), "old\n").unwrap();
        fs::write(lower.join("redone/same-name"), "before\n").unwrap();
        fs::write(lower.join("kept/k"), "k\n").unwrap();
        fs::create_dir_all(&upper).unwrap();
        nix::sys::stat::mknod(&upper.join("gone"), nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).unwrap();
        fs::create_dir_all(upper.join("redone")).unwrap();
        fs::write(upper.join("redone/same-name"), "after\n").unwrap();
        let c = std::ffi::CString::new(upper.join("redone").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: valid C strings and a one-byte value.
        let rc = unsafe { libc::lsetxattr(c.as_ptr(), c"trusted.overlay.opaque".as_ptr(), b"y".as_ptr().cast(), 1, 0) };
        assert_eq!(rc, 0, "setting trusted.* needs root: {}", io::Error::last_os_error());
        let d = layer_diff(&[LayerDirs { upper, lower, at: "/".into() }]).unwrap();
        for gone in ["gone/a", "gone/sub/b", "redone/old"] {
            assert!(d.contains(&format!("deleted file mode 100644\n--- a/{gone}\n+++ /dev/null\n")), "{gone} deleted: {d}");
        }
        assert!(d.contains("--- a/redone/same-name\n+++ b/redone/same-name\n@@ -1 +1 @@\n-before\n+after\n"), "{d}");
        assert!(!d.contains("kept/k"), "{d}");
    }

    #[test]
    fn a_symlinked_lower_directory_is_not_followed_into_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper, host) = (dir.path().join("lower"), dir.path().join("upper"), dir.path().join("host"));
        fs::create_dir_all(&lower).unwrap();
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("secret"), "host secret\n").unwrap();
        std::os::unix::fs::symlink(&host, lower.join("lib")).unwrap();
        fs::create_dir_all(upper.join("lib")).unwrap();
        fs::write(upper.join("lib/secret"), "mine\n").unwrap();
        let d = layer_diff(&[LayerDirs { upper, lower, at: "/".into() }]).unwrap();
        assert!(!d.contains("host secret") && d.contains("+mine"), "{d}");
    }
}
