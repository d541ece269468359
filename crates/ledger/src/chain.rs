//! The hash chain over a task's event log.
//!
//! Every entry carries the hash of the one before it (`prev_hash`; the first
//! entry's is [`GENESIS`], 64 zeros) and its own `hash`, which covers its
//! content and that link:
//!
//! ```text
//! hash = hex(SHA-256( "cairn-ledger-v1" LF prev_hash LF canonical_json(entry) ))
//! ```
//!
//! byte by byte: the 15 ASCII bytes `cairn-ledger-v1`, one line feed (0x0a),
//! the previous entry's hash as 64 lowercase hex characters, one line feed,
//! then the entry as canonical JSON (UTF-8): an object with exactly the
//! eight keys `actor, args, duration_ms, exit_code, kind, seq, task,
//! time_ms` (`task` the task id, `seq` and `time_ms` integers, `kind` the
//! event kind's name, `exit_code` and `duration_ms` integers or `null`,
//! `args` the stored JSON value). Canonical JSON here is:
//!
//! - no whitespace outside strings;
//! - object keys sorted by their UTF-8 bytes, at every depth (inside `args`
//!   too);
//! - strings in double quotes, escaping only `"` as `\"`, `\` as `\\`, the
//!   control characters 0x08, 0x0c, 0x0a, 0x0d, 0x09 as `\b \f \n \r \t`
//!   and the other characters below 0x20 as `\u00xx` (lowercase hex); every
//!   other character is its own UTF-8 (no `\u` escapes for non-ASCII);
//! - integers in plain decimal; other numbers in the shortest form that
//!   reads back as the same double, as `serde_json` writes them (`12.5`,
//!   `3.0`, `1e-7`);
//! - `true`, `false`, `null` as themselves.
//!
//! This is what Python's `json.dumps(v, sort_keys=True, separators=(",",
//! ":"), ensure_ascii=False)` writes for everything but non-integer
//! numbers, which the daemon's own entries do not use for anything
//! security-relevant.
//!
//! [`verify_chain`] recomputes every hash and follows every link, and names
//! the first entry that was changed, removed or reordered. A log rewritten
//! consistently from some entry on (every later hash recomputed) is a valid
//! chain: only a signed checkpoint of an earlier head catches that
//! ([`check_against_checkpoint`]), as it catches a tail cut off after it.

use std::collections::HashSet;
use std::fmt;

use cairn_core::{Event, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;

/// The `prev_hash` of a log's first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Domain separation: the first line of every hashed entry.
const DOMAIN: &str = "cairn-ledger-v1";

/// The hash of entry `e` chained after `prev` (hex), per the module docs.
/// `e.prev_hash` and `e.hash` are not part of it.
pub fn entry_hash(prev: &str, e: &Event) -> String {
    hex::encode(Sha256::digest(entry_bytes(prev, e)))
}

/// The exact bytes [`entry_hash`] hashes.
pub fn entry_bytes(prev: &str, e: &Event) -> Vec<u8> {
    let body = serde_json::json!({
        "task": e.task.as_str(),
        "seq": e.seq,
        "time_ms": e.time_ms,
        "kind": e.kind.as_str(),
        "actor": e.actor,
        "args": e.args,
        "exit_code": e.exit_code,
        "duration_ms": e.duration_ms,
    });
    let mut out = String::with_capacity(128 + prev.len());
    out.push_str(DOMAIN);
    out.push('\n');
    out.push_str(prev);
    out.push('\n');
    write_canonical(&body, &mut out);
    out.into_bytes()
}

/// `v` as canonical JSON (see the module docs).
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorted here, whatever order the map keeps.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What happened to the first bad entry of a ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// Its content (or its stored hash) is not what was written.
    Changed,
    /// It is missing.
    Removed,
    /// It is there, at another position than the one it was written at.
    Reordered,
    /// The log up to here is a valid chain, but not the one a checkpoint
    /// signed: rewritten with recomputed hashes.
    Rewritten,
    /// A stored checkpoint does not verify (its signature, or its record).
    BadCheckpoint,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::Changed => "changed",
            ProblemKind::Removed => "removed",
            ProblemKind::Reordered => "reordered",
            ProblemKind::Rewritten => "rewritten",
            ProblemKind::BadCheckpoint => "bad_checkpoint",
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first problem in a log: the entry it concerns and one line that
/// names it (`entry 3 was changed (stored hash ..., computed ...)`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainProblem {
    pub seq: u64,
    pub what: ProblemKind,
    pub message: String,
}

