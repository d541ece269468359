//! Snapshots as the domain sees them: ids, kinds, the record of one
//! snapshot, rollback notes, retention and high-risk command policies.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::id::{has_id_shape, random_id};
use crate::{Error, TaskConfig, TaskId};

const RANDOM_LEN: usize = 9;

/// A snapshot id: `s` and 9 characters of the task-id alphabet, e.g.
/// `s4k8mzq2ab`. Short to type, never reused (the store's key), and stable:
/// a snapshot keeps its id for life.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotId(String);

impl SnapshotId {
    pub fn random() -> Self {
        SnapshotId(random_id('s', RANDOM_LEN))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn looks_like(s: &str) -> bool {
        has_id_shape(s, 's', RANDOM_LEN)
    }
}

impl FromStr for SnapshotId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if Self::looks_like(s) {
            Ok(SnapshotId(s.to_owned()))
        } else {
            Err(Error::SnapshotId(s.to_owned()))
        }
    }
}

impl TryFrom<String> for SnapshotId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<SnapshotId> for String {
    fn from(id: SnapshotId) -> String {
        id.0
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a snapshot was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotKind {
    /// A milestone landed (environment ready, tests green).
    Milestone,
    /// Taken automatically before a high-risk command.
    PreRisk,
    /// The first snapshot of a fork.
    Branch,
    /// Taken when a task suspends.
    Suspend,
    /// Asked for without a more specific reason.
    Manual,
}

impl SnapshotKind {
    pub const ALL: [SnapshotKind; 5] =
        [SnapshotKind::Milestone, SnapshotKind::PreRisk, SnapshotKind::Branch, SnapshotKind::Suspend, SnapshotKind::Manual];

    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Milestone => "milestone",
            SnapshotKind::PreRisk => "pre-risk",
            SnapshotKind::Branch => "branch",
            SnapshotKind::Suspend => "suspend",
            SnapshotKind::Manual => "manual",
        }
    }
}

impl FromStr for SnapshotKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| Error::SnapshotKind(s.to_owned()))
    }
}

impl fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The durable record of one snapshot. The data (the writable layer) is the
/// manifest named by `manifest` in the blob store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Snapshot {
    pub id: SnapshotId,
    pub task: TaskId,
    /// The snapshot this one was taken after; for a fork's first snapshot,
    /// the source task's snapshot.
    pub parent: Option<SnapshotId>,
    pub kind: SnapshotKind,
    pub note: String,
    pub healthy: bool,
    pub step: u64,
    /// The agent's memory summary at the time (text).
    pub memory: String,
    /// The snapshot holds a checkpoint of the sandbox's processes and
    /// memory (gvisor): a rollback to it or a fork from it continues them.
    #[serde(default)]
    pub with_memory: bool,
    pub config: TaskConfig,
    /// Hex id of the manifest in the blob store.
    pub manifest: String,
    pub files: u64,
    /// Logical bytes of the files in the writable layer.
    pub bytes: u64,
    /// Bytes this snapshot added to the blob store (after dedup, compressed).
    pub added_bytes: u64,
    /// How long the sandbox was frozen for a consistent capture.
    pub freeze_ms: f64,
    pub duration_ms: f64,
    pub created_ms: i64,
}

/// The layer of a snapshot's manifest that holds a checkpoint of the
/// sandbox's processes and memory (`checkpoint.img` of gVisor's runsc), on
/// the task's disk beside the writable layers: stored, chunked and
/// deduplicated with them, never mounted in the sandbox.
pub const MEMORY_LAYER: &str = "memory";

/// Where the memory layer says it is in the sandbox: a path no sandbox
/// sees (diffs and patches leave the layer out).
pub const MEMORY_LAYER_AT: &str = "/.cairn-memory";

/// What the agent is told after a rollback: from where, to where, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RollbackNote {
    /// The latest snapshot before the rollback, if there was one.
    pub from: Option<SnapshotId>,
    pub to: SnapshotId,
    /// The step the task was at when it rolled back.
    pub from_step: u64,
    pub reason: String,
    pub time_ms: i64,
    /// Which snapshot was chosen and why: named by the caller, or the
    /// newest healthy one, with its kind, step and note. (Absent from notes
    /// written before it was kept.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<String>,
}

