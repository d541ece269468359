//! Incoming webhook signatures, per the Standard Webhooks spec
//! (<https://www.standardwebhooks.com>).
//!
//! A sender shares a secret `whsec_<base64 key>` with us and sends three
//! headers: `webhook-id`, `webhook-timestamp` (unix seconds) and
//! `webhook-signature`, a space-separated list of `v1,<base64 HMAC-SHA256>`
//! over `{id}.{timestamp}.{body}`. The older `svix-` header names are
//! accepted too, since the spec allows them and they cost nothing.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

/// Largest body we check; the router answers 413 above it.
pub const MAX_BODY: usize = 256 * 1024;
/// How far a timestamp may be from our clock, either way, against replays.
pub const TOLERANCE_SECS: i64 = 300;
/// Longest accepted `webhook-id`; it becomes an idempotency key, so bounded.
pub const MAX_ID_LEN: usize = 256;

const SECRET_PREFIX: &str = "whsec_";
const SECRET_BYTES: usize = 24;

/// Secrets from other senders may come with or without padding, as the
/// reference library accepts both.
const LENIENT_B64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Never echoes the secret: the message may end up in a log.
    #[error("webhook secret is invalid: {0}")]
    BadSecret(&'static str),
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("header webhook-id must be 1 to {MAX_ID_LEN} printable ASCII characters")]
    BadId,
    #[error("header webhook-timestamp is not an integer number of seconds")]
    BadTimestamp,
    #[error("webhook timestamp is {skew_secs} s from the server's clock (at most {TOLERANCE_SECS} s allowed)")]
    TimestampOutOfRange { skew_secs: i64 },
    #[error("no webhook-signature entry matches the body")]
    BadSignature,
    #[error("webhook body is {len} bytes, more than the {MAX_BODY} allowed")]
    BodyTooLarge { len: usize },
}

impl From<WebhookError> for crate::Error {
    fn from(e: WebhookError) -> Self {
        let message = format!("webhook refused: {e}");
        match e {
            WebhookError::BadSecret(_) => crate::Error::internal_with(message, e),
            WebhookError::BadId => crate::Error::Invalid(message),
            // Whatever stops the signature from being checked is refused like
            // a bad signature.
            WebhookError::MissingHeader(_)
            | WebhookError::BadTimestamp
            | WebhookError::TimestampOutOfRange { .. }
            | WebhookError::BadSignature => crate::Error::Unauthorized(message),
            WebhookError::BodyTooLarge { .. } => crate::Error::TooLarge(message),
        }
    }
}

/// A webhook's three signature headers as they came, bytes not yet checked.
#[derive(Debug, Clone, Default)]
pub struct WebhookHeaders {
    pub id: Option<Vec<u8>>,
    pub timestamp: Option<Vec<u8>>,
    pub signature: Option<Vec<u8>>,
}

impl WebhookHeaders {
    /// Takes each header by its spec name, else its `svix-` name, from any
    /// header map; empty counts as absent, as in the reference library.
    pub fn from_lookup<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> WebhookHeaders {
        let one = |name: &str, alias: &str| [name, alias].into_iter().find_map(|n| get(n).filter(|v| !v.is_empty())).map(<[u8]>::to_vec);
        WebhookHeaders {
            id: one("webhook-id", "svix-id"),
            timestamp: one("webhook-timestamp", "svix-timestamp"),
            signature: one("webhook-signature", "svix-signature"),
        }
    }
}

/// What a verified webhook told us about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedWebhook {
    /// The sender's message id, the same across its retries.
    pub id: String,
    /// Unix seconds, as signed by the sender.
    pub timestamp: i64,
}

