//! `image pull`: an image from an OCI distribution registry.
//!
//! The manifest is fetched (an index resolved to this host's platform) with
//! its config, which the image store checks against the manifest before
//! anything is downloaded. Each layer not in the layer store yet is then
//! streamed into a staging file in the layer store while it is hashed and
//! counted: a blob longer than its descriptor says is cut off, one shorter
//! or with another digest is refused, before it is unpacked. The image
//! store then unpacks the layers (checking the digest, size and diffid
//! again) and publishes the image. Whatever fails, the staging files are
//! deleted and no image nor unused layer is left.
//!
//! Credentials are used for the one pull: never stored, never logged. The
//! client authenticates as the registry's challenge asks: basic auth, or a
//! bearer token fetched from the registry's token server with them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use cairn_api::images::{LayerProgress, PullProgress, PullRequest};
use cairn_image::{Image, OciImage};
use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{ImageIndexEntry, OciDescriptor};
use oci_client::secrets::RegistryAuth;
use oci_client::RegistryOperation;
use oci_client::{Client, Reference};
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use crate::images::Images;
use crate::Error;

/// The pulls going on, by image name: what `GET /v1/images/pull/progress`
/// reports.
#[derive(Debug, Default)]
pub struct Pulls(Mutex<HashMap<String, PullProgress>>);

impl Pulls {
    pub fn get(&self, name: &str) -> Option<PullProgress> {
        self.0.lock().ok()?.get(name).cloned()
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut PullProgress)) {
        if let Ok(mut map) = self.0.lock() {
            if let Some(p) = map.get_mut(name) {
                f(p);
            }
        }
    }
}

/// Removes a pull's progress entry when the pull ends, however it ends.
struct Tracked<'a> {
    pulls: &'a Pulls,
    name: String,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.pulls.0.lock() {
            map.remove(&self.name);
        }
    }
}

/// Deletes the downloaded blobs when dropped.
#[derive(Default)]
struct Staged(HashMap<String, PathBuf>);

impl Drop for Staged {
    fn drop(&mut self) {
        for path in self.0.values() {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), "cannot delete a downloaded layer: {e}");
                }
            }
        }
    }
}

/// The platform resolver: the index entry for linux on this host's
/// architecture.
pub fn resolve_platform(entries: &[ImageIndexEntry]) -> Option<String> {
    let described: Vec<(String, String, &str)> = entries
        .iter()
        .filter_map(|e| e.platform.as_ref().map(|p| (p.os.to_string(), p.architecture.to_string(), e.digest.as_str())))
        .collect();
    cairn_image::choose_host_platform(described.iter().map(|(os, arch, d)| (os.as_str(), arch.as_str(), *d))).map(str::to_owned)
}

