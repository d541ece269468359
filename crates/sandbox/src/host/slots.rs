//! The host side of uid slots: which slot each live sandbox of this host
//! uses, whatever daemon started it.
//!
//! A slot picks the sandbox's host id range ([`IdRange::for_slot`]). Each
//! daemon's store hands out slots among its own tasks; this record keeps
//! daemons with different homes on one host apart. One file per slot under
//! `/run/cairn/uid-slots`, created with `O_EXCL`; it names its owner (home
//! and task) and, once the sandbox runs, the init's pid and start time, so
//! an entry whose init is gone is stale and can be taken over.
//!
//! [`IdRange::for_slot`]: crate::IdRange::for_slot

use std::fs;
use std::path::{Path, PathBuf};

use crate::driver::InitProcess;
use crate::{Error, Result};

/// An entry with no init recorded yet is stale once older than any start takes.
const UNSTARTED_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The uid slots one home holds on this host.
#[derive(Debug, Clone)]
pub(crate) struct HostSlots {
    dir: PathBuf,
    /// Names this home in each entry (its run directory).
    home: PathBuf,
}

impl HostSlots {
    /// The host-wide record, for the home whose run directory is `home`.
    pub(crate) fn new(home: &Path) -> Self {
        HostSlots::at("/run/cairn/uid-slots", home)
    }

    pub(crate) fn at(dir: impl Into<PathBuf>, home: &Path) -> Self {
        HostSlots { dir: dir.into(), home: home.to_owned() }
    }

    fn path(&self, slot: u32) -> PathBuf {
        self.dir.join(slot.to_string())
    }

    fn owner(&self, task: &str) -> String {
        format!("{}\t{task}", self.home.display())
    }

    /// Takes `slot` for `task`. False when a live sandbox of another owner
    /// holds it; true again for the owner itself.
    pub(crate) fn reserve(&self, slot: u32, task: &str) -> Result<bool> {
        fs::create_dir_all(&self.dir).map_err(|e| Error::Io(self.dir.display().to_string(), e))?;
        let owner = self.owner(task);
        let path = self.path(slot);
        for _ in 0..2 {
            match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    std::io::Write::write_all(&mut f, format!("{owner}\n").as_bytes())
                        .map_err(|e| Error::Io(path.display().to_string(), e))?;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // An entry that cannot be read (EMFILE) is no evidence
                    // that its owner is gone.
                    let text = match fs::read_to_string(&path) {
                        Ok(t) => t,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(Error::Io(path.display().to_string(), e)),
                    };
                    let mut lines = text.lines();
                    if lines.next() == Some(owner.as_str()) {
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

    /// Notes the init of `task`'s sandbox on `slot`, so the entry lives
    /// exactly as long as that process.
    pub(crate) fn record_init(&self, slot: u32, task: &str, init: InitProcess) -> Result<()> {
        let path = self.path(slot);
        fs::write(&path, format!("{}\n{} {}\n", self.owner(task), init.pid, init.start_time))
            .map_err(|e| Error::Io(path.display().to_string(), e))
    }

    /// Takes `slot` for a sandbox that is already running (found again
    /// after a restart) and records its init. False when another owner's
    /// live sandbox holds the slot.
    pub(crate) fn adopt(&self, slot: u32, task: &str, init: InitProcess) -> Result<bool> {
        if !self.reserve(slot, task)? {
            return Ok(false);
        }
        self.record_init(slot, task, init)?;
        Ok(true)
    }

    /// Gives `slot` back if `task` of this home holds it.
    pub(crate) fn release(&self, slot: u32, task: &str) {
        let path = self.path(slot);
        if fs::read_to_string(&path).is_ok_and(|t| t.lines().next() == Some(self.owner(task).as_str())) {
            let _ = fs::remove_file(path);
        }
    }
}

/// An entry is stale when its init is known to have exited (one that cannot
/// be looked at now is not), or, before the init was recorded, when it is
/// older than any start takes.
fn entry_is_stale(path: &Path, init: Option<&str>) -> bool {
    match init.and_then(|l| l.split_once(' ')) {
        Some((pid, start)) => {
            let (Ok(pid), Ok(start_time)) = (pid.parse::<i32>(), start.parse::<u64>()) else { return true };
            InitProcess { pid, start_time }.exited()
        }
        None => fs::metadata(path)
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().unwrap_or_default() > UNSTARTED_GRACE)
            .unwrap_or(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::spawn::process_start_time;

    #[test]
    fn slots_are_shared_between_homes_and_freed_when_stale() {
        let dir = tempfile::tempdir().unwrap();
        let a = HostSlots::at(dir.path(), Path::new("/home-a"));
        let b = HostSlots::at(dir.path(), Path::new("/home-b"));
        assert!(a.reserve(0, "t1").unwrap());
        assert!(a.reserve(0, "t1").unwrap(), "the owner may take it again");
        assert!(!b.reserve(0, "t2").unwrap(), "another home's live sandbox keeps it");
        assert!(!a.reserve(0, "t2").unwrap(), "so does another task of the same home");
        // Recorded with a live init (this process): still held.
        let me = std::process::id() as i32;
        let start = process_start_time(me).unwrap();
        a.record_init(0, "t1", InitProcess { pid: me, start_time: start }).unwrap();
        assert!(!b.reserve(0, "t2").unwrap());
        // An init that is gone frees it.
        a.record_init(0, "t1", InitProcess { pid: me, start_time: start + 1 }).unwrap();
        assert!(b.reserve(0, "t2").unwrap());
        a.release(0, "t1");
        assert!(dir.path().join("0").exists(), "only the owner releases");
        b.release(0, "t2");
        assert!(!dir.path().join("0").exists());
    }

    #[test]
    fn adopting_records_the_running_init() {
        let dir = tempfile::tempdir().unwrap();
        let a = HostSlots::at(dir.path(), Path::new("/home-a"));
        let b = HostSlots::at(dir.path(), Path::new("/home-b"));
        let me = std::process::id() as i32;
        let init = InitProcess { pid: me, start_time: process_start_time(me).unwrap() };
        assert!(a.adopt(3, "t1", init).unwrap());
        assert!(!b.adopt(3, "t2", init).unwrap(), "a live sandbox of another home keeps its slot");
        let text = fs::read_to_string(dir.path().join("3")).unwrap();
        assert_eq!(text, format!("/home-a\tt1\n{me} {}\n", init.start_time));
    }
}
