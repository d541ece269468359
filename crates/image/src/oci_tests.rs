//! OCI layout imports and the layer store. They run as root: layers hold
//! whiteouts (device nodes) and `trusted.*` attributes.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::json;
use tempfile::TempDir;

use super::testing::{for_platform, host_arch, tagged, LayerBlob, LayerTar, OciLayout};
use super::*;
use crate::{Lookup, LowerStack};

pub(super) fn store() -> (TempDir, ImageStore) {
    let tmp = TempDir::new().unwrap();
    let store = ImageStore::new(tmp.path().join("images"));
    (tmp, store)
}

pub(super) fn base_tar() -> Vec<u8> {
    LayerTar::new()
        .dir("etc")
        .file("etc/a", b"base a\n")
        .file("etc/b", b"base b\n")
        .file("etc/c", b"base c\n")
        .dir("opt")
        .file("opt/o", b"base o\n")
        .dir("opt/old")
        .file("opt/old/x", b"x\n")
        .finish()
}

pub(super) fn top_tar() -> Vec<u8> {
    LayerTar::new()
        .dir("etc")
        .file("etc/a", b"top a\n")
        .whiteout("etc", "c")
        .dir("opt")
        .opaque("opt")
        .file("opt/n", b"top n\n")
        .finish()
}

/// The names the merged view shows in `rel`.
pub(super) fn merged_names(image: &Image, rel: &str) -> Vec<String> {
    let stack = LowerStack::open(&image.layers()[0].lowers).unwrap();
    let Some(Lookup::Dir(d)) = stack.lookup(Path::new(rel)) else { panic!("{rel} is no directory") };
    d.names().iter().map(|n| n.to_string_lossy().into_owned()).collect()
}

pub(super) fn merged_content(image: &Image, rel: &str) -> Option<Vec<u8>> {
    let stack = LowerStack::open(&image.layers()[0].lowers).unwrap();
    match stack.lookup(Path::new(rel))? {
        Lookup::Other { parent, name, .. } => Some(cairn_fsat::read_regular_at(&parent, &name, 1 << 20).unwrap()),
        Lookup::Dir(_) => None,
    }
}

pub(super) fn is_opaque(p: &Path) -> bool {
    let fd = cairn_fsat::open_dir(p).unwrap();
    cairn_fsat::XattrAt::Fd(fd.as_fd()).get(b"trusted.overlay.opaque").is_ok_and(|v| v == b"y")
}

/// Entries in `dir` (none if it does not exist).
pub(super) fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// No image `name`, and the layer store holds exactly `layers` and no
/// temporary directory.
pub(super) fn assert_left(store: &ImageStore, name: &str, layers: usize) {
    assert!(matches!(store.get(name), Err(Error::UnknownImage(_))), "{name} visible");
    for e in entries(store.root()) {
        assert!(!e.starts_with(".tmp-"), "image staging {e} left behind");
    }
    let sha = store.layer_store().root().join("sha256");
    for e in entries(&sha) {
        assert!(!e.starts_with(".tmp-"), "layer staging {e} left behind");
    }
    assert_eq!(store.layer_store().list().unwrap().len(), layers, "layers: {:?}", entries(&sha));
}

fn import_err(store: &ImageStore, dir: &Path) -> String {
    let e = store.import("bad", dir).unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains('\n'), "one line: {msg}");
    msg
}

#[test]
fn a_two_layer_image_stacks_with_whiteouts_and_an_opaque_directory() {
    let (tmp, store) = store();
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::gzip(&base_tar()), LayerBlob::gzip(&top_tar())]);
    let image = store.import("two", &layout.dir).unwrap();
    assert_eq!(image.kind, ImageKind::Oci);
    assert_eq!(image.layers, [LayerBlob::gzip(&base_tar()).diff_id, LayerBlob::gzip(&top_tar()).diff_id]);
    let config = image.config.clone().unwrap();
    assert_eq!((config.env, config.cmd), (vec!["PATH=/usr/bin:/bin".to_owned()], vec!["/bin/sh".to_owned()]));
    assert!(image.manifest_digest.as_deref().is_some_and(|d| d.starts_with("sha256:")));

    // One overlay at /, its lowers the layer trees, top first.
    let layers = image.layers();
    assert_eq!(layers.len(), 1);
    let ls = store.layer_store();
    assert_eq!(layers[0].lowers, [ls.tree(&image.layers[1]).unwrap(), ls.tree(&image.layers[0]).unwrap()]);
    assert_eq!(store.get("two").unwrap(), image, "loads as imported");

    // The top layer's tree holds what overlayfs reads.
    let top = &layers[0].lowers[0];
    let wh = fs::symlink_metadata(top.join("etc/c")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "whiteout is a 0/0 char device");
    assert!(is_opaque(&top.join("opt")) && !is_opaque(&top.join("etc")));
    assert!(!top.join("opt/.wh..wh..opq").exists() && !top.join("etc/.wh.c").exists());

    // Merged, the image shows exactly the second layer's changes.
    assert_eq!(merged_names(&image, "etc"), ["a", "b"]);
    assert_eq!(merged_content(&image, "etc/a").unwrap(), b"top a\n");
    assert_eq!(merged_content(&image, "etc/b").unwrap(), b"base b\n");
    assert_eq!(merged_names(&image, "opt"), ["n"]);
    assert!(merged_content(&image, "etc/c").is_none() && merged_content(&image, "opt/o").is_none());

    // A rootfs image's description is as before: no OCI fields.
    let json = serde_json::to_value(store.import("plain", &write_tar(tmp.path(), &base_tar())).unwrap()).unwrap();
    for k in ["layers", "config", "manifest_digest", "lowers"] {
        assert!(json.get(k).is_none(), "{k} in {json}");
    }
}

