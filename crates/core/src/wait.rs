//! Waits and the events that satisfy them.
//!
//! A wait is a durable record that a task is blocked on an approval, a named
//! webhook or a timer. Events land in the task's inbox first; an event
//! satisfies the task's pending wait when it matches, or stays in the inbox
//! for the next matching wait.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::id::{has_id_shape, random_id};
use crate::{Error, TaskId};

const RANDOM_LEN: usize = 11;

macro_rules! prefixed_id {
    ($name:ident, $prefix:literal, $what:literal) => {
        #[doc = concat!("A ", $what, " id: `", $prefix, "` and 11 random characters.")]
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn random() -> Self {
                $name(random_id($prefix, RANDOM_LEN))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
            pub fn looks_like(s: &str) -> bool {
                has_id_shape(s, $prefix, RANDOM_LEN)
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                if Self::looks_like(s) {
                    Ok($name(s.to_owned()))
                } else {
                    Err(Error::Id($what, s.to_owned()))
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(s: String) -> Result<Self, Error> {
                s.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(WaitId, 'w', "wait");
prefixed_id!(InboxId, 'e', "event");

/// What a wait waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum WaitFor {
    /// A person approves or rejects; `prompt` tells them what.
    Approval { prompt: String },
    /// An event of this name: a signed webhook to the task's URL for it, or
    /// `cairn event --name`.
    Webhook { name: String },
    /// A point in time.
    Timer { fire_at_ms: i64 },
}

impl WaitFor {
    pub fn kind(&self) -> &'static str {
        match self {
            WaitFor::Approval { .. } => "approval",
            WaitFor::Webhook { .. } => "webhook",
            WaitFor::Timer { .. } => "timer",
        }
    }
}

/// Where an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventSource {
    /// A signed webhook.
    Webhook,
    /// `cairn event` (an authenticated operator).
    Operator,
    /// The approval page, `cairn approve` or the API.
    Approval,
    /// A timer that fired.
    Timer,
}

impl EventSource {
    pub fn as_str(self) -> &'static str {
        match self {
            EventSource::Webhook => "webhook",
            EventSource::Operator => "operator",
            EventSource::Approval => "approval",
            EventSource::Timer => "timer",
        }
    }
}

impl FromStr for EventSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [EventSource::Webhook, EventSource::Operator, EventSource::Approval, EventSource::Timer]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown event source {s:?}"))
    }
}

/// A durable wait.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Wait {
    pub id: WaitId,
    pub task: TaskId,
    #[serde(flatten)]
    pub what: WaitFor,
    pub created_ms: i64,
    /// Set once it ended: an event satisfied it, or it was cancelled.
    pub satisfied_ms: Option<i64>,
    pub event: Option<InboxId>,
    /// Set when it was cancelled (no event satisfied it).
    #[serde(default)]
    pub cancelled_ms: Option<i64>,
}

/// An event in a task's inbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InboxEvent {
    pub id: InboxId,
    pub task: TaskId,
    pub source: EventSource,
    /// The webhook or event name; `approval` for approvals; the wait id for
    /// timers.
    pub name: String,
    /// The sender's delivery id (`webhook-id`): a retry of the same delivery
    /// takes effect once.
    pub delivery: Option<String>,
    pub data: serde_json::Value,
    pub received_ms: i64,
    /// The wait it satisfied, once it did.
    pub wait: Option<WaitId>,
}

impl InboxEvent {
    /// True when this event satisfies `wait`.
    pub fn matches(&self, wait: &Wait) -> bool {
        match &wait.what {
            WaitFor::Approval { .. } => self.source == EventSource::Approval,
            WaitFor::Webhook { name } => {
                matches!(self.source, EventSource::Webhook | EventSource::Operator) && self.name == *name
            }
            WaitFor::Timer { .. } => self.source == EventSource::Timer && self.name == wait.id.as_str(),
        }
    }
}

/// Checks a webhook or event name: what goes into the webhook URL.
pub fn check_event_name(s: &str) -> Result<(), Error> {
    let ok = !s.is_empty() && s.len() <= 63 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::EventName(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(source: EventSource, name: &str) -> InboxEvent {
        InboxEvent {
            id: InboxId::random(),
            task: TaskId::random(),
            source,
            name: name.into(),
            delivery: None,
            data: serde_json::Value::Null,
            received_ms: 0,
            wait: None,
        }
    }

    fn wait(what: WaitFor) -> Wait {
        Wait { id: WaitId::random(), task: TaskId::random(), what, created_ms: 0, satisfied_ms: None, event: None, cancelled_ms: None }
    }

    #[test]
    fn events_match_the_waits_they_are_for() {
        let hook = wait(WaitFor::Webhook { name: "build-done".into() });
        assert!(event(EventSource::Webhook, "build-done").matches(&hook));
        assert!(event(EventSource::Operator, "build-done").matches(&hook));
        assert!(!event(EventSource::Webhook, "other").matches(&hook));
        assert!(!event(EventSource::Approval, "build-done").matches(&hook));
        let approval = wait(WaitFor::Approval { prompt: "ship?".into() });
        assert!(event(EventSource::Approval, "approval").matches(&approval));
        assert!(!event(EventSource::Webhook, "approval").matches(&approval));
        let timer = wait(WaitFor::Timer { fire_at_ms: 5 });
        assert!(event(EventSource::Timer, timer.id.as_str()).matches(&timer));
        assert!(!event(EventSource::Timer, WaitId::random().as_str()).matches(&timer));
    }

    #[test]
    fn kinds_and_sources_have_one_name_in_text_and_json() {
        for (what, kind) in [
            (WaitFor::Approval { prompt: "ship?".into() }, "approval"),
            (WaitFor::Webhook { name: "build-done".into() }, "webhook"),
            (WaitFor::Timer { fire_at_ms: 5 }, "timer"),
        ] {
            assert_eq!(what.kind(), kind);
            assert_eq!(serde_json::to_value(&what).unwrap()["kind"], kind, "the JSON tag is the kind");
        }
        let sources = [(EventSource::Webhook, "webhook"), (EventSource::Operator, "operator"), (EventSource::Approval, "approval"), (EventSource::Timer, "timer")];
        for (source, name) in sources {
            assert_eq!(source.as_str(), name);
            assert_eq!(name.parse::<EventSource>(), Ok(source));
            assert_eq!(serde_json::to_value(source).unwrap(), serde_json::json!(name));
        }
        assert_eq!("cron".parse::<EventSource>(), Err("unknown event source \"cron\"".to_owned()));
    }

    #[test]
    fn ids_and_names() {
        let w = WaitId::random();
        assert_eq!(w.as_str().parse::<WaitId>().unwrap(), w);
        assert!(w.as_str().parse::<InboxId>().is_err());
        assert!(check_event_name("build-done.v2").is_ok());
        for bad in ["", "a/b", "a b", "é", &"x".repeat(64)] {
            assert!(check_event_name(bad).is_err(), "{bad:?}");
        }
    }
}
