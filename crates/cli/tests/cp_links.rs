//! `cairn cp` out of a sandbox with symlinks that lead out of the copied
//! tree: refused by default with a one-line error naming the link,
//! `--follow-links` copies what they point to inside the sandbox,
//! `--keep-links` copies them as they are.

mod common;

use std::path::Path;

use common::Daemon;

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir).into_iter().map(|p| p.strip_prefix(dir).unwrap_or(&p).display().to_string()).collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn links_out_of_the_copied_tree_are_refused_followed_or_kept() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let (code, _, err) = d.sh(
        &id,
        "mkdir -p /workspace/tree/sub /workspace/elsewhere && echo inside > /workspace/tree/a && echo other > /workspace/elsewhere/b \
         && ln -s ../a /workspace/tree/sub/near && ln -s /etc/hostname /workspace/tree/abs && ln -s ../../elsewhere/b /workspace/tree/sub/far",
    );
    assert_eq!(code, 0, "{err}");
    let local = tempfile::tempdir().expect("tempdir");
    let src = format!("{id}:/workspace/tree");

    // Refused, naming the first link that leads out, and nothing written.
    let out = local.path().join("refused");
    let err = d.fails(&["cp", &src, out.to_str().unwrap_or_default()]);
    assert!(err.contains("tree/abs -> /etc/hostname") && err.contains("leads out of the copied tree") && err.contains("--follow-links"), "{err}");
    assert!(!out.exists(), "a refused copy leaves nothing");
    let log = d.json(&["log", &id]).to_string();
    assert!(log.contains("leads out of the copied tree"), "the refusal is in the log: {log}");

    // A link inside the tree is fine on its own (positive control).
    let (code, _, err) = d.sh(&id, "rm /workspace/tree/abs /workspace/tree/sub/far");
    assert_eq!(code, 0, "{err}");
    let ok = local.path().join("ok");
    d.ok(&["cp", &src, ok.to_str().unwrap_or_default()]);
    assert_eq!(std::fs::read_link(ok.join("sub/near")).expect("link kept"), Path::new("../a"));
    assert_eq!(std::fs::read_to_string(ok.join("sub/near")).expect("through the link"), "inside\n");

    let (code, _, err) = d.sh(&id, "ln -s /workspace/elsewhere/b /workspace/tree/abs && ln -s ../../elsewhere /workspace/tree/sub/far");
    assert_eq!(code, 0, "{err}");
    // --keep-links copies them as links.
    let kept = local.path().join("kept");
    d.ok(&["cp", "--keep-links", &src, kept.to_str().unwrap_or_default()]);
    assert_eq!(std::fs::read_link(kept.join("abs")).expect("abs kept"), Path::new("/workspace/elsewhere/b"));
    assert_eq!(std::fs::read_link(kept.join("sub/far")).expect("far kept"), Path::new("../../elsewhere"));

    // --follow-links copies their targets, resolved inside the sandbox.
    let followed = local.path().join("followed");
    d.ok(&["cp", "--follow-links", &src, followed.to_str().unwrap_or_default()]);
    assert_eq!(std::fs::read_to_string(followed.join("abs")).expect("abs followed"), "other\n");
    assert!(std::fs::symlink_metadata(followed.join("sub/far")).expect("far").is_dir());
    assert_eq!(std::fs::read_to_string(followed.join("sub/far/b")).expect("far/b"), "other\n");
    assert_eq!(listing(&followed), ["a", "abs", "sub", "sub/far", "sub/far/b", "sub/near"]);

    // A followed link to a host path is looked up in the sandbox, not on the host.
    let (code, _, err) = d.sh(&id, &format!("ln -sfn {} /workspace/tree/abs", local.path().join("ok/a").display()));
    assert_eq!(code, 0, "{err}");
    let err = d.fails(&["cp", "--follow-links", &src, local.path().join("host").to_str().unwrap_or_default()]);
    assert!(err.contains("no such file or directory in the sandbox"), "{err}");

    // The flags are for copies out.
    let file = local.path().join("f.txt");
    std::fs::write(&file, "x").expect("write");
    let err = d.fails(&["cp", "--keep-links", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/")]);
    assert!(err.contains("apply to copies out"), "{err}");
    let err = d.fails(&["cp", "--keep-links", "--follow-links", &src, "x"]);
    assert!(err.contains("cannot be used together"), "{err}");
}

#[test]
fn copying_in_to_a_path_ending_in_slash_makes_or_needs_a_directory_there() {
    let d = Daemon::start();
    let id = d.create(&[]);
    let local = tempfile::tempdir().expect("tempdir");
    let file = local.path().join("f.txt");
    std::fs::write(&file, "x").expect("write");
    // A file there is no directory: refused, and the file is untouched.
    let (code, _, err) = d.sh(&id, "printf keep > /workspace/afile");
    assert_eq!(code, 0, "{err}");
    let err = d.fails(&["cp", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/afile/")]);
    assert!(err.contains("/workspace/afile/") && err.to_lowercase().contains("not a directory"), "{err}");
    assert_eq!(d.sh(&id, "cat /workspace/afile").1, "keep");
    // Missing, it is made (as mkdir -p would) and the file lands inside.
    d.ok(&["cp", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/made/")]);
    assert_eq!(d.sh(&id, "cat /workspace/made/f.txt").1, "x");
    // Positive controls: without the slash it is the file's new name, and
    // into an existing directory (or a link to one) it keeps its own.
    d.ok(&["cp", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/nodir")]);
    let (code, _, err) = d.sh(&id, "mkdir /workspace/dir && ln -s dir /workspace/to-dir");
    assert_eq!(code, 0, "{err}");
    d.ok(&["cp", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/dir/")]);
    d.ok(&["cp", file.to_str().unwrap_or_default(), &format!("{id}:/workspace/to-dir")]);
    let (code, out, _) = d.sh(&id, "cat /workspace/nodir /workspace/dir/f.txt; ls -A /workspace/dir; test -L /workspace/to-dir && echo still-a-link");
    assert_eq!((code, out.as_str()), (0, "xxf.txt\nstill-a-link\n"));
}
