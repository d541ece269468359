//! One accepted client connection: its first request head decides whether
//! it becomes a tunnel or a plain HTTP connection; a head that cannot be
//! read is answered and logged here, as is a connection over the limit.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::attempt::{AttemptKind, Recorder};
use super::head::{guess, read_head, HeadError};
use super::respond::{refuse, response_bytes};
use super::{fmt_duration, forward, route, tunnel, Ctx};
use crate::{RequestHead, Target};

/// Longest wait for the head of a connection that will get a 429 anyway.
const OVER_LIMIT_WAIT: Duration = Duration::from_secs(1);

pub(crate) fn recorder(ctx: &Ctx, kind: AttemptKind, started: Instant) -> Recorder {
    Recorder::new(
        kind,
        started,
        ctx.log.clone(),
        ctx.cancel.clone(),
        Arc::default(),
    )
}

/// Serves one connection until it ends or the proxy shuts down; `_permit`
/// holds its place in the connection limit until then.
pub(crate) async fn serve(ctx: Arc<Ctx>, stream: TcpStream, _permit: OwnedSemaphorePermit) {
    tokio::select! {
        // The connection first: while its head is read it handles shutdown
        // itself, to log what was asked for.
        biased;
        () = handle(&ctx, stream) => {}
        () = ctx.cancel.cancelled() => {}
    }
}

async fn handle(ctx: &Arc<Ctx>, mut stream: TcpStream) {
    let started = Instant::now();
    let _ = stream.set_nodelay(true);
    let config = &ctx.config;
    let mut buf = Vec::new();
    let read = tokio::select! {
        read = read_head(&mut stream, &mut buf, config.handshake_timeout) => read,
        () = ctx.cancel.cancelled() => Err(HeadError::Shutdown),
    };
    let error = match read {
        Ok(head) => {
            return match head.target {
                Target::Authority { .. } => tunnel::run(ctx, stream, head, buf, started).await,
                Target::Absolute { .. } => forward::serve(ctx.clone(), stream, buf).await,
            };
        }
        // A connection that asked for nothing is not an attempt.
        Err(HeadError::Closed | HeadError::Io(_) | HeadError::Shutdown) if buf.is_empty() => return,
        Err(e) => e,
    };
    let g = guess(&buf);
    let mut rec = recorder(ctx, g.kind, started);
    rec.target(&g.host, g.port);
    let linger = config.handshake_timeout;
    match error {
        HeadError::Timeout => {
            let why = format!(
                "no complete request head within {}",
                fmt_duration(config.handshake_timeout)
            );
            refuse(&mut stream, rec, 408, &why, linger).await;
        }
        HeadError::Bad(e) => refuse(&mut stream, rec, 400, &e.to_string(), linger).await,
        HeadError::Closed => {
            rec.reason("client closed the connection before its request head was complete");
            rec.finish();
        }
        HeadError::Shutdown => {
            rec.reason("proxy shut down");
            rec.finish();
        }
        HeadError::Io(e) => {
            rec.reason(format!(
                "client connection failed before its request head was complete: {e}"
            ));
            rec.finish();
        }
    }
}

fn too_many(ctx: &Ctx) -> String {
    format!("more than {} open connections", ctx.config.max_tunnels)
}

/// Over the limit: read the head briefly (so the log says what was asked
/// for and the close does not reset unread bytes), answer 429, close.
pub(crate) async fn refuse_over_limit(
    ctx: Arc<Ctx>,
    mut stream: TcpStream,
    _permit: OwnedSemaphorePermit,
) {
    let started = Instant::now();
    let refusal = async {
        let wait = ctx.config.handshake_timeout.min(OVER_LIMIT_WAIT);
        let mut buf = Vec::new();
        let read = tokio::select! {
            read = read_head(&mut stream, &mut buf, wait) => read,
            () = ctx.cancel.cancelled() => Err(HeadError::Shutdown),
        };
        let rec = match read {
            Ok(head) => head_recorder(&ctx, &head, started),
            Err(_) => {
                let g = guess(&buf);
                let mut rec = recorder(&ctx, g.kind, started);
                rec.target(&g.host, g.port);
                rec
            }
        };
        let linger = if ctx.cancel.is_cancelled() {
            Duration::ZERO
        } else {
            wait
        };
        refuse(&mut stream, rec, 429, &too_many(&ctx), linger).await;
    };
    tokio::select! {
        // Answered and logged even when the proxy is shutting down.
        biased;
        () = refusal => {}
        () = ctx.cancel.cancelled() => {}
    }
}

/// Far over the limit: answer with whatever fits in the socket buffer
/// right now and close, without waiting for anything.
pub(crate) fn refuse_now(ctx: &Ctx, stream: TcpStream) {
    let started = Instant::now();
    let mut buf = [0u8; 2048];
    let n = stream.try_read(&mut buf).unwrap_or(0);
    let g = guess(buf.get(..n).unwrap_or_default());
    let mut rec = recorder(ctx, g.kind, started);
    rec.target(&g.host, g.port);
    let why = too_many(ctx);
    let _ = stream.try_write(&response_bytes(429, &why));
    rec.status(429);
    rec.reason(why);
    rec.finish();
}

/// A recorder for a head that parsed: the kind, and the host normalised
/// when it can be.
fn head_recorder(ctx: &Ctx, head: &RequestHead, started: Instant) -> Recorder {
    let kind = match head.target {
        Target::Authority { .. } => AttemptKind::Connect,
        Target::Absolute { .. } => AttemptKind::Http,
    };
    let mut rec = recorder(ctx, kind, started);
    rec.target(head.target.host(), head.target.port());
    if let Ok(host) = route::name(head.target.host()) {
        rec.host(&host);
    }
    rec
}
