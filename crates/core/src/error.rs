use thiserror::Error;

/// Invalid domain input. Each variant names the value that was wrong.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid task id {0:?}: expected 't' followed by 11 lowercase letters or digits")]
    TaskId(String),
    #[error("invalid size {0:?}: expected a number with an optional unit, like 512M or 2G")]
    Size(String),
    /// A size given for a limit (`memory`, `disk`) that is not one.
    #[error("invalid {0} {1:?}: expected a number with an optional unit, like 512M or 2G")]
    LimitSize(&'static str, String),
    #[error("invalid duration {0:?}: expected a number with a unit, like 30s or 5m")]
    Duration(String),
    #[error("invalid cpu count {0:?}: expected a positive number like 1 or 0.5")]
    Cpus(String),
    #[error("invalid pid limit {0:?}: expected a whole number of at least 8")]
    Pids(String),
    #[error("{0} limit {1} is out of range ({2})")]
    LimitRange(&'static str, String, &'static str),
    #[error("invalid environment variable {0:?}: expected KEY=VALUE with KEY made of letters, digits and _")]
    EnvVar(String),
    #[error("invalid working directory {0:?}: expected an absolute path without '..'")]
    Workdir(String),
    #[error("invalid user {0:?}: expected a name or a uid (0-65535), optionally with :group or :gid")]
    User(String),
    #[error("invalid task name {0:?}: expected 1-63 letters, digits, '-' or '_'")]
    Name(String),
    #[error("invalid image name {0:?}: expected a name of lowercase letters, digits, '-', '_' or '.', or an image reference ([host[:port]/]path[:tag][@sha256:digest]), at most 255 characters")]
    ImageName(String),
    #[error("invalid snapshot id {0:?}: expected 's' followed by 9 lowercase letters or digits")]
    SnapshotId(String),
    #[error("invalid snapshot kind {0:?}: expected milestone, pre-risk, branch, suspend or manual")]
    SnapshotKind(String),
    #[error("invalid risk pattern `{0}`: {1}")]
    RiskPattern(String, String),
    #[error("invalid {0} id {1:?}")]
    Id(&'static str, String),
    #[error("invalid event name {0:?}: expected 1-63 letters, digits, '-', '_' or '.'")]
    EventName(String),
    #[error("invalid isolation {0:?}: expected native or gvisor")]
    Isolation(String),
    #[error("task is {from}; it cannot {action}")]
    Transition { from: crate::TaskState, action: &'static str },
}
