//! The tests' own leak scanner, written apart from the product's
//! `traces` module so that a bug there cannot hide a leak here. It fails
//! closed: anything it cannot read where it must look is itself reported.
//!
//! After a daemon is stopped, nothing on the host may name its home or any
//! of its tasks: no mount, no loop device, no cgroup in any hierarchy, no
//! process in such a cgroup, no named network namespace, no uid-slot file,
//! and no run directory or disk image in the home.

use std::fs;
use std::io;
use std::path::Path;

/// What [`scan`] finds while the daemon of `home` still runs, less the
/// one mount a running daemon keeps: its home bound on itself `nosuid`.
#[allow(dead_code)]
pub fn scan_while_running(home: &Path, tasks: &[String]) -> Vec<String> {
    let own = format!(" {} {} ", home.display(), home.display());
    scan(home, tasks).into_iter().filter(|f| !(f.starts_with("mount left: ") && f.contains(&own))).collect()
}

/// Everything left on the host by the daemon of `home` and its `tasks`.
pub fn scan(home: &Path, tasks: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let home_s = home.display().to_string();
    let names_one = |s: &str| s.contains(&home_s) || tasks.iter().any(|t| s.contains(t.as_str()));

    // The calling thread's mount namespace, which is the daemon's also when
    // a test runs it from a thread with a mount namespace of its own.
    match fs::read_to_string("/proc/thread-self/mountinfo") {
        Ok(m) => found.extend(m.lines().filter(|l| names_one(l)).map(|l| format!("mount left: {l}"))),
        Err(e) => found.push(format!("cannot read the mount table: {e}")),
    }

    match fs::read_dir("/sys/block") {
        Ok(entries) => {
            for e in entries {
                let e = match e {
                    Ok(e) => e,
                    Err(err) => {
                        found.push(format!("cannot list block devices: {err}"));
                        continue;
                    }
                };
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with("loop") {
                    continue;
                }
                match fs::read_to_string(e.path().join("loop/backing_file")) {
                    Ok(b) if names_one(&b) => found.push(format!("loop device {name} left, backed by {}", b.trim())),
                    Ok(_) => {}
                    // An unattached loop device has no backing file.
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(err) => found.push(format!("cannot read loop device {name}: {err}")),
                }
            }
        }
        Err(e) => found.push(format!("cannot list block devices: {e}")),
    }

    let mut cgroups = Vec::new();
    if let Err(e) = walk_cgroups(Path::new("/sys/fs/cgroup"), 0, &mut |p: &Path| {
        if tasks.iter().any(|t| p.file_name().is_some_and(|n| n.to_string_lossy().contains(t.as_str()))) {
            cgroups.push(p.to_owned());
        }
    }) {
        found.push(format!("cannot walk the cgroup hierarchies: {e}"));
    }
    found.extend(cgroups.iter().map(|p| format!("cgroup left: {}", p.display())));

    match fs::read_dir("/proc") {
        Ok(entries) => {
            for e in entries.flatten() {
                let pid = e.file_name().to_string_lossy().into_owned();
                if !pid.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                // A process may end between the listing and the read.
                if let Ok(cg) = fs::read_to_string(e.path().join("cgroup")) {
                    let Some(line) = cg.lines().find(|l| tasks.iter().any(|t| l.contains(t.as_str()))) else { continue };
                    let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                    if reaped_here(&pid, &stat) {
                        continue;
                    }
                    let state = stat.rfind(')').map_or("?", |i| stat[i + 2..].split(' ').next().unwrap_or("?"));
                    found.push(format!("process {pid} (state {state}) left in a task's cgroup: {line}"));
                }
            }
        }
        Err(e) => found.push(format!("cannot list processes: {e}")),
    }

    for (dir, what) in [("/run/netns", "network namespace"), ("/run/cairn/uid-slots", "uid slot")] {
        match fs::read_dir(dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let text = if what == "uid slot" { fs::read_to_string(e.path()).unwrap_or_default() } else { String::new() };
                    let name = e.file_name().to_string_lossy().into_owned();
                    if names_one(&name) || tasks.iter().any(|t| text.lines().next() == Some(t.as_str())) {
                        found.push(format!("{what} left: {dir}/{name}"));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => found.push(format!("cannot list {dir}: {e}")),
        }
    }

    for t in tasks {
        for p in [home.join("run").join(t), home.join("disks").join(format!("{t}.img"))] {
            match fs::symlink_metadata(&p) {
                Ok(_) => found.push(format!("scratch left: {}", p.display())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => found.push(format!("cannot check {}: {e}", p.display())),
            }
        }
    }
    found
}

/// Reaps `pid` when it is a zombie child of this test process (a sandbox
/// init orphaned by a killed daemon is reparented here, a subreaper): it
/// has exited, only its exit status was left to collect.
fn reaped_here(pid: &str, stat: &str) -> bool {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return false };
    let mut fields = rest.split(' ');
    let (state, ppid) = (fields.next(), fields.next().and_then(|p| p.parse::<u32>().ok()));
    let Ok(pid) = pid.parse::<i32>() else { return false };
    if state != Some("Z") || ppid != Some(std::process::id()) {
        return false;
    }
    let mut status = 0;
    // SAFETY: waitpid on one pid with a valid out pointer.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}

/// Visits every cgroup directory under `dir` (all hierarchies, v1 and v2).
fn walk_cgroups(dir: &Path, depth: usize, visit: &mut impl FnMut(&Path)) -> io::Result<()> {
    if depth > 8 {
        return Ok(());
    }
    for e in fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            visit(&e.path());
            match walk_cgroups(&e.path(), depth + 1, visit) {
                // A cgroup removed while it is walked.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                r => r?,
            }
        }
    }
    Ok(())
}
