//! The frame of every page (head, navigation, the logout form), the two
//! assets, and the small formatting helpers pages share.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::{ErrorBody, ErrorCode};
use maud::{html, Markup, DOCTYPE};

use crate::session::Session;

const STYLE: &str = include_str!("assets/console.css");
const SCRIPT: &str = include_str!("assets/console.js");

/// Which part of the navigation a page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Tasks,
    Approvals,
    System,
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="robots" content="noindex, nofollow";
            title { (title) " · Cairn" }
            link rel="stylesheet" href="/console/assets/console.css";
            script src="/console/assets/console.js" defer {}
        }
    }
}

/// A page of a logged-in session.
pub fn page(title: &str, session: &Session, section: Section, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top {
                    a.brand href="/" { "Cairn" }
                    nav {
                        a href="/" aria-current=[(section == Section::Tasks).then_some("page")] { "Tasks" }
                        a href="/console/approvals" aria-current=[(section == Section::Approvals).then_some("page")] { "Approvals" }
                        a href="/console/system" aria-current=[(section == Section::System).then_some("page")] { "System" }
                    }
                    form.logout method="post" action="/console/logout" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A page outside a session (the login form).
pub fn bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body.bare { main.narrow { (body) } }
        }
    }
}

/// An error as a page of the session, with its status.
pub fn error_page(status: StatusCode, session: &Session, section: Section, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    (status, page(title, session, section, html! { h1 { (title) } p.problem role="alert" { (message) } })).into_response()
}

/// An error as the API's JSON error body: for requests that are not for
/// a page (a form post refused, an event stream without a session).
pub fn error_json(status: StatusCode, message: &str) -> Response {
    (status, Json(ErrorBody::new(ErrorCode::for_status(status.as_u16()), message))).into_response()
}

/// The style sheet and the script.
pub async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        _ => return error_json(StatusCode::NOT_FOUND, &format!("no console asset {file:?}")),
    };
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The time now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// How long ago, coarsely: `42s`, `7m`, `3h`, `12d`.
pub fn ago(ms: i64, now_ms: i64) -> String {
    let s = (now_ms - ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A duration in milliseconds, for people.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{}m {}s", ms / 60_000, ms % 60_000 / 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_614_265_330_000), "2021-02-25 15:02:10");
        assert_eq!(ago(0, 59_999), "59s");
        assert_eq!(ago(0, 3_600_000), "1h");
        assert_eq!(ago(10, 0), "0s");
        assert_eq!(duration(999), "999 ms");
        assert_eq!(duration(1500), "1.5 s");
        assert_eq!(duration(125_000), "2m 5s");
        assert_eq!(query_escape("/console/tasks/t1?a=b&c"), "/console/tasks/t1%3Fa%3Db%26c");
    }

    #[test]
    fn pages_escape_what_they_show() {
        let s = Session { id: "i".into(), csrf: "c\"sr<f".into() };
        let p = page("<script>alert(1)</script>", &s, Section::Tasks, html! { p { ("<img src=x onerror=alert(1)>") } }).into_string();
        assert!(!p.contains("<script>alert"), "{p}");
        assert!(!p.contains("<img"), "{p}");
        assert!(p.contains("value=\"c&quot;sr&lt;f\""), "{p}");
        assert_eq!(p.matches("<script").count(), 1, "only the console's own script: {p}");
        assert!(p.contains("<script src=\"/console/assets/console.js\" defer></script>"));
    }
}
