//! Notifications out: hooks the operator configures (a URL, the event
//! types to send it, every task or one) and the sender that posts them.
//!
//! Durable by construction: the store adds an outbox row in the very
//! transaction that appends an event of a kind a hook takes (a trigger of
//! its own), so an acknowledged event is never lost to a crash. The sender
//! claims each (hook, task) stream's oldest row, posts it signed with the
//! hook's secret and deletes it on a 2xx answer: a notification is sent at
//! least once (a crash between the answer and the delete sends it again,
//! with the same message id, so a receiver can drop the repeat), in order
//! per task. A failed attempt is tried again after a backoff (1 s, doubling
//! up to 5 min) until `[hooks] give_up_after` from its event, then kept as
//! failed and the stream goes on. On a cluster any node sends; a claim is
//! held for one attempt's time, so a node that dies mid-send lets it go.
//!
//! Hooks are set with the API token, never from inside a sandbox, so any
//! address the operator names is allowed (unlike the egress proxy's).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine as _;
use cairn_core::{Event, EventKind, Task, TaskId};
use cairn_store::{HookEntry, HookRow, Notification};
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use cairn_api::hooks::{CreatedHook, HookFormat, HookTestAnswer, HookView, NewHook, NotificationView};

use crate::config::HooksConfig;
use crate::gateway::webhook;
use crate::runtime::Runtime;
use crate::Error;

/// How often the sender looks for notifications due.
const POLL: Duration = Duration::from_millis(200);
/// Notifications claimed in one look.
const BATCH: i64 = 32;
/// Attempts under way at once, over every hook.
const MAX_SENDING: usize = 64;
/// A claim outlasts an attempt's deadline by this much.
const CLAIM_MARGIN: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// At most this much of a receiver's refusal is kept as the error.
const ERROR_BODY: usize = 200;
/// The longest URL a hook may have.
const MAX_URL: usize = 2048;

/// PEM certificates from `pem` (a `[hooks] ca_file`), or why there are none.
pub fn ca_certificates(pem: &[u8]) -> Result<Vec<reqwest::Certificate>, String> {
    let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".into());
    }
    Ok(certs)
}

/// The HTTP client and settings of the sender.
#[derive(Debug)]
pub(crate) struct Notifier {
    client: reqwest::Client,
    give_up_after: Duration,
    timeout: Duration,
    sending: Arc<tokio::sync::Semaphore>,
}

impl Notifier {
    pub(crate) fn new(config: &HooksConfig) -> Result<Notifier, String> {
        // reqwest's rustls comes without a crypto provider: ring's, once
        // per process (the blob store installs the same).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            // A receiver is exactly the URL the operator named.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("cairn/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &config.ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("hooks.ca_file {}: {e}", path.display()))?;
            builder = builder.tls_certs_merge(ca_certificates(&pem).map_err(|e| format!("hooks.ca_file {}: {e}", path.display()))?);
        }
        let client = builder.build().map_err(|e| format!("cannot make the hooks' HTTP client: {e}"))?;
        Ok(Notifier {
            client,
            give_up_after: config.give_up_after,
            timeout: config.timeout,
            sending: Arc::new(tokio::sync::Semaphore::new(MAX_SENDING)),
        })
    }
}

