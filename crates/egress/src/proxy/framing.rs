//! The framing check of HTTP/1.1 requests on an intercepted connection,
//! before hyper reads them. hyper reads a request with both
//! `Content-Length` and `Transfer-Encoding` by its chunked framing and drops
//! the length (RFC 9112 6.3 allows it); a proxy should refuse it instead,
//! since the two framings are how one request hides another. The guard
//! follows the byte stream request by request (holding each head back
//! until it is whole, then walking its body by its length or its chunks)
//! and replaces a request whose framing is ambiguous by a marker request
//! the handler answers `400` with the reason; nothing after it is read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The header that carries the refusal to the handler, with the
/// connection's own token so that a client cannot send it.
pub(crate) const REFUSED_HEADER: &str = "x-cairn-framing-refused";

/// Where the guard is in the stream.
#[derive(Debug)]
enum State {
    /// Collecting a request head.
    Head,
    /// This many body bytes to pass.
    Body(u64),
    /// A chunk-size line.
    ChunkSize,
    /// This many chunk bytes, then CRLF.
    ChunkData(u64),
    ChunkCrlf(u8),
    /// Trailer lines until an empty one.
    Trailers,
    /// Past what the guard can follow (a head hyper will refuse itself):
    /// everything passes as it is.
    Through,
    /// A refusal was handed on: nothing more.
    Closed,
}

/// The byte-level part: feed what the client sent, get what hyper may read.
#[derive(Debug)]
pub(crate) struct FramingGuard {
    state: State,
    held: BytesMut,
    token: String,
    host: String,
    max_head: usize,
}

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

impl FramingGuard {
    pub fn new(token: String, host: String, max_head: usize) -> Self {
        FramingGuard { state: State::Head, held: BytesMut::new(), token, host, max_head }
    }

    /// Takes `input`; appends to `out` the bytes hyper may read now.
    pub fn feed(&mut self, input: &[u8], out: &mut BytesMut) {
        self.held.extend_from_slice(input);
        loop {
            match self.state {
                State::Closed => {
                    self.held.clear();
                    return;
                }
                State::Through => {
                    out.extend_from_slice(&self.held.split());
                    return;
                }
                State::Head => {
                    let Some(end) = find(&self.held, b"\r\n\r\n") else {
                        if self.held.len() > self.max_head {
                            // Too large: hyper answers 431 itself.
                            self.state = State::Through;
                            continue;
                        }
                        return;
                    };
                    let head = self.held.split_to(end + 4);
                    match framing(&head) {
                        Ok(Framing::Length(0)) | Ok(Framing::None) => out.extend_from_slice(&head),
                        Ok(Framing::Length(n)) => {
                            out.extend_from_slice(&head);
                            self.state = State::Body(n);
                        }
                        Ok(Framing::Chunked) => {
                            out.extend_from_slice(&head);
                            self.state = State::ChunkSize;
                        }
                        Err(Some(why)) => {
                            out.extend_from_slice(self.marker(&why).as_bytes());
                            self.state = State::Closed;
                        }
                        Err(None) => {
                            out.extend_from_slice(&head);
                            self.state = State::Through;
                        }
                    }
                }
                State::Body(n) => {
                    if self.held.is_empty() {
                        return;
                    }
                    let take = (self.held.len() as u64).min(n) as usize;
                    out.extend_from_slice(&self.held.split_to(take));
                    self.state = if n == take as u64 { State::Head } else { State::Body(n - take as u64) };
                }
                State::ChunkSize | State::Trailers => {
                    let Some(end) = find(&self.held, b"\r\n") else {
                        if self.held.len() > 4096 {
                            self.state = State::Through;
                            continue;
                        }
                        return;
                    };
                    let line = self.held.split_to(end + 2);
                    out.extend_from_slice(&line);
                    if matches!(self.state, State::Trailers) {
                        if end == 0 {
                            self.state = State::Head;
                        }
                        continue;
                    }
                    let size = std::str::from_utf8(&line[..end]).ok().and_then(|l| u64::from_str_radix(l.split(';').next().unwrap_or("").trim(), 16).ok());
                    self.state = match size {
                        Some(0) => State::Trailers,
                        Some(n) => State::ChunkData(n),
                        None => State::Through,
                    };
                }
                State::ChunkData(n) => {
                    if self.held.is_empty() {
                        return;
                    }
                    let take = (self.held.len() as u64).min(n) as usize;
                    out.extend_from_slice(&self.held.split_to(take));
                    self.state = if n == take as u64 { State::ChunkCrlf(2) } else { State::ChunkData(n - take as u64) };
                }
                State::ChunkCrlf(k) => {
                    if self.held.is_empty() {
                        return;
                    }
                    let take = self.held.len().min(k as usize);
                    out.extend_from_slice(&self.held.split_to(take));
                    self.state = if take == k as usize { State::ChunkSize } else { State::ChunkCrlf(k - take as u8) };
                }
            }
        }
    }

    fn marker(&self, why: &str) -> String {
        let why: String = why.chars().filter(|c| !c.is_control()).collect();
        format!("GET / HTTP/1.1\r\nHost: {}\r\n{REFUSED_HEADER}: {} {why}\r\nConnection: close\r\n\r\n", self.host, self.token)
    }
}

