//! `filesystem.Filesystem`: a sandbox's files. Reads go through the
//! runtime's descriptor-relative file code (paths resolved inside the
//! sandbox, never out of it); changes (make a directory, move, remove) run
//! as commands inside the sandbox, as the user the call names, so the
//! daemon follows no sandbox path for them at all. A relative path is
//! taken from the task's working directory. Watches are the sandbox's own
//! inotify ([`cairn_runtime::watchers`]).

use std::time::{Duration, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use cairn_api::exec::{ExecStart, STDERR, STDOUT};
use cairn_api::files::{DirEntry, EntryKind};
use cairn_runtime::exec::{ExecChannel, ExecInput, ExecOutput};
use cairn_runtime::watchers::{WatchEvent, WatchKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect;
use crate::envd::Ctx;
use crate::E2bError;

/// Deepest `ListDir` walks.
const MAX_DEPTH: u32 = 16;

pub(crate) fn routes() -> Router<Ctx> {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route("/filesystem.Filesystem/GetWatcherEvents", post(get_watcher_events))
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathRequest {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    recursive: bool,
    include_entry: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// `path` as an absolute sandbox path: a relative one from `workdir`.
pub(crate) fn absolute(path: &str, workdir: &str) -> Result<String, E2bError> {
    if path.is_empty() {
        return Err(E2bError::bad_request("no path given"));
    }
    if path.contains('\0') {
        return Err(E2bError::bad_request("a path cannot hold a NUL byte"));
    }
    let joined = if path.starts_with('/') { path.to_owned() } else { format!("{}/{path}", workdir.trim_end_matches('/')) };
    Ok(normalize(&joined))
}

/// `.` and `..` taken out by the text alone (`..` at the root stays at
/// the root), as a shell in the sandbox would read the path before
/// following any link: the runtime then resolves what is left inside the
/// sandbox, links and all.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Splits an absolute path into its directory and last name (`None` for `/`).
fn split(path: &str) -> Option<(String, String)> {
    let trimmed = path.trim_end_matches('/');
    let (dir, name) = trimmed.rsplit_once('/')?;
    if name.is_empty() || name == "." || name == ".." {
        return None;
    }
    Some((if dir.is_empty() { "/".to_owned() } else { dir.to_owned() }, name.to_owned()))
}

pub(crate) async fn workdir(ctx: &Ctx, task: &str) -> Result<String, E2bError> {
    Ok(ctx.rt.show(task).await?.task.config.workdir)
}

fn file_type(kind: &EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "FILE_TYPE_FILE",
        EntryKind::Dir => "FILE_TYPE_DIRECTORY",
        EntryKind::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

fn permissions(kind: &EntryKind, mode: u32) -> String {
    let lead = match kind {
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        _ => '-',
    };
    let bits: String = (0..9).map(|i| if mode & (1 << (8 - i)) != 0 { ['r', 'w', 'x'][i % 3] } else { '-' }).collect();
    format!("{lead}{bits}")
}

fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// E2B's `EntryInfo` of an entry of directory `dir`.
fn entry_info(dir: &str, e: &DirEntry) -> Value {
    let path = if dir == "/" { format!("/{}", e.name) } else { format!("{}/{}", dir.trim_end_matches('/'), e.name) };
    let mut info = json!({
        "name": e.name,
        "type": file_type(&e.kind),
        "path": path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(&e.kind, e.mode),
        "modifiedTime": rfc3339(e.mtime_ms),
    });
    if let Some(t) = &e.target {
        info["symlinkTarget"] = json!(t);
        info["isSymlink"] = json!(true);
    }
    info
}

/// The entry at absolute `path`, from a listing of its directory.
async fn stat_path(ctx: &Ctx, task: &str, path: &str) -> Result<Value, E2bError> {
    let Some((dir, name)) = split(path) else {
        return Ok(json!({ "name": "", "type": "FILE_TYPE_DIRECTORY", "path": "/", "mode": 0o755, "permissions": "drwxr-xr-x" }));
    };
    let listing = cairn_runtime::files::list_dir(ctx.rt.clone(), task, dir.clone(), "e2b".into()).await?;
    match listing.entries.iter().find(|e| e.name == name) {
        Some(e) => Ok(entry_info(&listing.path, e)),
        None => Err(E2bError::not_found(format!("{path}: no such file or directory in the sandbox"))),
    }
}

fn unary(result: Result<Value, E2bError>) -> Response {
    match result {
        Ok(v) => connect::unary_response(&v),
        Err(e) => e.connect_response(),
    }
}

async fn stat(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: PathRequest = connect::unary_request("Stat", &headers, &body)?;
            let path = absolute(&req.path, &workdir(&ctx, task).await?)?;
            Ok(json!({ "entry": stat_path(&ctx, task, &path).await? }))
        }
        .await,
    )
}

async fn list_dir(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: PathRequest = connect::unary_request("ListDir", &headers, &body)?;
            let depth = req.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
            let path = absolute(&req.path, &workdir(&ctx, task).await?)?;
            let mut entries = Vec::new();
            let mut level = vec![path];
            for _ in 0..depth {
                let mut next = Vec::new();
                for dir in level {
                    let listing = cairn_runtime::files::list_dir(ctx.rt.clone(), task, dir, "e2b".into()).await?;
                    for e in &listing.entries {
                        let info = entry_info(&listing.path, e);
                        if e.kind == EntryKind::Dir {
                            next.push(info["path"].as_str().unwrap_or_default().to_owned());
                        }
                        entries.push(info);
                    }
                }
                level = next;
            }
            Ok(json!({ "entries": entries }))
        }
        .await,
    )
}

async fn make_dir(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: PathRequest = connect::unary_request("MakeDir", &headers, &body)?;
            let path = absolute(&req.path, &workdir(&ctx, task).await?)?;
            if stat_path(&ctx, task, &path).await.is_ok() {
                return Err(E2bError::new(axum::http::StatusCode::CONFLICT, format!("{path} exists already")));
            }
            run(&ctx, task, &headers, &["mkdir", "-p", "--", &path]).await?;
            Ok(json!({ "entry": stat_path(&ctx, task, &path).await? }))
        }
        .await,
    )
}

