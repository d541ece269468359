//! Allow and deny rules for destinations, and the decision for one request.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::host::{normalise, parse_ip_literal};
use crate::rules::{HostRules, Injection, RequestRule};
use crate::{Error, Host, Result};

/// Ports an allow rule without a port covers: plain and TLS HTTP.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Which names a rule covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Pattern {
    /// Exactly this name.
    Exact(Host),
    /// Names strictly below this one (`*.example.com`), never the name itself.
    Subdomains(Host),
    /// Requests that name this address as an IP literal, in any spelling.
    Address(std::net::IpAddr),
}

/// One `HOST[:PORT]` rule: `example.com`, `*.example.com`, `example.com:8443`.
///
/// A wildcard is only a whole leftmost `*.` label over a name of at least
/// two labels: `*.com` would open a whole top-level domain. (`*.co.uk` is
/// not caught: that needs the public suffix list.)
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Rule {
    pattern: Pattern,
    port: Option<u16>,
}

impl Rule {
    pub fn parse(rule: &str) -> Result<Self> {
        let bad = |problem: &str| Error::Rule {
            rule: rule.to_owned(),
            problem: problem.to_owned(),
        };
        // An address, alone (`192.0.2.1`, `::1`, `[::1]`) or with a port
        // (`192.0.2.1:8443`, `[::1]:443`): allows exactly that address.
        if let Some(ip) = parse_ip_literal(rule) {
            return Ok(Rule { pattern: Pattern::Address(ip), port: None });
        }
        if let Some((addr, p)) = rule.rsplit_once(':') {
            if let Some(ip) = parse_ip_literal(addr).filter(|_| !addr.contains(':') || addr.starts_with('[')) {
                return Ok(Rule { pattern: Pattern::Address(ip), port: Some(parse_port(rule, p)?) });
            }
        }
        if rule.strip_prefix("*.").and_then(parse_ip_literal).is_some() {
            return Err(bad("a wildcard cannot stand over an IP address"));
        }
        let (name, port) = match rule.split_once(':') {
            Some((n, p)) => (n, Some(parse_port(rule, p)?)),
            None => (rule, None),
        };
        let pattern = if let Some(base) = name.strip_prefix("*.") {
            let base = normalise(base)?;
            if base.labels() < 2 {
                return Err(bad(
                    "a wildcard needs a name of at least two labels under it, like *.example.com",
                ));
            }
            Pattern::Subdomains(base)
        } else if name.contains('*') {
            return Err(bad(
                "a wildcard is only allowed as the whole leftmost label, like *.example.com",
            ));
        } else {
            Pattern::Exact(normalise(name)?)
        };
        Ok(Rule { pattern, port })
    }

    /// Whether the rule names an address rather than names.
    pub fn is_address(&self) -> bool {
        matches!(self.pattern, Pattern::Address(_))
    }

    /// Whether this rule, as an allow rule, covers `host` on `port`.
    pub fn covers(&self, host: &Host, port: u16) -> bool {
        self.matches(host, port, false)
    }

    /// Whether this rule covers `host`; `any_port` makes a rule without a
    /// port cover every port (deny rules) instead of the default ones.
    fn matches(&self, host: &Host, port: u16, any_port: bool) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => any_port || DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match &self.pattern {
                Pattern::Exact(h) => h == host,
                Pattern::Address(ip) => host.ip() == Some(*ip),
                Pattern::Subdomains(base) => host
                    .as_str()
                    .strip_suffix(base.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            }
    }
}

fn parse_port(rule: &str, p: &str) -> Result<u16> {
    let bad = || Error::Port {
        rule: rule.to_owned(),
        port: p.to_owned(),
    };
    // Digits only: `u16::from_str` would also take "+443".
    if p.is_empty() || p.len() > 5 || !p.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad()),
        Ok(n) => Ok(n),
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Pattern::Exact(h) => write!(f, "{h}")?,
            Pattern::Subdomains(h) => write!(f, "*.{h}")?,
            Pattern::Address(ip) => write!(f, "{}", Host::address(*ip))?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl FromStr for Rule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Rule::parse(s)
    }
}

