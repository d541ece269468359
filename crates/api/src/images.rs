//! Images.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

// The image store's records are the wire's: one definition each, with its
// schema (the image crate's `schema` feature). What is set only when an
// image is loaded (its lower directories, a template's stack, a task's
// trust layer) is never serialised.
pub use cairn_image::{Committed, Dropped, Image, ImageKind, LayerInfo, Projection, RunConfig};

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

/// Progress of an import, as `GET /v1/images/import/progress` answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ImportProgress {
    /// The image's name, as the import request gave it.
    pub name: String,
    /// Bytes of the source archive read so far.
    pub read: u64,
    /// The source archive's size, when the source is one archive unpacked
    /// as it is read (a root filesystem's tar, plain or compressed); absent
    /// for a directory, an OCI layout or a docker archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_bytes: Option<u64>,
    /// Bytes written into the image (or its new layers) so far.
    pub written: u64,
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
    pub layer_details: Vec<LayerInfo>,
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
            lowers: Vec::new(),
            stack: Vec::new(),
            trust: None,
        };
        // What is set when an image is loaded never goes on the wire.
        let loaded = Image {
            lowers: vec!["/not/on/the/wire".into()],
            stack: vec![cairn_image::Layer { lowers: vec!["/not/either".into()], at: "/".into(), history: 1 }],
            trust: Some("/not/stored".into()),
            ..image.clone()
        };
        assert_eq!(serde_json::to_value(&loaded).ok(), serde_json::to_value(&image).ok());
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
