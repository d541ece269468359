//! How an image appears in a sandbox: one overlay per layer of the image,
//! each a stack of read-only lower directories mounted at a path.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One overlay of the sandbox: its read-only lower directories and where
/// it appears in the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    /// The lower directories, top first: one for a self-contained tree, the
    /// image's layer stack for an OCI image.
    pub lowers: Vec<PathBuf>,
    /// Absolute path inside the sandbox: `/` for the image root.
    pub at: PathBuf,
    /// How many of the top lowers hold the task's own earlier changes (the
    /// base a fork's tasks share) rather than the image's: a patch counts
    /// them as the task's.
    #[serde(default)]
    pub history: usize,
}

impl Layer {
    /// Name of the layer's upper/work directories on the task disk.
    pub fn disk_name(&self) -> String {
        let rel = self.at.to_string_lossy().trim_matches('/').replace('/', "_");
        if rel.is_empty() {
            "root".to_owned()
        } else {
            format!("at_{rel}")
        }
    }
}
