//! Progress reports for long captures and restores.

use std::time::{Duration, Instant};

/// Where a capture or restore is. Totals are what is known when the report
/// is made (a phase's totals are known once its walk is done).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub phase: &'static str,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

const EVERY: Duration = Duration::from_millis(100);
const EVERY_BYTES: u64 = 1 << 20;

/// Calls the caller's callback at most every 100 ms or 1 MiB, plus once at
/// each phase's start and end.
pub(crate) struct Reporter<'a> {
    f: &'a mut dyn FnMut(&Progress),
    pub now: Progress,
    last: Instant,
    last_bytes: u64,
}

impl<'a> Reporter<'a> {
    pub fn new(f: &'a mut dyn FnMut(&Progress)) -> Reporter<'a> {
        Reporter { f, now: Progress::default(), last: Instant::now(), last_bytes: 0 }
    }

    /// Starts a phase with its totals and reports it.
    pub fn phase(&mut self, phase: &'static str, files_total: u64, bytes_total: u64) {
        self.now = Progress { phase, files_done: 0, files_total, bytes_done: 0, bytes_total };
        self.force();
    }

    pub fn add(&mut self, files: u64, bytes: u64) {
        self.now.files_done += files;
        self.now.bytes_done += bytes;
        if self.now.bytes_done - self.last_bytes >= EVERY_BYTES || self.last.elapsed() >= EVERY {
            self.force();
        }
    }

    pub fn force(&mut self) {
        self.last = Instant::now();
        self.last_bytes = self.now.bytes_done;
        (self.f)(&self.now);
    }
}

impl std::fmt::Debug for Reporter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter").field("now", &self.now).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttles_by_bytes() {
        let mut seen = Vec::new();
        let mut f = |p: &Progress| seen.push(p.clone());
        {
            let mut r = Reporter::new(&mut f);
            r.phase("read", 3, 3 << 20);
            for _ in 0..1024 {
                r.add(0, 3 << 10);
            }
            r.add(3, 0);
            r.force();
        }
        assert!(seen.len() >= 4 && seen.len() < 10, "{}", seen.len());
        assert_eq!(seen.last().unwrap(), &Progress { phase: "read", files_done: 3, files_total: 3, bytes_done: 3 << 20, bytes_total: 3 << 20 });
    }
}
