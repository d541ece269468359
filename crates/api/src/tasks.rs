//! Tasks: `POST /v1/tasks` and the task as every route returns it.

use cairn_core::Task;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/tasks`. Limits are given as a user would type them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub image: Option<String>,
    pub name: Option<String>,
    pub memory: Option<String>,
    pub cpus: Option<String>,
    pub pids: Option<String>,
    pub disk: Option<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub workdir: Option<String>,
    /// Retention: keep the newest K snapshots.
    pub keep_last: Option<u32>,
    /// Retention: keep every milestone.
    pub keep_milestones: Option<bool>,
    /// Retention: expire other snapshots after this long (`never` to keep).
    pub expire_after: Option<String>,
    /// High-risk command patterns of this task (regular expressions).
    #[serde(default)]
    pub risky: Vec<String>,
    /// Services: commands started whenever the sandbox starts.
    #[serde(default)]
    pub services: Vec<String>,
    /// Suspend after this long without activity (e.g. `5m`).
    pub idle_suspend: Option<String>,
    /// Egress allow rules (`HOST[:PORT]`, `*.example.com`). Without allow
    /// or deny rules the task gets the daemon's default policy.
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Request rules, `HOST=METHODS PATH_PREFIX` (`api.example.com=GET,POST
    /// /repos/acme/`): the host takes only what they allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Injections, `HOST=HEADER: VALUE` with `{{secret:NAME}}` in VALUE, or
    /// `HOST=$NAME` (the agent's placeholder, replaced on the way out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inject: Vec<String>,
    /// The isolation driver: `native` or `gvisor` (default: the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Whether suspends keep processes and memory (gvisor only; default:
    /// yes for gvisor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_memory: Option<bool>,
    /// Labels to find and list the task by (E2B's sandbox metadata).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// End the task this long after it is created (e.g. `5m`): destroyed,
    /// or suspended with `suspend_at_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_at_timeout: Option<bool>,
}

/// Limits as a user reads them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LimitsView {
    pub memory: String,
    pub cpus: String,
    pub pids: u32,
    pub disk: String,
}

/// A task as the API returns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskView {
    #[serde(flatten)]
    pub task: Task,
    pub limits: LimitsView,
    /// Host pid of the sandbox's init, while it runs.
    pub sandbox_pid: Option<i32>,
    /// First host uid of the sandbox's id range, while it runs.
    pub sandbox_uid_base: Option<u32>,
    /// The task's pending wait: what it waits for, since when (and for a
    /// timer, until when). Only in the answers about one task (show,
    /// suspend, resume), where it is absent when nothing is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_wait: Option<crate::waits::WaitView>,
}
