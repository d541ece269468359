//! E2B's control API (`spec/openapi.yml` of e2b-dev/E2B, the part its SDKs
//! call), each route one runtime action:
//!
//! | E2B | Cairn |
//! |---|---|
//! | `POST /sandboxes`, `/v2/sandboxes` | create a task (template: an image) |
//! | `GET /sandboxes/{id}` | show |
//! | `GET /v2/sandboxes`, `/sandboxes` | list, by state and metadata, paged |
//! | `DELETE /sandboxes/{id}` | destroy |
//! | `POST /sandboxes/{id}/timeout` | the task's deadline |
//! | `POST /sandboxes/{id}/pause` | suspend |
//! | `POST /sandboxes/{id}/resume`, `/connect` | wake (and a deadline) |
//! | `POST /sandboxes/{id}/fork` | fork |
//! | `GET /templates` | images |
//! | `POST /sandboxes/{id}/snapshots` | an image committed from a new snapshot of the task |
//! | `GET /snapshots` | the images committed from tasks |
//! | `DELETE /templates/{id}` | remove the image |
//!
//! Every route takes a Cairn API key in `X-API-Key`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn_api::tasks::{CreateRequest, TaskView};
use cairn_core::TaskState;
use cairn_runtime::Runtime;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{E2bError, ENVD_VERSION};

type Rt = State<Arc<Runtime>>;

/// E2B's default sandbox timeout, when a create names none.
const DEFAULT_TIMEOUT_S: u64 = 300;
/// E2B's default template name.
const BASE_TEMPLATE: &str = "base";
/// Most sandboxes one list page holds.
const MAX_PAGE: usize = 1000;

pub(crate) fn routes() -> Router<Arc<Runtime>> {
    let not_served = |what: &'static str| move || async move { E2bError::not_implemented(what) };
    Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(show).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/templates", get(templates).post(not_served("building a template from a Dockerfile")))
        .route("/v2/templates", post(not_served("building a template from a Dockerfile")))
        .route("/volumes", get(not_served("volumes")).post(not_served("volumes")))
        .route("/teams", get(not_served("teams")))
        .route("/sandboxes/{id}/network", axum::routing::put(not_served("changing a sandbox's network")))
        .route("/sandboxes/{id}/metrics", get(not_served("sandbox metrics")))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", axum::routing::delete(delete_template))
        .layer(middleware::from_fn(api_key_layer))
}

/// Answers a request without any key before its body is read; each
/// handler then checks the key itself ([`check_key`]).
async fn api_key_layer(req: Request, next: Next) -> Response {
    if !req.headers().contains_key("x-api-key") {
        return E2bError::unauthenticated("missing API key (X-API-Key); make one with `cairn api-key create NAME`").into_response();
    }
    next.run(req).await
}

/// Checks the request's `X-API-Key`.
async fn check_key(rt: &Runtime, headers: &HeaderMap) -> Result<(), E2bError> {
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("");
    rt.check_api_key(key).await.map(|_| ()).map_err(|e| E2bError::unauthenticated(e.to_string()))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    network: Option<Network>,
    /// E2B's MCP gateway, and volumes: not served.
    mcp: Option<Value>,
    volume_mounts: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Network {
    allow_out: Vec<String>,
    deny_out: Vec<String>,
    /// Cairn's own: request rules and injections, as `--rule` and
    /// `--inject` take them (docs/e2b.md).
    rules: Vec<String>,
    inject: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TimeoutBody {
    timeout: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ForkBody {
    count: Option<u32>,
}

fn parse<T: serde::de::DeserializeOwned + Default>(what: &str, body: &[u8]) -> Result<T, E2bError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| E2bError::bad_request(format!("malformed {what} request: {e}")))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).to_string()
}

/// E2B's `running` or `paused`; `None` for a task that has ended.
fn e2b_state(state: TaskState) -> Option<&'static str> {
    match state {
        TaskState::Created | TaskState::Running | TaskState::Waking => Some("running"),
        TaskState::Suspending | TaskState::Suspended | TaskState::Failed => Some("paused"),
        TaskState::Completed | TaskState::Destroyed => None,
    }
}

/// The template name a client sees: the image, `base` for the default.
fn template_of(view: &TaskView) -> String {
    view.task.config.metadata.get("e2b.template").cloned().unwrap_or_else(|| view.task.config.image.clone())
}

