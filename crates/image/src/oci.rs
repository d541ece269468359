//! Reading an OCI image layout directory (image-spec `image-layout.md`):
//! `oci-layout`, `index.json` and the content-addressed `blobs/`.
//!
//! The layout is untrusted input. It is opened once by path, and every file
//! in it is then opened beneath that descriptor without following a symlink
//! (`cairn_fsat::open_beneath`); a blob must be a regular file of the size
//! its descriptor says, and its sha256 must be its name. Only the small
//! JSON documents are read whole (up to [`MAX_JSON`]); layers are streamed
//! into the layer store, which checks their digests as it unpacks them.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use cairn_fsat::{self as fsat, Kind, OFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::layers::{read_limited, sha256_hex, LayerWant};
use super::path::{quoted, short};
use crate::{Error, Result};

/// The largest index, manifest or config read.
pub(super) const MAX_JSON: u64 = 4 << 20;
/// Indexes nested deeper than this are refused.
const MAX_NESTING: usize = 4;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const MT_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What a task started from the image runs with, from the image config.
/// Kept for the steps that apply it to tasks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RunConfig {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
}

/// An image chosen from a layout or pulled from a registry: its manifest's
/// digest, its run config and its layers, bottom first.
#[derive(Debug)]
pub struct OciImage {
    pub manifest_digest: String,
    pub config: RunConfig,
    pub layers: Vec<LayerWant>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<ContainerConfig>,
    rootfs: RootFs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ContainerConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct LayoutFile {
    #[serde(rename = "imageLayoutVersion")]
    version: String,
}

/// True when `dir` looks like an OCI image layout (it has `oci-layout`).
pub(super) fn is_layout(dir: &Path) -> bool {
    dir.is_dir() && std::fs::symlink_metadata(dir.join("oci-layout")).is_ok()
}

/// An OCI image layout directory, opened.
#[derive(Debug)]
pub(super) struct Layout {
    path: PathBuf,
    dir: OwnedFd,
}

impl Layout {
    pub(super) fn open(path: &Path) -> Result<Layout> {
        let dir = fsat::open_dir(path).map_err(|e| Error::ImageSource(path.to_owned(), e.to_string()))?;
        let layout = Layout { path: path.to_owned(), dir };
        let file: LayoutFile = layout.json_file("oci-layout")?;
        if !file.version.starts_with("1.") {
            return Err(layout.bad(format!("image layout version {} is not supported (1.x is)", quoted(&file.version))));
        }
        Ok(layout)
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Chooses the image: the one the layout holds, or the one tagged `tag`
    /// (its `org.opencontainers.image.ref.name`), resolved through indexes
    /// to this host's platform. Reads and checks its manifest and config.
    pub(super) fn image(&self, tag: Option<&str>) -> Result<OciImage> {
        let index: Index = self.json_file("index.json")?;
        if index.schema_version != 2 {
            return Err(self.bad(format!("index.json has schemaVersion {}, not 2", index.schema_version)));
        }
        let tagged: Vec<&Descriptor> = match tag {
            Some(t) => index.manifests.iter().filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(t)).collect(),
            None => index.manifests.iter().collect(),
        };
        let desc = match (tagged.as_slice(), tag) {
            ([one], _) => *one,
            ([], Some(t)) => return Err(self.bad(format!("no image tagged {t:?} (tags: {})", short(&tags(&index.manifests))))),
            ([], None) => return Err(self.bad("index.json lists no image".into())),
            (several, _) => self.choose_platform(several, tag)?,
        };
        self.resolve(desc, 0)
    }

