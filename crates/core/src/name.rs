//! File names as the API shows them. A Linux name is bytes, and not every
//! name is UTF-8; JSON text is. A name that is UTF-8 is shown as it is; one
//! that is not is shown with each byte that is not part of valid UTF-8
//! written `\xNN`, and carried losslessly beside it in base64.

use std::borrow::Cow;

/// `bytes` as text: itself when it is UTF-8, else with each byte outside
/// valid UTF-8 written `\xNN` (so `caf\xe9` for Latin-1 `café`).
pub fn escaped(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    Cow::Owned(out)
}

/// The name's bytes in standard base64 when they are not UTF-8 (the
/// lossless form beside [`escaped`]); `None` for a UTF-8 name, whose text is
/// already exact.
pub fn bytes_if_not_utf8(bytes: &[u8]) -> Option<String> {
    use base64::Engine;
    std::str::from_utf8(bytes).is_err().then(|| base64::engine::general_purpose::STANDARD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_utf8_name_is_itself_and_another_is_escaped_with_its_bytes_beside() {
        assert_eq!(escaped("café \\x".as_bytes()), "café \\x");
        assert!(matches!(escaped(b"plain"), Cow::Borrowed(_)));
        assert_eq!(bytes_if_not_utf8("café".as_bytes()), None);
        assert_eq!(escaped(b"caf\xe9"), "caf\\xe9");
        assert_eq!(escaped(b"\xff\xfe-\xc3\xa9-\xe2\x82"), "\\xff\\xfe-\u{e9}-\\xe2\\x82");
        assert_eq!(bytes_if_not_utf8(b"caf\xe9").as_deref(), Some("Y2Fm6Q=="));
    }
}
