//! The engine's images part: the image store (images, their layers,
//! templates and fork bases), the pulls going on with their progress
//! (`pull.rs`), and the lock that keeps fork bases while a fork or a commit
//! picks one. The image store's calls block (they read and unpack
//! layers), so they run on the blocking pool, here.
//!
//! Which tasks use an image is the runtime's to say: removing an image and
//! making a template (`template.rs`) are orchestrations over this part, the
//! store and the snapshots.

use cairn_api::images::{ImageDetail, ImportRequest};
use cairn_image::{Image, ImageStore};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::pull::Pulls;
use crate::runtime::Runtime;
use crate::Error;

#[derive(Debug)]
pub(crate) struct Images {
    store: ImageStore,
    pub(crate) pulls: Pulls,
    /// Held shared by a fork or a commit from the moment it picks a fork
    /// base until a task or a template names it; exclusive while unused
    /// bases are removed, so none is removed under it.
    fork_bases: RwLock<()>,
}

impl Images {
    pub(crate) fn new(store: ImageStore) -> Images {
        Images { store, pulls: Pulls::default(), fork_bases: RwLock::new(()) }
    }

    /// Runs `work` with the image store on the blocking pool.
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl FnOnce(&ImageStore) -> T + Send + 'static) -> Result<T, Error> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || work(&store)).await?)
    }

    /// The image store itself, for work already on the blocking pool.
    pub(crate) fn store(&self) -> &ImageStore {
        &self.store
    }

    pub(crate) async fn get(&self, name: &str) -> Result<Image, Error> {
        let name = name.to_owned();
        Ok(self.run(move |images| images.get(&name)).await??)
    }

    pub(crate) async fn list(&self) -> Result<Vec<Image>, Error> {
        Ok(self.run(|images| images.list()).await??)
    }

    /// One image and its layers.
    pub(crate) async fn detail(&self, name: &str) -> Result<ImageDetail, Error> {
        let name = name.to_owned();
        self.run(move |images| -> Result<ImageDetail, Error> {
            let image = images.get(&name)?;
            let mut layer_details = Vec::with_capacity(image.layers.len());
            for diff_id in image.layers.iter().chain(image.committed.iter().map(|c| &c.layer)) {
                let info = images.layer_store().get(diff_id)?;
                layer_details.push(info.ok_or_else(|| Error::internal(format!("image {name}: layer {diff_id} is missing from the layer store")))?);
            }
            Ok(ImageDetail { image, layer_details })
        })
        .await?
    }

    pub(crate) async fn import(&self, req: ImportRequest) -> Result<Image, Error> {
        Ok(self.run(move |images| images.import_tagged(&req.name, std::path::Path::new(&req.path), req.tag.as_deref())).await??)
    }

    /// Removes an image the caller found unused by any task; the inner
    /// error is the image store's refusal (the image is another's parent).
    pub(crate) async fn remove(&self, name: &str) -> Result<Result<(), cairn_image::Error>, Error> {
        let name = name.to_owned();
        self.run(move |images| images.remove(&name)).await
    }

    /// Layers no image uses any more, removed; their names.
    pub(crate) async fn gc_layers(&self) -> Result<Vec<String>, Error> {
        Ok(self.run(|images| images.gc_layers()).await??)
    }

    /// Keeps every fork base while the guard lives.
    pub(crate) async fn keep_fork_bases(&self) -> RwLockReadGuard<'_, ()> {
        self.fork_bases.read().await
    }

    /// Lets nothing pick a fork base while the guard lives.
    pub(crate) async fn fork_bases_alone(&self) -> RwLockWriteGuard<'_, ()> {
        self.fork_bases.write().await
    }
}

impl Runtime {
    pub(crate) async fn image(&self, name: &str) -> Result<Image, Error> {
        self.images.get(name).await
    }

    pub async fn list_images(&self) -> Result<Vec<Image>, Error> {
        self.images.list().await
    }

    /// One image and its layers.
    pub async fn image_detail(&self, name: &str) -> Result<ImageDetail, Error> {
        self.images.detail(name).await
    }

    pub async fn import_image(&self, req: ImportRequest) -> Result<Image, Error> {
        self.images.import(req).await
    }

    /// Removes an image no live task and no template uses.
    pub async fn remove_image(&self, name: &str) -> Result<(), Error> {
        let mut users = Vec::new();
        for t in self.store.list_tasks().await?.into_iter().filter(|t| !t.state.is_terminal()) {
            let mut images = vec![t.config.image.clone()];
            images.extend(self.store.snapshots(&t.id).await?.into_iter().map(|s| s.config.image));
            if images.iter().any(|i| i == name) {
                users.push(t.id.to_string());
            }
        }
        if !users.is_empty() {
            return Err(Error::conflict(format!("image {name:?} is used by task(s) {}; destroy them first", users.join(", "))));
        }
        Ok(self.images.remove(name).await??)
    }

    /// How far the import of image `name` going on has got.
    pub fn import_progress(&self, name: &str) -> Result<cairn_api::images::ImportProgress, Error> {
        let p = self.images.store().import_progress(name).ok_or_else(|| Error::not_found(format!("no import of {name:?} is going on")))?;
        Ok(cairn_api::images::ImportProgress { name: name.to_owned(), read: p.read, source_bytes: p.source_bytes, written: p.written })
    }

    /// The downloads so far of the pull of image `name` going on.
    pub fn pull_progress(&self, name: &str) -> Result<cairn_api::images::PullProgress, Error> {
        self.images.pulls.get(name).ok_or_else(|| Error::not_found(format!("no pull of {name:?} is going on")))
    }

    /// Pulls `req.reference` as image `req.name` (the reference by default).
    pub async fn pull_image(&self, req: cairn_api::images::PullRequest) -> Result<Image, Error> {
        self.images.pull(req).await
    }
}
