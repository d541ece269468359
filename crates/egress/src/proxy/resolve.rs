//! Names to addresses, the checks every address passes before the proxy
//! connects to it, and connecting to exactly the addresses checked.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::net::TcpStream;

use super::fmt_duration;
use crate::{classify, normalise, AllowedRanges, Host};

/// How names become addresses. The real one is [`SystemResolver`]; tests
/// use a recording double.
pub trait Resolver: Send + Sync + 'static {
    fn resolve(&self, host: &Host, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>>;
}

/// The configured name map first, else the system resolver (`getaddrinfo`,
/// through `tokio::net::lookup_host`). The map (`[egress.hosts]`, for tests
/// and closed networks) takes normalised names to addresses; an entry's
/// port, when `Some`, replaces the requested one (so tests can run
/// upstreams on ephemeral ports while clients use 80 and 443).
#[derive(Debug, Clone, Default)]
pub struct SystemResolver {
    hosts: HashMap<String, Vec<(IpAddr, Option<u16>)>>,
}

impl SystemResolver {
    /// Keys are normalised here, so `Example.COM.` maps `example.com`; a key
    /// that is not a valid name is kept as written and never matches.
    pub fn new(hosts: HashMap<String, Vec<(IpAddr, Option<u16>)>>) -> Self {
        let hosts = hosts
            .into_iter()
            .map(|(name, addrs)| match normalise(&name) {
                Ok(h) => (String::from(h), addrs),
                Err(_) => (name, addrs),
            })
            .collect();
        SystemResolver { hosts }
    }
}

