//! Signed approval links: `{base}/approve/{wait_id}?exp={ms}&sig={token}`.
//!
//! The token is an HMAC of the wait id and the expiry under a key that
//! never leaves the daemon's data directory, so a link cannot be guessed
//! from the wait id nor stretched past its expiry. Nothing per link is
//! stored: the wait's row says whether it is still pending.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

const KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("approval link key {path}: {source}")]
    KeyFile { path: PathBuf, source: std::io::Error },
    #[error("approval link key {path} is {len} bytes, expected {KEY_LEN}; remove it to make a new one (outstanding links stop working)")]
    KeyFileSize { path: PathBuf, len: u64 },
    #[error("approval link key {path} has mode {mode:o}, readable by others; chmod 600 it, or remove it to make a new one")]
    KeyFileMode { path: PathBuf, mode: u32 },
    #[error("approval link key {path} is not a regular file")]
    KeyFileType { path: PathBuf },
    #[error("this approval link has expired")]
    Expired,
    #[error("this approval link is not valid")]
    Forged,
}

/// The key approval links are signed with.
pub struct LinkKey([u8; KEY_LEN]);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.write_str("LinkKey(..)")
    }
}

impl LinkKey {
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> LinkKey {
        LinkKey(bytes)
    }

    /// The key as hex, to share with the other nodes through the store.
    pub(crate) fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key a cluster shares (see [`LinkKey::to_hex`]), written over the
    /// one at `path` (mode 0600) so that this home keeps using it.
    pub(crate) fn adopt_hex(path: &Path, hex: &str) -> Result<LinkKey, ApprovalError> {
        let bad = || ApprovalError::KeyFileSize { path: path.to_owned(), len: hex.len() as u64 / 2 };
        if hex.len() != 2 * KEY_LEN || !hex.is_ascii() {
            return Err(bad());
        }
        let mut key = [0u8; KEY_LEN];
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        crate::home::write_atomic(path, &key, 0o600).map_err(|e| ApprovalError::KeyFile { path: path.to_owned(), source: std::io::Error::other(e.to_string()) })?;
        Ok(LinkKey(key))
    }

    /// Reads the key at `path`, or makes one there (32 random bytes, mode
    /// 0600) if there is none. A key of the wrong size or one others can read
    /// is refused rather than fixed: either means something else touched it.
    pub fn load_or_create(path: &Path) -> Result<LinkKey, ApprovalError> {
        match File::open(path) {
            Ok(f) => Self::read(path, f),
            Err(e) if e.kind() == ErrorKind::NotFound => Self::create(path),
            Err(source) => Err(ApprovalError::KeyFile { path: path.to_owned(), source }),
        }
    }

    fn read(path: &Path, mut f: File) -> Result<LinkKey, ApprovalError> {
        let err = |source| ApprovalError::KeyFile { path: path.to_owned(), source };
        // Checked on the open file, so it is the one we read.
        let meta = f.metadata().map_err(err)?;
        if !meta.is_file() {
            return Err(ApprovalError::KeyFileType { path: path.to_owned() });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(ApprovalError::KeyFileMode { path: path.to_owned(), mode: meta.mode() & 0o7777 });
        }
        if meta.len() != KEY_LEN as u64 {
            return Err(ApprovalError::KeyFileSize { path: path.to_owned(), len: meta.len() });
        }
        let mut key = [0u8; KEY_LEN];
        f.read_exact(&mut key).map_err(err)?;
        Ok(LinkKey(key))
    }

    fn create(path: &Path) -> Result<LinkKey, ApprovalError> {
        let err = |source| ApprovalError::KeyFile { path: path.to_owned(), source };
        let mut key = [0u8; KEY_LEN];
        rand::rngs::OsRng.fill_bytes(&mut key);

        let name = path.file_name().ok_or_else(|| err(ErrorKind::InvalidInput.into()))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut tmp_name = name.to_owned();
        tmp_name.push(format!(".tmp{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        // A leftover from a crash between create and rename holds nothing
        // that was ever used.
        let _ = fs::remove_file(&tmp);
        let written = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&key)?;
            f.sync_all()?;
            fs::rename(&tmp, path)?;
            // The rename itself is durable only once the directory is synced.
            File::open(dir)?.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(err(e));
        }
        Ok(LinkKey(key))
    }

    /// The `sig` of a link: URL-safe base64 (no padding) of
    /// HMAC-SHA256(key, "approve\n{wait_id}\n{expires_ms}").
    pub fn token(&self, wait_id: &str, expires_ms: i64) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(wait_id, expires_ms))
    }

    /// Whether `token` was made by [`LinkKey::token`] for this wait and
    /// expiry, and the expiry has not passed. The signature is checked first,
    /// so `Expired` is only ever said of a genuine link.
    pub fn check(&self, wait_id: &str, expires_ms: i64, token: &str, now_ms: i64) -> Result<(), ApprovalError> {
        let expected = self.token(wait_id, expires_ms);
        if !bool::from(expected.as_bytes().ct_eq(token.as_bytes())) {
            return Err(ApprovalError::Forged);
        }
        if now_ms > expires_ms {
            return Err(ApprovalError::Expired);
        }
        Ok(())
    }

    /// HMAC-SHA256 of `text` under this key, for other tokens the daemon
    /// hands out; each starts `text` with a word of its own (never
    /// `approve`), so no token stands for another.
    pub(crate) fn mac_text(&self, text: &str) -> [u8; 32] {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        m.update(text.as_bytes());
        m.finalize().into_bytes().into()
    }

    fn mac(&self, wait_id: &str, expires_ms: i64) -> [u8; 32] {
        // HMAC takes keys of any length; this cannot fail.
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        // The expiry is the text after the last newline and has none itself,
        // so a wait id with a newline cannot pose as another (id, expiry).
        m.update(format!("approve\n{wait_id}\n{expires_ms}").as_bytes());
        m.finalize().into_bytes().into()
    }
}

