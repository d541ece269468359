//! The HTTP API, under `/v1`, bearer-token authenticated.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | /v1/health | daemon version and home |
//! | GET, POST | /v1/tasks | list, create ([`CreateRequest`]) |
//! | GET, DELETE | /v1/tasks/{id} | show, destroy |
//! | GET | /v1/tasks/{id}/events | the event log |
//! | GET (WebSocket) | /v1/tasks/{id}/exec | run a command ([`crate::exec`]) |
//! | GET, PUT | /v1/tasks/{id}/files | tar out of / into the sandbox |
//! | GET, POST | /v1/tasks/{id}/snapshots | list, take ([`SnapshotRequest`]) |
//! | GET | /v1/tasks/{id}/snapshots/diff?a=S&b=S | added, changed, deleted paths |
//! | POST | /v1/tasks/{id}/rollback | roll back in place ([`RollbackRequest`]) |
//! | POST | /v1/tasks/{id}/fork | new tasks from a snapshot ([`ForkRequest`]) |
//! | GET | /v1/tasks/{id}/progress | the snapshot or restore in progress, if any |
//! | POST | /v1/gc | retention, then mark and sweep ([`GcRequest`]) |
//! | POST | /v1/check | `{read_data}`: verify the blob store |
//! | POST | /v1/tasks/{id}/waits | wait ([`WaitRequest`]): suspends until satisfied |
//! | GET | /v1/waits/{id}?block_ms=N | a wait, optionally blocking until satisfied |
//! | POST | /v1/tasks/{id}/approve | approve or reject ([`ApproveRequest`]) |
//! | GET, POST | /v1/tasks/{id}/inbox | the inbox; an operator's event ([`EventRequest`]) |
//! | POST | /v1/tasks/{id}/suspend, /resume | suspend now; wake now |
//! | GET | /v1/tasks/{id}/watch?after=SEQ | the event log as server-sent events, live |
//! | GET | /v1/tasks/{id}/ledger | walk the hash chain, check it against the signed checkpoints |
//! | POST | /v1/tasks/{id}/checkpoint | sign the chain's head now |
//! | GET | /v1/keys | the node's public keys, current first |
//! | POST | /v1/keys/rotate | a new signing key; the old public key stays |
//! | GET, POST | /v1/images | list, import `{name, path}` |
//!
//! Without the bearer token (their own checks):
//!
//! | method | path | what |
//! |---|---|---|
//! | POST | /v1/hooks/{task}/{name} | a webhook, signed per Standard Webhooks with the task's secret |
//! | GET, POST | /approve/{wait}?exp=&sig= | the approval page and its form (a signed link) |
//! | DELETE | /v1/images/{name} | remove |
//!
//! Errors are `{"error": {"code": "...", "message": "..."}}` with a 4xx/5xx
//! status; the codes are [`cairn_api::ErrorCode`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use cairn_core::TaskState;
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use cairn_api::images::ImportRequest;
use cairn_api::snapshots::CheckRequest;

use crate::snapshots::{ForkRequest, GcRequest, RollbackRequest, SnapshotRequest};
use crate::waits::{ApproveRequest, EventRequest, WaitRequest};
use crate::tasks::{CreateRequest, Tasks};
use crate::ApiError;

#[derive(Clone)]
struct AppState {
    tasks: Arc<Tasks>,
}

pub fn router(tasks: Arc<Tasks>, token: String) -> Router {
    let token = Arc::new(token);
    let public = Router::new()
        .route("/v1/hooks/{task}/{name}", axum::routing::post(hook))
        .route("/approve/{wait}", get(approval_page).post(approval_form))
        .layer(axum::extract::DefaultBodyLimit::max(crate::gateway::webhook::MAX_BODY))
        .with_state(AppState { tasks: tasks.clone() });
    let private = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/tasks", get(list_tasks).post(create_task))
        .route("/v1/tasks/{id}", get(show_task).delete(destroy_task))
        .route("/v1/tasks/{id}/events", get(task_events))
        .route("/v1/tasks/{id}/exec", get(exec))
        .route("/v1/tasks/{id}/files", get(download).put(upload))
        .route("/v1/tasks/{id}/snapshots", get(list_snapshots).post(take_snapshot))
        .route("/v1/tasks/{id}/snapshots/diff", get(diff_snapshots))
        .route("/v1/tasks/{id}/rollback", axum::routing::post(rollback))
        .route("/v1/tasks/{id}/fork", axum::routing::post(fork))
        .route("/v1/tasks/{id}/progress", get(progress))
        .route("/v1/gc", axum::routing::post(gc))
        .route("/v1/check", axum::routing::post(check))
        .route("/v1/tasks/{id}/waits", axum::routing::post(create_wait))
        .route("/v1/waits/{id}", get(show_wait))
        .route("/v1/tasks/{id}/approve", axum::routing::post(approve))
        .route("/v1/tasks/{id}/inbox", get(inbox).post(operator_event))
        .route("/v1/tasks/{id}/suspend", axum::routing::post(suspend))
        .route("/v1/tasks/{id}/resume", axum::routing::post(resume))
        .route("/v1/tasks/{id}/watch", get(watch))
        .route("/v1/tasks/{id}/egress", get(show_egress).post(update_egress))
        .route("/v1/tasks/{id}/ledger", get(ledger))
        .route("/v1/tasks/{id}/checkpoint", axum::routing::post(checkpoint))
        .route("/v1/tasks/{id}/deliveries", axum::routing::post(deliver))
        .route("/v1/tasks/{id}/complete", axum::routing::post(complete))
        .route("/v1/deliverables/{sha256}", get(deliverable))
        .route("/v1/records/{id}", get(record))
        .route("/v1/keys", get(keys))
        .route("/v1/keys/rotate", axum::routing::post(rotate_key))
        .route("/v1/images", get(list_images).post(import_image))
        .route("/v1/images/{name}", delete(remove_image))
        .layer(middleware::from_fn(move |req, next| auth(token.clone(), req, next)))
        .with_state(AppState { tasks });
    public.merge(private).fallback(|| async { ApiError::not_found("no such API endpoint") })
}

