//! Images: the read-only base filesystems sandboxes start from.
//!
//! An [`ImageStore`] keeps each image in `<root>/<name>/`: the tree in
//! `rootfs/` and its description, an [`Image`], in `image.json`. Images are
//! built in a hidden `.tmp-*` directory and renamed into place complete, so
//! a crash never leaves a half image visible (see `staging`).
//!
//! There are three kinds:
//! - the built-in `host` image ([`ImageStore::ensure_host`]), a small
//!   skeleton that borrows the host's `/usr` through a [`Projection`];
//! - imported images ([`ImageStore::import`]), copied from a directory or
//!   unpacked from a tar archive. Archives are untrusted: see `archive` and
//!   `writer` for how their entries are kept inside the image;
//! - OCI images, imported from an OCI image layout directory (`oci`) or a
//!   `docker save` archive (`docker_archive`), or pulled: a stack of layers
//!   kept in the shared [`LayerStore`] (`layers`), which the sandbox mounts
//!   as overlayfs lower directories. Their `rootfs/` is empty; `image.json`
//!   names the layers.
//! - templates ([`ImageStore::commit`]): another image (the parent) with
//!   one more layer on top of each of its overlays, committed from a task's
//!   writable layer. The base a fork's tasks share is a hidden template
//!   (named by [`fork_base_name`], not listed), whose layers count as the
//!   tasks' own changes.
//!
//! Image contents keep their owners' numeric ids as they are on the host;
//! the sandbox maps them into its user namespace with an idmapped mount.
//! They keep their set-id bits and file capabilities too; device nodes,
//! fifos and sockets are dropped.
//!
//! What one import may unpack is bounded ([`ImportLimits`], see `limits`).

mod archive;
mod copy;
mod error;
mod overlay;
pub mod stack;
mod docker_archive;
mod host;
pub mod layers;
mod limits;
mod oci;
mod path;
mod progress;
mod staging;
mod tarstream;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod oci_tests;
#[cfg(test)]
mod docker_archive_tests;
#[cfg(test)]
mod archive_tests;
mod writer;

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use self::archive::Format;
use self::copy::{copy_tree, CopyPolicy};
use self::limits::Budget;
use self::path::RelPath;
use self::staging::{discard, fsync_dir, temp_path, Staging};
use self::writer::TreeWriter;
pub use self::error::{Error, Result};
pub use self::layers::{LayerInfo, LayerStore};
pub use self::overlay::Layer;
pub use self::stack::{Lookup, LowerStack};
pub use self::limits::{ImportLimits, SizeBound, DEFAULT_MAX_EXPANDED_SIZE, DEFAULT_MAX_LOGICAL_SIZE};
pub use self::progress::ImportProgress;
pub(crate) use self::limits::too_large_reason;
pub(crate) use self::path::{quoted, short};
pub use self::oci::{choose_host_platform, host_arch, image_from_documents, OciImage, RunConfig};
// Entry points for the fuzz targets only.
#[doc(hidden)]
pub use self::archive::{unpack_layer_for_fuzzing, FuzzedLayer};
#[doc(hidden)]
pub use self::oci::{parse_config_document, parse_index, IndexEntry};

/// Name of the built-in image.
pub const HOST_IMAGE: &str = "host";

const IMAGE_JSON: &str = "image.json";
const ROOTFS: &str = "rootfs";
const TMP_PREFIX: &str = ".tmp-";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// The built-in image made from the host's own userland.
    Host,
    /// A self-contained tree, imported.
    Rootfs,
    /// A stack of shared layers, imported from an OCI image.
    Oci,
    /// Another image with a task's writable layer committed on top.
    Template,
}

impl ImageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::Host => "host",
            ImageKind::Rootfs => "rootfs",
            ImageKind::Oci => "oci",
            ImageKind::Template => "template",
        }
    }
}