    /// The image `desc` names: a manifest, or an index resolved to this
    /// host's platform.
    fn resolve(&self, desc: &Descriptor, depth: usize) -> Result<OciImage> {
        if desc.media_type != MT_OCI_INDEX && desc.media_type != MT_DOCKER_LIST {
            return self.manifest(desc);
        }
        if depth >= MAX_NESTING {
            return Err(self.bad(format!("indexes nested more than {MAX_NESTING} deep")));
        }
        let nested: Index = self.json_blob(desc)?;
        let all: Vec<&Descriptor> = nested.manifests.iter().collect();
        let chosen = match all.as_slice() {
            [] => return Err(self.bad(format!("index {} lists no image", desc.digest))),
            [one] => *one,
            several => self.choose_platform(several, None)?,
        };
        self.resolve(chosen, depth + 1)
    }

    /// The entry for this host's platform (linux and its architecture).
    fn choose_platform<'d>(&self, several: &[&'d Descriptor], tag: Option<&str>) -> Result<&'d Descriptor> {
        let arch = host_arch();
        if let Some(d) = several.iter().find(|d| d.platform.as_ref().is_some_and(|p| p.os == "linux" && p.architecture == arch)) {
            return Ok(d);
        }
        if several.iter().any(|d| d.platform.is_some()) {
            let offered: Vec<String> =
                several.iter().filter_map(|d| d.platform.as_ref()).map(|p| format!("{}/{}", p.os, p.architecture)).collect();
            return Err(self.bad(format!("no image for linux/{arch} (the layout has {})", short(&offered.join(", ")))));
        }
        let what = tag.map(|t| format!("{} images tagged {t:?}", several.len())).unwrap_or_else(|| format!("{} images", several.len()));
        Err(self.bad(format!("the layout holds {what}; choose one with --tag (tags: {})", short(&tags_of(several)))))
    }

    fn manifest(&self, desc: &Descriptor) -> Result<OciImage> {
        if ![MT_OCI_MANIFEST, MT_DOCKER_MANIFEST, ""].contains(&desc.media_type.as_str()) {
            return Err(self.bad(format!("{} has the media type {}, not an image manifest", short(&desc.digest), quoted(&desc.media_type))));
        }
        let manifest: Manifest = self.json_blob(desc)?;
        if manifest.schema_version != 2 {
            return Err(self.bad(format!("manifest {} has schemaVersion {}, not 2", desc.digest, manifest.schema_version)));
        }
        let config: ConfigFile = self.json_blob(&manifest.config)?;
        from_parts(&desc.digest, &manifest, config).map_err(|m| self.bad(m))
    }

    /// Opens blob `digest` for reading: a regular file beneath
    /// `blobs/sha256/`, of `size` bytes.
    pub(super) fn blob(&self, digest: &str, size: u64) -> Result<File> {
        let hex = sha256_hex(digest).ok_or_else(|| self.bad(format!("{} is not a sha256 digest", quoted(digest))))?;
        let rel = format!("blobs/sha256/{hex}");
        let fd = fsat::open_beneath(&self.dir, rel.as_str(), OFlags::RDONLY | OFlags::NONBLOCK, 0).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                self.bad(format!("blob {digest} is missing"))
            } else {
                self.bad(format!("cannot open blob {digest}: {e}"))
            }
        })?;
        let st = fsat::fstat(&fd).map_err(|e| self.bad(format!("blob {digest}: {e}")))?;
        if fsat::kind(&st) != Kind::File {
            return Err(self.bad(format!("blob {digest} is not a regular file")));
        }
        if st.st_size as u64 != size {
            return Err(self.bad(format!("blob {digest} is {} bytes, not the {size} its descriptor says", st.st_size)));
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::empty()).map_err(|e| self.bad(format!("blob {digest}: {e}")))?;
        Ok(File::from(fd))
    }

    /// Reads and parses a small JSON blob, checking its size and digest.
    fn json_blob<T: DeserializeOwned>(&self, desc: &Descriptor) -> Result<T> {
        if desc.size > MAX_JSON {
            return Err(self.bad(format!("{} is {} bytes; the limit for a JSON document is {MAX_JSON}", desc.digest, desc.size)));
        }
        let mut bytes = Vec::new();
        read_limited(self.blob(&desc.digest, desc.size)?, desc.size, &mut bytes)
            .map_err(|e| self.bad(format!("reading blob {}: {e}", desc.digest)))?;
        let got = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
        if got != desc.digest {
            return Err(self.bad(format!("blob {} has the digest {got} (corrupt or tampered with)", desc.digest)));
        }
        serde_json::from_slice(&bytes).map_err(|e| self.bad(format!("blob {} is not a valid document: {e}", desc.digest)))
    }

    /// Reads and parses a small JSON file of the layout.
    fn json_file<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let fd = fsat::open_beneath(&self.dir, name, OFlags::RDONLY | OFlags::NONBLOCK, 0)
            .map_err(|e| self.bad(format!("cannot open {name}: {e}")))?;
        let st = fsat::fstat(&fd).map_err(|e| self.bad(format!("{name}: {e}")))?;
        if fsat::kind(&st) != Kind::File {
            return Err(self.bad(format!("{name} is not a regular file")));
        }
        let mut bytes = Vec::new();
        read_limited(File::from(fd), MAX_JSON, &mut bytes).map_err(|e| self.bad(format!("reading {name}: {e}")))?;
        serde_json::from_slice(&bytes).map_err(|e| self.bad(format!("{name} is not valid: {e}")))
    }

    fn bad(&self, msg: String) -> Error {
        Error::ImageSource(self.path.clone(), msg)
    }
}