/// The delay before attempt `attempts + 1`.
fn backoff(attempts: i64) -> Duration {
    let doublings = attempts.saturating_sub(1).clamp(0, 16) as u32;
    FIRST_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

/// `http://` or `https://`, a host, at most [`MAX_URL`] bytes.
fn check_url(url: &str) -> Result<reqwest::Url, Error> {
    let bad = |why: &str| Error::invalid(format!("hook URL {url:?}: {why}"));
    if url.len() > MAX_URL {
        return Err(bad(&format!("longer than {MAX_URL} bytes")));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(parsed)
}

/// Where a secret is sealed: bound to its hook, so that it opens for no other.
fn seal_name(hook: &str) -> String {
    format!("hook:{hook}")
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).to_string()
}

/// The message id of a notification: the same for every attempt.
fn message_id(hook: &str, task: &str, seq: i64) -> String {
    format!("msg_{hook}_{task}_{seq}")
}

fn view(e: HookEntry) -> HookView {
    let format = HookFormat::parse(&e.hook.format).unwrap_or_default();
    let kinds: Vec<EventKind> = e.kinds.iter().filter_map(|k| k.parse().ok()).collect();
    let events = format.events().iter().filter(|(_, of)| of.iter().any(|k| kinds.contains(k))).map(|(name, _)| (*name).to_owned()).collect();
    HookView {
        id: e.hook.id,
        url: e.hook.url,
        events,
        task: e.hook.task_id,
        format,
        created_ms: e.hook.created_ms,
        sent: e.hook.sent,
        last_sent_ms: e.hook.last_sent_ms,
        pending: e.pending,
        failed: e.failed,
        last_error: e.last_error,
    }
}

/// One notification ready to post: its body and the headers that sign it.
struct Outgoing {
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
}

/// Signs `body` as `format` wants, with message id `id`.
fn signed(format: HookFormat, secret: &str, hook: &str, id: &str, body: Vec<u8>) -> Result<Outgoing, Error> {
    let headers = match format {
        HookFormat::Standard => {
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
            let signature = webhook::sign(secret, id, now, &body).map_err(|e| Error::internal(format!("hook {hook}: {e}")))?;
            vec![("webhook-id", id.to_owned()), ("webhook-timestamp", now.to_string()), ("webhook-signature", signature)]
        }
        HookFormat::E2b => {
            let mut digest = Sha256::new();
            digest.update(secret.as_bytes());
            digest.update(&body);
            vec![
                ("e2b-webhook-id", hook.to_owned()),
                ("e2b-delivery-id", id.to_owned()),
                ("e2b-signature-version", "v1".to_owned()),
                ("e2b-signature", STANDARD_NO_PAD.encode(digest.finalize())),
            ]
        }
    };
    Ok(Outgoing { body, headers })
}

impl Runtime {
    /// Adds a hook; the answer holds its secret, which no later one does.
    pub async fn add_hook(&self, req: NewHook) -> Result<CreatedHook, Error> {
        let url = check_url(req.url.trim())?;
        let format = req.format;
        let kinds = format.kinds_of(&req.events).map_err(|name| {
            let known: Vec<&str> = format.events().iter().map(|(n, _)| *n).collect();
            Error::invalid(format!("unknown event type {name:?} for the {} format; it has {}", format.as_str(), known.join(", ")))
        })?;
        let task = match &req.task {
            Some(t) => Some(self.store.find_task(t).await?.id.to_string()),
            None => None,
        };
        let secret = match req.secret {
            Some(s) if s.is_empty() => return Err(Error::invalid("the hook's secret is empty")),
            Some(s) if s.len() > 1024 => return Err(Error::invalid("the hook's secret is longer than 1024 bytes")),
            Some(s) => {
                if format == HookFormat::Standard {
                    webhook::sign(&s, "check", 0, b"").map_err(|e| Error::invalid(format!("the hook's secret: {e}")))?;
                }
                s
            }
            None => webhook::new_secret(),
        };
        let mut raw = [0u8; 6];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let id = format!("hook-{}", hex::encode(raw));
        let sealed = self.seal_key()?.seal(&seal_name(&id), secret.as_bytes());
        let row = HookRow {
            id: id.clone(),
            url: url.to_string(),
            task_id: task,
            format: format.as_str().to_owned(),
            sealed,
            created_ms: cairn_store::now_ms(),
            sent: 0,
            last_sent_ms: None,
        };
        let kind_names: Vec<String> = kinds.iter().map(|k| k.as_str().to_owned()).collect();
        self.store.insert_hook(&row, &kind_names).await?;
        Ok(CreatedHook { hook: self.hook(&id).await?, secret })
    }

    /// Every hook, oldest first: never a secret.
    pub async fn hooks(&self) -> Result<Vec<HookView>, Error> {
        Ok(self.store.hooks().await?.into_iter().map(view).collect())
    }

    async fn hook_entry(&self, id: &str) -> Result<HookEntry, Error> {
        self.store.hooks().await?.into_iter().find(|h| h.hook.id == id).ok_or_else(|| Error::not_found(format!("no hook {id:?}")))
    }

    pub async fn hook(&self, id: &str) -> Result<HookView, Error> {
        Ok(view(self.hook_entry(id).await?))
    }

    /// Removes a hook and what it had not sent.
    pub async fn remove_hook(&self, id: &str) -> Result<(), Error> {
        if self.store.remove_hook(id).await? {
            Ok(())
        } else {
            Err(Error::not_found(format!("no hook {id:?}")))
        }
    }

    /// What a hook has not sent: pending, then failed, oldest first.
    pub async fn hook_notifications(&self, id: &str) -> Result<Vec<NotificationView>, Error> {
        self.hook_entry(id).await?;
        let rows = self.store.notifications(id, 1000).await?;
        Ok(rows
            .into_iter()
            .map(|n| NotificationView { task: n.task_id, seq: n.seq as u64, state: n.state, attempts: n.attempts, created_ms: n.created_ms, last_error: n.last_error })
            .collect())
    }

    /// Sends a `hook.test` notification now (not kept, not retried) and
    /// says what the receiver answered.
    pub async fn test_hook(&self, id: &str) -> Result<HookTestAnswer, Error> {
        let entry = self.hook_entry(id).await?;
        let format = HookFormat::parse(&entry.hook.format).unwrap_or_default();
        let now = cairn_store::now_ms();
        let msg = format!("msg_{id}_test_{now}");
        let body = match format {
            HookFormat::Standard => json!({ "type": "hook.test", "timestamp": rfc3339(now), "data": { "hook": id, "url": entry.hook.url } }),
            HookFormat::E2b => json!({ "version": "v2", "id": msg, "type": "hook.test", "eventData": {}, "timestamp": rfc3339(now) }),
        };
        let secret = self.hook_secret(&entry.hook)?;
        let out = signed(format, &secret, id, &msg, body.to_string().into_bytes())?;
        let started = std::time::Instant::now();
        let result = self.post(&entry.hook.url, out).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        Ok(match result {
            Ok(status) => HookTestAnswer { ok: true, status: Some(status), error: None, duration_ms },
            Err(Refused { status, error }) => HookTestAnswer { ok: false, status, error: Some(error), duration_ms },
        })
    }

    fn hook_secret(&self, hook: &HookRow) -> Result<String, Error> {
        let opened = self
            .seal_key()?
            .open(&seal_name(&hook.id), &hook.sealed)
            .ok_or_else(|| Error::internal(format!("hook {}: its secret does not open with this daemon's secrets key", hook.id)))?;
        String::from_utf8(opened.to_vec()).map_err(|_| Error::internal(format!("hook {}: its secret is not UTF-8", hook.id)))
    }

    /// Posts `out` to `url`: the status of a 2xx answer, or why not.
    async fn post(&self, url: &str, out: Outgoing) -> Result<u16, Refused> {
        let mut req = self.notifier.client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(out.body);
        for (name, value) in out.headers {
            req = req.header(name, value);
        }
        let resp = req.send().await.map_err(|e| Refused { status: None, error: reach_error(url, &e) })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(status.as_u16());
        }
        let text = resp.text().await.unwrap_or_default();
        let mut said: String = text.chars().filter(|c| !c.is_control()).take(ERROR_BODY).collect();
        if !said.is_empty() {
            said = format!(": {said}");
        }
        Err(Refused { status: Some(status.as_u16()), error: format!("HTTP {status}{said}") })
    }

    /// Starts the sender: every [`POLL`], claims the notifications due and
    /// posts each on a task of its own (a slow receiver holds only its own
    /// streams back).
    pub(crate) fn spawn_notifier(self: Arc<Self>) {
        tokio::spawn(async move {
            let mut failing_since: Option<std::time::Instant> = None;
            while self.pause(POLL).await {
                match self.send_due().await {
                    Ok(()) => failing_since = None,
                    // Once a minute at most: a store that is down would
                    // otherwise log five lines a second.
                    Err(e) => {
                        if failing_since.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                            tracing::warn!("cannot look for notifications to send: {e}");
                            failing_since = Some(std::time::Instant::now());
                        }
                    }
                }
            }
        });
    }

    async fn send_due(self: &Arc<Self>) -> Result<(), Error> {
        let free = self.notifier.sending.available_permits() as i64;
        if free == 0 {
            return Ok(());
        }
        let now = cairn_store::now_ms();
        let hold = (self.notifier.timeout + CLAIM_MARGIN).as_millis() as i64;
        let due = self.store.claim_notifications(self.node_name(), now, now + hold, BATCH.min(free)).await?;
        if due.is_empty() {
            return Ok(());
        }
        let hooks = self.store.hooks().await?;
        for n in due {
            let hook = hooks.iter().find(|h| h.hook.id == n.hook_id).map(|h| h.hook.clone());
            let Ok(permit) = self.notifier.sending.clone().acquire_owned().await else { return Ok(()) };
            let rt = self.clone();
            tokio::spawn(async move {
                rt.send_one(n, hook).await;
                drop(permit);
            });
        }
        Ok(())
    }

    /// One attempt at `n`, settled in the store.
    async fn send_one(&self, n: Notification, hook: Option<HookRow>) {
        let Some(hook) = hook else {
            // Its hook was removed after the claim: nothing to send.
            let _ = self.store.notification_sent(n.id, &n.hook_id, cairn_store::now_ms()).await;
            return;
        };
        let outcome = match self.outgoing(&hook, &n).await {
            Ok(Some(out)) => self.post(&hook.url, out).await.map(drop).map_err(|r| r.error),
            // A log entry its format has no type for: nothing to send.
            Ok(None) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
        let now = cairn_store::now_ms();
        let settled = match outcome {
            Ok(()) => self.store.notification_sent(n.id, &hook.id, now).await,
            Err(error) => {
                let age = Duration::from_millis((now - n.created_ms).max(0) as u64);
                let next = now + backoff(n.attempts).as_millis() as i64;
                if age >= self.notifier.give_up_after {
                    tracing::warn!(hook = %hook.id, task = %n.task_id, seq = n.seq, "notification given up after {} attempts: {error}", n.attempts);
                    self.store.notification_failed(n.id, &error, None).await
                } else {
                    tracing::debug!(hook = %hook.id, task = %n.task_id, seq = n.seq, "notification attempt {} failed: {error}", n.attempts);
                    self.store.notification_failed(n.id, &error, Some(next)).await
                }
            }
        };
        if let Err(e) = settled {
            // The claim runs out and the notification is sent again.
            tracing::warn!(hook = %hook.id, "cannot settle notification {} of {}: {e}", n.seq, n.task_id);
        }
    }

    /// The notification of `n` as `hook` sends it, or `None` when its
    /// format has no type for the entry.
    async fn outgoing(&self, hook: &HookRow, n: &Notification) -> Result<Option<Outgoing>, Error> {
        let format = HookFormat::parse(&hook.format).ok_or_else(|| Error::internal(format!("hook {}: unknown format {:?}", hook.id, hook.format)))?;
        let task_id: TaskId = n.task_id.parse().map_err(|e| Error::internal(format!("notification of task {:?}: {e}", n.task_id)))?;
        let event = self
            .store
            .events_before(&task_id, Some(n.seq as u64 + 1), 1)
            .await?
            .into_iter()
            .find(|e| e.seq == n.seq as u64)
            .ok_or_else(|| Error::internal(format!("event {} of task {} is not in its log", n.seq, n.task_id)))?;
        let Some(kind_type) = format.event_type(event.kind) else { return Ok(None) };
        let task = self.store.find_task(task_id.as_str()).await?;
        let id = message_id(&hook.id, &n.task_id, n.seq);
        let body = match format {
            HookFormat::Standard => self.standard_body(kind_type, &task, &event).await?,
            HookFormat::E2b => e2b_body(kind_type, &id, &task, &event),
        };
        let secret = self.hook_secret(hook)?;
        Ok(Some(signed(format, &secret, &hook.id, &id, body.to_string().into_bytes())?))
    }

    /// `{"type", "timestamp", "data": {"task", "event", ...}}`: the task,
    /// the log entry whole, and what its type adds (a wait with its prompt
    /// and signed approval link).
    async fn standard_body(&self, kind_type: &str, task: &Task, event: &Event) -> Result<Value, Error> {
        let mut kind_type = kind_type.to_owned();
        let mut data = json!({
            "task": {
                "id": task.id,
                "name": task.name,
                "image": task.config.image,
                "isolation": task.config.isolation,
                "state": task.state,
                "step": task.step,
                "metadata": task.config.metadata,
            },
            "event": event,
        });
        if event.kind == EventKind::Wait {
            if event.args.get("cancelled").and_then(Value::as_bool) == Some(true) {
                kind_type = "task.wait_cancelled".into();
            }
            if let Some(wait) = event.args.get("wait").and_then(Value::as_str) {
                if let Ok(wait) = self.store.find_wait(wait).await {
                    data["wait"] = serde_json::to_value(self.wait_view(wait).await?).unwrap_or(Value::Null);
                }
            }
        }
        Ok(json!({ "type": kind_type, "timestamp": rfc3339(event.time_ms), "data": data }))
    }
}

