#![no_main]

use cairn_runtime::gateway::webhook::{sign, verify, WebhookError, WebhookHeaders, MAX_BODY};
use libfuzzer_sys::fuzz_target;

/// The example secret of the Standard Webhooks spec.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The clock the checks run at.
const NOW: i64 = 1_614_265_330;

fuzz_target!(|data: &[u8]| {
    // An HTTP request's headers (`name: value` lines) up to a blank line,
    // then its body.
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let fields: Vec<(String, &[u8])> = head
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&line[..colon]).trim().to_ascii_lowercase();
            Some((name, line[colon + 1..].trim_ascii()))
        })
        .collect();
    let headers = WebhookHeaders::from_lookup(|name| fields.iter().find(|(n, _)| n == name).map(|(_, v)| *v));
    let first = verify(SECRET, &headers, body, NOW);
    if let Ok(v) = &first {
        assert!((v.timestamp - NOW).abs() <= 300, "timestamp {} accepted at {NOW}", v.timestamp);
        assert!(!v.id.is_empty() && v.id.len() <= 256 && v.id.bytes().all(|b| b.is_ascii_graphic()));
    }
    // When only the signature stopped it, the right signature added to
    // the ones given makes it pass, for this body and no other.
    if !matches!(first, Ok(_) | Err(WebhookError::BadSignature)) {
        return;
    }
    let id = std::str::from_utf8(headers.id.as_deref().expect("checked")).expect("checked");
    let timestamp: i64 = std::str::from_utf8(headers.timestamp.as_deref().expect("checked")).expect("checked").parse().expect("checked");
    let good = sign(SECRET, id, timestamp, body).expect("the secret is valid");
    let given = headers.signature.as_deref().and_then(|s| std::str::from_utf8(s).ok()).unwrap_or("");
    let signed = WebhookHeaders { signature: Some(format!("{given} {good}").into_bytes()), ..headers.clone() };
    let ok = verify(SECRET, &signed, body, NOW).expect("a signed webhook verifies");
    assert_eq!((ok.id.as_str(), ok.timestamp), (id, timestamp));
    if body.len() >= MAX_BODY {
        return;
    }
    let mut other = body.to_vec();
    other.push(b'!');
    let only_good = WebhookHeaders { signature: Some(good.into_bytes()), ..headers.clone() };
    assert!(matches!(verify(SECRET, &only_good, &other, NOW), Err(WebhookError::BadSignature)));
});
