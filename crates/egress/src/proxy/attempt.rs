//! One connection attempt as the task's decision log records it, and the
//! recorder that fills it in along the way and sends it exactly once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::{Decision, Host};

/// Longest host kept in a log entry when it is logged as sent.
pub(crate) const MAX_LOGGED_HOST: usize = 300;

/// What the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AttemptKind {
    /// A `CONNECT` tunnel. Also used for a refused request whose method was
    /// `CONNECT` even if nothing else could be read.
    Connect,
    /// A plain HTTP request (one per request on a keep-alive connection),
    /// and any request too malformed to say it was a `CONNECT`.
    Http,
    /// One request inside a tunnel the proxy intercepts (the host has
    /// request rules or injections): decided by those rules.
    Intercepted,
}

impl AttemptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::Connect => "connect",
            AttemptKind::Http => "http",
            AttemptKind::Intercepted => "intercepted",
        }
    }
}

/// One connection attempt through a task's egress proxy, as written to the
/// task's decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub kind: AttemptKind,
    /// Normalised when it could be normalised, else as sent (truncated to
    /// 300 characters); empty when the request named none.
    pub host: String,
    /// 0 when the request was too malformed to say.
    pub port: u16,
    /// The checked address connected to (or refused, or the last one that
    /// failed); `None` if no lookup happened.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>))]
    pub address: Option<SocketAddr>,
    /// True only if the proxy let the traffic through to the upstream: a
    /// forwarded HTTP request, or a tunnel past its checks. A tunnel later
    /// cut (policy change, timeouts) stays `true`; its reason says why it
    /// ended.
    pub allowed: bool,
    /// The policy rule that decided, if any.
    pub rule: Option<String>,
    /// One line: why it was allowed, refused or cut.
    pub reason: String,
    /// The status the proxy answered with itself (200 for an established
    /// tunnel; 400, 403, 408, 429, 502), or, for a forwarded HTTP request,
    /// the upstream's status. `None` when no response was sent.
    pub status: Option<u16>,
    /// Client -> upstream payload bytes relayed (tunnel data, or request
    /// body).
    pub bytes_up: u64,
    /// Upstream -> client payload bytes (tunnel data, or response body).
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// Set on the entry a tunnel writes when its bytes start to flow, so
    /// a long tunnel is on record while it is open (a daemon killed
    /// before it ends cannot write its final entry, which follows with
    /// this unset).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
    /// An intercepted request's method and path (without the query).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The secrets the proxy put into this request, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// How many times a secret in the response was replaced by its
    /// placeholder.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub scrubbed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A host as sent, cut to the length the log keeps.
pub(crate) fn as_sent(host: &str) -> String {
    host.chars().take(MAX_LOGGED_HOST).collect()
}

/// What was relayed, shared with the code that relays it: payload bytes
/// each way, and whether the traffic was let through to the upstream.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    up: AtomicU64,
    down: AtomicU64,
    through: AtomicBool,
}

impl Meter {
    pub fn let_through(&self) {
        self.through.store(true, Ordering::Relaxed);
    }

    pub fn add_up(&self, n: usize) {
        self.up.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_down(&self, n: usize) {
        self.down.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }

    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

/// When bytes last moved, for idle timeouts.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Self {
        Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    pub fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Returns once nothing moved for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Why a connection is being cut from outside the code that owns its
/// attempts (idle, policy change): read by recorders dropped with it.
#[derive(Debug, Default)]
pub(crate) struct CutSlot(Mutex<Option<String>>);

impl CutSlot {
    /// The first reason wins.
    pub fn set(&self, reason: String) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason);
        }
    }

    pub fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Builds one [`Attempt`] and sends it exactly once: by [`Recorder::finish`]
/// or, if the work is dropped first (shutdown, a cut connection), on drop.
#[derive(Debug)]
pub(crate) struct Recorder {
    attempt: Attempt,
    started: Instant,
    meter: Arc<Meter>,
    cut: Arc<CutSlot>,
    cancel: CancellationToken,
    log: UnboundedSender<Attempt>,
    sent: bool,
}

impl Recorder {
    pub fn new(
        kind: AttemptKind,
        started: Instant,
        log: UnboundedSender<Attempt>,
        cancel: CancellationToken,
        cut: Arc<CutSlot>,
    ) -> Self {
        Recorder {
            attempt: Attempt {
                kind,
                host: String::new(),
                port: 0,
                address: None,
                allowed: false,
                rule: None,
                reason: String::new(),
                status: None,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
                open: false,
                method: None,
                path: None,
                secrets: Vec::new(),
                scrubbed: 0,
            },
            started,
            meter: Arc::default(),
            cut,
            cancel,
            log,
            sent: false,
        }
    }

    /// The destination as sent, before it is normalised.
    pub fn target(&mut self, host: &str, port: u16) {
        self.attempt.host = as_sent(host);
        self.attempt.port = port;
    }

    pub fn host(&mut self, host: &Host) {
        self.attempt.host = host.to_string();
    }

    pub fn decided(&mut self, d: &Decision) {
        self.attempt.rule.clone_from(&d.rule);
        self.attempt.reason.clone_from(&d.reason);
    }

    pub fn address(&mut self, addr: SocketAddr) {
        self.attempt.address = Some(addr);
    }

    pub fn address_of(&self) -> Option<SocketAddr> {
        self.attempt.address
    }

