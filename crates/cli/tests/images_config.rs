//! An OCI image's config applies to the tasks started from it: its `Env`
//! under the task's own, its `WorkingDir` unless the task chose one, its
//! `User` (a uid:gid, or a name looked up in the image's /etc/passwd and
//! /etc/group inside the sandbox) for every command unless the exec names
//! another, and its `Entrypoint` + `Cmd` for an exec without a command.
//! `image inspect` shows it. Needs root, and busybox on the host (the
//! image's shell).

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use cairn_image::testing::{tagged, LayerBlob, LayerTar, OciLayout};
use common::Daemon;
use serde_json::{json, Value};

fn busybox() -> Vec<u8> {
    let path = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    fs::read(path.expect("these tests need a static busybox on the host (the image's shell)")).unwrap()
}

/// busybox as the shell, with a user `app` (1000:1000, also in group
/// `staff`) in /etc/passwd and /etc/group.
fn layer() -> LayerBlob {
    let mut t = LayerTar::new().dir("bin").executable("bin/busybox", &busybox());
    for applet in ["sh", "cat", "ls", "echo", "id", "pwd", "env", "touch", "test"] {
        t = t.symlink(&format!("bin/{applet}"), "busybox");
    }
    for d in ["proc", "dev", "tmp", "workspace", "etc", "home", "home/app"] {
        t = t.dir(d);
    }
    let tar = t
        .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n")
        .file("etc/group", b"root:x:0:\napp:x:1000:\nstaff:x:50:app\n")
        .finish();
    LayerBlob::gzip(&tar)
}

/// A layout of one image with `run` as its config's `config` object.
fn layout(run: Value) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix("cairn-oci-config-").tempdir_in("/var/tmp").unwrap();
    let dir = tmp.path().join("layout");
    let l = OciLayout::create(&dir);
    let m = l.add_image(&[layer()], cairn_image::testing::host_arch(), run);
    l.write_index(&[tagged(m, "latest")]);
    (tmp, dir)
}

fn import(d: &Daemon, name: &str, run: Value) {
    let (_tmp, dir) = layout(run);
    d.ok(&["image", "import", name, dir.to_str().unwrap()]);
}

fn config(user: &str) -> Value {
    json!({
        "Env": ["PATH=/bin", "A=image", "B=image"],
        "WorkingDir": "/srv/app",
        "User": user,
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo from-cmd; id -u"],
    })
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

#[test]
fn a_task_takes_the_images_env_workdir_user_and_default_command() {
    common::require_root();
    let d = Daemon::start();
    import(&d, "cfg", config("1000:1000"));

    let id = d.create(&["--image", "cfg", "--env", "B=task"]);
    assert_eq!(must(&d, &id, "echo $A $B"), "image task\n", "the image's Env, the task's --env on top");
    assert_eq!(must(&d, &id, "pwd"), "/srv/app\n");
    assert_eq!(must(&d, &id, "id -u; id -g"), "1000\n1000\n");
    // HOME comes from the user's /etc/passwd entry.
    assert_eq!(must(&d, &id, "echo $HOME"), "/home/app\n");
    // What the user may not do: write where only root may.
    let (code, _, _) = d.sh(&id, "touch /etc/x");
    assert_ne!(code, 0, "user 1000 cannot write /etc");
    // Positive control: root, named by the exec, can.
    let out = d.ok(&["exec", "--user", "0", &id, "--", "sh", "-c", "touch /etc/x && id -u"]);
    assert_eq!(out, "0\n");

    // No command: the image's Entrypoint + Cmd, as its user.
    assert_eq!(d.ok(&["exec", &id]), "from-cmd\n1000\n");
    // A command given runs as given (no Entrypoint in front).
    assert_eq!(d.ok(&["exec", &id, "--", "echo", "as-given"]), "as-given\n");

    // The task records the config; it survives a daemon restart.
    let t = d.task(&id);
    assert_eq!(t["config"]["user"], "1000:1000");
    assert_eq!(t["config"]["workdir"], "/srv/app");
    assert_eq!(t["config"]["entrypoint"], json!(["/bin/sh", "-c"]));

    // --workdir on create wins over the image's.
    let other = d.create(&["--image", "cfg", "--workdir", "/tmp"]);
    assert_eq!(must(&d, &other, "pwd"), "/tmp\n");

    // image inspect shows the config and the layers.
    let v = d.json(&["image", "inspect", "cfg"]);
    assert_eq!(v["kind"], "oci");
    assert_eq!(v["config"]["user"], "1000:1000");
    assert_eq!(v["config"]["working_dir"], "/srv/app");
    assert_eq!(v["config"]["cmd"], json!(["echo from-cmd; id -u"]));
    assert_eq!(v["layer_details"].as_array().unwrap().len(), 1);
    assert!(v["manifest_digest"].as_str().unwrap().starts_with("sha256:"));
    let human = d.ok(&["image", "inspect", "cfg"]);
    assert!(human.contains("user:        1000:1000") && human.contains("layers:    1"), "{human}");
    let list = d.ok(&["image", "list"]);
    assert!(list.lines().any(|l| l.starts_with("cfg") && l.contains("oci")), "{list}");
    let err = d.fails(&["image", "inspect", "nosuch"]);
    assert!(err.contains("nosuch"), "{err}");
}

#[test]
fn a_named_user_is_looked_up_in_the_sandbox_and_an_unknown_one_fails_in_one_line() {
    common::require_root();
    let d = Daemon::start();
    import(&d, "named", config("app"));
    import(&d, "ghost", config("ghost"));

    let id = d.create(&["--image", "named"]);
    assert_eq!(must(&d, &id, "id -u; id -g; id -G"), "1000\n1000\n1000 50\n", "app, its group and its membership of staff");
    assert_eq!(d.ok(&["exec", &id, "--user", "app:staff", "--", "id", "-g"]), "50\n");

    // The unknown name fails every exec, with one line naming it...
    let bad = d.create(&["--image", "ghost"]);
    let (code, out, err) = d.sh(&bad, "echo ran");
    assert_eq!(code, 127, "{out}{err}");
    let err = err.trim();
    assert!(err.contains("\"ghost\"") && err.contains("/etc/passwd") && !err.contains('\n'), "{err}");
    assert_eq!(out, "");
    // ...and so does one an exec names.
    let out = d.cairn(&["exec", "--user", "nobody-here", &id, "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nobody-here") && err.trim().lines().count() == 1, "{err}");
    // A malformed user is refused before anything runs.
    let err = d.fails(&["exec", "--user", "a:b:c", &id, "--", "true"]);
    assert!(err.contains("invalid user"), "{err}");
    // Positive control: the same task runs as a user that exists.
    assert_eq!(d.ok(&["exec", "--user", "0", &bad, "--", "id", "-u"]), "0\n");
}

#[test]
fn an_exec_without_a_command_needs_a_default_one() {
    common::require_root();
    let d = Daemon::start();
    import(&d, "plain", json!({"Env": ["PATH=/bin"]}));
    let id = d.create(&["--image", "plain"]);
    let err = d.fails(&["exec", &id]);
    assert!(err.contains("no command given") && err.contains("plain"), "{err}");
    // Positive control: with a command it runs, as root in /workspace.
    assert_eq!(must(&d, &id, "id -u; pwd"), "0\n/workspace\n");
}
