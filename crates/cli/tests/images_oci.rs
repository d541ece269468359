//! OCI images imported from an image layout directory or a `docker save`
//! archive: their layers are stored once and mounted as a stack of
//! overlayfs lower directories, with whiteouts and opaque directories as
//! the OCI spec says. A task on such an image sees the merged layers,
//! writes only to its own layer, snapshots, rolls back and delivers a patch
//! of its own changes; bad layouts fail with one line and leave nothing in
//! the image or layer store. Needs root, busybox on the host (the image's
//! shell) and skopeo (which writes the docker archive).

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cairn_image::testing::{LayerBlob, LayerTar, OciLayout};
use common::Daemon;

fn busybox() -> Vec<u8> {
    let path = ["/usr/bin/busybox", "/bin/busybox"].into_iter().find(|p| Path::new(p).exists());
    fs::read(path.expect("these tests need a static busybox on the host (the image's shell)")).unwrap()
}

/// The base layer: busybox as the shell, the mount points, and files the
/// second layer replaces, deletes and hides.
fn base_layer() -> LayerBlob {
    let mut t = LayerTar::new().dir("bin").executable("bin/busybox", &busybox());
    for applet in ["sh", "cat", "ls", "echo", "rm", "test"] {
        t = t.symlink(&format!("bin/{applet}"), "busybox");
    }
    for d in ["proc", "dev", "tmp", "workspace", "etc", "opt", "opt/old"] {
        t = t.dir(d);
    }
    let tar = t
        .file("etc/a", b"base a\n")
        .file("etc/b", b"base b\n")
        .file("etc/c", b"base c\n")
        .file("opt/o", b"base o\n")
        .file("opt/old/x", b"x\n")
        .finish();
    LayerBlob::gzip(&tar)
}

/// The second layer: replaces /etc/a, deletes /etc/c, makes /opt opaque
/// with only /opt/n.
fn top_layer() -> LayerBlob {
    let tar = LayerTar::new()
        .dir("etc")
        .file("etc/a", b"top a\n")
        .whiteout("etc", "c")
        .dir("opt")
        .opaque("opt")
        .file("opt/n", b"top n\n")
        .finish();
    LayerBlob::gzip(&tar)
}

fn must(d: &Daemon, task: &str, script: &str) -> String {
    let (code, out, err) = d.sh(task, script);
    assert_eq!(code, 0, "script failed: {script}\nstdout: {out}\nstderr: {err}");
    out
}