/// E2B's lifecycle event shape (`version` v2).
fn e2b_body(kind_type: &str, id: &str, task: &Task, event: &Event) -> Value {
    json!({
        "version": "v2",
        "id": id,
        "type": kind_type,
        "eventData": { "sandbox_metadata": task.config.metadata },
        "sandboxBuildId": "",
        "sandboxExecutionId": task.id,
        "sandboxId": task.id,
        "sandboxTeamId": "",
        "sandboxTemplateId": task.config.image,
        "timestamp": rfc3339(event.time_ms),
    })
}

/// Why a post failed: the receiver's status if it answered.
struct Refused {
    status: Option<u16>,
    error: String,
}

/// A transport error in one line: what could not be done, and the
/// innermost cause (reqwest's own message names only the request).
fn reach_error(url: &str, e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let what = if e.is_timeout() { "timed out" } else if e.is_connect() { "cannot connect" } else { "cannot post" };
    let host = reqwest::Url::parse(url).ok().and_then(|u| u.host_str().map(str::to_owned)).unwrap_or_default();
    format!("{what} to {host}: {cause}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    #[test]
    fn backoff_doubles_from_a_second_up_to_five_minutes() {
        let delays: Vec<u64> = (1..=11).map(|a| backoff(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(backoff(i64::MAX), MAX_BACKOFF);
    }

    #[test]
    fn urls_are_http_or_https_with_a_host() {
        assert!(check_url("https://hooks.example.com/cairn").is_ok());
        assert!(check_url("http://127.0.0.1:9000/").is_ok());
        for (bad, why) in [("ftp://example.com/", "scheme"), ("hooks.example.com", "relative URL"), ("http://", "empty host"), ("file:///etc/passwd", "scheme")] {
            let e = check_url(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
        assert!(check_url(&format!("https://example.com/{}", "a".repeat(MAX_URL))).unwrap_err().to_string().contains("longer than"));
    }

    #[test]
    fn standard_signatures_verify_and_e2b_signatures_are_sha256_of_secret_and_body() {
        let secret = webhook::new_secret();
        let out = signed(HookFormat::Standard, &secret, "hook-1", "msg_1", b"{\"a\":1}".to_vec()).unwrap();
        let get = |name: &str| out.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()).unwrap();
        let headers = webhook::WebhookHeaders::from_lookup(|h| match h {
            "webhook-id" => Some(b"msg_1".as_slice()),
            _ => None,
        });
        // The id alone is not enough: the signature and the time must match too.
        assert!(webhook::verify(&secret, &headers, &out.body, 0).is_err());
        let (id, ts, sig) = (get("webhook-id"), get("webhook-timestamp"), get("webhook-signature"));
        let headers = webhook::WebhookHeaders::from_lookup(|h| match h {
            "webhook-id" => Some(id.as_bytes()),
            "webhook-timestamp" => Some(ts.as_bytes()),
            "webhook-signature" => Some(sig.as_bytes()),
            _ => None,
        });
        assert!(webhook::verify(&secret, &headers, &out.body, ts.parse().unwrap()).is_ok());
        assert!(webhook::verify(&secret, &headers, b"{\"a\":2}", ts.parse().unwrap()).is_err(), "another body");

        let out = signed(HookFormat::E2b, "s3cret", "hook-1", "msg_1", b"{}".to_vec()).unwrap();
        let sig = out.headers.iter().find(|(n, _)| *n == "e2b-signature").map(|(_, v)| v.clone()).unwrap();
        let mut d = Sha256::new();
        d.update(b"s3cret{}");
        assert_eq!(sig, STANDARD_NO_PAD.encode(d.finalize()));
        assert!(!sig.ends_with('='), "unpadded");
        assert_eq!(STANDARD.decode(format!("{sig}=")).map(|b| b.len()), Ok(32));
    }
}
