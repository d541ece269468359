//! Routes without the bearer token, each with its own check: webhooks
//! (signed with the task's secret) and the approval page (a signed link).

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cairn_api::waits::Delivered;
use cairn_api::ErrorBody;
use cairn_runtime::gateway::webhook::{WebhookHeaders, MAX_BODY};
use cairn_runtime::intake::LinkDecision;
use serde::Deserialize;

use super::served::Routes;
use super::Rt;
use crate::gateway::page;
use crate::ApiError;

pub(super) fn routes() -> Routes {
    Routes::new()
        .post("/v1/hooks/{task}/{name}", hook)
        .get("/approve/{wait}", approval_page)
        .post("/approve/{wait}", approval_form)
        .wrap(|r| r.layer(axum::extract::DefaultBodyLimit::max(MAX_BODY)).layer(axum::middleware::map_response(approval_headers)))
}

/// The approval page's security headers (it must not be framed); the
/// webhook route answers JSON, where they do no harm.
async fn approval_headers(resp: Response) -> Response {
    cairn_console::headers::approval(resp).await
}

/// A webhook: the signature (with the task's secret) is the authentication.
#[utoipa::path(
    post,
    path = "/v1/hooks/{task}/{name}",
    operation_id = "webhook",
    tag = "gateway",
    description = "A webhook, signed per Standard Webhooks (`webhook-id`, `webhook-timestamp` and `webhook-signature` headers) with the task's `webhook_secret`; no bearer token.",
    security(("webhook_signature" = [])),
    params(
        ("task" = String, Path, description = "The task's id"),
        ("name" = String, Path, description = "The event's name"),
    ),
    request_body(content = serde_json::Value, description = "The event's data (at most 256 KiB)", content_type = "application/json"),
    responses(
        (status = 200, description = "The event was stored (or was a duplicate); what it satisfied", body = Delivered),
        (status = 401, description = "The signature does not verify", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 413, description = "The body is over 256 KiB", body = ErrorBody),
    )
)]
async fn hook(rt: Rt, Path((task, name)): Path<(String, String)>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Delivered>, ApiError> {
    let signed = WebhookHeaders::from_lookup(|n| headers.get(n).map(|v| v.as_bytes()));
    Ok(Json(rt.webhook(&task, &name, &signed, &b).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct LinkQuery {
    /// When the link expires, in Unix milliseconds.
    exp: i64,
    /// The link's signature.
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
        cairn_api::ErrorCode::Invalid => "Bad request",
        _ => "Failed",
    };
    html(e.status(), page::render_error(title, &e.message))
}

#[utoipa::path(
    get,
    path = "/approve/{wait}",
    tag = "gateway",
    description = "The approval page a signed link opens; no bearer token.",
    security(("approval_link" = [])),
    params(("wait" = String, Path, description = "The wait's id"), LinkQuery),
    responses(
        (status = 200, description = "The page with the prompt and the approve and reject buttons", content_type = "text/html; charset=utf-8", body = String),
        (status = "default", description = "An HTML page naming what failed: 403 for a link that is expired or does not verify, 404 for an unknown wait, 409 when it was already decided", content_type = "text/html; charset=utf-8", body = String),
    )
)]
async fn approval_page(rt: Rt, Path(wait): Path<String>, Query(q): Query<LinkQuery>) -> Response {
    match rt.linked_wait(&wait, q.exp, &q.sig).await {
        Ok(l) => {
            // The context is a help, not the decision: a page without it
            // still lets the approver decide on the prompt.
            let context = match rt.approval_context(l.wait.clone()).await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(wait = %l.wait.id, "the approval page's context: {e}");
                    None
                }
            };
            html(StatusCode::OK, page::render_pending(l.wait.task.as_str(), l.wait.id.as_str(), &l.prompt, q.exp, &q.sig, context.as_ref()))
        }
        Err(e) => error_page(e),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
struct ApprovalForm {
    exp: i64,
    sig: String,
    /// `approve` or `reject`.
    decision: String,
    comment: Option<String>,
}

#[utoipa::path(
    post,
    path = "/approve/{wait}",
    tag = "gateway",
    description = "The approval page's form; the link's `exp` and `sig` come in the form; no bearer token.",
    security(("approval_link" = [])),
    params(("wait" = String, Path, description = "The wait's id")),
    request_body(content = ApprovalForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "The decision was delivered", content_type = "text/html; charset=utf-8", body = String),
        (status = 400, description = "An unknown decision", content_type = "text/html; charset=utf-8", body = String),
        (status = "default", description = "An HTML page naming what failed: 403 for a link that is expired or does not verify, 404 for an unknown wait, 409 when it was already decided", content_type = "text/html; charset=utf-8", body = String),
    )
)]
async fn approval_form(rt: Rt, Path(wait): Path<String>, form: axum::Form<ApprovalForm>) -> Response {
    let link = LinkDecision { wait: &wait, exp: form.exp, sig: &form.sig, decision: &form.decision, comment: form.comment.clone() };
    match rt.approve_by_link(link, "approval-page").await {
        Ok(done) => html(StatusCode::OK, page::render_done(done.task.as_str(), &form.decision, done.comment.as_deref())),
        Err(e) => error_page(e),
    }
}
