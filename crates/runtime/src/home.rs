//! The data directory, `$CAIRN_HOME`: the task database, the bearer token
//! (mode 0600), the `url` the daemon listens on, images, disks and the run
//! directories of live sandboxes. One daemon per home, enforced by a lock.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;

#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("cannot use data directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("another cairn daemon is already running on {home} (pid {pid}); stop it first or set CAIRN_HOME to another directory")]
    Locked { home: PathBuf, pid: String },
    #[error("{0}: {1}")]
    File(PathBuf, std::io::Error),
    #[error("refusing data directory {0}: it is a symbolic link; point CAIRN_HOME at the directory itself")]
    Symlink(PathBuf),
    #[error(
        "refusing data directory {path}: it is owned by uid {owner}, not by this user (uid {me})"
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("refusing data directory {0}: it is not a directory")]
    NotDir(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

/// Held for the daemon's lifetime; the kernel drops the lock if it dies.
#[derive(Debug)]
pub struct HomeLock {
    _file: File,
}

impl Home {
    pub fn new(root: PathBuf) -> Home {
        Home { root }
    }

    /// `$CAIRN_HOME`, else `/var/lib/cairn` for root, else
    /// `$XDG_DATA_HOME/cairn` (`~/.local/share/cairn`).
    pub fn default_root() -> PathBuf {
        if let Some(h) = std::env::var_os("CAIRN_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(h);
        }
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/lib/cairn");
        }
        if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|h| !h.is_empty()) {
            return PathBuf::from(x).join("cairn");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
        PathBuf::from(home).join(".local/share/cairn")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("cairn.db")
    }
    pub fn token_path(&self) -> PathBuf {
        self.root.join("token")
    }
    pub fn url_path(&self) -> PathBuf {
        self.root.join("url")
    }
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }
    /// The blob store: packs, index files and manifests of every snapshot
    /// (unless the daemon keeps them elsewhere, `--blob`).
    pub fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }
    /// The local cache of a remote blob store's packs.
    pub fn blob_cache(&self) -> PathBuf {
        self.root.join("blob-cache")
    }

    fn ensure(&self) -> Result<(), HomeError> {
        self.check_owner()?;
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.root).map_err(|e| HomeError::Dir(self.root.clone(), e))
    }

    /// Refuses a home that is a symbolic link (whoever controls the link
    /// chooses where the daemon writes) or another user's.
    fn check_owner(&self) -> Result<(), HomeError> {
        let meta = match fs::symlink_metadata(&self.root) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(HomeError::Dir(self.root.clone(), e)),
        };
        let me = nix::unistd::geteuid().as_raw();
        if meta.file_type().is_symlink() {
            Err(HomeError::Symlink(self.root.clone()))
        } else if !meta.is_dir() {
            Err(HomeError::NotDir(self.root.clone()))
        } else if meta.uid() != me {
            Err(HomeError::Owner {
                path: self.root.clone(),
                owner: meta.uid(),
                me,
            })
        } else {
            Ok(())
        }
    }

    /// Makes the home private whatever existed before: the directory and
    /// every directory at its top 0700, every file there 0600 (the database
    /// holds webhook secrets, `keys/` the signing keys, `layers/` and
    /// `images/` what tasks made). Symbolic links are left alone, never
    /// followed. Run at every start, and again once the store has created
    /// its files.
    pub fn make_private(&self) -> Result<(), HomeError> {
        self.check_owner()?;
        chmod_nofollow(&self.root, 0o700)?;
        for dir in [self.root.clone(), self.root.join("keys")] {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(HomeError::Dir(dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| HomeError::Dir(dir.clone(), e))?;
                let kind = entry
                    .file_type()
                    .map_err(|e| HomeError::File(entry.path(), e))?;
                if kind.is_dir() {
                    chmod_nofollow(&entry.path(), 0o700)?;
                } else if kind.is_file() {
                    chmod_nofollow(&entry.path(), 0o600)?;
                }
            }
        }
        Ok(())
    }

    /// Takes the daemon lock, or names the daemon that holds it.
    pub fn lock(&self) -> Result<HomeLock, HomeError> {
        self.ensure()?;
        self.make_private()?;
        let path = self.root.join("daemon.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| HomeError::File(path.clone(), e))?;
        // SAFETY: flock on a descriptor we own; no pointers.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            return Err(HomeError::Locked { home: self.root.clone(), pid: pid.trim().to_owned() });
        }
        file.set_len(0).map_err(|e| HomeError::File(path.clone(), e))?;
        write!(file, "{}", std::process::id()).map_err(|e| HomeError::File(path.clone(), e))?;
        Ok(HomeLock { _file: file })
    }

    /// The bearer token, created (random, mode 0600) at first start.
    pub fn token(&self) -> Result<String, HomeError> {
        self.ensure()?;
        let path = self.token_path();
        if let Ok(t) = fs::read_to_string(&path) {
            if !t.trim().is_empty() {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(|e| HomeError::File(path.clone(), e))?;
                return Ok(t.trim().to_owned());
            }
        }
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        write_atomic(&path, token.as_bytes(), 0o600)?;
        Ok(token)
    }

    pub fn write_url(&self, url: &str) -> Result<(), HomeError> {
        write_atomic(&self.url_path(), format!("{url}\n").as_bytes(), 0o600)
    }
}

