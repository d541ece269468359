//! The tools' arguments as an agent gives them, each with the JSON schema
//! rmcp publishes, and their checked conversion into the runtime's
//! requests. A bad argument is an [`Error::Invalid`] naming it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use base64::Engine;
use cairn_api::deliver::DeliverRequest;
use cairn_api::exec::RunRequest;
use cairn_api::snapshots::{ForkRequest, RollbackRequest, SnapshotRequest};
use cairn_api::tasks::CreateRequest;
use cairn_runtime::Error;
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// The image to start from (default: the daemon's default image).
    pub image: Option<String>,
    /// A unique name to call the task by instead of its id.
    pub name: Option<String>,
    /// Environment variables of every command in the task.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory of commands (default: the image's).
    pub workdir: Option<String>,
    /// Memory limit, e.g. "512M" or "2G".
    pub memory: Option<String>,
    /// CPU limit, e.g. "1" or "0.5".
    pub cpus: Option<String>,
    /// Disk limit of the writable layer, e.g. "2G".
    pub disk: Option<String>,
    /// Suspend the task after this long without activity, e.g. "10m".
    pub idle_suspend: Option<String>,
    /// Hosts the task may reach (`HOST[:PORT]`, `*.example.com`); without
    /// any, the daemon's default egress policy applies.
    #[serde(default)]
    pub allow: Vec<String>,
    /// "native" or "gvisor" (a second kernel; its suspends keep running
    /// processes and their memory). Default: the daemon's.
    pub isolation: Option<String>,
}

impl CreateTask {
    pub fn into_request(self) -> Result<CreateRequest, Error> {
        check_env_names(&self.env)?;
        Ok(CreateRequest {
            image: self.image,
            name: self.name,
            env: self.env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            workdir: self.workdir,
            memory: self.memory,
            cpus: self.cpus,
            disk: self.disk,
            idle_suspend: self.idle_suspend,
            allow: self.allow,
            isolation: self.isolation,
            ..CreateRequest::default()
        })
    }
}

fn check_env_names(env: &BTreeMap<String, String>) -> Result<(), Error> {
    match env.keys().find(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
        Some(k) => Err(Error::invalid(format!("env name {k:?} is not a variable name"))),
        None => Ok(()),
    }
}

/// A tool that names only its task.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    /// The task's id or name.
    pub task: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// The task's id or name.
    pub task: String,
    /// The command: a shell line as one string (run by `sh -c`, so pipes
    /// and redirections work), or the program and its arguments as an
    /// array, e.g. ["ls", "-l"].
    pub cmd: CommandLine,
    /// The working directory (default: the task's).
    pub cwd: Option<String>,
    /// Variables added to the task's environment for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is killed (it then ends with exit code
    /// 124 and `timed_out`); default 50, under the minute many clients
    /// wait for a tool.
    pub timeout: Option<f64>,
    /// What the command reads on stdin (else it reads nothing).
    pub stdin: Option<String>,
}

/// A command as a tool takes it.
#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged, expecting = "cmd as a shell line (a string) or a program and its arguments (an array of strings)")]
pub enum CommandLine {
    /// A shell line, run by `sh -c`.
    Shell(String),
    /// A program and its arguments.
    Argv(Vec<String>),
}

/// How long a command runs when the call does not say: under the minute
/// after which common clients give up on a tool call, so the answer (with
/// `timed_out`) reaches the agent instead of a client-side timeout.
pub const DEFAULT_COMMAND_SECS: f64 = 50.0;

