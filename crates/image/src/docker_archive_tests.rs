//! `docker save` archive imports, in both layouts docker writes. They run
//! as root: layers hold whiteouts (device nodes) and `trusted.*`
//! attributes.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::oci_tests::{assert_left, base_tar, is_opaque, merged_content, merged_names, store, top_tar};
use super::testing::{gzip, sha256, DockerArchive, DockerLayout, LayerBlob, LayerTar, OciLayout};
use super::*;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

/// Docker's layers are plain tars; one gzip layer checks that the
/// compression is told by content.
fn two_layers() -> [LayerBlob; 2] {
    [LayerBlob::tar(&base_tar()), LayerBlob::gzip(&top_tar())]
}

#[test]
fn a_two_layer_image_in_either_layout_stacks_with_whiteouts_and_an_opaque_directory() {
    let [base, top] = two_layers();
    for (layout, compress) in [(DockerLayout::Legacy, false), (DockerLayout::Blobs, false), (DockerLayout::Legacy, true), (DockerLayout::Blobs, true)] {
        let what = format!("{layout:?}, gzip {compress}");
        // A store each, so that every case unpacks its layers.
        let (tmp, store) = store();
        let mut bytes = DockerArchive::new(layout).image(&[base.clone(), top.clone()], &["docker.io/cairn/two:v1"]).finish();
        if compress {
            bytes = gzip(&bytes);
        }
        let path = write(tmp.path(), "two.tar", &bytes);
        let image = store.import("two", &path).unwrap();
        assert_eq!(image.kind, ImageKind::Oci, "{what}");
        assert_eq!(image.layers, [base.diff_id.clone(), top.diff_id.clone()], "{what}");
        assert_eq!(image.source, path.display().to_string());
        assert_eq!(image.manifest_digest, None, "a docker archive has no manifest digest");
        let config = image.config.clone().unwrap();
        assert_eq!((config.env, config.cmd), (vec!["PATH=/usr/bin:/bin".to_owned()], vec!["/bin/sh".to_owned()]));
        assert_eq!(store.get("two").unwrap(), image, "{what}: loads as imported");

        let top_tree = &image.layers()[0].lowers[0];
        let wh = fs::symlink_metadata(top_tree.join("etc/c")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{what}: whiteout is a 0/0 char device");
        assert!(is_opaque(&top_tree.join("opt")) && !is_opaque(&top_tree.join("etc")), "{what}");
        assert_eq!(merged_names(&image, "etc"), ["a", "b"], "{what}");
        assert_eq!(merged_content(&image, "etc/a").unwrap(), b"top a\n");
        assert_eq!(merged_content(&image, "etc/b").unwrap(), b"base b\n");
        assert_eq!(merged_names(&image, "opt"), ["n"], "{what}");
        assert!(merged_content(&image, "etc/c").is_none() && merged_content(&image, "opt/o").is_none(), "{what}");

        let ls = store.layer_store();
        let (b, t) = (ls.get(&base.diff_id).unwrap().unwrap(), ls.get(&top.diff_id).unwrap().unwrap());
        assert_eq!(b.media_type, "application/vnd.docker.image.rootfs.diff.tar", "{what}");
        assert_eq!((b.blob_digest, b.bytes), (base.digest(), base.bytes.len() as u64), "{what}");
        assert_eq!(t.media_type, "application/vnd.docker.image.rootfs.diff.tar.gzip", "{what}");
        assert_eq!(t.blob_digest, top.digest(), "{what}");
    }
}

#[test]
fn layers_are_shared_with_an_oci_import_of_the_same_layers() {
    let (tmp, store) = store();
    // The same base layer, gzip in the layout and plain in the archive:
    // one diffid, stored once.
    let a = LayerBlob::gzip(&LayerTar::new().file("a", b"a").finish());
    let b = LayerBlob::tar(&LayerTar::new().file("b", b"b").finish());
    let layout = OciLayout::single(&tmp.path().join("oci"), &[LayerBlob::gzip(&base_tar()), a.clone()]);
    let base = LayerBlob::tar(&base_tar());
    let archive = write(tmp.path(), "d.tar", &DockerArchive::new(DockerLayout::Blobs).image(&[base.clone(), b.clone()], &["d:1"]).finish());

    let from_layout = store.import("o", &layout.dir).unwrap();
    let base_tree = store.layer_store().tree(&base.diff_id).unwrap();
    let ino = fs::metadata(base_tree.join("etc/a")).unwrap().ino();
    let from_archive = store.import("d", &archive).unwrap();
    assert_eq!(store.layer_store().list().unwrap().len(), 3, "the base layer once");
    assert_eq!(from_layout.layers()[0].lowers[1], from_archive.layers()[0].lowers[1]);
    assert_eq!(fs::metadata(base_tree.join("etc/a")).unwrap().ino(), ino, "not unpacked again");
    assert_eq!(merged_content(&from_archive, "b").unwrap(), b"b");
    assert_eq!(merged_content(&from_archive, "etc/b").unwrap(), b"base b\n");

    // Whichever comes last, the layer stays while an image uses it.
    store.remove("o").unwrap();
    assert!(base_tree.join("etc/a").exists());
    assert_eq!(store.layer_store().list().unwrap().len(), 2);
    let again = store.import("o2", &layout.dir).unwrap();
    assert_eq!(again.layers()[0].lowers[1], from_archive.layers()[0].lowers[1]);
    store.remove("d").unwrap();
    store.remove("o2").unwrap();
    assert_left(&store, "d", 0);
}

#[test]
fn an_image_is_chosen_by_its_tag() {
    let (tmp, store) = store();
    let base = LayerBlob::tar(&base_tar());
    let a = LayerBlob::tar(&LayerTar::new().file("which", b"a").finish());
    let b = LayerBlob::tar(&LayerTar::new().file("which", b"b").finish());
    for layout in [DockerLayout::Legacy, DockerLayout::Blobs] {
        // Docker links the second image's copy of the base to the first's
        // in the legacy layout, and stores one blob in the other.
        let bytes = DockerArchive::new(layout)
            .image(&[base.clone(), a.clone()], &["docker.io/cairn/two:v1"])
            .image(std::slice::from_ref(&b), &["cairn/other:latest", "cairn/other:v2"])
            .image(&[LayerBlob::tar(&LayerTar::new().file("x", b"").finish()), base.clone(), b.clone()], &["cairn/third:v1"])
            .finish();
        let path = write(tmp.path(), "several.tar", &bytes);
        let e = store.import("x", &path).unwrap_err().to_string();
        assert!(e.contains("holds 3 images; choose one with --tag") && e.contains("docker.io/cairn/two:v1, cairn/other:latest, cairn/other:v2"), "{e}");
        let two = store.import_tagged("two", &path, Some("cairn/two:v1")).unwrap();
        assert_eq!(two.layers, [base.diff_id.clone(), a.diff_id.clone()]);
        assert_eq!(merged_content(&two, "which").unwrap(), b"a");
        assert!(two.source.ends_with("several.tar:cairn/two:v1"), "{}", two.source);
        let other = store.import_tagged("other", &path, Some("cairn/other")).unwrap();
        assert_eq!(merged_content(&other, "which").unwrap(), b"b");
        let third = store.import_tagged("third", &path, Some("cairn/third:v1")).unwrap();
        assert_eq!(third.layers.len(), 3);
        assert_eq!(merged_content(&third, "etc/b").unwrap(), b"base b\n");
        let e = store.import_tagged("x", &path, Some("cairn/nope:v1")).unwrap_err().to_string();
        assert!(e.contains("no image tagged \"cairn/nope:v1\" (tags: "), "{e}");
        for name in ["two", "other", "third"] {
            store.remove(name).unwrap();
        }
        assert_left(&store, "x", 0);
    }
}

#[test]
fn devices_in_a_layer_are_dropped_and_counted() {
    let (tmp, store) = store();
    let tar = LayerTar::new().dir("dev").device("dev/null").file("f", b"x").finish();
    let path = write(tmp.path(), "dev.tar", &DockerArchive::new(DockerLayout::Legacy).image(&[LayerBlob::tar(&tar)], &[]).finish());
    let image = store.import("dev", &path).unwrap();
    assert_eq!(image.dropped.devices, 1);
    assert!(!image.layers()[0].lowers[0].join("dev/null").exists());
}

#[test]
fn a_rootfs_archive_is_still_a_rootfs_image() {
    let (tmp, store) = store();
    // Top-level files only, as a docker archive has, but no manifest.json.
    let tar = LayerTar::new().file("a.json", b"{}").file("b", b"b").finish();
    let image = store.import("plain", &write(tmp.path(), "plain.tar", &tar)).unwrap();
    assert_eq!(image.kind, ImageKind::Rootfs);
    let image = store.import("plain-gz", &write(tmp.path(), "plain.tar.gz", &gzip(&base_tar()))).unwrap();
    assert_eq!(image.kind, ImageKind::Rootfs);
}

/// A bad input: what it is, the archive, the tag asked for, and what its
/// error must say.
type BadCase = (&'static str, Vec<u8>, Option<&'static str>, Vec<&'static str>);

/// Where `marker` first occurs in `bytes`.
fn find(bytes: &[u8], marker: &[u8]) -> usize {
    bytes.windows(marker.len()).position(|w| w == marker).unwrap()
}

#[test]
fn bad_archives_fail_with_one_line_and_leave_nothing() {
    let (tmp, store) = store();
    // A layer another image holds: a failed import neither removes it nor
    // leaves one of its own.
    let [base, top] = two_layers();
    let kept = DockerArchive::new(DockerLayout::Legacy).image(std::slice::from_ref(&base), &["kept"]).finish();
    store.import("kept", &write(tmp.path(), "kept.tar", &kept)).unwrap();
    let images_before: Vec<String> = store.list().unwrap().into_iter().map(|i| i.name).collect();

    let two = |layout, layers: &[LayerBlob]| DockerArchive::new(layout).image(layers, &["cairn/two:v1"]);
    let both = [base.clone(), top.clone()];
    let mut cases: Vec<BadCase> = Vec::new();

    // manifest.json naming what the archive does not hold.
    let edit = |m: &mut Value| m[0]["Layers"][1] = json!("0123/layer.tar");
    cases.push(("missing layer", two(DockerLayout::Legacy, &both).finish_with(edit), None, vec!["lists 0123/layer.tar, which the archive does not hold"]));
    let edit = |m: &mut Value| m[0]["Config"] = json!("blobs/sha256/nope");
    cases.push(("missing config", two(DockerLayout::Blobs, &both).finish_with(edit), None, vec!["lists blobs/sha256/nope, which the archive does not hold"]));
    let edit = |m: &mut Value| m[0]["Layers"][0] = json!("../../etc/passwd");
    cases.push(("outside", two(DockerLayout::Legacy, &both).finish_with(edit), None, vec!["outside the archive"]));
    let edit = |m: &mut Value| {
        m[0]["Layers"].as_array_mut().unwrap().pop();
    };
    cases.push(("count", two(DockerLayout::Legacy, &both).finish_with(edit), None, vec!["lists 1 layers", "2 diffids"]));

    // A layer that does not unpack to its diffid.
    let mut wrong = top.clone();
    wrong.diff_id = sha256(b"something else");
    cases.push(("diffid", two(DockerLayout::Blobs, &[base.clone(), wrong]).finish(), None, vec!["unpacks to", "not the diffid", "layer blobs/sha256/"]));

    // A config that does not match the digest its name says.
    let bytes = two(DockerLayout::Legacy, &both).finish();
    let config_at = find(&bytes, b"\"rootfs\"");
    let mut tampered = bytes.clone();
    tampered[config_at + 1] = b'R';
    cases.push(("config digest", tampered, None, vec!["has the digest", "corrupt or tampered with"]));

    // The archive cut short in the middle of a layer.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let big = LayerBlob::tar(&LayerTar::new().file("big", &big).file("marker", b"MARKER-1234").finish());
    for layout in [DockerLayout::Legacy, DockerLayout::Blobs] {
        let mut bytes = two(layout, &[base.clone(), big.clone()]).finish();
        bytes.truncate(find(&bytes, b"MARKER-1234"));
        cases.push(("cut archive", bytes.clone(), None, vec!["truncated"]));
        cases.push(("cut gzip archive", gzip(&bytes), None, vec!["unreadable archive"]));
    }

    // A layer whose own stream is cut short (its diffid is of the whole).
    let mut cut = LayerBlob::gzip(&top_tar());
    cut.bytes.truncate(cut.bytes.len() / 2);
    cases.push(("cut layer", two(DockerLayout::Legacy, &[base.clone(), cut]).finish(), None, vec!["unreadable", "layer "]));
    let mut cut = LayerBlob::tar(&big.bytes);
    cut.bytes.truncate(big.bytes.len() / 2);
    cut.diff_id = big.diff_id.clone();
    cases.push(("cut plain layer", two(DockerLayout::Legacy, &[base.clone(), cut]).finish(), None, vec!["unreadable", "/layer.tar"]));

    // Unsafe entries: refused, naming the entry and the layer.
    for (tar, reason) in [
        (LayerTar::new().raw_file(b"../escape", b"x").finish(), "'..'"),
        (LayerTar::new().raw_file(b"/etc/passwd", b"x").finish(), "absolute path"),
        (LayerTar::new().hardlink("etc/link", "etc/a").finish(), "not in this layer"),
        (LayerTar::new().raw_hardlink(b"out", b"../../etc/shadow").finish(), "'..'"),
    ] {
        let bytes = two(DockerLayout::Legacy, &[base.clone(), LayerBlob::tar(&tar)]).finish();
        cases.push(("unsafe", bytes, None, vec![reason, "unsafe entry", "in layer ", "/layer.tar"]));
    }

    // Tags.
    cases.push(("unknown tag", two(DockerLayout::Blobs, &both).finish(), Some("cairn/two:v2"), vec!["no image tagged \"cairn/two:v2\" (tags: cairn/two:v1)"]));
    cases.push(("tag on a rootfs", base_tar(), Some("v1"), vec!["OCI image layout or a docker save archive", "neither"]));

    // Archives of images this does not read.
    let bytes = LayerTar::new().file("manifest.json", b"{\"not\": \"a list\"}").finish();
    cases.push(("bad manifest", bytes, None, vec!["not a docker save manifest"]));
    let hex = "ab".repeat(32);
    let old = LayerTar::new().file("repositories", b"{}").file(&format!("{hex}/layer.tar"), &base.bytes).finish();
    cases.push(("before 1.10", old, None, vec!["without manifest.json"]));
    let oci_archive = LayerTar::new().dir("blobs").dir("blobs/sha256").file("oci-layout", b"{}").file("index.json", b"{}").finish();
    cases.push(("oci-archive", oci_archive, None, vec!["oci-archive", "unpack it"]));

    for (what, bytes, tag, expect) in cases {
        let path = write(tmp.path(), "bad.tar", &bytes);
        let e = store.import_tagged("bad", &path, tag).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{what}: one line: {e}");
        for part in expect {
            assert!(e.contains(part), "{what}: expected {part:?}: {e}");
        }
        assert_left(&store, "bad", 1);
        let images: Vec<String> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(images, images_before, "{what}");
    }
    assert!(store.layer_store().get(&base.diff_id).unwrap().is_some(), "the kept image's layer stays");
}