/// An image, as recorded in its `image.json`, and as `GET /v1/images` lists
/// it and an import answers it (without what is set when it is loaded).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Image {
    pub name: String,
    pub kind: ImageKind,
    /// The image's tree on the daemon's host.
    #[cfg_attr(feature = "schema", schema(value_type = String))]
    pub rootfs: PathBuf,
    /// Host directories to mount read-only into the tree.
    #[serde(default)]
    pub projections: Vec<Projection>,
    /// Total size of the regular files (each hard-linked file once).
    pub size_bytes: u64,
    /// Number of entries in the tree (files, directories, links).
    pub files: u64,
    /// Unix time in milliseconds.
    pub created_ms: i64,
    /// Where it came from: `host`, or the imported path.
    pub source: String,
    /// What was left out because an image must not carry it.
    #[serde(default)]
    pub dropped: Dropped,
    /// An OCI image's layers (diffids), bottom first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// An OCI image's run configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// The digest of the OCI manifest it was imported from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// The layers' trees on the host, top first (set when loaded).
    #[serde(skip)]
    pub lowers: Vec<PathBuf>,
    /// A template's parent: the image of the task it was committed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// A template's own layers, one for each overlay the task wrote to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub committed: Vec<Committed>,
    /// For the hidden base a fork's tasks share: the snapshot it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_of: Option<String>,
    /// A template's overlays: the parent's with its own layers on top (set
    /// when loaded).
    #[serde(skip)]
    pub stack: Vec<Layer>,
    /// A read-only directory laid over the image root for one task (the
    /// daemon's: the task's CA added to the trust store), above the image
    /// and below the task's own changes. Never stored with the image.
    #[serde(skip)]
    pub trust: Option<PathBuf>,
}

/// One layer a template adds: a task's writable layer at one overlay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Committed {
    /// Where the overlay appears in the sandbox (`/`, `/usr`).
    #[cfg_attr(feature = "schema", schema(value_type = String))]
    pub at: PathBuf,
    /// Its key in the layer store.
    pub layer: String,
}

/// Most templates stacked on one another (each adds a lower directory to
/// every overlay it commits).
pub const MAX_TEMPLATE_DEPTH: usize = 32;

const FORK_BASE_PREFIX: &str = ".fork-";

/// The name of the hidden template the forks of snapshot `snapshot` share.
/// Not a valid image name, so no user can make or pull one.
pub fn fork_base_name(snapshot: &str) -> String {
    format!("{FORK_BASE_PREFIX}{snapshot}")
}

/// True for a name [`fork_base_name`] makes.
pub fn is_fork_base(name: &str) -> bool {
    name.strip_prefix(FORK_BASE_PREFIX).is_some_and(|id| {
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    })
}

impl Image {
    /// The overlay layers of a sandbox on this image: the image root, then
    /// each projection. Each has its writable directory on the task disk
    /// under [`Layer::disk_name`]; snapshots and restores read and write
    /// them there.
    pub fn layers(&self) -> Vec<Layer> {
        let mut layers = if self.kind == ImageKind::Template {
            self.stack.clone()
        } else {
            let root = if self.lowers.is_empty() { vec![self.rootfs.clone()] } else { self.lowers.clone() };
            let mut layers = vec![Layer { lowers: root, at: "/".into(), history: 0 }];
            layers.extend(self.projections.iter().map(|p| Layer { lowers: vec![p.host_path.clone()], at: p.at.clone(), history: 0 }));
            layers
        };
        if let (Some(trust), Some(root)) = (&self.trust, layers.iter_mut().find(|l| l.at == Path::new("/"))) {
            let at = root.history.min(root.lowers.len());
            root.lowers.insert(at, trust.clone());
        }
        layers
    }
}

/// A host directory shown read-only at a path inside the image (the host
/// image projects the host's /usr at /usr).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Projection {
    #[cfg_attr(feature = "schema", schema(value_type = String))]
    pub host_path: PathBuf,
    /// Absolute path inside the sandbox.
    #[cfg_attr(feature = "schema", schema(value_type = String))]
    pub at: PathBuf,
}

/// Counts of what an import dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Dropped {
    /// Character and block devices: the sandbox gets its `/dev` elsewhere.
    pub devices: u64,
    /// Fifos and sockets.
    pub fifos_sockets: u64,
    /// Entries whose setuid and/or setgid bits were cleared: 0 since
    /// imports keep them; an image imported before says how many it lost.
    #[serde(default)]
    pub setid: u64,
}

impl Dropped {
    fn add(&mut self, other: &Dropped) {
        self.devices += other.devices;
        self.fifos_sockets += other.fifos_sockets;
        self.setid += other.setid;
    }
}

/// The images under one directory, normally `$CAIRN_HOME/images`.
#[derive(Clone, Debug)]
pub struct ImageStore {
    root: PathBuf,
    layers: LayerStore,
    limits: ImportLimits,
    imports: progress::Imports,
}

