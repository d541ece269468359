//! The ledger end to end: a real daemon writes each task's hash-chained
//! log; the database is then edited behind its back, as an attacker with
//! write access to `cairn.db` would (triggers dropped first), with Python's
//! sqlite3 module; `cairn log --verify` must name what was done. The
//! "clever" attacker recomputes every hash after an edit with an
//! independent implementation of the documented encoding (Python's json and
//! hashlib), which only a signed checkpoint catches.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::Daemon;
use serde_json::Value;

/// `python3 -c TAMPER DB TASK ACTION ARGS...`
const TAMPER: &str = r#"
import hashlib, json, sqlite3, sys
db, task, action, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
con = sqlite3.connect(db, timeout=30, isolation_level=None)
con.executescript("DROP TRIGGER IF EXISTS events_no_update; DROP TRIGGER IF EXISTS events_no_delete;")
GENESIS = "0" * 64

def entry_hash(prev, r):
    # The encoding of docs/architecture.md, "Ledger".
    body = {"task": task, "seq": r[0], "time_ms": r[1], "kind": r[2], "actor": r[3],
            "args": json.loads(r[4]), "exit_code": r[5], "duration_ms": r[6]}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(("cairn-ledger-v1\n" + prev + "\n" + text).encode()).hexdigest()

def rows():
    return con.execute("SELECT seq, time_ms, kind, actor, args, exit_code, duration_ms, prev_hash, hash "
                       "FROM events WHERE task_id = ? ORDER BY seq", (task,)).fetchall()

def edit(seq, old, new):
    (args_text,) = con.execute("SELECT args FROM events WHERE task_id = ? AND seq = ?", (task, seq)).fetchone()
    assert old in args_text, (old, args_text)
    con.execute("UPDATE events SET args = ? WHERE task_id = ? AND seq = ?", (args_text.replace(old, new, 1), task, seq))

if action == "check":
    prev = GENESIS
    for r in rows():
        assert r[7] == prev, ("link", r[0])
        assert entry_hash(prev, r) == r[8], ("hash", r[0], r)
        prev = r[8]
    print(len(rows()))
elif action == "edit":
    edit(int(args[0]), args[1], args[2])
elif action == "delete":
    con.execute("DELETE FROM events WHERE task_id = ? AND seq = ?", (task, int(args[0])))
elif action == "swap":
    a, b = int(args[0]), int(args[1])
    con.execute("UPDATE events SET seq = -1 WHERE task_id = ? AND seq = ?", (task, a))
    con.execute("UPDATE events SET seq = ? WHERE task_id = ? AND seq = ?", (a, task, b))
    con.execute("UPDATE events SET seq = ? WHERE task_id = ? AND seq = -1", (b, task))
elif action == "rewrite":
    # Edit, then recompute every hash from there on: a consistent chain.
    seq = int(args[0])
    edit(seq, args[1], args[2])
    prev = GENESIS
    for r in rows():
        if r[0] >= seq:
            h = entry_hash(prev, r)
            con.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE task_id = ? AND seq = ?", (prev, h, task, r[0]))
            prev = h
        else:
            prev = r[8]
elif action == "truncate":
    con.execute("DELETE FROM events WHERE task_id = ? AND seq >= ?", (task, int(args[0])))
else:
    sys.exit("unknown action " + action)
"#;

