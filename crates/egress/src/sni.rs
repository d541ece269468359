//! The server name a TLS client asks for, read from its ClientHello before
//! any bytes are forwarded, so a tunnel to an allowed `host:port` cannot be
//! used to reach another name behind the same address.
//!
//! A byte parser, not a TLS stack: it reads TLS records of type handshake,
//! joins their fragments until the first handshake message is complete, and
//! walks that ClientHello down to the `server_name` extension (RFC 8446
//! section 4.1.2, RFC 6066 section 3). Every read is bounds-checked.

use crate::{Error, Result};

/// Largest ClientHello accepted (handshake message, with its 4-byte header).
/// Real ones are well under this, even with post-quantum key shares.
pub const MAX_HANDSHAKE: usize = 16 * 1024;
/// TLS records carry at most 2^14 bytes of plaintext.
const MAX_RECORD: usize = 1 << 14;
const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the proxy needs from a ClientHello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The `host_name` from the server_name extension, as sent (ASCII;
    /// callers normalise it). `None` if the client sent no SNI.
    pub sni: Option<String>,
}

fn not_tls(problem: impl Into<String>) -> Error {
    Error::NotTls {
        problem: problem.into(),
    }
}

fn not_hello(msg_type: u8) -> Error {
    not_tls(format!(
        "first handshake message has type {msg_type}, not ClientHello (1)"
    ))
}

fn malformed(problem: impl Into<String>) -> Error {
    Error::MalformedHello {
        problem: problem.into(),
    }
}

/// Parse the ClientHello at the start of `buf`, the bytes the client sent
/// so far. `Ok(None)` means it is not complete yet: read more and call
/// again with the whole buffer. Bytes after the ClientHello are ignored.
pub fn parse_client_hello(buf: &[u8]) -> Result<Option<ClientHello>> {
    let mut message: Vec<u8> = Vec::new();
    let mut rest = buf;
    loop {
        // Judge each header byte as soon as it arrives, so plaintext sent
        // into a tunnel is refused without waiting for five bytes.
        if let Some(&ty) = rest.first() {
            if ty != CONTENT_HANDSHAKE {
                return Err(not_tls(format!(
                    "record type {ty} where a handshake record (22) was expected"
                )));
            }
        }
        if let Some(&major) = rest.get(1) {
            if major != 3 {
                return Err(not_tls(format!("record version major {major}, expected 3")));
            }
        }
        let Some(header) = rest.get(..RECORD_HEADER) else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 {
            return Err(malformed("empty handshake record"));
        }
        if len > MAX_RECORD {
            return Err(malformed(format!(
                "record length {len} exceeds {MAX_RECORD}"
            )));
        }
        let Some(fragment) = rest.get(RECORD_HEADER..RECORD_HEADER + len) else {
            // Check the message type early too, before the record is whole.
            if let (true, Some(&msg_type)) = (message.is_empty(), rest.get(RECORD_HEADER)) {
                if msg_type != HANDSHAKE_CLIENT_HELLO {
                    return Err(not_hello(msg_type));
                }
            }
            return Ok(None);
        };
        rest = rest.get(RECORD_HEADER + len..).unwrap_or_default();
        message.extend_from_slice(fragment);

        if let Some(&msg_type) = message.first() {
            if msg_type != HANDSHAKE_CLIENT_HELLO {
                return Err(not_hello(msg_type));
            }
        }
        let Some(hs_header) = message.get(..4) else {
            continue;
        };
        let body_len = usize::from(hs_header[1]) << 16
            | usize::from(hs_header[2]) << 8
            | usize::from(hs_header[3]);
        if body_len + 4 > MAX_HANDSHAKE {
            return Err(Error::TooLarge {
                what: "TLS ClientHello",
                limit: MAX_HANDSHAKE,
            });
        }
        if let Some(body) = message.get(4..4 + body_len) {
            return parse_body(body).map(Some);
        }
    }
}

