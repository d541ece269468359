//! The tools: each parses its arguments ([`crate::args`]), calls the
//! runtime as the actor `mcp`, and answers JSON (structured content, and
//! the same as text). A failure is a tool result with `is_error` whose one
//! line starts with the runtime's error code, e.g. `not_found: ...`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::Duration;

use cairn_core::TaskState;
use cairn_runtime::{Error, Runtime};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use serde::Serialize;
use serde_json::{json, Value};

use crate::args::{self, WaitCall};
use crate::views::{SnapshotSummary, TaskSummary};

/// Who the event log says acted.
pub const ACTOR: &str = "mcp";

/// The MCP server's handler: the tools over one runtime.
#[derive(Clone)]
pub struct CairnTools {
    rt: Arc<Runtime>,
    tool_router: ToolRouter<CairnTools>,
}

impl std::fmt::Debug for CairnTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CairnTools").finish_non_exhaustive()
    }
}

/// The answer of a tool: its JSON, or the error as one line.
fn answer<T: Serialize>(result: Result<T, Error>) -> CallToolResult {
    match result.and_then(|v| serde_json::to_value(v).map_err(Error::internal_from)) {
        Ok(value) => CallToolResult::structured(value),
        Err(e) => failure(&e),
    }
}

/// `code: message`, the code as the HTTP API spells it.
pub fn error_line(e: &Error) -> String {
    let code = serde_json::to_value(e.code()).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "internal".to_owned());
    format!("{code}: {e}")
}

fn failure(e: &Error) -> CallToolResult {
    if matches!(e, Error::Internal { .. }) {
        tracing::error!("mcp tool failed: {e}");
    }
    CallToolResult::error(vec![ContentBlock::text(error_line(e))])
}

#[tool_router]
impl CairnTools {
    pub fn new(rt: Arc<Runtime>) -> CairnTools {
        CairnTools { rt, tool_router: Self::tool_router() }
    }

    #[tool(description = "Create a task: a sandbox (a small Linux machine with its own files) that keeps its state across calls and \
        can be snapshotted, rolled back and forked. Answers the task; use its id (or the name you gave) in the other tools.")]
    async fn create_task(&self, Parameters(a): Parameters<args::CreateTask>) -> CallToolResult {
        let req = match a.into_request() {
            Ok(r) => r,
            Err(e) => return failure(&e),
        };
        answer(self.rt.create(req, ACTOR).await.map(TaskSummary::from))
    }

    #[tool(description = "List the tasks: id, name, state (running, suspended, ...), step, working directory and limits of \
        each. Destroyed tasks are left out unless include_destroyed is true.", annotations(read_only_hint = true))]
    async fn list_tasks(&self, Parameters(a): Parameters<args::ListTasks>) -> CallToolResult {
        answer(self.rt.list().await.map(|tasks| {
            let shown = tasks.into_iter().filter(|t| a.include_destroyed || t.task.state != TaskState::Destroyed);
            json!({ "tasks": shown.map(TaskSummary::from).collect::<Vec<_>>() })
        }))
    }

