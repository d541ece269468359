//! Routes without the bearer token, each with its own check: webhooks
//! (signed with the task's secret) and the approval page (a signed link).

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_api::waits::{ApproveRequest, Delivered};
use cairn_runtime::gateway::webhook::{WebhookHeaders, MAX_BODY};
use serde::Deserialize;

use super::waits::delivered;
use super::Rt;
use crate::gateway::page;
use crate::ApiError;

pub(super) fn routes() -> Router<std::sync::Arc<cairn_runtime::Runtime>> {
    Router::new()
        .route("/v1/hooks/{task}/{name}", post(hook))
        .route("/approve/{wait}", get(approval_page).post(approval_form))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

/// A webhook: the signature (with the task's secret) is the authentication.
async fn hook(rt: Rt, Path((task, name)): Path<(String, String)>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Delivered>, ApiError> {
    let signed = WebhookHeaders::from_lookup(|n| headers.get(n).map(|v| v.as_bytes()));
    Ok(Json(delivered(&rt.webhook(&task, &name, &signed, &b).await?)))
}

#[derive(Deserialize)]
struct LinkQuery {
    exp: i64,
    sig: String,
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// The error page for a refused link or a failed decision.
fn error_page(e: cairn_runtime::Error) -> Response {
    let e = ApiError::from(e);
    let title = match e.code {
        cairn_api::ErrorCode::Forbidden => "Link not valid",
        cairn_api::ErrorCode::NotFound => "Not found",
        cairn_api::ErrorCode::Conflict => "Already decided",
        _ => "Failed",
    };
    html(e.status(), page::render_error(title, &e.message))
}

async fn approval_page(rt: Rt, Path(wait): Path<String>, Query(q): Query<LinkQuery>) -> Response {
    match rt.linked_wait(&wait, q.exp, &q.sig).await {
        Ok(l) => html(StatusCode::OK, page::render_pending(l.wait.task.as_str(), l.wait.id.as_str(), &l.prompt, q.exp, &q.sig)),
        Err(e) => error_page(e),
    }
}

#[derive(Deserialize)]
struct ApprovalForm {
    exp: i64,
    sig: String,
    decision: String,
    comment: Option<String>,
}

async fn approval_form(rt: Rt, Path(wait): Path<String>, form: axum::Form<ApprovalForm>) -> Response {
    let w = match rt.linked_wait(&wait, form.exp, &form.sig).await {
        Ok(l) => l.wait,
        Err(e) => return error_page(e),
    };
    let approve = match form.decision.as_str() {
        "approve" => true,
        "reject" => false,
        other => return html(StatusCode::BAD_REQUEST, page::render_error("Bad request", &format!("unknown decision {other:?}"))),
    };
    let comment = form.comment.clone().filter(|c| !c.trim().is_empty());
    let req = ApproveRequest { approve, comment: comment.clone() };
    match rt.approve_wait(&w.task, req, "approval-page").await {
        Ok(_) => html(StatusCode::OK, page::render_done(w.task.as_str(), &form.decision, comment.as_deref())),
        Err(e) => error_page(e),
    }
}