impl ImageStore {
    /// Opens the store at `root` (created on first import), with its
    /// layers in the sibling directory `layers`, and removes what
    /// interrupted imports and removals left behind.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let layers = LayerStore::new(root.with_file_name("layers"));
        let store = ImageStore { root, layers, limits: ImportLimits::default(), imports: progress::Imports::default() };
        if let Err(e) = store.cleanup() {
            tracing::warn!(root = %store.root.display(), "cannot clean up the image store: {e}");
        }
        if let Err(e) = store.layers.cleanup() {
            tracing::warn!(root = %store.layers.root().display(), "cannot clean up the layer store: {e}");
        }
        store
    }

    /// This store, with imports and pulls bounded by `limits` instead of
    /// the defaults.
    pub fn with_limits(mut self, limits: ImportLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> ImportLimits {
        self.limits
    }

    pub fn layer_store(&self) -> &LayerStore {
        &self.layers
    }

    /// Before a pull downloads `need` bytes of layers into the layer store:
    /// the bound they would cross, and its value. The downloads count
    /// against the bounds of what they unpack to (they are on the same
    /// disk until then, and a layer unpacks to at least about its size).
    pub fn download_bound(&self, need: u64) -> Result<Option<(SizeBound, u64)>> {
        let dir = self.layers.root();
        fs::create_dir_all(dir).map_err(|e| Error::ImageIo(dir.to_owned(), e))?;
        let spare = limits::spare(dir)?;
        Ok(if need > self.limits.max_expanded_size {
            Some((SizeBound::Expanded, self.limits.max_expanded_size))
        } else if need > spare {
            Some((SizeBound::FreeSpace, spare))
        } else {
            None
        })
    }

    /// The budget of one import writing into `dir`'s filesystem.
    fn budget(&self, dir: &Path) -> Result<Budget> {
        fs::create_dir_all(dir).map_err(|e| Error::ImageIo(dir.to_owned(), e))?;
        Budget::for_import(self.limits, dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How far the import of image `name` going on has got; `None` when
    /// none is.
    pub fn import_progress(&self, name: &str) -> Option<ImportProgress> {
        self.imports.get(name)
    }

    /// Deletes the `.tmp-*` directories of imports and removals that did
    /// not finish, except those another process is still building. Returns
    /// how many were deleted.
    pub fn cleanup(&self) -> Result<usize> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::ImageIo(self.root.clone(), e)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| Error::ImageIo(self.root.clone(), e))?;
            if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                continue;
            }
            let path = entry.path();
            match discard(&path) {
                Ok(true) => removed += 1,
                Ok(false) => tracing::debug!(path = %path.display(), "still being built; kept"),
                Err(e) => return Err(Error::ImageIo(path, e)),
            }
        }
        Ok(removed)
    }

    /// Returns the built-in `host` image, building it first if needed. Once
    /// built, this only reads its `image.json`.
    pub fn ensure_host(&self) -> Result<Image> {
        self.ensure_host_from(Path::new("/"))
    }

    /// [`ImageStore::ensure_host`] for a host whose root is `host_root`.
    fn ensure_host_from(&self, host_root: &Path) -> Result<Image> {
        match self.load(HOST_IMAGE) {
            Err(Error::UnknownImage(_)) => {}
            found => return found,
        }
        let staging = Staging::new(&self.root)?;
        // Not bounded by the free space: the host image is small, and a
        // daemon must start on a full disk too.
        let mut w = TreeWriter::new(&staging.rootfs(), host_root, Budget::new(self.limits, None))?;
        let projections = host::build(host_root, &mut w)?;
        let dropped = w.finish()?;
        let image = self.describe(HOST_IMAGE, ImageKind::Host, &staging, projections, dropped, HOST_IMAGE.into())?;
        match staging.publish(&self.image_dir(HOST_IMAGE), &image) {
            // Another process built it at the same time: theirs is as good.
            Err(Error::ImageExists(_)) => self.load(HOST_IMAGE),
            published => published.map(|()| image),
        }
    }

    /// Imports image `name` from `src`: a directory, or a tar archive (plain,
    /// gzip or zstd, recognised by content). Nothing is visible in the store
    /// unless the whole import succeeds.
    pub fn import(&self, name: &str, src: &Path) -> Result<Image> {
        self.import_tagged(name, src, None)
    }

    /// [`ImageStore::import`], where `src` may also be an OCI image layout
    /// directory (one with an `oci-layout` file) or a `docker save` archive
    /// (a tar with `manifest.json`, plain or compressed); `tag` chooses the
    /// image when it holds several: a layout's ref name, or an archive's
    /// `RepoTags`.
    pub fn import_tagged(&self, name: &str, src: &Path, tag: Option<&str>) -> Result<Image> {
        check_name(name)?;
        // `host` is reserved even before the host image is built.
        if name == HOST_IMAGE || self.image_dir(name).exists() {
            return Err(Error::ImageExists(name.to_owned()));
        }
        let tracked = self.imports.start(name);
        if oci::is_layout(src) {
            return self.import_oci(name, src, tag);
        }
        if let Some(archive) = docker_archive::DockerArchive::open(src)? {
            let result = self.import_docker(name, src, &archive, tag);
            return self.collect_after_failure(result);
        }
        if tag.is_some() {
            return Err(Error::ImageSource(
                src.to_owned(),
                "a tag chooses an image of an OCI image layout or a docker save archive (a tar with manifest.json), and this is neither".into(),
            ));
        }
        let format = archive::detect(src)?;
        if format == Format::Directory {
            self.check_not_ancestor(src)?;
        }
        let staging = Staging::new(&self.root)?;
        let budget = self.budget(&self.root)?;
        self.imports.track_budget(name, &budget);
        let mut w = TreeWriter::new(&staging.rootfs(), src, budget)?;
        match format {
            Format::Directory => copy_tree(src, &RelPath::root(), &mut w, CopyPolicy::EXACT)?,
            _ => archive::unpack(src, format, &mut w, &tracked)?,
        }
        let dropped = w.finish()?;
        if format != Format::Directory {
            if let Some(top) = wrapped_root(&staging.rootfs()) {
                return Err(Error::ImageSource(
                    src.to_owned(),
                    format!("the archive holds one top-level directory, {top}/, with a root filesystem inside it; nothing could run from this image: archive that directory's contents instead (tar -C {top} -cf FILE .)"),
                ));
            }
        }
        let source = std::path::absolute(src).unwrap_or_else(|_| src.to_owned()).display().to_string();
        let image = self.describe(name, ImageKind::Rootfs, &staging, Vec::new(), dropped, source)?;
        staging.publish(&self.image_dir(name), &image)?;
        tracing::info!(image = name, files = image.files, bytes = image.size_bytes, dropped = ?image.dropped, "imported image");
        Ok(image)
    }

    /// Imports an OCI image layout: each layer into the layer store (unless
    /// it is there already), then the image naming them. On failure, the
    /// layers this import added and no image uses are removed again.
    fn import_oci(&self, name: &str, src: &Path, tag: Option<&str>) -> Result<Image> {
        let result = self.import_oci_locked(name, src, tag);
        self.collect_after_failure(result)
    }

    /// Imports the image `tag` chooses from a docker save archive, as
    /// [`ImageStore::import_oci`] does from a layout: the layers the store
    /// lacks, read in one pass over the archive, then the image.
    fn import_docker(&self, name: &str, src: &Path, archive: &docker_archive::DockerArchive, tag: Option<&str>) -> Result<Image> {
        let chosen = archive.image(tag)?;
        let _lock = self.layers.lock(false)?;
        let budget = self.budget(self.layers.root())?;
        self.imports.track_budget(name, &budget);
        archive.unpack_layers(&chosen, &self.layers, &budget)?;
        let mut layers = Vec::with_capacity(chosen.layers.len());
        for layer in &chosen.layers {
            let info = self.layers.get(&layer.diff_id)?.ok_or_else(|| {
                Error::ImageSource(src.to_owned(), format!("layer {} is not in the layer store after unpacking", short(&layer.listed)))
            })?;
            layers.push(info);
        }
        self.publish_stack(name, source_of(src, tag), chosen.run, None, &layers)
    }

    /// Passes `result` on; when it is a failure, first removes the layers
    /// no image uses (those the failed import added).
    fn collect_after_failure(&self, result: Result<Image>) -> Result<Image> {
        if result.is_err() {
            if let Err(e) = self.gc_layers() {
                tracing::warn!("cannot remove the layers of a failed import: {e}");
            }
        }
        result
    }

    /// Makes image `name` of an image pulled from `reference`: each layer
    /// not in the layer store yet is unpacked from the blob downloaded to
    /// `blobs[its digest]` (checked again for its digest, size and diffid).
    /// On failure nothing is left: no image, and no layer no image uses.
    /// The caller deletes the downloaded blobs.
    pub fn import_pulled(
        &self,
        name: &str,
        reference: &str,
        chosen: OciImage,
        blobs: &std::collections::HashMap<String, PathBuf>,
    ) -> Result<Image> {
        check_name(name)?;
        if name == HOST_IMAGE || self.image_dir(name).exists() {
            return Err(Error::ImageExists(name.to_owned()));
        }
        let source = PathBuf::from(reference);
        let open = |want: &layers::LayerWant| -> Result<fs::File> {
            let path = blobs.get(&want.blob_digest).ok_or_else(|| {
                Error::ImageSource(source.clone(), format!("layer {} was removed while the image was pulled; pull again", want.diff_id))
            })?;
            fs::File::open(path).map_err(|e| Error::ImageIo(path.clone(), e))
        };
        let result = self.publish_oci(name, reference.to_owned(), chosen, &source, open);
        self.collect_after_failure(result)
    }

    fn import_oci_locked(&self, name: &str, src: &Path, tag: Option<&str>) -> Result<Image> {
        let layout = oci::Layout::open(src)?;
        let chosen = layout.image(tag)?;
        self.publish_oci(name, source_of(src, tag), chosen, layout.path(), |want| layout.blob(&want.blob_digest, want.blob_size))
    }

    /// Ensures each of `chosen`'s layers (unpacking those not stored from
    /// the blob `open` gives) and publishes the image naming them.
    fn publish_oci<R: io::Read>(
        &self,
        name: &str,
        source: String,
        chosen: OciImage,
        origin: &Path,
        open: impl Fn(&layers::LayerWant) -> Result<R>,
    ) -> Result<Image> {
        let _lock = self.layers.lock(false)?;
        // One budget for all the layers this import unpacks.
        let budget = self.budget(self.layers.root())?;
        self.imports.track_budget(name, &budget);
        let mut layers = Vec::with_capacity(chosen.layers.len());
        for want in &chosen.layers {
            layers.push(self.layers.ensure(want, origin, &budget, || open(want))?);
        }
        self.publish_stack(name, source, chosen.config, Some(chosen.manifest_digest), &layers)
    }

    /// Publishes image `name`, the stack of `layers` (stored, bottom
    /// first). The caller holds the layer store's lock (shared).
    fn publish_stack(
        &self,
        name: &str,
        source: String,
        config: RunConfig,
        manifest_digest: Option<String>,
        layers: &[LayerInfo],
    ) -> Result<Image> {
        let (mut size_bytes, mut files, mut dropped) = (0, 0, Dropped::default());
        for info in layers {
            size_bytes += info.size_bytes;
            files += info.files;
            dropped.add(&info.dropped);
        }
        let staging = Staging::new(&self.root)?;
        let mut image = Image {
            name: name.to_owned(),
            kind: ImageKind::Oci,
            rootfs: self.image_dir(name).join(ROOTFS),
            projections: Vec::new(),
            size_bytes,
            files,
            created_ms: now_ms(),
            source,
            dropped,
            layers: layers.iter().map(|l| l.diff_id.clone()).collect(),
            config: Some(config),
            manifest_digest,
            lowers: Vec::new(),
            parent: None,
            committed: Vec::new(),
            fork_of: None,
            stack: Vec::new(),
            trust: None,
        };
        staging.publish(&self.image_dir(name), &image)?;
        image.lowers = self.lowers_of(&image.layers)?;
        tracing::info!(image = name, layers = image.layers.len(), files, bytes = size_bytes, "imported OCI image");
        Ok(image)
    }

    /// Makes template `name`: image `parent` with one more layer on top of
    /// some of its overlays, each given as (where the overlay is, its key in
    /// the layer store, a tree in a [`layers::Scratch`] of the layer store
    /// to move in as that layer). `name` is a fork base name (see
    /// [`fork_base_name`]) exactly when `fork_of` is given.
    pub fn commit(
        &self,
        name: &str,
        parent: &str,
        source: String,
        fork_of: Option<String>,
        layers: Vec<(PathBuf, String, PathBuf)>,
    ) -> Result<Image> {
        match &fork_of {
            Some(_) if !is_fork_base(name) => return Err(Error::InvalidImageName(cairn_core::Error::ImageName(name.to_owned()))),
            Some(_) => {}
            None => check_name(name)?,
        }
        if name == HOST_IMAGE || self.image_dir(name).exists() {
            return Err(Error::ImageExists(name.to_owned()));
        }
        let base = self.get(parent)?;
        let _lock = self.layers.lock(false)?;
        let (mut size_bytes, mut files) = (base.size_bytes, base.files);
        let mut committed = Vec::new();
        for (at, key, tree) in layers {
            if !base.layers().iter().any(|l| l.at == at) {
                return Err(Error::ImageSource(tree, format!("image {parent:?} has no overlay at {}", at.display())));
            }
            let info = self.layers.adopt(&key, &tree, &source)?;
            size_bytes += info.size_bytes;
            files += info.files;
            committed.push(Committed { at, layer: key });
        }
        let staging = Staging::new(&self.root)?;
        let image = Image {
            name: name.to_owned(),
            kind: ImageKind::Template,
            rootfs: self.image_dir(name).join(ROOTFS),
            projections: base.projections.clone(),
            size_bytes,
            files,
            created_ms: now_ms(),
            source,
            dropped: Dropped::default(),
            layers: Vec::new(),
            config: base.config.clone(),
            manifest_digest: None,
            lowers: Vec::new(),
            parent: Some(parent.to_owned()),
            committed,
            fork_of,
            stack: Vec::new(),
            trust: None,
        };
        staging.publish(&self.image_dir(name), &image)?;
        let image = self.load(name)?;
        tracing::info!(image = name, parent, layers = image.committed.len(), "committed template");
        Ok(image)
    }

    /// The layer trees of `diff_ids` (bottom first), top first.
    fn lowers_of(&self, diff_ids: &[String]) -> Result<Vec<PathBuf>> {
        diff_ids.iter().rev().map(|d| self.layers.tree(d)).collect()
    }

    /// Removes the layers no image uses. Returns their diffids.
    pub fn gc_layers(&self) -> Result<Vec<String>> {
        self.layers.gc(|| self.layers_in_use())
    }

    /// The layers every image uses (hidden ones included). An image whose
    /// description cannot be read fails this, so that its layers are never
    /// taken for unused.
    fn layers_in_use(&self) -> Result<HashSet<String>> {
        let mut used = HashSet::new();
        for name in self.names_with_hidden()? {
            match self.describe_only(&name) {
                Ok(image) => {
                    used.extend(image.layers);
                    used.extend(image.committed.into_iter().map(|c| c.layer));
                }
                Err(Error::UnknownImage(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(used)
    }

    /// The templates (hidden ones included) whose parent is `name`.
    pub fn children(&self, name: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for n in self.names_with_hidden()? {
            match self.describe_only(&n) {
                Ok(image) if image.parent.as_deref() == Some(name) => out.push(n),
                Ok(_) | Err(Error::UnknownImage(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The hidden fork bases in the store.
    pub fn fork_bases(&self) -> Result<Vec<String>> {
        Ok(self.names_with_hidden()?.into_iter().filter(|n| is_fork_base(n)).collect())
    }

    /// All complete images, sorted by name; the host image once built.
    pub fn list(&self) -> Result<Vec<Image>> {
        let mut images = Vec::new();
        for name in self.names()? {
            match self.load(&name) {
                Ok(image) => images.push(image),
                Err(Error::UnknownImage(_)) => {}
                Err(e) => tracing::warn!(image = name, "skipping unreadable image: {e}"),
            }
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// Image `name`, also a hidden fork base.
    pub fn get(&self, name: &str) -> Result<Image> {
        if !is_fork_base(name) {
            check_name(name)?;
        }
        self.load(name)
    }

    /// Removes image `name`. It is first renamed to a `.tmp-*` name, so a
    /// crash while deleting leaves no half image, only litter for
    /// [`ImageStore::cleanup`].
    /// Refused while a template is made from it.
    pub fn remove(&self, name: &str) -> Result<()> {
        if !is_fork_base(name) {
            check_name(name)?;
        }
        if name == HOST_IMAGE {
            return Err(Error::ImageBuiltIn(name.to_owned()));
        }
        let image = self.describe_only(name)?;
        let children = self.children(name)?;
        if !children.is_empty() {
            return Err(Error::ImageInUse(name.to_owned(), format!("template(s) {} are made from it", children.join(", "))));
        }
        let trash = temp_path(&self.root);
        match fs::rename(self.image_dir(name), &trash) {
            Ok(()) => {}
            // Removed by someone else in the meantime.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::UnknownImage(name.to_owned())),
            Err(e) => return Err(Error::ImageIo(self.image_dir(name), e)),
        }
        fsync_dir(&self.root).map_err(|e| Error::ImageIo(self.root.clone(), e))?;
        // The image is gone from the store now; failing to free its space
        // is only worth a warning, and cleanup will retry.
        if let Err(e) = discard(&trash) {
            tracing::warn!(path = %trash.display(), "cannot delete removed image: {e}");
        }
        if !image.layers.is_empty() || !image.committed.is_empty() {
            if let Err(e) = self.gc_layers() {
                tracing::warn!(image = name, "cannot remove the layers no image uses: {e}");
            }
        }
        Ok(())
    }

    fn image_dir(&self, name: &str) -> PathBuf {
        self.root.join(dir_name(name))
    }

    /// The names of the images in the store, from their directories'
    /// `image.json` (a reference's directory name is escaped; see
    /// [`dir_name`]). Skips `.tmp-*` and anything that is no image.
    fn names(&self) -> Result<Vec<String>> {
        self.dir_names(false)
    }

    /// [`ImageStore::names`] and the hidden fork bases.
    fn names_with_hidden(&self) -> Result<Vec<String>> {
        self.dir_names(true)
    }

    fn dir_names(&self, hidden: bool) -> Result<Vec<String>> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::ImageIo(self.root.clone(), e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::ImageIo(self.root.clone(), e))?;
            let Some(dir) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if dir.starts_with('.') {
                if hidden && is_fork_base(&dir) {
                    names.push(dir);
                }
                continue;
            }
            // A plain name is its own directory; only an escaped one needs
            // its `image.json` read for the real name.
            if check_name(&dir).is_ok() && dir_name(&dir) == dir {
                names.push(dir);
                continue;
            }
            let json = entry.path().join(IMAGE_JSON);
            let Ok(bytes) = fs::read(&json) else { continue };
            #[derive(Deserialize)]
            struct Named {
                name: String,
            }
            match serde_json::from_slice::<Named>(&bytes) {
                Ok(n) if check_name(&n.name).is_ok() && dir_name(&n.name) == dir => names.push(n.name),
                _ => tracing::warn!(dir, "skipping an image directory whose image.json does not name it"),
            }
        }
        Ok(names)
    }

    /// Reads a (validly named) image's description, with the layer stack it
    /// mounts (a template's parents are read for it). An image directory
    /// without `image.json` is not an image.
    fn load(&self, name: &str) -> Result<Image> {
        let mut image = self.describe_only(name)?;
        if image.kind == ImageKind::Template {
            self.resolve_template(&mut image, 0)?;
        }
        Ok(image)
    }

    /// A template's overlays: its parent's, each with the template's own
    /// layer on top. Below a template that is no fork base, everything is
    /// image (its parent's fork layers count as the image's too).
    fn resolve_template(&self, image: &mut Image, depth: usize) -> Result<()> {
        let json = self.image_dir(&image.name).join(IMAGE_JSON);
        let broken = |msg: String| Error::ImageIo(json.clone(), io::Error::new(io::ErrorKind::InvalidData, msg));
        if depth >= MAX_TEMPLATE_DEPTH {
            return Err(broken(format!("templates are stacked more than {MAX_TEMPLATE_DEPTH} deep")));
        }
        let parent_name = image.parent.clone().ok_or_else(|| broken("a template without a parent".into()))?;
        let mut parent = self.describe_only(&parent_name).map_err(|e| match e {
            Error::UnknownImage(p) => broken(format!("its parent image {p:?} is gone")),
            e => e,
        })?;
        if parent.kind == ImageKind::Template {
            self.resolve_template(&mut parent, depth + 1)?;
        }
        let mut stack = parent.layers();
        let fork = image.fork_of.is_some();
        for layer in &mut stack {
            if !fork {
                layer.history = 0;
            }
        }
        for c in &image.committed {
            let layer = stack
                .iter_mut()
                .find(|l| l.at == c.at)
                .ok_or_else(|| broken(format!("it commits a layer at {}, where its parent has no overlay", c.at.display())))?;
            layer.lowers.insert(0, self.layers.tree(&c.layer)?);
            if fork {
                layer.history += 1;
            }
        }
        image.projections = parent.projections;
        image.stack = stack;
        Ok(())
    }

    /// Reads an image's `image.json` alone (a template's stack unset).
    fn describe_only(&self, name: &str) -> Result<Image> {
        let json = self.image_dir(name).join(IMAGE_JSON);
        let bytes = match fs::read(&json) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::UnknownImage(name.to_owned())),
            Err(e) => return Err(Error::ImageIo(json, e)),
        };
        let mut image: Image = serde_json::from_slice(&bytes)
            .map_err(|e| Error::ImageIo(json, io::Error::new(io::ErrorKind::InvalidData, e)))?;
        // The directory is the truth, should the store have been moved.
        image.name = name.to_owned();
        image.rootfs = self.image_dir(name).join(ROOTFS);
        image.lowers = self.lowers_of(&image.layers)?;
        Ok(image)
    }

    /// Describes the image built in `staging`, as it will be once published.
    fn describe(
        &self,
        name: &str,
        kind: ImageKind,
        staging: &Staging,
        projections: Vec<Projection>,
        dropped: Dropped,
        source: String,
    ) -> Result<Image> {
        let (size_bytes, files) = measure(&staging.rootfs()).map_err(|e| Error::ImageIo(staging.rootfs(), e))?;
        Ok(Image {
            name: name.to_owned(),
            kind,
            rootfs: self.image_dir(name).join(ROOTFS),
            projections,
            size_bytes,
            files,
            created_ms: now_ms(),
            source,
            dropped,
            layers: Vec::new(),
            config: None,
            manifest_digest: None,
            lowers: Vec::new(),
            parent: None,
            committed: Vec::new(),
            fork_of: None,
            stack: Vec::new(),
            trust: None,
        })
    }

    /// Refuses to copy a directory that contains the store: the copy would
    /// include the image being built, and never end.
    fn check_not_ancestor(&self, src: &Path) -> Result<()> {
        fs::create_dir_all(&self.root).map_err(|e| Error::ImageIo(self.root.clone(), e))?;
        let src_abs = fs::canonicalize(src).map_err(|e| Error::ImageSource(src.to_owned(), e.to_string()))?;
        let root_abs = fs::canonicalize(&self.root).map_err(|e| Error::ImageIo(self.root.clone(), e))?;
        if root_abs.starts_with(&src_abs) {
            return Err(Error::ImageSource(src.to_owned(), "contains the image store itself".into()));
        }
        Ok(())
    }
}

/// The directory image `name` lives in: the name itself when it is a
/// plain name, else the name with each byte outside `[a-z0-9._-]`
/// percent-escaped (`test/two:v1` is `test%2Ftwo%3Av1`). A name whose
/// escaped form would be too long for a file name is cut, and a hash of the
/// whole name appended after a `~` (never part of an escaped name).
pub(crate) fn dir_name(name: &str) -> String {
    const MAX: usize = 200;
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() <= MAX {
        return out;
    }
    let mut cut = 120;
    // Never in the middle of an escape.
    while out.as_bytes()[cut - 1] == b'%' || out.as_bytes()[cut - 2] == b'%' {
        cut -= 1;
    }
    out.truncate(cut);
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(name.as_bytes()));
    format!("{out}~{}", &hash[..32])
}

/// An imported image's `source`: the absolute path, and the tag chosen.
fn source_of(src: &Path, tag: Option<&str>) -> String {
    let path = std::path::absolute(src).unwrap_or_else(|_| src.to_owned()).display().to_string();
    match tag {
        Some(t) => format!("{path}:{t}"),
        None => path,
    }
}

fn check_name(name: &str) -> Result<()> {
    cairn_core::check_image_name(name).map_err(Error::InvalidImageName)
}

fn now_ms() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// Total bytes of regular files (hard links counted once) and number of
/// entries below `dir`. Never follows symlinks.
fn measure(dir: &Path) -> io::Result<(u64, u64)> {
    let (mut bytes, mut files) = (0, 0);
    let mut linked = HashSet::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            // DirEntry::metadata does not follow symlinks.
            let meta = entry.metadata()?;
            files += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.is_file() && (meta.nlink() == 1 || linked.insert((meta.dev(), meta.ino()))) {
                bytes += meta.len();
            }
        }
    }
    Ok((bytes, files))
}

/// The name of the one directory a root filesystem was archived inside
/// (`top/usr`, `top/bin` or `top/etc`, and none of them at the root), as
/// `tar -cf x.tar top` makes: an image of it runs nothing. `None` for any
/// other tree. The tree is the import's own staging copy.
fn wrapped_root(rootfs: &Path) -> Option<String> {
    const MARKS: [&str; 3] = ["usr", "bin", "etc"];
    let mut entries = std::fs::read_dir(rootfs).ok()?;
    let only = entries.next()?.ok()?;
    if entries.next().is_some() || !only.file_type().ok()?.is_dir() {
        return None;
    }
    let top = only.path();
    let has = |dir: &Path| MARKS.iter().any(|m| std::fs::symlink_metadata(dir.join(m)).is_ok());
    (has(&top) && !has(rootfs)).then(|| only.file_name().to_string_lossy().into_owned())
}