/// An image config's diffids and run config, checked.
#[derive(Debug)]
pub(super) struct CheckedConfig {
    pub diff_ids: Vec<String>,
    pub run: RunConfig,
}

/// Parses and checks the image config `bytes` (at most [`MAX_JSON`]);
/// `what` names it in errors, which are one-line messages.
pub(super) fn parse_config(what: &str, bytes: &[u8]) -> std::result::Result<CheckedConfig, String> {
    if bytes.len() as u64 > MAX_JSON {
        return Err(format!("config {what} is {} bytes; the limit for a JSON document is {MAX_JSON}", bytes.len()));
    }
    let config: ConfigFile = serde_json::from_slice(bytes).map_err(|e| format!("config {what} is not valid: {e}"))?;
    checked_config(what, config)
}

/// Checks an image config: layers for linux on this host's architecture,
/// each diffid a sha256 digest. `what` names it in errors.
fn checked_config(what: &str, config: ConfigFile) -> std::result::Result<CheckedConfig, String> {
    if config.rootfs.kind != "layers" {
        return Err(format!("config {what} has rootfs type {}, not \"layers\"", quoted(&config.rootfs.kind)));
    }
    if !config.os.is_empty() && config.os != "linux" {
        return Err(format!("the image is for {}, not linux", short(&config.os)));
    }
    if !config.architecture.is_empty() && config.architecture != host_arch() {
        return Err(format!("the image is for {}, and this host is {}", short(&config.architecture), host_arch()));
    }
    for diff_id in &config.rootfs.diff_ids {
        sha256_hex(diff_id).ok_or_else(|| format!("diffid {} is not a sha256 digest", quoted(diff_id)))?;
    }
    let c = config.config.unwrap_or_default();
    let run = RunConfig {
        env: c.env.unwrap_or_default(),
        working_dir: c.working_dir.filter(|w| !w.is_empty()),
        user: c.user.filter(|u| !u.is_empty()),
        entrypoint: c.entrypoint.unwrap_or_default(),
        cmd: c.cmd.unwrap_or_default(),
    };
    Ok(CheckedConfig { diff_ids: config.rootfs.diff_ids, run })
}

