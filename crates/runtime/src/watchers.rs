//! Directory watches in a task's sandbox, reported by the sandbox's own
//! inotify ([`cairn_sandbox::watch`]): the daemon starts the watch through
//! its driver and reads the events from a pipe; it never looks a path of
//! the sandbox up itself.
//!
//! Two shapes, as E2B has them: a [`DirWatch`] streams events for as long
//! as its client holds it; a kept watcher ([`Runtime::create_watcher`])
//! collects them in the daemon until a client asks for them. Both end with
//! the sandbox (a suspend, a stop): a watch is not part of a snapshot.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

pub use cairn_sandbox::watch::{WatchEvent, WatchKind};
use cairn_sandbox::watch::WatchLine;
use cairn_sandbox::RunningCommand;
use tokio::sync::mpsc;

use crate::runtime::Runtime;
use crate::Error;

/// Events a kept watcher holds between two reads; older ones are dropped.
const KEPT_EVENTS: usize = 10_000;
/// Kept watchers one task may have at once.
const MAX_KEPT_PER_TASK: usize = 64;
/// How long a watch may take to be in place.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A running watch: its events, until the watch ends (the directory was
/// removed, the sandbox stopped). Dropping it stops the watch.
#[derive(Debug)]
pub struct DirWatch {
    pub events: mpsc::Receiver<WatchEvent>,
    /// The watch's connection to the sandbox: closed, the watch is killed.
    _command: RunningCommand,
}

/// The kept watchers of the daemon, by id.
#[derive(Default)]
pub(crate) struct Watchers {
    kept: Mutex<HashMap<String, Kept>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Watchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("Watchers").field("kept", &kept).finish()
    }
}

