//! The head of an HTTP/1.1 request sent to the egress proxy: either
//! `CONNECT host:port` (a tunnel, usually TLS) or an absolute-form request
//! such as `GET http://host/path` (plain HTTP forwarded by the proxy).
//!
//! Strict on purpose: anything another parser could read as a different
//! destination is refused rather than guessed at.

use std::net::Ipv6Addr;

use crate::{Error, Result};

/// Largest head (request line and headers) buffered before refusing.
pub const MAX_HEAD: usize = 16 * 1024;
/// Longest request line, without its line ending.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Most header fields accepted.
pub const MAX_HEADERS: usize = 100;
/// Longest host accepted in a target; DNS names are at most 253 bytes, so a
/// longer one is refused before any lookup.
pub const MAX_HOST: usize = 253;

/// Where the request asks to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`. An IPv6 literal keeps its brackets (`[::1]`);
    /// [`crate::parse_ip_literal`] reads both spellings.
    Authority { host: String, port: u16 },
    /// `GET http://host[:port]/path`: `scheme` is lowercased (only `http`),
    /// `port` defaults to 80, `path` includes any query and is at least `/`.
    Absolute {
        scheme: String,
        host: String,
        port: u16,
        path: String,
    },
}

impl Target {
    pub fn host(&self) -> &str {
        match self {
            Target::Authority { host, .. } | Target::Absolute { host, .. } => host,
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Target::Authority { port, .. } | Target::Absolute { port, .. } => *port,
        }
    }
}

/// A parsed request head. `head_len` is how many bytes of the buffer it
/// used; anything after that is body or tunnel data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: Target,
    pub headers: Vec<(String, String)>,
    pub head_len: usize,
}

fn bad(problem: impl Into<String>) -> Error {
    Error::Request {
        problem: problem.into(),
    }
}

/// Parse a request head from the bytes received so far. `Ok(None)` means
/// the head is not complete yet: read more and call again with the whole
/// buffer.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>> {
    let line_end = match check_request_line(buf)? {
        Some(end) => end,
        None => return Ok(None),
    };
    // `line_end` is the index of the '\n'; the line itself has no CR or LF.
    let line_bytes = buf.get(..line_end).unwrap_or_default();
    let line_bytes = line_bytes.strip_suffix(b"\r").unwrap_or(line_bytes);
    // Checked to be printable ASCII above, so this cannot fail.
    let line = std::str::from_utf8(line_bytes).map_err(|_| bad("request line is not ASCII"))?;
    let (method, target) = parse_request_line(line)?;

    let rest_start = line_end + 1;
    let rest_limit = MAX_HEAD.saturating_sub(rest_start);
    let rest = buf.get(rest_start..).unwrap_or_default();
    let window = rest.get(..rest_limit).unwrap_or(rest);
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (used, fields) = match httparse::parse_headers(window, &mut slots) {
        Ok(httparse::Status::Complete(done)) => done,
        Ok(httparse::Status::Partial) => {
            if rest.len() >= rest_limit {
                return Err(Error::TooLarge {
                    what: "request head",
                    limit: MAX_HEAD,
                });
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(bad(format!("more than {MAX_HEADERS} header fields")))
        }
        Err(e) => return Err(bad(format!("bad header field: {e}"))),
    };
    let mut headers = Vec::with_capacity(fields.len());
    for f in fields {
        let value = std::str::from_utf8(f.value)
            .map_err(|_| bad(format!("header {:?} is not UTF-8", f.name)))?;
        headers.push((f.name.to_owned(), value.trim().to_owned()));
    }
    Ok(Some(RequestHead {
        method,
        target,
        headers,
        head_len: rest_start + used,
    }))
}

