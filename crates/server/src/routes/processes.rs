//! Background commands with handles (`cairn_runtime::processes`): start,
//! list, output so far (optionally waiting for the end), stdin, resize, kill.

use std::time::Duration;

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use cairn_api::processes::{ProcessOutput, ProcessView, Resize, StartProcess};
use cairn_runtime::processes::{Process, ProcessEvent, ProcessSelector};
use serde::Deserialize;

use super::served::Routes;
use super::{actor, body, Rt};
use crate::ApiError;

/// Longest a `wait_ms` may be.
const MAX_WAIT: Duration = Duration::from_secs(300);

pub(super) fn routes() -> Routes {
    Routes::new()
        .post("/v1/tasks/{id}/processes", start)
        .get("/v1/tasks/{id}/processes", list)
        .get("/v1/tasks/{id}/processes/{pid}", show)
        .post("/v1/tasks/{id}/processes/{pid}/stdin", stdin)
        .post("/v1/tasks/{id}/processes/{pid}/resize", resize)
        .post("/v1/tasks/{id}/processes/{pid}/kill", kill)
}

fn view(p: &Process) -> ProcessView {
    let (exit, error) = match p.end() {
        Some(ProcessEvent::Ended(e)) => (Some(e), None),
        Some(ProcessEvent::Failed(m)) => (None, Some(m)),
        _ => (None, None),
    };
    ProcessView { id: p.id, task: p.task.clone(), argv: p.start.argv.clone(), tag: p.tag.clone(), tty: p.start.tty.is_some(), running: !p.has_ended(), exit, error }
}

fn pid_of(pid: &str) -> Result<ProcessSelector, ApiError> {
    pid.parse::<u32>().map(ProcessSelector::Id).map_err(|_| ApiError::bad_request(format!("{pid:?} is not a command's handle (a number)")))
}

#[utoipa::path(
    post,
    operation_id = "start_process",
    path = "/v1/tasks/{id}/processes",
    tag = "exec",
    params(("id" = String, Path, description = "Task id or name")),
    request_body = StartProcess,
    responses((status = 201, description = "Started in the background: its handle", body = ProcessView), (status = 429, description = "Past a bound of [limits]"))
)]
async fn start(rt: Rt, Path(id): Path<String>, headers: HeaderMap, b: axum::body::Bytes) -> Result<(StatusCode, Json<ProcessView>), ApiError> {
    let req: StartProcess = body("process", &b)?;
    let (p, _) = rt.start_process(&id, &actor(&headers), req.start, req.tag).await?;
    Ok((StatusCode::CREATED, Json(view(&p))))
}

#[utoipa::path(
    get,
    operation_id = "list_processes",
    path = "/v1/tasks/{id}/processes",
    tag = "exec",
    params(("id" = String, Path, description = "Task id or name")),
    responses((status = 200, description = "The task's background commands, running or ended in the last ten minutes, oldest first", body = [ProcessView]))
)]
async fn list(rt: Rt, Path(id): Path<String>) -> Result<Json<Vec<ProcessView>>, ApiError> {
    Ok(Json(rt.processes(&id).await?.iter().map(|p| view(p)).collect()))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default)]
struct WaitQuery {
    /// Wait up to this many milliseconds for the command to end (at most 300000).
    wait_ms: Option<u64>,
}

#[utoipa::path(
    get,
    operation_id = "show_process",
    path = "/v1/tasks/{id}/processes/{pid}",
    tag = "exec",
    params(("id" = String, Path, description = "Task id or name"), ("pid" = u32, Path, description = "The command's handle"), WaitQuery),
    responses((status = 200, description = "The command and its output so far (after its end, with `wait_ms`, unless the wait ran out)", body = ProcessOutput))
)]
async fn show(rt: Rt, Path((id, pid)): Path<(String, String)>, Query(q): Query<WaitQuery>) -> Result<Json<ProcessOutput>, ApiError> {
    let p = rt.process(&id, &pid_of(&pid)?).await?;
    if let Some(ms) = q.wait_ms {
        p.wait(Duration::from_millis(ms).min(MAX_WAIT)).await;
    }
    let (out, err, truncated) = p.output();
    Ok(Json(ProcessOutput { process: view(&p), stdout: String::from_utf8_lossy(&out).into_owned(), stderr: String::from_utf8_lossy(&err).into_owned(), truncated }))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(default)]
