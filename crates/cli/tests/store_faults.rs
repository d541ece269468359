//! PostgreSQL restarted mid-load: the test binary's private server is
//! stopped (a fast shutdown, every connection dropped), kept down for
//! 3 s and started again on the same data and port. Nothing the daemon
//! acknowledged is lost or doubled, and it serves again once the database
//! is back. The only test here: the restart takes every database of the
//! binary's server away. S3 failing mid-snapshot is in `blob_s3.rs`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_store::testing::postgres::{fresh_database, restart_server};
use common::Daemon;

#[test]
fn postgres_restarted_mid_load_loses_nothing_acknowledged() {
    let db = fresh_database();
    let d = Daemon::start_with(&["--store", &db.url]);
    let id = d.create(&[]);

    // A client runs commands one after another, each appending its number
    // to a file and recorded as an exec event; the database is down for
    // 3 s in the middle.
    let done = AtomicBool::new(false);
    let (timed, down_from, back_at) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut timed = BTreeMap::new();
            let mut n = 0u32;
            while !done.load(Ordering::SeqCst) || n < 20 {
                n += 1;
                let start = Instant::now();
                let out = d.try_cairn(&["exec", &id, "--", "sh", "-c", &format!("echo {n} >> /workspace/load")]);
                timed.insert(n, (matches!(&out, Ok(o) if o.status.success()), start, Instant::now()));
                if n >= 400 {
                    break;
                }
            }
            timed
        });
        std::thread::sleep(Duration::from_secs(2));
        let down_from = Instant::now();
        restart_server(Duration::from_secs(3));
        let back_at = Instant::now();
        // Load for a while after the database is back.
        std::thread::sleep(Duration::from_secs(3));
        done.store(true, Ordering::SeqCst);
        (load.join().unwrap(), down_from, back_at)
    });
    let outcomes: BTreeMap<u32, bool> = timed.iter().map(|(n, (ok, _, _))| (*n, *ok)).collect();
    let acknowledged: Vec<u32> = outcomes.iter().filter(|(_, ok)| **ok).map(|(n, _)| *n).collect();
    let refused: Vec<u32> = outcomes.iter().filter(|(_, ok)| !**ok).map(|(n, _)| *n).collect();
    // The restart met the load: a command was refused, or one in flight
    // while the server was down (a second or more before it was back: it
    // takes a moment to start) was answered only once it was back (the
    // daemon waits for a connection rather than fail at once).
    let waited: Vec<u32> = timed
        .iter()
        .filter(|(_, (_, start, end))| *start + Duration::from_secs(1) < back_at && *end >= back_at)
        .map(|(n, _)| *n)
        .collect();
    eprintln!(
        "{} commands acknowledged, {} refused, {:?} in flight while the server was down ({:?}) and answered after it was back",
        acknowledged.len(),
        refused.len(),
        waited,
        back_at - down_from
    );
    assert!(!refused.is_empty() || !waited.is_empty(), "no command met the restart: the database never went away under load");
    let after: Vec<u32> = timed.iter().filter(|(_, (ok, start, _))| *ok && *start >= back_at).map(|(n, _)| *n).collect();
    assert!(!after.is_empty(), "nothing was acknowledged after the database came back: {outcomes:?}");
    let last = *outcomes.keys().last().unwrap();
    assert!(outcomes[&last], "the last command, after the database came back, failed");

    // Every acknowledged command's event is in the log exactly once, and
    // no command's is there twice; the chain verifies.
    let log = d.json(&["log", &id]);
    let mut recorded: BTreeMap<u32, usize> = BTreeMap::new();
    for e in log.as_array().unwrap().iter().filter(|e| e["kind"] == "exec") {
        let script = e["args"]["argv"][2].as_str().unwrap_or("");
        if let Some(n) = script.strip_prefix("echo ").and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()) {
            *recorded.entry(n).or_default() += 1;
        }
    }
    for n in &acknowledged {
        assert_eq!(recorded.get(n), Some(&1), "acknowledged command {n} is in the log {:?} times", recorded.get(n));
    }
    assert!(recorded.values().all(|c| *c == 1), "a command recorded twice: {recorded:?}");
    d.ok(&["log", &id, "--verify"]);
    // The sandbox ran every acknowledged command.
    let (code, file, _) = d.sh(&id, "cat /workspace/load");
    assert_eq!(code, 0);
    let ran: Vec<u32> = file.lines().map(|l| l.parse().unwrap()).collect();
    for n in &acknowledged {
        assert!(ran.contains(n), "acknowledged command {n} did not run");
    }
    // And the daemon goes on: a snapshot and a rollback.
    let snap = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
    d.sh(&id, "echo later >> /workspace/load");
    d.ok(&["rollback", &id, "--to", &snap, "--reason", "after the database came back"]);
    assert_eq!(d.sh(&id, "cat /workspace/load").1, file);
    d.ok(&["destroy", &id]);
    drop(d);
    drop(db);
}