    #[tool(description = "Show one task: its state, step, working directory, limits, its last rollback note (why it was \
        rolled back) and what it waits for, if anything.", annotations(read_only_hint = true))]
    async fn get_task(&self, Parameters(a): Parameters<args::TaskRef>) -> CallToolResult {
        answer(self.rt.show(&a.task).await.map(TaskSummary::from))
    }

    #[tool(description = "List a task's snapshots, oldest first: id, kind (milestone, pre-risk, ...), note, whether it is \
        healthy, and the step it was taken at; the ids are what rollback and fork take.", annotations(read_only_hint = true))]
    async fn list_snapshots(&self, Parameters(a): Parameters<args::TaskRef>) -> CallToolResult {
        answer(self.rt.list_snapshots(&a.task).await.map(|snaps| json!({ "snapshots": snaps.into_iter().map(SnapshotSummary::from).collect::<Vec<_>>() })))
    }

    #[tool(description = "Run a command in a task to its end and answer its exit code, stdout and stderr (each cut at the \
        output cap, flagged by `truncated`). `cmd` is a shell line (run by sh -c) or an argument vector. It is stopped after \
        `timeout` seconds, 50 unless given. A suspended task is woken first.")]
    async fn run_command(&self, Parameters(a): Parameters<args::RunCommand>) -> CallToolResult {
        let task = a.task.clone();
        let defaulted = a.timeout.is_none();
        answer(self.rt.run(&task, ACTOR, a.into_request()).await.and_then(|ran| {
            let mut value = serde_json::to_value(&ran).map_err(Error::internal_from)?;
            if ran.timed_out && defaulted {
                value["message"] = json!(format!(
                    "stopped after the default timeout of {} s; give a longer timeout (seconds) if it needs more",
                    args::DEFAULT_COMMAND_SECS
                ));
            }
            Ok(value)
        }))
    }

    #[tool(description = "Read one regular file of a task's sandbox (at most 64 MiB). Answers `content` as text with `encoding` \
        \"utf8\" when the file is valid UTF-8, else its bytes in base64 with `encoding` \"base64\".", annotations(read_only_hint = true))]
    async fn read_file(&self, Parameters(a): Parameters<args::ReadFile>) -> CallToolResult {
        let path = match self.path_of(&a.task, a.path, a.path_b64, false).await {
            Ok(p) => p,
            Err(e) => return failure(&e),
        };
        let shown = shown(&path);
        let read = cairn_runtime::files::read_one(self.rt.clone(), &a.task, path, ACTOR.to_owned()).await;
        answer(read.map(|data| {
            let size = data.len();
            let (encoding, content) = args::encode_content(data);
            json!({ "path": shown, "size": size, "encoding": encoding.as_str(), "content": content })
        }))
    }

    #[tool(description = "Write one file in a task's sandbox, replacing a regular file already there; missing directories on its path are made. \
        `content` is text, or base64 with `encoding` \"base64\" for binary content.")]
    async fn write_file(&self, Parameters(a): Parameters<args::WriteFile>) -> CallToolResult {
        let data = match a.bytes() {
            Ok(d) => d,
            Err(e) => return failure(&e),
        };
        let size = data.len();
        let path = match self.path_of(&a.task, a.path, a.path_b64, false).await {
            Ok(p) => p,
            Err(e) => return failure(&e),
        };
        let written = cairn_runtime::files::write_one(self.rt.clone(), &a.task, path, data.into(), ACTOR.to_owned()).await;
        answer(written.map(|shown| json!({ "path": shown, "size": size })))
    }

    #[tool(description = "List a directory of a task's sandbox: each entry's name, kind (file, dir, symlink, other), size, mode, \
        modification time and link target.", annotations(read_only_hint = true))]
    async fn list_files(&self, Parameters(a): Parameters<args::ListFiles>) -> CallToolResult {
        let path = match self.path_of(&a.task, a.path, a.path_b64, true).await {
            Ok(p) => p,
            Err(e) => return failure(&e),
        };
        answer(cairn_runtime::files::list_dir(self.rt.clone(), &a.task, path, ACTOR.to_owned()).await)
    }

    #[tool(description = "Snapshot a task: its files (and memory summary) now, to roll back to or fork from later. Take a \
        \"milestone\" when something works and a \"pre-risk\" before trying something that may break it. Answers the snapshot \
        with its id.")]
    async fn snapshot(&self, Parameters(a): Parameters<args::Snapshot>) -> CallToolResult {
        match a.into_request() {
            Ok((task, req)) => answer(self.rt.snapshot(&task, req, ACTOR).await.map(SnapshotSummary::from)),
            Err(e) => failure(&e),
        }
    }

    #[tool(description = "Roll a task back in place to a snapshot (or the newest healthy one), discarding what changed since. \
        A reason is required: it is kept in the task's rollback note, answered here, so the next attempt knows what failed.", annotations(destructive_hint = true))]
    async fn rollback(&self, Parameters(a): Parameters<args::Rollback>) -> CallToolResult {
        match a.into_request() {
            Ok((task, req)) => answer(self.rt.rollback(&task, req, ACTOR).await),
            Err(e) => failure(&e),
        }
    }

    #[tool(description = "Fork a task: new tasks, each starting from one of its snapshots (default: the newest; take one \
        first with `snapshot`), to try alternatives side by side. Answers the new tasks.")]
    async fn fork(&self, Parameters(a): Parameters<args::Fork>) -> CallToolResult {
        let (task, req) = a.into_request();
        answer(self.rt.fork(&task, req, ACTOR).await.map(|tasks| json!({ "tasks": tasks.into_iter().map(TaskSummary::from).collect::<Vec<_>>() })))
    }

    #[tool(description = "Expose a port: a signed link through which a person (or a browser) reaches a server listening on \
        `port` inside the task, over HTTP and WebSocket, until the link expires. The task stays offline: the daemon relays \
        each request. Answers the url and when it expires.", annotations(read_only_hint = true))]
    async fn expose_port(&self, Parameters(a): Parameters<args::ExposePort>) -> CallToolResult {
        let ttl = a.ttl_seconds.unwrap_or(3600);
        if a.port == 0 || ttl == 0 || ttl > 7 * 24 * 3600 {
            return failure(&Error::invalid(format!("port {} with ttl_seconds {ttl}: give a port of 1 to 65535 and a ttl of 1 s to 7 days", a.port)));
        }
        let ttl = Duration::from_secs(ttl);
        answer(self.rt.port_link(&a.task, a.port, ttl).await.map(|link| json!({ "url": link.url, "expires_ms": link.expires_ms })))
    }

    #[tool(description = "Ask a person to approve something, and wait for the answer. The task is suspended while it waits and \
        runs again, with its files, once answered. Give task and prompt to ask. If no answer comes within `timeout` seconds, the \
        answer has state \"pending\", the wait_id and the approval_url to show the person: call again with wait_id alone to keep \
        waiting. Once answered, state is \"satisfied\" and `approved` says the decision.")]
    async fn wait_for_approval(&self, Parameters(a): Parameters<args::WaitForApproval>) -> CallToolResult {
        let (wait_id, block) = match a.into_call() {
            Ok(WaitCall::Ask { task, prompt, block }) => {
                let req = cairn_api::waits::WaitRequest { approval: Some(prompt), ..Default::default() };
                match self.rt.wait(&task, req, ACTOR).await {
                    Ok(view) => (view.id.to_string(), block),
                    Err(e) => return failure(&e),
                }
            }
            Ok(WaitCall::Resume { wait_id, block }) => (wait_id, block),
            Err(e) => return failure(&e),
        };
        answer(self.block_on_wait(&wait_id, block).await)
    }

    #[tool(description = "Deliver a task's outputs: files, a directory as an archive, a patch of its changes and a report \
        file (all sandbox paths), recorded in a signed delivery record. Answers the record id and each deliverable's name and SHA-256. With complete, the \
        task is then finished and its sandbox removed.")]
    async fn deliver(&self, Parameters(a): Parameters<args::Deliver>) -> CallToolResult {
        let (task, req) = match a.into_request() {
            Ok(r) => r,
            Err(e) => return failure(&e),
        };
        answer(self.rt.deliver_outputs(&task, req, ACTOR).await.map(|d| {
            // The signed envelope itself is left out: it is long, and
            // fetched by record id from the HTTP API when needed.
            json!({
                "task": d.task,
                "record_id": d.record_id,
                "deliverables": d.deliverables,
                "ledger_seq": d.ledger_seq,
                "completed": d.completed,
            })
        }))
    }

    #[tool(description = "Destroy a task: its sandbox, snapshots and scratch space go. This cannot be undone.", annotations(destructive_hint = true))]
    async fn destroy_task(&self, Parameters(a): Parameters<args::TaskRef>) -> CallToolResult {
        answer(self.rt.destroy(&a.task, ACTOR).await.map(TaskSummary::from))
    }
}