/// E2B's `Sandbox` (what create, connect and resume answer).
fn sandbox(rt: &Runtime, view: &TaskView) -> Value {
    json!({
        "templateID": template_of(view),
        "sandboxID": view.task.id.as_str(),
        "clientID": view.task.node.clone().unwrap_or_else(|| "cairn".into()),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": rt.sandbox_access_token(view.task.id.as_str()),
        "trafficAccessToken": rt.traffic_token(view.task.id.as_str()),
        "domain": Value::Null,
    })
}

/// E2B's `SandboxDetail` and `ListedSandbox`.
fn detail(rt: &Runtime, view: &TaskView, state: &str) -> Value {
    let config = &view.task.config;
    // No deadline: as far ahead as E2B's longest (a day).
    let end = config.deadline_ms.unwrap_or(view.task.created_ms + 24 * 3600 * 1000);
    let metadata: BTreeMap<&String, &String> = config.metadata.iter().filter(|(k, _)| !k.starts_with("e2b.")).collect();
    json!({
        "templateID": template_of(view),
        "sandboxID": view.task.id.as_str(),
        "clientID": view.task.node.clone().unwrap_or_else(|| "cairn".into()),
        "startedAt": rfc3339(view.task.created_ms),
        "endAt": rfc3339(end),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": rt.sandbox_access_token(view.task.id.as_str()),
        "cpuCount": config.limits.millicpus.div_ceil(1000).max(1),
        "memoryMB": config.limits.memory_bytes >> 20,
        "diskSizeMB": config.limits.disk_bytes >> 20,
        "state": state,
        "metadata": metadata,
        "domain": Value::Null,
    })
}

/// A task that exists and has not ended, or E2B's 404.
async fn live_task(rt: &Runtime, id: &str) -> Result<TaskView, E2bError> {
    let view = rt.show(id).await.map_err(|e| match e {
        cairn_runtime::Error::NotFound(_) => E2bError::not_found(format!("sandbox {id} not found")),
        e => e.into(),
    })?;
    if e2b_state(view.task.state).is_none() {
        return Err(E2bError::not_found(format!("sandbox {id} not found (it has ended)")));
    }
    Ok(view)
}

async fn create(State(rt): Rt, headers: HeaderMap, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let req: NewSandbox = parse("create", &body)?;
    if req.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(E2bError::not_implemented("the MCP gateway (Cairn's own MCP server is `cairn mcp`, see docs/mcp.md)"));
    }
    if req.volume_mounts.as_ref().is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return Err(E2bError::not_implemented("volumes"));
    }
    let template = req.template_id.clone().unwrap_or_else(|| BASE_TEMPLATE.to_owned());
    let images = rt.list_images().await?;
    // `base` is the node's default image unless an image has that name.
    let image = if template == BASE_TEMPLATE && !images.iter().any(|i| i.name == BASE_TEMPLATE) {
        None
    } else if images.iter().any(|i| i.name == template) {
        Some(template.clone())
    } else {
        return Err(E2bError::not_found(format!("template {template:?} not found: it names no image of this node (cairn image list)")));
    };
    let mut metadata = req.metadata.unwrap_or_default();
    if metadata.keys().any(|k| k.starts_with("e2b.")) {
        return Err(E2bError::bad_request("metadata keys starting with \"e2b.\" are Cairn's own"));
    }
    metadata.insert("e2b.template".into(), template.clone());
    let network = req.network.unwrap_or_default();
    let create = CreateRequest {
        image,
        env: req.env_vars.unwrap_or_default().into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        metadata,
        timeout: Some(format!("{}s", req.timeout.unwrap_or(DEFAULT_TIMEOUT_S).max(1))),
        suspend_at_timeout: req.auto_pause,
        allow: network.allow_out,
        deny: network.deny_out,
        rules: network.rules,
        inject: network.inject,
        ..CreateRequest::default()
    };
    let view = rt.create(create, "e2b").await?;
    Ok((StatusCode::CREATED, Json(sandbox(&rt, &view))).into_response())
}

