//! The data directory, `$CAIRN_HOME`: the task database, the bearer token
//! (mode 0600), the `url` the daemon listens on, images, disks and the run
//! directories of live sandboxes. One daemon per home, enforced by a lock.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.root).map_err(|e| HomeError::Dir(self.root.clone(), e))
    }

    /// Takes the daemon lock, or names the daemon that holds it.
    pub fn lock(&self) -> Result<HomeLock, HomeError> {
        self.ensure()?;
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
        write_atomic(&self.url_path(), format!("{url}\n").as_bytes(), 0o644)
    }
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
    fn one_daemon_per_home() {
        let d = tempfile::tempdir().unwrap();
        let h = Home::new(d.path().to_owned());
        let lock = h.lock().unwrap();
        let err = h.lock().unwrap_err().to_string();
        assert!(err.contains("already running") && err.contains(&std::process::id().to_string()), "{err}");
        drop(lock);
        h.lock().unwrap();
    }
}
