//! Admission of task disks against the space that holds them.
//!
//! A task disk is a sparse file sized by the task's limit: it takes blocks
//! only as the task writes. Made without admission, disks overcommit the
//! filesystem, and a task writing its quota fills the host's disk. So a
//! new disk is admitted only when everything every disk may still write
//! (its size less what it already holds) fits in the free space, less a
//! reserve kept for the daemon's own data (the store, the blob store,
//! image layers, logs), which no sandbox can reach. An operator may also
//! cap the sum of all disk sizes with a budget.
//!
//! The count is read from the disk files at each admission (their sizes
//! and allocated blocks), so it needs no state of its own and stays right
//! across restarts, discards and deletions.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::{Error, Result};

/// The reserve when none is configured: this share of the filesystem...
const DEFAULT_RESERVE_PERCENT: u64 = 5;
/// ...but at least this much.
const DEFAULT_RESERVE_MIN: u64 = 1 << 30;

/// How the space of the disks' filesystem is shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskSpace {
    /// Kept free for the daemon's own data; `None`: 5 % of the filesystem,
    /// at least 1 GiB.
    pub reserve: Option<u64>,
    /// At most this much in all task disks' sizes together; `None`: no cap
    /// but the free space.
    pub budget: Option<u64>,
}

/// What the disks already hold and promise.
#[derive(Debug, Default, PartialEq, Eq)]
struct Promised {
    disks: usize,
    /// The sum of their sizes.
    size: u64,
    /// What they may still write: sizes less allocated blocks.
    unwritten: u64,
}

impl DiskSpace {
    /// Admits a new disk of `size` bytes among the task disks (`*.img`) in
    /// `dir`, or says why not in one line.
    pub fn admit(&self, dir: &Path, size: u64) -> Result<()> {
        let promised = promised(dir)?;
        let vfs = nix::sys::statvfs::statvfs(dir).map_err(|e| Error::Disk(dir.to_owned(), e.into()))?;
        let frsize = vfs.fragment_size();
        let free = vfs.blocks_available().saturating_mul(frsize);
        let total = vfs.blocks().saturating_mul(frsize);
        let reserve = self.reserve.unwrap_or_else(|| (total / 100 * DEFAULT_RESERVE_PERCENT).max(DEFAULT_RESERVE_MIN));
        decide(size, free, reserve, self.budget, &promised).map_err(Error::DiskSpace)
    }
}

fn decide(size: u64, free: u64, reserve: u64, budget: Option<u64>, p: &Promised) -> std::result::Result<(), String> {
    if let Some(budget) = budget {
        if p.size.saturating_add(size) > budget {
            return Err(format!(
                "no room for a {} task disk in the disk budget of {} ([disk] budget): {} task disk{} hold {} of it",
                approx(size),
                approx(budget),
                p.disks,
                if p.disks == 1 { "" } else { "s" },
                approx(p.size)
            ));
        }
    }
    let room = free.saturating_sub(reserve).saturating_sub(p.unwritten);
    if size > room {
        return Err(format!(
            "no room for a {} task disk: {} free, of which {} is kept for the daemon's own data ([disk] reserve) and {} is promised to {} other task disk{}",
            approx(size),
            approx(free),
            approx(reserve),
            approx(p.unwritten),
            p.disks,
            if p.disks == 1 { "" } else { "s" }
        ));
    }
    Ok(())
}

/// Sums the task disks in `dir` (the pool's blanks, in a directory of
/// their own, are nobody's yet).
fn promised(dir: &Path) -> Result<Promised> {
    let mut p = Promised::default();
    let entries = fs::read_dir(dir).map_err(|e| Error::Disk(dir.to_owned(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::Disk(dir.to_owned(), e))?;
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "img") {
            continue;
        }
        // The daemon's own directory: a disk removed meanwhile is no
        // promise any more.
        let Ok(m) = fs::symlink_metadata(&path) else { continue };
        if !m.is_file() {
            continue;
        }
        p.disks += 1;
        p.size = p.size.saturating_add(m.len());
        p.unwritten = p.unwritten.saturating_add(m.len().saturating_sub(m.blocks().saturating_mul(512)));
    }
    Ok(p)
}

/// `1.5 GiB`, `300 MiB`, `12 KiB`: for messages.
pub fn approx(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else if v < 10.0 && v.fract() != 0.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_disk_fits_when_what_all_disks_may_still_write_fits_in_the_free_space_less_the_reserve() {
        let p = Promised { disks: 2, size: 8 * GIB, unwritten: 6 * GIB };
        assert_eq!(decide(2 * GIB, 10 * GIB, GIB, None, &p), Ok(()), "6 + 2 <= 10 - 1");
        let e = decide(4 * GIB, 10 * GIB, GIB, None, &p).unwrap_err();
        assert_eq!(
            e,
            "no room for a 4 GiB task disk: 10 GiB free, of which 1 GiB is kept for the daemon's own data ([disk] reserve) and 6 GiB is promised to 2 other task disks"
        );
        // Less free than the reserve: nothing fits.
        assert!(decide(1, GIB / 2, GIB, None, &Promised::default()).is_err());
    }

    #[test]
    fn a_budget_caps_the_sum_of_sizes_whatever_is_free() {
        let p = Promised { disks: 1, size: 2 * GIB, unwritten: 0 };
        assert_eq!(decide(GIB, 100 * GIB, GIB, Some(3 * GIB), &p), Ok(()));
        let e = decide(2 * GIB, 100 * GIB, GIB, Some(3 * GIB), &p).unwrap_err();
        assert_eq!(e, "no room for a 2 GiB task disk in the disk budget of 3 GiB ([disk] budget): 1 task disk hold 2 GiB of it");
    }

    #[test]
    fn written_blocks_are_no_longer_promised() {
        let d = tempfile::tempdir().unwrap();
        let f = fs::File::create(d.path().join("t1.img")).unwrap();
        f.set_len(64 << 20).unwrap();
        std::io::Write::write_all(&mut &f, &vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        fs::create_dir(d.path().join("pool")).unwrap();
        fs::File::create(d.path().join("pool/blank.img")).unwrap().set_len(64 << 20).unwrap();
        fs::write(d.path().join("notes.txt"), "not a disk").unwrap();
        let p = promised(d.path()).unwrap();
        assert_eq!((p.disks, p.size), (1, 64 << 20), "only task disks count, not the pool's");
        assert!(p.unwritten <= (63 << 20) && p.unwritten >= (62 << 20), "{}", p.unwritten);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(approx(512), "512 bytes");
        assert_eq!(approx(1536 * 1024 * 1024), "1.5 GiB");
        assert_eq!(approx(300 << 20), "300 MiB");
        assert_eq!(approx(12 << 30), "12 GiB");
    }
}
