//! Destination host names, normalised so that two spellings of one name
//! compare equal and nothing that is really an address passes as a name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Longest name DNS can carry (RFC 1035), without the trailing dot.
const MAX_NAME: usize = 253;
/// Longest DNS label.
const MAX_LABEL: usize = 63;

/// A destination host. Almost always a normalised DNS name: lowercase ASCII
/// (IDNs in punycode), no trailing dot, 1-253 bytes, labels of 1-63 bytes,
/// never an IP literal. The one exception is made by [`Host::address`]: an
/// IP literal in a request becomes its canonical address (`192.0.2.1`,
/// `[2001:db8::1]`), which only a rule naming that address allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Host(String);

impl Host {
    pub fn parse(s: &str) -> Result<Self> {
        normalise(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An IP address as a destination, in canonical form.
    pub fn address(ip: IpAddr) -> Host {
        Host(match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        })
    }

    /// The address of a host made by [`Host::address`]; `None` for a name
    /// (names are never IP literals, so this cannot mistake one).
    pub fn ip(&self) -> Option<IpAddr> {
        parse_ip_literal(&self.0)
    }

    /// Number of dot-separated labels.
    pub fn labels(&self) -> usize {
        self.0.split('.').count()
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Host {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        normalise(s)
    }
}

impl TryFrom<String> for Host {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        normalise(&s)
    }
}

impl From<Host> for String {
    fn from(h: Host) -> String {
        h.0
    }
}

fn bad(host: &str, problem: impl Into<String>) -> Error {
    Error::Host {
        host: host.to_owned(),
        problem: problem.into(),
    }
}

/// Normalise a destination name: lowercase, one trailing dot stripped,
/// Unicode converted to punycode (UTS-46, STD3 rules: letters, digits and
/// inner hyphens only, so `_` is refused too), and refused if it is an IP
/// literal or could be read as a different host by another parser.
pub fn normalise(input: &str) -> Result<Host> {
    if input.is_empty() {
        return Err(bad(input, "empty"));
    }
    // Characters that make a URL parser see userinfo, a path, an escape or
    // a second token: the proxy and the client must agree on the host.
    if let Some(c) = input
        .chars()
        .find(|c| matches!(c, '@' | '%' | '/' | '\\') || c.is_whitespace() || c.is_control())
    {
        return Err(bad(input, format!("contains {c:?}")));
    }
    if let Some(ip) = parse_ip_literal(input) {
        return Err(Error::IpLiteral {
            host: input.to_owned(),
            ip,
        });
    }
    // One trailing dot is the absolute form of the same name; two is not a name.
    let name = input.strip_suffix('.').unwrap_or(input);
    if name.is_empty() {
        return Err(bad(input, "empty"));
    }
    if name.split('.').any(str::is_empty) {
        return Err(bad(input, "empty label"));
    }
    let ascii = idna::domain_to_ascii_strict(name).map_err(|_| {
        bad(
            input,
            "not a valid domain name (letters, digits and inner hyphens only, IDNA rules)",
        )
    })?;
    // Mapping can turn fullwidth digits and dots into an address: check again.
    if let Some(ip) = parse_ip_literal(&ascii) {
        return Err(Error::IpLiteral {
            host: input.to_owned(),
            ip,
        });
    }
    if ascii.is_empty() || ascii.split('.').any(str::is_empty) {
        return Err(bad(input, "empty label"));
    }
    if ascii.len() > MAX_NAME {
        return Err(bad(input, format!("longer than {MAX_NAME} bytes")));
    }
    if let Some(l) = ascii.split('.').find(|l| l.len() > MAX_LABEL) {
        return Err(bad(
            input,
            format!("label {l:?} is longer than {MAX_LABEL} bytes"),
        ));
    }
    // A URL parser takes a name ending in a number as IPv4 and fails on it;
    // a name it would refuse must not reach a rule as something else.
    if ends_in_number(&ascii) {
        return Err(bad(input, "ends in a number but is not an IPv4 address"));
    }
    if let Some(c) = ascii
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(bad(input, format!("contains {c:?}")));
    }
    Ok(Host(ascii))
}

/// Recognise an IP literal in any spelling the WHATWG URL parser accepts:
/// IPv4 as dotted decimal, octal (`0177.0.0.1`), hex (`0x7f.1`), shortened
/// (`127.1`) or one integer (`2130706433`), with an optional trailing dot;
/// IPv6 with or without brackets, including IPv4-mapped forms.
pub fn parse_ip_literal(s: &str) -> Option<IpAddr> {
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if s.contains(':') {
        return s.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    parse_ipv4(s).map(IpAddr::V4)
}

/// The WHATWG IPv4 parser: 1-4 parts, the last filling the remaining bytes.
fn parse_ipv4(s: &str) -> Option<Ipv4Addr> {
    let s = if s.len() > 1 {
        s.strip_suffix('.').unwrap_or(s)
    } else {
        s
    };
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        nums.push(ipv4_number(p)?);
    }
    let (last, init) = nums.split_last()?;
    if init.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (5 - parts.len() as u32);
    if last_bits < 64 && *last >= 1u64 << last_bits {
        return None;
    }
    let mut v: u64 = 0;
    for (i, &n) in init.iter().enumerate() {
        v |= n << (8 * (3 - i as u64));
    }
    v |= last;
    u32::try_from(v).ok().map(Ipv4Addr::from)
}