impl TryFrom<String> for Rule {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        Rule::parse(&s)
    }
}

impl From<Rule> for String {
    fn from(r: Rule) -> String {
        r.to_string()
    }
}

/// A task's egress policy. Deny wins over allow; nothing is allowed unless
/// a rule allows it. A deny rule without a port denies every port (a bare
/// name there means "never this host"); an allow rule without one allows
/// only ports 80 and 443.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub allow: Vec<Rule>,
    #[serde(default)]
    pub deny: Vec<Rule>,
    /// Per-host request rules: a host they cover takes only what they allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RequestRule>,
    /// Headers set and placeholders replaced in the requests to a host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injections: Vec<Injection>,
}

/// The answer for one destination, with what to write in the decision log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    /// The rule that decided, in its normalised form; `None` for the default.
    pub rule: Option<String>,
    pub reason: String,
}

impl Policy {
    /// Parse rule strings; the first invalid one is the error.
    pub fn parse<S: AsRef<str>>(allow: &[S], deny: &[S]) -> Result<Self> {
        let rules = |v: &[S]| {
            v.iter()
                .map(|r| Rule::parse(r.as_ref()))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Policy {
            allow: rules(allow)?,
            deny: rules(deny)?,
            requests: Vec::new(),
            injections: Vec::new(),
        })
    }

    /// Adds request rules and injections (`HOST=...` strings). Each must
    /// name a host an allow rule covers: they refine what is allowed,
    /// never widen it.
    pub fn with_requests<S: AsRef<str>>(mut self, requests: &[S], injections: &[S]) -> Result<Self> {
        for r in requests {
            self.requests.push(RequestRule::parse(r.as_ref())?);
        }
        for i in injections {
            self.injections.push(Injection::parse(i.as_ref())?);
        }
        let hosts = self.requests.iter().map(|r| (&r.host, r.to_string())).chain(self.injections.iter().map(|i| (&i.host, i.to_string())));
        for (host, text) in hosts {
            // The same rule, or a name every allowed port of which the
            // policy allows (`api.example.com` under `*.example.com`).
            let allowed = |h: &Host, ports: &[u16]| ports.iter().all(|p| self.decide(h, *p).allowed);
            let covered = self.allow.contains(host)
                || match (&host.pattern, host.port) {
                    (Pattern::Exact(h), Some(p)) => allowed(h, &[p]),
                    (Pattern::Exact(h), None) => allowed(h, &DEFAULT_PORTS),
                    _ => false,
                };
            if !covered {
                return Err(Error::Rule { rule: text, problem: format!("no allow rule {host}: allow the host first (--allow {host})") });
            }
        }
        Ok(self)
    }

    /// The request rules and injections that cover `host` on `port`.
    pub fn rules_for(&self, host: &Host, port: u16) -> HostRules {
        crate::rules::rules_for(&self.requests, &self.injections, host, port)
    }

    /// Every secret the injections name, each once.
    pub fn secrets(&self) -> Vec<String> {
        crate::rules::secret_names(&self.injections)
    }

