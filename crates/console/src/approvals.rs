//! Pending approvals, each with what an approver needs (the task, its
//! step, the prompt, the files changed since its last milestone, its last
//! commands) and an Approve / Reject form with a note.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use cairn_api::waits::{ApprovalContext, ApproveRequest};
use maud::{html, Markup};
use serde::Deserialize;

use crate::layout::{self, page, Section};
use crate::session::Session;
use crate::timeline;
use crate::Console;

/// Paths listed per kind of change; the rest are counted.
const PATHS_SHOWN: usize = 20;

fn paths(label: &str, list: &[String]) -> Markup {
    html! {
        @if !list.is_empty() {
            li { (label) " (" (list.len()) "): "
                @for (i, p) in list.iter().take(PATHS_SHOWN).enumerate() {
                    @if i > 0 { ", " }
                    code { (p) }
                }
                @if list.len() > PATHS_SHOWN { " and " (list.len() - PATHS_SHOWN) " more" }
            }
        }
    }
}

/// One pending approval as a card.
pub fn card(a: &ApprovalContext, csrf: &str) -> Markup {
    let task = a.wait.task.as_str();
    html! {
        article.approval id={ "approval-" (task) } {
            h2 {
                a href={ "/console/tasks/" (task) } { @if let Some(n) = &a.task_name { (n) " " } code { (task) } }
                " · step " (a.step)
            }
            p { "Waiting since " (layout::utc(a.wait.created_ms)) " UTC" }
            div.prompt { (a.prompt) }
            @if let Some(m) = &a.since_milestone {
                h3 { "Changed since milestone " code { (m.milestone) } @if !m.note.is_empty() { " (" (m.note) ")" } }
                @if m.diff.added.is_empty() && m.diff.changed.is_empty() && m.diff.deleted.is_empty() {
                    p { "Nothing." }
                } @else {
                    ul.changes {
                        (paths("added", &m.diff.added))
                        (paths("changed", &m.diff.changed))
                        (paths("deleted", &m.diff.deleted))
                    }
                }
            } @else {
                p.hint { "No milestone snapshot yet." }
            }
            @if !a.last_commands.is_empty() {
                h3 { "Last commands" }
                ol.timeline { @for e in &a.last_commands { (timeline::row(e)) } }
            }
            form method="post" action={ "/console/approvals/" (task) } {
                input type="hidden" name="csrf" value=(csrf);
                label for={ "note-" (task) } { "Note " span.hint { "(optional, passed on to the task)" } }
                textarea id={ "note-" (task) } name="note" rows="2" maxlength="4000" {}
                div.actions {
                    button.approve type="submit" name="decision" value="approve" { "Approve" }
                    button.reject type="submit" name="decision" value="reject" { "Reject" }
                }
            }
        }
    }
}

pub async fn list(State(console): State<Console>, Extension(session): Extension<Session>) -> Response {
    let pending = match console.rt.pending_approvals().await {
        Ok(p) => p,
        Err(e) => return layout::error_page(StatusCode::INTERNAL_SERVER_ERROR, &session, Section::Approvals, &e.to_string()),
    };
    let body = html! {
        h1 { "Approvals" }
        @if pending.is_empty() { p.empty { "No task is waiting for an approval." } }
        @for a in &pending { (card(a, &session.csrf)) }
    };
    page("Approvals", &session, Section::Approvals, body).into_response()
}

#[derive(Debug, Deserialize)]
pub struct Decision {
    csrf: String,
    /// `approve` or `reject`.
    decision: String,
    note: Option<String>,
}

/// Approves or rejects, then shows the task's timeline, where the wake
/// appears.
pub async fn decide(State(console): State<Console>, Extension(session): Extension<Session>, Path(task): Path<String>, Form(d): Form<Decision>) -> Response {
    if !session.csrf_ok(&d.csrf) {
        return crate::session::csrf_refused();
    }
    let approve = match d.decision.as_str() {
        "approve" => true,
        "reject" => false,
        other => return layout::error_page(StatusCode::BAD_REQUEST, &session, Section::Approvals, &format!("unknown decision {other:?}: approve or reject")),
    };
    let comment = d.note.filter(|n| !n.trim().is_empty());
    match console.rt.approve(&task, ApproveRequest { approve, comment }, "console").await {
        Ok(_) => Redirect::to(&format!("/console/tasks/{}", layout::query_escape(&task))).into_response(),
        Err(e) => {
            let status = match e {
                cairn_runtime::Error::NotFound(_) => StatusCode::NOT_FOUND,
                cairn_runtime::Error::Conflict(_) => StatusCode::CONFLICT,
                cairn_runtime::Error::Invalid(_) => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            layout::error_page(status, &session, Section::Approvals, &e.to_string())
        }
    }
}
