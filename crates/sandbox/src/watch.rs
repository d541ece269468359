//! Directory watches with inotify, run inside the sandbox: the native
//! init forks one for each watch, a gvisor sandbox runs
//! `cairn __gvisor-watch` (gVisor has its own inotify). Either way the
//! kernel that reports the events is the sandbox's, and every path is
//! resolved in the sandbox's own view of its files, so nothing on the host
//! is looked up by a name the agent chose.
//!
//! The watcher writes one JSON [`WatchLine`] per line: `Ready` once its
//! watches are in place (or `Error` and it exits), then an `Event` per
//! change, named relative to the watched directory. It stops when the
//! watched directory goes away or its reader does.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

/// The hidden subcommand of the `cairn` binary that runs [`run`] on its
/// stdout: `cairn __gvisor-watch PATH [--recursive]`.
pub const WATCH_SUBCOMMAND: &str = "__gvisor-watch";

/// Most directories one recursive watch follows.
pub const MAX_WATCHED_DIRS: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Write,
    Remove,
    /// The old name of a moved entry (its new name comes as `Create`).
    Rename,
    Chmod,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Relative to the watched directory.
    pub name: String,
    pub kind: WatchKind,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchLine {
    Ready,
    Event(WatchEvent),
    Error(String),
}

/// Watches `dir` (and, if `recursive`, every directory beneath it, also
/// those made later) and writes what happens to `out` until `dir` is
/// removed or `out` is closed. Returns the exit code.
pub fn run(dir: &Path, recursive: bool, out: &mut impl Write) -> i32 {
    let mut emit = |line: &WatchLine| -> bool {
        let Ok(mut text) = serde_json::to_vec(line) else { return false };
        text.push(b'\n');
        out.write_all(&text).and_then(|()| out.flush()).is_ok()
    };
    let inotify = match Inotify::init(InitFlags::IN_CLOEXEC) {
        Ok(i) => i,
        Err(e) => {
            emit(&WatchLine::Error(format!("inotify: {e}")));
            return 1;
        }
    };
    let mut watches = Watches { inotify, dirs: HashMap::new(), base: dir.to_owned() };
    let root = match watches.add(Path::new("")) {
        Ok(wd) => wd,
        Err(e) => {
            let why = match e {
                nix::Error::ENOENT => "no such directory".to_owned(),
                nix::Error::ELOOP => "a symbolic link, not a directory".to_owned(),
                nix::Error::ENOTDIR => "not a directory".to_owned(),
                e => e.desc().to_owned(),
            };
            emit(&WatchLine::Error(format!("{}: {why}", dir.display())));
            return 1;
        }
    };
    if recursive {
        watches.add_beneath(Path::new(""), &mut |_| true);
    }
    if !emit(&WatchLine::Ready) {
        return 0;
    }
    loop {
        let events = match watches.inotify.read_events() {
            Ok(e) => e,
            Err(nix::Error::EINTR) => continue,
            Err(e) => {
                emit(&WatchLine::Error(format!("inotify: {e}")));
                return 1;
            }
        };
        for event in events {
            if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                watches.dirs.remove(&event.wd);
                if event.wd == root {
                    // The watched directory is gone.
                    return 0;
                }
                continue;
            }
            let Some(parent) = watches.dirs.get(&event.wd).cloned() else { continue };
            let Some(name) = event.name else { continue };
            let rel = parent.join(&name);
            let mask = event.mask;
            let kind = if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
                WatchKind::Create
            } else if mask.contains(AddWatchFlags::IN_MODIFY) {
                WatchKind::Write
            } else if mask.contains(AddWatchFlags::IN_DELETE) {
                WatchKind::Remove
            } else if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                WatchKind::Rename
            } else if mask.contains(AddWatchFlags::IN_ATTRIB) {
                WatchKind::Chmod
            } else {
                continue;
            };
            if !emit(&WatchLine::Event(WatchEvent { name: rel.to_string_lossy().into_owned(), kind })) {
                return 0;
            }
            if recursive && kind == WatchKind::Create && mask.contains(AddWatchFlags::IN_ISDIR) {
                // A new directory: watch it, and tell of what was made in
                // it before the watch was in place (`mkdir -p a/b/c`).
                if watches.add(&rel).is_ok() {
                    let mut gone = false;
                    watches.add_beneath(&rel, &mut |made| {
                        gone = gone || !emit(&WatchLine::Event(WatchEvent { name: made.to_string_lossy().into_owned(), kind: WatchKind::Create }));
                        !gone
                    });
                    if gone {
                        return 0;
                    }
                }
            }
        }
    }
}

struct Watches {
    inotify: Inotify,
    /// Each watch's directory, relative to `base`.
    dirs: HashMap<WatchDescriptor, PathBuf>,
    base: PathBuf,
}

