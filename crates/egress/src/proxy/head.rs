//! Reading the first request head of a client connection with
//! [`parse_request_head`], and a best-effort reading of a head that failed,
//! so the log can still say what was asked for.

use std::io;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::attempt::{as_sent, AttemptKind};
use crate::connect::MAX_HEAD;
use crate::{parse_request_head, Error, RequestHead};

/// Why no request head was read.
#[derive(Debug)]
pub(crate) enum HeadError {
    /// Not complete within the handshake timeout.
    Timeout,
    /// The client closed before the head was complete.
    Closed,
    /// The parser refused it.
    Bad(Error),
    Io(io::Error),
    /// The proxy is shutting down.
    Shutdown,
}

/// Reads until `buf` holds a complete head (which it returns; bytes past
/// `head_len` are already the body or tunnel data), never buffering more
/// than [`MAX_HEAD`] bytes.
pub(crate) async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> Result<RequestHead, HeadError> {
    tokio::time::timeout(timeout, read_until_head(stream, buf))
        .await
        .unwrap_or(Err(HeadError::Timeout))
}

async fn read_until_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<RequestHead, HeadError> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = parse_request_head(buf).map_err(HeadError::Bad)? {
            return Ok(head);
        }
        let room = MAX_HEAD.saturating_sub(buf.len()).min(chunk.len());
        let Some(into) = chunk.get_mut(..room).filter(|c| !c.is_empty()) else {
            // The parser refuses a full buffer itself; this is a backstop.
            return Err(HeadError::Bad(Error::TooLarge {
                what: "request head",
                limit: MAX_HEAD,
            }));
        };
        let n = stream.read(into).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        buf.extend_from_slice(into.get(..n).unwrap_or_default());
    }
}

/// What a head that did not parse seems to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guess {
    pub kind: AttemptKind,
    /// As sent, cut to the logged length; empty if none could be found.
    pub host: String,
    /// 0 if none could be read.
    pub port: u16,
}

/// Reads the method and target out of the first line, however broken.
pub(crate) fn guess(buf: &[u8]) -> Guess {
    let line_end = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
    let line = String::from_utf8_lossy(buf.get(..line_end).unwrap_or_default());
    let mut parts = line.trim_end_matches('\r').split(' ');
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let kind = if connect {
        AttemptKind::Connect
    } else {
        AttemptKind::Http
    };
    let (authority, default_port) = if connect {
        (target, 0)
    } else if let Some((_, rest)) = target.split_once("://") {
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        (rest.get(..end).unwrap_or(rest), 80)
    } else {
        ("", 0)
    };
    let (host, port) = split_authority(authority);
    Guess {
        kind,
        host: as_sent(host),
        port: port.unwrap_or(if host.is_empty() { 0 } else { default_port }),
    }
}

/// `host:port` or `[v6]:port`, leniently; the port only if it is a number.
fn split_authority(authority: &str) -> (&str, Option<u16>) {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(i) => (
                authority.get(..=i).unwrap_or(authority),
                authority.get(i + 1..).and_then(|p| p.strip_prefix(':')),
            ),
            None => (authority, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
            _ => (authority, None),
        }
    };
    let port = port
        .filter(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != 0);
    (host, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> (AttemptKind, String, u16) {
        let g = guess(s.as_bytes());
        (g.kind, g.host, g.port)
    }

    #[test]
    fn guesses() {
        use AttemptKind::{Connect, Http};
        assert_eq!(
            g("CONNECT user@a.test:443 HTTP/1.1\r\n"),
            (Connect, "user@a.test".into(), 443)
        );
        assert_eq!(
            g("CONNECT a.test HTTP/1.1\r\n"),
            (Connect, "a.test".into(), 0)
        );
        assert_eq!(
            g("CONNECT [::1]:8443 HTTP/1.1"),
            (Connect, "[::1]".into(), 8443)
        );
        assert_eq!(g("connect a.test:99999 x"), (Connect, "a.test".into(), 0));
        assert_eq!(
            g("GET http://a%2e.test/x HTTP/1.1\r\n"),
            (Http, "a%2e.test".into(), 80)
        );
        assert_eq!(
            g("GET http://u:pw@a.test/ HTTP/1.1\r\n"),
            (Http, "u:pw@a.test".into(), 80)
        );
        assert_eq!(
            g("GET https://a.test:8443/x HTTP/1.1\r\n"),
            (Http, "a.test".into(), 8443)
        );
        assert_eq!(g("GET /x HTTP/1.1\r\n"), (Http, String::new(), 0));
        assert_eq!(g(""), (Http, String::new(), 0));
        assert_eq!(g("\u{0}\u{ff}"), (Http, String::new(), 0));
        let long = format!("CONNECT {}:443 HTTP/1.1\r\n", "a".repeat(5000));
        let (_, host, port) = g(&long);
        assert_eq!((host.len(), port), (300, 443));
        let mut bytes = b"CONNECT a.te".to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe]);
        bytes.extend_from_slice(b"st:443 HTTP/1.1");
        let guess = guess(&bytes);
        assert_eq!(guess.port, 443);
        assert!(guess.host.starts_with("a.te"));
    }
}
