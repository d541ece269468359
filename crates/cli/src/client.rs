//! The HTTP client side of every subcommand: finds the daemon
//! (`CAIRN_URL`, else `$CAIRN_HOME/url`) and its token (`CAIRN_TOKEN`, else
//! `$CAIRN_HOME/token`), and turns every failure into one line.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// An answer of the daemon twice: as it came, which is what `--json`
/// prints (every field, in the daemon's words), and decoded into its type
/// of the wire model ([`cairn_api`]), which is what everything else reads.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    pub raw: Value,
    pub body: T,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Answer<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(d)?;
        let body = T::deserialize(&raw).map_err(serde::de::Error::custom)?;
        Ok(Answer { raw, body })
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    pub base: String,
    pub token: String,
    http: reqwest::Client,
    actor: String,
}

pub fn home() -> PathBuf {
    cairn_server::Home::default_root()
}

impl Client {
    pub fn new(base: String, token: String) -> Client {
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| format!("uid{}", nix::unistd::geteuid()))
        });
        Client { base: base.trim_end_matches('/').to_owned(), token, http: reqwest::Client::new(), actor: format!("cli:{user}") }
    }

    /// From the environment and the data directory.
    pub fn from_env() -> Result<Client> {
        let home = home();
        let start_hint = "start it with `cairn serve`";
        let base = match std::env::var("CAIRN_URL").ok().filter(|u| !u.is_empty()) {
            Some(u) => u,
            None => {
                let path = home.join("url");
                std::fs::read_to_string(&path)
                    .map(|s| s.trim().to_owned())
                    .map_err(|_| anyhow!("daemon not running: no {} ({start_hint}, or set CAIRN_URL)", path.display()))?
            }
        };
        let token = match std::env::var("CAIRN_TOKEN").ok().filter(|t| !t.is_empty()) {
            Some(t) => t,
            None => {
                let path = home.join("token");
                std::fs::read_to_string(&path)
                    .map(|s| s.trim().to_owned())
                    .with_context(|| format!("cannot read the daemon's token {} (set CAIRN_TOKEN, or run as the daemon's user)", path.display()))?
            }
        };
        Ok(Client::new(base, token))
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn actor(&self) -> &str {
        &self.actor
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(&self.token).header("x-cairn-actor", &self.actor)
    }

    /// Sends and decodes, mapping HTTP errors to the daemon's message.
    pub async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T> {
        let resp = req.send().await.map_err(|e| self.connect_error(e))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| anyhow!("reading the daemon's answer: {e}"))?;
        if !status.is_success() {
            bail!("{}", error_message(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| anyhow!("malformed answer from the daemon: {e}"))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send(self.request(Method::GET, path)).await
    }

    /// Posts a body of the wire model ([`cairn_api`]).
    pub async fn post<T: DeserializeOwned, B: serde::Serialize + ?Sized>(&self, path: &str, body: &B) -> Result<T> {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    /// Posts a request that has nothing to say beyond its path (complete,
    /// suspend, resume, checkpoint, key rotation): the body is `{}`.
    pub async fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.post(path, &serde_json::Map::new()).await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send(self.request(Method::DELETE, path)).await
    }

    /// Streams the task's event log (server-sent events) to stdout: one
    /// JSON object per line with `json`, else one readable line per event.
    pub async fn watch(&self, task: &str, json: bool) -> Result<()> {
        use futures_util::StreamExt;
        let resp = self.request(Method::GET, &format!("/v1/tasks/{task}/watch")).send().await.map_err(|e| self.connect_error(e))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.bytes().await.unwrap_or_default();
            bail!("{}", error_message(status, &body));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| anyhow!("the event stream broke: {e}"))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                for data in frame.lines().filter_map(|l| l.strip_prefix("data:")) {
                    let v: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
                    if json {
                        outln!("{v}");
                    } else {
                        let e = cairn_core::Event::deserialize(&v).map_err(|e| anyhow!("malformed event from the daemon: {e}"))?;
                        outln!("{}", crate::output::watch_line(&e));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn connect_error(&self, e: reqwest::Error) -> anyhow::Error {
        if e.is_connect() {
            anyhow!("daemon not running at {} (start it with `cairn serve`)", self.base)
        } else {
            anyhow!("request to the daemon at {} failed: {e}", self.base)
        }
    }
}

/// The one-line message of an error answer.
pub fn error_message(status: StatusCode, body: &[u8]) -> String {
    let msg = serde_json::from_slice::<cairn_api::ErrorBody>(body)
        .map(|b| b.error.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_owned());
    match status {
        StatusCode::UNAUTHORIZED => format!("the daemon refused the token: {msg}"),
        _ if msg.is_empty() => format!("the daemon answered {status}"),
        _ => msg,
    }
}

/// Percent-encodes one path segment (an image reference has `/` and `:`).
pub fn segment_escape(s: &str) -> String {
    query_escape(s).replace('/', "%2F")
}

/// Percent-encodes a query value.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
