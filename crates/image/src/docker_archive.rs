//! Reading a `docker save` archive: a tar (plain, or gzip or zstd
//! compressed) holding `manifest.json`, which lists each image's config
//! and layer files, the configs, and the layers as tar files. Docker before
//! 25 writes the layers as `<id>/layer.tar` and the configs as
//! `<hex>.json`; docker 25 and later write them as `blobs/sha256/<hex>`
//! (the archive is then an OCI image layout too, which is not read here);
//! `skopeo` writes `<hex>.tar` and links `<id>/layer.tar` to them.
//!
//! The archive is untrusted input. Its member names are only looked up,
//! never used as paths on the host; a link between members is followed
//! within the archive only. Layers are streamed out of the archive into the
//! layer store, which unpacks them with the same writer as OCI layers and
//! checks each against the diffid its config says.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use sha2::Digest;
use tar::EntryType;

use super::archive::{self, Format};
use super::layers::{is_hex64, read_limited, Blob, BlobCheck, LayerStore};
use super::limits::Budget;
use super::oci::{self, RunConfig, MAX_JSON};
use super::path::{quoted, short};
use crate::{Error, Result};

const MANIFEST: &str = "manifest.json";
/// Links followed from a name `manifest.json` lists to the file it means.
const MAX_LINKS: usize = 8;

/// One image of `manifest.json`.
#[derive(Debug, Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// What a member of the archive is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// A regular file of `size` bytes, whose data ends at `end` in a plain
    /// tar.
    File { size: u64, end: u64 },
    /// A symbolic or hard link to another member (`None`: to a name
    /// outside the archive).
    Link(Option<String>),
    Other,
}

#[derive(Clone, Debug)]
struct Member {
    kind: Kind,
    /// Held more than once, so which copy is meant is unclear.
    twice: bool,
}

/// A member as a walk over the archive meets it.
#[derive(Debug)]
struct Seen {
    /// Its name, normalised (`None`: not UTF-8, or outside the archive).
    name: Option<String>,
    kind: Kind,
    dir: bool,
}

enum Flow {
    More,
    Done,
}

/// The image chosen from an archive: its run config and its layers,
/// bottom first.
#[derive(Debug)]
pub(super) struct DockerImage {
    pub run: RunConfig,
    pub layers: Vec<DockerLayer>,
}

/// One layer of a [`DockerImage`].
#[derive(Debug)]
pub(super) struct DockerLayer {
    pub diff_id: String,
    /// The file as `manifest.json` lists it, naming the layer in errors.
    pub listed: String,
    /// The member holding its bytes (`listed` with links followed).
    member: String,
    size: u64,
}

/// A docker save archive, its members listed and `manifest.json` read.
#[derive(Debug)]
pub(super) struct DockerArchive {
    path: PathBuf,
    format: Format,
    members: HashMap<String, Member>,
    manifest: Vec<ManifestEntry>,
}

