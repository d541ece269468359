//! How far the imports going on have got, by image name, for a client to
//! show while it waits: bytes of the source archive read (of its size) and
//! bytes written into the image so far.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::limits::Budget;

/// How far one import has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportProgress {
    /// Bytes of the source archive read so far.
    pub read: u64,
    /// The source archive's size, when the source is one archive file
    /// unpacked as it is read (a root filesystem's tar); `None` for a
    /// directory, an OCI layout or a docker archive.
    pub source_bytes: Option<u64>,
    /// Bytes written into the image (or its new layers) so far.
    pub written: u64,
}

/// The imports going on. Clones share the same registry.
#[derive(Clone, Debug, Default)]
pub(crate) struct Imports(Arc<Mutex<HashMap<String, Entry>>>);

#[derive(Debug)]
struct Entry {
    read: Arc<AtomicU64>,
    source_bytes: Option<u64>,
    written: Option<Budget>,
}

impl Imports {
    /// Registers the import of `name` until the guard is dropped.
    pub(crate) fn start(&self, name: &str) -> Tracked {
        let read = Arc::new(AtomicU64::new(0));
        let entry = Entry { read: read.clone(), source_bytes: None, written: None };
        if let Ok(mut map) = self.0.lock() {
            map.insert(name.to_owned(), entry);
        }
        Tracked { imports: self.clone(), name: name.to_owned(), read }
    }

    pub(crate) fn get(&self, name: &str) -> Option<ImportProgress> {
        let map = self.0.lock().ok()?;
        let e = map.get(name)?;
        Some(ImportProgress { read: e.read.load(Ordering::Relaxed), source_bytes: e.source_bytes, written: e.written.as_ref().map_or(0, Budget::written) })
    }

    /// Counts what `budget` writes as the import of `name`'s, if one is
    /// registered (a pull's layers are not).
    pub(crate) fn track_budget(&self, name: &str, budget: &Budget) {
        self.update(name, |e| e.written = Some(budget.clone()));
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut Entry)) {
        if let Ok(mut map) = self.0.lock() {
            if let Some(e) = map.get_mut(name) {
                f(e);
            }
        }
    }
}

/// One import's registration; it ends when this is dropped, however the
/// import ends.
pub(crate) struct Tracked {
    imports: Imports,
    name: String,
    read: Arc<AtomicU64>,
}

impl Tracked {
    /// The source is one archive file of `bytes`, read through
    /// [`Tracked::reader`].
    pub(crate) fn source(&self, bytes: u64) {
        self.imports.update(&self.name, |e| e.source_bytes = Some(bytes));
    }

    /// `inner`, counting what is read from it as the source read.
    pub(crate) fn reader<R: Read>(&self, inner: R) -> Counting<R> {
        Counting { inner, read: self.read.clone() }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Ok(mut map) = self.imports.0.lock() {
            map.remove(&self.name);
        }
    }
}

/// A reader that adds what it reads to a shared count.
pub(crate) struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_import_is_listed_while_it_runs_and_counts_what_it_reads() {
        let imports = Imports::default();
        assert_eq!(imports.get("a"), None);
        let tracked = imports.start("a");
        tracked.source(10);
        let mut r = tracked.reader(&b"0123456789"[..]);
        let mut buf = [0u8; 4];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(imports.get("a"), Some(ImportProgress { read: 4, source_bytes: Some(10), written: 0 }));
        let budget = Budget::new(crate::ImportLimits::default(), None);
        imports.track_budget("a", &budget);
        budget.wrote(std::path::Path::new("src"), &"f", 7).unwrap();
        assert_eq!(imports.get("a").unwrap().written, 7);
        imports.track_budget("not-importing", &budget);
        assert_eq!(imports.get("not-importing"), None);
        drop(tracked);
        assert_eq!(imports.get("a"), None, "gone once the import ends");
    }
}