/// A fresh secret: `whsec_` and the standard base64 of 24 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The `webhook-signature` value for a message: `v1,<base64 HMAC-SHA256>`.
pub fn sign(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> Result<String, WebhookError> {
    let key = decode_secret(secret)?;
    Ok(format!("v1,{}", STANDARD.encode(mac(&key, msg_id, timestamp, body))))
}

/// Checks a webhook's headers and body against `secret`, at `now_secs`.
pub fn verify(secret: &str, headers: &WebhookHeaders, body: &[u8], now_secs: i64) -> Result<VerifiedWebhook, WebhookError> {
    let key = decode_secret(secret)?;
    if body.len() > MAX_BODY {
        return Err(WebhookError::BodyTooLarge { len: body.len() });
    }
    let id = headers.id.as_deref().ok_or(WebhookError::MissingHeader("webhook-id"))?;
    let timestamp = headers.timestamp.as_deref().ok_or(WebhookError::MissingHeader("webhook-timestamp"))?;
    let signatures = headers.signature.as_deref().ok_or(WebhookError::MissingHeader("webhook-signature"))?;

    let id = std::str::from_utf8(id).map_err(|_| WebhookError::BadId)?;
    if id.len() > MAX_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(WebhookError::BadId);
    }
    let timestamp: i64 =
        std::str::from_utf8(timestamp).ok().and_then(|t| t.parse().ok()).ok_or(WebhookError::BadTimestamp)?;
    // Saturating: a hostile timestamp near i64::MIN must not overflow.
    let skew_secs = timestamp.saturating_sub(now_secs);
    if skew_secs.unsigned_abs() > TOLERANCE_SECS.unsigned_abs() {
        return Err(WebhookError::TimestampOutOfRange { skew_secs });
    }

    let expected = mac(&key, id, timestamp, body);
    let signatures = std::str::from_utf8(signatures).map_err(|_| WebhookError::BadSignature)?;
    // Every entry is compared, so the time taken says nothing about which
    // one matched or how much of it.
    let mut matched = Choice::from(0);
    for entry in signatures.split(' ').filter(|e| !e.is_empty()) {
        let Some(("v1", b64)) = entry.split_once(',') else {
            continue; // other versions (v1a, ...) are for other schemes
        };
        if let Ok(given) = STANDARD.decode(b64) {
            matched |= given.as_slice().ct_eq(expected.as_slice());
        }
    }
    if bool::from(matched) {
        Ok(VerifiedWebhook { id: id.to_owned(), timestamp })
    } else {
        Err(WebhookError::BadSignature)
    }
}

fn decode_secret(secret: &str) -> Result<Vec<u8>, WebhookError> {
    let b64 = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let key = LENIENT_B64.decode(b64).map_err(|_| WebhookError::BadSecret("not base64 after the whsec_ prefix"))?;
    if key.is_empty() {
        return Err(WebhookError::BadSecret("empty key"));
    }
    Ok(key)
}