/// Find the end of the request line (index of its '\n') and refuse a line
/// that is too long or holds anything but printable ASCII, as early as the
/// bytes allow. `None`: no line ending yet.
fn check_request_line(buf: &[u8]) -> Result<Option<usize>> {
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let len = if i > 0 && buf.get(i - 1) == Some(&b'\r') {
                i - 1
            } else {
                i
            };
            if len == 0 {
                return Err(bad("empty request line"));
            }
            if len > MAX_REQUEST_LINE {
                return Err(Error::TooLarge {
                    what: "request line",
                    limit: MAX_REQUEST_LINE,
                });
            }
            return Ok(Some(i));
        }
        if i > MAX_REQUEST_LINE {
            // Room for the longest line plus its CR has been used up.
            return Err(Error::TooLarge {
                what: "request line",
                limit: MAX_REQUEST_LINE,
            });
        }
        // A CR is only allowed right before the LF (possibly not here yet).
        let cr_ok = b == b'\r' && matches!(buf.get(i + 1), None | Some(b'\n'));
        if !(cr_ok || (0x20..=0x7e).contains(&b)) {
            return Err(bad(format!(
                "request line contains byte 0x{b:02x} at offset {i}"
            )));
        }
    }
    Ok(None)
}

fn parse_request_line(line: &str) -> Result<(String, Target)> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(format!(
            "request line {line:?} is not METHOD SP TARGET SP VERSION"
        )));
    };
    // Methods are case-sensitive: `connect` is not CONNECT, so only the
    // upper-case spellings every client sends are accepted.
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad(format!("method {method:?} is not an upper-case token")));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad(format!("unsupported HTTP version {version:?}")));
    }
    let target = if method == "CONNECT" {
        let (host, port) = parse_authority(target, None)?;
        Target::Authority { host, port }
    } else {
        parse_absolute(target)?
    };
    Ok((method.to_owned(), target))
}