/// Which snapshots of a task to keep. Expired snapshots lose their record;
/// their data goes at the next `cairn gc`. The latest snapshot and the
/// latest healthy one are always kept, whatever the policy says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct Retention {
    /// Keep the newest `keep_last` snapshots (0: no such rule).
    pub keep_last: u32,
    /// Keep every milestone regardless of age or count.
    pub keep_milestones: bool,
    /// Snapshots outside the rules above expire this long after they were
    /// taken (`None`: never).
    #[serde(with = "opt_duration_ms")]
    #[schema(value_type = Option<u64>, default = default_expire_after_ms)]
    pub expire_after: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { keep_last: 20, keep_milestones: true, expire_after: Some(Duration::from_secs(7 * 24 * 3600)) }
    }
}

/// The default `expire_after` as the wire has it (milliseconds), for the
/// schema: its derive would write the `Duration` itself.
fn default_expire_after_ms() -> Option<u64> {
    Retention::default().expire_after.map(|d| d.as_millis() as u64)
}

impl Retention {
    /// Which of `snapshots` (oldest first) expire at `now_ms`.
    pub fn expired<'a>(&self, snapshots: &'a [Snapshot], now_ms: i64) -> Vec<&'a Snapshot> {
        let n = snapshots.len();
        let latest_healthy = snapshots.iter().rposition(|s| s.healthy);
        snapshots
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                let newest_k = self.keep_last > 0 && *i + (self.keep_last as usize) >= n;
                let protected = *i + 1 == n || Some(*i) == latest_healthy;
                let milestone = self.keep_milestones && s.kind == SnapshotKind::Milestone;
                let old = match self.expire_after {
                    Some(d) => now_ms.saturating_sub(s.created_ms) > d.as_millis() as i64,
                    // Without an age rule, `keep_last` alone decides.
                    None => self.keep_last > 0,
                };
                !(newest_k || protected || milestone) && old
            })
            .map(|(_, s)| s)
            .collect()
    }
}

mod opt_duration_ms {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(kind: SnapshotKind, healthy: bool, created_ms: i64) -> Snapshot {
        Snapshot {
            id: SnapshotId::random(),
            task: TaskId::random(),
            parent: None,
            kind,
            note: String::new(),
            healthy,
            step: 0,
            memory: String::new(),
            with_memory: false,
            config: TaskConfig::default(),
            manifest: String::new(),
            files: 0,
            bytes: 0,
            added_bytes: 0,
            freeze_ms: 0.0,
            duration_ms: 0.0,
            created_ms,
        }
    }

    #[test]
    fn ids_and_kinds() {
        let id = SnapshotId::random();
        assert_eq!(id.as_str().parse::<SnapshotId>().unwrap(), id);
        assert!("s0".parse::<SnapshotId>().is_err() && "t123".parse::<SnapshotId>().is_err());
        for k in SnapshotKind::ALL {
            assert_eq!(k.as_str().parse::<SnapshotKind>().unwrap(), k);
        }
        assert!("prerisk".parse::<SnapshotKind>().is_err());
    }