impl Resolver for SystemResolver {
    fn resolve(&self, host: &Host, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        if let Some(entries) = self.hosts.get(host.as_str()) {
            let addrs = entries
                .iter()
                .map(|(ip, p)| SocketAddr::new(*ip, p.unwrap_or(port)))
                .collect();
            return Box::pin(async move { Ok(addrs) });
        }
        let name = host.as_str().to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((name.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// Addresses the proxy must not connect to whatever a name resolves to.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    pub allow_private: &'a AllowedRanges,
    /// The daemon's own listening sockets.
    pub own: &'a [SocketAddr],
    /// This proxy's listening socket.
    pub listener: SocketAddr,
}

impl Guard<'_> {
    /// Why `addr` is refused, or `None` if the proxy may connect to it.
    pub fn refuses(&self, addr: SocketAddr) -> Option<String> {
        if same_socket(addr, self.listener) {
            return Some(format!("{addr} is this proxy itself"));
        }
        if self.own.iter().any(|own| same_socket(addr, *own)) {
            return Some(format!("{addr} is the daemon itself"));
        }
        let ip = addr.ip();
        match classify(ip) {
            Some(range) if !self.allow_private.contains(ip) => Some(format!(
                "{} is in a reserved range ({range}); allow it with [egress] allow_private",
                ip.to_canonical()
            )),
            _ => None,
        }
    }

    /// Splits a lookup result into the addresses to try, in order, and the
    /// first refused one with its reason.
    pub fn screen(&self, addrs: &[SocketAddr]) -> (Vec<SocketAddr>, Option<(SocketAddr, String)>) {
        let mut ok = Vec::new();
        let mut first_refused = None;
        for &addr in addrs {
            match self.refuses(addr) {
                None => {
                    if !ok.contains(&addr) {
                        ok.push(addr);
                    }
                }
                Some(why) => {
                    first_refused.get_or_insert((addr, why));
                }
            }
        }
        (ok, first_refused)
    }
}

/// Whether connecting to `addr` would reach a socket listening on `own`.
fn same_socket(addr: SocketAddr, own: SocketAddr) -> bool {
    if addr.port() != own.port() {
        return false;
    }
    let (a, o) = (addr.ip().to_canonical(), own.ip().to_canonical());
    a == o || o.is_unspecified() || (a.is_loopback() && o.is_loopback())
}

/// Connects to the first of `addrs` that answers, each within `timeout`.
/// On failure: the last address tried and what went wrong.
pub(crate) async fn connect_first(
    addrs: &[SocketAddr],
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), (SocketAddr, String)> {
    let mut last = None;
    for &addr in addrs {
        let problem = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok((stream, addr)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {}", fmt_duration(timeout)),
        };
        last = Some((addr, problem));
    }
    Err(last.unwrap_or_else(|| {
        (
            SocketAddr::from(([0, 0, 0, 0], 0)),
            "no addresses to connect to".to_owned(),
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn own_sockets_match_by_port_and_ip() {
        let own = sa("127.0.0.1:7878");
        assert!(same_socket(sa("127.0.0.1:7878"), own));
        assert!(same_socket(sa("127.0.0.2:7878"), own), "both loopback");
        assert!(same_socket(sa("[::1]:7878"), own), "both loopback");
        assert!(same_socket(sa("[::ffff:127.0.0.1]:7878"), own));
        assert!(!same_socket(sa("127.0.0.1:7879"), own));
        assert!(!same_socket(sa("10.0.0.1:7878"), own));
        let any = sa("0.0.0.0:7878");
        assert!(same_socket(sa("10.0.0.1:7878"), any));
        assert!(same_socket(sa("[2001:db8::1]:7878"), sa("[::]:7878")));
        assert!(!same_socket(sa("10.0.0.1:80"), any));
        let lan = sa("192.168.1.5:7878");
        assert!(same_socket(sa("192.168.1.5:7878"), lan));
        assert!(!same_socket(sa("192.168.1.6:7878"), lan));
    }

    #[test]
    fn guard_reasons() {
        let allow = AllowedRanges::parse(&["127.0.0.0/8"]).unwrap();
        let own = [sa("127.0.0.1:7878")];
        let g = Guard {
            allow_private: &allow,
            own: &own,
            listener: sa("127.0.0.1:3128"),
        };
        assert_eq!(
            g.refuses(sa("127.0.0.1:3128")).unwrap(),
            "127.0.0.1:3128 is this proxy itself"
        );
        assert_eq!(
            g.refuses(sa("127.0.0.1:7878")).unwrap(),
            "127.0.0.1:7878 is the daemon itself"
        );
        assert_eq!(g.refuses(sa("127.0.0.1:80")), None, "allowed range");
        assert_eq!(
            g.refuses(sa("10.0.0.5:80")).unwrap(),
            "10.0.0.5 is in a reserved range (private); allow it with [egress] allow_private"
        );
        assert_eq!(
            g.refuses(sa("[::ffff:10.0.0.5]:80")).unwrap(),
            "10.0.0.5 is in a reserved range (private); allow it with [egress] allow_private"
        );
        assert_eq!(g.refuses(sa("93.184.216.34:443")), None);

        let (ok, refused) = g.screen(&[
            sa("10.0.0.5:80"),
            sa("93.184.216.34:80"),
            sa("169.254.169.254:80"),
            sa("93.184.216.34:80"),
        ]);
        assert_eq!(ok, vec![sa("93.184.216.34:80")]);
        assert_eq!(refused.unwrap().0, sa("10.0.0.5:80"));
    }

    #[tokio::test]
    async fn system_resolver_uses_the_map_first() {
        let mut hosts = HashMap::new();
        hosts.insert(
            "Mapped.TEST.".to_owned(),
            vec![
                ("127.0.0.1".parse().unwrap(), Some(9999)),
                ("::1".parse().unwrap(), None),
            ],
        );
        let r = SystemResolver::new(hosts);
        let got = r
            .resolve(&Host::parse("mapped.test").unwrap(), 443)
            .await
            .unwrap();
        assert_eq!(got, vec![sa("127.0.0.1:9999"), sa("[::1]:443")]);
        // Not in the map: the system resolver answers (localhost resolves
        // everywhere without a network).
        let got = r
            .resolve(&Host::parse("localhost").unwrap(), 80)
            .await
            .unwrap();
        assert!(
            got.iter().all(|a| a.ip().is_loopback() && a.port() == 80),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn connect_first_reports_the_last_failure() {
        // A port nothing listens on: bind, learn it, close.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live_addr = live.local_addr().unwrap();
        let (_, addr) = connect_first(&[dead, live_addr], Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(addr, live_addr);
        let (addr, why) = connect_first(&[dead], Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(addr, dead);
        assert!(why.to_lowercase().contains("refused"), "{why}");
        assert!(connect_first(&[], Duration::from_secs(1)).await.is_err());
    }
}
