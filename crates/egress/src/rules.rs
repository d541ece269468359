//! Per-host request rules and credential injection: what the proxy checks
//! and changes inside the requests to a host it intercepts.
//!
//! - `HOST=METHODS PATH_PREFIX` ([`RequestRule`]): `api.example.com=GET,POST
//!   /repos/acme/`. A host with request rules takes only requests one of
//!   them allows; `*` stands for every method.
//! - `HOST=HEADER: VALUE` ([`Injection`]): the proxy sets `HEADER` on every
//!   request to `HOST`; `VALUE` may name secrets as `{{secret:NAME}}`.
//! - `HOST=$NAME` (also an [`Injection`]): the agent may send the
//!   placeholder `$NAME` in the request line or a header to `HOST`; the
//!   proxy puts the secret's value there on the way out.
//!
//! Secrets appear here by name only; their values are the proxy's
//! ([`crate::proxy::SecretValues`]). A host named in rules or injections is
//! intercepted (TLS terminated by the proxy); every other host stays a
//! plain tunnel.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::policy::Rule;
use crate::{Error, Host, Result};

/// How a secret is referred to in an injected header's value.
const SECRET_OPEN: &str = "{{secret:";
const SECRET_CLOSE: &str = "}}";

/// Headers the proxy owns or that frame the message: never injected.
const NOT_INJECTABLE: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn bad(rule: &str, problem: impl Into<String>) -> Error {
    Error::Rule { rule: rule.to_owned(), problem: problem.into() }
}

/// `HOST=REST`, with `HOST` a name rule (no address: a certificate is
/// made for the name).
fn split_host(rule: &str) -> Result<(Rule, &str)> {
    let Some((host, rest)) = rule.split_once('=') else {
        return Err(bad(rule, "expected HOST=..."));
    };
    let host = Rule::parse(host.trim())?;
    if host.is_address() {
        return Err(bad(rule, "request rules and injection need a host name, not an address"));
    }
    Ok((host, rest.trim()))
}

/// A secret's name: a letter or `_` first, then letters, digits and `_`
/// (as an environment variable's), at most 64.
pub fn is_secret_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first_ok && name.len() <= 64 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `HOST=METHODS PATH_PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RequestRule {
    pub host: Rule,
    /// Upper-case method names; empty for every method (`*`).
    methods: Vec<String>,
    path_prefix: String,
}

impl RequestRule {
    pub fn parse(rule: &str) -> Result<Self> {
        let (host, rest) = split_host(rule)?;
        let Some((methods, path_prefix)) = rest.split_once(' ') else {
            return Err(bad(rule, "expected HOST=METHODS PATH_PREFIX, like api.example.com=GET,POST /repos/acme/"));
        };
        let path_prefix = path_prefix.trim();
        if !path_prefix.starts_with('/') || path_prefix.contains(char::is_whitespace) || path_prefix.contains('?') {
            return Err(bad(rule, format!("path prefix {path_prefix:?} must start with / and hold no spaces or query")));
        }
        if has_dot_segment(path_prefix) {
            return Err(bad(rule, format!("path prefix {path_prefix:?} holds a . or .. segment")));
        }
        let methods = if methods == "*" {
            Vec::new()
        } else {
            let mut list = Vec::new();
            for m in methods.split(',') {
                if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
                    return Err(bad(rule, format!("method {m:?} is not a method name (or give * for every method)")));
                }
                let m = m.to_ascii_uppercase();
                if m == "CONNECT" {
                    return Err(bad(rule, "CONNECT is the proxy's own method"));
                }
                if !list.contains(&m) {
                    list.push(m);
                }
            }
            list
        };
        Ok(RequestRule { host, methods, path_prefix: path_prefix.to_owned() })
    }

    /// Whether this rule allows `method` on `path` (the request target's
    /// path, without its query).
    pub fn allows(&self, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == method)) && path.starts_with(&self.path_prefix)
    }
}

impl fmt::Display for RequestRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods = if self.methods.is_empty() { "*".to_owned() } else { self.methods.join(",") };
        write!(f, "{}={methods} {}", self.host, self.path_prefix)
    }
}

/// One piece of an injected value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Part {
    Text(String),
    Secret(String),
}

/// What an injection does to the requests to its host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Inject {
    /// Set this header (lower-case name) to this value.
    Header { name: String, value: Vec<Part> },
    /// Replace the placeholder `$NAME` with the secret's value.
    Placeholder(String),
}

/// `HOST=HEADER: VALUE` or `HOST=$NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Injection {
    pub host: Rule,
    pub inject: Inject,
}

