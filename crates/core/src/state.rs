use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The durable lifecycle state of a task (see the state diagram in the
/// design brief). Later stages add suspend, wake and delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Created,
    Running,
    Suspending,
    Suspended,
    Waking,
    Completed,
    Failed,
    Destroyed,
}

impl TaskState {
    pub const ALL: [TaskState; 8] = [
        TaskState::Created,
        TaskState::Running,
        TaskState::Suspending,
        TaskState::Suspended,
        TaskState::Waking,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Destroyed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Created => "created",
            TaskState::Running => "running",
            TaskState::Suspending => "suspending",
            TaskState::Suspended => "suspended",
            TaskState::Waking => "waking",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Destroyed => "destroyed",
        }
    }

    /// A task in a terminal state never runs again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Destroyed)
    }

    /// `created -> running`: the first sandbox starts.
    pub fn start(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Created => Ok(TaskState::Running),
            from => Err(Error::Transition { from, action: "start" }),
        }
    }

    /// Commands run only in a running task.
    pub fn check_exec(self) -> Result<(), Error> {
        match self {
            TaskState::Running => Ok(()),
            from => Err(Error::Transition { from, action: "run commands" }),
        }
    }

    /// `running -> suspending`: a wait, `cairn suspend` or idle time.
    pub fn suspend(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Running => Ok(TaskState::Suspending),
            from => Err(Error::Transition { from, action: "suspend" }),
        }
    }

    /// `suspending -> suspended`: the suspend snapshot is stored and the
    /// sandbox is gone.
    pub fn suspended(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Suspending => Ok(TaskState::Suspended),
            from => Err(Error::Transition { from, action: "finish suspending" }),
        }
    }

    /// `suspended -> waking`: an event, `cairn resume`, or an exec.
    pub fn wake(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Suspended => Ok(TaskState::Waking),
            from => Err(Error::Transition { from, action: "wake" }),
        }
    }

    /// `waking -> running`: the fresh sandbox is ready.
    pub fn woke(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Waking => Ok(TaskState::Running),
            from => Err(Error::Transition { from, action: "finish waking" }),
        }
    }

    /// `running | suspended | created -> completed`: the task's work was
    /// delivered; its sandbox goes, its records and deliverables stay.
    pub fn complete(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Running | TaskState::Suspended | TaskState::Created => Ok(TaskState::Completed),
            from => Err(Error::Transition { from, action: "complete" }),
        }
    }

    /// `any -> destroyed`, except from destroyed itself.
    pub fn destroy(self) -> Result<TaskState, Error> {
        match self {
            TaskState::Destroyed => Err(Error::Transition { from: self, action: "be destroyed again" }),
            _ => Ok(TaskState::Destroyed),
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        TaskState::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| format!("unknown task state {s:?}"))
    }
}

/// Whether a task's ephemeral compute currently exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// No sandbox: not started yet, or torn down.
    None,
    /// The sandbox's init is alive and serving commands.
    Ready,
    /// The daemon found the sandbox gone (host reboot, killed init). Its
    /// durable records remain; recovery from snapshots restores it.
    Lost,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::None => "none",
            SandboxState::Ready => "ready",
            SandboxState::Lost => "lost",
        }
    }
}

impl FromStr for SandboxState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(SandboxState::None),
            "ready" => Ok(SandboxState::Ready),
            "lost" => Ok(SandboxState::Lost),
            _ => Err(format!("unknown sandbox state {s:?}")),
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_as_text() {
        for st in TaskState::ALL {
            assert_eq!(st.as_str().parse::<TaskState>(), Ok(st));
        }
        assert!("exploded".parse::<TaskState>().is_err());
    }

    #[test]
    fn terminal_states_are_completed_and_destroyed() {
        let terminal: Vec<TaskState> = TaskState::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [TaskState::Completed, TaskState::Destroyed]);
    }

    #[test]
    fn states_display_as_their_names() {
        let names = ["created", "running", "suspending", "suspended", "waking", "completed", "failed", "destroyed"];
        for (st, name) in TaskState::ALL.into_iter().zip(names) {
            assert_eq!((st.as_str(), st.to_string()), (name, name.to_owned()));
        }
        for (st, name) in [(SandboxState::None, "none"), (SandboxState::Ready, "ready"), (SandboxState::Lost, "lost")] {
            assert_eq!((st.as_str(), st.to_string()), (name, name.to_owned()));
            assert_eq!(name.parse::<SandboxState>(), Ok(st));
            assert_eq!(serde_json::to_value(st).unwrap(), serde_json::json!(name));
        }
        assert_eq!("Ready".parse::<SandboxState>(), Err("unknown sandbox state \"Ready\"".to_owned()));
    }

    #[test]
    fn transitions() {
        assert_eq!(TaskState::Created.start(), Ok(TaskState::Running));
        assert!(TaskState::Running.start().is_err());
        assert!(TaskState::Running.check_exec().is_ok());
        assert!(TaskState::Destroyed.check_exec().is_err());
        assert!(TaskState::Destroyed.destroy().is_err());
        assert_eq!(TaskState::Running.destroy(), Ok(TaskState::Destroyed));
        let cycle = TaskState::Running.suspend().and_then(TaskState::suspended).and_then(TaskState::wake).and_then(TaskState::woke);
        assert_eq!(cycle, Ok(TaskState::Running));
        assert!(TaskState::Suspended.suspend().is_err() && TaskState::Running.wake().is_err());
        assert!(TaskState::Created.suspend().is_err() && TaskState::Suspending.woke().is_err());
    }
}