    /// An intercepted request's method and path.
    pub fn request(&mut self, method: &str, path: &str) {
        self.attempt.method = Some(method.to_owned());
        self.attempt.path = Some(path.chars().take(MAX_LOGGED_HOST).collect());
    }

    /// The request rule that allowed it ("" for none).
    pub fn rule(&mut self, rule: String) {
        self.attempt.rule = (!rule.is_empty()).then_some(rule);
    }

    pub fn secrets(&mut self, names: Vec<String>) {
        self.attempt.secrets = names;
    }

    pub fn scrubbed(&mut self, n: u64) {
        self.attempt.scrubbed += n;
    }

    pub fn allowed(&mut self) {
        self.meter.let_through();
    }

    pub fn status(&mut self, status: u16) {
        self.attempt.status = Some(status);
    }

    pub fn reason(&mut self, reason: impl Into<String>) {
        self.attempt.reason = reason.into();
    }

    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    #[cfg(test)]
    pub fn cut_slot(&self) -> &Arc<CutSlot> {
        &self.cut
    }

    /// What sends the tunnel's "open" entry: the attempt as it stands now,
    /// marked open and let through, when called.
    pub fn open_notice(&self) -> impl Fn() + Send + Sync + 'static {
        let mut attempt = self.attempt.clone();
        attempt.open = true;
        attempt.allowed = true;
        let (log, started) = (self.log.clone(), self.started);
        move || {
            let mut a = attempt.clone();
            a.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let _ = log.send(a);
        }
    }

    /// Sends the attempt as it stands.
    pub fn finish(mut self) {
        self.send(true);
    }

    fn send(&mut self, finished: bool) {
        if self.sent {
            return;
        }
        self.sent = true;
        let mut attempt = self.attempt.clone();
        if !finished {
            if let Some(reason) = self.cut.get() {
                attempt.reason = reason;
            } else if self.cancel.is_cancelled() {
                attempt.reason = "proxy shut down".to_owned();
            }
        }
        attempt.allowed = self.meter.through.load(Ordering::Relaxed);
        attempt.bytes_up = self.meter.up();
        attempt.bytes_down = self.meter.down();
        attempt.duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(
            kind = ?attempt.kind,
            host = %attempt.host,
            port = attempt.port,
            allowed = attempt.allowed,
            reason = %attempt.reason,
            "egress attempt"
        );
        // A closed log means nobody is listening any more; nothing to do.
        let _ = self.log.send(attempt);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.send(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn recorder(cancel: &CancellationToken) -> (Recorder, mpsc::UnboundedReceiver<Attempt>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let r = Recorder::new(
            AttemptKind::Connect,
            Instant::now(),
            tx,
            cancel.clone(),
            Arc::default(),
        );
        (r, rx)
    }

    #[test]
    fn serde_shape() {
        let a = Attempt {
            kind: AttemptKind::Http,
            host: "example.com".into(),
            port: 80,
            address: Some("93.184.216.34:80".parse().unwrap()),
            allowed: true,
            rule: Some("example.com".into()),
            reason: "allowed by rule example.com".into(),
            status: Some(200),
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
            open: false,
            method: None,
            path: None,
            secrets: Vec::new(),
            scrubbed: 0,
        };
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["kind"], "http");
        assert!(v.get("open").is_none(), "only open entries say so");
        assert_eq!(v["address"], "93.184.216.34:80");
        assert_eq!(
            serde_json::to_value(AttemptKind::Connect).unwrap(),
            "connect"
        );
        let back: Attempt = serde_json::from_value(v).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn sent_once_on_finish() {
        let cancel = CancellationToken::new();
        let (mut r, mut rx) = recorder(&cancel);
        r.target("Example.COM", 443);
        r.meter().add_up(5);
        r.meter().add_down(7);
        r.reason("done");
        r.finish();
        let a = rx.try_recv().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("Example.COM", 443));
        assert_eq!((a.bytes_up, a.bytes_down), (5, 7));
        assert_eq!(a.reason, "done");
        assert!(rx.try_recv().is_err(), "exactly once");
    }

    #[test]
    fn dropped_recorders_log_why() {
        let cancel = CancellationToken::new();
        let (mut r, mut rx) = recorder(&cancel);
        r.reason("allowed by rule a.test");
        drop(r);
        assert_eq!(rx.try_recv().unwrap().reason, "allowed by rule a.test");

        let (mut r, mut rx) = recorder(&cancel);
        r.reason("allowed by rule a.test");
        r.cut_slot().set("idle for 1s".into());
        r.cut_slot().set("second reason loses".into());
        drop(r);
        assert_eq!(rx.try_recv().unwrap().reason, "idle for 1s");

        let (r, mut rx) = recorder(&cancel);
        cancel.cancel();
        drop(r);
        assert_eq!(rx.try_recv().unwrap().reason, "proxy shut down");
        assert!(rx.try_recv().is_err());

        // A finished attempt keeps its own reason even during shutdown.
        let (mut r, mut rx) = recorder(&cancel);
        r.reason("no rule allows it");
        r.finish();
        assert_eq!(rx.try_recv().unwrap().reason, "no rule allows it");
    }

    #[test]
    fn hosts_as_sent_are_truncated() {
        let long = "a".repeat(1000);
        assert_eq!(as_sent(&long).chars().count(), MAX_LOGGED_HOST);
        assert_eq!(as_sent("ä.test"), "ä.test");
    }
}
