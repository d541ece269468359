//! Bad input through the real CLI: every refusal is one clear line and a
//! non-zero exit, changes nothing, and sits next to a control that works.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Daemon;
use serde_json::Value;

fn tasks(d: &Daemon) -> Value {
    d.json(&["task", "list"])
}

/// Like [`Daemon::fails`], for a prepared command.
fn fails_cmd(mut cmd: Command) -> String {
    let out = common::run(cmd.stdin(Stdio::null())).expect("run cairn");
    assert!(!out.status.success(), "{cmd:?} should have failed: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(err.starts_with("cairn: ") && !err.contains('\n'), "want one line starting with 'cairn: ', got {err:?}");
    err
}

#[test]
fn unknown_task_ids_and_names() {
    let d = Daemon::start();
    let id = d.create(&["--name", "real"]);
    let before = tasks(&d);
    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("f.txt");
    std::fs::write(&file, "x").unwrap();
    let out = local.path().join("out.txt");
    for missing in ["tzzzzzzzzzzz", "no-such-task"] {
        let cp_in_dst = format!("{missing}:/workspace/");
        let cp_out_src = format!("{missing}:/etc/hostname");
        let calls: [&[&str]; 6] = [
            &["task", "show", missing],
            &["exec", missing, "--", "true"],
            &["cp", file.to_str().unwrap(), &cp_in_dst],
            &["cp", &cp_out_src, out.to_str().unwrap()],
            &["log", missing],
            &["destroy", missing],
        ];
        for args in calls {
            let err = d.fails(args);
            assert!(err.contains("unknown task") && err.contains(missing), "{args:?}: {err}");
        }
    }
    assert!(!out.exists(), "a failed copy out writes nothing");
    assert_eq!(tasks(&d), before);
    // Positive controls: the real one by id and by name.
    for who in [id.as_str(), "real"] {
        assert_eq!(d.task(who)["id"], id.as_str());
        assert_eq!(d.sh(who, "echo ok").1, "ok\n");
        d.ok(&["log", who]);
    }
    d.ok(&["cp", file.to_str().unwrap(), &format!("{id}:/workspace/")]);
    d.ok(&["cp", "real:/workspace/f.txt", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "x");
}

#[test]
fn malformed_create_and_exec_arguments() {
    let d = Daemon::start();
    let id = d.create(&[]);
    d.sh(&id, "true");
    let before = tasks(&d);
    let cases: [(&[&str], &str); 9] = [
        (&["--image", "no-such-image"], "unknown image"),
        (&["--memory", "lots"], "lots"),
        (&["--cpus", "0"], "cpu"),
        (&["--pids", "1"], "pids"),
        (&["--disk", "1K"], "disk"),
        (&["--env", "NOEQUALS"], "NOEQUALS"),
        (&["--env", "1BAD=x"], "1BAD"),
        (&["--workdir", "relative/dir"], "relative/dir"),
        (&["--workdir", "/a/../b"], "/a/../b"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["task", "create"];
        args.extend_from_slice(extra);
        let err = d.fails(&args);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    let err = d.fails(&["task", "create", "--name", id.as_str()]);
    assert!(err.contains("name"), "a name that looks like an id: {err}");
    // Per exec: the command does not run and the step does not move.
    for (extra, want) in [(["--env", "NOEQUALS"], "NOEQUALS"), (["--workdir", "rel"], "rel")] {
        let mut args = vec!["exec"];
        args.extend_from_slice(&extra);
        args.extend_from_slice(&[&id, "--", "sh", "-c", "echo ran > /workspace/ran"]);
        let err = d.fails(&args);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    let err = d.fails(&["exec", "--timeout", "soon", &id, "--", "true"]);
    assert!(err.contains("soon"), "{err}");
    assert_eq!(tasks(&d), before, "nothing was created or changed");
    assert_eq!(d.sh(&id, "ls -A /workspace").1, "", "no refused command ran");

    // Positive control: the same flags, well formed.
    let good = d.create(&["--memory", "256M", "--cpus", "0.5", "--pids", "64", "--disk", "128M", "--env", "A=1", "--workdir", "/w"]);
    let t = d.task(&good);
    assert_eq!(
        (t["limits"]["memory"].as_str(), t["limits"]["cpus"].as_str(), t["limits"]["pids"].as_u64(), t["limits"]["disk"].as_str()),
        (Some("256M"), Some("0.5"), Some(64), Some("128M"))
    );
    assert_eq!(d.ok(&["exec", "--env", "B=2", "--workdir", "/tmp", &good, "--", "sh", "-c", "echo $A$B; pwd"]), "12\n/tmp\n");
}

#[test]
fn destroyed_tasks_refuse_exec_and_a_second_destroy() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let alive = d.create(&[]);
    let pid = d.task(&id)["sandbox_pid"].as_i64().unwrap() as i32;
    d.ok(&["destroy", &id]);
    assert_eq!(d.leftovers(&id, pid), Vec::<String>::new());
    let before = tasks(&d);
    let log_before = d.json(&["log", &id]);
    let err = d.fails(&["exec", &id, "--", "true"]);
    assert!(err.contains("destroyed") && err.contains("cannot run commands"), "{err}");
    let err = d.fails(&["destroy", &id]);
    assert!(err.contains("destroyed") && err.contains("again"), "{err}");
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = d.fails(&["cp", f.path().to_str().unwrap(), &format!("{id}:/workspace/")]);
    assert!(err.contains("destroyed"), "{err}");
    assert_eq!(tasks(&d), before);
    assert_eq!(d.json(&["log", &id]), log_before, "refusals of a destroyed task add nothing to its log");
    // Positive control: the other task is fine, and can be destroyed once.
    assert_eq!(d.sh(&alive, "echo yes").1, "yes\n");
    d.ok(&["destroy", &alive]);
}

#[test]
fn cp_stays_inside_the_sandbox() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let local = tempfile::tempdir().unwrap();
    let payload = local.path().join("payload");
    std::fs::write(&payload, "payload\n").unwrap();
    let host_passwd = std::fs::read("/etc/passwd").unwrap();
    let host_core = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    // Puts the host's core_pattern back should a regression let the probe
    // below through (the probe itself writes a harmless pattern).
    struct RestoreCorePattern(String);
    impl Drop for RestoreCorePattern {
        fn drop(&mut self) {
            if std::fs::read_to_string("/proc/sys/kernel/core_pattern").is_ok_and(|now| now != self.0) {
                let _ = std::fs::write("/proc/sys/kernel/core_pattern", self.0.trim_end());
            }
        }
    }
    let _restore = RestoreCorePattern(host_core.clone());
    let marker = format!("cairn-escape-{id}");

    // Positive control first.
    d.ok(&["cp", payload.to_str().unwrap(), &format!("{id}:/workspace/ok")]);
    assert_eq!(d.sh(&id, "cat /workspace/ok").1, "payload\n");
    assert_eq!(d.sh(&id, "ln -s ../../../../../../ /workspace/up && ln -s /etc /workspace/e").0, 0);
    let before = tasks(&d);

    // `..` above the sandbox root, both ways.
    let out = local.path().join("passwd");
    let err = d.fails(&["cp", &format!("{id}:/../../etc/passwd"), out.to_str().unwrap()]);
    assert!(err.contains("outside the sandbox"), "{err}");
    assert!(!out.exists());
    let err = d.fails(&["cp", payload.to_str().unwrap(), &format!("{id}:/../../tmp/{marker}")]);
    assert!(err.contains("outside the sandbox"), "{err}");
    assert!(!Path::new("/tmp").join(&marker).exists());

    // Through a symlink that climbs out.
    let err = d.fails(&["cp", payload.to_str().unwrap(), &format!("{id}:/workspace/up/{marker}")]);
    assert!(err.contains(&format!("path \"/workspace/up/{marker}\" is outside the sandbox")), "{err}");
    assert!(!Path::new("/").join(&marker).exists(), "written on the host's /");
    let err = d.fails(&["cp", &format!("{id}:/workspace/up/etc/passwd"), out.to_str().unwrap()]);
    assert!(err.contains("path \"/workspace/up/etc/passwd\" is outside the sandbox"), "{err}");
    assert!(!out.exists());

    // An absolute symlink resolves inside the sandbox, never on the host.
    let hostname = local.path().join("hostname");
    d.ok(&["cp", &format!("{id}:/workspace/e/hostname"), hostname.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&hostname).unwrap().trim(), "cairn", "the sandbox's /etc/hostname, not the host's");
    // Through the absolute link it lands in the sandbox's /etc.
    d.ok(&["cp", payload.to_str().unwrap(), &format!("{id}:/workspace/e/{marker}")]);
    assert!(!Path::new("/etc").join(&marker).exists(), "written on the host's /etc");

    // Kernel files are not files to copy.
    let core = local.path().join("core");
    std::fs::write(&core, "cairn-test-core.%p\n").unwrap();
    let err = d.fails(&["cp", core.to_str().unwrap(), &format!("{id}:/proc/sys/kernel/core_pattern")]);
    assert!(err.contains("core_pattern"), "{err}");
    let err = d.fails(&["cp", core.to_str().unwrap(), &format!("{id}:/proc/sys/kernel/")]);
    assert!(err.contains("/proc/sys/kernel"), "{err}");
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(), host_core, "host core_pattern changed");
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), host_passwd);

    // Not local to local, nor sandbox to sandbox.
    let err = d.fails(&["cp", payload.to_str().unwrap(), out.to_str().unwrap()]);
    assert!(err.contains("ID:/"), "{err}");
    let err = d.fails(&["cp", &format!("{id}:/workspace/ok"), &format!("{id}:/workspace/ok2")]);
    assert!(err.contains("between two sandboxes"), "{err}");

    assert_eq!(tasks(&d), before);
    assert_eq!(d.sh(&id, &format!("cat /etc/{marker}")).1, "payload\n", "landed in the sandbox's /etc");
    // Positive control after: the sandbox and cp still work.
    let back = local.path().join("back");
    d.ok(&["cp", &format!("{id}:/workspace/ok"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "payload\n");
}

/// One tar entry with a name and link name written as raw header bytes,
/// so the archive can say what the tar crate itself would refuse to.
fn raw_entry(b: &mut tar::Builder<std::fs::File>, kind: tar::EntryType, name: &str, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(if kind == tar::EntryType::Directory { 0o755 } else { 0o644 });
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

type Entry<'a> = (tar::EntryType, &'a str, &'a str, &'a [u8]);

fn archive(path: &Path, entries: &[Entry<'_>]) {
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (kind, name, link, data) in entries {
        raw_entry(&mut b, *kind, name, link, data);
    }
    b.finish().unwrap();
}

fn image_list(d: &Daemon) -> Value {
    d.json(&["image", "list"])
}

#[test]
fn malicious_image_archives() {
    use tar::EntryType::{Block, Char, Directory, Link, Regular, Symlink};
    let d = Daemon::start();
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::Builder::new().prefix("cairn-outside-").tempdir_in("/tmp").unwrap();
    let out = outside.path().to_str().unwrap().trim_start_matches('/').to_owned();
    let abs = format!("/{out}/abs");
    let dotdot = format!("../../../../../../../../{out}/dotdot");
    let outside_link = format!("/{out}");
    let cases: Vec<(&str, Vec<Entry<'_>>, &str)> = vec![
        ("absolute", vec![(Directory, "bin/", "", b""), (Regular, &abs, "", b"pwned\n")], "absolute path"),
        ("dotdot", vec![(Regular, "ok.txt", "", b"fine\n"), (Regular, &dotdot, "", b"pwned\n")], "'..'"),
        ("inner-dotdot", vec![(Regular, "a/../../x", "", b"pwned\n")], "'..'"),
        ("symlink-then-write", vec![(Symlink, "evil", &outside_link, b""), (Regular, "evil/pwned", "", b"pwned\n")], "evil"),
        ("hardlink-abs", vec![(Link, "passwd", "/etc/passwd", b"")], "hard link target is an absolute path"),
        ("hardlink-dotdot", vec![(Link, "x", "../x", b"")], "hard link target has a '..' component"),
        ("hardlink-dotdot-deep", vec![(Link, "x", "../../../../../../etc/passwd", b"")], "'..'"),
    ];
    let images_before = image_list(&d);
    let tasks_before = tasks(&d);
    for (name, entries, want) in &cases {
        let tar = work.path().join(format!("{name}.tar"));
        archive(&tar, entries);
        let err = d.fails(&["image", "import", &format!("bad-{name}"), tar.to_str().unwrap()]);
        assert!(err.contains(want) && (err.contains("unsafe") || err.contains("cannot")), "{name}: {err}");
        assert_eq!(image_list(&d), images_before, "{name}: image list changed");
        let left: Vec<_> = std::fs::read_dir(outside.path()).unwrap().flatten().map(|e| e.path()).collect();
        assert!(left.is_empty(), "{name}: wrote outside: {left:?}");
    }
    // Nothing half-made is left in the store either.
    let store: Vec<String> =
        std::fs::read_dir(d.home().join("images")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(store, ["host"], "{store:?}");
    assert_eq!(tasks(&d), tasks_before);

    // Device nodes are dropped and counted; the rest is imported.
    let devs = work.path().join("devs.tar");
    {
        let mut b = tar::Builder::new(std::fs::File::create(&devs).unwrap());
        raw_entry(&mut b, Directory, "dev/", "", b"");
        for (kind, name, major, minor) in [(Char, "dev/mem", 1, 1), (Block, "dev/sda", 8, 0)] {
            let mut h = tar::Header::new_gnu();
            h.set_path(name).unwrap();
            h.set_entry_type(kind);
            h.set_device_major(major).unwrap();
            h.set_device_minor(minor).unwrap();
            h.set_mode(0o666);
            h.set_size(0);
            h.set_cksum();
            b.append(&h, &b""[..]).unwrap();
        }
        raw_entry(&mut b, Regular, "etc/marker", "", b"devs\n");
        b.finish().unwrap();
    }
    let human = d.ok(&["image", "import", "devs", devs.to_str().unwrap()]);
    assert!(human.contains("dropped 2 device nodes"), "{human}");
    let v = image_list(&d);
    let img = v.as_array().unwrap().iter().find(|i| i["name"] == "devs").expect("devs imported");
    assert_eq!(img["dropped"]["devices"], 2);
    let rootfs = d.home().join("images/devs/rootfs");
    assert_eq!(std::fs::read_to_string(rootfs.join("etc/marker")).unwrap(), "devs\n");
    for node in ["dev/mem", "dev/sda"] {
        assert!(std::fs::symlink_metadata(rootfs.join(node)).is_err(), "{node} was created");
    }

    // Positive control: links that stay inside are fine.
    let good = work.path().join("good.tar");
    archive(
        &good,
        &[
            (Directory, "etc/", "", b""),
            (Regular, "etc/real", "", b"real\n"),
            (Link, "etc/hard", "etc/real", b""),
            (Symlink, "etc/soft", "real", b""),
            (Symlink, "etc/abs", "/etc/real", b""),
        ],
    );
    d.ok(&["image", "import", "good", good.to_str().unwrap()]);
    let root = d.home().join("images/good/rootfs");
    assert_eq!(std::fs::read_to_string(root.join("etc/hard")).unwrap(), "real\n");
    assert_eq!(std::fs::read_link(root.join("etc/abs")).unwrap(), Path::new("/etc/real"));
    let names: Vec<String> = image_list(&d).as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, ["devs", "good", "host"]);
    let left: Vec<_> = std::fs::read_dir(outside.path()).unwrap().flatten().collect();
    assert!(left.is_empty());

    // Not an archive at all, a missing path, a bad name.
    let junk = work.path().join("junk.tar");
    std::fs::write(&junk, "this is not a tar archive\n").unwrap();
    let err = d.fails(&["image", "import", "junk", junk.to_str().unwrap()]);
    assert!(err.contains("not a directory or a tar archive"), "{err}");
    let err = d.fails(&["image", "import", "gone", work.path().join("missing.tar").to_str().unwrap()]);
    assert!(err.contains("missing.tar"), "{err}");
    let err = d.fails(&["image", "import", "Bad/Name", good.to_str().unwrap()]);
    assert!(err.contains("Bad/Name"), "{err}");
    let err = d.fails(&["image", "import", "host", good.to_str().unwrap()]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(image_list(&d).as_array().unwrap().len(), 3);
}

/// `GET /v1/tasks` over a plain socket; returns the status line.
fn raw_get(url: &str, auth: Option<&str>) -> String {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = TcpStream::connect(addr).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    write!(s, "GET /v1/tasks HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn api_needs_the_token() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let before = tasks(&d);
    let token = std::fs::read_to_string(d.home().join("token")).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64);
    let status = |auth: Option<&str>| raw_get(&d.url, auth);
    assert!(status(None).starts_with("HTTP/1.1 401"), "{}", status(None));
    assert!(status(Some("Bearer wrong")).starts_with("HTTP/1.1 401"));
    assert!(status(Some(&format!("Bearer {token}x"))).starts_with("HTTP/1.1 401"));
    assert!(status(Some(&format!("Basic {token}"))).starts_with("HTTP/1.1 401"));
    assert!(status(Some(&format!("Bearer {token}"))).starts_with("HTTP/1.1 200"), "{}", status(Some(&format!("Bearer {token}"))));

    // The CLI with a wrong token, for a plain call and for exec.
    for args in [&["task", "list"][..], &["exec", &id, "--", "touch", "/workspace/x"][..]] {
        let mut c = d.cmd();
        c.env("CAIRN_TOKEN", "wrong").args(args);
        let err = fails_cmd(c);
        assert!(err.contains("token"), "{args:?}: {err}");
    }
    // The CLI against a port where nothing listens.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for args in [&["task", "list"][..], &["exec", &id, "--", "true"][..]] {
        let mut c = d.cmd();
        c.env("CAIRN_URL", format!("http://127.0.0.1:{port}")).args(args);
        let err = fails_cmd(c);
        assert!(err.contains("daemon not running") && err.contains("cairn serve"), "{args:?}: {err}");
    }
    // No url file at all: the same advice.
    let empty = tempfile::tempdir().unwrap();
    let mut c = d.cmd();
    c.env("CAIRN_HOME", empty.path()).args(["task", "list"]);
    let err = fails_cmd(c);
    assert!(err.contains("daemon not running") && err.contains("cairn serve"), "{err}");

    assert_eq!(tasks(&d), before);
    assert_eq!(d.sh(&id, "ls -A /workspace").1, "", "the refused exec did not run");
    // Positive control: the right token from the environment works too.
    let mut c = d.cmd();
    c.env("CAIRN_TOKEN", &token).env("CAIRN_URL", &d.url).args(["task", "show", &id]);
    assert!(common::run(&mut c).unwrap().status.success());
}
