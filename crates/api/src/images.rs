//! Images.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/images`: import a directory, an archive, an OCI
/// image layout directory or a `docker save` archive on the daemon's host
/// as an image.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    pub name: String,
    /// An absolute path on the daemon's host.
    pub path: String,
    /// For an OCI image layout or a docker save archive holding several
    /// images: the one whose `org.opencontainers.image.ref.name`
    /// annotation, or one of whose `RepoTags`, is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Body of `POST /v1/images/pull`: pull an image from an OCI distribution
/// registry. The credentials are used for this pull only: never stored or
/// logged.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `name:tag`, `name@sha256:...` or `host[:port]/path/name:tag`; a
    /// name without a host is on Docker Hub.
    pub reference: String,
    /// The image's name in Cairn; the reference as given by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Plain HTTP instead of HTTPS to the reference's registry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl std::fmt::Debug for PullRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullRequest")
            .field("reference", &self.reference)
            .field("name", &self.name)
            .field("insecure", &self.insecure)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Progress of a pull, as `GET /v1/images/pull/progress` answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullProgress {
    /// The image's name, as the pull request gave or implied it.
    pub name: String,
    /// Each layer to download, bottom first (layers already stored are
    /// left out).
    pub layers: Vec<LayerProgress>,
    /// True once every download finished and the layers are being unpacked.
    #[serde(default)]
    pub unpacking: bool,
}

/// One layer's download.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LayerProgress {
    pub digest: String,
    /// Bytes received so far.
    pub done: u64,
    /// The blob's size from the manifest.
    pub total: u64,
}

/// An image as `GET /v1/images` lists it and an import answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Image {
    pub name: String,
    pub kind: ImageKind,
    /// The image's tree on the daemon's host.
    pub rootfs: String,
    /// Host directories mounted read-only into the tree.
    #[serde(default)]
    pub projections: Vec<Projection>,
    /// Total size of the regular files (each hard-linked file once).
    pub size_bytes: u64,
    /// Number of entries in the tree (files, directories, links).
    pub files: u64,
    pub created_ms: i64,
    /// Where it came from: `host`, or the imported path.
    pub source: String,
    /// What an import left out because an image must not carry it.
    #[serde(default)]
    pub dropped: Dropped,
    /// An OCI image's layers (diffids), bottom first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// An OCI image's run configuration, from its image config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// The digest of the OCI manifest it was imported from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// A template's parent: the image of the task it was committed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// A template's own layers, one for each overlay the task wrote to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub committed: Vec<Committed>,
    /// For the hidden base a fork's tasks share: the snapshot it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_of: Option<String>,
}

/// One layer a template adds: a task's writable layer at one overlay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Committed {
    /// Where the overlay appears in the sandbox (`/`, `/usr`).
    pub at: String,
    /// Its key in the layer store.
    pub layer: String,
}

/// Body of `POST /v1/images/commit`: make a template from a task.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// The task (id or name) whose writable layer becomes the template's.
    pub task: String,
    /// The new image's name.
    pub name: String,
    /// The snapshot to commit (id, or a prefix); by default a new snapshot
    /// of the running task, or the task's latest one when it is not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// The answer of `GET /v1/images/{name}`: the image, and each of an OCI
/// image's layers, bottom first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImageDetail {
    #[serde(flatten)]
    pub image: Image,
    /// The layers as the layer store keeps them (absent for other kinds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_details: Vec<Layer>,
}

/// One stored layer, shared by every image that has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Layer {
    /// `sha256:<hex>` of the uncompressed tar stream.
    pub diff_id: String,
    /// `sha256:<hex>` of the blob it was unpacked from.
    pub blob_digest: String,
    pub media_type: String,
    /// Size of the blob.
    pub bytes: u64,
    /// Total size of the unpacked regular files.
    pub size_bytes: u64,
    /// Entries in the unpacked tree.
    pub files: u64,
    pub created_ms: i64,
    #[serde(default)]
    pub dropped: Dropped,
    /// Whiteout-prefixed metadata entries skipped.
    #[serde(default)]
    pub skipped: u64,
}

/// What an OCI image's config says a container runs with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// A host directory shown read-only at a path inside the image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Projection {
    pub host_path: String,
    /// Absolute path inside the sandbox.
    pub at: String,
}

/// Counts of what an import dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Dropped {
    /// Character and block devices: the sandbox gets its `/dev` elsewhere.
    pub devices: u64,
    /// Fifos and sockets.
    pub fifos_sockets: u64,
    /// Entries whose setuid and/or setgid bits were cleared.
    pub setid: u64,
}

/// The answer of `DELETE /v1/images/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Removed {
    /// The image's name.
    pub removed: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assert_wire_shape;

    #[test]
    fn answers_keep_the_daemons_field_names() {
        let dropped = Dropped { devices: 2, fifos_sockets: 1, setid: 5 };
        assert_wire_shape(&dropped, &["devices", "fifos_sockets", "setid"]);
        let projection = Projection { host_path: "/usr".into(), at: "/usr".into() };
        assert_wire_shape(&projection, &["host_path", "at"]);
        let image = Image {
            name: "alpine".into(),
            kind: ImageKind::Rootfs,
            rootfs: "/var/lib/cairn/images/alpine/rootfs".into(),
            projections: vec![projection],
            size_bytes: 8 << 20,
            files: 520,
            created_ms: 1,
            source: "/tmp/alpine.tar.zst".into(),
            dropped,
            layers: Vec::new(),
            config: None,
            manifest_digest: None,
            parent: None,
            committed: Vec::new(),
            fork_of: None,
        };
        assert_wire_shape(&image, &["name", "kind", "rootfs", "projections", "size_bytes", "files", "created_ms", "source", "dropped"]);
        let oci = Image {
            kind: ImageKind::Oci,
            layers: vec!["sha256:00".into()],
            config: Some(RunConfig::default()),
            manifest_digest: Some("sha256:11".into()),
            ..image.clone()
        };
        assert_wire_shape(
            &oci,
            &["name", "kind", "rootfs", "projections", "size_bytes", "files", "created_ms", "source", "dropped", "layers", "config", "manifest_digest"],
        );
        let template = Image {
            kind: ImageKind::Template,
            parent: Some("alpine".into()),
            committed: vec![Committed { at: "/".into(), layer: "sha256:22".into() }],
            ..image.clone()
        };
        assert_wire_shape(
            &template,
            &["name", "kind", "rootfs", "projections", "size_bytes", "files", "created_ms", "source", "dropped", "parent", "committed"],
        );
        assert_eq!(serde_json::to_value(ImageKind::Template).unwrap_or_default(), ImageKind::Template.as_str());
        assert_wire_shape(&RunConfig::default(), &["env", "working_dir", "user", "entrypoint", "cmd"]);
        assert_eq!(serde_json::to_value(image.kind).unwrap_or_default(), ImageKind::Rootfs.as_str());
        assert_wire_shape(&Removed { removed: "alpine".into() }, &["removed"]);
    }
}
