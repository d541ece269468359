//! Reserved address ranges: a public name may resolve to a private address
//! (DNS rebinding, internal records), so the proxy checks the address it is
//! about to connect to as well as the name.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// (network, prefix length, name), most specific first where they nest.
const V4: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 32, "unspecified"),
    ([0, 0, 0, 0], 8, "this network"),
    ([10, 0, 0, 0], 8, "private"),
    ([100, 64, 0, 0], 10, "shared address space (CGNAT)"),
    ([127, 0, 0, 0], 8, "loopback"),
    ([169, 254, 0, 0], 16, "link-local"),
    ([172, 16, 0, 0], 12, "private"),
    ([192, 0, 0, 0], 24, "IETF protocol assignments"),
    ([192, 0, 2, 0], 24, "documentation"),
    ([192, 88, 99, 0], 24, "6to4 relay anycast"),
    ([192, 168, 0, 0], 16, "private"),
    ([198, 18, 0, 0], 15, "benchmarking"),
    ([198, 51, 100, 0], 24, "documentation"),
    ([203, 0, 113, 0], 24, "documentation"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([255, 255, 255, 255], 32, "broadcast"),
    ([240, 0, 0, 0], 4, "reserved"),
];

/// IPv6 ranges named outright; mapped, NAT64-free embeddings are handled
/// in [`classify_v6`].
const V6: &[(u128, u8, &str)] = &[
    (0, 128, "unspecified"),
    (1, 128, "loopback"),
    (0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96, "NAT64"),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        "NAT64 (local use)",
    ),
    (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, "discard"),
    (0x2001_0000_0000_0000_0000_0000_0000_0000, 32, "Teredo"),
    (
        0x2001_0002_0000_0000_0000_0000_0000_0000,
        48,
        "benchmarking",
    ),
    (
        0x2001_0db8_0000_0000_0000_0000_0000_0000,
        32,
        "documentation",
    ),
    (
        0x3fff_0000_0000_0000_0000_0000_0000_0000,
        20,
        "documentation",
    ),
    (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7, "unique local"),
    (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10, "link-local"),
    (
        0xfec0_0000_0000_0000_0000_0000_0000_0000,
        10,
        "site-local (deprecated)",
    ),
    (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, "multicast"),
];

/// The name of the reserved range `ip` is in, or `None` for a public address.
///
/// NAT64 and Teredo are refused whole: what they reach is decided by a
/// translator or relay, not by the address we can check. IPv4-mapped
/// addresses and 6to4 are classified by the IPv4 address they carry.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let a = u32::from(ip);
    V4.iter()
        .find(|(net, len, _)| prefix_match_v4(a, u32::from_be_bytes(*net), *len))
        .map(|(_, _, name)| *name)
}

fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let a = u128::from(ip);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    if let Some((_, _, name)) = V6
        .iter()
        .find(|(net, len, _)| prefix_match_v6(a, *net, *len))
    {
        return Some(name);
    }
    // ::a.b.c.d (IPv4-compatible, deprecated): no stack should route it.
    if a >> 32 == 0 {
        return Some("IPv4-compatible (deprecated)");
    }
    // 6to4 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
    if a >> 112 == 0x2002 {
        let embedded = Ipv4Addr::from(((a >> 80) & 0xffff_ffff) as u32);
        return classify_v4(embedded).map(|_| "6to4 with an embedded reserved IPv4 address");
    }
    None
}

fn prefix_match_v4(a: u32, net: u32, len: u8) -> bool {
    len == 0 || (a ^ net) >> (32 - u32::from(len)) == 0
}

fn prefix_match_v6(a: u128, net: u128, len: u8) -> bool {
    len == 0 || (a ^ net) >> (128 - u32::from(len)) == 0
}