/// How a request head says its body is framed.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// `Err(Some(why))` for an ambiguous framing, `Err(None)` for a head the
/// guard cannot read (hyper refuses it itself).
fn framing(head: &[u8]) -> Result<Framing, Option<String>> {
    let mut headers = [httparse::EMPTY_HEADER; crate::connect::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(None),
    }
    let mut length: Option<u64> = None;
    let mut te: Vec<String> = Vec::new();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            // Digits only: `u64::from_str` would also take "+4".
            let v = std::str::from_utf8(h.value).ok().map(str::trim).filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())).and_then(|v| v.parse::<u64>().ok());
            match (length, v) {
                (_, None) => return Err(Some("a Content-Length that is not a number".into())),
                (Some(a), Some(b)) if a != b => return Err(Some("two different Content-Length headers".into())),
                (_, Some(b)) => length = Some(b),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            te.extend(String::from_utf8_lossy(h.value).split(',').map(|t| t.trim().to_ascii_lowercase()).filter(|t| !t.is_empty()));
        }
    }
    match (length, te.is_empty()) {
        (Some(_), false) => Err(Some("both Content-Length and Transfer-Encoding: refused, as one request could hide another".into())),
        (_, false) if te.last().map(String::as_str) == Some("chunked") && te.iter().filter(|t| *t == "chunked").count() == 1 => Ok(Framing::Chunked),
        (_, false) => Err(Some(format!("Transfer-Encoding {} does not end in one chunked", te.join(", ")))),
        (Some(n), true) => Ok(Framing::Length(n)),
        (None, true) => Ok(Framing::None),
    }
}

/// The client stream with the guard in front of its reads.
#[derive(Debug)]
pub(crate) struct Guarded<S> {
    inner: S,
    guard: FramingGuard,
    ready: BytesMut,
    eof: bool,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, guard: FramingGuard) -> Self {
        Guarded { inner, guard, ready: BytesMut::new(), eof: false }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if matches!(this.guard.state, State::Closed) {
                // Nothing more is read; not an end either, which would make
                // hyper drop the refusal unanswered. The marker asked for
                // the connection to close after its answer.
                return Poll::Pending;
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                        // A head cut off by the end goes to hyper as it is.
                        let rest = this.guard.held.split();
                        this.ready.extend_from_slice(&rest);
                        continue;
                    }
                    let mut out = BytesMut::new();
                    this.guard.feed(rb.filled(), &mut out);
                    this.ready.extend_from_slice(&out);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> String {
        let mut g = FramingGuard::new("tok".into(), "api.example.com".into(), 65536);
        let mut out = BytesMut::new();
        for c in chunks {
            g.feed(c, &mut out);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn requests_pass_whole_by_length_and_by_chunks() {
        let two = b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: h\r\n\r\n";
        assert_eq!(run(&[two]), String::from_utf8_lossy(two));
        let chunked = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        // Byte by byte: the same.
        let bytes: Vec<&[u8]> = chunked.chunks(1).collect();
        assert_eq!(run(&bytes), String::from_utf8_lossy(chunked));
    }

    proptest::proptest! {
        /// Well-framed requests pass byte for byte, however they are cut.
        #[test]
        fn well_framed_requests_pass_unchanged(
            bodies in proptest::collection::vec((proptest::collection::vec(proptest::num::u8::ANY, 0..40), proptest::bool::ANY), 1..6),
            cuts in proptest::collection::vec(0usize..600, 0..12),
        ) {
            let mut input = Vec::new();
            for (body, chunked) in &bodies {
                if *chunked {
                    input.extend_from_slice(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
                    for part in body.chunks(7) {
                        input.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                        input.extend_from_slice(part);
                        input.extend_from_slice(b"\r\n");
                    }
                    input.extend_from_slice(b"0\r\n\r\n");
                } else {
                    input.extend_from_slice(format!("POST /l HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
                    input.extend_from_slice(body);
                }
            }
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= input.len()).collect();
            cuts.sort_unstable();
            let mut g = FramingGuard::new("tok".into(), "h".into(), 65536);
            let (mut out, mut at) = (BytesMut::new(), 0);
            for c in cuts {
                g.feed(&input[at..c], &mut out);
                at = c;
            }
            g.feed(&input[at..], &mut out);
            proptest::prop_assert_eq!(&out[..], &input[..]);
        }
    }

    #[test]
    fn a_head_is_held_until_whole() {
        let mut g = FramingGuard::new("tok".into(), "h".into(), 65536);
        let mut out = BytesMut::new();
        g.feed(b"GET / HTTP/1.1\r\nHost: h\r\n", &mut out);
        assert!(out.is_empty());
        g.feed(b"\r\n", &mut out);
        assert_eq!(&out[..], b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    }

    #[test]
    fn ambiguous_framings_become_the_marker_and_nothing_after() {
        for (head, why) in [
            ("POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", "both Content-Length and Transfer-Encoding"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", "both Content-Length and Transfer-Encoding"),
            ("POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n", "two different Content-Length"),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "does not end in one chunked"),
            ("POST / HTTP/1.1\r\nContent-Length: +4\r\n\r\n", "not a number"),
        ] {
            let out = run(&[head.as_bytes(), b"0\r\n\r\nGET /hidden HTTP/1.1\r\n\r\n"]);
            assert!(out.starts_with("GET / HTTP/1.1\r\nHost: api.example.com\r\nx-cairn-framing-refused: tok "), "{out}");
            assert!(out.contains(why) && !out.contains("hidden"), "{head}: {out}");
        }
    }
}