/// A cursor over a byte slice whose reads fail instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let Some(head) = self.buf.get(..n) else {
            return Err(malformed(format!(
                "{field} in {} needs {n} bytes, {} left",
                self.what,
                self.buf.len()
            )));
        };
        self.buf = self.buf.get(n..).unwrap_or_default();
        Ok(head)
    }

    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?.first().copied().unwrap_or_default())
    }

    fn u16(&mut self, field: &str) -> Result<u16> {
        let b = self.take(2, field)?;
        match b {
            [hi, lo] => Ok(u16::from_be_bytes([*hi, *lo])),
            _ => Err(malformed(format!("{field}: short read"))),
        }
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.u8(field)?;
        self.take(usize::from(n), field)
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.u16(field)?;
        self.take(usize::from(n), field)
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

fn parse_body(body: &[u8]) -> Result<ClientHello> {
    let mut r = Reader::new(body, "ClientHello");
    r.u16("legacy_version")?;
    r.take(32, "random")?;
    // The legacy resumption id (32 bytes at most).
    let legacy_id = r.vec8("legacy resumption id")?;
    if legacy_id.len() > 32 {
        return Err(malformed(format!(
            "legacy resumption id of {} bytes (at most 32)",
            legacy_id.len()
        )));
    }
    let suites = r.vec16("cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(malformed(format!(
            "cipher_suites length {} (must be even and non-zero)",
            suites.len()
        )));
    }
    if r.vec8("compression_methods")?.is_empty() {
        return Err(malformed("no compression methods"));
    }
    // Very old clients may stop here: no extensions, so no SNI.
    if r.is_empty() {
        return Ok(ClientHello { sni: None });
    }
    let extensions = r.vec16("extensions")?;
    if !r.is_empty() {
        return Err(malformed("bytes after the extensions"));
    }

    let mut exts = Reader::new(extensions, "extensions");
    let mut sni = None;
    let mut seen_server_name = false;
    while !exts.is_empty() {
        let ty = exts.u16("extension type")?;
        let data = exts.vec16("extension data")?;
        if ty != EXT_SERVER_NAME {
            continue;
        }
        // Two server_name extensions could be read differently by the
        // proxy and the server; RFC 8446 forbids duplicates anyway.
        if seen_server_name {
            return Err(malformed("two server_name extensions"));
        }
        seen_server_name = true;
        sni = parse_server_name(data)?;
    }
    Ok(ClientHello { sni })
}

