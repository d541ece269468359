//! What a task with request rules or injections needs beyond its policy:
//! the secrets its rules name must exist; it has its own CA (made when it
//! first gets such rules, kept sealed in the store like a secret, under a
//! name no secret can have); the proxy gets the CA, the secrets' values
//! and the upstream trust roots; the sandbox trusts the CA through a small
//! read-only layer over its image (the image's CA bundle with the task's
//! CA added) and the usual variables pointing at it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_core::{EgressRules, TaskId};
use cairn_egress::ca::{self, CaPem, TaskCa};
use cairn_egress::proxy::{Interception, SecretValues};

use crate::runtime::Runtime;
use crate::Error;

/// Where a task's CA is kept among the secrets ('/' is in no secret name).
fn ca_name(task: &TaskId) -> String {
    format!("task-ca/{task}")
}

/// The image's CA bundle, where Debian, Ubuntu and Alpine keep it.
pub const IMAGE_CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
/// The bundle (image's roots and the task's CA) the variables point at.
pub const TASK_CA_BUNDLE: &str = "/etc/cairn/ca-bundle.pem";
/// The task's CA alone (`NODE_EXTRA_CA_CERTS` adds to Node's own roots).
pub const TASK_CA_CERT: &str = "/etc/cairn/egress-ca.pem";

/// The variables that make common clients trust the task's CA.
pub fn trust_environment(rules: &EgressRules) -> Vec<(&'static str, String)> {
    if !rules.intercepts() {
        return Vec::new();
    }
    vec![
        ("SSL_CERT_FILE", TASK_CA_BUNDLE.to_owned()),
        ("REQUESTS_CA_BUNDLE", TASK_CA_BUNDLE.to_owned()),
        ("CURL_CA_BUNDLE", TASK_CA_BUNDLE.to_owned()),
        ("GIT_SSL_CAINFO", TASK_CA_BUNDLE.to_owned()),
        ("NODE_EXTRA_CA_CERTS", TASK_CA_CERT.to_owned()),
    ]
}

impl Runtime {
    /// Refuses rules that name a secret the store does not hold.
    pub(crate) async fn check_rule_secrets(&self, rules: &EgressRules) -> Result<(), Error> {
        for name in crate::egress::policy_of(rules).secrets() {
            if self.store.secret(&name).await?.is_none() {
                return Err(Error::invalid(format!("the egress rules name secret {name}, which does not exist (set it first: cairn secret set {name})")));
            }
        }
        Ok(())
    }

    /// Task `task`'s CA, made if it has none; `None` for a task without
    /// request rules (and no store read: every sandbox start asks).
    pub(crate) async fn ensure_task_ca(&self, task: &TaskId, rules: &EgressRules) -> Result<Option<CaPem>, Error> {
        if !rules.intercepts() {
            return Ok(None);
        }
        if let Some(pem) = self.task_ca(task).await? {
            return Ok(Some(pem));
        }
        let pem = ca::generate(task.as_str()).map_err(|e| Error::internal(e.to_string()))?;
        let both = serde_json::json!({ "cert": pem.cert, "key": pem.key }).to_string();
        self.put_sealed(&ca_name(task), both.as_bytes()).await?;
        Ok(Some(pem))
    }

    /// Task `task`'s CA, if it has one.
    pub(crate) async fn task_ca(&self, task: &TaskId) -> Result<Option<CaPem>, Error> {
        let Some(raw) = self.open_sealed(&ca_name(task)).await? else { return Ok(None) };
        let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| Error::internal(format!("the CA of task {task} does not read: {e}")))?;
        let field = |k: &str| v[k].as_str().map(str::to_owned).ok_or_else(|| Error::internal(format!("the CA of task {task} has no {k}")));
        Ok(Some(CaPem { cert: field("cert")?, key: field("key")? }))
    }

    /// Forgets task `task`'s CA (the task is gone).
    pub(crate) async fn remove_task_ca(&self, task: &TaskId) {
        if let Err(e) = self.store.remove_secret(&ca_name(task)).await {
            tracing::warn!(task = %task, "cannot remove the task's CA: {e}");
        }
    }

    /// The values of the secrets `rules` name (a secret removed since is
    /// left out: requests that need it are answered 502).
    pub(crate) async fn secret_values(&self, rules: &EgressRules) -> SecretValues {
        let mut values = SecretValues::default();
        for name in crate::egress::policy_of(rules).secrets() {
            match self.secret_value(&name).await {
                Ok(v) => values.insert(&name, v.to_vec()),
                Err(e) => tracing::warn!("egress secret {name}: {e}"),
            }
        }
        values
    }

    /// What the proxy of task `task` needs to intercept, with the sender
    /// of its secrets' values; `None` when the task has no CA.
    pub(crate) async fn interception(&self, task: &TaskId, rules: &EgressRules) -> Option<(Interception, tokio::sync::watch::Sender<Arc<SecretValues>>)> {
        let pem = match self.task_ca(task).await {
            Ok(Some(p)) => p,
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(task = %task, "cannot read the task's CA: {e}");
                return None;
            }
        };
        let ca = match TaskCa::load(task.as_str(), &pem) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::error!(task = %task, "cannot load the task's CA: {e}");
                return None;
            }
        };
        let upstream_tls = self.egress.upstream_tls()?;
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(self.secret_values(rules).await));
        Some((Interception { ca, secrets: rx, upstream_tls }, tx))
    }

    /// The read-only layer that makes the sandbox of `task` trust its CA:
    /// the image's bundle with the CA added, at the image's bundle path and
    /// at [`TASK_CA_BUNDLE`], and the CA alone at [`TASK_CA_CERT`].
    /// Written afresh at each sandbox start.
    pub(crate) async fn trust_layer(&self, task: &TaskId, image: &cairn_image::Image, pem: CaPem) -> Result<PathBuf, Error> {
        let dir = self.home.join("trust").join(task.as_str());
        let lowers: Vec<PathBuf> = image.layers().first().map(|l| l.lowers.clone()).unwrap_or_default();
        let written = tokio::task::spawn_blocking(move || write_trust_layer(&dir, &lowers, &pem.cert).map(|()| dir)).await?;
        written.map_err(|e| Error::internal(format!("the trust layer of task {task}: {e}")))
    }

    /// Removes the trust layer of a task that is gone.
    pub(crate) fn remove_trust_layer(&self, task: &TaskId) {
        let dir = self.home.join("trust").join(task.as_str());
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(task = %task, "cannot remove {}: {e}", dir.display());
            }
        }
    }
}

