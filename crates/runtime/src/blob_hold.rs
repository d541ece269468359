//! Holds on the blob store that keep `gc` apart from the snapshots,
//! restores and forks that read or add packs. On one node the
//! repository's own lock does it (shared for those, exclusive for gc); on a
//! store several nodes share, a row in the store does the same across
//! nodes (`LeaseStore::lock_blobs`): gc on one node deleting the packs a
//! snapshot on another is about to reference would lose that snapshot.
//! Holds are renewed with the heartbeat and run out when their node dies.

use std::time::{Duration, Instant};

use cairn_store::SharedStore;
use tokio::sync::{RwLockReadGuard, RwLockWriteGuard};

use crate::runtime::Runtime;
use crate::Error;

/// How long a hold lasts unless its node's heartbeat renews it.
pub(crate) const HOLD_TTL: Duration = Duration::from_secs(60);
/// How often a hold that is in the way is tried again.
const RETRY: Duration = Duration::from_millis(200);
/// How long a snapshot, restore or fork waits for another node's gc.
const SHARED_PATIENCE: Duration = Duration::from_secs(600);
/// How long gc waits for other nodes' snapshots, restores and forks.
const GC_PATIENCE: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum Local<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// A hold on the blob store until dropped.
#[derive(Debug)]
pub(crate) struct BlobHold<'a> {
    _local: Local<'a>,
    cluster: Option<(SharedStore, String)>,
}

impl Drop for BlobHold<'_> {
    fn drop(&mut self) {
        if let Some((store, id)) = self.cluster.take() {
            tokio::spawn(async move {
                if let Err(e) = store.unlock_blobs(&id).await {
                    tracing::warn!("letting go of the blob store: {e} (the hold runs out by itself)");
                }
            });
        }
    }
}

impl Runtime {
    /// A shared hold, for a snapshot, a restore or a fork: waits while
    /// another node's gc runs.
    pub(crate) async fn hold_blobs(&self) -> Result<BlobHold<'_>, Error> {
        let local = Local::Shared(self.snaps.repo.gc_lock().read().await);
        let cluster = self.hold_cluster_blobs(false, SHARED_PATIENCE).await?;
        Ok(BlobHold { _local: local, cluster })
    }

    /// The exclusive hold gc takes: waits (a while) for other nodes'
    /// snapshots, restores and forks to end.
    pub(crate) async fn hold_blobs_for_gc(&self) -> Result<BlobHold<'_>, Error> {
        let local = Local::Exclusive(self.snaps.repo.gc_lock().write().await);
        let cluster = self.hold_cluster_blobs(true, GC_PATIENCE).await?;
        Ok(BlobHold { _local: local, cluster })
    }

    async fn hold_cluster_blobs(&self, exclusive: bool, patience: Duration) -> Result<Option<(SharedStore, String)>, Error> {
        if !self.store.shared() {
            return Ok(None);
        }
        let id = format!("{}-{}", self.cluster.name, cairn_core::SnapshotId::random());
        let begun = Instant::now();
        loop {
            if self.store.lock_blobs(&id, &self.cluster.name, exclusive, HOLD_TTL.as_millis() as i64).await? {
                return Ok(Some((self.store.clone(), id)));
            }
            if begun.elapsed() > patience {
                let what = if exclusive {
                    "gc waited 30 s for snapshots, restores or forks on other nodes; try again"
                } else {
                    "a gc on another node has held the blob store for 10 minutes"
                };
                return Err(Error::Unavailable(what.into()));
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}