impl fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The result of walking a task's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainReport {
    pub task: String,
    /// Entries in the log.
    pub entries: usize,
    /// The last entry's seq and stored hash.
    pub head: Option<(u64, String)>,
    /// The first problem found, if any.
    pub problem: Option<ChainProblem>,
    /// Every entry's seq and hash, in order (the stored hash; the
    /// recomputed one where none is stored).
    pub hashes: Vec<(u64, String)>,
}

impl ChainReport {
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }

    /// The hash of the entry at `seq`, if the log has one (the first, if a
    /// broken log has several). Searched in order: the entries of a broken
    /// log need not be sorted by seq.
    pub fn hash_at(&self, seq: u64) -> Option<&str> {
        self.hashes.iter().find(|(s, _)| *s == seq).map(|(_, h)| h.as_str())
    }
}

/// The first 16 hex characters, for messages.
fn short(h: &str) -> String {
    match h.get(..16) {
        Some(p) if h.len() > 16 => format!("{p}..."),
        _ => h.to_owned(),
    }
}

/// Walks `events` (one task's log, in stored order, each with its stored
/// `hash` and `prev_hash`) and names the first entry that was changed,
/// removed or reordered.
pub fn verify_chain(task: &TaskId, events: &[Event]) -> ChainReport {
    let mut hashes = Vec::with_capacity(events.len());
    let mut problem = None;
    let stored: HashSet<&str> = events.iter().filter_map(|e| e.hash.as_deref()).collect();
    for (i, e) in events.iter().enumerate() {
        let prev_link = e.prev_hash.as_deref().unwrap_or("");
        let computed = entry_hash(prev_link, e);
        hashes.push((e.seq, e.hash.clone().unwrap_or_else(|| computed.clone())));
        if problem.is_none() {
            problem = check_entry(task, events, i, &computed, &stored);
        }
    }
    ChainReport {
        task: task.to_string(),
        entries: events.len(),
        head: events.last().map(|e| (e.seq, e.hash.clone().unwrap_or_default())),
        problem,
        hashes,
    }
}

fn check_entry(task: &TaskId, events: &[Event], i: usize, computed: &str, stored: &HashSet<&str>) -> Option<ChainProblem> {
    let e = &events[i];
    let q = e.seq;
    let problem = |seq, what, message: String| Some(ChainProblem { seq, what, message });
    if &e.task != task {
        return problem(q, ProblemKind::Changed, format!("entry {q} was changed (it names task {}, not {task})", e.task));
    }
    let prev = i.checked_sub(1).map(|j| &events[j]);
    let expected = prev.map(|p| p.seq + 1).unwrap_or(1);
    if q > expected {
        let which = if q == expected + 1 { format!("entry {expected} was") } else { format!("entries {expected} to {} were", q - 1) };
        return problem(expected, ProblemKind::Removed, format!("{which} removed (the log goes on at {q})"));
    }
    if q < expected {
        return problem(q, ProblemKind::Reordered, format!("entry {q} was reordered (it comes after entry {})", expected - 1));
    }
    let (Some(hash), Some(link)) = (e.hash.as_deref(), e.prev_hash.as_deref()) else {
        return problem(q, ProblemKind::Changed, format!("entry {q} was changed (its hash was removed)"));
    };
    if hash != computed {
        // Written at another position? Its hash covers the seq it was
        // written with: find that seq.
        let last = events.last().map(|l| l.seq).unwrap_or(q);
        let limit = last.saturating_add(events.len() as u64);
        let original = (1..=limit).filter(|&s| s != q).find(|&s| entry_hash(link, &Event { seq: s, ..e.clone() }) == hash);
        if let Some(s) = original {
            let predecessor_kept = if s == 1 { link == GENESIS } else { stored.contains(link) };
            if predecessor_kept {
                return problem(q, ProblemKind::Reordered, format!("entry {q} was reordered (it holds the entry written as {s})"));
            }
            if s > q {
                let which = if s == q + 1 { format!("entry {q} was") } else { format!("entries {q} to {} were", s - 1) };
                return problem(q, ProblemKind::Removed, format!("{which} removed (and the later entries renumbered: entry {q} was written as {s})"));
            }
        }
        return problem(q, ProblemKind::Changed, format!("entry {q} was changed (stored hash {}, computed {})", short(hash), short(computed)));
    }
    match prev {
        None if link != GENESIS => {
            problem(q, ProblemKind::Changed, format!("entry {q} was changed (it links to {}, not to the start of the chain)", short(link)))
        }
        Some(p) if Some(link) != p.hash.as_deref() => {
            if let Some(after) = events.iter().find(|o| o.hash.as_deref() == Some(link)) {
                return problem(q, ProblemKind::Reordered, format!("entry {q} was reordered (it was written after entry {}, not {})", after.seq, p.seq));
            }
            let ps = p.seq;
            problem(
                ps,
                ProblemKind::Changed,
                format!("entry {ps} was changed (entry {q} links to {}, entry {ps} hashes to {})", short(link), short(p.hash.as_deref().unwrap_or(""))),
            )
        }
        _ => None,
    }
}