/// The link to hand out: `{base_url}/approve/{wait_id}?exp={expires_ms}&sig={token}`.
pub fn link(base_url: &str, wait_id: &str, expires_ms: i64, token: &str) -> String {
    let base = base_url.trim_end_matches('/');
    format!("{base}/approve/{}?exp={expires_ms}&sig={}", encode_component(wait_id), encode_component(token))
}

/// Percent-encodes all but RFC 3986 unreserved characters. Wait ids and
/// tokens have none, so this changes nothing in practice; it keeps an odd id
/// from breaking the URL.
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const WAIT: &str = "wK3v9x0PqZa1";
    const EXP: i64 = 1_750_000_000_000;

    fn key() -> LinkKey {
        LinkKey::from_bytes([42u8; 32])
    }

    #[test]
    fn round_trip() {
        let k = key();
        let t = k.token(WAIT, EXP);
        assert_eq!(t.len(), 43, "32 bytes, unpadded base64");
        assert!(t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{t}");
        k.check(WAIT, EXP, &t, EXP - 1).unwrap();
        k.check(WAIT, EXP, &t, EXP).unwrap();
    }

    #[test]
    fn changed_fields_are_forged() {
        let k = key();
        let t = k.token(WAIT, EXP);
        assert!(matches!(k.check("wK3v9x0PqZa2", EXP, &t, 0), Err(ApprovalError::Forged)));
        assert!(matches!(k.check(WAIT, EXP + 1, &t, 0), Err(ApprovalError::Forged)));
        // Moving the expiry back into the past is still a forgery, not "expired".
        assert!(matches!(k.check(WAIT, EXP - 1, &t, EXP), Err(ApprovalError::Forged)));
        for i in 0..t.len() {
            let mut b = t.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let changed = String::from_utf8(b).unwrap();
            assert!(matches!(k.check(WAIT, EXP, &changed, 0), Err(ApprovalError::Forged)), "char {i}");
        }
        assert!(matches!(k.check(WAIT, EXP, &t[..42], 0), Err(ApprovalError::Forged)));
        assert!(matches!(k.check(WAIT, EXP, "", 0), Err(ApprovalError::Forged)));
        let other = LinkKey::from_bytes([7u8; 32]);
        assert!(matches!(other.check(WAIT, EXP, &t, 0), Err(ApprovalError::Forged)));
    }

    #[test]
    fn expired() {
        let k = key();
        let t = k.token(WAIT, EXP);
        assert!(matches!(k.check(WAIT, EXP, &t, EXP + 1), Err(ApprovalError::Expired)));
    }

    #[test]
    fn link_shape() {
        assert_eq!(
            link("http://127.0.0.1:7070/", WAIT, EXP, "abc-_"),
            format!("http://127.0.0.1:7070/approve/{WAIT}?exp={EXP}&sig=abc-_")
        );
        assert_eq!(link("https://x.example", "w a/b", 5, "t"), "https://x.example/approve/w%20a%2Fb?exp=5&sig=t");
    }

    #[test]
    fn key_file_private_and_stable() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("approval.key");
        let k1 = LinkKey::load_or_create(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 32);
        let k2 = LinkKey::load_or_create(&path).unwrap();
        assert_eq!(k1.token(WAIT, EXP), k2.token(WAIT, EXP));
        k2.check(WAIT, EXP, &k1.token(WAIT, EXP), 0).unwrap();
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1, "no temporary file left");
        // Two keys made apart differ.
        let k3 = LinkKey::load_or_create(&d.path().join("other.key")).unwrap();
        assert_ne!(k1.token(WAIT, EXP), k3.token(WAIT, EXP));
        assert_eq!(format!("{k1:?}"), "LinkKey(..)");
    }

    #[test]
    fn bad_key_file_refused() {
        let d = tempfile::tempdir().unwrap();
        let short = d.path().join("short.key");
        fs::write(&short, [1u8; 16]).unwrap();
        fs::set_permissions(&short, fs::Permissions::from_mode(0o600)).unwrap();
        let err = LinkKey::load_or_create(&short).unwrap_err();
        assert!(matches!(err, ApprovalError::KeyFileSize { len: 16, .. }), "{err}");
        assert_eq!(fs::read(&short).unwrap(), [1u8; 16], "left as it was");

        let open = d.path().join("open.key");
        fs::write(&open, [1u8; 32]).unwrap();
        for mode in [0o644, 0o640, 0o604] {
            fs::set_permissions(&open, fs::Permissions::from_mode(mode)).unwrap();
            let err = LinkKey::load_or_create(&open).unwrap_err();
            assert!(matches!(err, ApprovalError::KeyFileMode { .. }), "{mode:o}: {err}");
            assert!(err.to_string().contains(&format!("{mode:o}")), "{err}");
        }

        let dir = d.path().join("dir.key");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(LinkKey::load_or_create(&dir), Err(ApprovalError::KeyFileType { .. })));

        let nowhere = d.path().join("missing/dir/approval.key");
        assert!(matches!(LinkKey::load_or_create(&nowhere), Err(ApprovalError::KeyFile { .. })));
    }
}
