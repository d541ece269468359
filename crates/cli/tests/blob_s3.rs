//! The blob store on S3-compatible storage, through the real CLI and
//! daemon: `cairn serve --blob s3://BUCKET/PREFIX` against a moto server on
//! loopback. Snapshot, rollback, suspend and wake (from the store, with the
//! task's local disk gone as on another node), fork, gc and check; the
//! objects are in the bucket, and a wake with the pack cache warm makes no
//! request for a pack, which the server's own request log (moto's recorder)
//! shows; a cold one fetches them. And S3 failing in the middle of a
//! snapshot loses nothing acknowledged.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_blob::moto::{Moto, Request};
use common::Daemon;
use serde_json::Value;

const BUCKET: &str = "cairn-cluster";
const PREFIX: &str = "pool/node-a";

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// What the task's files are: names, sizes and hashes.
fn files(d: &Daemon, task: &str) -> String {
    must(d, task, "cd /workspace && find . -type f | sort | xargs sha256sum")
}

fn pack_keys(moto: &Moto) -> Vec<String> {
    moto.keys(BUCKET, &format!("{PREFIX}/packs/"))
}

fn pack_gets(requests: &[Request]) -> usize {
    requests.iter().filter(|r| r.method == "GET" && r.path.starts_with(&format!("/{BUCKET}/{PREFIX}/packs/"))).count()
}

/// Files under `dir` (recursively).
fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}

