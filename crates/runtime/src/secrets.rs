//! Secrets for the egress proxy to inject into a task's requests, so that
//! a credential never enters the sandbox. A value is sealed here
//! (XChaCha20-Poly1305, its name bound in as associated data) under the
//! secrets key and only the sealed form reaches the store; it is never
//! logged, never answered, and never part of a task's config, events,
//! snapshots or records (their names and use counts may be).
//!
//! The secrets key is 32 random bytes in the daemon's home
//! (`secrets.key`, 0600 in the 0700 home). On a cluster every node needs
//! the same key: the first node stores its own in the shared store, sealed
//! under the key every node holds (`[secrets] cluster_key_file`, the same
//! file on each node), and the others take it from there.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use zeroize::Zeroizing;

pub use cairn_api::secrets::SecretView;

use crate::runtime::Runtime;
use crate::Error;

/// The largest value a secret may hold.
pub const MAX_SECRET: usize = 64 << 10;
const NONCE: usize = 24;

/// A 256-bit key that seals and opens values.
pub(crate) struct SealKey(XChaCha20Poly1305);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    fn from_bytes(bytes: &[u8]) -> Option<SealKey> {
        XChaCha20Poly1305::new_from_slice(bytes).ok().map(SealKey)
    }

    /// base64 of a fresh nonce and the ciphertext of `value`, bound to `name`.
    pub(crate) fn seal(&self, name: &str, value: &[u8]) -> String {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        // Sealing in memory fails only past the cipher's size bound, which
        // MAX_SECRET is far below.
        let sealed = self.0.encrypt(&nonce, Payload { msg: value, aad: name.as_bytes() }).unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        B64.encode(out)
    }

    pub(crate) fn open(&self, name: &str, sealed: &str) -> Option<Zeroizing<Vec<u8>>> {
        let raw = B64.decode(sealed).ok()?;
        if raw.len() < NONCE {
            return None;
        }
        let (nonce, ciphertext) = raw.split_at(NONCE);
        self.0.decrypt(XNonce::from_slice(nonce), Payload { msg: ciphertext, aad: name.as_bytes() }).ok().map(Zeroizing::new)
    }
}

