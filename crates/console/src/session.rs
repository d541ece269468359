//! Logging in. The API token, given once in the login form, opens a
//! session kept in the daemon's memory; the browser holds only the
//! session's random id, in an `HttpOnly`, `SameSite=Strict` cookie (and
//! `Secure` behind a TLS-terminating proxy that says so with
//! `X-Forwarded-Proto: https`). Logging out forgets the session, so a
//! copied cookie stops working; a daemon restart forgets them all.
//!
//! Every form of a session carries the session's own random token, which
//! the handler compares with the session's (CSRF); a request that a
//! browser marks as cross-site (`Sec-Fetch-Site`, or an `Origin` naming
//! another host) is refused before any of that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::html;
use rand::RngCore;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::layout::{self, error_json};
use crate::Console;

/// The session cookie's name.
pub const COOKIE: &str = "cairn_session";
/// How long a session lasts after its login.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at once; past it the one closest to its end goes first.
const MAX_SESSIONS: usize = 1024;

/// The open sessions, and the token that opens one.
pub struct Sessions {
    token: Arc<String>,
    open: Mutex<HashMap<String, Expiring>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

struct Expiring {
    csrf: String,
    until: Instant,
}

/// The session of a request that passed [`require`]: what its handlers
/// and forms need.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: String,
    /// The token its forms carry in their `csrf` field.
    pub csrf: String,
}

impl Session {
    /// Whether a form's `csrf` field is this session's.
    pub fn csrf_ok(&self, given: &str) -> bool {
        bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// The answer to a form whose `csrf` field is not its session's.
pub fn csrf_refused() -> Response {
    error_json(StatusCode::FORBIDDEN, "the form's csrf token is not this session's: reload the page and send it again")
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

impl Sessions {
    pub fn new(token: Arc<String>) -> Sessions {
        Sessions { token, open: Mutex::new(HashMap::new()) }
    }

    /// A new session if `given` is the API token.
    pub fn log_in(&self, given: &str) -> Option<Session> {
        if !bool::from(given.as_bytes().ct_eq(self.token.as_bytes())) || given.is_empty() {
            return None;
        }
        let now = Instant::now();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, s| s.until > now);
        if open.len() >= MAX_SESSIONS {
            if let Some(first) = open.iter().min_by_key(|(_, s)| s.until).map(|(id, _)| id.clone()) {
                open.remove(&first);
            }
        }
        let session = Session { id: random_hex(), csrf: random_hex() };
        open.insert(session.id.clone(), Expiring { csrf: session.csrf.clone(), until: now + LIFETIME });
        Some(session)
    }

    /// The live session with this id.
    pub fn find(&self, id: &str) -> Option<Session> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get(id) {
            Some(s) if s.until > Instant::now() => Some(Session { id: id.to_owned(), csrf: s.csrf.clone() }),
            Some(_) => {
                open.remove(id);
                None
            }
            None => None,
        }
    }

    pub fn log_out(&self, id: &str) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// The value of the session cookie, if the request carries one.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// Whether a browser says the request comes from another site: a form
/// posted from elsewhere, or a script of another origin.
fn cross_site(headers: &HeaderMap) -> bool {
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if matches!(fetch_site, Some("cross-site") | Some("same-site")) {
        return true;
    }
    let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) else {
        return false;
    };
    let origin = origin.to_str().unwrap_or("");
    let host = host.to_str().unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, rest)| rest).unwrap_or(origin);
    origin_host != host
}

/// The session's cookie header: `Secure` when a proxy in front says the
/// browser came over TLS.
fn set_cookie(value: &str, max_age: u64, headers: &HeaderMap) -> String {
    let secure = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) == Some("https");
    format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{}", if secure { "; Secure" } else { "" })
}

/// Lets through requests of a live session (with the [`Session`] in
/// their extensions); a page asked for without one is sent to the login
/// form, anything else refused with 401. Unsafe methods from another
/// site are refused with 403 whatever they carry.
pub async fn require(State(console): State<Console>, mut req: Request, next: Next) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD && cross_site(req.headers()) {
        return error_json(StatusCode::FORBIDDEN, "a cross-site request to the console");
    }
    match cookie(req.headers()).and_then(|id| console.sessions.find(&id)) {
        Some(session) => {
            req.extensions_mut().insert(session);
            next.run(req).await
        }
        // Event streams (a timeline's rows, a command's output) are not pages.
        None if req.method() == Method::GET && !req.uri().path().ends_with("/live") && !req.uri().path().ends_with("/output") => {
            let next_page = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let to = format!("/console/login?next={}", layout::query_escape(next_page));
            Redirect::to(&to).into_response()
        }
        None => error_json(StatusCode::UNAUTHORIZED, "log in to the console first (no session, or it ended)"),
    }
}

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    next: Option<String>,
}

