//! The node's ed25519 signing keys, in a directory (the daemon's is
//! `$CAIRN_HOME/keys/`, mode 0700):
//!
//! - `signing.key` (mode 0600): the current secret key, the 32-byte seed
//!   as 64 hex characters;
//! - `<key_id>.pub`: one per key ever used, JSON
//!   `{"key_id", "public_key", "created_ms"}`, kept after rotation so that
//!   what an old key signed still verifies.
//!
//! A key id is the first 16 bytes of the SHA-256 of the raw 32-byte public
//! key, in hex. A public key is written as its 64 hex characters: the form
//! of `keyval.public` in a securesystemslib `ed25519` key.
//!
//! Rotation writes the new public key first, then replaces `signing.key`
//! (write, fsync, rename): a crash leaves the old key or the new one, and
//! the old secret is gone once the rename is done.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{Error, Result};

const SECRET_FILE: &str = "signing.key";

/// A public key the node signs or signed with: `GET /v1/keys` lists them,
/// current first; `POST /v1/keys/rotate` answers the new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct KeyInfo {
    pub key_id: String,
    /// The raw ed25519 public key, 64 hex characters.
    pub public_key: String,
    pub created_ms: i64,
    /// The key new signatures are made with.
    #[serde(default)]
    pub current: bool,
}

/// The id of a public key: the first 16 bytes of SHA-256 over its 32 raw
/// bytes, hex.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..16])
}

/// The node's keys: the current signing key and every public key used.
pub struct NodeKeys {
    dir: PathBuf,
    signing: SigningKey,
    /// Newest first; the current key among them.
    known: Vec<KeyInfo>,
}

impl std::fmt::Debug for NodeKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKeys").field("dir", &self.dir).field("current", &self.current().key_id).field("known", &self.known.len()).finish()
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn new_signing_key() -> SigningKey {
    SigningKey::generate(&mut rand::rngs::OsRng)
}

impl NodeKeys {
    /// Loads the keys in `dir`, creating the directory (0700) and a first
    /// key at first use.
    pub fn load_or_create(dir: &Path) -> Result<NodeKeys> {
        let dir_err = |source| Error::KeyDir { path: dir.to_owned(), source };
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(dir_err)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
        let secret_path = dir.join(SECRET_FILE);
        let signing = match fs::read_to_string(&secret_path) {
            Ok(text) => {
                fs::set_permissions(&secret_path, fs::Permissions::from_mode(0o600))
                    .map_err(|source| Error::KeyFile { path: secret_path.clone(), source })?;
                parse_secret(&secret_path, &text)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = new_signing_key();
                write_public(dir, &info_of(&key.verifying_key(), now_ms()))?;
                write_atomic(&secret_path, format!("{}\n", hex::encode(key.to_bytes())).as_bytes(), 0o600)?;
                key
            }
            Err(source) => return Err(Error::KeyFile { path: secret_path, source }),
        };
        let mut known = read_publics(dir)?;
        let current_id = key_id(&signing.verifying_key());
        if !known.iter().any(|k| k.key_id == current_id) {
            // The public half went missing: write it again.
            let info = info_of(&signing.verifying_key(), now_ms());
            write_public(dir, &info)?;
            known.push(info);
        }
        let mut keys = NodeKeys { dir: dir.to_owned(), signing, known };
        keys.order();
        Ok(keys)
    }