fn layers_stored(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(d.home().join("layers/sha256")) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn images_stored(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(d.home().join("images")) {
        Ok(rd) => rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn layout_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix("cairn-oci-").tempdir_in("/var/tmp").unwrap();
    let dir = tmp.path().join(name);
    (tmp, dir)
}

#[test]
fn a_task_on_a_two_layer_image_sees_the_stack_and_changes_only_its_own_layer() {
    common::require_root();
    let d = Daemon::start();
    let (_tmp, dir) = layout_dir("two");
    let (base, top) = (base_layer(), top_layer());
    OciLayout::single(&dir, &[base.clone(), top.clone()]);

    let out = d.ok(&["image", "import", "two", dir.to_str().unwrap()]);
    assert!(out.starts_with("imported two (2 layers, "), "{out}");
    let listed = d.json(&["image", "list"]);
    let img = listed.as_array().unwrap().iter().find(|i| i["name"] == "two").unwrap().clone();
    assert_eq!(img["kind"], "oci");
    assert_eq!(img["layers"], serde_json::json!([base.diff_id, top.diff_id]));
    assert_eq!(img["config"]["cmd"], serde_json::json!(["/bin/sh"]));
    assert_eq!(layers_stored(&d).len(), 2);

    let id = d.create(&["--image", "two"]);
    assert_eq!(must(&d, &id, "cat /etc/a /etc/b"), "top a\nbase b\n");
    assert_eq!(must(&d, &id, "ls /etc"), "a\nb\n");
    assert_eq!(must(&d, &id, "ls /opt"), "n\n");
    assert_eq!(must(&d, &id, "test -e /etc/c || echo gone; test -e /opt/o || echo hidden"), "gone\nhidden\n");

    // Writes land in the task's own layer; the stored layers are unchanged.
    must(&d, &id, "echo mine > /workspace/f; echo changed > /etc/b; rm /etc/a; rm /opt/n");
    assert_eq!(must(&d, &id, "ls /etc; ls /opt; cat /workspace/f"), "b\nmine\n");
    let tree = |diff: &str, rel: &str| d.home().join("layers/sha256").join(diff.trim_start_matches("sha256:")).join("tree").join(rel);
    assert_eq!(fs::read(tree(&base.diff_id, "etc/b")).unwrap(), b"base b\n");
    assert_eq!(fs::read(tree(&top.diff_id, "etc/a")).unwrap(), b"top a\n");
    assert_eq!(fs::read(tree(&top.diff_id, "opt/n")).unwrap(), b"top n\n");

    // Snapshot and rollback.
    let snap = d.json(&["snapshot", &id]);
    let sid = snap["id"].as_str().unwrap().to_owned();
    must(&d, &id, "echo later > /etc/b; echo new > /etc/c; rm /workspace/f");
    assert_eq!(must(&d, &id, "cat /etc/c"), "new\n");
    d.json(&["rollback", &id, "--to", &sid, "--reason", "back to the snapshot"]);
    assert_eq!(must(&d, &id, "cat /etc/b /workspace/f; ls /etc; ls /opt"), "changed\nmine\nb\n");
    assert_eq!(must(&d, &id, "test -e /etc/c || echo gone; test -e /opt/o || echo hidden"), "gone\nhidden\n");

    // The patch holds the task's changes only, against the merged image.
    let out = tempfile::tempdir().unwrap();
    let outdir = out.path().join("delivered");
    d.json(&["deliver", &id, "--patch", "--out", outdir.to_str().unwrap()]);
    let patch = fs::read_to_string(outdir.join("workspace.patch")).unwrap();
    assert!(patch.contains("+++ b/workspace/f") && patch.contains("+mine"), "{patch}");
    assert!(patch.contains("-base b\n+changed"), "{patch}");
    assert!(patch.contains("--- a/etc/a") && patch.contains("-top a"), "{patch}");
    assert!(patch.contains("--- a/opt/n") && patch.contains("-top n"), "{patch}");
    assert!(!patch.contains("etc/c") && !patch.contains("opt/o") && !patch.contains("base a"), "image-layer changes are not the task's: {patch}");

    // Removing the image frees its layers; not while the task uses it.
    let err = d.fails(&["image", "rm", "two"]);
    assert!(err.contains("used by"), "{err}");
    d.ok(&["destroy", &id]);
    d.ok(&["image", "rm", "two"]);
    assert_eq!(layers_stored(&d), Vec::<String>::new());
}

#[test]
fn a_layer_shared_by_two_images_is_stored_once_and_freed_with_the_last() {
    common::require_root();
    let d = Daemon::start();
    let base = base_layer();
    let a = LayerBlob::gzip(&LayerTar::new().dir("etc").file("etc/which", b"a\n").finish());
    let b = LayerBlob::zstd(&LayerTar::new().dir("etc").file("etc/which", b"b\n").finish());
    let (_ta, da) = layout_dir("a");
    let (_tb, db) = layout_dir("b");
    OciLayout::single(&da, &[base.clone(), a]);
    OciLayout::single(&db, &[base.clone(), b]);
    d.ok(&["image", "import", "img-a", da.to_str().unwrap()]);
    d.ok(&["image", "import", "img-b", db.to_str().unwrap()]);
    assert_eq!(layers_stored(&d).len(), 3, "the base layer once");
    let (ia, ib) = (d.create(&["--image", "img-a"]), d.create(&["--image", "img-b"]));
    assert_eq!(must(&d, &ia, "cat /etc/which /etc/b"), "a\nbase b\n");
    assert_eq!(must(&d, &ib, "cat /etc/which /etc/b"), "b\nbase b\n");
    d.ok(&["destroy", &ia]);
    d.ok(&["image", "rm", "img-a"]);
    let left = layers_stored(&d);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&base.diff_id.trim_start_matches("sha256:").to_owned()));
    assert_eq!(must(&d, &ib, "cat /etc/which /etc/b"), "b\nbase b\n", "the other image's task is unaffected");
    d.ok(&["destroy", &ib]);
    d.ok(&["image", "rm", "img-b"]);
    assert_eq!(layers_stored(&d), Vec::<String>::new());
}

