//! How task disks share the host's filesystem (docs/security.md, "Disk
//! space"): a disk is admitted only when what every disk may still write
//! fits in the free space less the daemon's reserve (or in a configured
//! budget); a task that fills its disk writes no more than its size, and
//! what it frees goes back to the host; a task whose disk and inodes are
//! exhausted is still started again. Needs root.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::Daemon;

fn with_config(toml: &str) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.toml");
    std::fs::write(&path, toml).unwrap();
    (Daemon::start_with(&["--config", path.to_str().unwrap()]), dir)
}

fn disk_images(d: &Daemon) -> Vec<PathBuf> {
    std::fs::read_dir(d.home().join("disks")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "img")).collect()
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

#[test]
fn a_disk_past_the_budget_is_refused_at_create_and_fork_with_the_reason() {
    let (d, _cfg) = with_config("[disk]\nbudget = \"1G\"\n");
    let a = d.create(&["--disk", "512M"]);
    let b = d.create(&["--disk", "256M"]);
    let before = disk_images(&d).len();
    let tasks = || d.json(&["task", "list", "--all"]).as_array().unwrap().len();
    let recorded = tasks();
    let err = d.fails(&["task", "create", "--disk", "512M"]);
    assert!(!err.contains("failed to start"), "refused before the task is recorded: {err}");
    assert!(err.contains("no room for a 512 MiB task disk in the disk budget of 1 GiB") && err.contains("hold 768 MiB"), "{err}");
    let snap = d.json(&["snapshot", &a]);
    let err = d.fails(&["fork", &a, "--from", snap["id"].as_str().unwrap()]);
    assert!(err.contains("no room for a 512 MiB task disk"), "{err}");
    assert_eq!(disk_images(&d).len(), before, "a refused disk leaves no image");
    assert_eq!(tasks(), recorded, "a refused create or fork records no task");
    // Positive control: once a disk goes, the same request fits.
    d.ok(&["destroy", &b]);
    let c = d.create(&["--disk", "256M"]);
    assert_eq!(must(&d, &c, "echo ok"), "ok\n");
    for t in [&a, &c] {
        d.ok(&["destroy", t]);
    }
}

#[test]
fn a_disk_that_would_reach_into_the_reserve_is_refused_naming_what_is_free() {
    let free = nix::sys::statvfs::statvfs("/var/tmp").unwrap();
    let free = free.blocks_available() * free.fragment_size();
    // A reserve of all but 1 GiB of the free space: a 2 GiB disk cannot be
    // promised, a 256 MiB one can.
    let reserve = free.saturating_sub(1 << 30);
    let d = Daemon::start_with(&["--disk-reserve", &reserve.to_string()]);
    let err = d.fails(&["task", "create", "--disk", "2G"]);
    assert!(err.contains("no room for a 2 GiB task disk") && err.contains("free, of which") && err.contains("kept for the daemon's own data"), "{err}");
    let t = d.create(&["--disk", "256M"]);
    assert_eq!(must(&d, &t, "echo ok"), "ok\n");
    d.ok(&["destroy", &t]);
}

#[test]
fn a_task_filling_its_disk_writes_no_more_than_its_size_and_what_it_frees_returns_to_the_host() {
    let d = Daemon::start();
    let t = d.create(&["--disk", "256M"]);
    let neighbour = d.create(&[]);
    let image = d.home().join("disks").join(format!("{t}.img"));
    let used = || std::fs::metadata(&image).unwrap().blocks() * 512;
    let quiet = {
        let start = Instant::now();
        must(&d, &neighbour, "true");
        start.elapsed()
    };
    let (code, out, _) = d.sh(&t, "dd if=/dev/urandom of=/workspace/fill bs=1M 2>&1; s=$?; sync; exit $s");
    assert_ne!(code, 0, "filling the disk ends with ENOSPC");
    assert!(out.contains("No space left"), "dd said {out:?}");
    let full = used();
    assert!(full > 200 << 20, "the disk holds what was written: {full}");
    assert!(full <= (256 << 20) + (16 << 20), "a 256M disk took {full} bytes on the host");
    let start = Instant::now();
    must(&d, &neighbour, "true");
    let busy = start.elapsed();
    assert!(busy < quiet * 3 + Duration::from_millis(200), "the neighbour's exec took {busy:?}, {quiet:?} quiet");
    must(&d, &t, "rm /workspace/fill && sync");
    // The discard reaches the image when the journal commits.
    let deadline = Instant::now() + Duration::from_secs(30);
    while used() > full / 2 {
        assert!(Instant::now() < deadline, "freed blocks stay taken on the host: {} of {full}", used());
        std::thread::sleep(Duration::from_millis(200));
    }
    for id in [&t, &neighbour] {
        d.ok(&["destroy", id]);
    }
}

