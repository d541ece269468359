//! The README's tour of the CLI runs as written, line by line, in one
//! bash (`readme_tour.py` beside this file), against the daemon its first
//! line starts in a home of the test's own. The test makes what the tour
//! takes to be the reader's own (a source tree, data.csv, summary.txt,
//! token.txt, a root filesystem archive, an OCI layout, a docker archive);
//! the lines that name unreachable example hosts, start an alternative
//! daemon, want a person at a terminal or write outside the test's
//! directories are not run, and are listed here, so a new such line fails
//! the test until it is. Needs root, busybox and skopeo.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cairn_image::testing::{host_arch, tagged, LayerBlob, LayerTar, OciLayout};
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A busybox root filesystem as a layer tar.
fn busybox_rootfs() -> Vec<u8> {
    let path = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    let busybox = fs::read(path.expect("the tour's images need a static busybox on the host")).unwrap();
    let mut t = LayerTar::new().dir("bin").executable("bin/busybox", &busybox);
    for applet in ["sh", "cat", "ls", "echo", "id"] {
        t = t.symlink(&format!("bin/{applet}"), "busybox");
    }
    for d in ["proc", "dev", "tmp", "workspace", "etc"] {
        t = t.dir(d);
    }
    t.file("etc/hostname", b"tour\n").finish()
}

/// What the tour takes to be the reader's own, in `dir`.
fn readers_files(dir: &Path) {
    fs::create_dir_all(dir.join("src")).unwrap();
    fs::write(dir.join("src/main.py"), "print('hello')\n").unwrap();
    fs::write(dir.join("data.csv"), "a,b\n1,2\n").unwrap();
    fs::write(dir.join("summary.txt"), "tests green after the parser fix\n").unwrap();
    fs::write(dir.join("token.txt"), "ghp_example_token\n").unwrap();
    let rootfs = busybox_rootfs();
    fs::write(dir.join("alpine-rootfs.tar.gz"), cairn_image::testing::gzip(&rootfs)).unwrap();
    let layout = OciLayout::create(&dir.join("python-oci"));
    let m = layout.add_image(&[LayerBlob::gzip(&rootfs)], host_arch(), json!({"Env": ["PATH=/bin", "B=image"], "WorkingDir": "/workspace", "Cmd": ["/bin/sh"]}));
    layout.write_index(&[tagged(m, "3.12")]);
    let mut skopeo = Command::new("skopeo");
    skopeo
        .args(["copy", "--insecure-policy"])
        .arg(format!("oci:{}:3.12", dir.join("python-oci").display()))
        .arg(format!("docker-archive:{}:app:v1", dir.join("app.tar").display()))
        .stdin(Stdio::null());
    let out = common::output_within(&mut skopeo, Duration::from_secs(60));
    assert!(out.status.success(), "skopeo (scripts/setup-debian.sh installs it) could not write the docker archive: {}", String::from_utf8_lossy(&out.stderr));
}

/// The lines the tour does not run, each for the reason its rule gives.
const NOT_RUN: [&str; 9] = [
    "cairn serve --store postgres://cairn@db.example/cairn &",
    "cairn serve --node alpha &",
    "cairn serve --store postgres://cairn@db.example/cairn --blob s3://snaps/pool --node beta --capacity 50 \\",
    "cairn exec -it $T -- bash",
    "cairn task watch $T",
    "cairn image pull registry.example.com/python:3.12-slim",
    "cairn hooks test HOOK",
    "CAIRN_HOME=/var/lib/cairn-new cairn restore node.tar",
    "cairn completions bash > /etc/bash_completion.d/cairn",
];

#[test]
fn the_readme_tour_of_the_cli_runs_as_written() {
    common::require_root();
    let work = tempfile::Builder::new().prefix("cairn-tour-").tempdir_in("/var/tmp").unwrap();
    let home = work.path().join("home");
    let dir = work.path().join("reader");
    fs::create_dir_all(&dir).unwrap();
    readers_files(&dir);
    let cairn = Path::new(common::CAIRN);
    let path = format!("{}:{}", cairn.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("crates/cli/tests/readme_tour.py"))
        .arg(repo_root().join("README.md"))
        .arg(&dir)
        .env("CAIRN_HOME", &home)
        .env("PATH", path)
        .env_remove("CAIRN_URL")
        .env_remove("CAIRN_TOKEN")
        .stdin(Stdio::null());
    let out = common::output_within(&mut cmd, Duration::from_secs(900));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // Whatever happened, the tour's daemon and its tasks go.
    stop_the_tours_daemon(&home, &dir);
    assert!(out.status.success(), "the tour stopped:\n{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    eprintln!("the tour: {summary}");
    let skipped: Vec<&str> = summary["skipped"].as_object().unwrap().keys().map(String::as_str).collect();
    let mut want = NOT_RUN.to_vec();
    want.sort_unstable();
    assert_eq!(skipped, want, "the lines not run: {summary}");
    assert!(summary["ran"].as_u64() >= Some(60), "{summary}");
    // What the tour delivered verifies, as its own line said.
    assert!(dir.join("delivered/record.json").is_file() && dir.join("node.tar").is_file() && dir.join("hi").is_file());
}

/// Destroys every task of the tour's daemon, then stops it (by the pid its
/// first line's `&` left in daemon.pid).
fn stop_the_tours_daemon(home: &Path, dir: &Path) {
    let cli = |args: &[&str]| common::output_within(Command::new(common::CAIRN).args(args).env("CAIRN_HOME", home).env_remove("CAIRN_URL").env_remove("CAIRN_TOKEN").stdin(Stdio::null()), Duration::from_secs(120));
    let listed = cli(&["--json", "task", "list", "--all"]);
    if let Ok(Value::Array(tasks)) = serde_json::from_slice::<Value>(&listed.stdout) {
        for t in tasks.iter().filter(|t| t["state"] != "destroyed") {
            cli(&["destroy", t["id"].as_str().unwrap_or_default()]);
        }
    }
    if let Ok(pid) = fs::read_to_string(dir.join("daemon.pid")) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            for _ in 0..100 {
                if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
