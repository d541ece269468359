//! Access to a task's writable layers, for what the daemon does with them
//! outside the sandbox: snapshot (read), restore (write), commit to a
//! template (read) and the workspace patch (read).
//!
//! The daemon reads and writes the layers through the snapshot engine's
//! descriptor walks, which start from one directory that shows each
//! writable layer as `<name>/upper` (`name` being
//! [`cairn_image::Layer::disk_name`], or the memory layer's name). A backend
//! whose sandbox is a host directory hands out that directory itself
//! ([`HostLayers`]); one whose sandbox is not (a VM's disk image, a guest
//! agent) implements [`LayerAccess`] with its own view: a mount of the
//! disk that lives as long as the value, say, undone on drop.
//!
//! Everything under a layer is the agent's: whoever walks it opens beneath
//! the layer's directory without following links (see `cairn_fsat`).

use std::fmt;
use std::path::{Path, PathBuf};

/// A task's writable layers, open for the daemon to read or write while
/// this value lives.
pub trait LayerAccess: Send + Sync + fmt::Debug {
    /// The directory that shows each writable layer as `<name>/upper`.
    fn root(&self) -> &Path;

    /// The writable tree of layer `name`.
    fn upper(&self, name: &str) -> PathBuf {
        self.root().join(name).join("upper")
    }
}

/// A task's layers as the driver hands them to the daemon.
pub type TaskLayers = Box<dyn LayerAccess>;

/// Layers that are directories on the host: a task's disk mount, or a
/// scratch directory a snapshot is restored into.
#[derive(Debug, Clone)]
pub struct HostLayers {
    root: PathBuf,
}

impl HostLayers {
    pub fn new(root: impl Into<PathBuf>) -> HostLayers {
        HostLayers { root: root.into() }
    }
}

impl LayerAccess for HostLayers {
    fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_upper_sits_under_its_name() {
        let layers = HostLayers::new("/disk");
        assert_eq!(layers.upper("root"), Path::new("/disk/root/upper"));
        assert_eq!(layers.root(), Path::new("/disk"));
    }
}