/// Every inode, then every block the sandbox may take, of the task's disk.
fn exhaust(d: &Daemon, t: &str) {
    let filled = must(
        d,
        t,
        "python3 -c 'import os\nn = 0\nwhile True:\n    try:\n        open(\"/workspace/i%d\" % n, \"w\").close()\n    except OSError:\n        break\n    n += 1\nprint(n)'; \
         dd if=/dev/zero of=/workspace/blocks bs=1M 2>/dev/null; true",
    );
    assert!(filled.trim().parse::<u64>().unwrap() > 1000, "{filled}");
    let (code, _, err) = d.sh(t, "touch /workspace/one-more");
    assert_ne!(code, 0, "the disk's inodes are exhausted: {err}");
}

/// A suspended task keeps its disk as it was and the wake mounts its
/// overlay on it again: on a disk without a free inode that needs the
/// daemon's spare ones.
#[test]
fn a_task_whose_disk_and_inodes_are_exhausted_wakes_from_it() {
    let d = Daemon::start();
    let t = d.create(&["--disk", "64M"]);
    must(&d, &t, "echo yes > /workspace/kept");
    exhaust(&d, &t);
    d.ok(&["suspend", &t]);
    d.ok(&["resume", &t]);
    assert_eq!(must(&d, &t, "cat /workspace/kept"), "yes\n");
    assert_eq!(d.state(&t), "running");
    // Space freed inside makes it writable again.
    must(&d, &t, "rm -f /workspace/blocks /workspace/i1 /workspace/i2 && touch /workspace/one-more");
    d.ok(&["destroy", &t]);
}

/// /tmp is a tmpfs charged to the task's memory, whose pages outlive the
/// process that wrote them: filled, it leaves room for the next command.
#[test]
fn a_task_whose_tmp_is_full_runs_its_next_command() {
    let d = Daemon::start();
    let t = d.create(&["--memory", "128M", "--disk", "64M"]);
    let (code, _, err) = d.sh(&t, "head -c 200M /dev/zero > /tmp/fill");
    assert!(code != 0 && err.contains("No space left on device"), "the writer meets a full /tmp, not the OOM killer: {code} {err}");
    assert_eq!(must(&d, &t, "df -k /tmp | awk 'NR==2 {print $4}'"), "0\n", "/tmp is full");
    // The next command runs and can free it.
    assert_eq!(must(&d, &t, "echo alive && rm /tmp/fill && echo freed"), "alive\nfreed\n");
    assert_eq!(d.state(&t), "running");
    d.ok(&["destroy", &t]);
}

