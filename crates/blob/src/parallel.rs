//! Bounded parallelism for transfers: many reads, writes or deletes of
//! objects, at most a given number at a time, on scoped threads (the
//! backends are synchronous and block).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::Result;

/// Runs `f` on every item, at most `limit` at a time; the results come back
/// in the items' order. With a limit of one (or one item) it runs on the
/// calling thread.
pub fn map_bounded<T: Send, R: Send>(items: Vec<T>, limit: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    run(items, limit, &f, None)
}

/// [`map_bounded`] for fallible work: after the first error no new item is
/// started, and the error of the earliest failed item is returned.
pub fn try_map_bounded<T: Send, R: Send>(items: Vec<T>, limit: usize, f: impl Fn(T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let failed = AtomicBool::new(false);
    let g = |item: T| {
        let r = f(item);
        if r.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        r
    };
    run(items, limit, &g, Some(&failed)).into_iter().collect()
}

fn run<T: Send, R: Send>(items: Vec<T>, limit: usize, f: &(impl Fn(T) -> R + Sync), stop: Option<&AtomicBool>) -> Vec<R> {
    let n = items.len();
    let workers = limit.clamp(1, n.max(1));
    if workers == 1 {
        let mut out = Vec::with_capacity(n);
        for item in items {
            out.push(f(item));
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                break;
            }
        }
        return out;
    }
    let queue = Mutex::new(items.into_iter().enumerate());
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                    break;
                }
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some((i, item)) = next else { break };
                let r = f(item);
                results.lock().unwrap_or_else(PoisonError::into_inner)[i] = Some(r);
            });
        }
    });
    // Items not started after an error have no result; a worker's panic
    // went on through the scope above.
    results.into_inner().unwrap_or_else(PoisonError::into_inner).into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;
    use crate::Error;

    #[test]
    fn keeps_order_and_bounds_concurrency() {
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = map_bounded((0..40).collect(), 4, |i: u64| {
            let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(in_flight, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            now.fetch_sub(1, Ordering::SeqCst);
            i * 2
        });
        assert_eq!(out, (0..40).map(|i| i * 2).collect::<Vec<_>>());
        let most = most.load(Ordering::SeqCst);
        assert!((2..=4).contains(&most), "{most} at once");
        assert!(map_bounded(Vec::<u8>::new(), 8, |x| x).is_empty());
        assert_eq!(map_bounded(vec![1, 2], 1, |x| x + 1), vec![2, 3]);
    }

    #[test]
    fn stops_after_the_first_error() {
        let started = AtomicUsize::new(0);
        let r = try_map_bounded((0..1000).collect(), 3, |i: usize| {
            started.fetch_add(1, Ordering::SeqCst);
            if i == 5 {
                return Err(Error::Writer(format!("item {i}")));
            }
            std::thread::sleep(Duration::from_millis(1));
            Ok(i)
        });
        assert!(matches!(r, Err(Error::Writer(w)) if w == "item 5"));
        assert!(started.load(Ordering::SeqCst) < 100);
        assert_eq!(try_map_bounded((0..10).collect(), 3, |i: usize| Ok(i)).unwrap(), (0..10).collect::<Vec<_>>());
    }
}