/// One address range in CIDR notation; a bare address is a /32 or /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // A mapped address reaches the IPv4 host: match it as IPv4.
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_match_v4(u32::from(a), u32::from(n), self.len),
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                prefix_match_v6(u128::from(a), u128::from(n), self.len)
            }
            (IpAddr::V6(n), IpAddr::V4(a)) => {
                prefix_match_v6(u128::from(a.to_ipv6_mapped()), u128::from(n), self.len)
            }
            (IpAddr::V4(_), IpAddr::V6(_)) => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |problem: &str| Error::Range {
            range: s.to_owned(),
            problem: problem.to_owned(),
        };
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        // Only the canonical spellings: a config is read by people, and
        // `0177.1/8` would not mean what it looks like to most of them.
        let net: IpAddr = addr
            .parse()
            .map_err(|_| bad("expected an address like 10.0.0.0/8 or fd00::/8"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) if !l.is_empty() && l.len() <= 3 && l.chars().all(|c| c.is_ascii_digit()) => l
                .parse::<u8>()
                .map_err(|_| bad("prefix length is not a number"))?,
            Some(_) => return Err(bad("prefix length is not a number")),
        };
        if len > max {
            return Err(bad(&format!("prefix length {len} is longer than {max}")));
        }
        let cidr = Cidr { net, len };
        // Bits past the prefix are almost always a typo (127.0.0.1/8).
        let host_bits_set = match net {
            IpAddr::V4(n) => len < 32 && u32::from(n) << len != 0,
            IpAddr::V6(n) => len < 128 && u128::from(n) << len != 0,
        };
        if host_bits_set {
            return Err(bad("address has bits set past the prefix length"));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

/// Reserved ranges the operator allows anyway (the daemon's
/// `allow_private`), e.g. a package mirror on `10.1.2.3/32`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AllowedRanges(Vec<Cidr>);

impl AllowedRanges {
    pub fn parse<S: AsRef<str>>(ranges: &[S]) -> Result<Self> {
        ranges
            .iter()
            .map(|r| r.as_ref().trim().parse())
            .collect::<Result<_>>()
            .map(AllowedRanges)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl TryFrom<Vec<String>> for AllowedRanges {
    type Error = Error;
    fn try_from(v: Vec<String>) -> Result<Self> {
        Self::parse(&v)
    }
}

impl From<AllowedRanges> for Vec<String> {
    fn from(r: AllowedRanges) -> Self {
        r.0.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Option<&'static str> {
        classify(s.parse().unwrap())
    }

    #[test]
    fn classifies_reserved_ipv4() {
        let cases = [
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "shared address space (CGNAT)"),
            ("100.127.255.255", "shared address space (CGNAT)"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.255", "multicast"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this network"),
            ("255.255.255.255", "broadcast"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.1", "documentation"),
            ("203.0.113.1", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("192.0.0.8", "IETF protocol assignments"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
        ];
        for (ip, want) in cases {
            assert_eq!(c(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_ipv4_next_to_reserved_ranges() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "126.255.255.255",
            "128.0.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "192.0.1.1",
            "223.255.255.255",
        ] {
            assert_eq!(c(ip), None, "{ip}");
        }
    }

    #[test]
    fn classifies_reserved_ipv6() {
        let cases = [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fc00::1", "unique local"),
            ("fd12:3456::1", "unique local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("64:ff9b::8.8.8.8", "NAT64"),
            ("64:ff9b:1::1", "NAT64 (local use)"),
            ("2001::1", "Teredo"),
            ("2001:0:ffff::1", "Teredo"),
            ("100::1", "discard"),
            ("2001:2::1", "benchmarking"),
            ("::127.0.0.1", "IPv4-compatible (deprecated)"),
            (
                "2002:0a00:0001::1",
                "6to4 with an embedded reserved IPv4 address",
            ),
            (
                "2002:7f00:1::",
                "6to4 with an embedded reserved IPv4 address",
            ),
        ];
        for (ip, want) in cases {
            assert_eq!(c(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn mapped_addresses_are_classified_by_their_ipv4() {
        assert_eq!(c("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(c("::ffff:10.0.0.1"), Some("private"));
        assert_eq!(c("::ffff:169.254.169.254"), Some("link-local"));
        assert_eq!(c("::ffff:8.8.8.8"), None);
    }

    #[test]
    fn public_ipv6() {
        for ip in [
            "2606:4700:4700::1111",
            "2a00:1450::1",
            "2002:0808:0808::1",
            "2001:4860:4860::8888",
            "fbff::1",
            "fe7f::1",
            "64:ff9b:2::1",
            "2001:1::1",
        ] {
            assert_eq!(c(ip), None, "{ip}");
        }
    }

    #[test]
    fn allowed_ranges_contain() {
        let r = AllowedRanges::parse(&["127.0.0.0/8", "10.1.2.3", "fd00::/8", "192.168.0.0/16"])
            .unwrap();
        assert!(r.contains("127.9.9.9".parse().unwrap()));
        assert!(r.contains("10.1.2.3".parse().unwrap()));
        assert!(!r.contains("10.1.2.4".parse().unwrap()));
        assert!(r.contains("fd00::5".parse().unwrap()));
        assert!(!r.contains("fc00::5".parse().unwrap()));
        assert!(
            r.contains("::ffff:127.0.0.1".parse().unwrap()),
            "mapped matches as IPv4"
        );
        assert!(!r.contains("128.0.0.1".parse().unwrap()));
        assert!(!r.contains("::1".parse().unwrap()));
        assert!(!AllowedRanges::default().contains("127.0.0.1".parse().unwrap()));
        let all = AllowedRanges::parse(&["0.0.0.0/0"]).unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let mapped = AllowedRanges::parse(&["::ffff:0:0/96"]).unwrap();
        assert!(mapped.contains("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn allowed_ranges_are_empty_only_without_ranges() {
        assert!(AllowedRanges::default().is_empty());
        assert!(AllowedRanges::parse::<&str>(&[]).unwrap().is_empty());
        assert!(!AllowedRanges::parse(&["10.1.2.3/32"]).unwrap().is_empty());
        assert!(!AllowedRanges::parse(&["::/0"]).unwrap().is_empty());
    }

    #[test]
    fn refuses_bad_ranges() {
        for s in [
            "",
            "127.0.0.0/33",
            "::/129",
            "127.0.0.1/8",
            "10.0.0.0/",
            "10.0.0.0/x",
            "10.0.0.0/+8",
            "0177.0.0.1/32",
            "example.com/8",
            "10.0.0.0/8/8",
            "fd00::1/8",
        ] {
            assert!(
                matches!(s.parse::<Cidr>(), Err(Error::Range { .. })),
                "{s:?}"
            );
        }
        for s in ["127.0.0.0/8", "10.0.0.0/32", "::/0", "fd00::/8", "::1"] {
            assert!(s.parse::<Cidr>().is_ok(), "{s:?}");
        }
    }

    #[test]
    fn allowed_ranges_serde() {
        let r: AllowedRanges = serde_json::from_str(r#"["127.0.0.0/8","::1"]"#).unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"["127.0.0.0/8","::1/128"]"#
        );
        assert!(serde_json::from_str::<AllowedRanges>(r#"["127.0.0.1/8"]"#).is_err());
    }
}