impl Images {
    /// Pulls `req.reference` as image `req.name` (the reference by default).
    pub(crate) async fn pull(&self, req: PullRequest) -> Result<Image, Error> {
        let name = req.name.clone().unwrap_or_else(|| req.reference.clone());
        cairn_core::check_image_name(&name).map_err(|e| Error::invalid(e.to_string()))?;
        if name == cairn_image::HOST_IMAGE || self.list().await?.iter().any(|i| i.name == name) {
            return Err(Error::conflict(format!("image {name:?} already exists")));
        }
        let reference: Reference =
            req.reference.parse().map_err(|e| Error::invalid(format!("invalid image reference {:?}: {e}", req.reference)))?;
        let auth = match (&req.username, &req.password) {
            (Some(u), Some(p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            (None, None) => RegistryAuth::Anonymous,
            _ => return Err(Error::invalid("a username needs a password, and a password a username")),
        };
        let progress = PullProgress { name: name.clone(), ..PullProgress::default() };
        {
            let mut map = self.pulls.0.lock().map_err(|_| Error::internal("the pull table is poisoned"))?;
            if map.contains_key(&name) {
                return Err(Error::conflict(format!("image {name:?} is being pulled already")));
            }
            map.insert(name.clone(), progress);
        }
        let _tracked = Tracked { pulls: &self.pulls, name: name.clone() };
        let what = |e: String| format!("cannot pull {}: {e}", req.reference);
        let client = client(&reference, req.insecure);
        let credentials = !matches!(auth, RegistryAuth::Anonymous);
        tracing::info!(reference = req.reference, image = name, "pulling image");
        if credentials {
            // Authenticates first: a token server that refuses the
            // credentials is then the error. Left to the pull, the client
            // would go on without a token and only the registry's bare 401
            // would say what went wrong. The token it gets serves the pull.
            client.auth(&reference, &auth, RegistryOperation::Pull).await.map_err(|e| registry_error(&req.reference, e, credentials))?;
        }
        let (manifest, digest, config) =
            client.pull_manifest_and_config(&reference, &auth).await.map_err(|e| registry_error(&req.reference, e, credentials))?;
        let manifest_json = serde_json::to_vec(&manifest).map_err(Error::internal_from)?;
        let chosen = cairn_image::image_from_documents(&digest, &manifest_json, config.as_bytes()).map_err(|e| Error::invalid(what(e)))?;
        let staged = self.download(&client, &reference, &req.reference, &name, &chosen, credentials).await?;
        fail::fail_point!("pull.downloaded");
        self.pulls.update(&name, |p| p.unpacking = true);
        let r = req.reference.clone();
        let image = self
            .run(move |images| {
                let image = images.import_pulled(&name, &r, chosen, &staged.0);
                drop(staged);
                if image.is_ok() {
                    fail::fail_point!("pull.imported");
                }
                image
            })
            .await?
        .map_err(|e| match e {
            cairn_image::Error::ImageSource(_, msg) => Error::invalid(what(msg)),
            e => Error::from(e).context(&format!("cannot pull {}", req.reference)),
        })?;
        tracing::info!(reference = req.reference, image = image.name, layers = image.layers.len(), "pulled image");
        Ok(image)
    }

    /// Refuses a pull whose downloads alone would cross the image store's
    /// bounds (`[images] max_size`, or what its filesystem can spare).
    fn check_download(&self, need: u64, given: &str) -> Result<(), Error> {
        use cairn_image::SizeBound;
        let bound = self.store().download_bound(need).map_err(|e| Error::from(e).context(&format!("cannot pull {given}")))?;
        match bound {
            None => Ok(()),
            Some((SizeBound::FreeSpace, spare)) => Err(Error::NoSpace(format!(
                "cannot pull {given}: its layers are {}, over the {} the image store's filesystem can spare",
                cairn_core::Bytes(need),
                cairn_core::Bytes(spare)
            ))),
            Some((_, limit)) => Err(Error::TooLarge(format!(
                "cannot pull {given}: its layers are {}, over the limit of {} ([images] max_size)",
                cairn_core::Bytes(need),
                cairn_core::Bytes(limit)
            ))),
        }
    }

    /// Downloads the layers of `chosen` not in the layer store yet.
    async fn download(
        &self,
        client: &Client,
        reference: &Reference,
        given: &str,
        name: &str,
        chosen: &OciImage,
        credentials: bool,
    ) -> Result<Staged, Error> {
        let store = self.store().layer_store();
        let mut wanted = Vec::new();
        for want in &chosen.layers {
            if store.get(&want.diff_id)?.is_none() && !wanted.iter().any(|w: &&cairn_image::layers::LayerWant| w.blob_digest == want.blob_digest) {
                wanted.push(want);
            }
        }
        self.pulls.update(name, |p| {
            p.layers = wanted.iter().map(|w| LayerProgress { digest: w.blob_digest.clone(), done: 0, total: w.blob_size }).collect();
        });
        let need: u64 = wanted.iter().map(|w| w.blob_size).sum();
        self.check_download(need, given)?;
        let mut staged = Staged::default();
        for want in wanted {
            let path = store.staging_blob()?;
            staged.0.insert(want.blob_digest.clone(), path.clone());
            let desc = OciDescriptor {
                media_type: want.media_type.clone(),
                digest: want.blob_digest.clone(),
                size: i64::try_from(want.blob_size).unwrap_or(i64::MAX),
                ..OciDescriptor::default()
            };
            let fail = |m: String| Error::invalid(format!("cannot pull {given}: layer {}: {m}", want.blob_digest));
            let mut stream = client.pull_blob_stream(reference, &desc).await.map_err(|e| registry_error(given, e, credentials))?;
            let mut file = tokio::fs::File::create(&path).await.map_err(|e| io_error(given, &path, e))?;
            let mut hasher = sha2::Sha256::new();
            let mut got: u64 = 0;
            while let Some(chunk) = stream.next().await {
                let chunk = match chunk {
                    Ok(c) => c,
                    // The client's own digest check fails the last chunk;
                    // the count and hash below say what was wrong.
                    Err(e) if got == want.blob_size => {
                        tracing::debug!("the client's digest check failed: {e}");
                        break;
                    }
                    Err(e) => return Err(fail(format!("download failed after {got} of {} bytes: {}", want.blob_size, one_line(&e.to_string())))),
                };
                got += chunk.len() as u64;
                if got > want.blob_size {
                    return Err(fail(format!("the registry sent more than the {} bytes its manifest says", want.blob_size)));
                }
                hasher.update(&chunk);
                file.write_all(&chunk).await.map_err(|e| io_error(given, &path, e))?;
                self.pulls.update(name, |p| {
                    if let Some(l) = p.layers.iter_mut().find(|l| l.digest == want.blob_digest) {
                        l.done = got;
                    }
                });
            }
            if got < want.blob_size {
                return Err(fail(format!("truncated: the registry sent {got} of its {} bytes", want.blob_size)));
            }
            let digest = format!("sha256:{}", hex::encode(hasher.finalize()));
            if digest != want.blob_digest {
                return Err(fail(format!("the registry sent a blob with the digest {digest} (corrupt or tampered with)")));
            }
            file.sync_all().await.map_err(|e| io_error(given, &path, e))?;
        }
        Ok(staged)
    }
}

/// A client for `reference`'s registry: plain HTTP to it when `insecure`;
/// index manifests resolved to this host's platform.
fn client(reference: &Reference, insecure: bool) -> Client {
    // reqwest is built without a TLS provider of its own: the workspace's
    // ring one serves it (installing it twice is harmless).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if insecure { ClientProtocol::HttpsExcept(vec![reference.resolve_registry().to_owned()]) } else { ClientProtocol::Https };
    Client::new(ClientConfig {
        protocol,
        platform_resolver: Some(Box::new(resolve_platform)),
        connect_timeout: Some(std::time::Duration::from_secs(30)),
        read_timeout: Some(std::time::Duration::from_secs(120)),
        ..ClientConfig::default()
    })
}

/// A registry client's error as one line naming what was wrong;
/// `credentials` says whether the pull gave any (a refusal then means they
/// were wrong, not missing).
fn registry_error(given: &str, e: OciDistributionError, credentials: bool) -> Error {
    let refused = |detail: &str| {
        if credentials {
            Error::invalid(format!("cannot pull {given}: the registry refused access with the credentials given ({detail})"))
        } else {
            Error::invalid(format!(
                "cannot pull {given}: the registry refused access without authentication ({detail}); give --username and --password-stdin"
            ))
        }
    };
    let arch = cairn_image::host_arch();
    match e {
        OciDistributionError::ImageManifestNotFoundError(m) if m.contains("platform") => {
            Error::not_found(format!("cannot pull {given}: the image has no variant for linux/{arch}"))
        }
        OciDistributionError::ImageManifestNotFoundError(_) => Error::not_found(format!("cannot pull {given}: no such image")),
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope.errors.iter().map(|e| format!("{:?}", e.code)).collect();
            let msgs: Vec<String> = envelope.errors.iter().map(|e| e.message.clone()).collect();
            let text = one_line(&msgs.join("; "));
            if codes.iter().any(|c| c.contains("Unknown")) {
                Error::not_found(format!("cannot pull {given}: the registry has no such image ({text})"))
            } else if codes.iter().any(|c| c.contains("Unauthorized") || c.contains("Denied")) {
                refused(&text)
            } else {
                Error::invalid(format!("cannot pull {given}: the registry answered: {text}"))
            }
        }
        // The registry's token server refused the token request (its body
        // says why, cut to a line).
        OciDistributionError::AuthenticationFailure(m) => {
            let m = one_line(&m);
            let m: String = if m.is_empty() { "no reason given".to_owned() } else { m.chars().take(200).collect() };
            refused(&format!("authentication failed at its token server: {m}"))
        }
        OciDistributionError::UnauthorizedError { .. } => refused("401 Unauthorized"),
        OciDistributionError::ServerError { code: 404, .. } => Error::not_found(format!("cannot pull {given}: the registry has no such image")),
        OciDistributionError::ServerError { code: 401, .. } => refused("401 Unauthorized"),
        OciDistributionError::ServerError { code: 403, .. } => refused("403 Forbidden"),
        OciDistributionError::RequestError(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            Error::invalid(format!("cannot pull {given}: {}", one_line(&msg)))
        }
        e => Error::invalid(format!("cannot pull {given}: {}", one_line(&e.to_string()))),
    }
}

fn io_error(given: &str, path: &std::path::Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        Error::NoSpace(format!("cannot pull {given}: the disk is full ({})", path.display()))
    } else {
        Error::internal_from(e).context(&format!("cannot pull {given}: {}", path.display()))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_client::manifest::Platform;

    fn entry(os: &str, arch: &str, digest: &str) -> ImageIndexEntry {
        let platform: Platform = serde_json::from_value(serde_json::json!({"os": os, "architecture": arch})).unwrap_or_else(|e| panic!("{e}"));
        let mut e: ImageIndexEntry = serde_json::from_value(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": 1,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        e.platform = Some(platform);
        e
    }

    #[test]
    fn the_resolver_chooses_linux_on_this_hosts_architecture() {
        let arch = cairn_image::host_arch();
        let other = if arch == "arm64" { "amd64" } else { "arm64" };
        let entries = vec![entry("windows", arch, "sha256:w"), entry("linux", other, "sha256:o"), entry("linux", arch, "sha256:h")];
        assert_eq!(resolve_platform(&entries).as_deref(), Some("sha256:h"));
        assert_eq!(resolve_platform(&entries[..2]), None);
        let mut unknown = entry("linux", arch, "sha256:u");
        unknown.platform = None;
        assert_eq!(resolve_platform(&[unknown]), None);
    }

    #[test]
    fn registry_errors_are_one_line() {
        assert_eq!(one_line("a\n  b\tc "), "a b c");
        let e = registry_error("x:y", OciDistributionError::ServerError { code: 404, url: "u".into(), message: "m".into() }, false);
        assert!(matches!(e, Error::NotFound(_)) && e.to_string().starts_with("cannot pull x:y"), "{e}");
    }
}
