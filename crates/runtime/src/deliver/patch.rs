//! The `--patch` deliverable: a unified diff of what the task changed.
//!
//! With a git repository in the working directory it is that repository's
//! `git diff HEAD` plus its untracked files, made by git inside the
//! sandbox. Otherwise it is the writable layer against the base image, made
//! here from the task disk's upper directories, in the same `diff --git`
//! form so `git apply` and `patch -p1` take it.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cairn_fsat::{self as fsat, Kind, XattrAt};
use cairn_image::{Layer, Lookup, LowerStack};
use cairn_sandbox::LayerAccess;

/// Files larger than this are listed as changed, not diffed.
const MAX_DIFFED: u64 = 8 << 20;
/// Directories nested deeper than this in a writable layer are refused: the
/// walk holds one descriptor per level.
const MAX_DEPTH: usize = 256;

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

/// One layer of a task's disk: its upper directory on the host, the
/// task's own earlier changes under it (a fork's base, top first), the
/// image directories under those (top first), and where it appears in the
/// sandbox.
#[derive(Debug)]
pub struct LayerDirs {
    pub upper: PathBuf,
    pub history: Vec<PathBuf>,
    pub lowers: Vec<PathBuf>,
    pub at: PathBuf,
}

impl LayerDirs {
    pub fn of(disk: &dyn LayerAccess, layer: &Layer) -> LayerDirs {
        let (history, lowers) = layer.lowers.split_at(layer.history.min(layer.lowers.len()));
        LayerDirs {
            upper: disk.upper(&layer.disk_name()),
            history: history.to_vec(),
            lowers: lowers.to_vec(),
            at: layer.at.clone(),
        }
    }
}

/// What the writable layer holds at a path, read through descriptors while
/// the sandbox may be changing it.
#[derive(Debug)]
enum Upper {
    /// A regular file's bytes; `None` when it is over [`MAX_DIFFED`].
    File(Option<Vec<u8>>),
    Symlink(Vec<u8>),
    /// An overlay whiteout: the lower file or directory was deleted.
    Whiteout,
}

/// The writable layer of one overlay: its entries and its opaque
/// directories (which hide the lower directory of the same name).
#[derive(Debug, Default)]
struct UpperTree {
    entries: BTreeMap<PathBuf, Upper>,
    opaque: Vec<PathBuf>,
    dirs: std::collections::BTreeSet<PathBuf>,
}

impl UpperTree {
    /// `above` stacked on this tree as overlayfs stacks layers: its
    /// entries replace what is here at their paths (a whiteout or a file
    /// replaces a whole directory), and its opaque directories hide what is
    /// here beneath them.
    fn stack(mut self, above: UpperTree) -> UpperTree {
        for d in &above.opaque {
            self.remove_beneath(d);
        }
        for (path, entry) in above.entries {
            self.remove_beneath(&path);
            self.dirs.remove(&path);
            self.opaque.retain(|o| o != &path);
            self.entries.insert(path, entry);
        }
        for d in above.dirs {
            // A directory over a whiteout or a file ends the merge there,
            // as an opaque directory does: what the image has beneath is
            // hidden.
            if self.entries.remove(&d).is_some() {
                self.opaque.push(d.clone());
            }
            self.dirs.insert(d);
        }
        self.opaque.extend(above.opaque);
        self
    }

    /// Forgets everything strictly beneath directory `dir`.
    fn remove_beneath(&mut self, dir: &Path) {
        use std::ops::Bound::{Excluded, Unbounded};
        // Component-wise order puts a directory's descendants right after it.
        let beneath: Vec<PathBuf> =
            self.entries.range::<Path, _>((Excluded(dir), Unbounded)).map(|(p, _)| p).take_while(|p| p.starts_with(dir)).cloned().collect();
        for p in beneath {
            self.entries.remove(&p);
        }
        let dirs: Vec<PathBuf> =
            self.dirs.range::<Path, _>((Excluded(dir), Unbounded)).take_while(|p| p.starts_with(dir)).cloned().collect();
        for p in dirs {
            self.dirs.remove(&p);
        }
        self.opaque.retain(|o| o == dir || !o.starts_with(dir));
    }
}

