//! `GET /v1/tasks/{id}/exec`: a command over a WebSocket.
//!
//! The client's first message is a text frame with an [`ExecStart`]. Then:
//! - server to client: binary frames `[1, bytes..]` (stdout) and
//!   `[2, bytes..]` (stderr, or the pty), text frames of [`ServerFrame`]
//!   (`pre-risk` when a snapshot was taken before the command, `started`,
//!   and finally `exit` or `error`);
//! - client to server: binary `[0, bytes..]` (stdin), `[0]` alone (stdin
//!   closed), text frames of [`ClientFrame`] (`resize`).
//!
//! Closing the socket early kills the command.

use cairn_core::ExecExit;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The channel byte that starts a binary frame.
pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;

/// A terminal size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

/// The first message: what to run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecStart {
    /// The command; empty runs the task's default command (its image's
    /// `Entrypoint` and `Cmd`), and is refused when it has none.
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub workdir: Option<String>,
    /// Pass the client's stdin (else the command reads /dev/null).
    #[serde(default)]
    pub stdin: bool,
    /// Run on a pty of this size.
    pub tty: Option<WinSize>,
    pub timeout_ms: Option<u64>,
    /// Take a `pre-risk` snapshot first, whatever the command.
    #[serde(default)]
    pub risky: bool,
    /// Run as this user (`uid`, `uid:gid`, `name` or `name:group`, looked
    /// up in the sandbox) instead of the task's (its image's `User`, else
    /// root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// A text frame from the client after the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientFrame {
    Resize { rows: u16, cols: u16 },
    /// A signal for the command (its process group under the native
    /// driver): one of [`SIGNALS`], by number.
    Signal { signal: i32 },
}

/// The signals a client may send a command: HUP, INT, QUIT, KILL, USR1,
/// USR2, TERM.
pub const SIGNALS: [i32; 7] = [1, 2, 3, 9, 10, 12, 15];

/// A signal of [`SIGNALS`] by name (`TERM`, `SIGTERM`) or number.
pub fn signal_number(name: &str) -> Option<i32> {
    let names = [("HUP", 1), ("INT", 2), ("QUIT", 3), ("KILL", 9), ("USR1", 10), ("USR2", 12), ("TERM", 15)];
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    names.iter().find(|(n, _)| *n == bare).map(|(_, s)| *s).or_else(|| bare.parse().ok().filter(|s| SIGNALS.contains(s)))
}

/// A text frame from the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ServerFrame {
    /// A `pre-risk` snapshot was taken before the command.
    PreRisk { snapshot: String, reason: String, freeze_ms: f64 },
    /// The command runs; `step` is the task's step counter for it.
    Started { step: u64 },
    /// How it ended.
    Exit {
        #[serde(flatten)]
        exit: ExecExit,
        /// With `oom_killed`: the task's memory limit, as a user reads it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_limit: Option<String>,
    },
    /// It could not run; `status` is the HTTP status the error maps to.
    Error { error: String, status: u16, code: crate::ErrorCode },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_keep_their_wire_shape() {
        let exit = ServerFrame::Exit {
            exit: ExecExit { exit_code: 137, signal: None, oom_killed: true, timed_out: false, duration_ms: 5 },
            memory_limit: Some("64M".into()),
        };
        let v = serde_json::to_value(&exit).unwrap_or_default();
        assert_eq!(v["type"], "exit");
        assert_eq!(v["exit_code"], 137);
        assert_eq!(v["memory_limit"], "64M");
        assert_eq!(serde_json::from_value::<ServerFrame>(v).ok(), Some(exit));
        let pre = serde_json::to_value(ServerFrame::PreRisk { snapshot: "s1".into(), reason: "rm -rf".into(), freeze_ms: 1.5 }).unwrap_or_default();
        assert_eq!(pre["type"], "pre-risk");
        let resize: ClientFrame = serde_json::from_str(r#"{"type":"resize","rows":24,"cols":80}"#).unwrap_or(ClientFrame::Resize { rows: 0, cols: 0 });
        assert_eq!(resize, ClientFrame::Resize { rows: 24, cols: 80 });
    }
}

/// Body of `POST /v1/tasks/{id}/exec`: a command run to its end over plain
/// HTTP (no WebSocket), answered with a [`RunAnswer`]; with
/// `Accept: text/event-stream`, its output as server-sent events as it
/// comes (`stdout` and `stderr` events of [`RunOutput`], then one `exit`
/// event of a [`RunAnswer`] without the output).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The program and its arguments; empty or absent runs the task's
    /// default command (its image's `Entrypoint` and `Cmd`), and is refused
    /// when it has none.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// Variables added to the task's environment.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The working directory (default: the task's).
    pub cwd: Option<String>,
    /// Seconds before the command is killed (exit code 124).
    pub timeout: Option<f64>,
    /// What the command reads on stdin (else it reads nothing).
    pub stdin: Option<String>,
    /// Run as this user (`uid`, `uid:gid`, `name` or `name:group`) instead
    /// of the task's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The answer to a [`RunRequest`]: how the command ended and what it
/// wrote, each stream capped at [`RUN_OUTPUT_CAP`] bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct RunAnswer {
    pub exit_code: i32,
    /// Its output as text (invalid UTF-8 replaced).
    pub stdout: String,
    pub stderr: String,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// True when stdout or stderr was longer than the cap and was cut.
    pub truncated: bool,
}

/// Most bytes of each stream kept in a [`RunAnswer`].
pub const RUN_OUTPUT_CAP: usize = 1 << 20;

/// One `stdout` or `stderr` server-sent event of a streamed run.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct RunOutput {
    /// The bytes as text (invalid UTF-8 replaced; a character split across
    /// two reads may show as replacement characters).
    pub data: String,
}

#[cfg(test)]
mod run_tests {
    use super::*;

    #[test]
    fn a_run_request_takes_only_its_fields_and_an_answer_round_trips() {
        let req: RunRequest = serde_json::from_str(r#"{"cmd": ["ls", "-l"], "env": {"A": "1"}, "timeout": 2.5}"#).unwrap();
        assert_eq!(req.cmd, ["ls", "-l"]);
        assert_eq!(req.env.get("A").map(String::as_str), Some("1"));
        assert!(serde_json::from_str::<RunRequest>(r#"{"cmd": ["ls"], "argv": []}"#).is_err(), "unknown fields are refused");
        let a = RunAnswer { exit_code: 3, stdout: "x".into(), truncated: true, ..Default::default() };
        let text = serde_json::to_string(&a).unwrap();
        for key in ["exit_code", "stdout", "stderr", "signal", "oom_killed", "duration_ms", "truncated"] {
            assert!(text.contains(&format!("\"{key}\"")), "{key} in {text}");
        }
        assert_eq!(serde_json::from_str::<RunAnswer>(&text).unwrap(), a);
    }
}

/// A running command's output as anyone watching the task sees it (the
/// console's live timeline): its start, its output as it comes (each
/// chunk as read, decoded lossily as UTF-8), its end. Not kept: only the
/// command's exit goes to the task's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LiveOutput {
    Started { step: u64, argv: Vec<String> },
    Output { step: u64, stream: String, text: String },
    Exited { step: u64, exit_code: i32 },
}