/// chmod through a descriptor opened without following a final symlink, so
/// an entry swapped for a link meanwhile is never what gets the mode.
fn chmod_nofollow(path: &Path, mode: u32) -> Result<(), HomeError> {
    let err = |e| HomeError::File(path.to_owned(), e);
    // O_PATH: closing any other descriptor of a file drops every POSIX lock
    // this process holds on it, and the store's SQLite holds such locks on
    // `cairn.db` (another process would then take the database as unused
    // and checkpoint it away). An O_PATH descriptor releases none.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    // An entry swapped for a link since it was listed is opened as the
    // link itself: left alone, as links are.
    if f.metadata().map_err(err)?.file_type().is_symlink() {
        return Ok(());
    }
    // fchmod refuses O_PATH descriptors; its /proc link names the very
    // file opened, not the path again.
    fs::set_permissions(format!("/proc/self/fd/{}", f.as_raw_fd()), fs::Permissions::from_mode(mode)).map_err(err)
}

/// Write to a temporary file, fsync, rename: readers see old or new, whole.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), HomeError> {
    let tmp = path.with_extension("tmp");
    let err = |e| HomeError::File(path.to_owned(), e);
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp).map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_private_and_stable() {
        let d = tempfile::tempdir().unwrap();
        let h = Home::new(d.path().join("home"));
        let t1 = h.token().unwrap();
        assert_eq!(t1.len(), 64);
        assert_eq!(fs::metadata(h.token_path()).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(h.token().unwrap(), t1, "kept across starts");
    }

    #[test]
    fn a_home_that_existed_open_is_made_private_at_start() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("home");
        for dir in [root.clone(), root.join("layers"), root.join("keys")] {
            fs::create_dir(&dir).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for f in ["cairn.db", "cairn.db-wal", "keys/node.key"] {
            fs::write(root.join(f), "x").unwrap();
            fs::set_permissions(root.join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        // A link at the top is neither followed nor changed.
        let outside = d.path().join("outside");
        fs::write(&outside, "x").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let h = Home::new(root.clone());
        let _lock = h.lock().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("layers")), 0o700);
        assert_eq!(mode(&root.join("cairn.db")), 0o600);
        assert_eq!(mode(&root.join("cairn.db-wal")), 0o600);
        assert_eq!(mode(&root.join("keys/node.key")), 0o600);
        assert_eq!(mode(&outside), 0o644, "a link's target is not touched");
    }

    #[test]
    fn making_the_home_private_keeps_the_stores_locks() {
        let d = tempfile::tempdir().unwrap();
        let h = Home::new(d.path().join("home"));
        h.ensure().unwrap();
        let db = h.db();
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&db).unwrap();
        // A POSIX lock as SQLite takes it, held by this process.
        let lock = libc::flock { l_type: libc::F_WRLCK as i16, l_whence: libc::SEEK_SET as i16, l_start: 0, l_len: 0, l_pid: 0 };
        // SAFETY: fcntl on a descriptor we own with a valid flock struct.
        assert_eq!(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) }, 0);
        let locked_for_others = || {
            let probe = "import fcntl, sys\nf = open(sys.argv[1], 'r+')\ntry:\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\nexcept OSError:\n    print('locked')";
            let out = std::process::Command::new("python3").args(["-c", probe]).arg(&db).output().expect("python3");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        assert_eq!(locked_for_others(), "locked", "control: the lock is seen by another process");
        h.make_private().unwrap();
        assert_eq!(fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(locked_for_others(), "locked", "making the home private dropped this process's lock");
    }

    #[test]
    fn a_home_that_is_a_link_or_another_users_is_refused_in_one_line() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = Home::new(link.clone()).lock().unwrap_err().to_string();
        assert!(
            err.contains("symbolic link")
                && err.contains(link.to_str().unwrap())
                && !err.contains('\n'),
            "{err}"
        );
        assert!(
            fs::read_dir(&real).unwrap().next().is_none(),
            "nothing written through the link"
        );
        // Positive control: the directory itself is taken.
        Home::new(real.clone()).lock().unwrap();

        assert!(
            nix::unistd::geteuid().is_root(),
            "this test changes a directory's owner: run it as root"
        );
        let theirs = d.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = Home::new(theirs.clone()).lock().unwrap_err().to_string();
        assert!(
            err.contains("owned by uid 65534") && !err.contains('\n'),
            "{err}"
        );
        assert!(
            fs::read_dir(&theirs).unwrap().next().is_none(),
            "nothing written in another user's directory"
        );
    }

    #[test]
    fn one_daemon_per_home() {
        let d = tempfile::tempdir().unwrap();
        let h = Home::new(d.path().to_owned());
        let lock = h.lock().unwrap();
        let err = h.lock().unwrap_err().to_string();
        assert!(err.contains("already running") && err.contains(&std::process::id().to_string()), "{err}");
        drop(lock);
        // Another test of this binary may be between a fork and its exec,
        // its child holding a copy of the lock's descriptor for that
        // moment: the lock is free once that copy is gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while let Err(e) = h.lock() {
            assert!(std::time::Instant::now() < deadline, "the lock stays held after its drop: {e}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
