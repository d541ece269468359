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

/// Host-wide record of which uid slots live sandboxes use, shared by every
/// daemon on the host (each home has its own store, but uid ranges are a
/// host resource). One file per slot under `/run/cairn/uid-slots`, created
/// with `O_EXCL`; it names its owner (home and task) and, once started, the
/// init's pid and start time, so an entry whose init is gone is stale.
#[derive(Debug, Clone)]
pub struct HostSlots {
    dir: PathBuf,
}

impl Default for HostSlots {
    fn default() -> Self {
        HostSlots { dir: PathBuf::from("/run/cairn/uid-slots") }
    }
}

impl HostSlots {
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        HostSlots { dir: dir.into() }
    }

    fn path(&self, slot: u32) -> PathBuf {
        self.dir.join(slot.to_string())
    }

    /// Takes `slot` for `owner`. False when another live sandbox holds it.
    pub fn reserve(&self, slot: u32, owner: &str) -> Result<bool> {
        fs::create_dir_all(&self.dir).map_err(|e| Error::Io(self.dir.display().to_string(), e))?;
        let path = self.path(slot);
        for _ in 0..2 {
            match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    std::io::Write::write_all(&mut f, format!("{owner}\n").as_bytes())
                        .map_err(|e| Error::Io(path.display().to_string(), e))?;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    let mut lines = text.lines();
                    if lines.next() == Some(owner) {
                        return Ok(true);
                    }
                    if !entry_is_stale(&path, lines.next()) {
                        return Ok(false);
                    }
                    let _ = fs::remove_file(&path);
                }
                Err(e) => return Err(Error::Io(path.display().to_string(), e)),
            }
        }
        Ok(false)
    }

    /// Notes the init of the sandbox on `slot`, for staleness checks.
    pub fn record_init(&self, slot: u32, owner: &str, pid: i32, start_time: u64) -> Result<()> {
        let path = self.path(slot);
        fs::write(&path, format!("{owner}\n{pid} {start_time}\n")).map_err(|e| Error::Io(path.display().to_string(), e))
    }

    /// Gives `slot` back if `owner` holds it.
    pub fn release(&self, slot: u32, owner: &str) {
        let path = self.path(slot);
        if fs::read_to_string(&path).is_ok_and(|t| t.lines().next() == Some(owner)) {
            let _ = fs::remove_file(path);
        }
    }
}

/// An entry is stale when its init is gone, or, before the init was
/// recorded, when it is older than any start takes.
fn entry_is_stale(path: &std::path::Path, init: Option<&str>) -> bool {
    match init.and_then(|l| l.split_once(' ')) {
        Some((pid, start)) => {
            let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else { return true };
            crate::process::spawn::process_start_time(pid) != Some(start)
        }
        None => fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().unwrap_or_default() > std::time::Duration::from_secs(60))
            .unwrap_or(true),
    }
}

#[cfg(test)]
mod host_slot_tests {
    use super::*;

    #[test]
    fn slots_are_shared_between_owners_and_freed_when_stale() {
        let dir = tempfile::tempdir().unwrap();
        let slots = HostSlots::at(dir.path());
        assert!(slots.reserve(0, "/home-a\tt1").unwrap());
        assert!(slots.reserve(0, "/home-a\tt1").unwrap(), "the owner may take it again");
        assert!(!slots.reserve(0, "/home-b\tt2").unwrap(), "another home's live sandbox keeps it");
        // Recorded with a live init (this process): still held.
        let me = std::process::id() as i32;
        let start = crate::process::spawn::process_start_time(me).unwrap();
        slots.record_init(0, "/home-a\tt1", me, start).unwrap();
        assert!(!slots.reserve(0, "/home-b\tt2").unwrap());
        // An init that is gone frees it.
        slots.record_init(0, "/home-a\tt1", me, start + 1).unwrap();
        assert!(slots.reserve(0, "/home-b\tt2").unwrap());
        slots.release(0, "/home-a\tt1");
        assert!(dir.path().join("0").exists(), "only the owner releases");
        slots.release(0, "/home-b\tt2");
        assert!(!dir.path().join("0").exists());
    }
}