    pub fn decide(&self, host: &Host, port: u16) -> Decision {
        if let Some(r) = self.deny.iter().find(|r| r.matches(host, port, true)) {
            return Decision {
                allowed: false,
                rule: Some(r.to_string()),
                reason: format!("denied by rule {r}"),
            };
        }
        if let Some(r) = self.allow.iter().find(|r| r.matches(host, port, false)) {
            return Decision {
                allowed: true,
                rule: Some(r.to_string()),
                reason: format!("allowed by rule {r}"),
            };
        }
        let reason = match host.ip() {
            Some(ip) => format!("IP literals are not allowed unless a rule names the address ({ip})"),
            None => "no rule allows it".to_owned(),
        };
        Decision {
            allowed: false,
            rule: None,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy::parse(allow, deny).unwrap()
    }

    #[test]
    fn exact_rule_matches_only_that_name_on_default_ports() {
        let p = policy(&["example.com"], &[]);
        assert!(p.decide(&h("example.com"), 443).allowed);
        assert!(p.decide(&h("EXAMPLE.com."), 80).allowed);
        assert!(!p.decide(&h("example.com"), 22).allowed);
        assert!(!p.decide(&h("www.example.com"), 443).allowed);
        assert!(!p.decide(&h("badexample.com"), 443).allowed);
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let p = policy(&["*.example.com"], &[]);
        assert!(p.decide(&h("a.example.com"), 443).allowed);
        assert!(p.decide(&h("a.b.example.com"), 443).allowed);
        assert!(!p.decide(&h("example.com"), 443).allowed);
        assert!(!p.decide(&h("badexample.com"), 443).allowed);
        assert!(!p.decide(&h("a.badexample.com"), 443).allowed);
        assert!(!p.decide(&h("example.com.evil.net"), 443).allowed);
    }

    #[test]
    fn port_rules() {
        let p = policy(&["example.com:8443"], &[]);
        assert!(p.decide(&h("example.com"), 8443).allowed);
        assert!(!p.decide(&h("example.com"), 443).allowed);
        let p = policy(&["*.example.com:22"], &[]);
        assert!(p.decide(&h("git.example.com"), 22).allowed);
        assert!(!p.decide(&h("git.example.com"), 443).allowed);
    }

    #[test]
    fn deny_wins_and_covers_every_port() {
        let p = policy(
            &["*.example.com", "*.example.com:8443"],
            &["bad.example.com"],
        );
        let d = p.decide(&h("bad.example.com"), 443);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                rule: Some("bad.example.com".into()),
                reason: "denied by rule bad.example.com".into()
            }
        );
        assert!(!p.decide(&h("bad.example.com"), 8443).allowed);
        assert!(p.decide(&h("good.example.com"), 8443).allowed);
        let p = policy(&["*.example.com"], &["bad.example.com:22"]);
        assert!(
            p.decide(&h("bad.example.com"), 443).allowed,
            "a deny with a port denies only that port"
        );
    }

    #[test]
    fn decision_names_rule_and_reason() {
        let p = policy(&["Bücher.example"], &[]);
        let d = p.decide(&h("xn--bcher-kva.example"), 443);
        assert_eq!(
            d,
            Decision {
                allowed: true,
                rule: Some("xn--bcher-kva.example".into()),
                reason: "allowed by rule xn--bcher-kva.example".into()
            }
        );
        let d = p.decide(&h("other.example"), 443);
        assert_eq!(
            d,
            Decision {
                allowed: false,
                rule: None,
                reason: "no rule allows it".into()
            }
        );
        assert!(
            !Policy::default().decide(&h("example.com"), 443).allowed,
            "default deny"
        );
    }

    #[test]
    fn refuses_bad_wildcards() {
        for r in [
            "*",
            "*x.com",
            "a.*.com",
            "*.*.com",
            "**.example.com",
            "example.*",
            "*.",
            "*.com",
            "*.com:443",
        ] {
            assert!(Rule::parse(r).is_err(), "{r:?}");
        }
        for r in ["*.example.com", "*.co.uk", "*.a.b.c"] {
            assert!(Rule::parse(r).is_ok(), "{r:?}");
        }
    }

    #[test]
    fn refuses_bad_ports() {
        for r in [
            "example.com:0",
            "example.com:65536",
            "example.com:99999",
            "example.com:http",
            "example.com:",
            "example.com:+443",
            "example.com:-1",
            "example.com:443:1",
            "example.com: 443",
        ] {
            assert!(
                matches!(Rule::parse(r), Err(Error::Port { .. })),
                "{r:?}: {:?}",
                Rule::parse(r)
            );
        }
        for r in ["example.com:1", "example.com:65535", "example.com:0443"] {
            assert!(Rule::parse(r).is_ok(), "{r:?}");
        }
        // At most five digits, even when the number would fit.
        for r in ["example.com:000443", "192.0.2.1:000443"] {
            assert!(
                matches!(Rule::parse(r), Err(Error::Port { ref port, .. }) if port == "000443"),
                "{r:?}: {:?}",
                Rule::parse(r)
            );
        }
    }

    #[test]
    fn address_rules_name_one_address_in_canonical_form() {
        for (r, shown) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1:80", "127.0.0.1:80"),
            ("0x7f.1", "127.0.0.1"),
            ("2130706433:443", "127.0.0.1:443"),
            ("::1", "[::1]"),
            ("[::1]", "[::1]"),
            ("[0:0::1]:443", "[::1]:443"),
            ("::ffff:127.0.0.1", "[::ffff:127.0.0.1]"),
        ] {
            assert_eq!(Rule::parse(r).map(|r| r.to_string()), Ok(shown.to_owned()), "{r:?}");
        }
        for r in ["*.127.0.0.1", "127.0.0.1:0", "[::1]:99999", "127.0.0.1:x"] {
            assert!(Rule::parse(r).is_err(), "{r:?}");
        }
        assert!(Rule::parse("127.0.0.1.nip.io").is_ok());
    }

    #[test]
    fn an_address_rule_allows_that_address_in_any_spelling_and_nothing_else() {
        let p = policy(&["192.0.2.7", "[2001:db8::1]:8443"], &[]);
        let addr = |s: &str| Host::address(parse_ip_literal(s).unwrap());
        for spelled in ["192.0.2.7", "3221225991", "0xc0.0.2.7", "192.0.519"] {
            assert!(p.decide(&addr(spelled), 443).allowed, "{spelled}");
        }
        assert!(!p.decide(&addr("192.0.2.7"), 22).allowed, "default ports only");
        assert!(p.decide(&addr("[2001:db8::1]"), 8443).allowed);
        assert!(!p.decide(&addr("[2001:db8::1]"), 443).allowed);
        let other = p.decide(&addr("192.0.2.8"), 443);
        assert!(!other.allowed);
        assert_eq!(other.reason, "IP literals are not allowed unless a rule names the address (192.0.2.8)");
        // A name rule never matches an address, nor an address rule a name.
        assert!(!policy(&["example.com"], &[]).decide(&addr("192.0.2.7"), 443).allowed);
        assert!(!p.decide(&h("example.com"), 443).allowed);
        // Deny wins for addresses too.
        assert!(!policy(&["192.0.2.7"], &["192.0.2.7"]).decide(&addr("192.0.2.7"), 443).allowed);
    }

    #[test]
    fn refuses_bad_hosts_in_rules() {
        for r in [
            "",
            "user@example.com",
            "example.com/x",
            "a..com",
            "exa mple.com",
        ] {
            assert!(Rule::parse(r).is_err(), "{r:?}");
        }
    }

    #[test]
    fn rules_display_normalised() {
        assert_eq!(
            Rule::parse("*.EXAMPLE.com.:0443").unwrap().to_string(),
            "*.example.com:443"
        );
        assert_eq!(
            Rule::parse("Example.com").unwrap().to_string(),
            "example.com"
        );
    }

    #[test]
    fn policy_parse_reports_the_bad_rule() {
        let e = Policy::parse(&["example.com", "*"], &[]).unwrap_err();
        assert!(e.to_string().contains("\"*\""), "{e}");
        assert!(Policy::parse(&["example.com"], &["bad:0"]).is_err());
    }

    #[test]
    fn serde_round_trip() {
        let json =
            r#"{"allow":["*.Example.com","api.example.net:8443"],"deny":["bad.example.com"]}"#;
        let p: Policy = serde_json::from_str(json).unwrap();
        assert_eq!(
            p,
            policy(
                &["*.example.com", "api.example.net:8443"],
                &["bad.example.com"]
            )
        );
        let back = serde_json::to_string(&p).unwrap();
        assert_eq!(
            back,
            r#"{"allow":["*.example.com","api.example.net:8443"],"deny":["bad.example.com"]}"#
        );
        assert_eq!(
            serde_json::from_str::<Policy>("{}").unwrap(),
            Policy::default()
        );
        assert!(serde_json::from_str::<Policy>(r#"{"allow":["*"]}"#).is_err());
        assert!(serde_json::from_str::<Policy>(r#"{"allow":[],"alow":[]}"#).is_err());
    }
}
