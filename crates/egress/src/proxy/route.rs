//! The steps every tunnel and every forwarded request goes through, in
//! order: normalise the name, let the policy decide (before any lookup),
//! resolve, drop the addresses that must not be reached, connect.

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::watch;

use super::attempt::Recorder;
use super::resolve::{connect_first, Guard};
use super::{fmt_duration, Ctx};
use crate::{normalise, Error, Host, Policy};

/// A request the proxy answers itself instead of relaying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: u16,
    pub reason: String,
}

impl Refusal {
    pub fn new(status: u16, reason: impl Into<String>) -> Self {
        Refusal {
            status,
            reason: reason.into(),
        }
    }
}

/// The requested host, normalised. An IP literal, in any spelling, becomes
/// its canonical address ([`Host::address`]), which the policy allows only
/// through a rule naming that address.
pub(crate) fn name(host: &str) -> Result<Host, Refusal> {
    match normalise(host) {
        Ok(h) => Ok(h),
        Err(Error::IpLiteral { ip, .. }) => Ok(Host::address(ip)),
        Err(e) => Err(Refusal::new(400, e.to_string())),
    }
}

/// Decide, resolve, check and connect: an upstream connection the policy
/// and the address checks allowed. `policy` is marked seen here, so a
/// change from this point on shows up in `policy.changed()`.
pub(crate) async fn open(
    ctx: &Ctx,
    policy: &mut watch::Receiver<Arc<Policy>>,
    rec: &mut Recorder,
    host: &Host,
    port: u16,
) -> Result<TcpStream, Refusal> {
    let decision = policy.borrow_and_update().decide(host, port);
    rec.decided(&decision);
    if !decision.allowed {
        return Err(Refusal::new(403, decision.reason));
    }
    let config = &ctx.config;
    // An address a rule named is the address: nothing to look up.
    let lookup = async {
        match host.ip() {
            Some(ip) => Ok(vec![std::net::SocketAddr::new(ip, port)]),
            None => ctx.resolver.resolve(host, port).await,
        }
    };
    let lookup = tokio::time::timeout(config.connect_timeout, lookup);
    let addrs = match lookup.await {
        Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
        Ok(Ok(_)) => {
            return Err(Refusal::new(
                502,
                format!("cannot resolve {host}: no addresses"),
            ))
        }
        Ok(Err(e)) => return Err(Refusal::new(502, format!("cannot resolve {host}: {e}"))),
        Err(_) => {
            return Err(Refusal::new(
                502,
                format!(
                    "cannot resolve {host}: timed out after {}",
                    fmt_duration(config.connect_timeout)
                ),
            ))
        }
    };
    let guard = Guard {
        allow_private: &config.allow_private,
        own: &config.own_addrs,
        listener: ctx.listener,
    };
    let (usable, refused) = guard.screen(&addrs);
    if usable.is_empty() {
        if let Some((addr, why)) = refused {
            rec.address(addr);
            return Err(Refusal::new(403, why));
        }
    }
    match connect_first(&usable, config.connect_timeout).await {
        Ok((stream, addr)) => {
            rec.address(addr);
            // Tunnels carry interactive protocols too: no Nagle delay.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Err((addr, why)) => {
            rec.address(addr);
            Err(Refusal::new(
                502,
                format!("cannot connect to {host} ({addr}): {why}"),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_and_literals_become_addresses() {
        assert_eq!(name("Example.COM.").unwrap().as_str(), "example.com");
        assert_eq!(name("0x7f.1").unwrap().as_str(), "127.0.0.1");
        assert_eq!(name("[0:0::1]").unwrap().as_str(), "[::1]");
        assert_eq!(name("[::1]").unwrap().ip(), Some("::1".parse().unwrap()));
        let r = name("a_b.test").unwrap_err();
        assert_eq!(r.status, 400);
        assert!(r.reason.contains("a_b.test"), "{}", r.reason);
    }
}
