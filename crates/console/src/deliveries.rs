//! A delivery: its signed record checked by the daemon (what `cairn
//! verify` checks, from the store), its deliverables with their digests
//! to download, and the record's signed predicate.

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;
use serde::Deserialize;

use crate::layout::{self, page, query_escape, Section};
use crate::session::Session;
use crate::Console;

fn status_of(e: &cairn_runtime::Error) -> StatusCode {
    match e {
        cairn_runtime::Error::NotFound(_) => StatusCode::NOT_FOUND,
        cairn_runtime::Error::Invalid(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub async fn show(State(console): State<Console>, Extension(session): Extension<Session>, Path(record): Path<String>) -> Response {
    let v = match console.rt.verify_record(&record).await {
        Ok(v) => v,
        Err(e) => return layout::error_page(status_of(&e), &session, Section::Tasks, &e.to_string()),
    };
    let body = html! {
        h1 { "Delivery record" }
        p.verdict {
            @if v.verified { span.ok { "verified" } ": signed by node key " code { (v.key_id.as_deref().unwrap_or("")) } ", every deliverable matches its digest, and the task's ledger holds the signed entry" }
            @else { span.no { "does not verify" } ": " (v.problem.as_deref().unwrap_or("")) }
        }
        dl.meta {
            dt { "Record" } dd { code { (v.record) } " · " a href={ "/console/deliverables/" (v.record) "?kind=record&name=record.json" } { "download" } }
            @if let Some(task) = &v.task { dt { "Task" } dd { a href={ "/console/tasks/" (task) } { code { (task) } } } }
            @if let (Some(seq), Some(head)) = (v.ledger_seq, &v.ledger_head) { dt { "Ledger entry" } dd { (seq) " " code { (head) } } }
        }
        h2 { "Deliverables" }
        table.tasks {
            thead { tr { th { "Name" } th { "SHA-256" } } }
            tbody {
                @for (name, sha) in &v.deliverables {
                    tr {
                        td { a href={ "/console/deliverables/" (sha) "?name=" (query_escape(name)) } { (name) } }
                        td { code { (sha) } }
                    }
                }
            }
        }
        @if let Some(p) = &v.predicate {
            details { summary { "The signed predicate" } pre { (serde_json::to_string_pretty(p).unwrap_or_default()) } }
        }
    };
    page("Delivery", &session, Section::Tasks, body).into_response()
}

#[derive(Debug, Deserialize)]
pub struct DownloadQuery {
    /// The file name to save it as.
    name: Option<String>,
    /// `record` for the record itself; else a deliverable.
    kind: Option<String>,
}

/// A name safe in a `Content-Disposition` header: letters, digits, `.`,
/// `-` and `_`; anything else becomes `_`.
fn safe_name(name: &str) -> String {
    let s: String = name.chars().take(100).map(|c| if c.is_ascii_alphanumeric() || ".-_".contains(c) { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') { format!("download{s}") } else { s }
}

/// A deliverable's (or the record's) bytes, as a download.
pub async fn download(State(console): State<Console>, Path(sha): Path<String>, Query(q): Query<DownloadQuery>) -> Response {
    let bytes = match q.kind.as_deref() {
        Some("record") => console.rt.record(&sha).await,
        _ => console.rt.deliverable(&sha).await,
    };
    match bytes {
        Ok(b) => {
            let name = safe_name(q.name.as_deref().unwrap_or(&sha));
            (
                [(header::CONTENT_TYPE, "application/octet-stream".to_owned()), (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\""))],
                b,
            )
                .into_response()
        }
        Err(e) => layout::error_json(status_of(&e), &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_names_are_safe_in_a_header() {
        assert_eq!(safe_name("report.md"), "report.md");
        assert_eq!(safe_name("a\"; b=c\r\nx"), "a___b_c__x");
        assert_eq!(safe_name(".."), "download..");
        assert_eq!(safe_name(""), "download");
    }
}