    #[test]
    fn ids_and_kinds_are_their_text_everywhere() {
        let id: SnapshotId = "s4k8mzq2ab".parse().unwrap();
        assert_eq!((id.to_string(), String::from(id.clone())), ("s4k8mzq2ab".to_owned(), "s4k8mzq2ab".to_owned()));
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"s4k8mzq2ab\"");
        let names = ["milestone", "pre-risk", "branch", "suspend", "manual"];
        for (k, name) in SnapshotKind::ALL.into_iter().zip(names) {
            assert_eq!((k.as_str(), k.to_string()), (name, name.to_owned()));
            assert_eq!(serde_json::to_value(k).unwrap(), serde_json::json!(name));
        }
    }

    /// Indexes of the snapshots `r` expires at `now`.
    fn expired_at(r: &Retention, snaps: &[Snapshot], now: i64) -> Vec<usize> {
        r.expired(snaps, now).iter().map(|s| snaps.iter().position(|x| x.id == s.id).unwrap()).collect()
    }

    #[test]
    fn retention_keeps_exactly_the_newest_k() {
        let snaps: Vec<Snapshot> = (0..5).map(|_| snap(SnapshotKind::Manual, false, 0)).collect();
        let hour = Duration::from_secs(3600);
        let r = |keep_last| Retention { keep_last, keep_milestones: false, expire_after: Some(hour) };
        assert_eq!(expired_at(&r(3), &snaps, 2 * 3_600_000), [0, 1]);
        assert_eq!(expired_at(&r(1), &snaps, 2 * 3_600_000), [0, 1, 2, 3]);
        assert_eq!(expired_at(&r(5), &snaps, 2 * 3_600_000), Vec::<usize>::new());
        // No count rule: the latest snapshot is still kept.
        assert_eq!(expired_at(&r(0), &snaps, 2 * 3_600_000), [0, 1, 2, 3]);
    }

    #[test]
    fn retention_expires_a_snapshot_only_once_it_is_older_than_the_age() {
        let snaps = vec![snap(SnapshotKind::Manual, false, 1_000), snap(SnapshotKind::Manual, false, 1_000)];
        let r = Retention { keep_last: 0, keep_milestones: false, expire_after: Some(Duration::from_millis(500)) };
        assert_eq!(expired_at(&r, &snaps, 1_499), Vec::<usize>::new());
        assert_eq!(expired_at(&r, &snaps, 1_500), Vec::<usize>::new(), "exactly the age is not older");
        assert_eq!(expired_at(&r, &snaps, 1_501), [0]);
    }

    #[test]
    fn retention_reads_and_writes_the_age_in_milliseconds() {
        let r: Retention = serde_json::from_str(r#"{"keep_last": 3, "expire_after": 90000}"#).unwrap();
        assert_eq!(r, Retention { keep_last: 3, keep_milestones: true, expire_after: Some(Duration::from_secs(90)) });
        let never: Retention = serde_json::from_str(r#"{"expire_after": null}"#).unwrap();
        assert_eq!(never.expire_after, None);
        assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::json!({"keep_last": 3, "keep_milestones": true, "expire_after": 90000}));
        assert_eq!(serde_json::from_str::<Retention>("{}").unwrap(), Retention::default());
    }

    #[test]
    fn retention_keeps_latest_newest_k_milestones_and_latest_healthy() {
        let day = 24 * 3600 * 1000;
        let snaps = vec![
            snap(SnapshotKind::Milestone, true, 0),
            snap(SnapshotKind::Manual, true, 0),
            snap(SnapshotKind::Manual, true, 0), // latest healthy
            snap(SnapshotKind::PreRisk, false, 0),
            snap(SnapshotKind::Manual, false, 10 * day),
            snap(SnapshotKind::Manual, false, 10 * day),
        ];
        let r = Retention { keep_last: 2, keep_milestones: true, expire_after: Some(Duration::from_secs(3600)) };
        let gone: Vec<usize> = r.expired(&snaps, 10 * day).iter().map(|s| snaps.iter().position(|x| x.id == s.id).unwrap()).collect();
        assert_eq!(gone, [1, 3]);
        let young = r.expired(&snaps, 1000);
        assert!(young.is_empty(), "nothing is old enough yet");
        let no_age = Retention { keep_last: 1, keep_milestones: false, expire_after: None };
        let gone: Vec<usize> = no_age.expired(&snaps, 0).iter().map(|s| snaps.iter().position(|x| x.id == s.id).unwrap()).collect();
        assert_eq!(gone, [0, 1, 3, 4]);
        let keep_all = Retention { keep_last: 0, keep_milestones: false, expire_after: None };
        assert!(keep_all.expired(&snaps, i64::MAX).is_empty());
    }
}
