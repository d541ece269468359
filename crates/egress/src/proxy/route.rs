//! The steps every tunnel and every forwarded request goes through, in
//! order: normalise the name, let the policy decide (before any lookup),
//! resolve, drop the addresses that must not be reached, connect.

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::watch;

use super::attempt::{as_sent, Recorder};
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

/// The requested host, normalised. IP literals are refused in every
/// spelling and whatever address they name, even one in `allow_private`:
/// the policy speaks of names only, so an address has nothing to match.
pub(crate) fn name(host: &str) -> Result<Host, Refusal> {
    match normalise(host) {
        Ok(h) => Ok(h),
        Err(Error::IpLiteral { host, ip }) => Err(Refusal::new(
            403,
            format!("IP literals are not allowed: {} is {ip}", as_sent(&host)),
        )),
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
    let lookup = tokio::time::timeout(config.connect_timeout, ctx.resolver.resolve(host, port));
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
    fn names_are_normalised_and_literals_refused() {
        assert_eq!(name("Example.COM.").unwrap().as_str(), "example.com");
        let r = name("0x7f.1").unwrap_err();
        assert_eq!(r.status, 403);
        assert_eq!(r.reason, "IP literals are not allowed: 0x7f.1 is 127.0.0.1");
        assert_eq!(name("[::1]").unwrap_err().status, 403);
        let r = name("a_b.test").unwrap_err();
        assert_eq!(r.status, 400);
        assert!(r.reason.contains("a_b.test"), "{}", r.reason);
    }
}
