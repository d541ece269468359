//! Nothing a sandbox makes becomes a privilege on the host
//! (docs/security.md, "What a sandbox's content can become on the host").
//!
//! An agent makes a set-uid root program and a program with file
//! capabilities; the task is committed as a template and forked, so the
//! daemon writes both into its layer store on the host. Every set-id or
//! capability file in the home must then be powerless for a host user,
//! while inside a task from the template the program still runs set-uid,
//! as the image says. Each denial has its positive control: the same bytes
//! with the same mode outside the home do give privilege, so the probe
//! would see it. Needs root, and `setcap`/`getcap` (libcap2-bin) on the
//! host; the host image brings them into the sandbox too.

#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Daemon;

/// What the agent does as root inside: `sid` is `id` set-uid root, `capgrep`
/// is `grep` with CAP_SETUID and CAP_DAC_OVERRIDE effective (it prints its
/// own capability sets when asked to grep /proc/self/status).
const MAKE: &str = "cp /usr/bin/id /workspace/sid && chmod 4755 /workspace/sid \
    && cp /usr/bin/grep /workspace/capgrep && /usr/sbin/setcap cap_setuid,cap_dac_override+ep /workspace/capgrep \
    && stat -c '%A %u' /workspace/sid";

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

/// Runs `cmd` inside the task as uid and gid 65534.
fn as_nobody_inside(d: &Daemon, task: &str, cmd: &[&str]) -> String {
    let mut args = vec!["exec", "--user", "65534:65534", task, "--"];
    args.extend_from_slice(cmd);
    let out = d.cairn(&args);
    assert!(out.status.success(), "{cmd:?} as 65534 in {task}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the file at `path` on the host as uid and gid 65534, with `args`.
/// The file is opened by this (root) process and executed through its
/// descriptor, so the home's 0700 does not stand in the way: what decides
/// is the mount the file is on.
fn as_nobody_on_host(path: &Path, args: &[&str]) -> String {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // Not close-on-exec: the child executes it as /proc/self/fd/N.
    // SAFETY: open with a valid NUL-terminated path; the descriptor is
    // closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH) };
    assert!(fd >= 0, "open {}: {}", path.display(), std::io::Error::last_os_error());
    let out = common::run(Command::new(format!("/proc/self/fd/{fd}")).args(args).uid(65534).gid(65534));
    // SAFETY: closing the descriptor opened above, once.
    unsafe { libc::close(fd) };
    let out = out.unwrap_or_else(|e| panic!("run {} as 65534: {e}", path.display()));
    assert!(out.status.success(), "{} as 65534: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The effective capability set a `capgrep` run printed.
fn cap_eff(status_lines: &str) -> u64 {
    let line = status_lines.lines().find(|l| l.starts_with("CapEff:")).unwrap_or_else(|| panic!("no CapEff in {status_lines:?}"));
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).unwrap()
}

/// Every regular file under `root` with a set-id bit (a walk that never
/// follows a link).
fn setid_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && m.mode() & 0o6000 != 0 {
                found.push(e.path());
            }
        }
    }
    found
}

/// Files under `root` that carry file capabilities, as `getcap -r` lists them.
fn capability_files(root: &Path) -> Vec<PathBuf> {
    let out = common::run(Command::new("/usr/sbin/getcap").arg("-r").arg(root)).expect("getcap (install libcap2-bin)");
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(PathBuf::from).collect()
}

fn nosuid(path: &Path) -> bool {
    nix::sys::statvfs::statvfs(path).unwrap().flags().contains(nix::sys::statvfs::FsFlags::ST_NOSUID)
}

