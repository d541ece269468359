//! Uid slots, the runtime's side: a sandbox runs as its own range of host
//! uids (the driver's `uid_range(slot)`), claimed in the
//! store (so two tasks of this daemon never share one) and reserved on the
//! host (so no other daemon's sandbox uses it), and given back when the
//! sandbox goes away. Every claim and release goes through here.

use cairn_core::TaskId;

use crate::runtime::Runtime;
use crate::Error;

impl Runtime {
    /// A uid slot free both in this store and on the host (other daemons'
    /// sandboxes use the same host uid space).
    pub(crate) async fn claim_slot(&self, id: &TaskId) -> Result<u32, Error> {
        let mut min = 0;
        loop {
            let slot = self.store.claim_sandbox_slot_from(id, min).await?;
            match self.driver.reserve_slot(slot, id.as_str()).await {
                Ok(true) => return Ok(slot),
                Ok(false) => {
                    self.store.release_sandbox(id).await?;
                    min = slot + 1;
                }
                Err(e) => {
                    self.store.release_sandbox(id).await?;
                    return Err(e);
                }
            }
        }
    }

    /// A uid slot for a new sandbox of `id`, the previous one when free.
    pub(crate) async fn claim_slot_preferring(&self, id: &TaskId, previous: Option<u32>) -> Result<u32, Error> {
        if let Some(p) = previous {
            if self.store.try_claim_sandbox_slot(id, p).await? {
                if self.driver.reserve_slot(p, id.as_str()).await? {
                    return Ok(p);
                }
                self.store.release_sandbox(id).await?;
            }
        }
        self.claim_slot(id).await
    }

    pub(crate) async fn release_slot(&self, id: &TaskId) -> Result<(), Error> {
        if let Some(row) = self.store.sandbox(id).await? {
            self.driver.release_slot(row.uid_slot, id.as_str()).await;
        }
        self.store.release_sandbox(id).await?;
        Ok(())
    }
}