/// Checks an image manifest and its config, which the caller has checked
/// against their digests, and describes the image. Errors are messages.
fn from_parts(manifest_digest: &str, manifest: &Manifest, config: ConfigFile) -> std::result::Result<OciImage, String> {
    let config = checked_config(&manifest.config.digest, config)?;
    if config.diff_ids.len() != manifest.layers.len() {
        return Err(format!(
            "manifest {manifest_digest} has {} layers, and its config {} diffids",
            manifest.layers.len(),
            config.diff_ids.len()
        ));
    }
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (layer, diff_id) in manifest.layers.iter().zip(config.diff_ids) {
        sha256_hex(&layer.digest).ok_or_else(|| format!("layer digest {} is not a sha256 digest", quoted(&layer.digest)))?;
        layers.push(LayerWant {
            diff_id,
            blob_digest: layer.digest.clone(),
            blob_size: layer.size,
            media_type: layer.media_type.clone(),
        });
    }
    Ok(OciImage { manifest_digest: manifest_digest.to_owned(), config: config.run, layers })
}

/// Describes an image from its manifest and config documents as a registry
/// served them (the manifest already chosen for this host's platform). The
/// config must have the digest and size the manifest says; the layers are
/// checked as they are unpacked. Errors are one-line messages.
pub fn image_from_documents(manifest_digest: &str, manifest: &[u8], config: &[u8]) -> std::result::Result<OciImage, String> {
    if manifest.len() as u64 > MAX_JSON || config.len() as u64 > MAX_JSON {
        return Err(format!("a manifest or config over the {MAX_JSON}-byte limit"));
    }
    let manifest: Manifest = serde_json::from_slice(manifest).map_err(|e| format!("manifest {manifest_digest} is not valid: {e}"))?;
    if manifest.schema_version != 2 {
        return Err(format!("manifest {manifest_digest} has schemaVersion {}, not 2", manifest.schema_version));
    }
    let got = format!("sha256:{}", hex::encode(sha2::Sha256::digest(config)));
    if got != manifest.config.digest || config.len() as u64 != manifest.config.size {
        return Err(format!("config {} has the digest {got} and {} bytes (corrupt or tampered with)", short(&manifest.config.digest), config.len()));
    }
    let parsed: ConfigFile = serde_json::from_slice(config).map_err(|e| format!("config {} is not valid: {e}", manifest.config.digest))?;
    from_parts(manifest_digest, &manifest, parsed)
}

/// An index entry as [`parse_index`] gives it: media type, digest, and
/// platform (os, architecture). For the fuzz targets only.
#[doc(hidden)]
pub type IndexEntry = (String, String, Option<(String, String)>);

/// Parses an image index (`index.json`, or an index blob) and an image
/// config as a layout import does: the index's `(media type, digest,
/// platform)` entries, or the config's diffids and run config. For the fuzz
/// targets only.
#[doc(hidden)]
pub fn parse_index(bytes: &[u8]) -> std::result::Result<Vec<IndexEntry>, String> {
    if bytes.len() as u64 > MAX_JSON {
        return Err(format!("an index over the {MAX_JSON}-byte limit"));
    }
    let index: Index = serde_json::from_slice(bytes).map_err(|e| format!("index is not valid: {e}"))?;
    if index.schema_version != 2 {
        return Err(format!("index has schemaVersion {}, not 2", index.schema_version));
    }
    Ok(index.manifests.into_iter().map(|d| (d.media_type, d.digest, d.platform.map(|p| (p.os, p.architecture)))).collect())
}

/// See [`parse_index`]; for the fuzz targets only.
#[doc(hidden)]
pub fn parse_config_document(bytes: &[u8]) -> std::result::Result<(Vec<String>, RunConfig), String> {
    parse_config("(fuzzed)", bytes).map(|c| (c.diff_ids, c.run))
}

/// Chooses, among an index's entries given as (os, architecture, digest),
/// the one for this host: linux on its architecture.
pub fn choose_host_platform<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Option<&'a str> {
    let arch = host_arch();
    entries.into_iter().find(|(os, a, _)| *os == "linux" && *a == arch).map(|(_, _, d)| d)
}

/// This host's architecture as OCI names it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

fn tags(list: &[Descriptor]) -> String {
    tags_of(&list.iter().collect::<Vec<_>>())
}

fn tags_of(list: &[&Descriptor]) -> String {
    let names: Vec<&str> = list.iter().filter_map(|d| d.annotations.get(REF_NAME).map(String::as_str)).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
