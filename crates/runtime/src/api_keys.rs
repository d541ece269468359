//! API keys for the E2B-compatible API (`X-API-Key`): made here, kept in
//! the store as their SHA-256 only, and the access token each sandbox's
//! in-sandbox API checks. The daemon's own API keeps its bearer token.

use cairn_store::ApiKeyRow;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::runtime::Runtime;
use crate::Error;

/// The prefix E2B's SDKs expect of a key (some check `e2b_` and hex).
pub const KEY_PREFIX: &str = "e2b_";

pub use cairn_api::api_keys::ApiKeyView;

fn digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Names are short words: they appear in logs and on command lines.
fn check_key_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("invalid API key name {name:?}: 1 to 64 letters, digits, '-', '_' or '.'")))
    }
}

impl Runtime {
    /// Makes a key named `name` and returns it: the only time it is seen.
    pub async fn create_api_key(&self, name: &str) -> Result<String, Error> {
        check_key_name(name)?;
        let mut bytes = [0u8; 20];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let key = format!("{KEY_PREFIX}{}", hex::encode(bytes));
        let row = ApiKeyRow { name: name.to_owned(), hash: digest(&key), created_ms: cairn_store::now_ms(), last_used_ms: None };
        self.store.insert_api_key(&row).await?;
        Ok(key)
    }

    pub async fn api_keys(&self) -> Result<Vec<ApiKeyView>, Error> {
        let rows = self.store.api_keys().await?;
        Ok(rows.into_iter().map(|r| ApiKeyView { name: r.name, created_ms: r.created_ms, last_used_ms: r.last_used_ms }).collect())
    }

    pub async fn revoke_api_key(&self, name: &str) -> Result<(), Error> {
        if self.store.revoke_api_key(name).await? {
            Ok(())
        } else {
            Err(Error::not_found(format!("no API key named {name:?}")))
        }
    }

    /// The name of the key `key`, or why it is refused.
    pub async fn check_api_key(&self, key: &str) -> Result<String, Error> {
        if key.is_empty() {
            return Err(Error::Unauthorized("missing API key (X-API-Key)".into()));
        }
        match self.store.use_api_key(&digest(key), cairn_store::now_ms()).await? {
            Some(name) => Ok(name),
            None => Err(Error::Unauthorized("invalid API key".into())),
        }
    }

    /// The token a client of the E2B API gets for task `task`'s in-sandbox
    /// API (`X-Access-Token`): derived, not stored, the same on every node.
    pub fn sandbox_access_token(&self, task: &str) -> String {
        hex::encode(self.link_key.mac_text(&format!("sandbox-access\n{task}")))
    }

    /// Whether `token` is task `task`'s access token.
    pub fn check_sandbox_access_token(&self, task: &str, token: &str) -> bool {
        self.sandbox_access_token(task).as_bytes().ct_eq(token.as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_are_short_words() {
        assert!(check_key_name("ci-runner_1.a").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_key_name(bad).is_err(), "{bad:?}");
        }
    }
}
