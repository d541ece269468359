//! `CONNECT host:port`: after the route is open the client gets `200`, the
//! first tunnel bytes are checked (a TLS ClientHello must name the CONNECT
//! host), then bytes are relayed both ways until both sides close, the
//! tunnel is idle or too old, or the policy no longer allows it.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::attempt::{as_sent, Activity, AttemptKind, Meter};
use super::conn::recorder;
use super::respond::refuse;
use super::splice::{self, Pipe};
use super::{fmt_duration, route, Ctx, ProxyConfig};
use crate::sni::MAX_HANDSHAKE;
use crate::{
    host_header_agrees, normalise, parse_client_hello, Decision, Host, Policy, RequestHead,
};

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";
/// The port where the first tunnel bytes must be a TLS ClientHello.
const TLS_PORT: u16 = 443;
/// First byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;
/// Most raw bytes buffered while waiting for a complete ClientHello: the
/// message limit plus room for the headers of the records it is split into.
const MAX_HELLO_BYTES: usize = MAX_HANDSHAKE + 1024;
/// Buffer of each direction when no pipe is to be had for `splice`.
const RELAY_BUF: usize = 256 * 1024;

/// Runs one CONNECT request to its end and logs it.
pub(crate) async fn run(
    ctx: &Ctx,
    mut client: TcpStream,
    head: RequestHead,
    mut buf: Vec<u8>,
    started: Instant,
) {
    let config = &ctx.config;
    let linger = config.handshake_timeout;
    let mut rec = recorder(ctx, AttemptKind::Connect, started);
    let port = head.target.port();
    rec.target(head.target.host(), port);
    if let Err(e) = host_header_agrees(&head) {
        return refuse(&mut client, rec, 400, &e.to_string(), linger).await;
    }
    let host = match route::name(head.target.host()) {
        Ok(h) => h,
        Err(r) => return refuse(&mut client, rec, r.status, &r.reason, linger).await,
    };
    rec.host(&host);
    let mut policy = ctx.policy.clone();
    let mut upstream = match route::open(ctx, &mut policy, &mut rec, &host, port).await {
        Ok(u) => u,
        Err(r) => return refuse(&mut client, rec, r.status, &r.reason, linger).await,
    };
    // A host with request rules or injections is intercepted, if the task
    // has a CA to do it with.
    let intercepts = policy.borrow().rules_for(&host, port).intercepts();
    let interception = match (intercepts, ctx.interception.as_deref()) {
        (false, _) => None,
        (true, Some(i)) => Some(i),
        (true, None) => {
            let why = format!("{host} has request rules, but this proxy has no CA to intercept it with");
            return refuse(&mut client, rec, 502, &why, linger).await;
        }
    };
    if client.write_all(ESTABLISHED).await.is_err() {
        rec.reason("client closed the connection before the tunnel was established");
        return rec.finish();
    }
    rec.status(200);
    // Bytes sent right after the head are already tunnel data.
    let early = buf.split_off(head.head_len.min(buf.len()));
    let deadline = started + config.max_duration;
    if let Some(interception) = interception {
        rec.reason("intercepted: each request decided by the host's rules");
        if let Some(why) = super::intercept::run(ctx, interception, client, early, upstream, &host, port, &mut rec, deadline).await {
            rec.reason(why);
        }
        return rec.finish();
    }
    let tunnel = Tunnel {
        on_open: Box::new(rec.open_notice()),
        host: &host,
        port,
        config,
        meter: rec.meter().clone(),
        activity: Activity::new(),
        gate_open: Notify::new(),
    };
    let end = tunnel
        .relay(&mut client, &mut upstream, early, &mut policy, deadline)
        .await;
    match end {
        End::Closed => {}
        End::Refused(why) | End::Cut(why) => rec.reason(why),
    }
    rec.finish();
}

/// How a tunnel ended.
#[derive(Debug)]
enum End {
    /// Both sides closed, or one failed.
    Closed,
    /// The first bytes failed the check; nothing reached the upstream.
    Refused(String),
    /// The proxy cut it (idle, too old, policy changed).
    Cut(String),
}

struct Tunnel<'a> {
    /// Writes the tunnel's "open" entry once its bytes start to flow.
    on_open: Box<dyn Fn() + Send + Sync>,
    host: &'a Host,
    port: u16,
    config: &'a ProxyConfig,
    meter: Arc<Meter>,
    activity: Activity,
    /// Lets the upstream's bytes through once the check passed (port 443).
    gate_open: Notify,
}

