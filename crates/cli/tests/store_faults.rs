//! PostgreSQL going away mid-load (every connection dropped and refused
//! for a few seconds, as a restart does to its clients): nothing the daemon
//! acknowledged is lost or doubled, and it serves again once the database
//! is back. The daemon reaches the store's private server through a relay
//! the test cuts (`common::cut`). S3 failing mid-snapshot is in
//! `blob_s3.rs`.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_store::testing::postgres::fresh_database;
use common::Daemon;

#[test]
fn postgres_restarted_mid_load_loses_nothing_acknowledged() {
    let db = fresh_database();
    let (head, rest) = db.url.rsplit_once('@').unwrap();
    let (hostport, name) = rest.split_once('/').unwrap();
    let relay = common::cut::Cuttable::start(hostport.parse().unwrap());
    let url = format!("{head}@{}/{name}", relay.addr);
    let d = Daemon::start_with(&["--store", &url]);
    let id = d.create(&[]);

    // A client runs commands one after another, each appending its number
    // to a file and recorded as an exec event; the database goes away for
    // 3 s in the middle.
    let done = AtomicBool::new(false);
    let (outcomes, cut_at) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut outcomes = BTreeMap::new();
            let mut n = 0u32;
            while !done.load(Ordering::SeqCst) || n < 20 {
                n += 1;
                let out = d.try_cairn(&["exec", &id, "--", "sh", "-c", &format!("echo {n} >> /workspace/load")]);
                outcomes.insert(n, matches!(&out, Ok(o) if o.status.success()));
                if n >= 400 {
                    break;
                }
            }
            outcomes
        });
        std::thread::sleep(Duration::from_secs(2));
        let cut_at = Instant::now();
        relay.cut();
        std::thread::sleep(Duration::from_secs(3));
        relay.restore();
        // Load for a while after the database is back.
        std::thread::sleep(Duration::from_secs(3));
        done.store(true, Ordering::SeqCst);
        (load.join().unwrap(), cut_at)
    });
    let acknowledged: Vec<u32> = outcomes.iter().filter(|(_, ok)| **ok).map(|(n, _)| *n).collect();
    let refused: Vec<u32> = outcomes.iter().filter(|(_, ok)| !**ok).map(|(n, _)| *n).collect();
    eprintln!("{} commands acknowledged, {} refused while the database was away ({:?} after the cut)", acknowledged.len(), refused.len(), cut_at.elapsed());
    assert!(!refused.is_empty(), "no command was refused: the database never went away under load");
    let last = *outcomes.keys().last().unwrap();
    assert!(acknowledged.iter().any(|n| *n > *refused.last().unwrap()), "nothing was acknowledged after the database came back: {outcomes:?}");
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