impl Watches {
    fn add(&mut self, rel: &Path) -> nix::Result<WatchDescriptor> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(nix::Error::ENOSPC);
        }
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_ONLYDIR;
        // A link is refused, also in the last step: opened without following
        // it, checked, then watched through the descriptor (inotify and
        // O_DIRECTORY follow a link to a directory when asked for one).
        // `join("")` would add a slash, which follows a link.
        let path = if rel.as_os_str().is_empty() { self.base.clone() } else { self.base.join(rel) };
        let dir = nix::fcntl::open(&path, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
        // SAFETY: `open` just returned this descriptor, owned by nothing else.
        let dir = unsafe { OwnedFd::from_raw_fd(dir) };
        // What was opened, not what the name meant a moment before.
        match nix::sys::stat::fstat(dir.as_raw_fd())?.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {}
            libc::S_IFLNK => return Err(nix::Error::ELOOP),
            _ => return Err(nix::Error::ENOTDIR),
        }
        let wd = self.inotify.add_watch(format!("/proc/self/fd/{}", dir.as_raw_fd()).as_str(), mask)?;
        self.dirs.insert(wd, rel.to_owned());
        Ok(wd)
    }

    /// Watches every directory beneath `rel` (never through a link), and
    /// calls `found` with each entry met; stops when it answers false.
    fn add_beneath(&mut self, rel: &Path, found: &mut dyn FnMut(&Path) -> bool) -> bool {
        let Ok(entries) = std::fs::read_dir(self.base.join(rel)) else { return true };
        for entry in entries.flatten() {
            let child = rel.join(entry.file_name());
            if !found(&child) {
                return false;
            }
            // The entry's own type: a link to a directory is not followed.
            if entry.file_type().is_ok_and(|t| t.is_dir()) && self.add(&child).is_ok() && !self.add_beneath(&child, found) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixStream;

    /// Runs a watcher on a thread, writing to a socket; returns its lines.
    fn watch(dir: &Path, recursive: bool) -> (std::thread::JoinHandle<i32>, impl Iterator<Item = WatchLine>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let dir = dir.to_owned();
        let handle = std::thread::spawn(move || {
            let mut theirs = theirs;
            run(&dir, recursive, &mut theirs)
        });
        let lines = BufReader::new(ours).lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap());
        (handle, lines)
    }

    fn event(name: &str, kind: WatchKind) -> WatchLine {
        WatchLine::Event(WatchEvent { name: name.into(), kind })
    }

    #[test]
    fn reports_changes_named_from_the_watched_directory_and_ends_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("w");
        std::fs::create_dir_all(dir.join("old")).unwrap();
        let (handle, mut lines) = watch(&dir, true);
        assert_eq!(lines.next(), Some(WatchLine::Ready));
        std::fs::write(dir.join("a.txt"), "x").unwrap();
        assert_eq!(lines.next(), Some(event("a.txt", WatchKind::Create)));
        assert_eq!(lines.next(), Some(event("a.txt", WatchKind::Write)));
        std::fs::write(dir.join("old/b"), "").unwrap();
        assert_eq!(lines.next(), Some(event("old/b", WatchKind::Create)));
        std::fs::create_dir_all(dir.join("new/deep")).unwrap();
        assert_eq!(lines.next(), Some(event("new", WatchKind::Create)));
        // Made before its parent's watch was in place: told all the same.
        let next = lines.next();
        assert!(next == Some(event("new/deep", WatchKind::Create)), "{next:?}");
        std::fs::write(dir.join("new/deep/c"), "").unwrap();
        std::fs::rename(dir.join("a.txt"), dir.join("b.txt")).unwrap();
        // The watches on `new` and `deep` and their listings race the writes
        // above: `deep` made between the watch on `new` and its listing is
        // told again, `c` may be told by the listing of `deep`, by its watch,
        // or both, and the two may come in either order. Each is told before
        // the rename that followed them.
        let (deep, c) = (event("new/deep", WatchKind::Create), event("new/deep/c", WatchKind::Create));
        let mut c_told = false;
        let next = loop {
            match lines.next() {
                Some(line) if line == deep => {}
                Some(line) if line == c => c_told = true,
                other => break other,
            }
        };
        assert!(c_told, "new/deep/c was told before {next:?}");
        assert_eq!(next, Some(event("a.txt", WatchKind::Rename)));
        assert_eq!(lines.next(), Some(event("b.txt", WatchKind::Create)));
        std::fs::set_permissions(dir.join("b.txt"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert_eq!(lines.next(), Some(event("b.txt", WatchKind::Chmod)));
        std::fs::remove_file(dir.join("b.txt")).unwrap();
        assert_eq!(lines.next(), Some(event("b.txt", WatchKind::Remove)));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(handle.join().unwrap(), 0, "the watch ends with its directory");
    }

    #[test]
    fn a_flat_watch_ignores_subdirectories() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let (handle, mut lines) = watch(tmp.path(), false);
        assert_eq!(lines.next(), Some(WatchLine::Ready));
        std::fs::write(tmp.path().join("sub/hidden"), "").unwrap();
        std::fs::write(tmp.path().join("seen"), "").unwrap();
        assert_eq!(lines.next(), Some(event("seen", WatchKind::Create)), "the change in sub/ is not reported");
        drop(lines);
        // Its reader gone, the watcher stops at its next event. A child that
        // another test forks meanwhile holds a copy of our end until it
        // execs, and a write then still succeeds: make events until the
        // watcher has stopped, within a deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for n in 0.. {
            if handle.is_finished() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the watcher did not stop after its reader went");
            std::fs::write(tmp.path().join(format!("again{n}")), "").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(handle.join().unwrap(), 0);
    }

    #[test]
    fn refuses_a_missing_directory_a_file_and_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("file"), "").unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("link")).unwrap();
        for (name, why) in [("missing", "no such directory"), ("file", "not a directory"), ("link", "a symbolic link")] {
            let (handle, mut lines) = watch(&tmp.path().join(name), false);
            match lines.next() {
                Some(WatchLine::Error(e)) => assert!(e.contains(why), "{name}: {e}"),
                other => panic!("{name}: {other:?}"),
            }
            assert_eq!(handle.join().unwrap(), 1);
        }
    }
}