impl DockerArchive {
    /// Opens `src` if it is a docker save archive. `None` when it is not
    /// (a directory, no tar, or a tar of something else: the walk stops at
    /// its first member no docker archive has, so a rootfs archive costs
    /// a header or two); an error when it is an archive of images this
    /// cannot read, or a docker archive cut short.
    pub(super) fn open(src: &Path) -> Result<Option<DockerArchive>> {
        let format = match archive::detect(src) {
            Ok(Format::Directory) | Err(_) => return Ok(None),
            Ok(format) => format,
        };
        let bad = |msg: String| Error::ImageSource(src.to_owned(), msg);
        // A plain tar's size: a member whose data ends past it was cut off.
        let len = match format {
            Format::Tar => Some(fs::metadata(src).map_err(|e| bad(e.to_string()))?.len()),
            _ => None,
        };
        let mut members: HashMap<String, Member> = HashMap::new();
        let mut manifest: Option<std::result::Result<Vec<u8>, String>> = None;
        let mut shaped = true;
        let scan = walk(src, format, &mut |seen, data| {
            let Some(name) = seen.name.as_deref().filter(|n| docker_shaped(n, seen.dir)) else {
                shaped = false;
                return Ok(Flow::Done);
            };
            if name == MANIFEST && manifest.is_none() && matches!(seen.kind, Kind::File { .. }) {
                let mut bytes = Vec::new();
                manifest = Some(read_limited(data, MAX_JSON, &mut bytes).map(|()| bytes).map_err(|e| format!("cannot read {MANIFEST}: {e}")));
            }
            members
                .entry(name.to_owned())
                .and_modify(|m| m.twice = true)
                .or_insert(Member { kind: seen.kind.clone(), twice: false });
            Ok(Flow::More)
        });
        if !shaped {
            return Ok(None);
        }
        if let Err(e) = scan {
            // A corrupt archive of something else is for the rootfs import
            // to report.
            return if looks_like_images(&members) { Err(e) } else { Ok(None) };
        }
        if let Some(len) = len {
            if let Some((name, size, end)) = members.iter().find_map(|(n, m)| match m.kind {
                Kind::File { size, end } if end > len => Some((n, size, end)),
                _ => None,
            }) {
                let held = size.saturating_sub(end - len);
                return Err(bad(format!("the archive is truncated: it holds {held} of the {size} bytes of {}", short(name))));
            }
        }
        let manifest = match manifest {
            Some(bytes) => bytes.map_err(bad)?,
            None if members.contains_key(MANIFEST) => return Err(bad(format!("{MANIFEST} is not a regular file"))),
            None if members.contains_key("oci-layout") => {
                return Err(bad("an OCI image layout in a tar (oci-archive): unpack it and import the directory".into()))
            }
            None if members.contains_key("repositories") => {
                return Err(bad(format!("a docker save archive without {MANIFEST} (from docker before 1.10), which is not supported")))
            }
            None if looks_like_images(&members) => return Err(bad(format!("no {MANIFEST}: not a docker save archive, or one cut short"))),
            None => return Ok(None),
        };
        if members.get(MANIFEST).is_some_and(|m| m.twice) {
            return Err(bad(format!("the archive holds {MANIFEST} more than once")));
        }
        let manifest: Vec<ManifestEntry> =
            serde_json::from_slice(&manifest).map_err(|e| bad(format!("{MANIFEST} is not a docker save manifest: {e}")))?;
        Ok(Some(DockerArchive { path: src.to_owned(), format, members, manifest }))
    }

    /// Chooses the image: the only one, or the one tagged `tag` (one of
    /// its `RepoTags`, compared as docker shows them: `cairn/two:v1` is
    /// `docker.io/cairn/two:v1`). Reads and checks its config, and finds
    /// its layers.
    pub(super) fn image(&self, tag: Option<&str>) -> Result<DockerImage> {
        let entry = self.choose(tag)?;
        let (config_member, config_size) = self.resolve(&entry.config)?;
        let bytes = self.read_member(&config_member, config_size)?;
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        if let Some(named) = digest_in_name(&config_member) {
            if named != digest {
                return Err(self.bad(format!("config {} has the digest sha256:{digest}, not the one its name says (corrupt or tampered with)", short(&entry.config))));
            }
        }
        let config = oci::parse_config(&short(&entry.config), &bytes).map_err(|m| self.bad(m))?;
        if config.diff_ids.len() != entry.layers.len() {
            return Err(self.bad(format!(
                "{MANIFEST} lists {} layers for the image, and its config {} {} diffids",
                entry.layers.len(),
                entry.config,
                config.diff_ids.len()
            )));
        }
        let mut layers: Vec<DockerLayer> = Vec::with_capacity(entry.layers.len());
        for (listed, diff_id) in entry.layers.iter().zip(config.diff_ids) {
            let (member, size) = self.resolve(listed)?;
            // One file cannot unpack to two diffids.
            if let Some(other) = layers.iter().find(|l| l.member == member && l.diff_id != diff_id) {
                return Err(self.bad(format!("{MANIFEST} lists {} for the diffids {} and {diff_id}", short(listed), other.diff_id)));
            }
            layers.push(DockerLayer { diff_id, listed: listed.clone(), member, size });
        }
        Ok(DockerImage { run: config.run, layers })
    }

