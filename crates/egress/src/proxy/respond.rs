//! The responses the proxy writes itself, all of one shape:
//! `HTTP/1.1 <code> <reason>`, a `text/plain` body of one line saying why,
//! and `Connection: close`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::attempt::Recorder;

/// Most bytes read and dropped while waiting for a refused client to close.
const MAX_DRAIN: usize = 64 * 1024;
/// Longest wait for a refused client to close before the proxy does.
const MAX_LINGER: Duration = Duration::from_secs(1);

/// A reason as one printable line (control characters become spaces).
pub(crate) fn one_line(reason: &str) -> String {
    reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn phrase(status: u16) -> &'static str {
    StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error")
}

/// The body: the reason line and a newline.
fn body(reason: &str) -> String {
    format!("{}\n", one_line(reason))
}

/// A whole response as bytes, for writing to a raw client socket.
pub(crate) fn response_bytes(status: u16, reason: &str) -> Vec<u8> {
    let body = body(reason);
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        phrase(status),
        body.len()
    )
    .into_bytes()
}

/// The same response for the hyper server (it writes the status line).
pub(crate) fn response(status: u16, reason: &str) -> Response<Bytes> {
    let body = body(reason);
    let len = body.len();
    let mut resp = Response::new(Bytes::from(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// Answers `status` with `reason`, logs the attempt, and closes without
/// resetting: the client's unread bytes would otherwise turn the close into
/// a reset that can destroy the response before the client reads it.
pub(crate) async fn refuse(
    stream: &mut TcpStream,
    mut rec: Recorder,
    status: u16,
    reason: &str,
    linger: Duration,
) {
    rec.reason(reason);
    let written = stream.write_all(&response_bytes(status, reason)).await;
    if written.is_ok() {
        rec.status(status);
    }
    rec.finish();
    if written.is_ok() {
        close_gracefully(stream, linger).await;
    }
}

/// Half-closes, then reads and drops what the client still sends until it
/// closes too, `linger` passes (at most a second) or enough was read.
pub(crate) async fn close_gracefully(stream: &mut TcpStream, linger: Duration) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut total = 0;
        while total < MAX_DRAIN {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(linger.min(MAX_LINGER), drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let r = String::from_utf8(response_bytes(403, "no rule allows it")).unwrap();
        assert_eq!(
            r,
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 18\r\nConnection: close\r\n\r\nno rule allows it\n"
        );
        let r = String::from_utf8(response_bytes(429, "a\r\nSet-Cookie: x")).unwrap();
        assert!(r.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(r.ends_with("\r\n\r\na  Set-Cookie: x\n"), "{r:?}");
        assert!(String::from_utf8(response_bytes(408, "x"))
            .unwrap()
            .starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        let h = response(502, "cannot resolve a.test: no addresses");
        assert_eq!(h.status(), 502);
        assert_eq!(h.headers()[CONTENT_LENGTH], "36");
        assert_eq!(h.headers()[CONNECTION], "close");
        assert_eq!(&h.body()[..], b"cannot resolve a.test: no addresses\n");
    }
}