/// Checks a valid-looking chain against a signed checkpoint of its head at
/// some earlier moment: the entry at the checkpoint's seq must still hash to
/// the signed head. (The checkpoint's signature is checked by
/// [`crate::SignedCheckpoint::verify`], not here.)
pub fn check_against_checkpoint(report: &ChainReport, checkpoint: &Checkpoint) -> Option<ChainProblem> {
    let n = checkpoint.seq;
    let signed = format!(
        "checkpoint of {} signed by key {}",
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(checkpoint.time_ms.max(0) as u64)),
        checkpoint.key_id
    );
    if checkpoint.task != report.task {
        return Some(ChainProblem {
            seq: n,
            what: ProblemKind::BadCheckpoint,
            message: format!("the {signed} is of task {}, not {}", checkpoint.task, report.task),
        });
    }
    match report.hash_at(n) {
        Some(h) if h == checkpoint.head => None,
        Some(h) => Some(ChainProblem {
            seq: n,
            what: ProblemKind::Rewritten,
            message: format!(
                "entries up to {n} were rewritten (the chain no longer matches the {signed}: entry {n} hashes to {}, signed {})",
                short(h),
                short(&checkpoint.head)
            ),
        }),
        None => {
            let head = report.head.as_ref().map(|(s, _)| *s).unwrap_or(0);
            let message = if head < n {
                format!("entries after {head} were removed (the {signed} covers entries up to {n})")
            } else {
                format!("entry {n} was removed (the {signed} covers it)")
            };
            Some(ChainProblem { seq: if head < n { head + 1 } else { n }, what: ProblemKind::Removed, message })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use cairn_core::EventKind;
    use serde_json::json;

    use super::*;

    fn task() -> TaskId {
        "tchaintest22".parse().unwrap()
    }

    fn raw(seq: u64, args: Value) -> Event {
        Event {
            seq,
            task: task(),
            time_ms: 1_700_000_000_000 + seq as i64,
            kind: EventKind::Exec,
            actor: "cli:alice".into(),
            args,
            exit_code: Some(0),
            duration_ms: Some(5),
            prev_hash: None,
            hash: None,
        }
    }

    /// A well-formed log of `n` entries.
    fn log(n: u64) -> Vec<Event> {
        let mut out: Vec<Event> = Vec::new();
        for seq in 1..=n {
            let mut e = raw(seq, json!({"argv": ["step", seq], "env": {"B": "2", "A": "1"}}));
            let prev = out.last().and_then(|p| p.hash.clone()).unwrap_or_else(|| GENESIS.to_owned());
            e.hash = Some(entry_hash(&prev, &e));
            e.prev_hash = Some(prev);
            out.push(e);
        }
        out
    }

    /// Recomputes every hash from `from` (index) on, as an attacker would.
    fn rehash(events: &mut [Event], from: usize) {
        for i in from..events.len() {
            let prev = if i == 0 { GENESIS.to_owned() } else { events[i - 1].hash.clone().unwrap() };
            events[i].prev_hash = Some(prev.clone());
            events[i].hash = Some(entry_hash(&prev, &events[i]));
        }
    }

    fn problem(events: &[Event]) -> ChainProblem {
        verify_chain(&task(), events).problem.expect("a problem")
    }

    #[test]
    fn the_encoding_is_exactly_the_documented_bytes() {
        let mut e = raw(1, json!({"z": [1, {"b": null, "a": true}], "a": "é \"q\" \\ \n\u{1}\t", "m": 12.5}));
        e.exit_code = None;
        let bytes = String::from_utf8(entry_bytes(GENESIS, &e)).unwrap();
        let want = format!(
            "cairn-ledger-v1\n{GENESIS}\n{}",
            r#"{"actor":"cli:alice","args":{"a":"é \"q\" \\ \n\u0001\t","m":12.5,"z":[1,{"a":true,"b":null}]},"duration_ms":5,"exit_code":null,"kind":"exec","seq":1,"task":"tchaintest22","time_ms":1700000000001}"#
        );
        assert_eq!(bytes, want);
        assert_eq!(entry_hash(GENESIS, &e), hex::encode(Sha256::digest(want.as_bytes())));
        // Known answer, computed independently with Python's json.dumps(sort_keys=True,
        // separators=(",", ":"), ensure_ascii=False) and hashlib.
        assert_eq!(entry_hash(GENESIS, &e), "97ab6c71ae30976314286b40a2f46078855ae0471bd2a0501f8394b56f289550");
        let stored = Event { prev_hash: Some("x".into()), hash: Some("y".into()), ..e.clone() };
        assert_eq!(entry_hash(GENESIS, &stored), entry_hash(GENESIS, &e), "the stored hash fields are not hashed");
    }

    #[test]
    fn a_whole_log_verifies() {
        let events = log(5);
        let r = verify_chain(&task(), &events);
        assert!(r.ok(), "{:?}", r.problem);
        assert_eq!((r.entries, r.head.clone().map(|h| h.0)), (5, Some(5)));
        assert_eq!(r.hash_at(3), events[2].hash.as_deref());
        assert_eq!(r.hash_at(9), None);
        assert!(verify_chain(&task(), &[]).ok(), "an empty log is a valid chain");
    }

    #[test]
    fn a_changed_entry_is_named() {
        let mut events = log(5);
        events[2].args["argv"][1] = json!(4);
        let p = problem(&events);
        assert_eq!((p.seq, p.what), (3, ProblemKind::Changed), "{p}");
        assert!(p.message.starts_with("entry 3 was changed (stored hash "), "{p}");
        let mut events = log(5);
        events[1].actor = "cli:mallory".into();
        assert_eq!(problem(&events).seq, 2);
        let mut events = log(5);
        events[3].hash = None;
        assert_eq!(problem(&events).message, "entry 4 was changed (its hash was removed)");
        let mut events = log(3);
        events[0].task = "tdifferent22".parse().unwrap();
        assert_eq!(problem(&events).what, ProblemKind::Changed);
    }

    #[test]
    fn a_removed_entry_is_named() {
        let mut events = log(5);
        events.remove(2);
        let p = problem(&events);
        assert_eq!((p.seq, p.what, p.message.as_str()), (3, ProblemKind::Removed, "entry 3 was removed (the log goes on at 4)"));
        let mut events = log(5);
        events.drain(1..3);
        assert_eq!(problem(&events).message, "entries 2 to 3 were removed (the log goes on at 4)");
        let mut events = log(3);
        events.remove(0);
        assert_eq!(problem(&events).seq, 1, "the first entry too");
    }

    #[test]
    fn a_removal_hidden_by_renumbering_is_named() {
        let mut events = log(5);
        events.remove(2);
        for e in &mut events[2..] {
            e.seq -= 1;
        }
        let p = problem(&events);
        assert_eq!((p.seq, p.what), (3, ProblemKind::Removed), "{p}");
        assert!(p.message.contains("entry 3 was written as 4"), "{p}");
    }

    #[test]
    fn reordered_entries_are_named() {
        // Two entries swap their seq (as an UPDATE of the seq column does).
        let mut events = log(5);
        events[1].seq = 4;
        events[3].seq = 2;
        events.sort_by_key(|e| e.seq);
        let p = problem(&events);
        assert_eq!((p.seq, p.what, p.message.as_str()), (2, ProblemKind::Reordered, "entry 2 was reordered (it holds the entry written as 4)"));
        // Whole rows swapped, hashes and all, seq recomputed to look right.
        let mut events = log(4);
        events.swap(1, 2);
        events[1].seq = 2;
        events[2].seq = 3;
        assert_eq!(problem(&events).what, ProblemKind::Reordered);
    }

    #[test]
    fn a_replaced_entry_with_a_recomputed_hash_is_named_by_the_next_link() {
        let mut events = log(5);
        events[2].args = json!({"argv": ["rm", "-rf", "/"]});
        events[2].hash = Some(entry_hash(events[2].prev_hash.as_deref().unwrap(), &events[2]));
        let p = problem(&events);
        assert_eq!((p.seq, p.what), (3, ProblemKind::Changed), "{p}");
        assert!(p.message.contains("entry 4 links to"), "{p}");
        // A first entry that links elsewhere, its hash recomputed.
        let mut events = log(2);
        events[0].prev_hash = Some("ab".repeat(32));
        events[0].hash = Some(entry_hash(&"ab".repeat(32), &events[0]));
        events[1].prev_hash = events[0].hash.clone();
        events[1].hash = Some(entry_hash(events[1].prev_hash.as_deref().unwrap(), &events[1]));
        let p = problem(&events);
        assert_eq!((p.seq, p.what), (1, ProblemKind::Changed));
        assert!(p.message.contains("not to the start of the chain"), "{p}");
    }

    #[test]
    fn a_consistent_rewrite_passes_the_chain_but_not_the_checkpoint() {
        let events = log(5);
        let r = verify_chain(&task(), &events);
        let cp = Checkpoint { task: task().to_string(), seq: 4, head: r.hash_at(4).unwrap().to_owned(), time_ms: 0, key_id: "k1".into() };
        assert_eq!(check_against_checkpoint(&r, &cp), None);

        let mut forged = events.clone();
        forged[1].args = json!({"argv": ["nothing to see"]});
        rehash(&mut forged, 1);
        let r2 = verify_chain(&task(), &forged);
        assert!(r2.ok(), "a clever rewrite is a valid chain");
        let p = check_against_checkpoint(&r2, &cp).expect("the checkpoint catches it");
        assert_eq!((p.seq, p.what), (4, ProblemKind::Rewritten));
        assert!(p.message.starts_with("entries up to 4 were rewritten (the chain no longer matches the checkpoint of 1970-01-01T00:00:00Z signed by key k1"), "{p}");

        let mut cut = events.clone();
        cut.truncate(2);
        let p = check_against_checkpoint(&verify_chain(&task(), &cut), &cp).expect("a cut tail");
        assert_eq!((p.seq, p.what), (3, ProblemKind::Removed));
        assert!(p.message.starts_with("entries after 2 were removed"), "{p}");

        let other = Checkpoint { task: "tdifferent22".into(), ..cp };
        assert_eq!(check_against_checkpoint(&r, &other).unwrap().what, ProblemKind::BadCheckpoint);
    }

    #[test]
    fn a_report_with_a_problem_is_not_ok() {
        let mut events = log(3);
        events[1].actor = "cli:mallory".into();
        let r = verify_chain(&task(), &events);
        assert!(!r.ok(), "{r:?}");
        assert_eq!(r.problem.as_ref().map(|p| (p.seq, p.what)), Some((2, ProblemKind::Changed)));
        assert!(verify_chain(&task(), &log(3)).ok());
    }

    #[test]
    fn problems_display_as_their_names_and_messages() {
        let names = [
            (ProblemKind::Changed, "changed"),
            (ProblemKind::Removed, "removed"),
            (ProblemKind::Reordered, "reordered"),
            (ProblemKind::Rewritten, "rewritten"),
            (ProblemKind::BadCheckpoint, "bad_checkpoint"),
        ];
        for (kind, name) in names {
            assert_eq!((kind.as_str(), kind.to_string()), (name, name.to_owned()));
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(name), "the JSON name is the same");
        }
        let mut events = log(3);
        events.remove(1);
        let p = problem(&events);
        assert_eq!(p.to_string(), "entry 2 was removed (the log goes on at 3)");
        assert_eq!(p.to_string(), p.message);
    }

    #[test]
    fn hashes_in_messages_are_cut_to_16_characters() {
        assert_eq!(short(&"ab".repeat(32)), "abababababababab...");
        assert_eq!(short(&"c".repeat(17)), format!("{}...", "c".repeat(16)));
        assert_eq!(short(&"d".repeat(16)), "d".repeat(16), "16 characters are shown whole");
        assert_eq!(short("ab"), "ab");
        assert_eq!(short(""), "");
        let mut events = log(3);
        events[1].actor = "cli:mallory".into();
        let stored = events[1].hash.clone().unwrap();
        let computed = entry_hash(events[1].prev_hash.as_deref().unwrap(), &events[1]);
        assert_eq!(problem(&events).message, format!("entry 2 was changed (stored hash {}..., computed {}...)", &stored[..16], &computed[..16]));
    }

    #[test]
    fn an_entry_repeated_later_is_reordered() {
        // Entry 2 copied, hash and all, to the end of the log.
        let mut events = log(3);
        events.push(events[1].clone());
        let p = problem(&events);
        assert_eq!((p.seq, p.what, p.message.as_str()), (2, ProblemKind::Reordered, "entry 2 was reordered (it comes after entry 3)"));
        // The first entry copied to the end: its link is the start of the chain.
        let mut events = log(3);
        events.push(events[0].clone());
        let p = problem(&events);
        assert_eq!((p.seq, p.what, p.message.as_str()), (1, ProblemKind::Reordered, "entry 1 was reordered (it comes after entry 3)"));
    }

    #[test]
    fn an_entry_inserted_before_the_first_is_named_at_the_renumbered_first() {
        // A new, validly hashed first entry; the real log renumbered after it
        // with its hashes kept.
        let mut events = log(3);
        let mut forged = raw(1, json!({"argv": ["true"]}));
        forged.prev_hash = Some(GENESIS.to_owned());
        forged.hash = Some(entry_hash(GENESIS, &forged));
        for e in &mut events {
            e.seq += 1;
        }
        events.insert(0, forged);
        let p = problem(&events);
        assert_eq!((p.seq, p.what, p.message.as_str()), (2, ProblemKind::Reordered, "entry 2 was reordered (it holds the entry written as 1)"));
    }

    #[test]
    fn a_renumbered_removal_names_how_many_entries_went() {
        let mut events = log(5);
        events.remove(2);
        for e in &mut events[2..] {
            e.seq -= 1;
        }
        assert_eq!(problem(&events).message, "entry 3 was removed (and the later entries renumbered: entry 3 was written as 4)");
        let mut events = log(6);
        events.drain(2..4);
        for e in &mut events[2..] {
            e.seq -= 2;
        }
        let p = problem(&events);
        assert_eq!((p.seq, p.what), (3, ProblemKind::Removed));
        assert_eq!(p.message, "entries 3 to 4 were removed (and the later entries renumbered: entry 3 was written as 5)");
    }

    #[test]
    fn a_checkpoint_finds_its_entry_in_a_log_out_of_order() {
        // Rows stored out of seq order: the chain names a problem, but the
        // signed entry is still there and still hashes to the signed head.
        let events = log(3);
        let cp = Checkpoint { task: task().to_string(), seq: 2, head: events[1].hash.clone().unwrap(), time_ms: 0, key_id: "k1".into() };
        let shuffled = vec![events[0].clone(), events[2].clone(), events[1].clone()];
        let r = verify_chain(&task(), &shuffled);
        assert!(!r.ok());
        assert_eq!(r.hash_at(2), events[1].hash.as_deref());
        assert_eq!(r.hash_at(3), events[2].hash.as_deref());
        assert_eq!(check_against_checkpoint(&r, &cp), None);
        let cut = verify_chain(&task(), &events[..1]);
        let p = check_against_checkpoint(&cut, &cp).expect("a cut tail");
        assert_eq!((p.seq, p.what), (2, ProblemKind::Removed));
        assert_eq!(p.message, "entries after 1 were removed (the checkpoint of 1970-01-01T00:00:00Z signed by key k1 covers entries up to 2)");
        let mut gap = events.clone();
        gap.remove(1);
        let p = check_against_checkpoint(&verify_chain(&task(), &gap), &cp).expect("a removed entry");
        assert_eq!((p.seq, p.what), (2, ProblemKind::Removed));
        assert_eq!(p.message, "entry 2 was removed (the checkpoint of 1970-01-01T00:00:00Z signed by key k1 covers it)");
    }

    #[test]
    fn canonical_json_sorts_every_level_and_escapes_like_python() {
        let v: Value = serde_json::from_str(r#"{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":"\u007f\u2028€","":0}"#).unwrap();
        assert_eq!(canonical_json(&v), "{\"\":0,\"a\":\"\u{7f}\u{2028}€\",\"b\":{\"x\":[{\"c\":2,\"d\":1}],\"y\":1}}");
        assert_eq!(canonical_json(&json!(1e-7)), "1e-7");
        assert_eq!(canonical_json(&json!(3.0)), "3.0");
        assert_eq!(canonical_json(&json!(-17)), "-17");
        assert_eq!(canonical_json(&json!(u64::MAX)), "18446744073709551615");
    }
}