fn python(d: &Daemon, task: &str, args: &[&str]) -> String {
    let out = common::run(Command::new("python3").arg("-c").arg(TAMPER).arg(d.home().join("cairn.db")).arg(task).args(args)).expect("python3");
    assert!(out.status.success(), "python {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A task with three commands in its log; the seqs of their entries.
fn task_with_execs(d: &Daemon) -> (String, Vec<u64>) {
    let t = d.create(&[]);
    for word in ["alpha", "bravo", "charlie"] {
        let (code, out, _) = d.sh(&t, &format!("echo {word}"));
        assert_eq!((code, out.trim()), (0, word));
    }
    let log = d.json(&["log", &t]);
    let execs: Vec<u64> = log.as_array().unwrap().iter().filter(|e| e["kind"] == "exec").map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(execs.len(), 3, "{log}");
    (t, execs)
}

fn verify_fails(d: &Daemon, task: &str) -> String {
    let err = d.fails(&["log", task, "--verify"]);
    let prefix = format!("cairn: ledger of {task}: ");
    assert!(err.starts_with(&prefix), "{err}");
    err[prefix.len()..].to_owned()
}

fn ledger(d: &Daemon, task: &str) -> Value {
    serde_json::from_str(&String::from_utf8_lossy(&d.cairn(&["--json", "log", task, "--verify"]).stdout)).unwrap()
}

#[test]
fn ledger_tampering_in_sqlite_is_found_by_log_verify() {
    let d = Daemon::start();

    // Positive control: an untouched log verifies, and an independent
    // implementation of the documented encoding computes the same hashes.
    let (t, execs) = task_with_execs(&d);
    let out = d.ok(&["log", &t, "--verify"]);
    assert!(out.starts_with(&format!("ledger of {t}: ")) && out.contains(" entries, head ") && out.contains("no checkpoint yet"), "{out}");
    let v = ledger(&d, &t);
    assert_eq!((v["ok"].as_bool(), v["problem"].as_str()), (Some(true), None), "{v}");
    let entries = v["entries"].as_u64().unwrap();
    assert_eq!(python(&d, &t, &["check"]), entries.to_string(), "Python computes every stored hash from the docs");
    assert_eq!(v["hashes"].as_array().unwrap().len() as u64, entries);
    assert!(d.ok(&["log", &t]).contains("exec"), "plain `cairn log` is unchanged");
    let cp = d.json(&["log", &t, "--checkpoint"]);
    assert_eq!((cp["seq"].as_u64(), cp["head"].as_str()), (Some(entries), v["head"].as_str()));
    let out = d.ok(&["log", &t, "--verify"]);
    assert!(out.contains(&format!("checkpoint at seq {entries} verified")), "{out}");

    // One byte of one entry's args.
    python(&d, &t, &["edit", &execs[1].to_string(), "echo bravo", "echo bravO"]);
    let err = verify_fails(&d, &t);
    assert!(err.starts_with(&format!("entry {} was changed (stored hash ", execs[1])), "{err}");
    assert_eq!(ledger(&d, &t)["problem_kind"], "changed");
    let refused = d.fails(&["log", &t, "--checkpoint"]);
    assert!(refused.contains("will not sign the ledger") && refused.contains("was changed"), "{refused}");

    // An entry deleted.
    let (t2, execs2) = task_with_execs(&d);
    python(&d, &t2, &["delete", &execs2[1].to_string()]);
    let err = verify_fails(&d, &t2);
    assert!(err.starts_with(&format!("entry {} was removed", execs2[1])), "{err}");

    // Two entries' positions swapped.
    let (t3, execs3) = task_with_execs(&d);
    python(&d, &t3, &["swap", &execs3[0].to_string(), &execs3[2].to_string()]);
    let err = verify_fails(&d, &t3);
    assert!(err.starts_with(&format!("entry {} was reordered", execs3[0])), "{err}");
    assert_eq!(ledger(&d, &t3)["problem_kind"], "reordered");

    // The whole chain rewritten consistently after an edit: only the
    // signed checkpoint knows.
    let (t4, execs4) = task_with_execs(&d);
    let signed = d.json(&["log", &t4, "--checkpoint"]);
    let s = signed["seq"].as_u64().unwrap();
    python(&d, &t4, &["rewrite", &execs4[0].to_string(), "echo alpha", "echo ALPHA"]);
    python(&d, &t4, &["check"]);
    let err = verify_fails(&d, &t4);
    assert!(err.starts_with(&format!("entries up to {s} were rewritten (the chain no longer matches the checkpoint of ")), "{err}");
    assert!(err.contains(signed["key_id"].as_str().unwrap()), "{err}");

    // The tail cut off after a checkpoint.
    let (t5, _) = task_with_execs(&d);
    let signed = d.json(&["log", &t5, "--checkpoint"]);
    let s = signed["seq"].as_u64().unwrap();
    let (code, _, _) = d.sh(&t5, "true");
    assert_eq!(code, 0);
    d.ok(&["log", &t5, "--verify"]);
    python(&d, &t5, &["truncate", &s.to_string()]);
    let err = verify_fails(&d, &t5);
    assert!(err.starts_with(&format!("entries after {} were removed", s - 1)), "{err}");

    // The untouched first task's neighbours are unaffected.
    let (t6, _) = task_with_execs(&d);
    d.ok(&["log", &t6, "--verify"]);
}

#[test]
fn the_node_key_is_private_rotates_and_old_checkpoints_still_verify() {
    let mut d = Daemon::start();
    let keys = d.home().join("keys");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&keys), 0o700);
    assert_eq!(mode(&keys.join("signing.key")), 0o600, "the secret key is private from the first start");

    let shown = d.ok(&["key", "show"]);
    let hex_line = shown.lines().find_map(|l| l.strip_prefix("public key: ")).unwrap_or_default().trim().to_owned();
    assert!(hex_line.len() == 64 && hex_line.bytes().all(|b| b.is_ascii_hexdigit()), "{shown}");
    let all = d.json(&["key", "show"]);
    assert_eq!(all.as_array().unwrap().len(), 1);
    let k1 = all[0]["key_id"].as_str().unwrap().to_owned();
    assert_eq!((all[0]["public_key"].as_str(), all[0]["current"].as_bool()), (Some(hex_line.as_str()), Some(true)));

    let t = d.create(&[]);
    d.sh(&t, "echo one");
    let first = d.json(&["log", &t, "--checkpoint"]);
    assert_eq!(first["key_id"], k1.as_str());
    assert_eq!(first["envelope"]["payloadType"], "application/vnd.cairn.checkpoint+json");

    let rotated = d.json(&["key", "rotate"]);
    let k2 = rotated["key_id"].as_str().unwrap().to_owned();
    assert_ne!(k1, k2);
    let all = d.json(&["key", "show"]);
    let listed: Vec<(&str, bool)> = all.as_array().unwrap().iter().map(|k| (k["key_id"].as_str().unwrap(), k["current"].as_bool().unwrap())).collect();
    assert_eq!(listed, [(k2.as_str(), true), (k1.as_str(), false)]);
    assert!(d.ok(&["key", "show"]).contains("1 older key(s)"));

    // The checkpoint signed before the rotation verifies with the old key.
    let v = ledger(&d, &t);
    assert_eq!((v["ok"].as_bool(), v["checkpoint"]["key_id"].as_str()), (Some(true), Some(k1.as_str())), "{v}");
    d.sh(&t, "echo two");
    let second = d.json(&["log", &t, "--checkpoint"]);
    assert_eq!(second["key_id"], k2.as_str(), "new checkpoints carry the new key");
    assert!(second["seq"].as_u64() > first["seq"].as_u64());

    // Across a restart: same keys, both checkpoints verify.
    d.kill();
    d.spawn(&[]);
    assert_eq!(d.json(&["key", "show"])[0]["key_id"], k2.as_str());
    let v = ledger(&d, &t);
    assert_eq!((v["ok"].as_bool(), v["checkpoints"].as_u64()), (Some(true), Some(2)), "{v}");
    let out = d.ok(&["log", &t, "--verify"]);
    assert!(out.contains("(2 checkpoints, all verified)") && out.contains(&k2), "{out}");
    assert_eq!(mode(&keys.join("signing.key")), 0o600);

    // A forged checkpoint row (its head changed without a signature) is named.
    let db = d.home().join("cairn.db");
    let forge = "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None); \
                 c.executescript('DROP TRIGGER checkpoints_no_update'); \
                 c.execute(\"UPDATE checkpoints SET head = CASE substr(head, 1, 1) WHEN 'f' THEN 'e' ELSE 'f' END || substr(head, 2) WHERE id = (SELECT MIN(id) FROM checkpoints)\")";
    let out = common::run(Command::new("python3").args(["-c", forge]).arg(&db)).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = verify_fails(&d, &t);
    assert!(err.contains("does not verify"), "{err}");
}