fn write_tar(dir: &Path, tar: &[u8]) -> PathBuf {
    let p = dir.join("plain.tar");
    fs::write(&p, tar).unwrap();
    p
}

#[test]
fn opaque_markers_and_whiteouts_in_any_order_within_a_layer() {
    let (tmp, store) = store();
    let tar = LayerTar::new()
        // The marker before its directory's own entry.
        .opaque("early")
        .dir("early")
        .file("early/f", b"f")
        // A whiteout, then a directory of that name: opaque, no whiteout.
        .whiteout("", "d")
        .dir("d")
        .file("d/x", b"x")
        // A file, then its whiteout: this layer's file stays.
        .file("kept", b"k")
        .whiteout("", "kept")
        // A whiteout, then a file of that name: the file.
        .whiteout("", "later")
        .file("later", b"l")
        // AUFS metadata: skipped.
        .file(".wh..wh.plnk", b"")
        .finish();
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::tar(&tar)]);
    let image = store.import("order", &layout.dir).unwrap();
    let tree = &image.layers()[0].lowers[0];
    assert!(is_opaque(&tree.join("early")));
    assert_eq!(fs::metadata(tree.join("early")).unwrap().permissions().mode() & 0o777, 0o755);
    assert!(fs::metadata(tree.join("d")).unwrap().is_dir() && is_opaque(&tree.join("d")));
    assert_eq!(fs::read(tree.join("kept")).unwrap(), b"k");
    assert_eq!(fs::read(tree.join("later")).unwrap(), b"l");
    assert!(!tree.join(".wh..wh.plnk").exists());
    let info = store.layer_store().get(&image.layers[0]).unwrap().unwrap();
    assert_eq!(info.skipped, 1);
}

#[test]
fn bad_layers_fail_with_one_line_and_leave_nothing() {
    let (tmp, store) = store();
    let mut n = 0;
    let mut layout_of = |layers: &[LayerBlob]| {
        n += 1;
        OciLayout::single(&tmp.path().join(format!("oci{n}")), layers)
    };
    let base = LayerBlob::gzip(&base_tar());

    // The diffid the config says is not what the layer unpacks to.
    let mut wrong = LayerBlob::gzip(&top_tar());
    wrong.diff_id = super::testing::sha256(b"something else");
    let e = import_err(&store, &layout_of(&[base.clone(), wrong]).dir);
    assert!(e.contains("unpacks to") && e.contains("not the diffid"), "{e}");
    assert_left(&store, "bad", 0);

    // A truncated gzip layer (its digest in the manifest matches).
    let mut cut = LayerBlob::gzip(&top_tar());
    cut.bytes.truncate(cut.bytes.len() / 2);
    let e = import_err(&store, &layout_of(&[base.clone(), cut]).dir);
    assert!(e.contains("unreadable"), "{e}");
    assert_left(&store, "bad", 0);

    // Unsafe entries.
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (LayerTar::new().raw_file(b"../escape", b"x").finish(), "'..'"),
        (LayerTar::new().raw_file(b"/etc/passwd", b"x").finish(), "absolute path"),
        (LayerTar::new().hardlink("etc/link", "etc/a").finish(), "not in this layer"),
        (LayerTar::new().raw_hardlink(b"out", b"../../etc/shadow").finish(), "'..'"),
        (LayerTar::new().dir("d/.wh.x").finish(), "whiteout entry is a directory"),
        (LayerTar::new().whiteout("etc", "..").finish(), "'..'"),
    ];
    for (tar, reason) in cases {
        let e = import_err(&store, &layout_of(&[base.clone(), LayerBlob::gzip(&tar)]).dir);
        assert!(e.contains(reason), "expected {reason:?}: {e}");
        assert_left(&store, "bad", 0);
    }

    // A whiteout of a lower file, then a hard link to that name: the
    // target is in a lower layer.
    let tar = LayerTar::new().whiteout("etc", "a").hardlink("etc/z", "etc/a").finish();
    let e = import_err(&store, &layout_of(&[base.clone(), LayerBlob::gzip(&tar)]).dir);
    assert!(e.contains("not in this layer"), "{e}");
    assert_left(&store, "bad", 0);
}