#[test]
fn bad_layouts_fail_with_one_line_and_leave_nothing() {
    common::require_root();
    let d = Daemon::start();
    let base = base_layer();
    let images_before = images_stored(&d);
    let (_tmp, root) = layout_dir("bad");
    fs::create_dir_all(&root).unwrap();
    let mut cases: Vec<(&str, PathBuf, &str)> = Vec::new();

    // A blob whose bytes do not match its digest.
    let dir = root.join("tampered");
    let l = OciLayout::single(&dir, &[base.clone(), top_layer()]);
    let p = l.blob_path(&top_layer().digest());
    let mut bytes = fs::read(&p).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    fs::write(&p, bytes).unwrap();
    cases.push(("tampered", dir, ""));

    // A truncated layer (the manifest has the truncated blob's digest).
    let mut cut = top_layer();
    cut.bytes.truncate(cut.bytes.len() - 20);
    let dir = root.join("truncated");
    OciLayout::single(&dir, &[base.clone(), cut]);
    cases.push(("truncated", dir, "unreadable"));

    // Unsafe entries.
    for (name, tar, reason) in [
        ("dotdot", LayerTar::new().raw_file(b"../../escape", b"x").finish(), "'..'"),
        ("absolute", LayerTar::new().raw_file(b"/etc/cron.d/evil", b"x").finish(), "absolute path"),
        ("link-out", LayerTar::new().hardlink("etc/shadow-copy", "etc/b").finish(), "not in this layer"),
        ("link-dotdot", LayerTar::new().raw_hardlink(b"x", b"../../../etc/shadow").finish(), "'..'"),
    ] {
        let dir = root.join(name);
        OciLayout::single(&dir, &[base.clone(), LayerBlob::gzip(&tar)]);
        cases.push((name, dir, reason));
    }

    // A missing blob.
    let dir = root.join("missing");
    let l = OciLayout::single(&dir, &[base.clone(), top_layer()]);
    fs::remove_file(l.blob_path(&top_layer().digest())).unwrap();
    cases.push(("missing", dir, "is missing"));

    for (name, dir, reason) in cases {
        let err = d.fails(&["image", "import", "bad", dir.to_str().unwrap()]);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: one line: {err}");
        assert!(err.contains(reason), "{name}: expected {reason:?}: {err}");
        assert_eq!(images_stored(&d), images_before, "{name}: nothing in the image store");
        assert_eq!(layers_stored(&d), Vec::<String>::new(), "{name}: nothing in the layer store");
    }
    let err = d.fails(&["task", "create", "--image", "bad"]);
    assert!(err.contains("unknown image"), "{err}");
}