impl CairnTools {
    /// A sandbox path as the tools take it (`path`, or its bytes in
    /// `path_b64`), made absolute: a relative one starts at the task's
    /// working directory, as a command's would, and so does none when
    /// `none_is_workdir`.
    async fn path_of(&self, task: &str, path: Option<String>, path_b64: Option<String>, none_is_workdir: bool) -> Result<OsString, Error> {
        let path = match args::sandbox_path(path, path_b64)? {
            Some(p) => p,
            None if none_is_workdir => OsString::new(),
            None => return Err(Error::invalid("give the file's path (path, or path_b64 for a name that is not UTF-8)")),
        };
        if path.as_bytes().starts_with(b"/") {
            return Ok(path);
        }
        let workdir = self.rt.show(task).await?.task.config.workdir;
        Ok(join_relative(workdir.as_ref(), &path))
    }

    /// Blocks on the wait for at most `block`, then answers where it is.
    async fn block_on_wait(&self, wait_id: &str, block: Duration) -> Result<Value, Error> {
        let view = self.rt.get_wait(wait_id, Some(block)).await?;
        Ok(wait_answer(&view))
    }
}

/// `path` (relative, or empty for the directory itself) under `workdir`.
fn join_relative(workdir: &OsStr, path: &OsStr) -> OsString {
    let mut path = path.as_bytes();
    while let Some(rest) = path.strip_prefix(b"./") {
        path = rest;
    }
    let mut dir = workdir.as_bytes();
    while let Some(rest) = dir.strip_suffix(b"/") {
        dir = rest;
    }
    let joined = match path {
        b"" | b"." if dir.is_empty() => b"/".to_vec(),
        b"" | b"." => dir.to_vec(),
        rel => [dir, b"/", rel].concat(),
    };
    OsString::from_vec(joined)
}