impl Injection {
    pub fn parse(rule: &str) -> Result<Self> {
        let (host, rest) = split_host(rule)?;
        if let Some(name) = rest.strip_prefix('$') {
            if !is_secret_name(name) {
                return Err(bad(rule, format!("{name:?} is not a secret name (letters, digits and _, not starting with a digit)")));
            }
            return Ok(Injection { host, inject: Inject::Placeholder(name.to_owned()) });
        }
        let Some((name, value)) = rest.split_once(':') else {
            return Err(bad(rule, "expected HOST=HEADER: VALUE or HOST=$SECRET"));
        };
        let name = name.trim().to_ascii_lowercase();
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(bad(rule, format!("{name:?} is not a header name")));
        }
        if NOT_INJECTABLE.contains(&name.as_str()) {
            return Err(bad(rule, format!("header {name} is the proxy's own and cannot be injected")));
        }
        let value = parse_template(rule, value.trim())?;
        Ok(Injection { host, inject: Inject::Header { name, value } })
    }

    /// The secrets this injection uses, by name.
    pub fn secrets(&self) -> Vec<&str> {
        match &self.inject {
            Inject::Placeholder(n) => vec![n.as_str()],
            Inject::Header { value, .. } => value
                .iter()
                .filter_map(|p| match p {
                    Part::Secret(n) => Some(n.as_str()),
                    Part::Text(_) => None,
                })
                .collect(),
        }
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `Bearer {{secret:NAME}}` into its text and secret parts.
fn parse_template(rule: &str, mut value: &str) -> Result<Vec<Part>> {
    if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
        return Err(bad(rule, "a header value holds a control character"));
    }
    let mut parts = Vec::new();
    while let Some(at) = value.find(SECRET_OPEN) {
        if at > 0 {
            parts.push(Part::Text(value[..at].to_owned()));
        }
        let after = &value[at + SECRET_OPEN.len()..];
        let Some(end) = after.find(SECRET_CLOSE) else {
            return Err(bad(rule, "{{secret: without its closing }}"));
        };
        let name = after[..end].trim();
        if !is_secret_name(name) {
            return Err(bad(rule, format!("{name:?} is not a secret name (letters, digits and _, not starting with a digit)")));
        }
        parts.push(Part::Secret(name.to_owned()));
        value = &after[end + SECRET_CLOSE.len()..];
    }
    if !value.is_empty() {
        parts.push(Part::Text(value.to_owned()));
    }
    Ok(parts)
}

impl fmt::Display for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inject {
            Inject::Placeholder(n) => write!(f, "{}=${n}", self.host),
            Inject::Header { name, value } => {
                write!(f, "{}={name}: ", self.host)?;
                for p in value {
                    match p {
                        Part::Text(t) => f.write_str(t)?,
                        Part::Secret(n) => write!(f, "{SECRET_OPEN}{n}{SECRET_CLOSE}")?,
                    }
                }
                Ok(())
            }
        }
    }
}

macro_rules! string_forms {
    ($t:ty) => {
        impl std::str::FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                <$t>::parse(s)
            }
        }
        impl TryFrom<String> for $t {
            type Error = Error;
            fn try_from(s: String) -> Result<Self> {
                <$t>::parse(&s)
            }
        }
        impl From<$t> for String {
            fn from(r: $t) -> String {
                r.to_string()
            }
        }
    };
}
string_forms!(RequestRule);
string_forms!(Injection);

/// Whether a path holds a `.` or `..` segment, also percent-encoded, or an
/// encoded `/` or `\`: a path prefix cannot be trusted over such a path
/// (the upstream may resolve it to somewhere else).
pub fn has_dot_segment(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains('\\') {
        return true;
    }
    let decoded = lower.replace("%2e", ".");
    decoded.split('/').any(|s| s == "." || s == "..")
}

/// What a task's rules say about one host and port: the request rules and
/// injections that cover it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRules {
    pub requests: Vec<RequestRule>,
    pub injections: Vec<Injection>,
}

impl HostRules {
    /// Whether the proxy must look inside this host's requests.
    pub fn intercepts(&self) -> bool {
        !self.requests.is_empty() || !self.injections.is_empty()
    }

    /// `Ok(rule)` naming the request rule that allows `method` on `path`
    /// ("" when the host has no request rules), or the reason it is refused.
    pub fn check(&self, method: &str, path: &str) -> std::result::Result<String, String> {
        if self.requests.is_empty() {
            return Ok(String::new());
        }
        if has_dot_segment(path) {
            return Err(format!("path {path:?} holds a . or .. segment or an encoded separator; the request rules cannot be applied to it"));
        }
        match self.requests.iter().find(|r| r.allows(method, path)) {
            Some(r) => Ok(r.to_string()),
            None => {
                let rules: Vec<String> = self.requests.iter().map(ToString::to_string).collect();
                Err(format!("{method} {path} is allowed by no request rule ({})", rules.join("; ")))
            }
        }
    }

    /// Every secret these injections use, by name, each once.
    pub fn secrets(&self) -> Vec<String> {
        secret_names(&self.injections)
    }
}

/// Every secret `injections` use, by name, each once, in order.
pub fn secret_names(injections: &[Injection]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in injections.iter().flat_map(Injection::secrets) {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_owned());
        }
    }
    out
}