/// The server_name extension body: a list of (name_type, name) entries, of
/// which at most one host_name (RFC 6066).
fn parse_server_name(data: &[u8]) -> Result<Option<String>> {
    let mut outer = Reader::new(data, "server_name extension");
    let list = outer.vec16("server_name_list")?;
    if !outer.is_empty() {
        return Err(malformed("bytes after server_name_list"));
    }
    if list.is_empty() {
        return Err(malformed("empty server_name_list"));
    }
    let mut entries = Reader::new(list, "server_name_list");
    let mut host = None;
    while !entries.is_empty() {
        let name_type = entries.u8("name_type")?;
        let name = entries.vec16("server name")?;
        if name_type != NAME_TYPE_HOST_NAME {
            continue;
        }
        if host.is_some() {
            return Err(malformed("two host_name entries"));
        }
        if name.is_empty() {
            return Err(malformed("empty host_name"));
        }
        if let Some(b) = name.iter().find(|b| !b.is_ascii_graphic()) {
            return Err(malformed(format!(
                "host_name contains byte 0x{b:02x} (must be printable ASCII)"
            )));
        }
        // Printable ASCII checked above, so this is valid UTF-8.
        let name = std::str::from_utf8(name).map_err(|_| malformed("host_name is not ASCII"))?;
        host = Some(name.to_owned());
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A real ClientHello as rustls writes it, one TLS record.
    fn rustls_hello(sni: Option<&str>) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        // With SNI off rustls still needs a name to verify against.
        config.enable_sni = sni.is_some();
        let name = rustls::pki_types::ServerName::try_from(sni.unwrap_or("example.net"))
            .unwrap()
            .to_owned();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    /// Re-frame one record's handshake payload into records of the given
    /// payload sizes (the last takes the remainder).
    fn reframe(record: &[u8], sizes: &[usize]) -> Vec<u8> {
        let payload = &record[5..];
        let mut out = Vec::new();
        let mut at = 0;
        for (i, &n) in sizes.iter().chain(std::iter::once(&usize::MAX)).enumerate() {
            let end = if i == sizes.len() {
                payload.len()
            } else {
                (at + n).min(payload.len())
            };
            if end == at {
                break;
            }
            let chunk = &payload[at..end];
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
            at = end;
        }
        out
    }

    /// Hand-assembled ClientHello record with the given extensions block
    /// (None: no extensions field at all).
    fn hand_hello(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // empty legacy resumption id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        if let Some(ext) = extensions {
            body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            body.extend_from_slice(ext);
        }
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    fn sni_ext(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (ty, name) in entries {
            list.push(*ty);
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        let mut ext = vec![0, 0];
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(&data);
        ext
    }

    fn sni_of(buf: &[u8]) -> Option<String> {
        parse_client_hello(buf).unwrap().unwrap().sni
    }

    #[test]
    fn rustls_sni_found() {
        let hello = rustls_hello(Some("api.example.com"));
        assert_eq!(sni_of(&hello).as_deref(), Some("api.example.com"));
        // Trailing bytes (the next record) do not matter.
        let mut more = hello.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(sni_of(&more).as_deref(), Some("api.example.com"));
    }

    #[test]
    fn rustls_no_sni() {
        assert_eq!(sni_of(&rustls_hello(None)), None);
    }

    #[test]
    fn hand_built_hellos() {
        let ext = sni_ext(&[(0, b"Example.COM")]);
        assert_eq!(
            sni_of(&hand_hello(Some(&ext))).as_deref(),
            Some("Example.COM")
        );
        assert_eq!(sni_of(&hand_hello(None)), None);
        assert_eq!(sni_of(&hand_hello(Some(&[]))), None);
        // Another extension first, and an unknown name type is skipped.
        let mut ext = vec![0, 10, 0, 2, 0, 0];
        ext.extend_from_slice(&sni_ext(&[(1, b"x"), (0, b"a.b")]));
        assert_eq!(sni_of(&hand_hello(Some(&ext))).as_deref(), Some("a.b"));
    }

    #[test]
    fn every_split_point() {
        let hello = rustls_hello(Some("split.example.org"));
        for cut in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..cut]).unwrap(),
                None,
                "cut {cut}"
            );
        }
        assert_eq!(sni_of(&hello).as_deref(), Some("split.example.org"));
    }

    #[test]
    fn across_records() {
        let hello = rustls_hello(Some("multi.example.org"));
        // Two records, split inside the handshake header and inside the body.
        for sizes in [
            vec![2],
            vec![4],
            vec![60],
            vec![1, 1, 1, 1, 1],
            vec![100, 7],
        ] {
            let framed = reframe(&hello, &sizes);
            assert_eq!(
                sni_of(&framed).as_deref(),
                Some("multi.example.org"),
                "{sizes:?}"
            );
            for cut in 0..framed.len() {
                assert_eq!(parse_client_hello(&framed[..cut]).unwrap(), None);
            }
        }
        // Every payload byte in its own record.
        let framed = reframe(&hello, &vec![1; hello.len()]);
        assert_eq!(sni_of(&framed).as_deref(), Some("multi.example.org"));
    }

    #[test]
    fn not_tls() {
        for garbage in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\x16\x04",
            b"\x17\x03\x03\x00\x01x",
            b"SSH-2.0",
        ] {
            assert!(
                matches!(parse_client_hello(garbage), Err(Error::NotTls { .. })),
                "{garbage:?}"
            );
        }
        // A handshake record that is not a ClientHello (ServerHello = 2).
        let mut hello = rustls_hello(Some("a.example"));
        hello[5] = 2;
        assert!(matches!(
            parse_client_hello(&hello),
            Err(Error::NotTls { .. })
        ));
        // Refused from the first byte alone.
        assert!(matches!(
            parse_client_hello(b"G"),
            Err(Error::NotTls { .. })
        ));
        assert!(matches!(
            parse_client_hello(&hello[..6]),
            Err(Error::NotTls { .. })
        ));
        // A later record that is not a handshake.
        let hello = rustls_hello(Some("a.example"));
        let mut framed = reframe(&hello, &[10]);
        framed[5 + 10] = 23;
        assert!(matches!(
            parse_client_hello(&framed),
            Err(Error::NotTls { .. })
        ));
    }

    fn is_malformed(buf: &[u8]) -> bool {
        matches!(parse_client_hello(buf), Err(Error::MalformedHello { .. }))
    }

    #[test]
    fn malformed_lengths() {
        assert!(is_malformed(&[22, 3, 1, 0, 0]));
        assert!(is_malformed(&[22, 3, 1, 0x40, 0x01]));
        let good = hand_hello(Some(&sni_ext(&[(0, b"a.example")])));
        // Body length one short / one long of what the fields add up to: the
        // short one ends inside the extensions, the long one needs more bytes.
        let mut short = good.clone();
        short[8] -= 1;
        short[4] -= 1;
        short.pop();
        assert!(is_malformed(&short));
        let mut long = good.clone();
        long[8] += 1;
        assert_eq!(parse_client_hello(&long).unwrap(), None);
        // Extension block length wrong.
        let ext = sni_ext(&[(0, b"a.example")]);
        let mut bad_ext = ext.clone();
        bad_ext[3] += 1;
        assert!(is_malformed(&hand_hello(Some(&bad_ext))));
        // server_name list length disagreeing with the extension length.
        let mut bad_list = ext.clone();
        bad_list[5] -= 1;
        assert!(is_malformed(&hand_hello(Some(&bad_list))));
        // Bad legacy resumption id and cipher suite lengths.
        let mut h = hand_hello(None);
        h[9 + 2 + 32] = 33;
        assert!(is_malformed(&h));
        let mut h = hand_hello(None);
        h[9 + 2 + 32 + 2] = 3;
        assert!(is_malformed(&h));
        // Empty, duplicated and non-ASCII names.
        assert!(is_malformed(&hand_hello(Some(&sni_ext(&[(0, b"")])))));
        assert!(is_malformed(&hand_hello(Some(&sni_ext(&[
            (0, b"a"),
            (0, b"b")
        ])))));
        assert!(is_malformed(&hand_hello(Some(&sni_ext(&[(0, b"a b")])))));
        assert!(is_malformed(&hand_hello(Some(&sni_ext(&[(
            0,
            "é".as_bytes()
        )])))));
        let mut two = sni_ext(&[(0, b"a")]);
        two.extend_from_slice(&sni_ext(&[(0, b"b")]));
        assert!(is_malformed(&hand_hello(Some(&two))));
        // Every truncation of the hand-built hello is None, never a panic.
        for cut in 0..good.len() {
            assert_eq!(parse_client_hello(&good[..cut]).unwrap(), None);
        }
    }

    #[test]
    fn oversized() {
        // A handshake header announcing more than the limit is refused at once.
        let rec = [22, 3, 1, 0, 4, 1, 0, 0x40, 0x00];
        assert!(matches!(
            parse_client_hello(&rec),
            Err(Error::TooLarge { .. })
        ));
        // A padded ClientHello just over the limit, spread over records.
        let pad = vec![0u8; MAX_HANDSHAKE];
        let mut ext = vec![0, 21];
        ext.extend_from_slice(&((MAX_HANDSHAKE - 100) as u16).to_be_bytes());
        ext.extend_from_slice(&pad[..MAX_HANDSHAKE - 100]);
        let framed = reframe(&hand_hello(Some(&ext)), &[8000]);
        assert!(parse_client_hello(&framed).unwrap().is_some());
        let mut ext = vec![0, 21];
        ext.extend_from_slice(&(MAX_HANDSHAKE as u16).to_be_bytes());
        ext.extend_from_slice(&pad);
        let framed = reframe(&hand_hello(Some(&ext)), &[8000, 8000]);
        assert!(matches!(
            parse_client_hello(&framed),
            Err(Error::TooLarge { .. })
        ));
    }
}
