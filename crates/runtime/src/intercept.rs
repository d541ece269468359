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

    /// Makes task `task`'s CA if it has none; a task without request rules
    /// gets none.
    pub(crate) async fn ensure_task_ca(&self, task: &TaskId, rules: &EgressRules) -> Result<(), Error> {
        if !rules.intercepts() || self.task_ca(task).await?.is_some() {
            return Ok(());
        }
        let pem = ca::generate(task.as_str()).map_err(|e| Error::internal(e.to_string()))?;
        let both = serde_json::json!({ "cert": pem.cert, "key": pem.key }).to_string();
        self.put_sealed(&ca_name(task), both.as_bytes()).await
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
    /// Written afresh at each sandbox start; `None` without a CA.
    pub(crate) async fn trust_layer(&self, task: &TaskId, image: &cairn_sandbox::Image) -> Result<Option<PathBuf>, Error> {
        let Some(pem) = self.task_ca(task).await? else { return Ok(None) };
        let dir = self.home.join("trust").join(task.as_str());
        let lowers: Vec<PathBuf> = image.layers().first().map(|l| l.lowers.clone()).unwrap_or_default();
        let written = tokio::task::spawn_blocking(move || write_trust_layer(&dir, &lowers, &pem.cert).map(|()| dir)).await?;
        written.map(Some).map_err(|e| Error::internal(format!("the trust layer of task {task}: {e}")))
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

/// A regular file at `rel` under `root`, read without following a symbolic
/// link at any step (an imported image may hold links to the host's files).
fn read_no_links(root: &Path, rel: &str) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut at = root.to_path_buf();
    for part in Path::new(rel).components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).ok()?.file_type().is_symlink() {
            return None;
        }
    }
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&at).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 16 << 20), &mut out).ok()?;
    Some(out)
}

/// Writes the trust layer in `dir`: the image's bundle (from the topmost of
/// `lowers` that has one; the image is the daemon's, not the task's) with
/// `ca_cert` appended.
fn write_trust_layer(dir: &Path, lowers: &[PathBuf], ca_cert: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let image_bundle = lowers.iter().find_map(|l| read_no_links(l, IMAGE_CA_BUNDLE)).unwrap_or_default();
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