async fn auth(token: Arc<String>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if given.as_bytes().ct_eq(token.as_bytes()).into() {
        next.run(req).await
    } else {
        let msg = if given.is_empty() { "missing bearer token" } else { "wrong bearer token" };
        ApiError::new(StatusCode::UNAUTHORIZED, msg).into_response()
    }
}

/// Who made a request, for the event log.
fn actor(headers: &HeaderMap) -> String {
    headers
        .get("x-cairn-actor")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64)
        .map(|v| v.chars().filter(|c| c.is_ascii_graphic()).collect())
        .unwrap_or_else(|| "api".to_owned())
}

async fn health(State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "version": env!("CARGO_PKG_VERSION"), "home": s.tasks.store.path().parent() }))
}

async fn list_tasks(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let tasks = s.tasks.store.list_tasks().await?;
    let views: Vec<_> = tasks.into_iter().map(|t| s.tasks.view(t)).collect();
    Ok(Json(json!(views)))
}

async fn create_task(State(s): State<AppState>, headers: HeaderMap, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: CreateRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("malformed task request: {e}")))?;
    let view = s.tasks.create(req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn show_task(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.view(task))))
}

async fn destroy_task(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let view = s.tasks.destroy(&id, &actor(&headers)).await?;
    Ok(Json(json!(view)))
}

async fn task_events(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.store.events(&task.id).await?)))
}

async fn exec(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, ws: WebSocketUpgrade) -> Result<Response, ApiError> {
    // Refuse before upgrading when the task cannot run anything.
    let task = s.tasks.find(&id).await?;
    if matches!(task.state, TaskState::Destroyed | TaskState::Completed | TaskState::Failed) {
        task.state.check_exec()?;
    }
    let actor = actor(&headers);
    let tasks = s.tasks.clone();
    Ok(ws.on_upgrade(move |socket| crate::exec::serve(tasks, id, actor, socket)))
}

/// Parses a JSON body, naming what was malformed.
fn body<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ApiError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("malformed {what} request: {e}")))
}

async fn take_snapshot(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: SnapshotRequest = body("snapshot", &b)?;
    let snap = s.tasks.snapshot(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(snap)).into_response())
}

async fn list_snapshots(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.list_snapshots(&id).await?)))
}

#[derive(Deserialize)]
struct DiffQuery {
    a: String,
    b: String,
}

async fn diff_snapshots(State(s): State<AppState>, Path(id): Path<String>, Query(q): Query<DiffQuery>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.diff(&id, &q.a, &q.b).await?)))
}

async fn rollback(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: RollbackRequest = body("rollback", &b)?;
    Ok(Json(s.tasks.rollback(&id, req, &actor(&headers)).await?))
}

async fn fork(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ForkRequest = body("fork", &b)?;
    let children = s.tasks.fork(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(json!(children))).into_response())
}

async fn progress(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.progress(&task.id))))
}

async fn gc(State(s): State<AppState>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: GcRequest = body("gc", &b)?;
    Ok(Json(s.tasks.gc(req, &actor(&headers)).await?))
}

async fn check(State(s): State<AppState>, b: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: CheckRequest = body("check", &b)?;
    Ok(Json(json!(s.tasks.check(req.read_data).await?)))
}

#[derive(Deserialize)]
struct FileQuery {
    path: String,
    name: Option<String>,
    /// Copying out: `refuse` (default), `keep` or `follow` symlinks.
    links: Option<String>,
}

