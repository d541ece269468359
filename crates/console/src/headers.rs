//! The headers every page is sent with: a Content-Security-Policy that
//! allows no inline script and nothing from another origin, no framing
//! (`frame-ancestors 'none'`, and `X-Frame-Options` for older browsers),
//! no MIME sniffing and no referrer to other sites (a page's URL may be an
//! approval link).

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;

/// The console's policy: its own style sheet and script, its own
/// forms and event streams, inline SVG charts.
pub const CONSOLE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The approval page's policy: no script at all, its inline style.
pub const APPROVAL_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers, with `policy` as the page's CSP.
pub fn secure(mut resp: Response, policy: &'static str) -> Response {
    let h = resp.headers_mut();
    h.insert(HeaderName::from_static("content-security-policy"), HeaderValue::from_static(policy));
    h.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    h.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
    h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    resp
}

/// The console's pages, as a response mapper.
pub async fn console(resp: Response) -> Response {
    let mut resp = secure(resp, CONSOLE_POLICY);
    let h = resp.headers_mut();
    // Pages show live state and a session's form tokens: never cached.
    h.insert(HeaderName::from_static("cache-control"), HeaderValue::from_static("no-store"));
    // A browser sends `Origin: null` with a form posted from a page under
    // `no-referrer`, which the CSRF check must refuse; the console links
    // nowhere else, so its own origin is all a referrer tells.
    h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("same-origin"));
    resp
}

/// The approval page, as a response mapper.
pub async fn approval(resp: Response) -> Response {
    secure(resp, APPROVAL_POLICY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_allow_no_inline_script_and_no_framing() {
        for p in [CONSOLE_POLICY, APPROVAL_POLICY] {
            assert!(p.contains("frame-ancestors 'none'"), "{p}");
            assert!(p.starts_with("default-src 'none'"), "{p}");
            let script = p.split(';').map(str::trim).find(|d| d.starts_with("script-src")).unwrap_or("");
            assert!(!script.contains("unsafe-inline") && !script.contains("unsafe-eval"), "{p}");
        }
        let r = secure(Response::new(axum::body::Body::empty()), APPROVAL_POLICY);
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(r.headers()["x-frame-options"], "DENY");
        assert_eq!(r.headers()["content-security-policy"], APPROVAL_POLICY);
    }
}