async fn move_entry(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: MoveRequest = connect::unary_request("Move", &headers, &body)?;
            let wd = workdir(&ctx, task).await?;
            let (from, to) = (absolute(&req.source, &wd)?, absolute(&req.destination, &wd)?);
            stat_path(&ctx, task, &from).await?;
            run(&ctx, task, &headers, &["mv", "--", &from, &to]).await?;
            Ok(json!({ "entry": stat_path(&ctx, task, &to).await? }))
        }
        .await,
    )
}

async fn remove(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: PathRequest = connect::unary_request("Remove", &headers, &body)?;
            let path = absolute(&req.path, &workdir(&ctx, task).await?)?;
            stat_path(&ctx, task, &path).await?;
            run(&ctx, task, &headers, &["rm", "-rf", "--", &path]).await?;
            Ok(json!({}))
        }
        .await,
    )
}

/// E2B's `FilesystemEvent` for `event` of a watch on `dir`; with `entry`,
/// the entry's `EntryInfo` when it still exists.
async fn filesystem_event(ctx: &Ctx, task: &str, dir: &str, event: &WatchEvent, entry: bool) -> Value {
    let kind = match event.kind {
        WatchKind::Create => "EVENT_TYPE_CREATE",
        WatchKind::Write => "EVENT_TYPE_WRITE",
        WatchKind::Remove => "EVENT_TYPE_REMOVE",
        WatchKind::Rename => "EVENT_TYPE_RENAME",
        WatchKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    let mut message = json!({ "name": event.name, "type": kind });
    if entry && !matches!(event.kind, WatchKind::Remove | WatchKind::Rename) {
        let path = normalize(&format!("{dir}/{}", event.name));
        if let Ok(info) = stat_path(ctx, task, &path).await {
            message["entry"] = info;
        }
    }
    message
}

/// The directory a watch request names, absolute.
async fn watched_dir(ctx: &Ctx, task: &str, req: &WatchRequest) -> Result<String, E2bError> {
    absolute(&req.path, &workdir(ctx, task).await?)
}

/// A stream of the directory's changes, from the moment the first message
/// (`start`) is sent, until the client goes away or the directory does.
async fn watch_dir(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    let started = async {
        let task = ctx.authorized(&headers)?.to_owned();
        let req: WatchRequest = connect::stream_request("WatchDir", &body)?;
        let dir = watched_dir(&ctx, &task, &req).await?;
        let watch = ctx.rt.watch_dir(&task, &dir, req.recursive, "e2b").await?;
        Ok::<_, E2bError>((task, dir, req.include_entry, watch))
    }
    .await;
    let (task, dir, include_entry, watch) = match started {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e).await,
    };
    let every = crate::process::keepalive(&headers);
    let (response, sender) = connect::stream_response();
    tokio::spawn(async move {
        // The whole watch, not just its events: its connection keeps it alive.
        let mut watch = watch;
        if !sender.send(&json!({ "start": {} })).await {
            return;
        }
        loop {
            let tick = async {
                match every {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = watch.events.recv() => match event {
                    Some(event) => {
                        let message = filesystem_event(&ctx, &task, &dir, &event, include_entry).await;
                        if !sender.send(&json!({ "filesystem": message })).await {
                            return;
                        }
                    }
                    None => {
                        let gone = E2bError::not_found(format!("the watch of {dir} ended: the directory or the sandbox is gone"));
                        return sender.end(Some(&gone)).await;
                    }
                },
                () = tick => {
                    if !sender.send(&json!({ "keepalive": {} })).await {
                        return;
                    }
                }
                // The client went away: the watch stops with `watch`.
                () = sender.closed() => return,
            }
        }
    });
    response
}

async fn create_watcher(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: WatchRequest = connect::unary_request("CreateWatcher", &headers, &body)?;
            let dir = watched_dir(&ctx, task, &req).await?;
            let id = ctx.rt.create_watcher(task, &dir, req.recursive, req.include_entry, "e2b").await?;
            Ok(json!({ "watcherId": id }))
        }
        .await,
    )
}