#[test]
fn bad_blobs_and_documents_fail_with_one_line_and_leave_nothing() {
    let (tmp, store) = store();
    let base = LayerBlob::gzip(&base_tar());
    let top = LayerBlob::zstd(&top_tar());

    // A layer blob whose bytes do not match its digest (same size).
    let layout = OciLayout::single(&tmp.path().join("tampered"), &[base.clone(), top.clone()]);
    let path = layout.blob_path(&top.digest());
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let e = import_err(&store, &layout.dir);
    assert!(e.contains("digest") || e.contains("unreadable"), "{e}");
    assert_left(&store, "bad", 0);

    // A missing layer blob.
    let layout = OciLayout::single(&tmp.path().join("missing"), &[base.clone(), top.clone()]);
    fs::remove_file(layout.blob_path(&top.digest())).unwrap();
    let e = import_err(&store, &layout.dir);
    assert!(e.contains("is missing"), "{e}");
    assert_left(&store, "bad", 0);

    // A blob longer than its descriptor says.
    let layout = OciLayout::single(&tmp.path().join("long"), std::slice::from_ref(&base));
    let mut f = fs::OpenOptions::new().append(true).open(layout.blob_path(&base.digest())).unwrap();
    std::io::Write::write_all(&mut f, b"more").unwrap();
    let e = import_err(&store, &layout.dir);
    assert!(e.contains("bytes, not the"), "{e}");
    assert_left(&store, "bad", 0);

    // A blob that is a symlink out of the layout is not followed.
    let layout = OciLayout::single(&tmp.path().join("linked"), std::slice::from_ref(&base));
    let outside = tmp.path().join("outside");
    fs::rename(layout.blob_path(&base.digest()), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, layout.blob_path(&base.digest())).unwrap();
    let e = import_err(&store, &layout.dir);
    assert!(e.contains("cannot open blob"), "{e}");
    assert_left(&store, "bad", 0);

    // A manifest that does not match its digest.
    let layout = OciLayout::single(&tmp.path().join("manifest"), std::slice::from_ref(&base));
    let index: serde_json::Value = serde_json::from_slice(&fs::read(layout.dir.join("index.json")).unwrap()).unwrap();
    let m = layout.blob_path(index["manifests"][0]["digest"].as_str().unwrap());
    let text = fs::read_to_string(&m).unwrap().replace("\"schemaVersion\":2", "\"schemaVersion\":3");
    fs::write(&m, text).unwrap();
    let e = import_err(&store, &layout.dir);
    assert!(e.contains("digest"), "{e}");
    assert_left(&store, "bad", 0);

    // A layout of another version, and an unknown layer media type.
    let layout = OciLayout::single(&tmp.path().join("version"), std::slice::from_ref(&base));
    fs::write(layout.dir.join("oci-layout"), br#"{"imageLayoutVersion":"2.0.0"}"#).unwrap();
    assert!(import_err(&store, &layout.dir).contains("not supported"));
    let mut odd = base.clone();
    odd.media_type = "application/x-rar".into();
    let layout = OciLayout::single(&tmp.path().join("odd"), &[odd]);
    assert!(import_err(&store, &layout.dir).contains("unsupported media type"));
    assert_left(&store, "bad", 0);
}

#[test]
fn devices_in_a_layer_are_dropped_and_counted() {
    let (tmp, store) = store();
    let tar = LayerTar::new().dir("dev").device("dev/null").file("f", b"x").finish();
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::gzip(&tar)]);
    let image = store.import("dev", &layout.dir).unwrap();
    assert_eq!(image.dropped.devices, 1);
    assert!(!image.layers()[0].lowers[0].join("dev/null").exists());
}