/// The regular file `etc/ssl/certs/ca-certificates.crt` of one image
/// lower, walked from the lower's descriptor without following a symbolic
/// link at any step (a fork's lowers hold what a task wrote, and any image
/// may hold links to the host's files). `None` if it is not there as such.
fn image_bundle(lower: &Path) -> Option<Vec<u8>> {
    let (dir, name) = IMAGE_CA_BUNDLE.rsplit_once('/')?;
    let top = cairn_fsat::open_dir(lower).ok()?;
    let certs = cairn_fsat::open_beneath(&top, dir, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY, 0).ok()?;
    cairn_fsat::read_regular_at(&certs, &std::ffi::CString::new(name).ok()?, 16 << 20).ok()
}

/// Writes the trust layer in `dir`: the image's bundle (from the topmost of
/// `lowers` that has one; the image is the daemon's, not the task's) with
/// `ca_cert` appended.
fn write_trust_layer(dir: &Path, lowers: &[PathBuf], ca_cert: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let image_bundle = lowers.iter().find_map(|l| image_bundle(l)).unwrap_or_default();
    let mut bundle = image_bundle;
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca_cert.as_bytes());
    let files: [(&str, &[u8]); 3] =
        [(IMAGE_CA_BUNDLE, &bundle), (TASK_CA_BUNDLE.trim_start_matches('/'), &bundle), (TASK_CA_CERT.trim_start_matches('/'), ca_cert.as_bytes())];
    for (rel, content) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    // Every directory readable and searchable from inside the sandbox.
    let mut d = dir.join(IMAGE_CA_BUNDLE);
    while d.pop() && d.starts_with(dir) {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::set_permissions(dir.join("etc/cairn"), std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lower whose `etc/ssl/certs` a racer swaps with a symlink to a
    /// directory outside: the read gets the lower's own bundle or nothing,
    /// never the outside file.
    #[test]
    fn the_image_bundle_is_read_without_following_links_while_they_swap() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("ca-certificates.crt"), "HOST FILE").unwrap();
        let lower = tmp.path().join("lower");
        std::fs::create_dir_all(lower.join("etc/ssl/d")).unwrap();
        std::fs::write(lower.join("etc/ssl/d/ca-certificates.crt"), "IMAGE BUNDLE").unwrap();
        std::os::unix::fs::symlink(&outside, lower.join("etc/ssl/l")).unwrap();
        // "certs" is the name the read walks: first the real directory.
        std::fs::rename(lower.join("etc/ssl/d"), lower.join("etc/ssl/certs")).unwrap();
        assert_eq!(image_bundle(&lower).as_deref(), Some(&b"IMAGE BUNDLE"[..]), "the positive control");
        // A link in its place is not followed.
        std::fs::rename(lower.join("etc/ssl/certs"), lower.join("etc/ssl/d")).unwrap();
        std::os::unix::fs::symlink(&outside, lower.join("etc/ssl/certs")).unwrap();
        assert_eq!(image_bundle(&lower), None);
        std::fs::remove_file(lower.join("etc/ssl/certs")).unwrap();
        std::fs::rename(lower.join("etc/ssl/d"), lower.join("etc/ssl/certs")).unwrap();
        // Swapped all the while.
        let racer = cairn_fsat::testing::Racer::start(cairn_fsat::open_dir(&lower.join("etc/ssl")).unwrap(), "certs", "l");
        racer.wait_started();
        let (mut real, mut refused) = (0, 0);
        racer.race(200, || {
            match image_bundle(&lower) {
                Some(b) => {
                    assert_eq!(b, b"IMAGE BUNDLE", "never the host's file");
                    real += 1;
                }
                None => refused += 1,
            }
            real > 0 && refused > 0
        });
    }
}