impl RunCommand {
    /// The run request; the runtime checks cmd, timeout and env names.
    pub fn into_request(self) -> RunRequest {
        let cmd = match self.cmd {
            CommandLine::Shell(line) if line.trim().is_empty() => Vec::new(),
            CommandLine::Shell(line) => vec!["sh".to_owned(), "-c".to_owned(), line],
            CommandLine::Argv(argv) => argv,
        };
        let timeout = Some(self.timeout.unwrap_or(DEFAULT_COMMAND_SECS));
        RunRequest { cmd, env: self.env, cwd: self.cwd, timeout, stdin: self.stdin, user: None }
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasks {
    /// Also list destroyed tasks (left out by default).
    #[serde(default)]
    pub include_destroyed: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The task's id or name.
    pub task: String,
    /// The file's path in the sandbox; a relative path starts at the
    /// task's working directory.
    pub path: Option<String>,
    /// The path's bytes in base64, instead of `path`: for a name that is
    /// not UTF-8 (a listing gives its `name_b64`).
    pub path_b64: Option<String>,
}

/// A sandbox path from `path` or `path_b64` (its bytes in base64), at most
/// one of them; `None` when neither is given.
pub fn sandbox_path(path: Option<String>, path_b64: Option<String>) -> Result<Option<OsString>, Error> {
    match (path, path_b64) {
        (Some(_), Some(_)) => Err(Error::invalid("give path or path_b64, not both")),
        (Some(p), None) => Ok(Some(p.into())),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .map(|bytes| Some(OsString::from_vec(bytes)))
            .map_err(|e| Error::invalid(format!("path_b64 is not valid base64: {e}"))),
        (None, None) => Ok(None),
    }
}

/// How file content is written in an argument or an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The content is the text itself.
    #[default]
    Utf8,
    /// The content is the bytes in standard base64.
    Base64,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf8",
            Encoding::Base64 => "base64",
        }
    }
}

