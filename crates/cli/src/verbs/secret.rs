//! `cairn secret set|list|rm`: credentials the egress proxy injects into a
//! task's requests, so that they never enter the sandbox. A value is read
//! from stdin or a file, never from an argument (arguments show in `ps`
//! and shell history), and no command prints one.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cairn_api::secrets::SecretView;
use clap::Subcommand;

use super::Out;
use crate::client::{Answer, Client};

#[derive(Subcommand, Debug)]
pub(crate) enum SecretCmd {
    /// Set a secret from stdin (or --file): a new one, or a new value.
    Set {
        name: String,
        /// Read the value from this file instead of stdin.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// The secrets: name, when set, when last used, uses (never values).
    List,
    /// Remove a secret.
    Rm { name: String },
}

/// The value as given, less one trailing newline (what `echo` and a
/// heredoc add).
fn value_from(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    bytes
}

pub(crate) async fn run(client: &Client, cmd: SecretCmd, out: Out) -> Result<u8> {
    match cmd {
        SecretCmd::Set { name, file } => {
            let raw = match &file {
                Some(path) => std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
                None => {
                    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                        eprintln!("reading the value of {name} from stdin (end with Ctrl-D)");
                    }
                    let mut buf = Vec::new();
                    std::io::stdin().read_to_end(&mut buf).context("cannot read the value from stdin")?;
                    buf
                }
            };
            let value = value_from(raw);
            if value.is_empty() {
                bail!("secret {name}: the value is empty (give it on stdin or with --file)");
            }
            let req = client.request(reqwest::Method::PUT, &format!("/v1/secrets/{name}")).body(value);
            let v: Answer<SecretView> = client.send(req).await?;
            out.print(&v, |s| format!("set {}", s.name));
        }
        SecretCmd::List => {
            let v: Answer<Vec<SecretView>> = client.get("/v1/secrets").await?;
            out.print(&v, |all| {
                let when = |ms: i64| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)).to_string();
                let mut lines = vec![format!("{:<24} {:<22} {:<22} {}", "NAME", "SET", "LAST USED", "USES")];
                lines.extend(all.iter().map(|s| format!("{:<24} {:<22} {:<22} {}", s.name, when(s.updated_ms), s.last_used_ms.map(when).unwrap_or_else(|| "never".into()), s.uses)));
                lines.join("\n")
            });
        }
        SecretCmd::Rm { name } => {
            let v: Answer<serde_json::Value> = client.delete(&format!("/v1/secrets/{name}")).await?;
            out.print(&v, |_| format!("removed {name}"));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::value_from;

    #[test]
    fn one_trailing_newline_is_dropped() {
        assert_eq!(value_from(b"tok\n".to_vec()), b"tok");
        assert_eq!(value_from(b"tok\r\n".to_vec()), b"tok");
        assert_eq!(value_from(b"tok\n\n".to_vec()), b"tok\n");
        assert_eq!(value_from(b"tok".to_vec()), b"tok");
    }
}