async fn get_watcher_events(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: WatcherRequest = connect::unary_request("GetWatcherEvents", &headers, &body)?;
            let taken = ctx.rt.watcher_events(task, &req.watcher_id).await?;
            let mut events = Vec::with_capacity(taken.events.len());
            for e in &taken.events {
                events.push(filesystem_event(&ctx, task, &taken.path, e, taken.with_entries).await);
            }
            Ok(json!({ "events": events }))
        }
        .await,
    )
}

async fn remove_watcher(State(ctx): State<Ctx>, headers: HeaderMap, body: Bytes) -> Response {
    unary(
        async {
            let task = ctx.authorized(&headers)?;
            let req: WatcherRequest = connect::unary_request("RemoveWatcher", &headers, &body)?;
            ctx.rt.remove_watcher(task, &req.watcher_id).await?;
            Ok(json!({}))
        }
        .await,
    )
}

/// Runs `argv` in the sandbox as the call's user; its stderr is the error
/// when it fails.
pub(crate) async fn run(ctx: &Ctx, task: &str, headers: &HeaderMap, argv: &[&str]) -> Result<String, E2bError> {
    let start = ExecStart {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        user: Ctx::user(headers),
        timeout_ms: Some(60_000),
        ..ExecStart::default()
    };
    let mut collected = Collect::default();
    ctx.rt.exec(task, "e2b", start, &mut collected).await?;
    match collected.exit {
        Some(0) => Ok(String::from_utf8_lossy(&collected.stdout).into_owned()),
        _ => {
            let err = String::from_utf8_lossy(&collected.stderr).trim().to_owned();
            Err(E2bError::bad_request(if err.is_empty() { format!("`{}` failed in the sandbox", argv.join(" ")) } else { err }))
        }
    }
}

/// Writes what comes from `data` to absolute `path` in the sandbox, making
/// its directory if need be: `cat` run inside as the call's user, so the
/// file is theirs and lands wherever the sandbox sees that path (its `/tmp`
/// too); the bytes stream through (a full disk is the sandbox's ENOSPC).
pub(crate) async fn write_file(ctx: &Ctx, task: &str, headers: &HeaderMap, path: &str, data: tokio::sync::mpsc::Receiver<Bytes>) -> Result<(), E2bError> {
    let script = "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"";
    let start = ExecStart {
        argv: vec!["sh".into(), "-c".into(), script.into(), "sh".into(), path.to_owned()],
        user: Ctx::user(headers),
        stdin: true,
        timeout_ms: Some(3_600_000),
        ..ExecStart::default()
    };
    let mut collected = Collect { input: Some(data), ..Collect::default() };
    ctx.rt.exec(task, "e2b", start, &mut collected).await?;
    match collected.exit {
        Some(0) => Ok(()),
        _ => {
            let err = String::from_utf8_lossy(&collected.stderr).trim().to_owned();
            let err = if err.is_empty() { format!("cannot write {path} in the sandbox") } else { err };
            let status = if err.contains("No space left") { axum::http::StatusCode::INSUFFICIENT_STORAGE } else { axum::http::StatusCode::BAD_REQUEST };
            Err(E2bError::new(status, err))
        }
    }
}

/// An exec's output, collected; what comes from `input` is fed to its
/// stdin, which is closed when `input` ends.
#[derive(Default)]
struct Collect {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<i32>,
    input: Option<tokio::sync::mpsc::Receiver<Bytes>>,
}

impl ExecChannel for Collect {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        match out {
            ExecOutput::Output(STDOUT, d) => self.stdout.extend_from_slice(d),
            ExecOutput::Output(STDERR, d) => self.stderr.extend_from_slice(d),
            ExecOutput::Frame(cairn_api::exec::ServerFrame::Exit { exit, .. }) => self.exit = Some(exit.exit_code),
            _ => {}
        }
        true
    }

    async fn recv(&mut self) -> ExecInput {
        let Some(input) = self.input.as_mut() else { return std::future::pending().await };
        match input.recv().await {
            Some(chunk) if !chunk.is_empty() => ExecInput::Stdin(chunk.to_vec()),
            Some(_) => ExecInput::Other,
            None => {
                self.input = None;
                ExecInput::Stdin(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_and_split() {
        assert_eq!(absolute("a/b", "/workspace").unwrap(), "/workspace/a/b");
        assert_eq!(absolute("/etc", "/workspace").unwrap(), "/etc");
        assert_eq!(absolute("/workspace/../etc/./hosts", "/w").unwrap(), "/etc/hosts");
        assert_eq!(absolute("../../../..", "/workspace").unwrap(), "/");
        assert!(absolute("", "/w").is_err() && absolute("a\0b", "/w").is_err());
        assert_eq!(split("/a/b/"), Some(("/a".into(), "b".into())));
        assert_eq!(split("/a"), Some(("/".into(), "a".into())));
        assert_eq!(split("/"), None);
        assert_eq!(split("/a/.."), None);
        assert_eq!(permissions(&EntryKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(&EntryKind::File, 0o640), "-rw-r-----");
    }
}