    /// Newest first, exactly one current.
    fn order(&mut self) {
        let current = key_id(&self.signing.verifying_key());
        for k in &mut self.known {
            k.current = k.key_id == current;
        }
        self.known.sort_by(|a, b| b.current.cmp(&a.current).then(b.created_ms.cmp(&a.created_ms)).then(a.key_id.cmp(&b.key_id)));
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key new signatures are made with.
    pub fn current(&self) -> KeyInfo {
        let id = key_id(&self.signing.verifying_key());
        self.known.iter().find(|k| k.key_id == id).cloned().unwrap_or_else(|| KeyInfo { current: true, ..info_of(&self.signing.verifying_key(), 0) })
    }

    /// Every key ever used, the current one first, then newest first.
    pub fn all(&self) -> Vec<KeyInfo> {
        self.known.clone()
    }

    /// Replaces the signing key with a new one. The old public key stays
    /// known; its secret is gone.
    pub fn rotate(&mut self) -> Result<KeyInfo> {
        let key = new_signing_key();
        let newest = self.known.iter().map(|k| k.created_ms).max().unwrap_or(0);
        let info = info_of(&key.verifying_key(), now_ms().max(newest + 1));
        write_public(&self.dir, &info)?;
        write_atomic(&self.dir.join(SECRET_FILE), format!("{}\n", hex::encode(key.to_bytes())).as_bytes(), 0o600)?;
        self.signing = key;
        self.known.push(info);
        self.order();
        Ok(self.current())
    }

    /// Signs `msg` with the current key: its id and the 64-byte signature.
    pub fn sign(&self, msg: &[u8]) -> (String, [u8; 64]) {
        (key_id(&self.signing.verifying_key()), self.signing.sign(msg).to_bytes())
    }

    /// A known public key by id (current or retired).
    pub fn verifying_key(&self, key_id: &str) -> Option<VerifyingKey> {
        self.known.iter().find(|k| k.key_id == key_id).and_then(|k| decode_public(&k.public_key).ok())
    }

    /// Every known public key with its id, to verify against.
    pub fn verifying_keys(&self) -> Vec<(String, VerifyingKey)> {
        self.known.iter().filter_map(|k| decode_public(&k.public_key).ok().map(|v| (k.key_id.clone(), v))).collect()
    }
}

fn info_of(key: &VerifyingKey, created_ms: i64) -> KeyInfo {
    KeyInfo { key_id: key_id(key), public_key: hex::encode(key.as_bytes()), created_ms, current: false }
}

fn parse_secret(path: &Path, text: &str) -> Result<SigningKey> {
    let bad = |why: &str| Error::MalformedKey { path: path.to_owned(), why: why.to_owned() };
    let bytes = hex::decode(text.trim()).map_err(|_| bad("not hex"))?;
    let seed: [u8; 32] = bytes.try_into().map_err(|_| bad("want 32 bytes (64 hex characters)"))?;
    Ok(SigningKey::from_bytes(&seed))
}

fn decode_public(hex_text: &str) -> Result<VerifyingKey> {
    let bad = |why: String| Error::PublicKey { why };
    let bytes = hex::decode(hex_text.trim()).map_err(|_| bad(format!("{:?} is not hex", short(hex_text))))?;
    let raw: [u8; 32] = bytes.try_into().map_err(|_| bad(format!("{:?} is not 32 bytes", short(hex_text))))?;
    VerifyingKey::from_bytes(&raw).map_err(|_| bad(format!("{:?} is not an ed25519 point", short(hex_text))))
}

fn short(s: &str) -> String {
    s.chars().take(70).collect()
}

fn read_publics(dir: &Path) -> Result<Vec<KeyInfo>> {
    let mut out = Vec::new();
    let entries = fs::read_dir(dir).map_err(|source| Error::KeyDir { path: dir.to_owned(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::KeyDir { path: dir.to_owned(), source })?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("pub") {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|source| Error::KeyFile { path: path.clone(), source })?;
        let bad = |why: String| Error::MalformedKey { path: path.clone(), why };
        let info: KeyInfo = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let key = decode_public(&info.public_key).map_err(|e| bad(e.to_string()))?;
        if key_id(&key) != info.key_id {
            return Err(bad(format!("key id {} is not the id of its public key ({})", info.key_id, key_id(&key))));
        }
        out.push(KeyInfo { current: false, ..info });
    }
    Ok(out)
}

fn write_public(dir: &Path, info: &KeyInfo) -> Result<()> {
    let record = serde_json::json!({ "key_id": info.key_id, "public_key": info.public_key, "created_ms": info.created_ms });
    write_atomic(&dir.join(format!("{}.pub", info.key_id)), format!("{record}\n").as_bytes(), 0o644)
}

/// Write to a temporary file, fsync, rename, fsync the directory.
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let err = |source| Error::KeyFile { path: path.to_owned(), source };
    let tmp = path.with_extension("tmp");
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp).map_err(err)?;
    f.write_all(data).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(err)?;
    if let Some(parent) = path.parent() {
        fs::File::open(parent).and_then(|d| d.sync_all()).map_err(err)?;
    }
    Ok(())
}

