use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Lowercase letters and digits without the easily confused `0 1 l o`.
const ALPHABET: &[u8] = b"23456789abcdefghijkmnpqrstuvwxyz";
const RANDOM_LEN: usize = 11;

/// A task id: `t` and 11 random characters, e.g. `t7k3mxq9a2bc`.
///
/// Short enough to type, valid as a hostname (the sandbox's hostname is its
/// task id) and as a path component, and random enough (55 bits) that ids never
/// collide in practice; the store's primary key catches it if one ever does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(String);

/// `prefix` and `len` random characters of [`ALPHABET`].
pub(crate) fn random_id(prefix: char, len: usize) -> String {
    let mut rng = rand::thread_rng();
    let mut s = String::with_capacity(len + 1);
    s.push(prefix);
    for _ in 0..len {
        s.push(ALPHABET[rng.gen_range(0..ALPHABET.len())] as char);
    }
    s
}

/// True when `s` has the shape [`random_id`] makes.
pub(crate) fn has_id_shape(s: &str, prefix: char, len: usize) -> bool {
    s.len() == len + 1 && s.starts_with(prefix) && s.bytes().skip(1).all(|b| ALPHABET.contains(&b))
}

impl TaskId {
    pub fn random() -> Self {
        TaskId(random_id('t', RANDOM_LEN))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `s` has the shape of a task id (as opposed to a task name).
    pub fn looks_like(s: &str) -> bool {
        has_id_shape(s, 't', RANDOM_LEN)
    }
}

impl FromStr for TaskId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if Self::looks_like(s) {
            Ok(TaskId(s.to_owned()))
        } else {
            Err(Error::TaskId(s.to_owned()))
        }
    }
}

impl TryFrom<String> for TaskId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> String {
        id.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_parse_back() {
        for _ in 0..1000 {
            let id = TaskId::random();
            assert_eq!(id.as_str().parse::<TaskId>(), Ok(id.clone()));
            assert!(id.as_str().len() <= 63, "must fit a hostname label");
        }
    }

    #[test]
    fn ids_are_their_text_everywhere() {
        let id: TaskId = "t7k3mxq9a2bc".parse().unwrap();
        assert_eq!((id.to_string(), String::from(id.clone())), ("t7k3mxq9a2bc".to_owned(), "t7k3mxq9a2bc".to_owned()));
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"t7k3mxq9a2bc\"");
        assert_eq!(serde_json::from_str::<TaskId>("\"t7k3mxq9a2bc\"").unwrap(), id);
        assert!(serde_json::from_str::<TaskId>("\"t7k3\"").is_err());
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in ["", "t", "x7k3mxq9a2bc", "t7k3mxq9a2b", "t7k3mxq9a2bcd", "T7K3MXQ9A2BC", "t0k3mxq9a2bc", "t7k3mx/9a2bc"] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad:?} accepted");
        }
    }
}
