//! Running the daemon as an operator does: under systemd (`cairn serve
//! --systemd` tells a `Type=notify` unit when it is ready and when it
//! stops, through `NOTIFY_SOCKET`, here a datagram socket the test binds as
//! systemd would), and the shell completions.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The next message systemd would get, at most `limit` away.
fn next_message(sock: &UnixDatagram, limit: Duration) -> String {
    sock.set_read_timeout(Some(limit)).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = sock.recv(&mut buf).unwrap_or_else(|e| panic!("no sd_notify message within {limit:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn serve_tells_systemd_when_it_is_ready_and_when_it_stops() {
    common::require_root();
    let dir = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let home = dir.path().join("home");
    let socket = dir.path().join("notify");
    let sock = UnixDatagram::bind(&socket).unwrap();
    let child = Command::new(common::CAIRN)
        .args(["serve", "--systemd", "--listen", "127.0.0.1:0"])
        .env("CAIRN_HOME", &home)
        .env("NOTIFY_SOCKET", &socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Ready only once it answers: the URL it announces is served.
    let ready = next_message(&sock, Duration::from_secs(60));
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    let url = std::fs::read_to_string(home.join("url")).unwrap().trim().to_owned();
    assert!(ready.lines().any(|l| l == format!("STATUS=listening on {url}")), "{ready:?}");
    let health = common::run(Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", &format!("{url}/v1/openapi.json")])).unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout), "200");

    // SAFETY: kill has no memory-safety preconditions; pid is our child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let stopping = next_message(&sock, Duration::from_secs(30));
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let out = common::output_of(child, Duration::from_secs(60)).unwrap();
    assert!(out.status.success(), "the daemon stops cleanly on SIGTERM: {}", String::from_utf8_lossy(&out.stderr));

    // Without a NOTIFY_SOCKET (not under systemd) the flag only warns.
    let mut lone = Command::new(common::CAIRN)
        .args(["serve", "--systemd", "--listen", "127.0.0.1:0"])
        .env("CAIRN_HOME", &home)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(home.join("url")).map(|u| u.trim() == url).unwrap_or(true) {
        assert!(std::time::Instant::now() < deadline, "the daemon did not start again");
        assert!(lone.try_wait().unwrap().is_none(), "the daemon exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The URL is written before the daemon serves and handles signals: wait
    // until it answers, as systemd's READY=1 says above.
    let lone_url = std::fs::read_to_string(home.join("url")).unwrap().trim().to_owned();
    loop {
        let health = common::run(Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", &format!("{lone_url}/v1/openapi.json")])).unwrap();
        if String::from_utf8_lossy(&health.stdout) == "200" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the daemon did not answer");
        assert!(lone.try_wait().unwrap().is_none(), "the daemon exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(lone.id() as i32, libc::SIGTERM) }, 0);
    let out = common::output_of(lone, Duration::from_secs(60)).unwrap();
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("--systemd: no NOTIFY_SOCKET"), "{log}");
    assert!(!log.contains('\u{1b}'), "no colour codes in a log that is not a terminal: {log}");
}

#[test]
fn completions_for_each_shell_and_one_line_for_another() {
    for (shell, mark) in [("bash", "complete -F _cairn"), ("zsh", "#compdef cairn"), ("fish", "complete -c cairn"), ("elvish", "cairn"), ("powershell", "cairn")] {
        let out = common::run(Command::new(common::CAIRN).args(["completions", shell])).unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(mark) && script.contains("hooks") && script.contains("snapshot"), "{shell}: {script}");
    }
    // The bash script completes for real: bash loads it and offers the verbs.
    let out = common::run(Command::new("bash").args([
        "-c",
        &format!("source <({} completions bash); COMP_WORDS=(cairn ho); COMP_CWORD=1; _cairn cairn ho cairn; printf '%s\\n' \"${{COMPREPLY[@]}}\"", common::CAIRN),
    ]))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hooks", "{}", String::from_utf8_lossy(&out.stderr));
    let out = common::run(Command::new(common::CAIRN).args(["completions", "tcsh"])).unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(!out.status.success() && !err.contains('\n') && err.starts_with("cairn: completions for \"tcsh\": the shells are bash"), "{err}");
}

/// Unmounts a mount the test made, also when it fails.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = common::run(Command::new("umount").arg(&self.0));
    }
}

fn doctor(home: &std::path::Path, json: bool) -> (i32, String) {
    let mut cmd = Command::new(common::CAIRN);
    if json {
        cmd.arg("--json");
    }
    let out = common::run(cmd.arg("doctor").env("CAIRN_HOME", home).env_remove("CAIRN_URL")).unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn doctor_finds_this_host_ready_and_names_what_falls_short() {
    // This host runs the whole suite: nothing Cairn needs is missing, and a
    // running daemon is found and asked.
    let d = common::Daemon::start();
    let (code, text) = doctor(d.home(), false);
    assert_eq!(code, 0, "{text}");
    for check in ["kernel", "user namespaces", "overlayfs", "cgroups", "seccomp", "loop devices", "openat2", "gVisor", "disk room", "home", "clock"] {
        assert!(text.lines().any(|l| (l.starts_with("ok") || l.starts_with("warn")) && l[6..].starts_with(check)), "{check}: {text}");
    }
    assert!(text.lines().any(|l| l.starts_with("ok    daemon") && l.contains("running at http://127.0.0.1:")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ok    home") && l.contains("(700)")), "the daemon made its home 0700: {text}");
    let (code, json) = doctor(d.home(), true);
    assert_eq!(code, 0);
    let findings: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(findings.as_array().unwrap().len(), 12, "{findings}");
    assert!(findings.as_array().unwrap().iter().all(|f| ["ok", "warn"].contains(&f["level"].as_str().unwrap()) && f["detail"].is_string()));
    drop(d);

    // A home others can read is a warning; a filesystem without room fails.
    let dir = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    let open_home = dir.path().join("open");
    std::fs::create_dir(&open_home).unwrap();
    std::fs::set_permissions(&open_home, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, text) = doctor(&open_home, false);
    assert_eq!(code, 0, "{text}");
    assert!(text.lines().any(|l| l.starts_with("warn  home") && l.contains("755: others may read it")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ok    daemon") && l.contains("not running")), "{text}");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = common::run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=512k", "cairn-doctor-test"]).arg(&small)).unwrap();
    assert!(mounted.status.success(), "mount tmpfs: {}", String::from_utf8_lossy(&mounted.stderr));
    let _unmount = Unmount(small.clone());
    let (code, text) = doctor(&small.join("home"), false);
    assert_eq!(code, 1, "no room fails the check: {text}");
    let line = text.lines().find(|l| l.starts_with("FAIL  disk room")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(&small.display().to_string()) && line.contains("at least 1 GiB"), "{line}");
}

#[test]
fn a_command_line_clap_refuses_is_one_line_with_the_usage_and_exec_says_where_the_command_goes() {
    let out = common::run(Command::new(common::CAIRN).args(["exec", "some-task", "echo", "hi"])).unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains('\n'), "one line: {err:?}");
    assert!(err.starts_with("cairn: unexpected argument 'echo' found; the command goes after --, as in `cairn exec TASK -- echo hi`"), "{err}");
    assert!(err.contains("(usage: cairn exec [OPTIONS] <TASK> [-- <ARGV>...])"), "{err}");
    let out = common::run(Command::new(common::CAIRN).args(["snapshot", "--no-such-flag"])).unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(out.status.code() == Some(2) && !err.contains('\n') && err.starts_with("cairn: unexpected argument '--no-such-flag'") && !err.contains("goes after --"), "{err}");
    // Help is still help, on stdout.
    let out = common::run(Command::new(common::CAIRN).args(["exec", "--help"])).unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Usage: cairn exec"));
}

/// A lease outside 3 s to 10 min is refused before the daemon starts, in
/// one line naming the flag and the bounds; a lease inside them is taken
/// (the cluster tests run on `--lease 4s`).
#[test]
fn a_lease_out_of_bounds_is_refused_in_one_line() {
    let dir = tempfile::Builder::new().prefix("cairn-test-").tempdir_in("/var/tmp").unwrap();
    for bad in ["1s", "2h", "soon"] {
        let out = common::output_within(
            Command::new(common::CAIRN).args(["serve", "--listen", "127.0.0.1:0", "--lease", bad]).env("CAIRN_HOME", dir.path().join("home")).stdin(Stdio::null()),
            Duration::from_secs(60),
        );
        assert!(!out.status.success(), "--lease {bad} was taken");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        assert!(err.starts_with("cairn: --lease: ") && !err.contains('\n'), "{bad}: {err}");
    }
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "[node]\nlease = \"1s\"\n").unwrap();
    let out = common::output_within(
        Command::new(common::CAIRN).args(["serve", "--listen", "127.0.0.1:0", "--config"]).arg(&file).env("CAIRN_HOME", dir.path().join("home")).stdin(Stdio::null()),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("node.lease") && err.contains("outside 3s to 10m"), "{err}");
}
