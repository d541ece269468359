//! A sandbox root whose contents lead out of it: the sandbox's writable
//! layer (which the sandbox wrote, and which comes back on every restart)
//! or its image holds a symlink to a host directory where the helper must
//! create its workdir or mount something. The root is built by host root,
//! so a link followed there reaches the host. Each case checks that the
//! host directory is untouched (no new entry, same owner and mode) and is
//! paired with the same restart or start without the link.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use common::Daemon;

/// A directory on the host, as a target for links planted in a sandbox:
/// root's, mode 0755, holding one file.
struct HostDir(tempfile::TempDir);

impl HostDir {
    fn new() -> HostDir {
        let dir = tempfile::Builder::new().prefix("cairn-hostile-").tempdir_in("/var/tmp").expect("host dir");
        fs::write(dir.path().join("marker"), "host").expect("marker");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        HostDir(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn untouched(&self) {
        let names: Vec<_> = fs::read_dir(self.path()).expect("read host dir").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["marker"], "nothing made in the host directory {}", self.path().display());
        let m = fs::metadata(self.path()).expect("stat host dir");
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o755), "owner and mode of {} unchanged", self.path().display());
        assert_eq!(fs::read_to_string(self.path().join("marker")).expect("marker"), "host");
        let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!mounts.contains(self.path().to_str().unwrap_or_default()), "nothing mounted on the host directory");
    }
}

/// `sh -c script` in `/`, which must succeed; returns its stdout.
fn sh_in_root(d: &Daemon, id: &str, script: &str) -> String {
    let out = d.cairn(&["exec", id, "--workdir", "/", "--", "sh", "-c", script]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script}: {stdout}{stderr}");
    stdout
}

/// Suspends and resumes `id`: a fresh sandbox whose root is rebuilt from
/// the task's writable layer.
fn restart(d: &Daemon, id: &str) {
    d.ok(&["suspend", id]);
    assert_eq!(d.state(id), "suspended");
    d.ok(&["resume", id]);
    assert_eq!(d.state(id), "running");
}

#[test]
fn a_workspace_linked_to_the_host_is_left_alone_across_a_restart() {
    let d = Daemon::start();
    let host = HostDir::new();
    let id = d.create(&[]);

    // Positive control: the workspace survives a restart as a directory
    // owned by the sandbox's root.
    sh_in_root(&d, &id, "echo kept > /workspace/f");
    restart(&d, &id);
    assert_eq!(sh_in_root(&d, &id, "cat /workspace/f && stat -c %u /workspace"), "kept\n0\n");

    // The sandbox swaps its workspace for a link to a host path that does
    // not exist yet: built by path, the restart would make it on the host.
    let target = host.path().join("new");
    sh_in_root(&d, &id, &format!("rm -rf /workspace && ln -s {} /workspace", target.display()));
    restart(&d, &id);
    host.untouched();
    // The link is still there, not followed and not replaced; it resolves
    // inside the sandbox, where commands start.
    assert_eq!(sh_in_root(&d, &id, "readlink /workspace").trim(), target.to_str().unwrap_or_default());
    let (code, _, err) = d.sh(&id, "pwd");
    assert_eq!(code, 127, "the workdir leads nowhere in the sandbox, so the command cannot start: {err}");
    assert!(err.contains("/workspace"), "{err}");
    sh_in_root(&d, &id, &format!("mkdir -p {}", target.display()));
    let (code, out, err) = d.sh(&id, "pwd -P && touch made-inside");
    assert_eq!((code, out.trim()), (0, target.to_str().unwrap_or_default()), "{err}");
    host.untouched();
}

#[test]
fn a_workdir_under_a_planted_link_is_left_alone_across_a_restart() {
    let d = Daemon::start();
    let host = HostDir::new();
    let id = d.create(&["--workdir", "/a/b"]);

    // Positive control: made at creation, there again after a restart.
    assert_eq!(d.sh(&id, "pwd").1.trim(), "/a/b");
    restart(&d, &id);
    assert_eq!(sh_in_root(&d, &id, "stat -c %u /a/b"), "0\n");
    assert_eq!(d.sh(&id, "pwd").1.trim(), "/a/b");

    // /a becomes a link to the host directory, which has no b: built by
    // path, the restart would make host/b and give it to the sandbox.
    sh_in_root(&d, &id, &format!("mv /a /a.old && ln -s {} /a", host.path().display()));
    restart(&d, &id);
    host.untouched();
    assert_eq!(sh_in_root(&d, &id, "readlink /a").trim(), host.path().to_str().unwrap_or_default());
    assert!(sh_in_root(&d, &id, "test -d /a.old/b && echo yes").contains("yes"));
    host.untouched();
}

/// A minimal image: the directories the sandbox mounts on, with `tmp` as
/// given.
fn import_image(d: &Daemon, name: &str, tmp_link: Option<&Path>) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("cairn-image-").tempdir_in("/var/tmp").expect("image dir");
    for sub in ["proc", "dev", "etc", "workspace"] {
        fs::create_dir(dir.path().join(sub)).expect("mkdir");
    }
    match tmp_link {
        Some(target) => symlink(target, dir.path().join("tmp")).expect("symlink"),
        None => fs::create_dir(dir.path().join("tmp")).expect("mkdir tmp"),
    }
    d.ok(&["image", "import", name, dir.path().to_str().unwrap_or_default()]);
    dir
}

#[test]
fn an_image_whose_mount_point_is_a_link_does_not_start() {
    let d = Daemon::start();
    let host = HostDir::new();

    // Positive control: the same image with a real /tmp starts.
    let _plain = import_image(&d, "plain", None);
    let id = d.create(&["--image", "plain"]);
    assert_eq!(d.state(&id), "running");

    let _linked = import_image(&d, "linked", Some(host.path()));
    let err = d.fails(&["task", "create", "--image", "linked"]);
    assert!(err.contains("/tmp is a symlink") && err.contains("never followed"), "{err}");
    host.untouched();
}
