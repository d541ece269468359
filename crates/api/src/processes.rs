//! Background commands with handles: `/v1/tasks/{id}/processes`.

use cairn_core::ExecExit;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::exec::ExecStart;

/// Body of `POST /v1/tasks/{id}/processes`: what to run, as for an exec,
/// and a tag to find it by.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct StartProcess {
    #[serde(flatten)]
    pub start: ExecStart,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A background command: its handle and how it stands.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct ProcessView {
    /// The handle: unique in the daemon, never reused.
    pub id: u32,
    pub task: String,
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub tty: bool,
    pub running: bool,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExecExit>,
    /// Why it could not run at all, if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/tasks/{id}/processes/{pid}`: the command and its output so far
/// (the last MiB of each; UTF-8, invalid bytes replaced).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct ProcessOutput {
    #[serde(flatten)]
    pub process: ProcessView,
    pub stdout: String,
    pub stderr: String,
    /// Older output was dropped.
    pub truncated: bool,
}

/// Body of `POST /v1/tasks/{id}/processes/{pid}/resize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct Resize {
    pub rows: u16,
    pub cols: u16,
}