/// The diff of every layer's upper directory against its lower one, paths
/// relative to the sandbox root, sorted.
///
/// The upper directory belongs to the running sandbox, so it is read only
/// through descriptors (`cairn_fsat`): each directory is opened relative to
/// its parent without following symlinks, each entry's type comes from
/// `fstat` on what was opened, and a file is read from that descriptor. An
/// entry the sandbox swaps or removes meanwhile is left out, never followed.
pub fn layer_diff(layers: &[LayerDirs]) -> io::Result<String> {
    let mut out = String::new();
    for layer in layers {
        let upper = match fsat::open_dir(&layer.upper) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let lower = Lower(LowerStack::open(&layer.lowers)?);
        // A fork's base holds the task's changes before the fork: they and
        // the upper are the task's, stacked as the overlay stacks them.
        let mut tree = UpperTree::default();
        for dir in layer.history.iter().rev() {
            tree = tree.stack(read_upper(&fsat::open_dir(dir)?)?);
        }
        let tree = tree.stack(read_upper(&upper)?);
        let shown = |rel: &Path| {
            let p = layer.at.join(rel);
            p.strip_prefix("/").unwrap_or(&p).to_string_lossy().into_owned()
        };
        // Lower files an opaque directory hides were deleted, unless the
        // upper layer has its own entry of that name (then it is a change).
        let mut hidden = Vec::new();
        for dir in &tree.opaque {
            lower.files(dir, &mut hidden);
        }
        let mut paths: Vec<&Path> = tree.entries.keys().map(PathBuf::as_path).collect();
        paths.extend(hidden.iter().map(PathBuf::as_path).filter(|f| !tree.entries.contains_key(*f) && !tree.dirs.contains(*f)));
        paths.sort();
        paths.dedup();
        for rel in paths {
            let before = lower.content(rel);
            match tree.entries.get(rel) {
                None => {
                    // Hidden by an opaque directory.
                    if let Some(old) = before {
                        out.push_str(&file_diff(&shown(rel), Some(&old), None));
                    }
                }
                Some(Upper::Whiteout) => {
                    // The file, or the whole directory, was deleted.
                    let mut gone = Vec::new();
                    lower.files(rel, &mut gone);
                    gone.sort();
                    for f in gone {
                        if let Some(old) = lower.content(&f) {
                            out.push_str(&file_diff(&shown(&f), Some(&old), None));
                        }
                    }
                }
                Some(Upper::File(None)) => {
                    let shown = shown(rel);
                    out.push_str(&format!("diff --git a/{shown} b/{shown}\nFiles a/{shown} and b/{shown} differ (over {MAX_DIFFED} bytes)\n"));
                }
                Some(Upper::File(Some(new)) | Upper::Symlink(new)) => {
                    if before.as_deref() != Some(new.as_slice()) {
                        out.push_str(&file_diff(&shown(rel), before.as_deref(), Some(new)));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Errors that mean the sandbox changed or removed an entry while it was
/// read: the entry is left out.
fn vanished(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::NOENT, Errno::NOTDIR, Errno::LOOP, Errno::INVAL, Errno::NXIO].iter().any(|n| e.raw_os_error() == Some(n.raw_os_error()))
        || e.kind() == io::ErrorKind::InvalidInput
}

/// One directory being read: its descriptor, its path in the layer and the
/// names still to visit.
struct Frame {
    fd: OwnedFd,
    rel: PathBuf,
    names: std::vec::IntoIter<CString>,
}

/// Reads the writable layer under `root`, depth first, one descriptor per
/// level, never following a symlink and never leaving its filesystem.
fn read_upper(root: &OwnedFd) -> io::Result<UpperTree> {
    let dev = fsat::fstat(root)?.st_dev;
    let mut tree = UpperTree::default();
    let mut stack = vec![Frame { fd: root.try_clone()?, rel: PathBuf::new(), names: fsat::read_dir(root)?.into_iter() }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let rel = frame.rel.join(OsStr::from_bytes(name.to_bytes()));
        let st = match fsat::lstat_at(&frame.fd, &name) {
            Ok(st) => st,
            Err(e) if vanished(&e) => continue,
            Err(e) => return Err(e),
        };
        let entry = match fsat::kind(&st) {
            Kind::Dir => {
                let fd = match fsat::open_dir_at(&frame.fd, &name) {
                    Ok(fd) => fd,
                    Err(e) if vanished(&e) => continue,
                    Err(e) => return Err(e),
                };
                if fsat::fstat(&fd)?.st_dev != dev {
                    continue;
                }
                if stack.len() > MAX_DEPTH {
                    return Err(io::Error::other(format!("{} is nested more than {MAX_DEPTH} directories deep", rel.display())));
                }
                if XattrAt::Fd(fd.as_fd()).get(b"trusted.overlay.opaque").is_ok_and(|v| v == b"y") {
                    tree.opaque.push(rel.clone());
                }
                let names = match fsat::read_dir(&fd) {
                    Ok(n) => n,
                    Err(e) if vanished(&e) => continue,
                    Err(e) => return Err(e),
                };
                tree.dirs.insert(rel.clone());
                stack.push(Frame { fd, rel, names: names.into_iter() });
                continue;
            }
            Kind::File => match read_bounded(&frame.fd, &name) {
                Ok(data) => Upper::File(data),
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(e),
            },
            Kind::Symlink => match fsat::readlink_at(&frame.fd, &name) {
                Ok(target) => Upper::Symlink(target),
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(e),
            },
            Kind::CharDevice { rdev: 0 } => Upper::Whiteout,
            _ => continue,
        };
        tree.entries.insert(rel, entry);
    }
    Ok(tree)
}

/// A regular file's bytes, read from the descriptor that `fstat` checked;
/// `None` when it is over [`MAX_DIFFED`] (or grew over it while read).
fn read_bounded(dir: impl AsFd, name: &CStr) -> io::Result<Option<Vec<u8>>> {
    match fsat::read_regular_at(dir, name, MAX_DIFFED) {
        Ok(data) => Ok(Some(data)),
        Err(e) if e.kind() == io::ErrorKind::FileTooLarge => Ok(None),
        Err(e) => Err(e),
    }
}

/// The image directories under a layer, merged as the overlay shows them
/// and read beneath their descriptors without following symlinks (a link
/// in an image never leads the daemon out).
struct Lower(LowerStack);

impl Lower {
    /// Files and symlinks at or under `rel` (a file, or a directory walked
    /// without following symlinks).
    fn files(&self, rel: &Path, out: &mut Vec<PathBuf>) {
        match self.0.lookup(rel) {
            Some(Lookup::Dir(dir)) => Self::files_in(&dir, rel, out, 0),
            Some(Lookup::Other { kind: Kind::File | Kind::Symlink, .. }) => out.push(rel.to_path_buf()),
            _ => {}
        }
    }

    fn files_in(dir: &LowerStack, rel: &Path, out: &mut Vec<PathBuf>, depth: usize) {
        if depth >= MAX_DEPTH {
            return;
        }
        for name in dir.names() {
            let path = rel.join(OsStr::from_bytes(name.to_bytes()));
            match dir.child(&name) {
                Some(Lookup::Dir(sub)) => Self::files_in(&sub, &path, out, depth + 1),
                Some(Lookup::Other { kind: Kind::File | Kind::Symlink, .. }) => out.push(path),
                _ => {}
            }
        }
    }

    /// The content of `rel`: a file's bytes or a symlink's target. `None`
    /// when it does not exist, is too large, or a directory on its way is a
    /// symlink.
    fn content(&self, rel: &Path) -> Option<Vec<u8>> {
        match self.0.lookup(rel)? {
            Lookup::Other { parent, name, kind: Kind::Symlink } => fsat::readlink_at(&parent, &name).ok(),
            Lookup::Other { parent, name, kind: Kind::File } => read_bounded(&parent, &name).ok().flatten(),
            _ => None,
        }
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
    use std::fs;

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
        let d = layer_diff(&[LayerDirs { upper, history: vec![], lowers: vec![lower], at: "/".into() }]).unwrap();
        assert!(d.contains("diff --git a/etc/motd b/etc/motd\n--- a/etc/motd\n+++ b/etc/motd\n@@ -1,2 +1,2 @@\n hello\n-world\n+there\n"), "{d}");
        assert!(d.contains("deleted file mode 100644\n--- a/etc/gone\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"), "{d}");
        assert!(d.contains("new file mode 100644\n--- /dev/null\n+++ b/workspace/new.txt\n@@ -0,0 +1 @@\n+fresh\n"), "{d}");
        assert!(d.contains("Binary files /dev/null and b/workspace/blob.bin differ"), "{d}");
        assert!(!d.contains("etc/same"), "{d}");
    }

    #[test]
    fn a_forks_base_counts_as_the_tasks_own_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, base, upper) = (dir.path().join("lower"), dir.path().join("base"), dir.path().join("upper"));
        let whiteout = |p: &Path| nix::sys::stat::mknod(p, nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).unwrap();
        for d in [&lower.join("etc"), &lower.join("old"), &base.join("etc"), &base.join("srv"), &upper.join("srv")] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(lower.join("etc/motd"), "one\n").unwrap();
        fs::write(lower.join("etc/issue"), "image\n").unwrap();
        fs::write(lower.join("old/x"), "x\n").unwrap();
        // Before the fork: motd changed, issue deleted, a file made and one
        // made then deleted again after the fork; the directory old deleted.
        fs::write(base.join("etc/motd"), "two\n").unwrap();
        whiteout(&base.join("etc/issue"));
        fs::write(base.join("srv/kept"), "kept\n").unwrap();
        fs::write(base.join("srv/dropped"), "dropped\n").unwrap();
        whiteout(&base.join("old"));
        // After the fork: motd changed again, dropped deleted, old made anew.
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::write(upper.join("etc/motd"), "three\n").unwrap();
        whiteout(&upper.join("srv/dropped"));
        fs::create_dir_all(upper.join("old")).unwrap();
        fs::write(upper.join("old/y"), "y\n").unwrap();
        let d = layer_diff(&[LayerDirs { upper, history: vec![base], lowers: vec![lower], at: "/".into() }]).unwrap();
        assert!(d.contains("--- a/etc/motd\n+++ b/etc/motd\n@@ -1 +1 @@\n-one\n+three\n"), "{d}");
        assert!(d.contains("deleted file mode 100644\n--- a/etc/issue\n"), "{d}");
        assert!(d.contains("new file mode 100644\n--- /dev/null\n+++ b/srv/kept\n"), "{d}");
        assert!(d.contains("deleted file mode 100644\n--- a/old/x\n"), "{d}");
        assert!(d.contains("new file mode 100644\n--- /dev/null\n+++ b/old/y\n"), "{d}");
        assert!(!d.contains("dropped"), "made and deleted again is no change: {d}");
        assert_eq!(d.matches("diff --git").count(), 5, "{d}");
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
        let d = layer_diff(&[LayerDirs { upper, history: vec![], lowers: vec![lower], at: "/".into() }]).unwrap();
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
        let d = layer_diff(&[LayerDirs { upper, history: vec![], lowers: vec![lower], at: "/".into() }]).unwrap();
        assert!(!d.contains("host secret") && d.contains("+mine"), "{d}");
    }

    #[test]
    fn a_racing_swap_of_a_directory_and_a_host_symlink_never_leaks_host_files() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper, host) = (dir.path().join("lower"), dir.path().join("upper"), dir.path().join("host"));
        let marker = format!("host-marker-{}", std::process::id() as u64 * 7919 + 17);
        fs::create_dir_all(&lower).unwrap();
        fs::create_dir_all(upper.join("w/d")).unwrap();
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join("secret.txt"), &marker).unwrap();
        fs::write(upper.join("w/d/secret.txt"), "benign\n").unwrap();
        std::os::unix::fs::symlink(&host, upper.join("w/l")).unwrap();
        let layers = || vec![LayerDirs { upper: upper.clone(), history: vec![], lowers: vec![lower.clone()], at: "/".into() }];
        // Positive control: without the racer the file is in the diff.
        let d = layer_diff(&layers()).unwrap();
        assert!(d.contains("+benign") && !d.contains(&marker), "{d}");

        let racer = fsat::testing::Racer::start(fsat::open_dir(&upper.join("w")).unwrap(), "d", "l");
        racer.wait_started();
        let mut seen_benign = 0;
        racer.race(300, || {
            let d = layer_diff(&layers()).unwrap();
            assert!(!d.contains(&marker), "host file leaked into the patch: {d}");
            seen_benign += usize::from(d.contains("+benign"));
            seen_benign > 0
        });
        drop(racer);
        assert!(seen_benign > 0, "the layer was never read while racing");
        assert_eq!(fs::read_to_string(host.join("secret.txt")).unwrap(), marker);
        assert_eq!(fs::read_dir(&host).unwrap().count(), 1, "nothing created in the host directory");
    }

    #[test]
    fn a_fifo_or_a_deep_tree_does_not_hang_or_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let (lower, upper) = (dir.path().join("lower"), dir.path().join("upper"));
        fs::create_dir_all(&lower).unwrap();
        fs::create_dir_all(&upper).unwrap();
        nix::unistd::mkfifo(&upper.join("pipe"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        fs::write(upper.join("plain"), "x\n").unwrap();
        let d = layer_diff(&[LayerDirs { upper: upper.clone(), history: vec![], lowers: vec![lower.clone()], at: "/".into() }]).unwrap();
        assert!(d.contains("+++ b/plain") && !d.contains("pipe"), "{d}");
        // A tree deeper than the limit is refused with a reason, built by
        // descriptor since its path is longer than PATH_MAX.
        let mut cur = fsat::open_dir(&upper).unwrap();
        for _ in 0..MAX_DEPTH + 2 {
            fsat::mkdir_at(&cur, c"dddddddddddddddddddd", 0o755).unwrap();
            cur = fsat::open_dir_at(&cur, c"dddddddddddddddddddd").unwrap();
        }
        let err = layer_diff(&[LayerDirs { upper, history: vec![], lowers: vec![lower], at: "/".into() }]).unwrap_err().to_string();
        assert!(err.contains("nested more than"), "{err}");
    }
}