/// Reads a 32-byte key written as 64 hex digits, or makes one there
/// (0600) when the file does not exist.
fn load_or_create(path: &Path) -> Result<Zeroizing<Vec<u8>>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => match hex::decode(text.trim()) {
            Ok(bytes) if bytes.len() == 32 => Ok(Zeroizing::new(bytes)),
            _ => Err(format!("{}: not a secrets key (64 hex digits)", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Zeroizing::new(XChaCha20Poly1305::generate_key(&mut OsRng).to_vec());
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
            f.write_all(hex::encode(&*key).as_bytes()).and_then(|()| f.sync_all()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// The secrets key of this daemon, or why it has none.
pub(crate) type Secrets = Result<SealKey, String>;

/// Resolves the secrets key at start: the home's own on one node; on a
/// cluster, the one the store shares, opened with the cluster key.
pub(crate) async fn open(home: &Path, store: &dyn cairn_store::Store, cluster_key_file: Option<&Path>) -> Result<Secrets, String> {
    let own = load_or_create(&home.join("secrets.key"))?;
    if !store.shared() {
        return Ok(SealKey::from_bytes(&own).ok_or("the secrets key is not 32 bytes".to_owned()));
    }
    let Some(file) = cluster_key_file else {
        return Ok(Err("secrets on a cluster need [secrets] cluster_key_file, the same key file on every node (docs/security.md)".into()));
    };
    let wrap = match std::fs::read_to_string(file) {
        Ok(text) => hex::decode(text.trim()).ok().and_then(|b| SealKey::from_bytes(&b)).ok_or_else(|| format!("{}: not a cluster key (64 hex digits)", file.display()))?,
        Err(e) => return Err(format!("[secrets] cluster_key_file {}: {e}", file.display())),
    };
    let proposed = wrap.seal("cluster secrets key", &own);
    let shared = store.cluster_secret("secrets-key", &proposed).await.map_err(|e| e.to_string())?;
    let key = wrap
        .open("cluster secrets key", &shared)
        .ok_or_else(|| format!("{} does not open the cluster's secrets key: every node must hold the same cluster key file", file.display()))?;
    Ok(SealKey::from_bytes(&key).ok_or("the cluster's secrets key is not 32 bytes".to_owned()))
}

/// Names are what rules and placeholders use: a letter or `_` first, then
/// letters, digits and `_`, as an environment variable's.
pub fn check_secret_name(name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && name.len() <= 64 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid secret name {name:?}: 1 to 64 letters, digits or '_', not starting with a digit")))
    }
}

impl Runtime {
    pub(crate) fn seal_key(&self) -> Result<&SealKey, Error> {
        self.secrets.as_ref().map_err(|why| Error::Unavailable(why.clone()))
    }

    /// Sets secret `name` to `value` (a new secret or a new value).
    pub async fn set_secret(&self, name: &str, value: &[u8]) -> Result<SecretView, Error> {
        check_secret_name(name)?;
        if value.is_empty() {
            return Err(Error::invalid(format!("secret {name}: the value is empty")));
        }
        if value.len() > MAX_SECRET {
            return Err(Error::TooLarge(format!("secret {name}: the value is {} bytes; at most {MAX_SECRET}", value.len())));
        }
        let sealed = self.seal_key()?.seal(name, value);
        self.store.put_secret(name, &sealed, cairn_store::now_ms()).await?;
        self.secret(name).await
    }

    /// Secret `name`, as listed.
    pub async fn secret(&self, name: &str) -> Result<SecretView, Error> {
        let row = self.store.secret(name).await?.ok_or_else(|| Error::not_found(format!("no secret named {name:?}")))?;
        Ok(view(row))
    }

    /// Every secret, by name: never a value. (The store also keeps the
    /// tasks' CAs sealed this way, under names no secret can have.)
    pub async fn secrets(&self) -> Result<Vec<SecretView>, Error> {
        Ok(self.store.secrets().await?.into_iter().filter(|r| check_secret_name(&r.name).is_ok()).map(view).collect())
    }

    /// Seals `value` under `name` and keeps it (a secret, or a task's CA).
    pub(crate) async fn put_sealed(&self, name: &str, value: &[u8]) -> Result<(), Error> {
        let sealed = self.seal_key()?.seal(name, value);
        self.store.put_secret(name, &sealed, cairn_store::now_ms()).await?;
        Ok(())
    }

    /// The value kept under `name`, opened; `None` if there is none.
    pub(crate) async fn open_sealed(&self, name: &str) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
        let Some(row) = self.store.secret(name).await? else { return Ok(None) };
        let key = self.seal_key()?;
        key.open(name, &row.sealed).map(Some).ok_or_else(|| Error::internal(format!("{name} does not open with this daemon's secrets key")))
    }

    /// The value of secret `name`, for the egress proxy (its uses are
    /// counted per request, from the decision log).
    pub(crate) async fn secret_value(&self, name: &str) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.open_sealed(name).await?.ok_or_else(|| Error::not_found(format!("no secret named {name:?}")))
    }

    pub async fn remove_secret(&self, name: &str) -> Result<(), Error> {
        check_secret_name(name)?;
        if self.store.remove_secret(name).await? {
            Ok(())
        } else {
            Err(Error::not_found(format!("no secret named {name:?}")))
        }
    }

}

fn view(r: cairn_store::SecretRow) -> SecretView {
    SecretView { name: r.name, created_ms: r.created_ms, updated_ms: r.updated_ms, last_used_ms: r.last_used_ms, uses: r.uses }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_open_only_under_their_key_and_name() {
        let key = SealKey::from_bytes(&[7u8; 32]).unwrap();
        let sealed = key.seal("TOKEN", b"s3cr3t");
        assert!(!sealed.contains("s3cr3t") && B64.decode(&sealed).unwrap().windows(6).all(|w| w != b"s3cr3t"));
        assert_eq!(key.open("TOKEN", &sealed).unwrap().as_slice(), b"s3cr3t");
        assert_ne!(key.seal("TOKEN", b"s3cr3t"), sealed, "a fresh nonce each time");
        assert!(key.open("OTHER", &sealed).is_none(), "bound to its name");
        assert!(SealKey::from_bytes(&[8u8; 32]).unwrap().open("TOKEN", &sealed).is_none(), "another key opens nothing");
        let mut bad = B64.decode(&sealed).unwrap();
        *bad.last_mut().unwrap() ^= 1;
        assert!(key.open("TOKEN", &B64.encode(bad)).is_none(), "tampered");
        assert!(key.open("TOKEN", "AAAA").is_none() && key.open("TOKEN", "not base64!").is_none());
    }

    #[test]
    fn the_home_key_is_made_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let made = load_or_create(&path).unwrap();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions()) & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), made);
        std::fs::write(&path, "short").unwrap();
        assert!(load_or_create(&path).unwrap_err().contains("not a secrets key"));
    }

    #[test]
    fn names_are_like_environment_variables() {
        for ok in ["GITHUB_TOKEN", "_x", "a1"] {
            assert!(check_secret_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "$A", &"A".repeat(65)] {
            assert!(check_secret_name(bad).is_err(), "{bad:?}");
        }
    }
}