/// Where to go after logging in: a path of this site only.
fn local_path(next: Option<&str>) -> &str {
    match next {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') => p,
        _ => "/",
    }
}

fn login_form(next: &str, problem: Option<&str>) -> maud::Markup {
    layout::bare(
        "Log in",
        html! {
            h1 { "Cairn console" }
            p.lede { "Log in with the daemon's API token: the file " code { "token" } " in its home (" code { "$CAIRN_HOME/token" } ")." }
            @if let Some(p) = problem { p.problem role="alert" { (p) } }
            form method="post" action="/console/login" {
                input type="hidden" name="next" value=(next);
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                div.actions { button type="submit" { "Log in" } }
            }
        },
    )
}

pub async fn login_page(axum::extract::Query(q): axum::extract::Query<LoginQuery>) -> maud::Markup {
    login_form(local_path(q.next.as_deref()), None)
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    token: String,
    next: Option<String>,
}

pub async fn login(State(console): State<Console>, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if cross_site(&headers) {
        return error_json(StatusCode::FORBIDDEN, "a cross-site request to the console");
    }
    let next = local_path(f.next.as_deref());
    match console.sessions.log_in(f.token.trim()) {
        Some(session) => {
            let cookie = set_cookie(&session.id, LIFETIME.as_secs(), &headers);
            ([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response()
        }
        None => (StatusCode::UNAUTHORIZED, login_form(next, Some("That is not the daemon's API token."))).into_response(),
    }
}

#[derive(Debug, Deserialize)]
pub struct LogoutForm {
    csrf: String,
}

pub async fn logout(State(console): State<Console>, Extension(session): Extension<Session>, headers: HeaderMap, Form(f): Form<LogoutForm>) -> Response {
    if !session.csrf_ok(&f.csrf) {
        return csrf_refused();
    }
    console.sessions.log_out(&session.id);
    ([(header::SET_COOKIE, set_cookie("", 0, &headers))], Redirect::to("/console/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn sessions() -> Sessions {
        Sessions::new(Arc::new("tok-123".into()))
    }

    #[test]
    fn only_the_token_opens_a_session_and_logging_out_ends_it() {
        let s = sessions();
        assert!(s.log_in("tok-12").is_none());
        assert!(s.log_in("").is_none());
        assert!(s.log_in("tok-1234").is_none());
        let a = s.log_in("tok-123").expect("the token opens a session");
        let b = s.log_in("tok-123").expect("a second session");
        assert_ne!(a.id, b.id);
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(a.id.len(), 64);
        assert_eq!(s.find(&a.id).map(|f| f.csrf), Some(a.csrf.clone()));
        s.log_out(&a.id);
        assert!(s.find(&a.id).is_none(), "a replayed cookie after logout");
        assert!(s.find(&b.id).is_some(), "the other session stays");
        assert!(s.find("0".repeat(64).as_str()).is_none(), "a forged id");
    }

    #[test]
    fn csrf_must_be_the_sessions_own() {
        let s = sessions();
        let a = s.log_in("tok-123").expect("session");
        let b = s.log_in("tok-123").expect("session");
        assert!(a.csrf_ok(&a.csrf));
        assert!(!a.csrf_ok(&b.csrf));
        assert!(!a.csrf_ok(""));
    }

    #[test]
    fn sessions_are_bounded() {
        let s = sessions();
        let first = s.log_in("tok-123").expect("session");
        for _ in 0..MAX_SESSIONS {
            s.log_in("tok-123").expect("session");
        }
        assert!(s.find(&first.id).is_none(), "the oldest went first");
        assert_eq!(s.open.lock().map(|o| o.len()).unwrap_or(0), MAX_SESSIONS);
    }

    #[test]
    fn reads_the_cookie_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; cairn_session=abc; b=2"));
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        h.insert(header::COOKIE, HeaderValue::from_static("cairn_sessionx=abc"));
        assert_eq!(cookie(&h), None);
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let mut h = HeaderMap::new();
        assert!(!cross_site(&h), "no browser headers: a client, not a page");
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7878"));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:7878"));
        assert!(!cross_site(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://attacker.example.com"));
        assert!(cross_site(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:7878"));
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_site(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_site(&h));
    }

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(local_path(Some("/console/tasks/t1")), "/console/tasks/t1");
        assert_eq!(local_path(Some("//evil.example.com/")), "/");
        assert_eq!(local_path(Some("https://evil.example.com/")), "/");
        assert_eq!(local_path(Some("/\\evil.example.com")), "/");
        assert_eq!(local_path(None), "/");
    }

    #[test]
    fn cookie_flags() {
        let mut h = HeaderMap::new();
        let c = set_cookie("abc", 60, &h);
        assert_eq!(c, "cairn_session=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=60");
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(set_cookie("abc", 60, &h).ends_with("; Secure"));
    }
}
