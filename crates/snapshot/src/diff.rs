//! What changed between two manifests, as the sandbox sees it.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::manifest::{Entry, EntryKind, LayerTree, Manifest};

/// Sandbox paths (a layer's mount point joined with the entry's path),
/// sorted. Directory mtimes and the inode/ctime bookkeeping are not changes.
/// The answer of `GET /v1/tasks/{id}/snapshots/diff?a=A&b=B`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Diff {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub deleted: Vec<String>,
}

/// From `a` to `b`. A whiteout hides a file of the image: in `b` it is a
/// deletion (of whatever `a` showed there); a whiteout in `a` that `b` no
/// longer has, or replaces with a file, shows the path again: an addition.
pub fn diff(a: &Manifest, b: &Manifest) -> Diff {
    let (mut added, mut changed, mut deleted) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut names: Vec<&str> = a.layers.iter().chain(&b.layers).map(|l| l.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let (la, lb) = (a.layer(name), b.layer(name));
        let Some(at) = lb.or(la).map(|l| l.at.as_path()) else { continue };
        // A name that is not UTF-8 is shown with its bytes written \xNN.
        let show = |e: &Entry| cairn_core::name::escaped(at.join(&e.path).as_os_str().as_bytes()).into_owned();
        let before: HashMap<&Path, &Entry> = la.map(entries).unwrap_or_default();
        let after: HashMap<&Path, &Entry> = lb.map(entries).unwrap_or_default();
        for e in lb.iter().flat_map(|l| &l.entries) {
            let old = before.get(e.path.as_path());
            let was_shown = old.is_some_and(|o| o.kind != EntryKind::Whiteout);
            match (e.kind == EntryKind::Whiteout, old) {
                (true, Some(o)) if o.kind == EntryKind::Whiteout => {}
                (true, _) => {
                    deleted.insert(show(e));
                }
                (false, Some(o)) if was_shown => {
                    if differs(o, e) {
                        changed.insert(show(e));
                    }
                }
                (false, _) => {
                    added.insert(show(e));
                }
            }
        }
        for e in la.iter().flat_map(|l| &l.entries) {
            if !after.contains_key(e.path.as_path()) {
                if e.kind == EntryKind::Whiteout {
                    added.insert(show(e));
                } else {
                    deleted.insert(show(e));
                }
            }
        }
    }
    Diff { added: added.into_iter().collect(), changed: changed.into_iter().collect(), deleted: deleted.into_iter().collect() }
}

fn entries(l: &LayerTree) -> HashMap<&Path, &Entry> {
    l.entries.iter().map(|e| (e.path.as_path(), e)).collect()
}

fn differs(a: &Entry, b: &Entry) -> bool {
    a.kind != b.kind
        || a.mode != b.mode
        || a.uid != b.uid
        || a.gid != b.gid
        || a.xattrs != b.xattrs
        || (a.kind != EntryKind::Dir && a.mtime != b.mtime)
}

#[cfg(test)]
mod tests {
    use cairn_blob::ObjectId;

    use super::*;
    use crate::manifest::{Extent, Timestamp};

    fn e(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: path.into(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: Timestamp { sec: 1, nsec: 0 },
            xattrs: vec![],
            ino: 1,
            ctime: Timestamp { sec: 1, nsec: 0 },
        }
    }

    fn file(data: &str) -> EntryKind {
        let len = data.len() as u64;
        EntryKind::File { size: len, extents: vec![Extent { offset: 0, len, chunks: vec![ObjectId::of(data.as_bytes())] }] }
    }

    fn m(layers: Vec<(&str, &str, Vec<Entry>)>) -> Manifest {
        Manifest::new(
            layers.into_iter().map(|(name, at, entries)| LayerTree::new(name.into(), at.into(), entries)).collect(),
        )
    }

    #[test]
    fn added_changed_deleted_with_whiteouts_and_layers() {
        let mut touched_dir = e("d", EntryKind::Dir);
        touched_dir.mtime.sec = 99;
        let mut chmodded = e("mode", file("x"));
        chmodded.mode = 0o755;
        let mut reinode = e("same", file("s"));
        reinode.ino = 77;
        let a = m(vec![
            (
                "root",
                "/",
                vec![
                    e("", EntryKind::Dir),
                    e("d", EntryKind::Dir),
                    e("d/gone", file("g")),
                    e("edit", file("1")),
                    e("mode", file("x")),
                    e("revived", EntryKind::Whiteout),
                    e("rm_upper", file("u")),
                    e("same", file("s")),
                    e("still_gone", EntryKind::Whiteout),
                ],
            ),
            ("at_usr", "/usr", vec![e("", EntryKind::Dir), e("lib", file("l"))]),
        ]);
        let b = m(vec![
            (
                "root",
                "/",
                vec![
                    e("", EntryKind::Dir),
                    touched_dir,
                    e("d/new", file("n")),
                    e("edit", file("2")),
                    e("lower_rm", EntryKind::Whiteout),
                    chmodded,
                    e("revived", file("r")),
                    e("rm_upper", EntryKind::Whiteout),
                    reinode,
                    e("still_gone", EntryKind::Whiteout),
                ],
            ),
            ("at_usr", "/usr", vec![e("", EntryKind::Dir)]),
        ]);
        let d = diff(&a, &b);
        assert_eq!(d.added, ["/d/new", "/revived"]);
        assert_eq!(d.changed, ["/edit", "/mode"]);
        assert_eq!(d.deleted, ["/d/gone", "/lower_rm", "/rm_upper", "/usr/lib"]);
        assert_eq!(diff(&a, &a), Diff::default());
        let back = diff(&b, &a);
        assert_eq!(back.added, ["/d/gone", "/lower_rm", "/rm_upper", "/usr/lib"]);
        assert_eq!(back.deleted, ["/d/new", "/revived"]);
    }
}
