//! Templates and forks that copy nothing: `cairn image commit` makes an
//! image from a task's writable layer, one more layer over the task's
//! image; a task created from it sees the committed files over the base
//! image's layers and starts with an empty layer of its own. A fork shares
//! its snapshot the same way, through a hidden base that goes with its last
//! task. Removal is refused while a task or a template uses an image. Needs
//! root, and busybox on the host (the image's shell).

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use cairn_image::testing::{LayerBlob, LayerTar, OciLayout};
use common::Daemon;

fn busybox() -> Vec<u8> {
    let path = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    fs::read(path.expect("these tests need a static busybox on the host (the image's shell)")).unwrap()
}

/// A two-layer OCI image: busybox and /etc/{a,b} below, /etc/a replaced
/// above; its config sets an environment variable.
fn import_base(d: &Daemon, name: &str) -> tempfile::TempDir {
    let mut t = LayerTar::new().dir("bin").executable("bin/busybox", &busybox());
    for applet in ["sh", "cat", "ls", "echo", "rm", "test", "mkdir", "wc", "head", "du"] {
        t = t.symlink(&format!("bin/{applet}"), "busybox");
    }
    for dir in ["proc", "dev", "tmp", "workspace", "etc"] {
        t = t.dir(dir);
    }
    let base = LayerBlob::gzip(&t.file("etc/a", b"base a\n").file("etc/b", b"base b\n").finish());
    let top = LayerBlob::gzip(&LayerTar::new().dir("etc").file("etc/a", b"top a\n").finish());
    let tmp = tempfile::Builder::new().prefix("cairn-tpl-").tempdir_in("/var/tmp").unwrap();
    let dir = tmp.path().join("layout");
    let layout = OciLayout::create(&dir);
    let image = layout.add_image(&[base, top], cairn_image::testing::host_arch(), serde_json::json!({ "Env": ["FROM_IMAGE=yes"] }));
    layout.write_index(&[image]);
    d.ok(&["image", "import", name, dir.to_str().unwrap()]);
    tmp
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| !n.starts_with(".tmp-") && n != ".lock").collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Entries in a task's writable root layer, on its disk.
fn upper_entries(d: &Daemon, task: &str) -> Vec<String> {
    let upper: PathBuf = d.home().join("run").join(task).join("disk/root/upper");
    let mut out = Vec::new();
    let mut pending = vec![upper.clone()];
    while let Some(dir) = pending.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let p = e.path();
            out.push(p.strip_prefix(&upper).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                pending.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_task_from_a_template_sees_the_committed_files_over_the_base_layers() {
    common::require_root();
    let d = Daemon::start();
    let _layout = import_base(&d, "base");
    let src = d.create(&["--image", "base"]);
    must(&d, &src, "mkdir -p /workspace/deps && head -c 3000000 /dev/urandom > /workspace/deps/lib.bin && echo prepared > /workspace/ready && echo changed > /etc/b && rm /etc/a");

    let out = d.ok(&["image", "commit", &src, "prepared"]);
    assert!(out.starts_with("committed prepared from task "), "{out}");
    let img = d.json(&["image", "inspect", "prepared"]);
    assert_eq!(img["kind"], "template");
    assert_eq!(img["parent"], "base");
    assert_eq!(img["committed"].as_array().unwrap().len(), 1, "one layer, for the root overlay: {img}");
    assert_eq!(img["config"]["env"], serde_json::json!(["FROM_IMAGE=yes"]), "the parent's run config");
    assert_eq!(img["layer_details"][0]["media_type"], "application/vnd.cairn.committed-layer");

    // Changes after the commit are not in the template.
    must(&d, &src, "echo later > /workspace/later");

    let t = d.create(&["--image", "prepared"]);
    assert_eq!(must(&d, &t, "cat /workspace/ready /etc/b; ls /etc; wc -c < /workspace/deps/lib.bin; echo $FROM_IMAGE"), "prepared\nchanged\nb\n3000000\nyes\n");
    assert_eq!(must(&d, &t, "test -e /workspace/later || echo absent"), "absent\n");
    assert_eq!(must(&d, &t, "cat /bin/busybox | wc -c").trim(), busybox().len().to_string(), "the base image's layers are below");
    // Its own layer starts empty: nothing was copied for it.
    let own: Vec<String> = upper_entries(&d, &t).into_iter().filter(|e| e != "workspace").collect();
    assert!(own.is_empty(), "a new task's writable layer holds {own:?}");

    // It writes only to its own layer: the source and the template keep theirs.
    must(&d, &t, "echo mine > /workspace/ready; rm /workspace/deps/lib.bin");
    assert_eq!(must(&d, &src, "cat /workspace/ready"), "prepared\n");
    let t2 = d.create(&["--image", "prepared"]);
    assert_eq!(must(&d, &t2, "cat /workspace/ready; wc -c < /workspace/deps/lib.bin"), "prepared\n3000000\n");

    // A snapshot, rollback and suspend/resume of a task on a template.
    let snap = d.json(&["snapshot", &t]);
    must(&d, &t, "echo worse > /workspace/ready");
    d.json(&["rollback", &t, "--to", snap["id"].as_str().unwrap(), "--reason", "back"]);
    assert_eq!(must(&d, &t, "cat /workspace/ready; test -e /workspace/deps/lib.bin || echo deleted"), "mine\ndeleted\n");
    d.ok(&["suspend", &t]);
    d.ok(&["resume", &t]);
    assert_eq!(must(&d, &t, "cat /workspace/ready /etc/b"), "mine\nchanged\n");

    // A template of a template.
    must(&d, &t2, "echo second > /workspace/second");
    d.ok(&["image", "commit", &t2, "second"]);
    let t3 = d.create(&["--image", "second"]);
    assert_eq!(must(&d, &t3, "cat /workspace/second /workspace/ready; wc -c < /workspace/deps/lib.bin"), "second\nprepared\n3000000\n");
    assert_eq!(d.json(&["image", "inspect", "second"])["parent"], "prepared");

    for task in [&src, &t, &t2, &t3] {
        d.ok(&["destroy", task]);
    }
}

#[test]
fn commit_from_a_snapshot_takes_that_snapshot() {
    common::require_root();
    let d = Daemon::start();
    let _layout = import_base(&d, "base");
    let src = d.create(&["--image", "base"]);
    must(&d, &src, "echo first > /workspace/v");
    let first = d.json(&["snapshot", &src]);
    must(&d, &src, "echo second > /workspace/v");
    d.ok(&["image", "commit", &src, "at-first", "--from", first["id"].as_str().unwrap()]);
    let t = d.create(&["--image", "at-first"]);
    assert_eq!(must(&d, &t, "cat /workspace/v"), "first\n");

    // A suspended task commits its latest snapshot.
    d.ok(&["suspend", &src]);
    d.ok(&["image", "commit", &src, "suspended"]);
    let t2 = d.create(&["--image", "suspended"]);
    assert_eq!(must(&d, &t2, "cat /workspace/v"), "second\n");
    for task in [&src, &t, &t2] {
        d.ok(&["destroy", task]);
    }
}

#[test]
fn images_in_use_are_not_removed_and_their_layers_go_with_the_last() {
    common::require_root();
    let d = Daemon::start();
    let _layout = import_base(&d, "base");
    let src = d.create(&["--image", "base"]);
    must(&d, &src, "echo x > /workspace/x");
    d.ok(&["image", "commit", &src, "tpl"]);
    d.ok(&["destroy", &src]);
    assert_eq!(dir_names(&d.home().join("layers/sha256")).len(), 3, "two image layers and the committed one");

    // Positive control: an unused image of the same kind is removed.
    let other = d.create(&["--image", "base"]);
    d.ok(&["image", "commit", &other, "unused"]);
    d.ok(&["destroy", &other]);
    d.ok(&["image", "rm", "unused"]);
    assert_eq!(dir_names(&d.home().join("layers/sha256")).len(), 3, "the unused template's layer is gone");

    let err = d.fails(&["image", "rm", "base"]);
    assert!(err.contains("image \"base\" is in use: template(s) tpl are made from it"), "{err}");
    let t = d.create(&["--image", "tpl"]);
    let err = d.fails(&["image", "rm", "tpl"]);
    assert!(err.contains("is used by task(s)") && err.contains(&t), "{err}");
    assert_eq!(must(&d, &t, "cat /workspace/x"), "x\n", "the refusals left the image whole");

    d.ok(&["destroy", &t]);
    d.ok(&["image", "rm", "tpl"]);
    d.ok(&["image", "rm", "base"]);
    assert!(dir_names(&d.home().join("layers/sha256")).is_empty(), "{:?}", dir_names(&d.home().join("layers/sha256")));
    assert_eq!(dir_names(&d.home().join("images")), ["host"], "only the built-in image is left");
}

#[test]
fn bad_commits_fail_with_one_line_and_leave_nothing() {
    common::require_root();
    let d = Daemon::start();
    let _layout = import_base(&d, "base");
    let src = d.create(&["--image", "base"]);
    must(&d, &src, "echo x > /workspace/x");
    let images_before = dir_names(&d.home().join("images"));
    let layers_before = dir_names(&d.home().join("layers/sha256"));

    let cases: [(&[&str], &str); 6] = [
        (&["image", "commit", &src, "base"], "image \"base\" already exists"),
        (&["image", "commit", &src, "host"], "image \"host\" already exists"),
        (&["image", "commit", &src, "Bad Name"], "Bad Name"),
        (&["image", "commit", &src, ".fork-s2345678"], ".fork-s2345678"),
        (&["image", "commit", "tnosuchtask2", "x"], "tnosuchtask2"),
        (&["image", "commit", &src, "x", "--from", "snosuchsnap2"], "snosuchsnap2"),
    ];
    for (args, needle) in cases {
        let err = d.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    // A destroyed task has nothing to commit.
    let gone = d.create(&["--image", "base"]);
    d.ok(&["destroy", &gone]);
    let err = d.fails(&["image", "commit", &gone, "x"]);
    assert!(err.contains("is destroyed"), "{err}");

    assert_eq!(dir_names(&d.home().join("images")), images_before);
    assert_eq!(dir_names(&d.home().join("layers/sha256")), layers_before);
    // Positive control: the same task commits under a free name.
    d.ok(&["image", "commit", &src, "fine"]);
    d.ok(&["destroy", &src]);
}

#[test]
fn forks_share_their_snapshot_as_a_hidden_base_that_goes_with_the_last_fork() {
    common::require_root();
    let d = Daemon::start();
    let src = d.create(&[]);
    must(&d, &src, "head -c 4000000 /dev/urandom > /workspace/data.bin && echo plan > /workspace/plan && rm /etc/hostname");
    let snap = d.json(&["snapshot", &src]);
    let sid = snap["id"].as_str().unwrap().to_owned();

    let kids: Vec<String> =
        d.json(&["fork", &src, "--count", "3"]).as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kids.len(), 3);
    let base = format!(".fork-{sid}");
    assert_eq!(dir_names(&d.home().join("images")), [base.clone(), "host".to_owned()]);
    let listed = d.json(&["image", "list"]);
    assert!(listed.as_array().unwrap().iter().all(|i| i["name"] != base.as_str()), "the base is not listed: {listed}");
    for k in &kids {
        assert_eq!(d.json(&["task", "show", k])["config"]["image"], base.as_str());
        assert_eq!(must(&d, k, "cat /workspace/plan; wc -c < /workspace/data.bin; test -e /etc/hostname || echo deleted"), "plan\n4000000\ndeleted\n");
        let own: Vec<String> = upper_entries(&d, k).into_iter().filter(|e| e != "workspace").collect();
        assert!(own.is_empty(), "a fork's writable layer starts empty, holds {own:?}");
    }
    must(&d, &kids[0], "echo mine > /workspace/plan");
    assert_eq!(must(&d, &kids[1], "cat /workspace/plan"), "plan\n", "forks are independent");
    assert_eq!(must(&d, &src, "cat /workspace/plan"), "plan\n");

    // The patch of a fork holds the changes made before the fork too.
    let out = tempfile::tempdir().unwrap();
    let outdir = out.path().join("delivered");
    d.json(&["deliver", &kids[0], "--patch", "--out", outdir.to_str().unwrap()]);
    let patch = fs::read_to_string(outdir.join("workspace.patch")).unwrap();
    assert!(patch.contains("+++ b/workspace/plan\n@@ -0,0 +1 @@\n+mine"), "{patch}");
    assert!(patch.contains("b/workspace/data.bin") && patch.contains("--- a/etc/hostname"), "{patch}");

    // A fork of a fork, and a fork's rollback to its branch snapshot.
    let grand = d.json(&["snapshot", &kids[0]]);
    let g: Vec<String> = d
        .json(&["fork", &kids[0], "--from", grand["id"].as_str().unwrap()])
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(must(&d, &g[0], "cat /workspace/plan; wc -c < /workspace/data.bin"), "mine\n4000000\n");
    let branch = d.json(&["snapshot", "list", &kids[1]]).as_array().unwrap()[0].clone();
    assert_eq!(branch["kind"], "branch");
    must(&d, &kids[1], "rm /workspace/data.bin; echo other > /workspace/plan");
    d.json(&["rollback", &kids[1], "--to", branch["id"].as_str().unwrap(), "--reason", "start over"]);
    assert_eq!(must(&d, &kids[1], "cat /workspace/plan; wc -c < /workspace/data.bin"), "plan\n4000000\n");

    // The bases go with the last task that uses them.
    let err = d.fails(&["image", "rm", &base]);
    assert!(err.contains("is used by task(s)"), "{err}");
    for k in kids.iter().chain(&g) {
        d.ok(&["destroy", k]);
    }
    assert_eq!(dir_names(&d.home().join("images")), ["host"], "every fork base is gone");
    d.json(&["gc"]);
    assert!(dir_names(&d.home().join("layers/sha256")).is_empty(), "their layers are gone after gc");
    assert_eq!(must(&d, &src, "cat /workspace/plan"), "plan\n");
    d.ok(&["destroy", &src]);
}