/// `scheme://authority[/path][?query]`, only `http`, no userinfo or fragment.
fn parse_absolute(target: &str) -> Result<Target> {
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(bad(format!(
            "target {target:?} is not an absolute URI (a proxy request needs http://host/...)"
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" {
        return Err(bad(format!(
            "scheme {scheme:?} not supported (only http; use CONNECT for TLS)"
        )));
    }
    if target.contains('#') {
        return Err(bad("request target contains a fragment"));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let (host, port) = parse_authority(authority, Some(80))?;
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok(Target::Absolute {
        scheme,
        host,
        port,
        path,
    })
}

/// `host:port` or `[v6]:port`; the port may be left out only when a default
/// is given. The host is returned as written; callers normalise it.
fn parse_authority(authority: &str, default_port: Option<u16>) -> Result<(String, u16)> {
    if authority.contains('@') {
        return Err(bad(format!("userinfo in {authority:?} is not allowed")));
    }
    if authority.contains('%') {
        // Percent-escapes and IPv6 zone ids: other parsers decode them differently.
        return Err(bad(format!("'%' in host {authority:?} is not allowed")));
    }
    let (host, port) = if let Some(after) = authority.strip_prefix('[') {
        let Some((inner, tail)) = after.split_once(']') else {
            return Err(bad(format!("unclosed '[' in {authority:?}")));
        };
        if inner.parse::<Ipv6Addr>().is_err() {
            return Err(bad(format!("{inner:?} is not an IPv6 address")));
        }
        let port = match tail {
            "" => None,
            t => match t.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(bad(format!("junk after ']' in {authority:?}"))),
            },
        };
        // '[' and ']' are one byte each, so this ends on a char boundary.
        (authority.get(..inner.len() + 2).unwrap_or(authority), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(bad(format!("no host in {authority:?}")));
    }
    if host.len() > MAX_HOST {
        return Err(bad(format!("host is longer than {MAX_HOST} bytes")));
    }
    if !host.starts_with('[') {
        if host.contains(':') {
            return Err(bad(format!(
                "{authority:?}: an IPv6 address must be in brackets"
            )));
        }
        if let Some(c) = host
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
        {
            return Err(bad(format!("host {host:?} contains {c:?}")));
        }
    }
    let port = match (port, default_port) {
        (Some(p), _) => parse_port(p)?,
        (None, Some(d)) => d,
        (None, None) => return Err(bad(format!("{authority:?} has no port"))),
    };
    Ok((host.to_owned(), port))
}

fn parse_port(p: &str) -> Result<u16> {
    let err = || bad(format!("port {p:?}: expected a number from 1 to 65535"));
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(err()),
        Ok(n) => Ok(n),
    }
}

/// Check the `Host` header against the target: at most one `Host` field,
/// and for an absolute-form request it must name the same host (ignoring
/// ASCII case) and port (a missing port meaning 80) as the URI, so the
/// policy decision and the upstream server see one destination.
pub fn host_header_agrees(head: &RequestHead) -> Result<()> {
    let mut hosts = head
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.as_str());
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(bad("more than one Host header"));
    }
    let (Target::Absolute { host, port, .. }, Some(value)) = (&head.target, first) else {
        return Ok(());
    };
    let mismatch = || Error::HostMismatch {
        target: format!("{host}:{port}"),
        header: value.to_owned(),
    };
    let (h, p) = parse_authority(value.trim(), Some(80)).map_err(|_| mismatch())?;
    if h.eq_ignore_ascii_case(host) && p == *port {
        Ok(())
    } else {
        Err(mismatch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<RequestHead>> {
        parse_request_head(s.as_bytes())
    }

    fn problem(s: &str) -> String {
        match parse(s) {
            Err(e) => e.to_string(),
            Ok(v) => panic!("{s:?} parsed: {v:?}"),
        }
    }

    #[test]
    fn connect() {
        let req = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nTLS";
        let head = parse(req).unwrap().unwrap();
        assert_eq!(head.method, "CONNECT");
        assert_eq!(
            head.target,
            Target::Authority {
                host: "example.com".into(),
                port: 443
            }
        );
        assert_eq!(
            head.headers,
            vec![("Host".into(), "example.com:443".into())]
        );
        assert_eq!(head.head_len, req.len() - 3);
        host_header_agrees(&head).unwrap();
    }

    #[test]
    fn connect_ipv6_literal() {
        let head = parse("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.target.host(), "[2001:db8::1]");
        assert_eq!(head.target.port(), 8443);
        assert!(crate::parse_ip_literal(head.target.host()).is_some());
        assert!(problem("CONNECT [2001:db8::zz]:443 HTTP/1.1\r\n\r\n").contains("IPv6"));
        assert!(problem("CONNECT 2001:db8::1:443 HTTP/1.1\r\n\r\n").contains("brackets"));
        assert!(problem("CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\n\r\n").contains('%'));
    }

    #[test]
    fn connect_port_required_and_valid() {
        assert!(problem("CONNECT example.com HTTP/1.1\r\n\r\n").contains("no port"));
        for p in ["0", "65536", "-1", "+443", "44a", "", "0000443", " 443"] {
            let req = format!("CONNECT example.com:{p} HTTP/1.1\r\n\r\n");
            assert!(parse(&req).is_err(), "{p:?}");
        }
        let head = parse("CONNECT example.com:65535 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.target.port(), 65535);
    }

    #[test]
    fn absolute_form() {
        let head = parse("GET http://Example.com/a/b?c=d HTTP/1.1\r\nHost: example.COM\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            head.target,
            Target::Absolute {
                scheme: "http".into(),
                host: "Example.com".into(),
                port: 80,
                path: "/a/b?c=d".into()
            }
        );
        host_header_agrees(&head).unwrap();

        let head = parse("POST HTTP://example.com:8080 HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            head.target,
            Target::Absolute {
                scheme: "http".into(),
                host: "example.com".into(),
                port: 8080,
                path: "/".into()
            }
        );
        // No Host header at all is fine (HTTP/1.0).
        host_header_agrees(&head).unwrap();
        let head = parse("GET http://example.com?q HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.target.port(), 80);
        assert!(matches!(head.target, Target::Absolute { ref path, .. } if path == "/?q"));
    }

    #[test]
    fn absolute_form_refusals() {
        assert!(problem("GET https://example.com/ HTTP/1.1\r\n\r\n").contains("scheme"));
        assert!(problem("GET /index.html HTTP/1.1\r\n\r\n").contains("absolute"));
        assert!(problem("GET http://user@example.com/ HTTP/1.1\r\n\r\n").contains("userinfo"));
        assert!(problem("GET http://a:b@example.com/ HTTP/1.1\r\n\r\n").contains("userinfo"));
        assert!(problem("GET http://exa%6dple.com/ HTTP/1.1\r\n\r\n").contains('%'));
        assert!(problem("GET http://example.com/#x HTTP/1.1\r\n\r\n").contains("fragment"));
        assert!(problem("GET http://example.com:/ HTTP/1.1\r\n\r\n").contains("port"));
        assert!(problem("GET http:///x HTTP/1.1\r\n\r\n").contains("no host"));
        assert!(problem("CONNECT user@example.com:443 HTTP/1.1\r\n\r\n").contains("userinfo"));
    }

    #[test]
    fn host_header_must_agree() {
        let check = |host_lines: &str| {
            let req = format!("GET http://example.com/ HTTP/1.1\r\n{host_lines}\r\n");
            host_header_agrees(&parse(&req).unwrap().unwrap())
        };
        check("Host: example.com\r\n").unwrap();
        check("Host: EXAMPLE.com:80\r\n").unwrap();
        check("host: example.com\r\n").unwrap();
        for bad_host in [
            "Host: evil.com\r\n",
            "Host: example.com:8080\r\n",
            "Host: example.com.evil.com\r\n",
            "Host: \r\n",
            "Host: user@example.com\r\n",
        ] {
            assert!(
                matches!(check(bad_host), Err(Error::HostMismatch { .. })),
                "{bad_host:?}"
            );
        }
        let two = check("Host: example.com\r\nHost: example.com\r\n").unwrap_err();
        assert!(two.to_string().contains("more than one Host"));
        // Default port equivalence the other way round.
        let req = "GET http://example.com:80/ HTTP/1.1\r\nHost: example.com\r\n\r\n";
        host_header_agrees(&parse(req).unwrap().unwrap()).unwrap();
        // Duplicates are refused on CONNECT too.
        let req = "CONNECT example.com:443 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n";
        assert!(host_header_agrees(&parse(req).unwrap().unwrap()).is_err());
    }

    #[test]
    fn methods_are_case_sensitive() {
        assert!(problem("connect example.com:443 HTTP/1.1\r\n\r\n").contains("method"));
        assert!(problem("Get http://example.com/ HTTP/1.1\r\n\r\n").contains("method"));
    }

    #[test]
    fn versions() {
        for v in ["HTTP/2.0", "HTTP/1.2", "http/1.1", "HTTP/1.1 ", "HTTP/1"] {
            let req = format!("CONNECT example.com:443 {v}\r\n\r\n");
            assert!(parse(&req).is_err(), "{v:?}");
        }
        assert!(problem("CONNECT example.com:443\r\n\r\n").contains("METHOD SP"));
        assert!(problem("CONNECT  example.com:443 HTTP/1.1\r\n\r\n").contains("METHOD SP"));
    }

    #[test]
    fn request_line_bytes() {
        assert!(problem("CONNECT ex\tample.com:443 HTTP/1.1\r\n\r\n").contains("0x09"));
        assert!(problem("CONNECT ex\rample.com:443 HTTP/1.1\r\n\r\n").contains("0x0d"));
        let mut req = b"CONNECT ex".to_vec();
        req.extend_from_slice("ä".as_bytes());
        // Refused before the line is even complete.
        assert!(parse_request_head(&req).is_err());
        assert!(problem("\r\nCONNECT example.com:443 HTTP/1.1\r\n\r\n").contains("empty"));
    }

    #[test]
    fn long_host_refused() {
        let host = format!("{}.com", "a".repeat(250));
        let err = problem(&format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n"));
        assert!(err.contains("253"), "{err}");
        let ok = format!("{}.com", "a".repeat(249));
        assert!(parse(&format!("CONNECT {ok}:443 HTTP/1.1\r\n\r\n"))
            .unwrap()
            .is_some());
    }

    #[test]
    fn limits() {
        let line = format!(
            "GET http://example.com/{} HTTP/1.1",
            "a".repeat(MAX_REQUEST_LINE)
        );
        assert!(matches!(
            parse(&format!("{line}\r\n\r\n")),
            Err(Error::TooLarge {
                what: "request line",
                ..
            })
        ));
        // Exactly at the limit is fine; one more byte is not, CR or no CR.
        let fixed = "GET http://a.com/ HTTP/1.1".len();
        let at_limit = format!(
            "GET http://a.com/{} HTTP/1.1",
            "p".repeat(MAX_REQUEST_LINE - fixed)
        );
        assert_eq!(at_limit.len(), MAX_REQUEST_LINE);
        assert!(parse(&format!("{at_limit}\r\n\r\n")).unwrap().is_some());
        assert!(parse(&format!("{at_limit}\n\r\n")).unwrap().is_some());
        let over = at_limit.replacen("/p", "/pp", 1);
        assert!(matches!(
            parse(&format!("{over}\n\r\n")),
            Err(Error::TooLarge { .. })
        ));
        // Also refused without a line ending in sight.
        assert!(parse(&line).is_err());

        let headers: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let err = problem(&format!(
            "CONNECT example.com:443 HTTP/1.1\r\n{headers}\r\n"
        ));
        assert!(err.contains("more than 100"), "{err}");
        let headers: String = (0..MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let req = format!("CONNECT example.com:443 HTTP/1.1\r\n{headers}\r\n");
        assert_eq!(parse(&req).unwrap().unwrap().headers.len(), MAX_HEADERS);

        let big = format!("X-Big: {}\r\n", "v".repeat(8000));
        let req = format!("CONNECT example.com:443 HTTP/1.1\r\n{big}{big}{big}");
        assert!(matches!(
            parse(&req),
            Err(Error::TooLarge {
                what: "request head",
                ..
            })
        ));
        // Just under the cap but unfinished: wait for more.
        let req = format!("CONNECT example.com:443 HTTP/1.1\r\n{big}");
        assert_eq!(parse(&req).unwrap(), None);
    }

    #[test]
    fn incomplete_head_and_split_writes() {
        let req =
            "GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\nBODY";
        let whole = parse(req).unwrap().unwrap();
        assert_eq!(whole.head_len, req.len() - 4);
        for cut in 0..whole.head_len {
            assert_eq!(
                parse_request_head(&req.as_bytes()[..cut]).unwrap(),
                None,
                "cut at {cut}"
            );
        }
        for cut in whole.head_len..=req.len() {
            assert_eq!(
                parse_request_head(&req.as_bytes()[..cut]).unwrap().as_ref(),
                Some(&whole)
            );
        }
    }

    #[test]
    fn bad_headers() {
        assert!(parse("CONNECT a.com:443 HTTP/1.1\r\nNo Colon\r\n\r\n").is_err());
        assert!(parse("CONNECT a.com:443 HTTP/1.1\r\nBad\x01: v\r\n\r\n").is_err());
        let mut req = b"CONNECT a.com:443 HTTP/1.1\r\nX: ".to_vec();
        req.extend_from_slice(&[0xff, 0xfe]);
        req.extend_from_slice(b"\r\n\r\n");
        assert!(parse_request_head(&req).is_err());
    }
}