#[test]
fn shared_layers_are_stored_once_and_collected_when_unused() {
    let (tmp, store) = store();
    let base = LayerBlob::gzip(&base_tar());
    let a = LayerBlob::gzip(&LayerTar::new().file("a", b"a").finish());
    let b = LayerBlob::gzip(&LayerTar::new().file("b", b"b").finish());
    let la = OciLayout::single(&tmp.path().join("a"), &[base.clone(), a.clone()]);
    let lb = OciLayout::single(&tmp.path().join("b"), &[base.clone(), b.clone()]);
    let ia = store.import("a", &la.dir).unwrap();
    let base_tree = store.layer_store().tree(&base.diff_id).unwrap();
    let ino = fs::metadata(base_tree.join("etc/a")).unwrap().ino();
    let ib = store.import("b", &lb.dir).unwrap();
    assert_eq!(store.layer_store().list().unwrap().len(), 3, "the base layer once");
    assert_eq!(ia.layers()[0].lowers[1], ib.layers()[0].lowers[1]);
    assert_eq!(fs::metadata(base_tree.join("etc/a")).unwrap().ino(), ino, "not unpacked again");

    store.remove("a").unwrap();
    let left = store.layer_store().list().unwrap();
    assert_eq!(left, {
        let mut v = vec![base.diff_id.clone(), b.diff_id.clone()];
        v.sort();
        v
    });
    assert!(base_tree.join("etc/a").exists() && !store.layer_store().tree(&a.diff_id).unwrap().exists());
    // Nothing to collect while b stands.
    assert!(store.gc_layers().unwrap().is_empty());
    store.remove("b").unwrap();
    assert_left(&store, "b", 0);
}

#[test]
fn an_index_is_resolved_by_tag_and_platform() {
    let (tmp, store) = store();
    let base = LayerBlob::gzip(&base_tar());
    let other = LayerBlob::gzip(&LayerTar::new().file("other-arch", b"").finish());
    let layout = OciLayout::create(&tmp.path().join("oci"));
    let other_arch = if host_arch() == "arm64" { "amd64" } else { "arm64" };
    let mine = layout.add_image(std::slice::from_ref(&base), host_arch(), json!({"WorkingDir": "/src", "User": "1000"}));
    let theirs = layout.add_image(std::slice::from_ref(&other), other_arch, json!({}));
    let multi = layout.add_index(&[for_platform(theirs.clone(), "linux", other_arch), for_platform(mine, "linux", host_arch())]);
    let plain = layout.add_image(&[LayerBlob::tar(&LayerTar::new().file("plain", b"").finish())], host_arch(), json!({}));
    layout.write_index(&[tagged(multi, "multi"), tagged(plain, "plain")]);

    let e = import_err(&store, &layout.dir);
    assert!(e.contains("choose one with --tag") && e.contains("multi, plain"), "{e}");
    let image = store.import_tagged("m", &layout.dir, Some("multi")).unwrap();
    assert_eq!(image.layers, std::slice::from_ref(&base.diff_id), "this host's platform");
    let c = image.config.unwrap();
    assert_eq!((c.working_dir.as_deref(), c.user.as_deref()), (Some("/src"), Some("1000")));
    assert!(store.import_tagged("p", &layout.dir, Some("plain")).is_ok());
    let e = store.import_tagged("x", &layout.dir, Some("nope")).unwrap_err().to_string();
    assert!(e.contains("no image tagged \"nope\""), "{e}");

    // Only another platform on offer.
    let only = OciLayout::create(&tmp.path().join("only"));
    let theirs = only.add_image(&[other], other_arch, json!({}));
    only.write_index(&[for_platform(theirs, "linux", other_arch), for_platform(only.add_image(&[], other_arch, json!({})), "linux", other_arch)]);
    let e = import_err(&store, &only.dir);
    assert!(e.contains(&format!("no image for linux/{}", host_arch())), "{e}");
    // A tag on something that is no layout.
    let e = store.import_tagged("t", &write_tar(tmp.path(), &base_tar()), Some("x")).unwrap_err().to_string();
    assert!(e.contains("OCI image layout"), "{e}");
}

#[test]
fn an_image_json_from_before_oci_still_loads() {
    let (_tmp, store) = store();
    let dir = store.root().join("old");
    fs::create_dir_all(dir.join("rootfs")).unwrap();
    let json = r#"{"name":"old","kind":"rootfs","rootfs":"/x","size_bytes":1,"files":1,"created_ms":1,"source":"/t.tar"}"#;
    fs::write(dir.join("image.json"), json).unwrap();
    let image = store.get("old").unwrap();
    assert!(image.layers.is_empty() && image.config.is_none());
    assert_eq!(image.layers()[0].lowers, [dir.join("rootfs")]);
}