struct Kept {
    task: String,
    path: String,
    with_entries: bool,
    events: Arc<Mutex<KeptEvents>>,
    /// Collects the watch's events into `events`; aborted on removal.
    collector: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct KeptEvents {
    events: VecDeque<WatchEvent>,
    /// Events were dropped since the last read ([`KEPT_EVENTS`]).
    dropped: bool,
    /// The watch has ended; the watcher goes once its events are read.
    ended: bool,
}

/// What a kept watcher has collected since it was last asked.
#[derive(Debug)]
pub struct WatcherEvents {
    /// The watched directory, absolute in the sandbox.
    pub path: String,
    /// The client asked for each entry's details with its event.
    pub with_entries: bool,
    pub events: Vec<WatchEvent>,
    /// Some were dropped: more came than a watcher keeps between reads.
    pub dropped: bool,
}

impl Runtime {
    /// Starts watching directory `path` (absolute, as the sandbox sees it)
    /// of task `id`; returns once the watch is in place, so nothing done
    /// after is missed.
    pub async fn watch_dir(&self, id: &str, path: &str, recursive: bool, actor: &str) -> Result<DirWatch, Error> {
        if !path.starts_with('/') {
            return Err(Error::invalid(format!("{path}: a watched directory is an absolute path")));
        }
        let (task, _live) = self.running(id, actor).await?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::internal_from(e).context("a pipe for a watch"))?;
        let started = self.driver.watch(task.id.as_str(), path, recursive, write).await?;
        let command = started.map_err(|why| Error::Unavailable(format!("cannot watch {path} in task {}: {why}", task.id)))?;
        let (tx, rx) = mpsc::channel(1024);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let where_ = format!("{path} in task {}", task.id);
        std::thread::Builder::new()
            .name("dir-watch".into())
            .spawn(move || relay_lines(std::fs::File::from(read), ready_tx, tx))
            .map_err(|e| Error::internal_from(e).context("a thread for a watch"))?;
        match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(DirWatch { events: rx, _command: command }),
            Ok(Ok(Err(why))) if why.contains("no such directory") => Err(Error::NotFound(format!("cannot watch {why}"))),
            Ok(Ok(Err(why))) => Err(Error::invalid(format!("cannot watch {why}"))),
            Ok(Err(_)) => Err(Error::Unavailable(format!("the watch of {where_} ended before it began"))),
            Err(_) => Err(Error::Unavailable(format!("the watch of {where_} was not in place within {START_TIMEOUT:?}"))),
        }
    }

    /// Starts a watch kept in the daemon; its events are collected until
    /// [`Runtime::watcher_events`] takes them (`with_entries` is kept for
    /// the client: the entries' details are looked up when read). Returns
    /// the watcher's id.
    pub async fn create_watcher(&self, id: &str, path: &str, recursive: bool, with_entries: bool, actor: &str) -> Result<String, Error> {
        let task = self.find(id).await?.id.to_string();
        let count = self.watchers.kept.lock().unwrap_or_else(PoisonError::into_inner).values().filter(|k| k.task == task).count();
        if count >= MAX_KEPT_PER_TASK {
            return Err(Error::TooMany(format!("task {task} has {count} watchers, the most one task may keep; remove one first")));
        }
        let watch = self.watch_dir(&task, path, recursive, actor).await?;
        let events = Arc::new(Mutex::new(KeptEvents::default()));
        let sink = events.clone();
        let collector = tokio::spawn(async move {
            // The whole watch, not just its events: its connection keeps it alive.
            let mut watch = watch;
            while let Some(event) = watch.events.recv().await {
                let mut kept = sink.lock().unwrap_or_else(PoisonError::into_inner);
                if kept.events.len() >= KEPT_EVENTS {
                    kept.events.pop_front();
                    kept.dropped = true;
                }
                kept.events.push_back(event);
            }
            sink.lock().unwrap_or_else(PoisonError::into_inner).ended = true;
        });
        let watcher = format!("w{}", self.watchers.next.fetch_add(1, Ordering::Relaxed) + 1);
        self.watchers.kept.lock().unwrap_or_else(PoisonError::into_inner).insert(watcher.clone(), Kept { task, path: path.to_owned(), with_entries, events, collector });
        Ok(watcher)
    }

    /// The events kept watcher `watcher` of task `id` has collected since
    /// it was last asked. A watcher whose watch ended goes once read.
    pub async fn watcher_events(&self, id: &str, watcher: &str) -> Result<WatcherEvents, Error> {
        let task = self.find(id).await?.id.to_string();
        let mut kept = self.watchers.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let found = kept.get(watcher).filter(|k| k.task == task).ok_or_else(|| no_watcher(watcher, &task))?;
        let (taken, ended) = {
            let mut events = found.events.lock().unwrap_or_else(PoisonError::into_inner);
            let taken = WatcherEvents {
                path: found.path.clone(),
                with_entries: found.with_entries,
                events: events.events.drain(..).collect(),
                dropped: std::mem::take(&mut events.dropped),
            };
            (taken, events.ended)
        };
        if ended && taken.events.is_empty() {
            kept.remove(watcher);
            return Err(Error::NotFound(format!("watcher {watcher} of task {task} has ended (its directory or its sandbox is gone)")));
        }
        Ok(taken)
    }

    /// Stops and forgets kept watcher `watcher` of task `id`.
    pub async fn remove_watcher(&self, id: &str, watcher: &str) -> Result<(), Error> {
        let task = self.find(id).await?.id.to_string();
        let mut kept = self.watchers.kept.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.get(watcher) {
            Some(k) if k.task == task => {}
            _ => return Err(no_watcher(watcher, &task)),
        }
        if let Some(k) = kept.remove(watcher) {
            k.collector.abort();
        }
        Ok(())
    }
}

fn no_watcher(watcher: &str, task: &str) -> Error {
    Error::NotFound(format!("task {task} has no watcher {watcher}"))
}

/// Reads the watcher's lines: the first says whether the watch is in
/// place, the rest are events. Ends with the pipe or the receiver.
fn relay_lines(pipe: std::fs::File, ready: tokio::sync::oneshot::Sender<Result<(), String>>, events: mpsc::Sender<WatchEvent>) {
    let mut lines = BufReader::new(pipe).lines();
    let first = match lines.next() {
        Some(Ok(line)) => serde_json::from_str::<WatchLine>(&line).map_err(|e| format!("a malformed answer from the watch: {e}")),
        Some(Err(e)) => Err(format!("cannot read the watch: {e}")),
        None => Err("the watch ended before it began".into()),
    };
    match first {
        Ok(WatchLine::Ready) => {
            if ready.send(Ok(())).is_err() {
                return;
            }
        }
        Ok(WatchLine::Error(why)) | Err(why) => {
            let _ = ready.send(Err(why));
            return;
        }
        Ok(WatchLine::Event(_)) => {
            let _ = ready.send(Err("the watch sent an event before it was in place".into()));
            return;
        }
    }
    for line in lines {
        let Ok(line) = line else { return };
        match serde_json::from_str::<WatchLine>(&line) {
            Ok(WatchLine::Event(event)) => {
                if events.blocking_send(event).is_err() {
                    return;
                }
            }
            Ok(WatchLine::Error(why)) => {
                tracing::warn!("a directory watch failed: {why}");
                return;
            }
            Ok(WatchLine::Ready) | Err(_) => return,
        }
    }
}