/// A small tmpfs mounted at a path until dropped (lazily: the daemon may
/// still hold a file open in it).
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path, size: &str) -> SmallFs {
        fs::create_dir_all(at).unwrap();
        let ok = common::run(std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "cairn-test-small"])
            .arg(at))
            .unwrap()
            .status;
        assert!(ok.success(), "mount a tmpfs at {}", at.display());
        SmallFs(at.to_owned())
    }

    fn used_bytes(&self) -> u64 {
        let st = nix::sys::statvfs::statvfs(&self.0).unwrap();
        (st.blocks() - st.blocks_free()) as u64 * st.fragment_size() as u64
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The layer store on a 24 MiB filesystem: an image of 40 MiB does not fit.
/// The import fails with one line and leaves no layer, no image and no
/// staging behind; an image that fits imports afterwards.
#[test]
fn an_image_larger_than_the_space_for_layers_fails_with_one_line_and_leaves_nothing() {
    common::require_root();
    let mut small = None;
    let mut d = Daemon::start_prepared(|home| small = Some(SmallFs::mount(&home.join("layers"), "24m")), &[]);
    let small = small.unwrap();
    // Unmounted here (the copy in the daemon's nosuid bind of the home)
    // and by `d` once it has stopped (the mount itself).
    d.unmount_after_stop(&small.0);
    let images_before = images_stored(&d);
    let mut big = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(fs::File::open("/dev/urandom").unwrap(), 40 << 20), &mut big).unwrap();
    let (_tmp, dir) = layout_dir("big");
    let huge = LayerBlob::gzip(&LayerTar::new().dir("opt").file("opt/big", &big).finish());
    OciLayout::single(&dir, &[base_layer(), huge]);

    let err = d.fails(&["image", "import", "big", dir.to_str().unwrap()]);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    // Refused by the import's own count before the filesystem is full.
    assert!(err.contains("\"/opt/big\"") && err.contains("the image store's filesystem can spare"), "names the entry and the space: {err}");
    assert_eq!(images_stored(&d), images_before, "no image recorded");
    assert_eq!(layers_stored(&d), Vec::<String>::new(), "no layer kept");
    assert!(small.used_bytes() < 1 << 20, "nothing partial left: {} bytes used", small.used_bytes());

    // Control: an image that fits imports into the same store.
    let (_tmp2, fits) = layout_dir("fits");
    OciLayout::single(&fits, &[base_layer(), top_layer()]);
    d.ok(&["image", "import", "fits", fits.to_str().unwrap()]);
    assert_eq!(layers_stored(&d).len(), 2);
    d.ok(&["image", "rm", "fits"]);
}

#[test]
fn a_docker_archive_written_by_skopeo_imports_and_runs() {
    common::require_root();
    let d = Daemon::start();
    let (_tmp, dir) = layout_dir("two");
    let (base, top) = (base_layer(), top_layer());
    OciLayout::single(&dir, &[base.clone(), top.clone()]);
    let archive = dir.with_file_name("two.tar");
    let mut skopeo = Command::new("skopeo");
    skopeo
        .args(["copy", "--insecure-policy"])
        .arg(format!("oci:{}:latest", dir.display()))
        .arg(format!("docker-archive:{}:cairn/two:v1", archive.display()))
        .stdin(Stdio::null());
    if which("skopeo").is_none() {
        panic!("install skopeo: this test converts an OCI layout to a docker archive with it");
    }
    let out = common::output_within(&mut skopeo, Duration::from_secs(60));
    assert!(out.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));

    let out = d.ok(&["image", "import", "from-docker", archive.to_str().unwrap(), "--tag", "cairn/two:v1"]);
    assert!(out.starts_with("imported from-docker (2 layers, "), "{out}");
    let img = d.json(&["image", "inspect", "from-docker"]);
    assert_eq!(img["kind"], "oci", "{img}");
    // skopeo stores the layers uncompressed: the same diffids.
    assert_eq!(img["layers"], serde_json::json!([base.diff_id, top.diff_id]), "{img}");
    assert_eq!(img["config"]["cmd"], serde_json::json!(["/bin/sh"]));
    assert_eq!(img["layer_details"][1]["media_type"], "application/vnd.docker.image.rootfs.diff.tar", "{img}");
    assert_eq!(layers_stored(&d).len(), 2);

    let id = d.create(&["--image", "from-docker"]);
    assert_eq!(must(&d, &id, "cat /etc/a /etc/b"), "top a\nbase b\n", "a file of each layer");
    assert_eq!(must(&d, &id, "ls /etc; ls /opt"), "a\nb\nn\n");
    assert_eq!(must(&d, &id, "test -e /etc/c || echo gone; test -e /opt/o || echo hidden"), "gone\nhidden\n", "the whiteout and the opaque directory");
    d.ok(&["destroy", &id]);
    d.ok(&["image", "rm", "from-docker"]);
    assert_eq!(layers_stored(&d), Vec::<String>::new());
}