/// Public keys from what a person pastes: the 64 hex characters of one key,
/// or the JSON `cairn --json key show` prints (a list of keys; one object
/// with `public_key` too, and securesystemslib's `{"keyval": {"public"}}`).
/// Each comes with its key id, computed from the key (a given `key_id` or
/// `keyid` must match it).
pub fn parse_public_key(text: &str) -> Result<Vec<(String, VerifyingKey)>> {
    let text = text.trim();
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        let key = decode_public(text)?;
        return Ok(vec![(key_id(&key), key)]);
    }
    let v: Value = serde_json::from_str(text).map_err(|e| Error::PublicKey { why: format!("neither hex nor JSON ({e})") })?;
    let items = match &v {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    };
    if items.is_empty() {
        return Err(Error::PublicKey { why: "an empty list".into() });
    }
    items.into_iter().map(key_from_json).collect()
}

fn key_from_json(v: &Value) -> Result<(String, VerifyingKey)> {
    let public = v
        .get("public_key")
        .or_else(|| v.get("keyval").and_then(|k| k.get("public")))
        .and_then(Value::as_str)
        .ok_or_else(|| Error::PublicKey { why: "a JSON key needs \"public_key\" (or \"keyval\": {\"public\"})".into() })?;
    let key = decode_public(public)?;
    let id = key_id(&key);
    if let Some(given) = v.get("key_id").or_else(|| v.get("keyid")).and_then(Value::as_str) {
        if given != id {
            return Err(Error::PublicKey { why: format!("key id {given} is not the id of public key {public} ({id})") });
        }
    }
    Ok((id, key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ed25519_dalek::Verifier;

    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn first_use_creates_a_private_key_that_stays() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("keys");
        let keys = NodeKeys::load_or_create(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("signing.key")), 0o600);
        let cur = keys.current();
        assert!(cur.current && cur.public_key.len() == 64 && cur.key_id.len() == 32, "{cur:?}");
        assert!(dir.join(format!("{}.pub", cur.key_id)).exists());
        let again = NodeKeys::load_or_create(&dir).unwrap();
        assert_eq!(again.current(), cur, "kept across starts");
        assert_eq!(again.all(), vec![cur]);
        // A loosened mode is tightened again.
        fs::set_permissions(dir.join("signing.key"), fs::Permissions::from_mode(0o644)).unwrap();
        NodeKeys::load_or_create(&dir).unwrap();
        assert_eq!(mode(&dir.join("signing.key")), 0o600);
        assert!(!format!("{again:?}").contains(&hex::encode(again.signing.to_bytes())), "Debug shows no secret");
    }

    #[test]
    fn rotation_keeps_old_public_keys_and_signs_with_the_new_one() {
        let d = tempfile::tempdir().unwrap();
        let mut keys = NodeKeys::load_or_create(d.path()).unwrap();
        let old = keys.current();
        let (id1, sig1) = keys.sign(b"before");
        assert_eq!(id1, old.key_id);
        let new = keys.rotate().unwrap();
        assert_ne!(new.key_id, old.key_id);
        let (id2, sig2) = keys.sign(b"after");
        assert_eq!(id2, new.key_id, "new signatures use the new key");
        let reopened = NodeKeys::load_or_create(d.path()).unwrap();
        let all = reopened.all();
        assert_eq!(all.iter().map(|k| (k.key_id.as_str(), k.current)).collect::<Vec<_>>(), [(new.key_id.as_str(), true), (old.key_id.as_str(), false)]);
        let old_key = reopened.verifying_key(&old.key_id).unwrap();
        old_key.verify(b"before", &ed25519_dalek::Signature::from_bytes(&sig1)).expect("the old signature still verifies");
        reopened.verifying_key(&new.key_id).unwrap().verify(b"after", &ed25519_dalek::Signature::from_bytes(&sig2)).unwrap();
        assert!(old_key.verify(b"after", &ed25519_dalek::Signature::from_bytes(&sig2)).is_err());
        assert_eq!(reopened.verifying_keys().len(), 2);
    }

    #[test]
    fn a_damaged_key_file_is_named() {
        let d = tempfile::tempdir().unwrap();
        NodeKeys::load_or_create(d.path()).unwrap();
        fs::write(d.path().join("signing.key"), "zz\n").unwrap();
        let err = NodeKeys::load_or_create(d.path()).unwrap_err().to_string();
        assert!(err.contains("signing.key is malformed: not hex"), "{err}");
        let d = tempfile::tempdir().unwrap();
        let keys = NodeKeys::load_or_create(d.path()).unwrap();
        let other = new_signing_key().verifying_key();
        let lie = serde_json::json!({"key_id": keys.current().key_id, "public_key": hex::encode(other.as_bytes()), "created_ms": 1});
        fs::write(d.path().join(format!("{}.pub", keys.current().key_id)), lie.to_string()).unwrap();
        let err = NodeKeys::load_or_create(d.path()).unwrap_err().to_string();
        assert!(err.contains("is not the id of its public key"), "{err}");
    }

    #[test]
    fn public_keys_parse_from_hex_and_from_key_show_json() {
        let d = tempfile::tempdir().unwrap();
        let mut keys = NodeKeys::load_or_create(d.path()).unwrap();
        keys.rotate().unwrap();
        let cur = keys.current();
        let one = parse_public_key(&format!("  {}\n", cur.public_key)).unwrap();
        assert_eq!(one[0].0, cur.key_id);
        let list = parse_public_key(&serde_json::to_string_pretty(&keys.all()).unwrap()).unwrap();
        assert_eq!(list.iter().map(|k| k.0.clone()).collect::<Vec<_>>(), keys.all().iter().map(|k| k.key_id.clone()).collect::<Vec<_>>());
        let obj = parse_public_key(&serde_json::to_string(&cur).unwrap()).unwrap();
        assert_eq!(obj[0].1, keys.verifying_key(&cur.key_id).unwrap());
        let sslib = serde_json::json!({"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": cur.public_key}});
        assert_eq!(parse_public_key(&sslib.to_string()).unwrap()[0].0, cur.key_id);
        let pub_file = fs::read_to_string(d.path().join(format!("{}.pub", cur.key_id))).unwrap();
        assert_eq!(parse_public_key(&pub_file).unwrap()[0].0, cur.key_id, "a .pub file is accepted as it is");
        for bad in ["", "abc", "[]", "{\"public_key\": \"00\"}", &"g".repeat(64)] {
            assert!(matches!(parse_public_key(bad), Err(Error::PublicKey { .. })), "{bad:?}");
        }
        let wrong_id = serde_json::json!({"key_id": "00", "public_key": cur.public_key});
        assert!(parse_public_key(&wrong_id.to_string()).unwrap_err().to_string().contains("is not the id of public key"));
    }

    #[test]
    fn debug_names_the_current_key_and_a_new_key_is_dated_now() {
        let d = tempfile::tempdir().unwrap();
        let before = now_ms();
        let keys = NodeKeys::load_or_create(d.path()).unwrap();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        let cur = keys.current();
        assert!(before > 1_600_000_000_000 && (before..=after).contains(&cur.created_ms), "{before} <= {} <= {after}", cur.created_ms);
        let debug = format!("{keys:?}");
        assert!(debug.starts_with("NodeKeys {") && debug.contains(&cur.key_id) && debug.contains("known: 1"), "{debug}");
    }

    #[test]
    fn an_unreadable_secret_is_refused_and_left_alone() {
        let d = tempfile::tempdir().unwrap();
        let first = NodeKeys::load_or_create(d.path()).unwrap().current();
        let garbage = [0xffu8, 0xfe, b'\n'];
        fs::write(d.path().join("signing.key"), garbage).unwrap();
        match NodeKeys::load_or_create(d.path()) {
            Err(Error::KeyFile { path, source }) => {
                assert_eq!((path, source.kind()), (d.path().join("signing.key"), std::io::ErrorKind::InvalidData));
            }
            other => panic!("a secret that is not text must not be replaced: {other:?}"),
        }
        assert_eq!(fs::read(d.path().join("signing.key")).unwrap(), garbage, "not overwritten");
        let pubs: Vec<_> = fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().ends_with(".pub")).collect();
        assert_eq!(pubs, [std::ffi::OsString::from(format!("{}.pub", first.key_id))], "no new key was made");
    }

    #[test]
    fn a_rotated_key_is_newer_than_every_known_key_even_when_the_clock_is_behind() {
        let d = tempfile::tempdir().unwrap();
        let first = NodeKeys::load_or_create(d.path()).unwrap().current();
        // The first key dated an hour ahead, as after the clock stepped back.
        let ahead = now_ms() + 3_600_000;
        let record = serde_json::json!({"key_id": first.key_id, "public_key": first.public_key, "created_ms": ahead});
        fs::write(d.path().join(format!("{}.pub", first.key_id)), record.to_string()).unwrap();
        let mut keys = NodeKeys::load_or_create(d.path()).unwrap();
        assert_eq!(keys.current().created_ms, ahead);
        let new = keys.rotate().unwrap();
        assert_eq!(new.created_ms, ahead + 1);
        let reopened = NodeKeys::load_or_create(d.path()).unwrap();
        let order: Vec<_> = reopened.all().into_iter().map(|k| (k.key_id, k.current, k.created_ms)).collect();
        assert_eq!(order, [(new.key_id, true, ahead + 1), (first.key_id, false, ahead)]);
    }

    #[test]
    fn a_bad_public_key_is_quoted_in_the_refusal() {
        let why = |text: &str| match parse_public_key(text) {
            Err(Error::PublicKey { why }) => why,
            other => panic!("{text:?}: {other:?}"),
        };
        assert_eq!(why(r#"{"public_key": "zz"}"#), "\"zz\" is not hex");
        assert_eq!(why(r#"{"public_key": "00ff"}"#), "\"00ff\" is not 32 bytes");
        let long = "q".repeat(100);
        assert_eq!(why(&format!(r#"{{"public_key": "{long}"}}"#)), format!("{:?} is not hex", "q".repeat(70)));
        // 64 characters that are not all hex are read as JSON, not as a key.
        assert!(why(&"g".repeat(64)).starts_with("neither hex nor JSON ("));
        assert!(why(&format!("{}g", "a".repeat(63))).starts_with("neither hex nor JSON ("));
    }

    #[test]
    fn the_key_id_is_the_documented_hash_of_rfc8032_test_key_1() {
        // RFC 8032, 7.1, TEST 1.
        let secret: [u8; 32] = hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60").unwrap().try_into().unwrap();
        let key = SigningKey::from_bytes(&secret);
        assert_eq!(hex::encode(key.verifying_key().as_bytes()), "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
        assert_eq!(key_id(&key.verifying_key()), hex::encode(&Sha256::digest(key.verifying_key().as_bytes())[..16]));
        assert_eq!(
            hex::encode(key.sign(b"").to_bytes()),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        );
    }
}