impl Tunnel<'_> {
    async fn relay(
        &self,
        client: &mut TcpStream,
        upstream: &mut TcpStream,
        early: Vec<u8>,
        policy: &mut watch::Receiver<Arc<Policy>>,
        deadline: Instant,
    ) -> End {
        let (mut client_r, mut client_w) = client.split();
        let (mut upstream_r, mut upstream_w) = upstream.split();
        let up = async {
            let first = self.gate(&mut client_r, early).await?;
            // Let through: logged as allowed even if cut from here on.
            self.meter.let_through();
            (self.on_open)();
            self.gate_open.notify_one();
            if !first.is_empty() {
                upstream_w
                    .write_all(&first)
                    .await
                    .map_err(|_| End::Closed)?;
                self.meter.add_up(first.len());
                self.activity.touch();
            }
            match Pipe::new() {
                Ok(pipe) => splice::relay(client_r.as_ref(), upstream_w.as_ref(), &pipe, |n| {
                    self.meter.add_up(n);
                    self.activity.touch();
                })
                .await
                .map_err(|_| End::Closed),
                Err(_) => pump(&mut client_r, &mut upstream_w, &self.activity, |n| self.meter.add_up(n)).await,
            }
        };
        let down = async {
            // A TLS server never speaks first; nothing reaches the client
            // from a host its ClientHello did not name.
            if self.port == TLS_PORT {
                self.gate_open.notified().await;
            }
            match Pipe::new() {
                Ok(pipe) => splice::relay(upstream_r.as_ref(), client_w.as_ref(), &pipe, |n| {
                    self.meter.add_down(n);
                    self.activity.touch();
                })
                .await
                .map_err(|_| End::Closed),
                Err(_) => pump(&mut upstream_r, &mut client_w, &self.activity, |n| self.meter.add_down(n)).await,
            }
        };
        let idle = self.config.idle_timeout;
        tokio::select! {
            both = async { tokio::try_join!(up, down) } => match both {
                Ok(_) => End::Closed,
                Err(end) => end,
            },
            () = self.activity.idle_for(idle) => End::Cut(format!("idle for {}", fmt_duration(idle))),
            () = tokio::time::sleep_until(deadline) => End::Cut(format!(
                "open longer than {}",
                fmt_duration(self.config.max_duration)
            )),
            d = denied_by_change(policy, self.host, self.port) => {
                End::Cut(format!("policy changed: {}", d.reason))
            }
        }
    }

    /// The check on the first bytes from the client. On port 443 they must
    /// be a ClientHello naming the CONNECT host; on other ports only if they
    /// start like a TLS handshake (the policy named that port explicitly, so
    /// other protocols pass as they are). Returns the bytes read so far,
    /// to be sent on first.
    async fn gate<R: AsyncRead + Unpin>(
        &self,
        client: &mut R,
        mut buf: Vec<u8>,
    ) -> Result<Vec<u8>, End> {
        if self.port != TLS_PORT {
            if buf.is_empty() {
                // The server may speak first; the other direction is open.
                let mut chunk = vec![0u8; MAX_HELLO_BYTES];
                let n = client.read(&mut chunk).await.map_err(|_| End::Closed)?;
                chunk.truncate(n);
                buf = chunk;
                self.activity.touch();
            }
            if buf.first() != Some(&TLS_HANDSHAKE) {
                return Ok(buf);
            }
        }
        let wait = self.config.handshake_timeout;
        let hello = tokio::time::timeout(wait, self.read_hello(client, &mut buf))
            .await
            .unwrap_or_else(|_| Err(format!("no ClientHello within {}", fmt_duration(wait))))
            .map_err(End::Refused)?;
        let host = self.host;
        // TLS clients send no SNI for an address (RFC 6066); one naming
        // anything but this address is fronting for another site.
        if let Some(ip) = host.ip() {
            return match hello {
                None => Ok(buf),
                Some(sni) if crate::parse_ip_literal(&sni) == Some(ip) => Ok(buf),
                Some(sni) => Err(End::Refused(format!("SNI {} does not match CONNECT address {host}", as_sent(&sni)))),
            };
        }
        match hello {
            None => Err(End::Refused(format!(
                "no SNI in the ClientHello for CONNECT host {host}"
            ))),
            Some(sni) => match normalise(&sni) {
                Ok(name) if name == *host => Ok(buf),
                Ok(name) => Err(End::Refused(format!(
                    "SNI {name} does not match CONNECT host {host}"
                ))),
                Err(_) => Err(End::Refused(format!(
                    "SNI {} does not match CONNECT host {host}",
                    as_sent(&sni)
                ))),
            },
        }
    }

    /// Reads until `buf` holds a whole ClientHello; its SNI, as sent.
    async fn read_hello<R: AsyncRead + Unpin>(
        &self,
        client: &mut R,
        buf: &mut Vec<u8>,
    ) -> Result<Option<String>, String> {
        let mut chunk = [0u8; 4096];
        loop {
            match parse_client_hello(buf) {
                Ok(Some(hello)) => return Ok(hello.sni),
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            let room = MAX_HELLO_BYTES.saturating_sub(buf.len()).min(chunk.len());
            let Some(into) = chunk.get_mut(..room).filter(|c| !c.is_empty()) else {
                return Err(format!(
                    "TLS ClientHello not complete within {MAX_HELLO_BYTES} bytes"
                ));
            };
            let n = client
                .read(into)
                .await
                .map_err(|e| format!("client failed before its ClientHello was complete: {e}"))?;
            if n == 0 {
                return Err(if buf.is_empty() {
                    "client closed the tunnel without sending a ClientHello".to_owned()
                } else {
                    "client closed the tunnel before its ClientHello was complete".to_owned()
                });
            }
            buf.extend_from_slice(into.get(..n).unwrap_or_default());
            self.activity.touch();
        }
    }
}

/// Copies until end of stream, then closes the writing side (a half-close
/// passes through). Any error ends the whole tunnel.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    activity: &Activity,
    count: impl Fn(usize),
) -> Result<(), End>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUF];
    loop {
        let n = from.read(&mut buf).await.map_err(|_| End::Closed)?;
        let Some(data) = buf.get(..n).filter(|d| !d.is_empty()) else {
            let _ = to.shutdown().await;
            return Ok(());
        };
        activity.touch();
        to.write_all(data).await.map_err(|_| End::Closed)?;
        count(n);
        activity.touch();
    }
}

/// Returns the first decision that denies `host:port` after a policy
/// change; never returns if the policy can no longer change.
pub(crate) async fn denied_by_change(
    policy: &mut watch::Receiver<Arc<Policy>>,
    host: &Host,
    port: u16,
) -> Decision {
    loop {
        if policy.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        let decision = policy.borrow_and_update().decide(host, port);
        if !decision.allowed {
            return decision;
        }
    }
}
