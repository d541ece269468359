//! A task's ports over HTTP and WebSocket, relayed by the daemon:
//!
//! - by path: `/v1/tasks/{id}/ports/{port}/...` (the rest of the path and
//!   the query go to the task's server as they are);
//! - by host name: `{port}-{id}.{domain}`, what E2B's `get_host(port)`
//!   returns, for any domain whose names reach the daemon (a wildcard DNS
//!   record, or the client's own resolution).
//!
//! Who may: the daemon's API token (`Authorization: Bearer`), the task's
//! traffic token (`X-Cairn-Traffic-Token`, or E2B's
//! `E2b-Traffic-Access-Token`), or a signed link to the port
//! (`?exp=&sig=`, from `cairn port TASK PORT`), which also sets a cookie
//! for that port's path so a browser's next requests follow. Each request
//! is counted in the metrics and logged in the task's event log.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cairn_api::ErrorCode;
use cairn_runtime::Runtime;
use subtle::ConstantTimeEq;

use crate::ApiError;

/// The cookie a signed link leaves for its port's path.
const LINK_COOKIE: &str = "cairn_port_link";

/// Where a request is going: a task's port, and the path there.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    task: String,
    port: u16,
    /// The path and query for the task's server.
    rest: String,
    /// The path prefix the link cookie is scoped to (by-path requests).
    cookie_path: Option<String>,
}

/// `/v1/tasks/{id}/ports/{port}/rest?query`, or why it is not a port.
fn by_path(path_and_query: &str) -> Option<Result<Target, ApiError>> {
    let rest = path_and_query.strip_prefix("/v1/tasks/")?;
    let (task, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("ports/")?;
    let (port, rest) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => return Some(Err(ApiError::bad_request(format!("port {port:?} is out of range: give 1 to 65535")))),
    };
    let rest = if rest.starts_with('/') { rest.to_owned() } else { format!("/{rest}") };
    Some(Ok(Target { task: task.to_owned(), port, rest, cookie_path: Some(format!("/v1/tasks/{task}/ports/{port}/")) }))
}

/// `{port}-{id}.{domain}` in the `Host` header.
fn by_host(host: &str, path_and_query: &str) -> Option<Target> {
    let name = host.split(':').next()?;
    let (first, domain) = name.split_once('.')?;
    if domain.is_empty() {
        return None;
    }
    let (port, task) = first.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    if task.is_empty() || !task.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(Target { task: task.to_owned(), port, rest: path_and_query.to_owned(), cookie_path: None })
}

/// The port a request is for, by path or by host name; `None` when it is
/// for no port.
async fn target_of(rt: &Runtime, uri: &Uri, headers: &HeaderMap) -> Option<Result<Target, ApiError>> {
    let pq = uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "/".into());
    if let Some(found) = by_path(&pq) {
        return Some(found);
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let target = by_host(host, &pq)?;
    // A name that is not a task's is not ours to answer.
    rt.show(&target.task).await.is_ok().then_some(Ok(target))
}

/// Middleware: requests for a task's port are relayed to it; others go on.
pub async fn serve_ports(State((rt, token)): State<(Arc<Runtime>, Arc<String>)>, req: Request, next: Next) -> Response {
    match target_of(&rt, req.uri(), req.headers()).await {
        Some(Ok(target)) => relay_to_port(&rt, &token, target, req).await,
        Some(Err(e)) => e.into_response(),
        None => next.run(req).await,
    }
}

/// The task of a request for one of its ports that carries a valid
/// credential (see [`authorize`]); `None` for anything else.
pub(crate) async fn authorized_port_task(rt: &Runtime, token: &str, uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let target = target_of(rt, uri, headers).await?.ok()?;
    authorize(rt, token, &target, headers, uri.query()).ok()?;
    Some(target.task)
}