/// A sandbox that dies on a full disk (as when the OOM killer ends its
/// init) is recovered from its head snapshot at the next command.
#[test]
fn a_task_whose_disk_and_inodes_are_exhausted_is_recovered_after_its_sandbox_is_lost() {
    let d = Daemon::start();
    let t = d.create(&["--disk", "64M"]);
    must(&d, &t, "echo yes > /workspace/kept");
    d.json(&["snapshot", &t]);
    exhaust(&d, &t);
    let pid = d.task(&t)["sandbox_pid"].as_i64().unwrap() as i32;
    // SAFETY: kill with a pid the daemon reported for this task's sandbox.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out, _) = d.sh(&t, "cat /workspace/kept");
        if code == 0 {
            assert_eq!(out, "yes\n");
            break;
        }
        assert!(Instant::now() < deadline, "the task did not come back: {}", d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(d.state(&t), "running");
    must(&d, &t, "touch /workspace/one-more");
    d.ok(&["destroy", &t]);
}

/// A tar of one file of `len` zeros, zstd-compressed as it is written (a
/// few hundred KiB for a GiB).
fn zeros_tar_zst(path: &std::path::Path, len: u64) {
    let out = std::fs::File::create(path).unwrap();
    let enc = zstd::Encoder::new(out, 19).unwrap().auto_finish();
    let mut b = tar::Builder::new(enc);
    let mut h = tar::Header::new_gnu();
    h.set_size(len);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append_data(&mut h, "zeros", std::io::repeat(0).take(len)).unwrap();
    b.finish().unwrap();
}

use std::io::Read;

/// Image bombs against a daemon whose imports may write 256 MiB: a 1 GiB
/// file of zeros in a small `.tar.zst` and a 2 TiB sparse file in a small
/// tar are refused with one line, leave no image, and a neighbour's
/// commands meanwhile take about what they take when it is quiet.
#[test]
fn image_bombs_stop_at_the_limit_while_a_neighbour_runs_on() {
    let (d, cfg) = with_config("[images]\nmax_size = \"256M\"\n");
    let neighbour = d.create(&[]);
    let timed = |d: &Daemon| {
        let start = Instant::now();
        must(d, &neighbour, "true");
        start.elapsed()
    };
    let mut quiet: Vec<Duration> = (0..5).map(|_| timed(&d)).collect();
    quiet.sort();
    let quiet = quiet[2];

    let zst = cfg.path().join("bomb.tar.zst");
    zeros_tar_zst(&zst, 1 << 30);
    assert!(std::fs::metadata(&zst).unwrap().len() < 1 << 20, "a small archive");
    let sparse_file = cfg.path().join("hole");
    std::fs::File::create(&sparse_file).unwrap().set_len(2 << 40).unwrap();
    let sparse = cfg.path().join("sparse.tar");
    let made = common::run(std::process::Command::new("tar").arg("--sparse").arg("-cf").arg(&sparse).arg("-C").arg(cfg.path()).arg("hole")).unwrap().status;
    assert!(made.success(), "GNU tar makes the sparse archive");

    let before = d.json(&["image", "list"]).as_array().unwrap().len();
    let busy = std::thread::scope(|s| {
        let importing = s.spawn(|| {
            let zst_err = d.fails(&["image", "import", "bomb-zst", zst.to_str().unwrap()]);
            let sparse_err = d.fails(&["image", "import", "bomb-sparse", sparse.to_str().unwrap()]);
            (zst_err, sparse_err)
        });
        let mut busy = Vec::new();
        while !importing.is_finished() {
            busy.push(timed(&d));
        }
        let (zst_err, sparse_err) = importing.join().unwrap();
        assert!(zst_err.contains("256") && zst_err.len() < 300, "{zst_err}");
        assert!(sparse_err.contains("TiB") || sparse_err.contains("apparent") || sparse_err.contains("logical"), "{sparse_err}");
        busy
    });
    assert_eq!(d.json(&["image", "list"]).as_array().unwrap().len(), before, "no image is left of a refused import");
    let mut busy = busy;
    busy.sort();
    if let Some(median) = busy.get(busy.len() / 2) {
        assert!(*median < quiet * 3 + Duration::from_millis(50), "the neighbour's exec took {median:?} (median) during the imports, {quiet:?} quiet");
    }
    // Positive control: an archive within the limit is imported.
    let fine = cfg.path().join("fine.tar.zst");
    zeros_tar_zst(&fine, 1 << 20);
    d.ok(&["image", "import", "fine", fine.to_str().unwrap()]);
    d.ok(&["image", "rm", "fine"]);
    d.ok(&["destroy", &neighbour]);
}