#[test]
fn setid_and_capability_files_a_sandbox_made_are_powerless_on_the_host_and_work_inside() {
    let d = Daemon::start();
    let src = d.create(&[]);
    assert!(must(&d, &src, MAKE).starts_with("-rwsr-xr-x 0"), "the agent made a set-uid root program");
    // Inside the task itself: set-uid works (no no_new_privs), and so do
    // file capabilities, both bounded by the sandbox.
    assert!(as_nobody_inside(&d, &src, &["/workspace/sid"]).contains("euid=0"), "set-uid inside");
    assert_ne!(cap_eff(&as_nobody_inside(&d, &src, &["/workspace/capgrep", "Cap", "/proc/self/status"])), 0, "capabilities inside");

    d.ok(&["image", "commit", &src, "with-setid"]);
    let snap = d.json(&["snapshot", &src, "--note", "made them"]);
    let forks = d.json(&["fork", &src, "--from", snap["id"].as_str().unwrap()]);
    let fork = forks[0]["id"].as_str().or_else(|| forks["tasks"][0]["id"].as_str()).unwrap_or_else(|| panic!("fork answered {forks}")).to_owned();

    // On the host: the bits are kept in the layer store (a template must
    // keep them), and every such file is on a nosuid mount.
    let home = fs::canonicalize(d.home()).unwrap();
    let setid = setid_files(&home);
    let ours: Vec<&PathBuf> = setid.iter().filter(|p| p.file_name().is_some_and(|n| n == "sid")).collect();
    // The template's layer holds it as root's (the task's disks hold it as
    // their sandboxes' mapped root).
    let layers = home.join("layers");
    assert!(ours.iter().any(|p| p.starts_with(&layers)), "the template keeps the set-uid program: found {setid:?}");
    for f in &setid {
        assert!(nosuid(f), "{} is set-id on a mount without nosuid", f.display());
    }
    for f in &ours {
        let m = fs::metadata(f).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o4755, "{} kept its mode", f.display());
        if f.starts_with(&layers) {
            assert_eq!(m.uid(), 0, "{} is root's in the template", f.display());
        }
        let id = as_nobody_on_host(f, &[]);
        assert!(id.contains("uid=65534") && !id.contains("euid="), "{} gave a host user {id:?}", f.display());
    }
    let caps = capability_files(&home);
    for f in &caps {
        assert!(nosuid(f), "{} has file capabilities on a mount without nosuid", f.display());
        if f.file_name().is_some_and(|n| n == "capgrep") {
            assert_eq!(cap_eff(&as_nobody_on_host(f, &["Cap", "/proc/self/status"])), 0, "{} gave a host user capabilities", f.display());
        }
    }

    // Positive controls: the same program, set-uid root or with the same
    // capabilities outside the home, does give privilege, so the probes
    // above would have seen it.
    let outside = tempfile::Builder::new().prefix("cairn-setid-control-").tempdir_in("/var/tmp").unwrap();
    assert!(!nosuid(outside.path()), "the control needs a mount without nosuid");
    let control = outside.path().join("sid");
    fs::copy(ours.iter().find(|p| p.starts_with(&layers)).unwrap(), &control).unwrap();
    std::os::unix::fs::chown(&control, Some(0), Some(0)).unwrap();
    fs::set_permissions(outside.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&control, fs::Permissions::from_mode(0o4755)).unwrap();
    assert!(as_nobody_on_host(&control, &[]).contains("euid=0"), "the control is set-uid root for a host user");
    let capcontrol = outside.path().join("capgrep");
    fs::copy("/usr/bin/grep", &capcontrol).unwrap();
    let set = common::run(Command::new("/usr/sbin/setcap").args(["cap_setuid,cap_dac_override+ep"]).arg(&capcontrol)).unwrap().status;
    assert!(set.success());
    assert_ne!(cap_eff(&as_nobody_on_host(&capcontrol, &["Cap", "/proc/self/status"])), 0, "the control has capabilities for a host user");

    // In a task from the template, and in the fork, the program still runs
    // set-uid inside, as the image says.
    let from_template = d.create(&["--image", "with-setid"]);
    for t in [&from_template, &fork] {
        assert!(as_nobody_inside(&d, t, &["/workspace/sid"]).contains("euid=0"), "set-uid inside {t}");
    }
    for t in [&from_template, &fork, &src] {
        d.ok(&["destroy", t]);
    }
    d.ok(&["image", "rm", "with-setid"]);
}

#[test]
fn cp_out_of_a_task_never_writes_a_setid_bit_on_the_host() {
    let d = Daemon::start();
    let t = d.create(&[]);
    must(&d, &t, "cp /usr/bin/id /workspace/sid && chmod 6755 /workspace/sid && cp /usr/bin/id /workspace/plain && chmod 750 /workspace/plain");
    let out = tempfile::Builder::new().prefix("cairn-cp-").tempdir_in("/var/tmp").unwrap();
    for name in ["sid", "plain"] {
        d.ok(&["cp", &format!("{t}:/workspace/{name}"), out.path().join(name).to_str().unwrap()]);
    }
    let mode = |n: &str| fs::metadata(out.path().join(n)).unwrap().mode() & 0o7777;
    assert_eq!(mode("sid"), 0o755, "set-id bits dropped, the rest kept");
    assert_eq!(mode("plain"), 0o750, "positive control: modes are otherwise kept as they were");
    d.ok(&["destroy", &t]);
}

/// A home that existed, open to everyone, is private once a daemon ran on
/// it: the directory 0700 and the database (it holds every task's webhook
/// secret) 0600.
#[test]
fn a_home_that_existed_with_0755_is_0700_and_its_database_0600() {
    let d = Daemon::start_prepared(|home| fs::set_permissions(home, fs::Permissions::from_mode(0o755)).unwrap(), &[]);
    let t = d.create(&[]);
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(d.home()), 0o700);
    for f in ["cairn.db", "token"] {
        assert_eq!(mode(&d.home().join(f)), 0o600, "{f}");
    }
    for dir in ["layers", "images", "blobs", "run", "disks", "keys"] {
        let p = d.home().join(dir);
        if p.exists() {
            assert_eq!(mode(&p), 0o700, "{dir}");
        }
    }
    d.ok(&["destroy", &t]);
}