async fn show(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let view = live_task(&rt, &id).await?;
    let state = e2b_state(view.task.state).unwrap_or("paused");
    Ok(Json(detail(&rt, &view, state)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    next_token: Option<String>,
    limit: Option<usize>,
}

/// E2B's `metadata` filter: a form-encoded `k=v&k2=v2` whose keys and
/// values the SDKs percent-encode once more.
fn metadata_filter(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(&percent_decode(k)?)?, percent_decode(&percent_decode(v)?)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

async fn list(State(rt): Rt, headers: HeaderMap, Query(q): Query<ListQuery>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let wanted_states: Vec<String> = q.state.as_deref().map(|s| s.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    for s in &wanted_states {
        if s != "running" && s != "paused" {
            return Err(E2bError::bad_request(format!("unknown state {s:?}: running or paused")));
        }
    }
    let filter = q.metadata.as_deref().map(metadata_filter).unwrap_or_default();
    let limit = q.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let mut tasks = rt.list().await?;
    tasks.sort_by(|a, b| (a.task.created_ms, a.task.id.as_str()).cmp(&(b.task.created_ms, b.task.id.as_str())));
    let after = q.next_token.filter(|t| !t.is_empty());
    let mut page = Vec::new();
    let mut more = false;
    let mut passed_token = after.is_none();
    for view in &tasks {
        if !passed_token {
            passed_token = after.as_deref() == Some(view.task.id.as_str());
            continue;
        }
        let Some(state) = e2b_state(view.task.state) else { continue };
        if !wanted_states.is_empty() && !wanted_states.iter().any(|s| s == state) {
            continue;
        }
        if !filter.iter().all(|(k, v)| view.task.config.metadata.get(k) == Some(v)) {
            continue;
        }
        if page.len() == limit {
            more = true;
            break;
        }
        page.push((view.task.id.to_string(), detail(&rt, view, state)));
    }
    let next = if more { page.last().map(|(id, _)| id.clone()) } else { None };
    let body: Vec<Value> = page.into_iter().map(|(_, v)| v).collect();
    let mut response = Json(body).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    Ok(response)
}

async fn kill(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    live_task(&rt, &id).await?;
    rt.destroy(&id, "e2b").await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_timeout(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let req: TimeoutBody = parse("timeout", &body)?;
    let Some(secs) = req.timeout else { return Err(E2bError::bad_request("timeout: give {\"timeout\": SECONDS}")) };
    live_task(&rt, &id).await?;
    rt.set_deadline(&id, Some(Duration::from_secs(secs)), None, "e2b").await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Extends a sandbox's life by `duration` seconds (E2B's keep-alive).
async fn refresh(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let req: Value = parse("refresh", &body)?;
    let secs = req.get("duration").and_then(Value::as_u64).unwrap_or(DEFAULT_TIMEOUT_S);
    live_task(&rt, &id).await?;
    rt.set_deadline(&id, Some(Duration::from_secs(secs)), None, "e2b").await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn pause(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let view = live_task(&rt, &id).await?;
    if e2b_state(view.task.state) == Some("paused") {
        return Err(E2bError::new(StatusCode::CONFLICT, format!("sandbox {id} is paused already")));
    }
    rt.suspend(&id, "e2b").await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Wakes a paused sandbox (201), or finds it running (200); a timeout in
/// the body sets its deadline from now.
async fn wake(rt: &Arc<Runtime>, id: &str, body: &[u8]) -> Result<Response, E2bError> {
    let req: TimeoutBody = parse("connect", body)?;
    let view = live_task(rt, id).await?;
    let paused = e2b_state(view.task.state) == Some("paused");
    // The deadline first: a woken task whose deadline has passed would be
    // ended (or paused) again at once.
    let expired = view.task.config.deadline_ms.is_some_and(|d| d <= now_ms());
    match req.timeout {
        Some(secs) => {
            rt.set_deadline(id, Some(Duration::from_secs(secs)), None, "e2b").await?;
        }
        None if expired => {
            rt.set_deadline(id, Some(Duration::from_secs(DEFAULT_TIMEOUT_S)), None, "e2b").await?;
        }
        None => {}
    }
    if paused {
        rt.resume(id, "e2b").await?;
    }
    let view = rt.show(id).await?;
    let status = if paused { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(sandbox(rt, &view))).into_response())
}

async fn connect(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    wake(&rt, &id, &body).await
}

async fn resume(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let mut response = wake(&rt, &id, &body).await?;
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}

async fn fork(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let req: ForkBody = parse("fork", &body)?;
    let count = req.count.unwrap_or(1);
    if !(1..=20).contains(&count) {
        return Err(E2bError::bad_request(format!("fork: count {count} is not between 1 and 20")));
    }
    live_task(&rt, &id).await?;
    // E2B forks the sandbox as it is now: a snapshot first.
    let snap = cairn_api::snapshots::SnapshotRequest { kind: Some("manual".into()), note: Some("before an E2B fork".into()), ..Default::default() };
    let taken = rt.snapshot(&id, snap, "e2b").await?;
    let from = Some(taken.id.to_string());
    let children = rt.fork(&id, cairn_api::snapshots::ForkRequest { from, count: Some(count) }, "e2b").await?;
    let answer: Vec<Value> = children.iter().map(|c| json!({ "sandbox": sandbox(&rt, c) })).collect();
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

async fn templates(State(rt): Rt, headers: HeaderMap) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let images = rt.list_images().await?;
    let list: Vec<Value> = images
        .iter()
        .map(|i| {
            let at = rfc3339(i.created_ms);
            json!({
                "templateID": i.name, "buildID": i.name, "cpuCount": 1, "memoryMB": 512, "diskSizeMB": i.size_bytes >> 20,
                "public": false, "aliases": [i.name], "names": [i.name], "createdAt": at, "updatedAt": at,
                "createdBy": Value::Null, "lastSpawnedAt": at, "spawnCount": 0, "buildCount": 1,
                "envdVersion": ENVD_VERSION, "buildStatus": "ready",
            })
        })
        .collect();
    Ok(Json(list).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SnapshotBody {
    name: Option<String>,
    mode: Option<String>,
}

/// What E2B calls a snapshot: a template made from the sandbox as it is
/// now. In Cairn, an image committed from a new snapshot of the task (its
/// files; a new sandbox from it starts fresh, as E2B's `filesystem` mode).
async fn create_snapshot(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let req: SnapshotBody = parse("snapshot", &body)?;
    if let Some(mode) = req.mode.as_deref().filter(|m| !["full", "filesystem"].contains(m)) {
        return Err(E2bError::bad_request(format!("snapshot: mode {mode:?} is neither \"full\" nor \"filesystem\"")));
    }
    let task = live_task(&rt, &id).await?.task.id.to_string();
    let now_ms = std::time::SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default();
    let name = req.name.unwrap_or_else(|| format!("{task}-snapshot-{now_ms}"));
    cairn_core::check_image_name(&name).map_err(|e| E2bError::bad_request(format!("snapshot: {e}")))?;
    let commit = cairn_api::images::CommitRequest { task, name: name.clone(), from: None };
    let image = rt.commit_image(commit, "e2b").await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&image.name))).into_response())
}

fn snapshot_info(name: &str) -> Value {
    json!({ "snapshotID": name, "names": [name] })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    next_token: Option<String>,
    limit: Option<usize>,
}

/// The images committed from tasks (by E2B's snapshots or `cairn image
/// commit`), by name, paged; optionally those of one sandbox.
async fn list_snapshots(State(rt): Rt, headers: HeaderMap, Query(q): Query<SnapshotQuery>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let mut names: Vec<String> = rt
        .list_images()
        .await?
        .into_iter()
        .filter(|i| {
            // `task ID at snapshot S`, as a commit records it.
            let from = i.source.strip_prefix("task ").and_then(|r| r.split_once(' ')).map(|(t, _)| t);
            from.is_some() && q.sandbox_id.as_deref().is_none_or(|s| from == Some(s))
        })
        .map(|i| i.name)
        .filter(|n| q.name.as_deref().is_none_or(|want| n == want || n.split(':').next() == Some(want)))
        .filter(|n| q.next_token.as_deref().is_none_or(|after| n.as_str() > after))
        .collect();
    names.sort();
    let more = names.len() > limit;
    names.truncate(limit);
    let list: Vec<Value> = names.iter().map(|n| snapshot_info(n)).collect();
    let mut response = Json(list).into_response();
    if more {
        if let Some(next) = names.last().and_then(|n| HeaderValue::from_str(n).ok()) {
            response.headers_mut().insert("x-next-token", next);
        }
    }
    Ok(response)
}

/// Removes a template (an image), as E2B deletes a snapshot: refused while
/// a task uses it.
async fn delete_template(State(rt): Rt, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, E2bError> {
    check_key(&rt, &headers).await?;
    if !rt.list_images().await?.iter().any(|i| i.name == id) {
        return Err(E2bError::not_found(format!("template {id:?} not found")));
    }
    rt.remove_image(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_double_encoded_metadata_filter_is_read() {
        // {"a b": "c&d", "user": "x"} as the SDK sends it, once the query
        // string itself is decoded.
        let f = metadata_filter("a%2520b=c%2526d&user=x");
        assert_eq!(f.get("a b").map(String::as_str), Some("c&d"));
        assert_eq!(f.get("user").map(String::as_str), Some("x"));
        assert!(metadata_filter("").is_empty());
        assert!(percent_decode("%zz").is_none());
    }

    #[test]
    fn states_map_onto_e2bs_two() {
        assert_eq!(e2b_state(TaskState::Running), Some("running"));
        assert_eq!(e2b_state(TaskState::Suspended), Some("paused"));
        assert_eq!(e2b_state(TaskState::Destroyed), None);
    }
}