async fn download(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, Query(q): Query<FileQuery>) -> Result<Response, ApiError> {
    let links = match q.links.as_deref() {
        None => cairn_sandbox::files::LinkPolicy::Refuse,
        Some(l) => cairn_sandbox::files::LinkPolicy::parse(l)
            .ok_or_else(|| ApiError::bad_request(format!("links={l:?}: expected refuse, keep or follow")))?,
    };
    crate::files::download(s.tasks.clone(), &id, q.path, links, actor(&headers)).await
}

async fn upload(
    State(s): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let name = q.name.ok_or_else(|| ApiError::bad_request("missing name= (the top-level entry of the tar)"))?;
    Ok(Json(crate::files::upload(s.tasks.clone(), &id, q.path, name, body, actor(&headers)).await?))
}

async fn list_images(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let images = s.tasks.images.clone();
    let list = tokio::task::spawn_blocking(move || images.list()).await??;
    Ok(Json(json!(list)))
}

async fn import_image(State(s): State<AppState>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: ImportRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("malformed image request: {e}")))?;
    let images = s.tasks.images.clone();
    let image = tokio::task::spawn_blocking(move || images.import(&req.name, std::path::Path::new(&req.path))).await??;
    Ok((StatusCode::CREATED, Json(json!(image))).into_response())
}

async fn remove_image(State(s): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let users: Vec<String> = s
        .tasks
        .store
        .list_tasks()
        .await?
        .into_iter()
        .filter(|t| t.config.image == name && !t.state.is_terminal())
        .map(|t| t.id.to_string())
        .collect();
    if !users.is_empty() {
        return Err(ApiError::conflict(format!("image {name:?} is used by task(s) {}; destroy them first", users.join(", "))));
    }
    let images = s.tasks.images.clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || images.remove(&n)).await??;
    Ok(Json(json!({ "removed": name })))
}

fn delivered(d: &cairn_store::Delivered) -> cairn_api::waits::Delivered {
    cairn_api::waits::Delivered { event: d.event.clone(), duplicate: d.duplicate, satisfied: d.satisfied.clone(), wakes: d.wake }
}

async fn create_wait(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: WaitRequest = body("wait", &b)?;
    let view = s.tasks.wait(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[derive(Deserialize)]
struct WaitQuery {
    block_ms: Option<u64>,
}

async fn show_wait(State(s): State<AppState>, Path(id): Path<String>, Query(q): Query<WaitQuery>) -> Result<Json<Value>, ApiError> {
    let block = q.block_ms.map(|ms| std::time::Duration::from_millis(ms.min(300_000)));
    Ok(Json(json!(s.tasks.get_wait(&id, block).await?)))
}

async fn approve(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<cairn_api::waits::Delivered>, ApiError> {
    let req: ApproveRequest = body("approve", &b)?;
    Ok(Json(delivered(&s.tasks.approve(&id, req, &actor(&headers)).await?)))
}

async fn inbox(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let task = s.tasks.find(&id).await?;
    Ok(Json(json!(s.tasks.store.inbox(&task.id).await?)))
}

async fn operator_event(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: EventRequest = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(format!("malformed event request: {e}")))?;
    let d = s.tasks.operator_event(&id, req, &actor(&headers)).await?;
    Ok((StatusCode::ACCEPTED, Json(delivered(&d))).into_response())
}

async fn suspend(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.suspend(&id, &actor(&headers)).await?)))
}

async fn deliver(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, bytes: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let req: crate::deliver::DeliverRequest = body("delivery", &bytes)?;
    Ok(Json(json!(s.tasks.deliver_outputs(&id, req, &actor(&headers)).await?)))
}

async fn complete(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.complete(&id, &actor(&headers)).await?)))
}

async fn deliverable(State(s): State<AppState>, Path(sha): Path<String>) -> Result<Vec<u8>, ApiError> {
    Ok(s.tasks.deliverable(&sha).await?.to_vec())
}

async fn record(State(s): State<AppState>, Path(id): Path<String>) -> Result<Vec<u8>, ApiError> {
    Ok(s.tasks.record(&id).await?.to_vec())
}

async fn show_egress(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.egress_view(&id).await?)))
}

async fn update_egress(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap, bytes: axum::body::Bytes) -> Result<Json<Value>, ApiError> {
    let update: crate::egress::PolicyUpdate = body("egress policy", &bytes)?;
    Ok(Json(json!(s.tasks.update_egress(&id, update, &actor(&headers)).await?)))
}

async fn ledger(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.ledger_report(&id).await?)))
}

async fn checkpoint(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    let task = s.tasks.find(&id).await?;
    let view = s.tasks.checkpoint(&task.id, &actor(&headers)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn keys(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.tasks.public_keys()))
}

async fn rotate_key(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.rotate_key(&actor(&headers))?)))
}

