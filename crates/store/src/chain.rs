//! The event log's hash chain, worked out once for both backends: a new
//! entry's sequence number and hash follow from its task's head (the last
//! entry) and the entry itself. A backend reads each head once, chains any
//! number of entries onto it in memory, and writes them in few statements
//! (each statement is a round trip to the database's worker, which an
//! intercepted host that logs every request pays per entry otherwise).

use cairn_core::{Event, NewEvent};
use sqlx::{Database, Encode, QueryBuilder, Type};

/// At most this many entries in one `INSERT` (10 parameters each; SQLite
/// takes 32,766 parameters, PostgreSQL 65,535).
pub(crate) const ROWS_PER_INSERT: usize = 200;

/// Where a task's log ends: the next entry follows it.
#[derive(Debug)]
pub(crate) struct Head {
    seq: u64,
    hash: String,
}

/// One entry ready to be written.
#[derive(Debug)]
pub(crate) struct Row {
    task: String,
    seq: u64,
    time_ms: i64,
    kind: &'static str,
    actor: String,
    args_text: String,
    exit_code: Option<i32>,
    duration_ms: Option<i64>,
    prev_hash: String,
    hash: String,
}

impl Head {
    /// The head from a task's last entry (seq and hash), or the genesis of
    /// an empty log.
    pub(crate) fn from_last(task: &str, last: Option<(i64, Option<String>)>) -> Head {
        match last {
            None => Head { seq: 0, hash: cairn_ledger::GENESIS.to_owned() },
            Some((seq, hash)) => Head {
                seq: seq as u64,
                hash: hash.unwrap_or_else(|| {
                    // Only a database edited behind the daemon's back has a
                    // hashless head; the log stays writable and `cairn log
                    // --verify` names it.
                    tracing::warn!(task, seq, "the event log's last entry has no hash");
                    String::new()
                }),
            },
        }
    }

    /// Chains `ev` onto the head, which moves to it.
    pub(crate) fn next(&mut self, ev: &NewEvent, time_ms: i64) -> Row {
        let seq = self.seq + 1;
        // Hash what a reader will get back: the args as parsed from their text.
        let args_text = ev.args.to_string();
        let args = serde_json::from_str(&args_text).unwrap_or_else(|_| ev.args.clone());
        let entry = Event {
            seq,
            task: ev.task.clone(),
            time_ms,
            kind: ev.kind,
            actor: ev.actor.clone(),
            args,
            exit_code: ev.exit_code,
            duration_ms: ev.duration_ms,
            prev_hash: None,
            hash: None,
        };
        let hash = cairn_ledger::entry_hash(&self.hash, &entry);
        let prev_hash = std::mem::replace(&mut self.hash, hash.clone());
        self.seq = seq;
        Row {
            task: ev.task.to_string(),
            seq,
            time_ms,
            kind: ev.kind.as_str(),
            actor: ev.actor.clone(),
            args_text,
            exit_code: ev.exit_code,
            duration_ms: ev.duration_ms.map(|d| d as i64),
            prev_hash,
            hash,
        }
    }
}

/// What a backend does for [`append`]: read a task's head, write rows.
pub(crate) trait EventRows {
    async fn head(&mut self, task: &str) -> sqlx::Result<Head>;
    /// At most [`ROWS_PER_INSERT`] rows, in one statement.
    async fn insert(&mut self, rows: &[Row]) -> sqlx::Result<()>;
}

/// Appends one event to its task's log; returns its seq.
pub(crate) async fn append_one(conn: &mut impl EventRows, ev: &NewEvent) -> sqlx::Result<u64> {
    let row = conn.head(ev.task.as_str()).await?.next(ev, crate::now_ms());
    conn.insert(std::slice::from_ref(&row)).await?;
    Ok(row.seq)
}

/// Appends `events` (of one or more tasks, each task's in order): each
/// task's head read once, the entries written [`ROWS_PER_INSERT`] to a
/// statement.
pub(crate) async fn append(conn: &mut impl EventRows, events: &[NewEvent]) -> sqlx::Result<()> {
    use std::collections::hash_map::{Entry, HashMap};
    let mut heads: HashMap<&str, Head> = HashMap::new();
    let mut rows = Vec::with_capacity(events.len());
    for ev in events {
        let task = ev.task.as_str();
        let head = match heads.entry(task) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(conn.head(task).await?),
        };
        rows.push(head.next(ev, crate::now_ms()));
    }
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        conn.insert(chunk).await?;
    }
    Ok(())
}

/// The tasks of `events`, each once, in the order they first appear.
pub(crate) fn distinct_tasks(events: &[NewEvent]) -> Vec<&cairn_core::TaskId> {
    let mut tasks: Vec<&cairn_core::TaskId> = Vec::new();
    for ev in events {
        if !tasks.contains(&&ev.task) {
            tasks.push(&ev.task);
        }
    }
    tasks
}

/// One `INSERT` of `rows` (at most [`ROWS_PER_INSERT`]) into `events`,
/// with the backend's placeholders.
pub(crate) fn insert<'a, DB>(rows: &'a [Row]) -> QueryBuilder<'a, DB>
where
    DB: Database,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    Option<i32>: Encode<'a, DB> + Type<DB>,
    Option<i64>: Encode<'a, DB> + Type<DB>,
{
    let mut q = QueryBuilder::new("INSERT INTO events (task_id, seq, time_ms, kind, actor, args, exit_code, duration_ms, prev_hash, hash) ");
    q.push_values(rows, |mut b, r| {
        b.push_bind(r.task.as_str())
            .push_bind(r.seq as i64)
            .push_bind(r.time_ms)
            .push_bind(r.kind)
            .push_bind(r.actor.as_str())
            .push_bind(r.args_text.as_str())
            .push_bind(r.exit_code)
            .push_bind(r.duration_ms)
            .push_bind(r.prev_hash.as_str())
            .push_bind(r.hash.as_str());
    });
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::{EventKind, TaskId};

    fn ev(task: &TaskId, n: i32) -> NewEvent {
        NewEvent { task: task.clone(), kind: EventKind::Exec, actor: "test".into(), args: serde_json::json!({ "n": n }), exit_code: Some(n), duration_ms: Some(1) }
    }

    #[test]
    fn entries_chain_from_genesis_and_from_a_head() {
        let t = TaskId::random();
        let mut head = Head::from_last(t.as_str(), None);
        let a = head.next(&ev(&t, 1), 10);
        let b = head.next(&ev(&t, 2), 11);
        assert_eq!((a.seq, a.prev_hash.as_str()), (1, cairn_ledger::GENESIS));
        assert_eq!((b.seq, &b.prev_hash), (2, &a.hash));
        // Chained later from the stored head, the same entry gets the same hash.
        let mut later = Head::from_last(t.as_str(), Some((1, Some(a.hash.clone()))));
        let again = later.next(&ev(&t, 2), 11);
        assert_eq!((again.seq, &again.hash), (2, &b.hash));
        let mut broken = Head::from_last(t.as_str(), Some((7, None)));
        assert_eq!(broken.next(&ev(&t, 3), 12).prev_hash, "");
    }
}
