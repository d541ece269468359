//! `cairn api-key create|list|revoke`: keys of the E2B-compatible API
//! (`X-API-Key`; see docs/e2b.md). The ledger's signing keys are `cairn key`.

use anyhow::Result;
use cairn_api::api_keys::{ApiKeyView, CreateApiKey, NewApiKey};
use clap::Subcommand;

use super::Out;
use crate::client::{Answer, Client};

#[derive(Subcommand, Debug)]
pub(crate) enum ApiKeyCmd {
    /// Make a key and print it on stdout: the only time it is shown.
    Create { name: String },
    /// The keys: name, when made, when last used (never the keys).
    List,
    /// Revoke a key: requests with it are refused from now on.
    Revoke { name: String },
}

pub(crate) async fn run(client: &Client, cmd: ApiKeyCmd, out: Out) -> Result<u8> {
    match cmd {
        ApiKeyCmd::Create { name } => {
            let v: Answer<NewApiKey> = client.post("/v1/api-keys", &CreateApiKey { name }).await?;
            out.print(&v, |k| k.key.clone());
        }
        ApiKeyCmd::List => {
            let v: Answer<Vec<ApiKeyView>> = client.get("/v1/api-keys").await?;
            out.print(&v, |keys| {
                let when = |ms: i64| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)).to_string();
                let mut lines = vec![format!("{:<24} {:<22} {}", "NAME", "CREATED", "LAST USED")];
                lines.extend(keys.iter().map(|k| format!("{:<24} {:<22} {}", k.name, when(k.created_ms), k.last_used_ms.map(when).unwrap_or_else(|| "never".into()))));
                lines.join("\n")
            });
        }
        ApiKeyCmd::Revoke { name } => {
            let v: Answer<serde_json::Value> = client.delete(&format!("/v1/api-keys/{name}")).await?;
            out.print(&v, |_| format!("revoked {name}"));
        }
    }
    Ok(0)
}