async fn resume(State(s): State<AppState>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(s.tasks.resume(&id, &actor(&headers)).await?)))
}

#[derive(Deserialize)]
struct WatchQuery {
    after: Option<u64>,
}

/// The task's event log as server-sent events: what is there after `after`,
/// then each new entry as it is written.
async fn watch(State(s): State<AppState>, Path(id): Path<String>, Query(q): Query<WatchQuery>) -> Result<Response, ApiError> {
    use axum::response::sse::{Event as Sse, KeepAlive};
    let task = s.tasks.find(&id).await?;
    let tasks = s.tasks.clone();
    // Subscribed before the first read: each committed change wakes it.
    let start = (q.after.unwrap_or(0), Vec::<cairn_core::Event>::new(), s.tasks.store.changes());
    let stream = futures_util::stream::unfold(start, move |(mut after, mut queue, mut changes)| {
        let tasks = tasks.clone();
        let id = task.id.clone();
        async move {
            loop {
                if let Some(e) = queue.pop() {
                    after = e.seq;
                    let sse = Sse::default().event(e.kind.as_str()).id(e.seq.to_string()).json_data(&e);
                    return Some((sse.map_err(|e| std::io::Error::other(e.to_string())), (after, queue, changes)));
                }
                match tasks.store.events_after(&id, after).await {
                    Ok(new) => {
                        queue = new;
                        queue.reverse();
                    }
                    Err(e) => return Some((Err(std::io::Error::other(e.to_string())), (after, queue, changes))),
                }
                if queue.is_empty() && changes.changed().await.is_err() {
                    return None;
                }
            }
        }
    });
    Ok(axum::response::sse::Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// A webhook: the signature (with the task's secret) is the authentication.
async fn hook(State(s): State<AppState>, Path((task, name)): Path<(String, String)>, headers: HeaderMap, b: axum::body::Bytes) -> Result<Json<cairn_api::waits::Delivered>, ApiError> {
    Ok(Json(delivered(&s.tasks.webhook(&task, &name, &headers, &b).await?)))
}

#[derive(Deserialize)]
struct LinkQuery {
    exp: i64,
    sig: String,
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// Checks an approval link and finds its wait, still pending; or the page
/// to answer with.
async fn linked_wait(s: &AppState, wait: &str, exp: i64, sig: &str) -> Result<cairn_core::Wait, Response> {
    use crate::gateway::page;
    if let Err(e) = s.tasks.link_key.check(wait, exp, sig, cairn_store::now_ms()) {
        return Err(html(StatusCode::FORBIDDEN, page::render_error("Link not valid", &e.to_string())));
    }
    let w = match s.tasks.store.find_wait(wait).await {
        Ok(w) => w,
        Err(_) => return Err(html(StatusCode::NOT_FOUND, page::render_error("Not found", "this approval request does not exist"))),
    };
    let pending = s.tasks.store.pending_wait(&w.task).await.ok().flatten();
    if pending.map(|p| p.id) != Some(w.id.clone()) {
        return Err(html(StatusCode::CONFLICT, page::render_error("Already decided", "this approval request has been answered already")));
    }
    Ok(w)
}

async fn approval_page(State(s): State<AppState>, Path(wait): Path<String>, Query(q): Query<LinkQuery>) -> Response {
    match linked_wait(&s, &wait, q.exp, &q.sig).await {
        Ok(w) => {
            let prompt = match &w.what {
                cairn_core::WaitFor::Approval { prompt } => prompt.clone(),
                _ => String::new(),
            };
            html(StatusCode::OK, crate::gateway::page::render_pending(w.task.as_str(), w.id.as_str(), &prompt, q.exp, &q.sig))
        }
        Err(page) => page,
    }
}

#[derive(Deserialize)]
struct ApprovalForm {
    exp: i64,
    sig: String,
    decision: String,
    comment: Option<String>,
}

async fn approval_form(State(s): State<AppState>, Path(wait): Path<String>, form: axum::Form<ApprovalForm>) -> Response {
    use crate::gateway::page;
    let w = match linked_wait(&s, &wait, form.exp, &form.sig).await {
        Ok(w) => w,
        Err(page) => return page,
    };
    let approve = match form.decision.as_str() {
        "approve" => true,
        "reject" => false,
        other => return html(StatusCode::BAD_REQUEST, page::render_error("Bad request", &format!("unknown decision {other:?}"))),
    };
    let comment = form.comment.clone().filter(|c| !c.trim().is_empty());
    let req = ApproveRequest { approve, comment: comment.clone() };
    match s.tasks.approve_wait(&w.task, req, "approval-page").await {
        Ok(_) => html(StatusCode::OK, page::render_done(w.task.as_str(), &form.decision, comment.as_deref())),
        Err(e) => html(e.status, page::render_error("Failed", &e.message)),
    }
}