/// A sandbox path as answers show it (bytes that are not UTF-8 as `\xNN`).
fn shown(path: &OsStr) -> String {
    cairn_core::name::escaped(path.as_bytes()).into_owned()
}

/// A wait as `wait_for_approval` answers it: satisfied with the decision,
/// or pending with what the client needs to show and to call again.
fn wait_answer(view: &cairn_api::waits::WaitView) -> Value {
    let running = view.task_state == TaskState::Running;
    if view.state == "cancelled" {
        return json!({
            "state": "cancelled",
            "wait_id": view.id,
            "task": view.task,
            "task_state": view.task_state,
            "message": "the wait was cancelled without an answer",
        });
    }
    if view.satisfied_ms.is_some() {
        let data = view.event.as_ref().map(|e| &e.data);
        json!({
            "state": "satisfied",
            "wait_id": view.id,
            "task": view.task,
            "task_state": view.task_state,
            "approved": data.and_then(|d| d.get("decision")).and_then(Value::as_str).map(|d| d == "approve"),
            "comment": data.and_then(|d| d.get("comment")).cloned().unwrap_or(Value::Null),
            "event": view.event,
            "message": if running { "answered; the task is running again" } else { "answered" },
        })
    } else {
        json!({
            "state": "pending",
            "wait_id": view.id,
            "task": view.task,
            "task_state": view.task_state,
            "approval_url": view.approval_url,
            "message": format!("still waiting for approval; show the approval_url to a person, then call wait_for_approval with wait_id {} to keep waiting", view.id),
        })
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "cairn",
    instructions = "Cairn runs your work in sandboxed tasks that persist: create a task, run commands and edit files in it, \
        snapshot before risky steps and roll back (with a reason) when something breaks, fork to try alternatives, ask a \
        person for approval, and deliver the results."
)]
impl ServerHandler for CairnTools {}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{EventSource, InboxEvent, InboxId, TaskId, Wait, WaitFor, WaitId};

    #[test]
    fn every_tool_is_listed_with_an_object_schema() {
        let names: Vec<String> = CairnTools::tool_router().list_all().into_iter().map(|t| t.name.to_string()).collect();
        for want in [
            "create_task",
            "list_tasks",
            "run_command",
            "read_file",
            "write_file",
            "list_files",
            "snapshot",
            "rollback",
            "fork",
            "wait_for_approval",
            "deliver",
            "destroy_task",
            "expose_port",
            "get_task",
            "list_snapshots",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
        }
        let rollback = CairnTools::tool_router().list_all().into_iter().find(|t| t.name == "rollback").unwrap();
        let schema = serde_json::to_value(&rollback.input_schema).unwrap();
        assert_eq!(schema["type"], "object");
        assert!(schema["required"].as_array().unwrap().iter().any(|r| r == "reason"), "{schema}");
    }

    #[test]
    fn fork_count_is_bounded_in_the_schema_and_a_string_cmd_is_allowed() {
        let schema = |name: &str| {
            let tool = CairnTools::tool_router().list_all().into_iter().find(|t| t.name == name).unwrap();
            serde_json::to_value(&tool.input_schema).unwrap()
        };
        let fork = schema("fork");
        assert_eq!((fork["properties"]["count"]["minimum"].as_u64(), fork["properties"]["count"]["maximum"].as_u64()), (Some(1), Some(128)), "{fork}");
        let run = schema("run_command").to_string();
        assert!(run.contains("\"string\"") && run.contains("\"array\""), "cmd takes a string or an array: {run}");
    }

    #[test]
    fn a_relative_path_starts_at_the_working_directory() {
        let j = |w: &str, p: &str| join_relative(OsStr::new(w), OsStr::new(p));
        assert_eq!(j("/workspace", "a/b.txt"), "/workspace/a/b.txt");
        assert_eq!(j("/workspace/", "./a"), "/workspace/a");
        assert_eq!(j("/workspace", ""), "/workspace");
        assert_eq!(j("/workspace", "."), "/workspace");
        assert_eq!(j("/", "etc/hosts"), "/etc/hosts");
        assert_eq!(j("/", ""), "/");
        let latin1 = join_relative(OsStr::new("/w"), OsStr::from_bytes(b"caf\xe9"));
        assert_eq!((latin1.as_bytes(), shown(&latin1).as_str()), (&b"/w/caf\xe9"[..], "/w/caf\\xe9"));
    }

    #[test]
    fn errors_start_with_the_code() {
        assert_eq!(error_line(&Error::not_found("no task named x")), "not_found: no task named x");
        let result = failure(&Error::invalid("cmd is empty"));
        assert_eq!(result.is_error, Some(true));
    }

    #[test]
    fn a_pending_wait_says_how_to_keep_waiting_and_a_satisfied_one_the_decision() {
        let task = TaskId::random();
        let wait = Wait {
            id: WaitId::random(),
            task: task.clone(),
            what: WaitFor::Approval { prompt: "ship?".into() },
            created_ms: 1,
            satisfied_ms: None,
            event: None,
            cancelled_ms: None,
        };
        let pending = cairn_api::waits::WaitView::new(wait.clone(), TaskState::Suspended, Some("http://x/approve/w".into()), None, None);
        let v = wait_answer(&pending);
        assert_eq!(v["state"], "pending");
        assert_eq!(v["approval_url"], "http://x/approve/w");
        assert!(v["message"].as_str().unwrap().contains(wait.id.as_str()));
        let event = InboxEvent {
            id: InboxId::random(),
            task,
            source: EventSource::Approval,
            name: "approval".into(),
            delivery: None,
            data: json!({"decision": "reject", "comment": "not yet", "by": "cli:ann"}),
            received_ms: 2,
            wait: None,
        };
        let done = cairn_api::waits::WaitView::new(Wait { satisfied_ms: Some(2), ..wait }, TaskState::Running, None, None, Some(event));
        let v = wait_answer(&done);
        assert_eq!((v["state"].as_str(), v["approved"].as_bool(), v["comment"].as_str()), (Some("satisfied"), Some(false), Some("not yet")));
    }
}
