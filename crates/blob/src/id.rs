//! Object and chunk ids: BLAKE3 hashes, shown as 64 lowercase hex digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The BLAKE3 hash of an object's (uncompressed) content. Chunks, packs and
/// manifests are all named by one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// The id of `data`.
    pub fn of(data: &[u8]) -> ObjectId {
        ObjectId(*blake3::hash(data).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        // Manifests hold one per chunk: no allocation per byte.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 15) as usize] as char);
        }
        s
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", &self.to_hex()[..12])
    }
}

impl FromStr for ObjectId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(format!("{s:?} is not an object id (64 lowercase hex digits)"));
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(ObjectId(out))
    }
}

impl TryFrom<String> for ObjectId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<ObjectId> for String {
    fn from(id: ObjectId) -> String {
        id.to_hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = ObjectId::of(b"hello");
        assert_eq!(id.to_hex().parse::<ObjectId>().unwrap(), id);
        assert!("xyz".parse::<ObjectId>().is_err());
        assert!(id.to_hex().to_uppercase().parse::<ObjectId>().is_err());
    }

    #[test]
    fn debug_shows_the_first_12_hex_digits() {
        let id: ObjectId = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".parse().unwrap();
        assert_eq!(format!("{id:?}"), "ObjectId(001122334455)");
        assert_eq!(id.to_string(), "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    }
}
