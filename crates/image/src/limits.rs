//! How much one import may unpack.
//!
//! An archive's headers say how big each file is, and a compressed archive
//! or a sparse file can say a great deal in a few bytes (10 GB of zeros is
//! a 330 KB `.tar.zst`). Each file's size is therefore checked against the
//! import's [`Budget`] before anything of it is written, and the bytes are
//! counted again as they are written, so an import stops at its limit with
//! an error instead of filling the host's disk.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::{Error, Result};

/// The default of [`ImportLimits::max_expanded_size`]: 64 GiB.
pub const DEFAULT_MAX_EXPANDED_SIZE: u64 = 64 << 30;
/// The default of [`ImportLimits::max_logical_size`]: 1 TiB.
pub const DEFAULT_MAX_LOGICAL_SIZE: u64 = 1 << 40;
/// Space an import leaves free on the store's filesystem (a twentieth of
/// a filesystem smaller than 20 GiB).
const RESERVE: u64 = 1 << 30;

/// Bounds on what one import unpacks: an archive or a directory, or the
/// layers an OCI image (imported or pulled) adds to the layer store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportLimits {
    /// Bytes of file data written. A sparse file's holes are not written
    /// and do not count; the import also stops short of the free space of
    /// the store's filesystem, less a reserve.
    pub max_expanded_size: u64,
    /// Apparent size of the regular files, holes included: a sanity bound
    /// on sparse files, which cost no disk but read as that many zeros.
    pub max_logical_size: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits { max_expanded_size: DEFAULT_MAX_EXPANDED_SIZE, max_logical_size: DEFAULT_MAX_LOGICAL_SIZE }
    }
}

/// Which bound an import ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeBound {
    /// [`ImportLimits::max_expanded_size`].
    Expanded,
    /// [`ImportLimits::max_logical_size`].
    Logical,
    /// The free space of the store's filesystem, less a reserve.
    FreeSpace,
}

/// What is left of one import's limits, shared by the writers of all the
/// layers it unpacks.
#[derive(Clone, Debug)]
pub(super) struct Budget(Arc<Counters>);

#[derive(Debug)]
struct Counters {
    limits: ImportLimits,
    /// What the store's filesystem can spare, if that is the tighter bound.
    free: Option<u64>,
    written: AtomicU64,
    logical: AtomicU64,
}

impl Budget {
    /// A budget of `limits` and no more than `free` bytes written.
    pub(super) fn new(limits: ImportLimits, free: Option<u64>) -> Budget {
        let free = free.filter(|&f| f < limits.max_expanded_size);
        Budget(Arc::new(Counters { limits, free, written: AtomicU64::new(0), logical: AtomicU64::new(0) }))
    }

    /// A budget for an import into the filesystem of `dir` (which exists):
    /// `limits`, and its free space less a reserve.
    pub(super) fn for_import(limits: ImportLimits, dir: &Path) -> Result<Budget> {
        Ok(Budget::new(limits, Some(spare(dir)?)))
    }

    /// Bytes written so far.
    pub(super) fn written(&self) -> u64 {
        self.0.written.load(Ordering::Relaxed)
    }

    /// Before a file is written: it will take `data` bytes and read as
    /// `logical` bytes (more, for a sparse file). Fails if either would
    /// take the import past its bounds; nothing is written then.
    pub(super) fn reserve(&self, src: &Path, entry: &dyn fmt::Display, data: u64, logical: u64) -> Result<()> {
        let c = &self.0;
        let apparent = c.logical.load(Ordering::Relaxed).saturating_add(logical);
        if apparent > c.limits.max_logical_size {
            return Err(too_large(src, entry, apparent, c.limits.max_logical_size, SizeBound::Logical));
        }
        c.logical.store(apparent, Ordering::Relaxed);
        self.check(src, entry, c.written.load(Ordering::Relaxed).saturating_add(data))
    }

    /// While a file is written: `n` more bytes were. Fails once the import
    /// has written more than it may.
    pub(super) fn wrote(&self, src: &Path, entry: &dyn fmt::Display, n: u64) -> Result<()> {
        let written = self.0.written.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        self.check(src, entry, written)
    }

    fn check(&self, src: &Path, entry: &dyn fmt::Display, need: u64) -> Result<()> {
        let c = &self.0;
        let (limit, bound) = match c.free {
            Some(free) => (free, SizeBound::FreeSpace),
            None => (c.limits.max_expanded_size, SizeBound::Expanded),
        };
        if need > limit {
            return Err(too_large(src, entry, need, limit, bound));
        }
        Ok(())
    }
}

/// What the filesystem of `dir` (which exists) can spare for an import:
/// its free space less a reserve.
pub(super) fn spare(dir: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|e| Error::ImageIo(dir.to_owned(), e.into()))?;
    let frsize = st.fragment_size() as u64;
    let (total, avail) = ((st.blocks() as u64).saturating_mul(frsize), (st.blocks_available() as u64).saturating_mul(frsize));
    let reserve = RESERVE.min(total / 20);
    Ok(avail.saturating_sub(reserve))
}

fn too_large(src: &Path, entry: &dyn fmt::Display, need: u64, limit: u64, bound: SizeBound) -> Error {
    Error::ImageTooLarge { src: src.to_owned(), entry: entry.to_string(), need, limit, bound }
}

/// The reason of an [`Error::ImageTooLarge`], after the entry's name.
pub(crate) fn too_large_reason(need: u64, limit: u64, bound: SizeBound) -> String {
    match bound {
        SizeBound::Expanded => {
            format!(
                "would bring the file data written to {}, over the limit of {} ([images] max_size)",
                human(need),
                human(limit)
            )
        }
        SizeBound::Logical => format!(
            "would bring the files' apparent size (holes included) to {}, over the limit of {} ([images] max_apparent_size)",
            human(need),
            human(limit)
        ),
        SizeBound::FreeSpace => format!(
            "would bring the file data written to {}, over the {} the image store's filesystem can spare",
            human(need),
            human(limit)
        ),
    }
}

/// `n` bytes in binary units, for messages: `512 B`, `10.0 GiB`.
pub(crate) fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(10 << 30), "10.0 GiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn a_budget_counts_before_and_while_writing() {
        let src = Path::new("/src.tar");
        let limits = ImportLimits { max_expanded_size: 100, max_logical_size: 1000 };
        let b = Budget::new(limits, None);
        b.reserve(src, &"/a", 60, 600).unwrap();
        b.wrote(src, &"/a", 60).unwrap();
        // Holes: a file of 900 bytes with 10 written.
        match b.reserve(src, &"/b", 10, 900) {
            Err(Error::ImageTooLarge { need: 1500, limit: 1000, bound: SizeBound::Logical, .. }) => {}
            other => panic!("{other:?}"),
        }
        match b.reserve(src, &"/c", 41, 41) {
            Err(Error::ImageTooLarge { need: 101, limit: 100, bound: SizeBound::Expanded, entry, .. }) => {
                assert_eq!(entry, "/c")
            }
            other => panic!("{other:?}"),
        }
        // More written than said: stopped while writing.
        b.reserve(src, &"/d", 0, 0).unwrap();
        assert!(matches!(b.wrote(src, &"/d", 41), Err(Error::ImageTooLarge { need: 101, .. })));
        // The free space, when it is tighter, is the bound.
        let tight = Budget::new(limits, Some(50));
        assert!(matches!(
            tight.reserve(src, &"/e", 51, 51),
            Err(Error::ImageTooLarge { limit: 50, bound: SizeBound::FreeSpace, .. })
        ));
        assert_eq!(Budget::new(limits, Some(500)).0.free, None);
    }
}