async fn relay_to_port(rt: &Arc<Runtime>, token: &str, target: Target, mut req: Request) -> Response {
    let link = match authorize(rt, token, &target, req.headers(), req.uri().query()) {
        Ok(link) => link,
        Err(e) => return e.into_response(),
    };
    // A signed link's own parameters stay here: neither the task's server
    // nor its log sees them.
    let rest = if link.is_some() { without_link_params(&target.rest) } else { target.rest.clone() };
    let method = req.method().to_string();
    // The daemon's credentials are not the task's server's business.
    for h in [header::AUTHORIZATION.as_str(), "x-cairn-traffic-token", "e2b-traffic-access-token"] {
        req.headers_mut().remove(h);
    }
    match rest.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return ApiError::bad_request(format!("cannot relay the path {rest:?}: {e}")).into_response(),
    }
    let broke = |e: String| ApiError::new(ErrorCode::Unavailable, format!("port {} of task {}: the server there broke off: {e}", target.port, target.task)).into_response();
    let mut resp = if crate::port_pool::reusable(&req) {
        // Kept-alive connections: see `port_pool`.
        let connect = rt.connect_port(&target.task, target.port, "port");
        match crate::port_pool::send(&target.task, target.port, req, connect).await {
            Ok(r) => r,
            Err(crate::port_pool::SendError::Connect(e)) => return ApiError::from(e).into_response(),
            Err(crate::port_pool::SendError::Broken(e)) => return broke(e),
        }
    } else {
        let stream = match rt.connect_port(&target.task, target.port, "port").await {
            Ok(s) => s,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let host = format!("127.0.0.1:{}", target.port);
        match crate::forward::relay(stream, req, &host).await {
            Ok(r) => r,
            Err(e) => return broke(e),
        }
    };
    if let (Some(query), Some(path)) = (link, &target.cookie_path) {
        let cookie = format!("{LINK_COOKIE}={query}; Path={path}; HttpOnly; SameSite=Lax");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    // Logged beside the answer, not before it: the event log's write is
    // not on the request's path.
    let (rt, status) = (rt.clone(), resp.status().as_u16());
    tokio::spawn(async move { rt.record_port_request(&target.task, target.port, &method, &rest, status, "port").await });
    resp
}

/// `path?query` without the query's `exp` and `sig`.
fn without_link_params(rest: &str) -> String {
    let Some((path, query)) = rest.split_once('?') else { return rest.to_owned() };
    let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("exp=") && !p.starts_with("sig=")).collect();
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// Checks who asks. `Ok(Some(link))` when a signed link in the query let
/// the request in (its `exp` and `sig`, for the cookie).
fn authorize(rt: &Runtime, token: &str, target: &Target, headers: &HeaderMap, query: Option<&str>) -> Result<Option<String>, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(bearer) = header("authorization").and_then(|v| v.strip_prefix("Bearer ")) {
        if bool::from(bearer.as_bytes().ct_eq(token.as_bytes())) {
            return Ok(None);
        }
    }
    if let Some(t) = header("x-cairn-traffic-token").or(header("e2b-traffic-access-token")) {
        if rt.check_traffic_token(&target.task, t) {
            return Ok(None);
        }
    }
    let link_in = |text: &str, sep: char| -> Option<(i64, String)> {
        let mut exp = None;
        let mut sig = None;
        for pair in text.split(sep) {
            match pair.trim().split_once('=') {
                Some(("exp", v)) => exp = v.parse::<i64>().ok(),
                Some(("sig", v)) => sig = Some(v.to_owned()),
                _ => {}
            }
        }
        Some((exp?, sig?))
    };
    if let Some((exp, sig)) = query.and_then(|q| link_in(q, '&')) {
        if rt.check_port_link(&target.task, target.port, exp, &sig) {
            return Ok(Some(format!("exp={exp}.sig={sig}")));
        }
        return Err(ApiError::new(ErrorCode::Unauthorized, format!("the link to port {} of task {} is not valid (or has expired)", target.port, target.task)));
    }
    let cookies = headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|c| c.split(';')).map(str::trim);
    for c in cookies {
        if let Some(v) = c.strip_prefix(&format!("{LINK_COOKIE}=")) {
            if let Some((exp, sig)) = link_in(v, '.') {
                if rt.check_port_link(&target.task, target.port, exp, &sig) {
                    return Ok(None);
                }
            }
        }
    }
    Err(ApiError::new(ErrorCode::Unauthorized, format!("port {} of task {}: give the API token, the task's traffic token or a signed link (cairn port)", target.port, target.task)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_host_names_name_a_port() {
        let t = by_path("/v1/tasks/tabc/ports/8080/index.html?q=1").unwrap().unwrap();
        assert_eq!((t.task.as_str(), t.port, t.rest.as_str()), ("tabc", 8080, "/index.html?q=1"));
        assert_eq!(by_path("/v1/tasks/tabc/ports/80").unwrap().unwrap().rest, "/");
        assert_eq!(by_path("/v1/tasks/tabc/ports/80?x=1").unwrap().unwrap().rest, "/?x=1");
        assert!(by_path("/v1/tasks/tabc/ports/70000/").unwrap().is_err());
        assert!(by_path("/v1/tasks/tabc/ports/0/").unwrap().is_err());
        assert!(by_path("/v1/tasks/tabc/exec").is_none());
        let h = by_host("3000-tabc123.sandbox.example.com:7878", "/ws").unwrap();
        assert_eq!((h.task.as_str(), h.port, h.rest.as_str()), ("tabc123", 3000, "/ws"));
        assert!(by_host("127.0.0.1:7878", "/").is_none());
        assert!(by_host("api.example.com", "/").is_none());
        assert!(by_host("99999-tabc.example.com", "/").is_none());
        assert!(by_host("3000-t.b.example.com", "/").is_some_and(|t| t.task == "t"));
        assert_eq!(without_link_params("/a?exp=1&sig=x"), "/a");
        assert_eq!(without_link_params("/a?q=1&exp=1&sig=x"), "/a?q=1");
        assert_eq!(without_link_params("/a"), "/a");
    }
}
