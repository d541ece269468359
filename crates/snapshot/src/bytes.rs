//! Byte strings (file names, link targets, xattr names and values) in the
//! manifest: a JSON string when they are UTF-8, else `{"hex": "…"}`. The two
//! forms are distinct JSON types, so any byte string round-trips exactly.

use std::fmt;
use std::ops::Deref;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An owned byte string with the lossless serde form above.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteBuf(pub Vec<u8>);

impl Deref for ByteBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for ByteBuf {
    fn from(b: &[u8]) -> ByteBuf {
        ByteBuf(b.to_vec())
    }
}

impl From<&str> for ByteBuf {
    fn from(s: &str) -> ByteBuf {
        ByteBuf(s.as_bytes().to_vec())
    }
}

impl fmt::Debug for ByteBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl Serialize for ByteBuf {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_bytes(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for ByteBuf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteBuf, D::Error> {
        deserialize_bytes(d).map(ByteBuf)
    }
}

#[derive(Serialize)]
struct HexOut {
    hex: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Repr {
    Utf8(String),
    Hex { hex: String },
}

fn serialize_bytes<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(b) {
        Ok(text) => s.serialize_str(text),
        Err(_) => HexOut { hex: b.iter().map(|x| format!("{x:02x}")).collect() }.serialize(s),
    }
}

fn deserialize_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    match Repr::deserialize(d)? {
        Repr::Utf8(s) => Ok(s.into_bytes()),
        Repr::Hex { hex } => {
            let hex = hex.as_bytes();
            if hex.len() % 2 != 0 {
                return Err(serde::de::Error::custom("odd-length hex byte string"));
            }
            hex.chunks(2)
                .map(|pair| {
                    std::str::from_utf8(pair)
                        .ok()
                        .and_then(|p| u8::from_str_radix(p, 16).ok())
                        .ok_or_else(|| serde::de::Error::custom("invalid hex byte string"))
                })
                .collect()
        }
    }
}

/// `#[serde(with = "crate::bytes::path")]` for `PathBuf` fields.
pub mod path {
    use super::*;

    pub fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        serialize_bytes(p.as_os_str().as_bytes(), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        deserialize_bytes(d).map(|b| PathBuf::from(std::ffi::OsString::from_vec(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct T {
        #[serde(with = "path")]
        p: PathBuf,
        b: ByteBuf,
    }

    #[test]
    fn utf8_as_strings_other_bytes_as_hex() {
        let t = T { p: PathBuf::from(std::ffi::OsString::from_vec(b"a/\xff\x00z".to_vec())), b: ByteBuf::from("yes") };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#"{"p":{"hex":"612fff007a"},"b":"yes"}"#);
        assert_eq!(serde_json::from_str::<T>(&json).unwrap(), t);
        // A UTF-8 string that looks like hex stays a string.
        let t2 = T { p: "612f".into(), b: ByteBuf(vec![0xc3]) };
        let json2 = serde_json::to_string(&t2).unwrap();
        assert_eq!(serde_json::from_str::<T>(&json2).unwrap(), t2);
        assert!(serde_json::from_str::<T>(r#"{"p":{"hex":"6"},"b":""}"#).is_err());
    }

    #[test]
    fn a_byte_buf_is_its_bytes() {
        let b = ByteBuf::from(&b"a\xffz"[..]);
        assert_eq!(b.0, b"a\xffz");
        assert_eq!(&*b, b"a\xffz", "derefs to the bytes");
        assert_eq!(b.len(), 3);
        assert_eq!(&*ByteBuf::from(""), b"");
        assert_eq!(format!("{b:?}"), "\"a\u{fffd}z\"", "Debug shows the bytes as lossy text");
        assert_eq!(format!("{:?}", ByteBuf::from("user.x")), "\"user.x\"");
    }
}