fn mac(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
    // HMAC takes keys of any length; this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    m.update(msg_id.as_bytes());
    m.update(b".");
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::process::{Command, Stdio};

    // The example from the spec and the reference libraries' tests.
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: i64 = 1614265330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    /// Headers as an HTTP layer would hand them over.
    #[derive(Clone, Default)]
    struct HeaderMap(BTreeMap<String, Vec<u8>>);

    impl HeaderMap {
        fn insert(&mut self, name: &str, value: impl AsRef<[u8]>) {
            self.0.insert(name.to_owned(), value.as_ref().to_vec());
        }
        fn remove(&mut self, name: &str) {
            self.0.remove(name);
        }
    }

    fn verify(secret: &str, h: &HeaderMap, body: &[u8], now_secs: i64) -> Result<VerifiedWebhook, WebhookError> {
        super::verify(secret, &WebhookHeaders::from_lookup(|n| h.0.get(n).map(Vec::as_slice)), body, now_secs)
    }

    fn headers(id: &str, ts: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::default();
        h.insert("webhook-id", id);
        h.insert("webhook-timestamp", ts);
        h.insert("webhook-signature", sig);
        h
    }

    fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
    }

    #[test]
    fn new_secret_shape() {
        let s = new_secret();
        let b64 = s.strip_prefix("whsec_").unwrap();
        assert_eq!(STANDARD.decode(b64).unwrap().len(), 24);
        assert_ne!(new_secret(), s);
    }

    #[test]
    fn spec_vector() {
        assert_eq!(sign(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap(), SPEC_SIG);
        let h = headers(SPEC_ID, &SPEC_TS.to_string(), SPEC_SIG);
        let v = verify(SPEC_SECRET, &h, SPEC_BODY, SPEC_TS + 10).unwrap();
        assert_eq!(v, VerifiedWebhook { id: SPEC_ID.into(), timestamp: SPEC_TS });
    }

    #[test]
    fn secret_without_prefix_or_padding() {
        let bare = SPEC_SECRET.strip_prefix("whsec_").unwrap();
        assert_eq!(sign(bare, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap(), SPEC_SIG);
        // 24 bytes need no padding; a 32-byte key does.
        let key32 = STANDARD.encode([7u8; 32]);
        assert!(key32.ends_with('='));
        let unpadded = format!("whsec_{}", key32.trim_end_matches('='));
        assert_eq!(sign(&unpadded, "m", 1, b"x").unwrap(), sign(&format!("whsec_{key32}"), "m", 1, b"x").unwrap());
    }

    #[test]
    fn bad_secret() {
        assert!(matches!(sign("whsec_***", "m", 1, b""), Err(WebhookError::BadSecret(_))));
        assert!(matches!(sign("whsec_", "m", 1, b""), Err(WebhookError::BadSecret(_))));
        let err = sign("whsec_not base64!", "m", 1, b"").unwrap_err().to_string();
        assert!(!err.contains("not base64!"), "secret echoed: {err}");
    }

    #[test]
    fn round_trip() {
        let secret = new_secret();
        let t = now();
        let body = br#"{"event":"deploy.finished","ok":true}"#;
        let sig = sign(&secret, "msg_1", t, body).unwrap();
        let v = verify(&secret, &headers("msg_1", &t.to_string(), &sig), body, t).unwrap();
        assert_eq!(v.id, "msg_1");
        assert_eq!(v.timestamp, t);
    }

    #[test]
    fn tampered_body_or_wrong_secret() {
        let secret = new_secret();
        let sig = sign(&secret, "msg_1", 1000, b"hello").unwrap();
        let h = headers("msg_1", "1000", &sig);
        assert!(matches!(verify(&secret, &h, b"hellp", 1000), Err(WebhookError::BadSignature)));
        assert!(matches!(verify(&new_secret(), &h, b"hello", 1000), Err(WebhookError::BadSignature)));
        // The id and timestamp are signed too.
        assert!(matches!(verify(&secret, &headers("msg_2", "1000", &sig), b"hello", 1000), Err(WebhookError::BadSignature)));
        assert!(matches!(verify(&secret, &headers("msg_1", "1001", &sig), b"hello", 1000), Err(WebhookError::BadSignature)));
    }

    #[test]
    fn timestamp_window() {
        let secret = new_secret();
        let t = 1_700_000_000;
        let sig = sign(&secret, "m", t, b"x").unwrap();
        let h = headers("m", &t.to_string(), &sig);
        verify(&secret, &h, b"x", t + TOLERANCE_SECS).unwrap();
        verify(&secret, &h, b"x", t - TOLERANCE_SECS).unwrap();
        match verify(&secret, &h, b"x", t + TOLERANCE_SECS + 1) {
            Err(WebhookError::TimestampOutOfRange { skew_secs }) => assert_eq!(skew_secs, -301),
            other => panic!("old timestamp accepted: {other:?}"),
        }
        match verify(&secret, &h, b"x", t - 3600) {
            Err(WebhookError::TimestampOutOfRange { skew_secs }) => assert_eq!(skew_secs, 3600),
            other => panic!("future timestamp accepted: {other:?}"),
        }
        let far = headers("m", &i64::MIN.to_string(), &sig);
        assert!(matches!(verify(&secret, &far, b"x", t), Err(WebhookError::TimestampOutOfRange { .. })));
    }

    #[test]
    fn bad_timestamp() {
        let secret = new_secret();
        for ts in ["soon", "1614265330.5", "1e9", " "] {
            let h = headers("m", ts, "v1,AAAA");
            assert!(matches!(verify(&secret, &h, b"", 0), Err(WebhookError::BadTimestamp)), "{ts:?}");
        }
    }

    #[test]
    fn missing_each_header() {
        let secret = new_secret();
        let full = headers("m", "1", &sign(&secret, "m", 1, b"").unwrap());
        for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
            let mut h = full.clone();
            h.remove(name);
            match verify(&secret, &h, b"", 1) {
                Err(WebhookError::MissingHeader(n)) => assert_eq!(n, name),
                other => panic!("without {name}: {other:?}"),
            }
            // Empty is treated as absent.
            h.insert(name, "");
            assert!(matches!(verify(&secret, &h, b"", 1), Err(WebhookError::MissingHeader(_))));
        }
    }

    #[test]
    fn svix_header_names() {
        let secret = new_secret();
        let sig = sign(&secret, "m", 5, b"b").unwrap();
        let mut h = HeaderMap::default();
        h.insert("svix-id", "m");
        h.insert("svix-timestamp", "5");
        h.insert("svix-signature", &sig);
        assert_eq!(verify(&secret, &h, b"b", 5).unwrap().id, "m");
    }

    #[test]
    fn several_signatures_one_valid() {
        let secret = new_secret();
        let good = sign(&secret, "m", 9, b"body").unwrap();
        let other = sign(&new_secret(), "m", 9, b"body").unwrap();
        let b64 = good.strip_prefix("v1,").unwrap();
        // A right MAC under another version tag does not count.
        let list = format!("v1a,{b64} {other}  v1,@@notbase64 v2,xyz noversion {good}");
        verify(&secret, &headers("m", "9", &list), b"body", 9).unwrap();
        let without = format!("v1a,{b64} {other} v1,{}", &b64[..b64.len() - 4]);
        assert!(matches!(verify(&secret, &headers("m", "9", &without), b"body", 9), Err(WebhookError::BadSignature)));
    }

    #[test]
    fn id_guard() {
        let secret = new_secret();
        let long = "a".repeat(MAX_ID_LEN + 1);
        let ok = "a".repeat(MAX_ID_LEN);
        let sig = sign(&secret, &ok, 1, b"").unwrap();
        verify(&secret, &headers(&ok, "1", &sig), b"", 1).unwrap();
        for id in [long.as_str(), "has space", "tab\there"] {
            assert!(matches!(verify(&secret, &headers(id, "1", &sig), b"", 1), Err(WebhookError::BadId)), "{id:?}");
        }
        let mut h = headers("x", "1", &sig);
        h.insert("webhook-id", "caf\u{e9}".as_bytes());
        assert!(matches!(verify(&secret, &h, b"", 1), Err(WebhookError::BadId)));
    }

    #[test]
    fn body_limit() {
        let secret = new_secret();
        let body = vec![b'a'; MAX_BODY + 1];
        let sig = sign(&secret, "m", 1, &body).unwrap();
        let err = verify(&secret, &headers("m", "1", &sig), &body, 1).unwrap_err();
        assert!(matches!(err, WebhookError::BodyTooLarge { len } if len == MAX_BODY + 1));
        // A bad signature is a 401, not a 400: the sender must not learn more.
        let bad = verify(&secret, &headers("m", "1", "v1,AAAA"), b"", 1).unwrap_err();
        assert_eq!(crate::Error::from(bad).code(), cairn_api::ErrorCode::Unauthorized);
        assert_eq!(crate::Error::from(err).code(), cairn_api::ErrorCode::TooLarge);
    }

    /// Signs with the reference Python library (`standardwebhooks`) and has it
    /// verify our signature, so both directions agree with the spec's own code.
    const PY_SCRIPT: &str = r#"
import sys
from datetime import datetime, timezone
try:
    from standardwebhooks import Webhook
except ImportError as e:
    sys.exit(f"cannot import standardwebhooks ({e}); run: pip install standardwebhooks")
secret, msg_id, ts, ours = sys.argv[1:5]
body = sys.stdin.buffer.read().decode("utf-8")
wh = Webhook(secret)
print(wh.sign(msg_id, datetime.fromtimestamp(int(ts), tz=timezone.utc), body))
headers = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": ours}
wh.verify(body.encode("utf-8"), headers, json_parse=False)
print("verified")
"#;

    #[test]
    fn agrees_with_python_reference() {
        let secret = new_secret();
        let msg_id = "msg_2f0c4AqpZrXnEjeb8ib7Tq";
        let ts = now();
        let body = r#"{"event": "build.done", "note": "na\u00efve \u2713", "raw": "ünïcode ✓"}"#.as_bytes();
        let ours = sign(&secret, msg_id, ts, body).unwrap();

        let mut child = Command::new("python3")
            .args(["-c", PY_SCRIPT, &secret, msg_id, &ts.to_string(), &ours])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run python3 ({e}); this test needs python3 and: pip install standardwebhooks"));
        child.stdin.take().unwrap().write_all(body).unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "python3 standardwebhooks failed ({}); this test needs: pip install standardwebhooks\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = stdout.lines();
        let theirs = lines.next().unwrap_or_default().to_owned();
        assert_eq!(lines.next(), Some("verified"), "python rejected our signature: {stdout}");
        assert_eq!(theirs, ours, "python and rust sign differently");

        let h = headers(msg_id, &ts.to_string(), &theirs);
        assert_eq!(verify(&secret, &h, body, now()).unwrap().id, msg_id);
        let mut tampered = body.to_vec();
        tampered[2] ^= 0x01;
        assert!(matches!(verify(&secret, &h, &tampered, now()), Err(WebhookError::BadSignature)));
    }
}