/// File bytes as an answer carries them: the text when they are UTF-8,
/// else base64.
pub fn encode_content(data: Vec<u8>) -> (Encoding, String) {
    match String::from_utf8(data) {
        Ok(text) => (Encoding::Utf8, text),
        Err(e) => (Encoding::Base64, base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// The task's id or name.
    pub task: String,
    /// The file's path in the sandbox (a relative path starts at the
    /// task's working directory); missing directories are made. An existing
    /// regular file is replaced.
    pub path: Option<String>,
    /// The path's bytes in base64, instead of `path`: for a name that is
    /// not UTF-8.
    pub path_b64: Option<String>,
    /// The file's content.
    pub content: String,
    /// How `content` is written: "utf8" (default) or "base64" for
    /// binary content.
    #[serde(default)]
    pub encoding: Encoding,
}

impl WriteFile {
    pub fn bytes(&self) -> Result<Vec<u8>, Error> {
        match self.encoding {
            Encoding::Utf8 => Ok(self.content.as_bytes().to_vec()),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(self.content.trim())
                .map_err(|e| Error::invalid(format!("content is not valid base64: {e}"))),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// The task's id or name.
    pub task: String,
    /// The directory in the sandbox (default: the task's working
    /// directory, where a relative path starts too).
    pub path: Option<String>,
    /// The path's bytes in base64, instead of `path`: for a name that is
    /// not UTF-8.
    pub path_b64: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// The task's id or name.
    pub task: String,
    /// Why it is taken: "milestone" (something works), "pre-risk" (about
    /// to try something risky), "branch" or "manual" (default).
    pub kind: Option<String>,
    /// A note saying what state this is, for choosing it later.
    pub note: Option<String>,
    /// Mark the snapshot healthy, so that `rollback` with `last_healthy`
    /// can return to it.
    pub healthy: Option<bool>,
    /// Also keep the sandbox's running processes and their memory (tasks
    /// created with isolation "gvisor"), so that a rollback to the snapshot
    /// or a fork from it continues them.
    pub with_memory: Option<bool>,
}

/// The kinds a caller may ask for (`suspend` snapshots are the daemon's).
const SNAPSHOT_KINDS: [&str; 4] = ["milestone", "pre-risk", "branch", "manual"];

impl Snapshot {
    pub fn into_request(self) -> Result<(String, SnapshotRequest), Error> {
        if let Some(kind) = self.kind.as_deref().filter(|k| !SNAPSHOT_KINDS.contains(k)) {
            return Err(Error::invalid(format!("kind {kind:?} is not one of {}", SNAPSHOT_KINDS.join(", "))));
        }
        Ok((self.task, SnapshotRequest { kind: self.kind, note: self.note, memory: None, healthy: self.healthy, with_memory: self.with_memory.unwrap_or(false) }))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// The task's id or name.
    pub task: String,
    /// The snapshot to go back to (its id); give this or `last_healthy`.
    pub to: Option<String>,
    /// Go back to the newest snapshot marked healthy.
    #[serde(default)]
    pub last_healthy: bool,
    /// Why: what went wrong. It is kept in the task's rollback note, which
    /// tells whoever works on the task next.
    pub reason: String,
}

impl Rollback {
    pub fn into_request(self) -> Result<(String, RollbackRequest), Error> {
        if self.reason.trim().is_empty() {
            return Err(Error::invalid("reason is empty: say what went wrong"));
        }
        match (&self.to, self.last_healthy) {
            (Some(_), true) => return Err(Error::invalid("give either to or last_healthy, not both")),
            (None, false) => return Err(Error::invalid("give the snapshot to roll back to, or last_healthy: true")),
            _ => {}
        }
        Ok((self.task, RollbackRequest { to: self.to, last_healthy: self.last_healthy, reason: self.reason }))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    /// The task's id or name.
    pub task: String,
    /// The snapshot to fork from (default: the task's newest snapshot).
    pub from: Option<String>,
    /// How many tasks to make (default 1, at most 128).
    #[schemars(range(min = 1, max = 128))]
    pub count: Option<u32>,
}

impl Fork {
    pub fn into_request(self) -> (String, ForkRequest) {
        (self.task, ForkRequest { from: self.from, count: self.count })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// The task's id or name.
    pub task: String,
    /// The port a server listens on inside the task (1 to 65535).
    pub port: u16,
    /// How long the link works, in seconds (default 3600, at most 7 days).
    pub ttl_seconds: Option<u64>,
}

/// Longest a single `wait_for_approval` call blocks.
pub const MAX_WAIT_SECS: f64 = 3600.0;
/// How long it blocks when not told: under the common client tool-call
/// timeout of a minute.
pub const DEFAULT_WAIT_SECS: f64 = 50.0;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitForApproval {
    /// The task's id or name (with `prompt`, to ask for a new approval).
    pub task: Option<String>,
    /// What a person is asked to approve (with `task`).
    pub prompt: Option<String>,
    /// Keep waiting on this wait, from an earlier answer that was still
    /// pending (instead of `task` and `prompt`).
    pub wait_id: Option<String>,
    /// Seconds to block before answering "pending" (default 50, at most
    /// 3600).
    pub timeout: Option<f64>,
}

/// What a `wait_for_approval` call does.
#[derive(Debug, PartialEq)]
pub enum WaitCall {
    /// Ask: register the approval wait on the task, then block.
    Ask { task: String, prompt: String, block: Duration },
    /// Keep blocking on an existing wait.
    Resume { wait_id: String, block: Duration },
}

impl WaitForApproval {
    pub fn into_call(self) -> Result<WaitCall, Error> {
        let secs = self.timeout.unwrap_or(DEFAULT_WAIT_SECS);
        if !secs.is_finite() || !(0.0..=MAX_WAIT_SECS).contains(&secs) {
            return Err(Error::invalid(format!("timeout must be 0 to {MAX_WAIT_SECS} seconds, not {secs}")));
        }
        let block = Duration::from_secs_f64(secs);
        match (self.task, self.prompt, self.wait_id) {
            (Some(task), Some(prompt), None) => Ok(WaitCall::Ask { task, prompt, block }),
            (None, None, Some(wait_id)) => Ok(WaitCall::Resume { wait_id, block }),
            _ => Err(Error::invalid("give task and prompt to ask for an approval, or wait_id alone to keep waiting")),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Deliver {
    /// The task's id or name.
    pub task: String,
    /// Sandbox paths of files to deliver.
    #[serde(default)]
    pub files: Vec<String>,
    /// A sandbox directory to deliver as one archive (`NAME.tar.zst`).
    pub archive: Option<String>,
    /// Also deliver a unified diff of everything the task changed.
    #[serde(default)]
    pub patch: bool,
    /// The sandbox path of a report (e.g. Markdown) saying what was done
    /// and why; write it first with `write_file`.
    pub report: Option<String>,
    /// Then complete the task: its sandbox and scratch space are removed.
    #[serde(default)]
    pub complete: bool,
}

impl Deliver {
    pub fn into_request(self) -> Result<(String, DeliverRequest), Error> {
        if self.files.is_empty() && self.archive.is_none() && !self.patch && self.report.is_none() {
            return Err(Error::invalid("nothing to deliver: give files, archive, patch or report"));
        }
        Ok((self.task, DeliverRequest { files: self.files, archive: self.archive, patch: self.patch, report: self.report, complete: self.complete }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_api::ErrorCode;

    fn message<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
        let e = r.expect_err("should be refused");
        assert_eq!(e.code(), ErrorCode::Invalid);
        e.to_string()
    }

    #[test]
    fn create_task_turns_the_env_map_into_assignments_and_refuses_bad_names() {
        let args: CreateTask = serde_json::from_value(serde_json::json!({"name": "t", "env": {"A": "1", "B": "x=y"}})).unwrap();
        let req = args.into_request().unwrap();
        assert_eq!(req.env, ["A=1", "B=x=y"]);
        assert_eq!(req.name.as_deref(), Some("t"));
        let bad = CreateTask { env: BTreeMap::from([("A=B".into(), "1".into())]), ..CreateTask::default() };
        assert!(message(bad.into_request()).contains("\"A=B\""));
    }

    #[test]
    fn unknown_arguments_are_refused_by_name() {
        let e = serde_json::from_value::<RunCommand>(serde_json::json!({"task": "t", "cmd": ["ls"], "cwdd": "/"})).unwrap_err();
        assert!(e.to_string().contains("cwdd"), "{e}");
    }

    #[test]
    fn a_path_is_text_or_its_bytes_in_base64_never_both() {
        assert_eq!(sandbox_path(Some("/w/a".into()), None).unwrap(), Some(OsString::from("/w/a")));
        assert_eq!(sandbox_path(None, Some("L3cvY2Fm6Q==".into())).unwrap(), Some(OsString::from_vec(b"/w/caf\xe9".to_vec())));
        assert_eq!(sandbox_path(None, None).unwrap(), None);
        assert!(message(sandbox_path(Some("/a".into()), Some("L2E=".into()))).contains("not both"));
        assert!(message(sandbox_path(None, Some("%%".into()))).contains("path_b64"));
    }

    #[test]
    fn a_string_cmd_runs_in_a_shell_and_the_timeout_defaults_under_a_minute() {
        let run = |args: serde_json::Value| serde_json::from_value::<RunCommand>(args).unwrap().into_request();
        let line = run(serde_json::json!({"task": "t", "cmd": "ls | wc -l"}));
        assert_eq!((line.cmd, line.timeout), (vec!["sh".to_owned(), "-c".to_owned(), "ls | wc -l".to_owned()], Some(DEFAULT_COMMAND_SECS)));
        let argv = run(serde_json::json!({"task": "t", "cmd": ["ls", "-l"], "timeout": 600}));
        assert_eq!((argv.cmd, argv.timeout), (vec!["ls".to_owned(), "-l".to_owned()], Some(600.0)));
        assert!(run(serde_json::json!({"task": "t", "cmd": "  "})).cmd.is_empty(), "a blank line is no command");
        let e = serde_json::from_value::<RunCommand>(serde_json::json!({"task": "t", "cmd": 5})).unwrap_err();
        assert!(e.to_string().contains("a shell line (a string) or a program"), "{e}");
    }

    #[test]
    fn file_content_is_text_when_utf8_and_base64_otherwise() {
        assert_eq!(encode_content(b"hi\n".to_vec()), (Encoding::Utf8, "hi\n".to_owned()));
        assert_eq!(encode_content(vec![0xff, 0x00]), (Encoding::Base64, "/wA=".to_owned()));
        let w = WriteFile { task: "t".into(), path: Some("/a".into()), path_b64: None, content: "/wA=".into(), encoding: Encoding::Base64 };
        assert_eq!(w.bytes().unwrap(), [0xff, 0x00]);
        let bad = WriteFile { content: "not base64!".into(), ..w };
        assert!(message(bad.bytes()).contains("base64"));
        let encoding: Encoding = serde_json::from_value(serde_json::json!("utf8")).unwrap();
        assert_eq!(encoding, Encoding::Utf8);
    }

    #[test]
    fn a_snapshot_kind_must_be_one_a_caller_may_ask_for() {
        let snap = |kind: &str| Snapshot { task: "t".into(), kind: Some(kind.into()), note: None, healthy: None, with_memory: None };
        assert_eq!(snap("pre-risk").into_request().unwrap().1.kind.as_deref(), Some("pre-risk"));
        assert!(message(snap("suspend").into_request()).contains("milestone, pre-risk, branch, manual"));
    }

    #[test]
    fn a_rollback_needs_a_reason_and_exactly_one_target() {
        let rb = |to: Option<&str>, last_healthy, reason: &str| Rollback { task: "t".into(), to: to.map(Into::into), last_healthy, reason: reason.into() };
        assert!(message(rb(Some("s"), false, "  ").into_request()).contains("reason"));
        assert!(message(rb(Some("s"), true, "broke").into_request()).contains("not both"));
        assert!(message(rb(None, false, "broke").into_request()).contains("last_healthy"));
        let (task, req) = rb(None, true, "tests went red").into_request().unwrap();
        assert_eq!((task.as_str(), req.last_healthy, req.reason.as_str()), ("t", true, "tests went red"));
    }

    #[test]
    fn wait_for_approval_either_asks_or_resumes() {
        let w = |task: Option<&str>, prompt: Option<&str>, wait_id: Option<&str>, timeout| WaitForApproval {
            task: task.map(Into::into),
            prompt: prompt.map(Into::into),
            wait_id: wait_id.map(Into::into),
            timeout,
        };
        let ask = w(Some("t"), Some("ship it?"), None, None).into_call().unwrap();
        assert_eq!(ask, WaitCall::Ask { task: "t".into(), prompt: "ship it?".into(), block: Duration::from_secs(50) });
        let resume = w(None, None, Some("w1"), Some(0.5)).into_call().unwrap();
        assert_eq!(resume, WaitCall::Resume { wait_id: "w1".into(), block: Duration::from_millis(500) });
        assert!(message(w(Some("t"), None, None, None).into_call()).contains("wait_id"));
        assert!(message(w(Some("t"), Some("p"), Some("w"), None).into_call()).contains("wait_id alone"));
        assert!(message(w(None, None, Some("w"), Some(-1.0)).into_call()).contains("timeout"));
        assert!(message(w(None, None, Some("w"), Some(f64::NAN)).into_call()).contains("timeout"));
    }

    #[test]
    fn a_delivery_must_deliver_something() {
        let d = Deliver { task: "t".into(), files: vec![], archive: None, patch: false, report: None, complete: false };
        assert!(message(d.into_request()).contains("nothing to deliver"));
        let d = Deliver { task: "t".into(), files: vec!["/w/out.txt".into()], archive: None, patch: false, report: None, complete: false };
        assert_eq!(d.into_request().unwrap().1.files, ["/w/out.txt"]);
    }
}
