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

/// The channel byte that starts a binary frame.
pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;

/// A terminal size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

/// The first message: what to run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecStart {
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
}

/// A text frame from the client after the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientFrame {
    Resize { rows: u16, cols: u16 },
}

/// A text frame from the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
