use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The durable lifecycle state of a task (see the state diagram in the
/// design brief). Later stages add suspend, wake and delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
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
        self.apply(Transition::Start)
    }

    pub fn check_exec(self) -> Result<(), Error> {
        match self {
            TaskState::Running => Ok(()),
            from => Err(Error::Transition { from, action: "run commands" }),
        }
    }

    pub fn suspend(self) -> Result<TaskState, Error> {
        self.apply(Transition::Suspend)
    }

    pub fn suspended(self) -> Result<TaskState, Error> {
        self.apply(Transition::Suspended)
    }

    pub fn wake(self) -> Result<TaskState, Error> {
        self.apply(Transition::Wake)
    }

    pub fn woke(self) -> Result<TaskState, Error> {
        self.apply(Transition::Woke)
    }

    pub fn complete(self) -> Result<TaskState, Error> {
        self.apply(Transition::Complete)
    }

    pub fn destroy(self) -> Result<TaskState, Error> {
        self.apply(Transition::Destroy)
    }

    /// The state after `t`, or why `t` is not possible from here. This is
    /// the whole table: the store writes no state that does not come from
    /// it (and writes it only if the task is still in `self`).
    pub fn apply(self, t: Transition) -> Result<TaskState, Error> {
        use TaskState as S;
        use Transition as T;
        let to = match (t, self) {
            (T::Start, S::Created) => S::Running,
            (T::Suspend, S::Running) => S::Suspending,
            (T::Suspended, S::Suspending) => S::Suspended,
            // The wait was satisfied while the suspend ran.
            (T::SuspendedIntoWake, S::Suspending) => S::Waking,
            // The suspend's snapshot failed, or a restart found the sandbox
            // of a suspend cut short still running: nothing was torn down.
            (T::CancelSuspend, S::Suspending) => S::Running,
            (T::Wake, S::Suspended) => S::Waking,
            (T::Woke, S::Waking) => S::Running,
            // The restore failed; the snapshot is intact for a later wake.
            (T::WakeFailed, S::Waking) => S::Suspended,
            // A lost sandbox rebuilt from the task's head snapshot.
            (T::Recover, S::Running | S::Suspending) => S::Running,
            (T::Complete, S::Running | S::Suspended | S::Created) => S::Completed,
            (T::Fail, S::Created | S::Running | S::Suspending | S::Waking) => S::Failed,
            (T::Destroy, from) if from != S::Destroyed => S::Destroyed,
            (t, from) => return Err(Error::Transition { from, action: t.action() }),
        };
        Ok(to)
    }
}

/// Everything that changes a task's state (see [`TaskState::apply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transition {
    Start,
    Suspend,
    Suspended,
    SuspendedIntoWake,
    CancelSuspend,
    Wake,
    Woke,
    WakeFailed,
    Recover,
    Complete,
    Fail,
    Destroy,
}

impl Transition {
    pub const ALL: [Transition; 12] = [
        Transition::Start,
        Transition::Suspend,
        Transition::Suspended,
        Transition::SuspendedIntoWake,
        Transition::CancelSuspend,
        Transition::Wake,
        Transition::Woke,
        Transition::WakeFailed,
        Transition::Recover,
        Transition::Complete,
        Transition::Fail,
        Transition::Destroy,
    ];

    /// What it does, for "task T is S; it cannot ..." messages.
    pub fn action(self) -> &'static str {
        match self {
            Transition::Start => "start",
            Transition::Suspend => "suspend",
            Transition::Suspended => "finish suspending",
            Transition::SuspendedIntoWake => "wake while suspending",
            Transition::CancelSuspend => "cancel a suspend",
            Transition::Wake => "wake",
            Transition::Woke => "finish waking",
            Transition::WakeFailed => "fail a wake",
            Transition::Recover => "be recovered",
            Transition::Complete => "complete",
            Transition::Fail => "fail",
            Transition::Destroy => "be destroyed again",
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
    fn the_transition_table_is_exactly_this() {
        use TaskState as S;
        use Transition as T;
        let allowed: &[(T, S, S)] = &[
            (T::Start, S::Created, S::Running),
            (T::Suspend, S::Running, S::Suspending),
            (T::Suspended, S::Suspending, S::Suspended),
            (T::SuspendedIntoWake, S::Suspending, S::Waking),
            (T::CancelSuspend, S::Suspending, S::Running),
            (T::Wake, S::Suspended, S::Waking),
            (T::Woke, S::Waking, S::Running),
            (T::WakeFailed, S::Waking, S::Suspended),
            (T::Recover, S::Running, S::Running),
            (T::Recover, S::Suspending, S::Running),
            (T::Complete, S::Created, S::Completed),
            (T::Complete, S::Running, S::Completed),
            (T::Complete, S::Suspended, S::Completed),
            (T::Fail, S::Created, S::Failed),
            (T::Fail, S::Running, S::Failed),
            (T::Fail, S::Suspending, S::Failed),
            (T::Fail, S::Waking, S::Failed),
        ];
        for t in T::ALL {
            for from in S::ALL {
                let want = allowed.iter().find(|(at, af, _)| *at == t && *af == from).map(|(_, _, to)| *to);
                let want = match t {
                    T::Destroy if from != S::Destroyed => Some(S::Destroyed),
                    _ => want,
                };
                match (from.apply(t), want) {
                    (Ok(to), Some(w)) => assert_eq!(to, w, "{t:?} from {from}"),
                    (Err(Error::Transition { from: f, action }), None) => assert_eq!((f, action), (from, t.action()), "{t:?} from {from}"),
                    (got, want) => panic!("{t:?} from {from}: {got:?}, want {want:?}"),
                }
            }
        }
    }

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