/// Where `program` is on `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()))
}

/// While `cairn image import` of a large archive runs, `GET
/// /v1/images/import/progress?name=` answers how far it has got (the
/// archive read, of its size, and the bytes written), and 404 once it is
/// done; the CLI on a terminal shows it as a line with the rate and ETA.
#[test]
fn an_import_reports_its_progress_while_it_runs() {
    let d = Daemon::start();
    let dir = tempfile::Builder::new().prefix("cairn-import-progress-").tempdir_in("/var/tmp").unwrap();
    // A root filesystem with one large file of bytes no filesystem can
    // leave out (not zeros), as a plain tar.
    let archive = dir.path().join("big.tar");
    {
        let mut b = tar::Builder::new(std::io::BufWriter::new(fs::File::create(&archive).unwrap()));
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        b.append_data(&mut h, "etc/", std::io::empty()).unwrap();
        let size: u64 = 1 << 30;
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(size);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        let data = Noise { x: 0x9e37_79b9_7f4a_7c15, left: size };
        b.append_data(&mut h, "etc/big.bin", data).unwrap();
        b.into_inner().unwrap();
    }
    let archive_bytes = fs::metadata(&archive).unwrap().len();
    let token = fs::read_to_string(d.home().join("token")).unwrap();
    let progress = || {
        let out = common::output_within(
            Command::new("curl")
                .args(["-s", "-w", "\n%{http_code}", "-H", &format!("authorization: Bearer {}", token.trim())])
                .arg(format!("{}/v1/images/import/progress?name=big", d.url)),
            Duration::from_secs(10),
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_owned(), body.to_owned())
    };
    // On a terminal (script gives the CLI one), as a person runs it.
    let inner = format!("{} image import big {}", common::CAIRN, archive.display());
    let began = std::time::Instant::now();
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("CAIRN_HOME", d.home())
        .env_remove("CAIRN_URL")
        .env_remove("CAIRN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the import did not end within 300 s");
        let (code, body) = progress();
        if code == "200" {
            seen.push(serde_json::from_str(&body).unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = began.elapsed();
    let out = common::output_of(child, Duration::from_secs(30)).unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && shown.contains("imported big"), "{shown}");
    assert!(seen.iter().any(|p| p["read"].as_u64() > Some(0)), "no progress seen during the import ({took:?}): {seen:?}");
    for p in &seen {
        // The archive's size is known once its reading began.
        assert_eq!(p["name"].as_str(), Some("big"), "{p}");
        if p["read"].as_u64() > Some(0) {
            assert_eq!(p["source_bytes"].as_u64(), Some(archive_bytes), "{p}");
        }
        assert!(p["read"].as_u64().unwrap() <= archive_bytes, "{p}");
    }
    let reads: Vec<u64> = seen.iter().map(|p| p["read"].as_u64().unwrap()).collect();
    assert!(reads.windows(2).all(|w| w[0] <= w[1]), "read only grows: {reads:?}");
    assert!(seen.iter().any(|p| p["written"].as_u64() > Some(0)), "{seen:?}");
    assert_eq!(progress().0, "404", "no progress once the import is done");
    eprintln!("the import took {took:?}; the CLI printed: {shown:?}");
    // The line shows once an import has run for a second.
    if took > Duration::from_millis(1500) {
        assert!(shown.contains("import big: ") && shown.contains(" read at ") && shown.contains("written"), "{shown}");
    }
    d.ok(&["image", "rm", "big"]);
}

/// `left` bytes of xorshift noise, as a reader.
struct Noise {
    x: u64,
    left: u64,
}

impl std::io::Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.left as usize) / 8 * 8;
        let n = if n == 0 { buf.len().min(self.left as usize) } else { n };
        for chunk in buf[..n].chunks_mut(8) {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            chunk.copy_from_slice(&self.x.to_le_bytes()[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}
