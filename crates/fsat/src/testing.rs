//! For tests (feature `test-util`): a [`Racer`] that does what a hostile
//! sandbox does to the daemon, swapping a directory and a symlink with
//! `renameat2(RENAME_EXCHANGE)` in a tight loop on a thread of its own.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Swaps two names in a directory until dropped (or until a swap fails
/// because the names are gone).
#[derive(Debug)]
pub struct Racer {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Racer {
    /// Starts swapping `a` and `b` in `dir`.
    pub fn start(dir: OwnedFd, a: &str, b: &str) -> Racer {
        let (stop, swaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (a, b) = (CString::new(a).expect("name without NUL"), CString::new(b).expect("name without NUL"));
        let (stop2, swaps2) = (stop.clone(), swaps.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) && crate::exchange_at(&dir, &a, &b).is_ok() {
                swaps2.fetch_add(1, Ordering::Relaxed);
            }
        });
        Racer { stop, swaps, thread: Some(thread) }
    }

    /// Waits until the racer has swapped at least once, so a test's calls
    /// race it from the first one (panics after 10 s).
    pub fn wait_started(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.swaps() == 0 {
            assert!(Instant::now() < deadline, "the racer did not start swapping within 10 s");
            std::thread::yield_now();
        }
    }

    /// Calls `call` while the racer swaps: at least `min_calls` times, and
    /// on until `call` returns true (it says whether the calls have seen
    /// enough, e.g. both sides of the swap) and the racer has swapped at
    /// least twice meanwhile. A fixed count is not enough: on a busy machine
    /// the racer can sit descheduled through thousands of fast calls, all
    /// of which then see the same side. Panics after 60 s.
    pub fn race(&self, min_calls: usize, mut call: impl FnMut() -> bool) {
        let at_start = self.swaps();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut calls = 0usize;
        loop {
            let enough = call();
            calls += 1;
            if calls >= min_calls && enough && self.swaps() >= at_start + 2 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "60 s of racing did not see enough ({calls} calls, {} swaps, calls satisfied: {enough})",
                self.swaps() - at_start
            );
            if calls.is_multiple_of(8) {
                // Gives the racer a turn when both share a core.
                std::thread::yield_now();
            }
        }
    }

    /// How many swaps it has made.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }
}

impl Drop for Racer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
