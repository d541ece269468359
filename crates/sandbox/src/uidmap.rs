//! Host uid/gid ranges for sandbox user namespaces.
//!
//! Each live sandbox owns one slot; slot `n` maps sandbox ids `0..65536` onto
//! host ids `FIRST_HOST_ID + n * 65536 ..`. The store hands out slots, so no
//! two live sandboxes share a range. The ranges start far above the ids a
//! distribution gives to users and to `/etc/subuid`.

use std::fs;
use std::path::PathBuf;

use crate::{Error, Result};

/// First host id of slot 0 (2^30).
pub const FIRST_HOST_ID: u32 = 1 << 30;
/// Ids per sandbox: the usual 16-bit range, so images with `nobody` (65534) work.
pub const IDS_PER_SANDBOX: u32 = 65536;
/// Slots that fit below 2^31, which keeps every id a positive `i32`.
pub const MAX_SLOTS: u32 = (1 << 30) / IDS_PER_SANDBOX;

/// The host id range of one sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdRange {
    pub host_base: u32,
    pub count: u32,
}

impl IdRange {
    pub fn for_slot(slot: u32) -> Result<IdRange> {
        if slot >= MAX_SLOTS {
            return Err(Error::NoUidRange);
        }
        Ok(IdRange { host_base: FIRST_HOST_ID + slot * IDS_PER_SANDBOX, count: IDS_PER_SANDBOX })
    }

    /// The line written to `uid_map` and `gid_map`.
    pub fn map_line(&self) -> String {
        format!("0 {} {}\n", self.host_base, self.count)
    }

    /// Host id of sandbox id `inner`.
    pub fn host_id(&self, inner: u32) -> u32 {
        self.host_base + inner
    }

    pub fn contains_host(&self, host: u32) -> bool {
        host >= self.host_base && host - self.host_base < self.count
    }

    /// Writes the uid and gid maps of `pid`'s user namespace. Called by a
    /// privileged process in the parent namespace, so `setgroups` stays
    /// allowed inside.
    pub fn write_maps(&self, pid: i32) -> Result<()> {
        for file in ["uid_map", "gid_map"] {
            let path = PathBuf::from(format!("/proc/{pid}/{file}"));
            fs::write(&path, self.map_line()).map_err(|e| Error::Io(path.display().to_string(), e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_do_not_overlap() {
        let a = IdRange::for_slot(0).unwrap();
        let b = IdRange::for_slot(1).unwrap();
        assert_eq!(a.map_line(), "0 1073741824 65536\n");
        assert!(a.contains_host(a.host_id(65535)) && !a.contains_host(b.host_base));
        assert!(IdRange::for_slot(MAX_SLOTS - 1).unwrap().host_id(65535) <= i32::MAX as u32);
        assert!(matches!(IdRange::for_slot(MAX_SLOTS), Err(Error::NoUidRange)));
    }
}