/// The rules that cover `host` on `port` among `requests` and `injections`.
pub fn rules_for(requests: &[RequestRule], injections: &[Injection], host: &Host, port: u16) -> HostRules {
    HostRules {
        requests: requests.iter().filter(|r| r.host.covers(host, port)).cloned().collect(),
        injections: injections.iter().filter(|i| i.host.covers(host, port)).cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn request_rules_parse_and_allow_by_method_and_prefix() {
        let r = RequestRule::parse("API.example.com=get,POST /repos/acme/").unwrap();
        assert_eq!(r.to_string(), "api.example.com=GET,POST /repos/acme/");
        assert!(r.allows("GET", "/repos/acme/tool"));
        assert!(r.allows("POST", "/repos/acme/"));
        assert!(!r.allows("DELETE", "/repos/acme/tool"));
        assert!(!r.allows("GET", "/repos/other/"));
        let any = RequestRule::parse("api.example.com=* /").unwrap();
        assert!(any.allows("PATCH", "/x"));
        assert_eq!(any.to_string(), "api.example.com=* /");
        for (rule, problem) in [
            ("api.example.com", "HOST=..."),
            ("api.example.com=GET", "METHODS PATH_PREFIX"),
            ("api.example.com=GET repos/", "must start with /"),
            ("api.example.com=G3T /", "not a method name"),
            ("api.example.com=CONNECT /", "CONNECT"),
            ("api.example.com=GET /a/../b", ". or .. segment"),
            ("192.0.2.1=GET /", "not an address"),
            ("api.example.com=GET /a?b", "query"),
        ] {
            let e = RequestRule::parse(rule).unwrap_err().to_string();
            assert!(e.contains(problem) && e.contains(rule), "{rule}: {e}");
        }
    }

    #[test]
    fn injections_parse_headers_with_secrets_and_placeholders() {
        let i = Injection::parse("api.example.com=Authorization: Bearer {{secret:GITHUB_TOKEN}}").unwrap();
        assert_eq!(i.to_string(), "api.example.com=authorization: Bearer {{secret:GITHUB_TOKEN}}");
        assert_eq!(i.secrets(), vec!["GITHUB_TOKEN"]);
        assert_eq!(
            i.inject,
            Inject::Header { name: "authorization".into(), value: vec![Part::Text("Bearer ".into()), Part::Secret("GITHUB_TOKEN".into())] }
        );
        let p = Injection::parse("*.example.com=$TOKEN").unwrap();
        assert_eq!(p.inject, Inject::Placeholder("TOKEN".into()));
        assert_eq!(p.to_string(), "*.example.com=$TOKEN");
        let plain = Injection::parse("api.example.com=X-Team: acme").unwrap();
        assert!(plain.secrets().is_empty());
        for (rule, problem) in [
            ("api.example.com=Authorization Bearer", "HEADER: VALUE"),
            ("api.example.com=Host: evil.example", "cannot be injected"),
            ("api.example.com=Content-Length: 1", "cannot be injected"),
            ("api.example.com=X-A: {{secret:1BAD}}", "not a secret name"),
            ("api.example.com=X-A: {{secret:T", "closing"),
            ("api.example.com=$", "not a secret name"),
            ("api.example.com=X A: b", "not a header name"),
            ("api.example.com=X-A: a\u{1}b", "control character"),
        ] {
            let e = Injection::parse(rule).unwrap_err().to_string();
            assert!(e.contains(problem), "{rule}: {e}");
        }
    }

    #[test]
    fn host_rules_decide_and_name_the_rule() {
        let requests = vec![RequestRule::parse("api.example.com=GET /repos/acme/").unwrap()];
        let injections = vec![
            Injection::parse("api.example.com=Authorization: Bearer {{secret:A}}").unwrap(),
            Injection::parse("*.git.example.com=$B").unwrap(),
            Injection::parse("*.git.example.com=X-Also: {{secret:A}}").unwrap(),
        ];
        let r = rules_for(&requests, &injections, &h("api.example.com"), 443);
        assert!(r.intercepts());
        assert_eq!(r.injections.len(), 1);
        assert_eq!(r.check("GET", "/repos/acme/x"), Ok("api.example.com=GET /repos/acme/".into()));
        let e = r.check("POST", "/repos/acme/x").unwrap_err();
        assert!(e.contains("POST /repos/acme/x") && e.contains("api.example.com=GET /repos/acme/"), "{e}");
        assert!(r.check("GET", "/repos/acme/../other").unwrap_err().contains(". or .."));
        assert!(r.check("GET", "/repos/acme/%2e%2E/other").is_err());
        assert!(r.check("GET", "/repos/acme%2fx").is_err());
        assert!(!rules_for(&requests, &injections, &h("git.example.com"), 443).intercepts(), "a wildcard covers subdomains only, not the name itself");
        let sub = rules_for(&requests, &injections, &h("a.git.example.com"), 443);
        assert_eq!(sub.secrets(), vec!["B".to_owned(), "A".to_owned()]);
        assert_eq!(sub.check("DELETE", "/anything"), Ok(String::new()), "no request rules: every request");
        assert!(!rules_for(&requests, &injections, &h("other.test"), 443).intercepts());
        assert!(!rules_for(&requests, &injections, &h("api.example.com"), 22).intercepts(), "a rule without a port covers 80 and 443");
    }
}