/// One IPv4 part: `0x` hex, leading-zero octal, or decimal; `0x` alone is 0.
fn ipv4_number(p: &str) -> Option<u64> {
    if p.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Leading zeros would overflow nothing; cap the rest so u64 never overflows.
    let trimmed = digits.trim_start_matches('0');
    if trimmed.len() > 12 {
        return Some(u64::MAX);
    }
    u64::from_str_radix(if trimmed.is_empty() { "0" } else { trimmed }, radix).ok()
}

/// WHATWG "ends in a number": the last label is all digits or `0x` hex.
fn ends_in_number(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.chars().all(|c| c.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .or_else(|| last.strip_prefix("0X"))
        .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> String {
        normalise(s).unwrap().to_string()
    }

    fn ip_err(s: &str) -> IpAddr {
        match normalise(s) {
            Err(Error::IpLiteral { ip, .. }) => ip,
            other => panic!("{s:?}: expected an IP literal error, got {other:?}"),
        }
    }

    fn host_err(s: &str) -> String {
        match normalise(s) {
            Err(Error::Host { problem, .. }) => problem,
            other => panic!("{s:?}: expected a host error, got {other:?}"),
        }
    }

    #[test]
    fn lowercases_and_strips_one_trailing_dot() {
        assert_eq!(ok("Example.COM"), "example.com");
        assert_eq!(ok("example.com."), "example.com");
        assert_eq!(ok("localhost"), "localhost");
        assert!(host_err("example.com..").contains("empty label"));
        assert!(host_err(".").contains("empty"));
        assert!(host_err("").contains("empty"));
    }

    #[test]
    fn idn_becomes_punycode() {
        assert_eq!(ok("bücher.example"), "xn--bcher-kva.example");
        assert_eq!(ok("BÜCHER.example."), "xn--bcher-kva.example");
        assert_eq!(ok("xn--bcher-kva.example"), "xn--bcher-kva.example");
        assert_eq!(ok("例え.jp"), "xn--r8jz45g.jp");
        // Fullwidth dot maps to '.'.
        assert_eq!(ok("example\u{ff0e}com"), "example.com");
    }

    #[test]
    fn refuses_characters_that_change_the_host() {
        for s in [
            "user@example.com",
            "exa%6dple.com",
            "example.com/path",
            "example.com\\x",
            "exa mple.com",
            "example.com\t",
            "a\nb.com",
        ] {
            assert!(host_err(s).contains("contains"), "{s:?}");
        }
        assert_eq!(ok("example.com"), "example.com");
    }

    #[test]
    fn refuses_bad_labels_and_lengths() {
        assert!(host_err("a..com").contains("empty label"));
        assert!(host_err(".example.com").contains("empty label"));
        let label63 = "a".repeat(63);
        let label64 = "a".repeat(64);
        assert_eq!(ok(&format!("{label63}.com")), format!("{label63}.com"));
        assert!(normalise(&format!("{label64}.com")).is_err());
        // 4 * 63 + 3 dots = 255 > 253; 3 * 63 + 61 + 3 dots = 253.
        let long = [label63.as_str(); 4].join(".");
        assert!(normalise(&long).is_err());
        let max = format!("{}.{}", [label63.as_str(); 3].join("."), "a".repeat(61));
        assert_eq!(max.len(), 253);
        assert_eq!(ok(&max), max);
        assert_eq!(ok(&format!("{max}.")), max);
    }

    #[test]
    fn refuses_std3_violations() {
        for s in [
            "under_score.com",
            "-lead.com",
            "trail-.com",
            "star*.com",
            "a:b",
            "[example.com]",
            "ex!ample.com",
        ] {
            assert!(normalise(s).is_err(), "{s:?}");
        }
        assert_eq!(ok("in-ner.com"), "in-ner.com");
        assert_eq!(ok("a1.b2.c3"), "a1.b2.c3");
    }

    #[test]
    fn refuses_ipv4_in_every_spelling() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        for s in [
            "127.0.0.1",
            "127.0.0.1.",
            "0177.0.0.1",
            "0x7f.1",
            "0x7F.0.0.1",
            "127.1",
            "127.0.1",
            "2130706433",
            "0x7f000001",
            "017700000001",
        ] {
            assert_eq!(ip_err(s), lo, "{s:?}");
        }
        assert_eq!(
            ip_err("１２７.０.０.１"),
            lo,
            "fullwidth digits map to ASCII"
        );
        assert_eq!(ip_err("0"), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert_eq!(
            ip_err("10.0x10.0377.1"),
            IpAddr::V4(Ipv4Addr::new(10, 16, 255, 1))
        );
        // Controls: names that merely contain digits are names.
        assert_eq!(ok("127.0.0.1.example.com"), "127.0.0.1.example.com");
        assert_eq!(ok("0x7f.example"), "0x7f.example");
        assert_eq!(ok("1password.com"), "1password.com");
    }

    #[test]
    fn refuses_names_ending_in_a_number_that_are_not_addresses() {
        for s in [
            "1.2.3.4.5",
            "256.0.0.1",
            "example.123",
            "08.0.0.1",
            "0x.0xg.1",
            "example.0x1f",
        ] {
            assert!(normalise(s).is_err(), "{s:?}");
        }
        assert_eq!(ok("example.a123"), "example.a123");
    }

    #[test]
    fn refuses_ipv6_bracketed_or_not() {
        let lo = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert_eq!(ip_err("::1"), lo);
        assert_eq!(ip_err("[::1]"), lo);
        assert_eq!(ip_err("[0:0:0:0:0:0:0:1]"), lo);
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        assert_eq!(ip_err("::ffff:127.0.0.1"), mapped);
        assert_eq!(ip_err("[::FFFF:7f00:1]"), mapped);
        // A zone id is refused for its '%'.
        assert!(normalise("fe80::1%eth0").is_err());
    }

    #[test]
    fn parse_ip_literal_spellings() {
        let v4 = |a, b, c, d| Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
        assert_eq!(parse_ip_literal("127.0.0.1"), v4(127, 0, 0, 1));
        assert_eq!(parse_ip_literal("0177.0.0.1"), v4(127, 0, 0, 1));
        assert_eq!(parse_ip_literal("0x7f.1"), v4(127, 0, 0, 1));
        assert_eq!(parse_ip_literal("127.1"), v4(127, 0, 0, 1));
        assert_eq!(parse_ip_literal("2130706433"), v4(127, 0, 0, 1));
        assert_eq!(parse_ip_literal("4294967295"), v4(255, 255, 255, 255));
        assert_eq!(parse_ip_literal("192.168.257"), v4(192, 168, 1, 1));
        assert_eq!(parse_ip_literal("0x"), v4(0, 0, 0, 0));
        assert_eq!(
            parse_ip_literal("::ffff:127.0.0.1"),
            Some(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()))
        );
        assert_eq!(
            parse_ip_literal("[2001:db8::1]"),
            "2001:db8::1".parse().ok()
        );
        for s in [
            "4294967296",
            "256.1.1.1",
            "1.2.3.4.5",
            "1..2",
            "",
            ".",
            "08",
            "0x1g",
            "example.com",
            "[::1",
            "::1]",
            "[127.0.0.1]",
            "1.2.3.4:80",
            ":::",
        ] {
            assert_eq!(parse_ip_literal(s), None, "{s:?}");
        }
    }

    #[test]
    fn parse_ip_literal_takes_one_trailing_dot() {
        let lo = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(parse_ip_literal("127.0.0.1."), lo);
        assert_eq!(parse_ip_literal("0x7f.1."), lo);
        assert_eq!(parse_ip_literal("2130706433."), lo);
        assert_eq!(
            parse_ip_literal("1."),
            Some(IpAddr::V4(Ipv4Addr::new(0, 0, 0, 1)))
        );
        assert_eq!(parse_ip_literal("127.0.0.1.."), None);
        assert_eq!(parse_ip_literal("."), None);
    }

    #[test]
    fn parse_ip_literal_refuses_a_last_part_too_big_for_its_bytes() {
        let v4 = |a, b, c, d| Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
        assert_eq!(parse_ip_literal("1.2.3.255"), v4(1, 2, 3, 255));
        assert_eq!(parse_ip_literal("1.2.3.256"), None);
        assert_eq!(parse_ip_literal("1.2.65535"), v4(1, 2, 255, 255));
        assert_eq!(parse_ip_literal("1.2.65536"), None);
        assert_eq!(parse_ip_literal("1.16777215"), v4(1, 255, 255, 255));
        assert_eq!(parse_ip_literal("1.16777216"), None);
        // Five parts are never an address, whatever the last one is.
        assert_eq!(parse_ip_literal("1.2.3.4.0"), None);
        assert_eq!(parse_ip_literal("0.0.0.0.0"), None);
        assert_eq!(parse_ip_literal("1.2.3.4.5.6"), None);
    }

    #[test]
    fn serde_round_trip_and_refusal() {
        let h: Host = serde_json::from_str("\"Example.com.\"").unwrap();
        assert_eq!(h.as_str(), "example.com");
        assert_eq!(serde_json::to_string(&h).unwrap(), "\"example.com\"");
        assert!(serde_json::from_str::<Host>("\"127.1\"").is_err());
    }

    proptest! {
        #[test]
        fn normalise_is_idempotent_and_total(s in ".{0,80}") {
            if let Ok(h) = normalise(&s) {
                prop_assert_eq!(normalise(h.as_str()), Ok(h.clone()));
                prop_assert!(h.as_str().len() <= MAX_NAME);
            }
        }

        #[test]
        fn normalise_is_idempotent_on_name_like_strings(s in "[a-zA-Z0-9.\\-_*@:\\[\\]ßüé例]{0,40}") {
            if let Ok(h) = normalise(&s) {
                prop_assert_eq!(normalise(h.as_str()), Ok(h.clone()));
            }
        }
    }
}