    /// Unpacks into `store`, in one pass over the archive, each of
    /// `image`'s layers it does not hold yet. The caller holds the store's
    /// lock (shared).
    pub(super) fn unpack_layers(&self, image: &DockerImage, store: &LayerStore, budget: &Budget) -> Result<()> {
        let mut pending: HashMap<&str, &DockerLayer> = HashMap::new();
        for layer in &image.layers {
            if store.get(&layer.diff_id)?.is_none() && !pending.values().any(|l| l.diff_id == layer.diff_id) {
                pending.insert(&layer.member, layer);
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        walk(&self.path, self.format, &mut |seen, data| {
            let Some(layer) = seen.name.as_deref().and_then(|n| pending.remove(n)) else { return Ok(Flow::More) };
            let blob = Blob { label: &layer.listed, format: None, media_type: None, check: BlobCheck::Size(layer.size) };
            store.ensure_from(&layer.diff_id, blob, &self.path, budget, || Ok(data))?;
            Ok(if pending.is_empty() { Flow::Done } else { Flow::More })
        })?;
        match pending.values().next() {
            Some(layer) => Err(self.bad(format!("the archive ended before layer {}", short(&layer.listed)))),
            None => Ok(()),
        }
    }

    fn choose(&self, tag: Option<&str>) -> Result<&ManifestEntry> {
        let chosen: Vec<&ManifestEntry> = match tag {
            Some(t) => self.manifest.iter().filter(|e| e.repo_tags.iter().flatten().any(|r| familiar(r) == familiar(t))).collect(),
            None => self.manifest.iter().collect(),
        };
        match (chosen.as_slice(), tag) {
            ([one], _) => Ok(one),
            ([], Some(t)) => Err(self.bad(format!("no image tagged {t:?} (tags: {})", short(&self.tags())))),
            ([], None) => Err(self.bad(format!("{MANIFEST} lists no image"))),
            (several, Some(t)) => Err(self.bad(format!("{} images are tagged {t:?}", several.len()))),
            (several, None) => {
                Err(self.bad(format!("the archive holds {} images; choose one with --tag (tags: {})", several.len(), short(&self.tags()))))
            }
        }
    }

    fn tags(&self) -> String {
        let tags: Vec<&str> = self.manifest.iter().flat_map(|e| e.repo_tags.iter().flatten()).map(String::as_str).collect();
        if tags.is_empty() {
            "none".into()
        } else {
            tags.join(", ")
        }
    }

    /// The regular file member `listed` (a name `manifest.json` gives)
    /// means, links followed, and its size.
    fn resolve(&self, listed: &str) -> Result<(String, u64)> {
        let shown = short(listed);
        let mut name = normalise("", listed).ok_or_else(|| self.bad(format!("{MANIFEST} lists {}, which is outside the archive", quoted(listed))))?;
        for _ in 0..=MAX_LINKS {
            let member = self
                .members
                .get(&name)
                .ok_or_else(|| self.bad(format!("{MANIFEST} lists {shown}, which the archive does not hold")))?;
            if member.twice {
                return Err(self.bad(format!("the archive holds {} more than once", short(&name))));
            }
            match &member.kind {
                Kind::File { size, .. } => return Ok((name, *size)),
                Kind::Link(Some(target)) => name = target.clone(),
                Kind::Link(None) => return Err(self.bad(format!("{shown} links outside the archive"))),
                Kind::Other => return Err(self.bad(format!("{shown} is not a regular file"))),
            }
        }
        Err(self.bad(format!("{shown} is a link more than {MAX_LINKS} links deep")))
    }

    /// Reads member `name` (a regular file of `size` bytes) whole.
    fn read_member(&self, name: &str, size: u64) -> Result<Vec<u8>> {
        let shown = short(name);
        if size > MAX_JSON {
            return Err(self.bad(format!("{shown} is {size} bytes; the limit for a JSON document is {MAX_JSON}")));
        }
        let mut bytes = None;
        walk(&self.path, self.format, &mut |seen, data| {
            if seen.name.as_deref() != Some(name) {
                return Ok(Flow::More);
            }
            let mut read = Vec::new();
            read_limited(data, MAX_JSON, &mut read).map_err(|e| self.bad(format!("cannot read {shown}: {e}")))?;
            bytes = Some(read);
            Ok(Flow::Done)
        })?;
        match bytes {
            Some(b) if b.len() as u64 == size => Ok(b),
            Some(b) => Err(self.bad(format!("{shown} is truncated: {} of its {size} bytes", b.len()))),
            None => Err(self.bad(format!("the archive ended before {shown}"))),
        }
    }

    fn bad(&self, msg: String) -> Error {
        Error::ImageSource(self.path.clone(), msg)
    }
}

/// Calls `visit` with each member of the archive at `path` and its data,
/// in the archive's order, until it says it is done. A plain tar is
/// walked by seeking over the data `visit` does not read.
fn walk(path: &Path, format: Format, visit: &mut dyn FnMut(&Seen, &mut dyn Read) -> Result<Flow>) -> Result<()> {
    let unreadable = |e: io::Error| Error::ImageSource(path.to_owned(), format!("unreadable archive: {e}"));
    let file = File::open(path).map_err(|e| Error::ImageSource(path.to_owned(), e.to_string()))?;
    match format {
        Format::Tar => walk_entries(tar::Archive::new(file).entries_with_seek(), &unreadable, visit),
        // Multi-member: `cat a.gz b.gz` is a valid gzip stream too.
        Format::Gzip => walk_entries(tar::Archive::new(MultiGzDecoder::new(BufReader::new(file))).entries(), &unreadable, visit),
        Format::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(file).map_err(&unreadable)?;
            walk_entries(tar::Archive::new(decoder).entries(), &unreadable, visit)
        }
        Format::Directory => Err(Error::ImageSource(path.to_owned(), "is a directory, not an archive".into())),
    }
}

fn walk_entries<R: Read>(
    entries: io::Result<tar::Entries<'_, R>>,
    unreadable: &dyn Fn(io::Error) -> Error,
    visit: &mut dyn FnMut(&Seen, &mut dyn Read) -> Result<Flow>,
) -> Result<()> {
    // Moving to the next member reads past the rest of the last one, so a
    // stream cut short fails there: name it.
    let mut last: Option<String> = None;
    for entry in entries.map_err(unreadable)? {
        let mut entry = entry.map_err(|e| match &last {
            Some(name) => unreadable(io::Error::new(e.kind(), format!("in {}: {e}", short(name)))),
            None => unreadable(e),
        })?;
        let seen = seen(&entry);
        if let Flow::Done = visit(&seen, &mut entry)? {
            break;
        }
        last = seen.name;
    }
    Ok(())
}

fn seen<R: Read>(entry: &tar::Entry<'_, R>) -> Seen {
    let raw = entry.path_bytes();
    let name = std::str::from_utf8(&raw).ok().and_then(|n| normalise("", n));
    let link = || entry.link_name_bytes().and_then(|l| String::from_utf8(l.into_owned()).ok());
    let kind_of = entry.header().entry_type();
    let kind = match kind_of {
        EntryType::Regular | EntryType::Continuous if !raw.ends_with(b"/") => {
            Kind::File { size: entry.size(), end: entry.raw_file_position().saturating_add(entry.size()) }
        }
        // A symlink's target is relative to its own directory.
        EntryType::Symlink => {
            let dir = name.as_deref().and_then(|n| n.rsplit_once('/')).map_or("", |(d, _)| d);
            Kind::Link(link().and_then(|t| normalise(dir, &t)))
        }
        // A hard link's target is a member's name.
        EntryType::Link => Kind::Link(link().and_then(|t| normalise("", &t))),
        _ => Kind::Other,
    };
    let dir = kind_of == EntryType::Directory || raw.ends_with(b"/");
    Seen { name, kind, dir }
}

/// `rel` taken from directory `base` (both `/`-separated, within the
/// archive), with `.`, `..` and repeated slashes resolved. `None` when it
/// is absolute or climbs out of the archive.
fn normalise(base: &str, rel: &str) -> Option<String> {
    if rel.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// True for a member a docker save archive may have: a file at the top,
/// or anything in `blobs/` or in a directory named by 64 hex digits. A
/// rootfs archive (`./`, `bin/`, `etc/`...) fails this at once.
fn docker_shaped(name: &str, dir: bool) -> bool {
    match name.split_once('/') {
        None if dir => name == "blobs" || is_hex64(name),
        None => !name.is_empty(),
        Some((top, _)) => top == "blobs" || is_hex64(top),
    }
}

/// True when the members are those of an archive of images (docker's or
/// an OCI layout's), not merely docker-shaped.
fn looks_like_images(members: &HashMap<String, Member>) -> bool {
    members.keys().any(|n| {
        [MANIFEST, "repositories", "oci-layout"].contains(&n.as_str())
            || n.strip_prefix("blobs/sha256/").is_some_and(is_hex64)
            || n.strip_suffix("/layer.tar").is_some_and(is_hex64)
            || n.strip_suffix(".tar").is_some_and(is_hex64)
            || n.strip_suffix(".json").is_some_and(is_hex64)
    })
}

/// The sha256 a member's name says its content has: `<hex>.json`,
/// `blobs/sha256/<hex>` or `sha256:<hex>`.
fn digest_in_name(name: &str) -> Option<&str> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let hex = base.strip_suffix(".json").or_else(|| base.strip_prefix("sha256:")).unwrap_or(base);
    is_hex64(hex).then_some(hex)
}

/// A reference as docker shows it: without `docker.io/` and `library/`,
/// and with `:latest` when it has neither tag nor digest.
fn familiar(reference: &str) -> String {
    let r = ["docker.io/", "index.docker.io/"].iter().find_map(|p| reference.strip_prefix(p)).unwrap_or(reference);
    let r = r.strip_prefix("library/").unwrap_or(r);
    let last = r.rsplit('/').next().unwrap_or(r);
    if last.contains(':') || last.contains('@') {
        r.to_owned()
    } else {
        format!("{r}:latest")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_resolved_within_the_archive() {
        assert_eq!(normalise("", "./a//b/./c").as_deref(), Some("a/b/c"));
        assert_eq!(normalise("abc", "../def/layer.tar").as_deref(), Some("def/layer.tar"));
        assert_eq!(normalise("abc", "../../x"), None);
        assert_eq!(normalise("", "/etc/passwd"), None);
    }

    #[test]
    fn tags_compare_as_docker_shows_them() {
        assert_eq!(familiar("docker.io/cairn/two:v1"), familiar("cairn/two:v1"));
        assert_eq!(familiar("docker.io/library/busybox:latest"), familiar("busybox"));
        assert_eq!(familiar("localhost:5000/x"), "localhost:5000/x:latest");
        assert_ne!(familiar("cairn/two:v1"), familiar("cairn/two:v2"));
    }

    #[test]
    fn rootfs_archives_are_not_docker_shaped() {
        let hex = "a".repeat(64);
        assert!(docker_shaped(MANIFEST, false) && docker_shaped(&format!("{hex}/layer.tar"), false));
        assert!(docker_shaped("blobs/sha256", true) && docker_shaped(&hex, true));
        assert!(!docker_shaped("", true) && !docker_shaped("etc", true) && !docker_shaped("etc/passwd", false));
        assert_eq!(digest_in_name(&format!("blobs/sha256/{hex}")), Some(hex.as_str()));
        assert_eq!(digest_in_name(&format!("{hex}.json")), Some(hex.as_str()));
        assert_eq!(digest_in_name("config.json"), None);
    }
}