struct StdinQuery {
    /// Close stdin after these bytes (^D on a terminal).
    close: bool,
}

#[utoipa::path(
    post,
    operation_id = "write_process_stdin",
    path = "/v1/tasks/{id}/processes/{pid}/stdin",
    tag = "exec",
    params(("id" = String, Path, description = "Task id or name"), ("pid" = u32, Path, description = "The command's handle"), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "Bytes for the command's stdin"),
    responses((status = 200, description = "Written", body = ProcessView))
)]
async fn stdin(rt: Rt, Path((id, pid)): Path<(String, String)>, Query(q): Query<StdinQuery>, b: axum::body::Bytes) -> Result<Json<ProcessView>, ApiError> {
    let p = rt.process(&id, &pid_of(&pid)?).await?;
    if !b.is_empty() {
        p.write_stdin(b.to_vec())?;
    }
    if q.close {
        p.write_stdin(Vec::new())?;
    }
    Ok(Json(view(&p)))
}

#[utoipa::path(
    post,
    operation_id = "resize_process",
    path = "/v1/tasks/{id}/processes/{pid}/resize",
    tag = "exec",
    params(("id" = String, Path, description = "Task id or name"), ("pid" = u32, Path, description = "The command's handle")),
    request_body = Resize,
    responses((status = 200, description = "Its terminal resized", body = ProcessView))
)]
async fn resize(rt: Rt, Path((id, pid)): Path<(String, String)>, b: axum::body::Bytes) -> Result<Json<ProcessView>, ApiError> {
    let req: Resize = body("resize", &b)?;
    if req.rows == 0 || req.cols == 0 {
        return Err(ApiError::bad_request(format!("a terminal of {}x{} has no room; rows and cols must be at least 1", req.cols, req.rows)));
    }
    let p = rt.process(&id, &pid_of(&pid)?).await?;
    if p.start.tty.is_none() {
        return Err(ApiError::bad_request(format!("command {} has no terminal to resize", p.id)));
    }
    p.resize(req.rows, req.cols)?;
    Ok(Json(view(&p)))
}

#[utoipa::path(
    post,
    operation_id = "kill_process",
    path = "/v1/tasks/{id}/processes/{pid}/kill",
    tag = "exec",
    params(
        ("id" = String, Path, description = "Task id or name"),
        ("pid" = u32, Path, description = "The command's handle"),
        ("signal" = Option<String>, Query, description = "A signal other than KILL (TERM, INT, HUP, QUIT, USR1, USR2, or its number): sent to the command's process group, which may handle it"),
    ),
    responses((status = 200, description = "Killed (with its process group; its end as recorded), or signalled", body = ProcessView))
)]
async fn kill(rt: Rt, Path((id, pid)): Path<(String, String)>, Query(q): Query<KillQuery>) -> Result<Json<ProcessView>, ApiError> {
    let p = rt.process(&id, &pid_of(&pid)?).await?;
    let signal = match q.signal.as_deref() {
        None => SIGKILL,
        Some(name) => cairn_api::exec::signal_number(name).ok_or_else(|| ApiError::bad_request(format!("signal {name:?} is not one of HUP, INT, QUIT, KILL, USR1, USR2, TERM")))?,
    };
    if signal == SIGKILL {
        p.kill()?;
        p.wait(Duration::from_secs(10)).await;
    } else {
        p.signal(signal)?;
    }
    Ok(Json(view(&p)))
}

/// KILL, the signal that ends a command through its control connection.
const SIGKILL: i32 = 9;

#[derive(Debug, Deserialize)]
struct KillQuery {
    signal: Option<String>,
}