/// A sample of `GET /metrics`.
fn metric(d: &Daemon, name: &str) -> f64 {
    let token = std::fs::read_to_string(d.home().join("token")).unwrap();
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sf", "-H", &format!("authorization: Bearer {}", token.trim()), &format!("{}/metrics", d.url)]);
    let out = common::output_within(&mut cmd, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Suspends the task and removes its local disk, so that the next wake
/// restores it from the blob store, as a node that never ran it would.
fn suspend_and_drop_disk(d: &Daemon, id: &str) {
    d.ok(&["suspend", id]);
    assert_eq!(d.state(id), "suspended");
    std::fs::remove_file(d.home().join("disks").join(format!("{id}.img"))).unwrap();
}

/// Resumes the task and returns its wake event.
fn resume(d: &Daemon, id: &str) -> Value {
    d.ok(&["resume", id]);
    d.wait_for_state(id, "running", Duration::from_secs(60));
    let log = d.json(&["log", id]);
    log.as_array().unwrap().iter().rev().find(|e| e["kind"] == "wake").unwrap().clone()
}

#[test]
fn snapshots_suspend_wake_rollback_fork_gc_and_check_on_s3() {
    // Declared first, dropped last: the daemon stops before the server.
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let env = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = Daemon::start_with_env(&["--blob", &format!("s3://{BUCKET}/{PREFIX}")], &env);
    let cache = d.home().join("blob-cache/packs");

    let id = d.create(&["--keep-last", "2", "--keep-milestones", "true", "--expire-after", "never"]);
    must(&d, &id, "mkdir -p /workspace/src && head -c 6000000 /dev/urandom > /workspace/data.bin && seq 1 50000 > /workspace/src/numbers && echo v1 > /workspace/notes");
    let original = files(&d, &id);
    let s1 = d.json(&["snapshot", &id, "--kind", "milestone"]);
    let s1_id = s1["id"].as_str().unwrap().to_owned();

    // The objects are in the bucket under the prefix; nothing in the home's
    // blobs directory; the packs this node wrote are in its cache.
    let packs = pack_keys(&moto);
    assert!(!packs.is_empty(), "no pack in the bucket");
    assert!(!moto.keys(BUCKET, &format!("{PREFIX}/index/")).is_empty());
    assert!(!moto.keys(BUCKET, &format!("{PREFIX}/manifests/")).is_empty());
    assert_eq!(count_files(&d.home().join("blobs")), 0, "nothing stored locally");
    assert_eq!(count_files(&cache), packs.len(), "the packs written are cached");

    // Rollback.
    must(&d, &id, "echo v2 > /workspace/notes && rm /workspace/data.bin && echo extra > /workspace/src/extra");
    assert_ne!(files(&d, &id), original);
    d.ok(&["rollback", &id, "--to", &s1_id, "--reason", "back to the milestone"]);
    assert_eq!(files(&d, &id), original);

    // A wake from the store with a cold cache fetches the packs.
    suspend_and_drop_disk(&d, &id);
    std::fs::remove_dir_all(&cache).unwrap();
    moto.start_recording();
    let wake = resume(&d, &id);
    let cold = moto.stop_recording();
    assert_eq!(wake["args"]["from_cache"], false, "{wake}");
    assert!(wake["args"]["restore"]["files_written"].as_u64().unwrap() >= 3, "{wake}");
    assert!(pack_gets(&cold) > 0, "a cold cache fetched nothing: {cold:?}");
    assert_eq!(files(&d, &id), original);
    assert!(count_files(&cache) > 0, "the wake filled the cache");
    let downloaded = metric(&d, "cairn_blob_cache_downloaded_bytes_total");
    assert!(downloaded >= 6_000_000.0, "{downloaded}");

    // Again, with the cache warm: not one request for a pack.
    suspend_and_drop_disk(&d, &id);
    moto.start_recording();
    let wake = resume(&d, &id);
    let warm = moto.stop_recording();
    assert_eq!(wake["args"]["from_cache"], false, "{wake}");
    assert!(wake["args"]["restore"]["files_written"].as_u64().unwrap() >= 3, "{wake}");
    assert_eq!(pack_gets(&warm), 0, "a warm cache still fetched packs: {warm:?}");
    assert_eq!(metric(&d, "cairn_blob_cache_downloaded_bytes_total"), downloaded, "the daemon counts no download either");
    assert!(metric(&d, "cairn_blob_cache_hits_total") > 0.0);
    assert!(metric(&d, "cairn_blob_cache_bytes") > 0.0 && metric(&d, "cairn_blob_store_bytes") >= 6_000_000.0);
    assert_eq!(files(&d, &id), original);

    // Fork from the milestone.
    let forks = d.json(&["fork", &id, "--from", &s1_id]);
    let kid = forks.as_array().unwrap()[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(files(&d, &kid), original);

    // gc frees what expired, in the bucket and in the cache; check reads
    // every pack back from the store.
    must(&d, &id, "head -c 3000000 /dev/urandom > /workspace/junk");
    d.ok(&["snapshot", &id]);
    must(&d, &id, "rm /workspace/junk");
    d.ok(&["snapshot", &id]);
    d.ok(&["snapshot", &id, "--note", "third, so the one with the junk expires"]);
    let before = pack_keys(&moto).len();
    let gc = d.json(&["gc", "--grace", "0s"]);
    assert!(gc["report"]["bytes_freed"].as_u64().unwrap() >= 3_000_000, "{gc}");
    let after = pack_keys(&moto);
    assert!(after.len() < before, "{before} packs before gc, {} after", after.len());
    let cached_now = count_files(&cache);
    assert!(cached_now <= after.len(), "a pack gc deleted is still cached: {cached_now} cached, {} stored", after.len());
    let check = d.json(&["check", "--read-data"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    assert!(check["bytes_read"].as_u64().unwrap() >= 6_000_000, "{check}");

    // What is left still restores.
    d.ok(&["rollback", &id, "--to", &s1_id, "--reason", "once more"]);
    assert_eq!(files(&d, &id), original);
    assert_eq!(files(&d, &kid), original);
}

#[test]
fn a_daemon_pointed_at_an_unreachable_store_says_so_in_one_line() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let endpoint = format!("http://{closed}");
    let env = [("AWS_ENDPOINT_URL", endpoint.as_str()), ("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_ALLOW_HTTP", "true")];
    let home = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let out = common::output_within(
        std::process::Command::new(common::CAIRN)
            .args(["serve", "--listen", "127.0.0.1:0", "--disk-pool", "0", "--blob", "s3://cairn-nowhere/p"])
            .env("CAIRN_HOME", home.path())
            .env("RUST_LOG", "error")
            .envs(env),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("cairn: ") && last.contains("s3://cairn-nowhere/p") && last.contains(&endpoint), "{err}");
    assert!(last.contains("Connection refused"), "{err}");
}

/// S3 fails while a snapshot uploads its packs: every connection to it is
/// dropped and refused for 3 s (a relay between the daemon and the server
/// is cut once it has carried part of the upload). Whatever the snapshot's
/// answer, nothing acknowledged is lost: an acknowledged snapshot restores
/// byte for byte, a refused one is not listed, the task runs on with its
/// files, the store checks clean, and the earlier snapshot still restores.
#[test]
fn s3_failing_mid_snapshot_loses_nothing_acknowledged() {
    let moto = Moto::start();
    moto.create_bucket(BUCKET);
    let upstream: std::net::SocketAddr = moto.endpoint.trim_start_matches("http://").parse().unwrap();
    let relay = common::cut::Cuttable::start(upstream);
    let mut env = moto.env();
    for (k, v) in env.iter_mut() {
        if *k == "AWS_ENDPOINT_URL" {
            *v = format!("http://{}", relay.addr);
        }
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = Daemon::start_with_env(&["--blob", &format!("s3://{BUCKET}/{PREFIX}")], &env);
    let id = d.create(&[]);
    must(&d, &id, "echo first > /workspace/notes && head -c 1000000 /dev/urandom > /workspace/small");
    let first_files = files(&d, &id);
    let first = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();

    // 40 MB that do not compress: the upload takes a while.
    must(&d, &id, "head -c 40000000 /dev/urandom > /workspace/big && echo second > /workspace/notes");
    let second_files = files(&d, &id);
    let sent_before = relay.sent();
    let (answer, cut_during) = std::thread::scope(|s| {
        let snap = s.spawn(|| d.try_cairn(&["--json", "snapshot", &id]).unwrap());
        // The window: part of the upload has gone through the relay and
        // the snapshot has not answered yet.
        let deadline = Instant::now() + Duration::from_secs(60);
        while relay.sent() < sent_before + 8_000_000 && !snap.is_finished() {
            assert!(Instant::now() < deadline, "the upload never got going");
            std::thread::sleep(Duration::from_millis(5));
        }
        let cut_during = !snap.is_finished();
        relay.cut();
        std::thread::sleep(Duration::from_secs(3));
        relay.restore();
        (snap.join().unwrap(), cut_during)
    });
    assert!(cut_during, "the snapshot ended before S3 failed: the window was missed");
    let acknowledged = answer.status.success();
    eprintln!("the snapshot through the cut: {}", if acknowledged { "acknowledged (the client retried)" } else { "refused" });
    let listed: Vec<String> = d.json(&["snapshot", "list", &id]).as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    if acknowledged {
        let second: Value = serde_json::from_slice(&answer.stdout).unwrap();
        let second = second["id"].as_str().unwrap().to_owned();
        assert_eq!(listed, [first.clone(), second.clone()]);
        must(&d, &id, "rm /workspace/big && echo third > /workspace/notes");
        d.ok(&["rollback", &id, "--to", &second, "--reason", "after the failure"]);
        assert_eq!(files(&d, &id), second_files, "the acknowledged snapshot restores");
    } else {
        let err = String::from_utf8_lossy(&answer.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert_eq!(listed, std::slice::from_ref(&first), "a refused snapshot is not listed");
        assert_eq!(files(&d, &id), second_files, "the task runs on with its files");
        let retry = d.json(&["snapshot", &id])["id"].as_str().unwrap().to_owned();
        must(&d, &id, "rm /workspace/big && echo third > /workspace/notes");
        d.ok(&["rollback", &id, "--to", &retry, "--reason", "after the failure"]);
        assert_eq!(files(&d, &id), second_files, "a snapshot after the failure restores");
    }
    let check = d.json(&["check", "--read-data"]);
    assert!(check["problems"].as_array().unwrap().is_empty(), "{check}");
    d.ok(&["rollback", &id, "--to", &first, "--reason", "the first"]);
    assert_eq!(files(&d, &id), first_files, "the earlier snapshot restores");
}
