//! Snapshots: capture a task's writable layer into the blob store, and what
//! rollback, fork, suspend and wake share (manifests, baselines, restores,
//! retention, progress).
//!
//! A snapshot is written in this order, so a crash at any point leaves no
//! visible half-snapshot: chunks and packs, the index, the manifest (all in
//! the blob store, each durable before the next), then the snapshot row and
//! its event in one transaction. Everything before the row is invisible
//! garbage until `gc` removes it.
//!
//! `gc` and snapshot writers are serialised by the blob store's gc lock: a
//! writer may reuse any chunk it finds in the index, so no sweep may run
//! while it does. The grace period additionally protects objects of other
//! daemons sharing the same store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blob::{ObjectId, Repository};
use cairn_core::{EventKind, NewEvent, RiskPolicy, Snapshot, SnapshotId, SnapshotKind, Task, TaskId};
use cairn_sandbox::SandboxDriver;
use cairn_snapshot::{ChangeWatch, IdShift, LayerSpec, Manifest};
use cairn_store::now_ms;
use serde_json::json;

use crate::{Error, reaper};
use crate::runtime::{Live, Runtime};

/// Longest note or rollback reason accepted.
pub(crate) const MAX_NOTE: usize = 4096;

/// Longest memory summary accepted.
pub(crate) const MAX_MEMORY: usize = 1 << 20;

pub use cairn_api::snapshots::{FileChange, FileSide, ForkRequest, GcRequest, OpProgress, RollbackRequest, SnapshotRequest};

/// Files larger than this are shown in a snapshot diff by size, not read.
pub const DIFF_READ_LIMIT: u64 = 1 << 20;

/// The entry a sandbox path names in a manifest: in the layer mounted
/// deepest above it.
fn entry_at<'m>(m: &'m Manifest, path: &str) -> Option<&'m cairn_snapshot::Entry> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(path);
    let mut layers: Vec<_> = m.layers.iter().filter(|l| path.starts_with(&l.at)).collect();
    layers.sort_by_key(|l| std::cmp::Reverse(l.at.components().count()));
    layers.into_iter().find_map(|l| {
        let rel = path.strip_prefix(&l.at).ok()?;
        // The path as the diff showed it: a name that is not UTF-8 with
        // its bytes written \xNN.
        l.entries.iter().find(|e| e.path == rel).or_else(|| l.entries.iter().find(|e| cairn_core::name::escaped(e.path.as_os_str().as_bytes()) == rel.to_string_lossy()))
    })
}

/// The engine's snapshots part: the blob store snapshots live in, the
/// commands that count as risky, and gc's grace period. The blob store's
/// calls block (they read and write packs), so they run on the blocking
/// pool, here; what a snapshot means for a task (its sandbox, its log, its
/// baseline) is the runtime's orchestration below.
#[derive(Debug)]
pub struct Snapshots {
    pub repo: Arc<Repository>,
    pub risk: RiskPolicy,
    pub gc_grace: Duration,
}

impl Snapshots {
    pub fn new(repo: Arc<Repository>, risk: RiskPolicy, gc_grace: Duration) -> Snapshots {
        Snapshots { repo, risk, gc_grace }
    }

    /// Runs `work` with the blob store on the blocking pool.
    pub(crate) async fn run<T: Send + 'static>(&self, work: impl FnOnce(&Arc<Repository>) -> T + Send + 'static) -> Result<T, Error> {
        let repo = self.repo.clone();
        Ok(tokio::task::spawn_blocking(move || work(&repo)).await?)
    }

    pub(crate) async fn load_manifest(&self, hex: &str) -> Result<Manifest, Error> {
        let id = manifest_id(hex)?;
        self.run(move |repo| cairn_snapshot::load(repo, &id)).await?.map_err(|e| snapshot_error(&format!("cannot read manifest {hex}"), e))
    }

    /// Stores `manifest` (`what` names it in an error); returns its id and
    /// the manifest, which now knows how it was stored.
    pub(crate) async fn store_manifest(&self, mut manifest: Manifest, what: &str) -> Result<(ObjectId, Manifest), Error> {
        self.run(move |repo| cairn_snapshot::store(repo, &mut manifest).map(|id| (id, manifest)))
            .await?
            .map_err(|e| snapshot_error(&format!("cannot store the {what}"), e))
    }

    /// Checks that `chunks` (each with the manifest naming it) are indexed
    /// in packs that exist, reading every byte when `read_data`.
    pub(crate) async fn check(&self, manifests: Vec<ObjectId>, chunks: Vec<(ObjectId, ObjectId)>, read_data: bool) -> Result<cairn_blob::CheckReport, Error> {
        self.run(move |repo| repo.check(&manifests, &chunks, read_data)).await?.map_err(blob_error)
    }
}

/// How a snapshot keeps the sandbox's processes and memory (a checkpoint,
/// which stops the sandbox).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WithMemory {
    /// The sandbox is restored from the checkpoint at once (`snapshot
    /// --with-memory`).
    ThenResume,
    /// It stays stopped: the caller tears it down (a suspend).
    ThenStop,
}

/// Freezes a task's sandbox for a consistent capture (on the blocking
/// pool, inside the capture).
pub(crate) struct SandboxFreezer<'a> {
    driver: &'a dyn SandboxDriver,
    task: &'a str,
}

impl cairn_snapshot::Freezer for SandboxFreezer<'_> {
    fn freeze(&self) -> Result<(), String> {
        self.driver.freeze(self.task).map_err(|e| e.to_string())
    }
    fn thaw(&self) -> Result<(), String> {
        self.driver.thaw(self.task).map_err(|e| e.to_string())
    }
}

/// Reports progress into the task's cell until dropped.
pub(crate) struct ProgressSink {
    cell: Arc<crate::cell::TaskCell>,
    op: &'static str,
    began: Instant,
}

impl ProgressSink {
    pub(crate) fn update(&self, p: &cairn_snapshot::Progress) {
        let v = OpProgress {
            op: self.op.to_owned(),
            phase: p.phase.to_owned(),
            files_done: p.files_done,
            files_total: p.files_total,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            elapsed_ms: self.began.elapsed().as_millis() as u64,
        };
        self.cell.set_progress(Some(v));
    }
}

impl Drop for ProgressSink {
    fn drop(&mut self) {
        self.cell.set_progress(None);
    }
}

pub(crate) fn blob_error(e: cairn_blob::Error) -> Error {
    match e {
        cairn_blob::Error::NoSpace(_) => Error::NoSpace(e.to_string()),
        _ => Error::internal_from(e),
    }
}

pub(crate) fn snapshot_error(what: &str, e: cairn_snapshot::Error) -> Error {
    match e {
        cairn_snapshot::Error::Blob(cairn_blob::Error::NoSpace(_)) => Error::NoSpace(format!("{what}: {e}")),
        _ => Error::internal_from(e).context(what),
    }
}

pub(crate) fn manifest_id(hex: &str) -> Result<ObjectId, Error> {
    hex.parse().map_err(|e: String| Error::internal(format!("store holds a malformed manifest id: {e}")))
}

pub(crate) fn check_text(what: &str, s: &str, max: usize) -> Result<(), Error> {
    if s.len() > max {
        return Err(Error::invalid(format!("{what} is {} bytes; the limit is {max}", s.len())));
    }
    Ok(())
}

/// What the image (a fork's base included) has at `path` inside the
/// sandbox: `Some(true)` a directory, `Some(false)` anything else, `None`
/// nothing.
pub(crate) fn in_image(layers: &[cairn_image::Layer], path: &str) -> Option<bool> {
    let p = std::path::Path::new(path);
    let layer = layers.iter().filter(|l| p.starts_with(&l.at)).max_by_key(|l| l.at.as_os_str().len())?;
    let rel = p.strip_prefix(&layer.at).ok()?;
    // Through the image's lowers as the overlay merges them, following no
    // symlink of the image.
    let stack = cairn_image::LowerStack::open(&layer.lowers).ok()?;
    if stack.is_empty() {
        return None;
    }
    match stack.lookup(rel)? {
        cairn_image::Lookup::Dir(_) => Some(true),
        _ => Some(false),
    }
}

impl Runtime {
    pub(crate) fn layer_specs(image: &cairn_image::Image) -> Vec<LayerSpec> {
        image.layers().iter().map(|l| LayerSpec { name: l.disk_name(), at: l.at.clone() }).collect()
    }

    pub(crate) fn progress_sink(&self, task: &TaskId, op: &'static str) -> ProgressSink {
        ProgressSink { cell: self.cells.of(task), op, began: Instant::now() }
    }

    pub fn progress(&self, task: &TaskId) -> Option<OpProgress> {
        self.cells.get(task).and_then(|c| c.progress())
    }

    pub(crate) async fn load_manifest(&self, hex: &str) -> Result<Manifest, Error> {
        self.snaps.load_manifest(hex).await
    }

    /// The manifest describing the task's disk as it is now, if known.
    pub(crate) async fn baseline_manifest(&self, task: &TaskId) -> Option<Arc<Manifest>> {
        self.baseline_with_id(task).await.map(|(_, m)| m)
    }

    /// The baseline manifest and its id.
    pub(crate) async fn baseline_with_id(&self, task: &TaskId) -> Option<(String, Arc<Manifest>)> {
        let hex = self.store.baseline(task).await.ok()??;
        if let Some(m) = self.cells.get(task).and_then(|c| c.baseline(&hex)) {
            return Some((hex, m));
        }
        match self.load_manifest(&hex).await {
            Ok(m) => {
                let m = Arc::new(m);
                self.cache_baseline(task, hex.clone(), m.clone());
                Some((hex, m))
            }
            Err(e) => {
                // Only a speed-up: without it every file is read again.
                tracing::warn!(task = %task, "baseline manifest unusable, capturing in full: {e}");
                None
            }
        }
    }

    pub(crate) fn cache_baseline(&self, task: &TaskId, hex: String, m: Arc<Manifest>) {
        self.cells.of(task).set_baseline(Some((hex, m)));
    }

    pub(crate) fn forget_baseline(&self, task: &TaskId) {
        if let Some(c) = self.cells.get(task) {
            c.set_baseline(None);
        }
    }

    /// The high-risk pattern a command matches: the daemon's, then the task's.
    pub fn risky_match(&self, task: &Task, argv: &[String]) -> Result<Option<String>, Error> {
        if let Some(p) = self.snaps.risk.matches(argv) {
            return Ok(Some(p.to_owned()));
        }
        let own = RiskPolicy::new(task.config.risky.iter().map(String::as_str))?;
        Ok(own.matches(argv).map(str::to_owned))
    }

    /// Takes a snapshot of a running task.
    pub async fn snapshot(&self, id_or_name: &str, req: SnapshotRequest, actor: &str) -> Result<Snapshot, Error> {
        let kind = req.kind.as_deref().map(str::parse::<SnapshotKind>).transpose()?.unwrap_or(SnapshotKind::Manual);
        if matches!(kind, SnapshotKind::Branch | SnapshotKind::Suspend) {
            return Err(Error::invalid(format!("snapshots of kind {kind} are taken by `cairn fork` and by suspends; use milestone, pre-risk or manual")));
        }
        let note = req.note.unwrap_or_default();
        check_text("the note", &note, MAX_NOTE)?;
        if let Some(m) = &req.memory {
            check_text("the memory summary", m, MAX_MEMORY)?;
        }
        let (task, _) = self.running(id_or_name, actor).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        task.state.check_exec()?;
        let live = self.live(&task.id).ok_or_else(|| Error::conflict(format!("task {} has no running sandbox", task.id)))?;
        if req.with_memory && !task.config.isolation.keeps_memory() {
            return Err(Error::invalid(format!(
                "--with-memory needs a gvisor task; task {} runs under the {} driver, which cannot checkpoint processes",
                task.id, task.config.isolation
            )));
        }
        let with_memory = req.with_memory.then_some(WithMemory::ThenResume);
        self.snapshot_locked(&task, live, kind, note, req.healthy.unwrap_or(true), req.memory, with_memory, actor).await
    }

    /// Restarts a checkpointed sandbox from the checkpoint on its disk: the
    /// processes go on where they were.
    pub(crate) async fn resume_from_checkpoint(&self, task: &Task, actor: &str) -> Result<Live, Error> {
        self.stop_sandbox_keep_disk(task).await?;
        let image = self.image(&task.config.image).await?;
        self.start(task, &image, actor, None, None).await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn snapshot_locked(
        &self,
        task: &Task,
        live: Live,
        kind: SnapshotKind,
        note: String,
        healthy: bool,
        memory: Option<String>,
        with_memory: Option<WithMemory>,
        actor: &str,
    ) -> Result<Snapshot, Error> {
        let _no_gc = self.hold_blobs().await?;
        let image = self.image(&task.config.image).await?;
        let mut layers = Self::layer_specs(&image);
        let baseline = self.baseline_with_id(&task.id).await;
        let disk = self.driver.layers(task.id.as_str(), task.config.isolation).await?;
        // The watch that saw every change since the baseline, if the disk
        // is still the one it watches; the cached baseline is let go, so the
        // capture edits it instead of a copy.
        let cell = self.cells.of(&task.id);
        let watch = baseline.as_ref().and_then(|(hex, _)| cell.take_watch(hex)).filter(|w| w.watches(disk.root()));
        cell.set_baseline(None);
        let baseline = baseline.map(|(_, m)| Arc::try_unwrap(m).unwrap_or_else(|shared| (*shared).clone()));
        let ids = IdShift { base: live.ids.host_base, len: live.ids.count };
        let repo = self.snaps.repo.clone();
        let sink = self.progress_sink(&task.id, "snapshot");
        let begun = Instant::now();
        let mut checkpoint_ms = None;
        // The checkpoint stops the sandbox: its layers hold still without a
        // freeze, exactly as the checkpoint saw them.
        let freeze = with_memory.is_none();
        if with_memory.is_some() {
            let saved = self.driver.checkpoint(task.id.as_str()).await?;
            if let Err(e) = saved {
                let err = Error::internal_from(e).context("checkpoint failed");
                self.log(&task.id, EventKind::Snapshot, actor, json!({ "kind": kind, "error": err.to_string() }), Some(1), None).await;
                // A checkpoint that failed half-way may have stopped it.
                if self.driver.has_checkpoint(task.id.as_str()).await? || live.init.exited() {
                    self.after_checkpoint(task, with_memory, actor).await;
                }
                return Err(err);
            }
            checkpoint_ms = Some(begun.elapsed().as_secs_f64() * 1000.0);
            fail::fail_point!("checkpoint.saved");
            layers.push(LayerSpec { name: cairn_core::MEMORY_LAYER.into(), at: cairn_core::MEMORY_LAYER_AT.into() });
        }
        let tid = task.id.to_string();
        let captured = self
            .driver
            .run(move |driver| {
                let sandbox = SandboxFreezer { driver, task: &tid };
                let freezer: &dyn cairn_snapshot::Freezer = if freeze { &sandbox } else { &cairn_snapshot::NoFreeze };
                // A new watch starts before the capture that makes its baseline.
                let watch = watch.or_else(|| match ChangeWatch::start(disk.root()) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::debug!(disk = %disk.root().display(), "no change tracking: {e}");
                        None
                    }
                });
                match watch {
                    Some(mut watch) => {
                        cairn_snapshot::capture_tracked(&repo, disk.root(), &layers, baseline, &mut watch, ids, freezer, &mut |p| sink.update(p))
                            .map(|c| (c, Some(watch)))
                    }
                    None => cairn_snapshot::capture(&repo, disk.root(), &layers, baseline.as_ref(), ids, freezer, &mut |p| sink.update(p))
                        .map(|c| (c, None)),
                }
            })
            .await?;
        let duration_ms = begun.elapsed().as_secs_f64() * 1000.0;
        let ((mid, manifest, stats), watch) = match captured {
            Ok(c) => c,
            Err(e) => {
                let err = snapshot_error("snapshot failed", e);
                self.log(&task.id, EventKind::Snapshot, actor, json!({ "kind": kind, "error": err.to_string() }), Some(1), Some(duration_ms as u64))
                    .await;
                if with_memory.is_some() {
                    self.after_checkpoint(task, with_memory, actor).await;
                }
                return Err(err);
            }
        };
        fail::fail_point!("snapshot.manifest_stored");
        let parent = self.head_snapshot(task).await?.map(|s| s.id);
        let snap = Snapshot {
            id: SnapshotId::random(),
            task: task.id.clone(),
            parent,
            kind,
            note,
            healthy,
            step: task.step,
            memory: memory.clone().unwrap_or_else(|| task.memory.clone()),
            with_memory: with_memory.is_some(),
            config: task.config.clone(),
            manifest: mid.to_hex(),
            files: manifest.file_count(),
            bytes: manifest.total_bytes(),
            added_bytes: stats.stored_bytes,
            freeze_ms: stats.freeze_ms,
            duration_ms,
            created_ms: now_ms(),
        };
        let event = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Snapshot,
            actor: actor.to_owned(),
            args: json!({
                "snapshot": snap.id, "kind": kind, "note": snap.note, "healthy": healthy, "step": snap.step,
                "files_read": stats.files_read, "bytes_read": stats.bytes_read, "added_bytes": stats.stored_bytes,
                "freeze_ms": stats.freeze_ms, "tracked": stats.tracked, "with_memory": with_memory.is_some(), "checkpoint_ms": checkpoint_ms,
            }),
            exit_code: Some(0),
            duration_ms: Some(duration_ms as u64),
        };
        self.store.insert_snapshot(&snap, &snap.manifest, memory.as_deref(), &event).await?;
        fail::fail_point!("snapshot.recorded");
        self.metrics.snapshot_seconds.observe(duration_ms / 1000.0);
        self.metrics.snapshot_bytes_added.inc_by(stats.stored_bytes);
        self.cache_baseline(&task.id, snap.manifest.clone(), Arc::new(manifest));
        // A suspend's disk goes away next: its watch (a fanotify group, of
        // which the kernel allows few) is let go now, not held while the
        // task sleeps.
        if let Some(watch) = watch.filter(|_| kind != SnapshotKind::Suspend) {
            cell.set_watch(snap.manifest.clone(), watch);
        }
        tracing::debug!(task = %task.id, snapshot = %snap.id, freeze_ms = stats.freeze_ms, files_read = stats.files_read, "snapshot taken");
        if let Err(e) = self.apply_retention(&task.id, false).await {
            tracing::warn!(task = %task.id, "retention: {e}");
        }
        if with_memory == Some(WithMemory::ThenResume) {
            self.resume_from_checkpoint(task, actor).await?;
        }
        Ok(snap)
    }

    /// After a checkpoint whose snapshot failed: the sandbox goes on from
    /// the checkpoint (or boots, if there is none), unless the caller stops
    /// it anyway.
    async fn after_checkpoint(&self, task: &Task, with_memory: Option<WithMemory>, actor: &str) {
        if with_memory.is_none() {
            return;
        }
        if let Err(e) = self.resume_from_checkpoint(task, actor).await {
            tracing::error!(task = %task.id, "cannot restart the sandbox after a failed checkpoint snapshot: {e}");
        }
    }

    /// The snapshot the task's disk comes from: the latest, or the rollback
    /// target when a rollback came after it (and the target still exists).
    pub(crate) async fn head_snapshot(&self, task: &Task) -> Result<Option<Snapshot>, Error> {
        let mut snaps = self.store.snapshots(&task.id).await?;
        let latest = snaps.last().map(|l| l.created_ms);
        if let Some(n) = &task.rollback_note {
            if latest.is_none_or(|l| n.time_ms >= l) {
                if let Some(i) = snaps.iter().position(|s| s.id == n.to) {
                    return Ok(Some(snaps.swap_remove(i)));
                }
            }
        }
        Ok(snaps.pop())
    }

    /// Expires the task's snapshots its retention policy no longer keeps;
    /// returns them (without deleting anything when `dry_run`).
    pub(crate) async fn apply_retention(&self, task: &TaskId, dry_run: bool) -> Result<Vec<Snapshot>, Error> {
        let t = self.store.find_task(task.as_str()).await?;
        let snaps = self.store.snapshots(task).await?;
        let expired: Vec<Snapshot> = t.config.retention.expired(&snaps, now_ms()).into_iter().cloned().collect();
        if !dry_run && !expired.is_empty() {
            let ids: Vec<SnapshotId> = expired.iter().map(|s| s.id.clone()).collect();
            let events: Vec<NewEvent> = expired
                .iter()
                .map(|s| NewEvent {
                    task: task.clone(),
                    kind: EventKind::SnapshotExpired,
                    actor: "daemon".into(),
                    args: json!({ "snapshot": s.id, "kind": s.kind, "created_ms": s.created_ms }),
                    exit_code: None,
                    duration_ms: None,
                })
                .collect();
            self.store.expire_snapshots(&ids, &events).await?;
        }
        Ok(expired)
    }

    /// A snapshot of `task` named by the user.
    pub(crate) async fn snapshot_of(&self, task: &Task, id: &str) -> Result<Snapshot, Error> {
        let snap = self.store.find_snapshot(id).await.map_err(|e| match e {
            cairn_store::Error::UnknownSnapshot(_) => Error::not_found(e.to_string()),
            other => other.into(),
        })?;
        if snap.task != task.id {
            return Err(Error::invalid(format!("snapshot {} belongs to task {}, not to {}", snap.id, snap.task, task.id)));
        }
        Ok(snap)
    }

    pub async fn list_snapshots(&self, id_or_name: &str) -> Result<Vec<Snapshot>, Error> {
        let task = self.find(id_or_name).await?;
        Ok(self.store.snapshots(&task.id).await?)
    }

    /// One path of the diff from snapshot `a` to `b`, read from both
    /// snapshots: kinds, sizes, hashes and, when both sides are text of at
    /// most [`DIFF_READ_LIMIT`] bytes, a unified diff. A larger file is
    /// shown by its size and never read.
    pub async fn diff_file(&self, id_or_name: &str, a: &str, b: &str, path: &str) -> Result<FileChange, Error> {
        let task = self.find(id_or_name).await?;
        let (sa, sb) = (self.snapshot_of(&task, a).await?, self.snapshot_of(&task, b).await?);
        let (ma, mb) = (self.load_manifest(&sa.manifest).await?, self.load_manifest(&sb.manifest).await?);
        let (ea, eb) = (entry_at(&ma, path).cloned(), entry_at(&mb, path).cloned());
        if ea.is_none() && eb.is_none() {
            return Err(Error::not_found(format!("neither snapshot {a} nor {b} holds {path} in its writable layers")));
        }
        let (before, old) = self.side(ea).await?;
        let (after, new) = self.side(eb).await?;
        let text = |c: &Option<Vec<u8>>, side: &Option<FileSide>| match (c, side) {
            (Some(bytes), _) => std::str::from_utf8(bytes).ok().filter(|t| !t.contains('\0')).map(str::to_owned),
            (None, None) => Some(String::new()),
            (None, Some(s)) if s.kind != "file" => Some(String::new()),
            (None, Some(_)) => None,
        };
        let text_diff = match (text(&old, &before), text(&new, &after)) {
            (Some(o), Some(n)) if old.is_some() || new.is_some() => {
                Some(similar::TextDiff::from_lines(&o, &n).unified_diff().context_radius(3).header(&format!("a{path}"), &format!("b{path}")).to_string())
            }
            _ => None,
        };
        Ok(FileChange { path: path.to_owned(), before, after, text_diff })
    }

    /// What one side of a file diff shows, and the content when it is a
    /// file small enough to read.
    async fn side(&self, entry: Option<cairn_snapshot::Entry>) -> Result<(Option<FileSide>, Option<Vec<u8>>), Error> {
        use cairn_snapshot::EntryKind;
        let Some(e) = entry else { return Ok((None, None)) };
        let (kind, size, target) = match &e.kind {
            EntryKind::File { size, .. } => ("file", *size, None),
            EntryKind::Dir => ("dir", 0, None),
            EntryKind::Symlink { target } => ("symlink", 0, Some(cairn_core::name::escaped(std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str())).into_owned())),
            EntryKind::Whiteout => ("whiteout", 0, None),
            _ => ("other", 0, None),
        };
        let content = match &e.kind {
            EntryKind::File { size, extents } if *size <= DIFF_READ_LIMIT => {
                let (size, extents) = (*size, extents.clone());
                let name = e.path.to_string_lossy().into_owned();
                let bytes = self
                    .snaps
                    .run(move |repo| -> Result<Vec<u8>, cairn_blob::Error> {
                        let mut out = vec![0u8; size as usize];
                        for x in &extents {
                            let mut at = x.offset as usize;
                            for id in &x.chunks {
                                let data = repo.read_chunk(id)?;
                                let end = (at + data.len()).min(out.len());
                                out[at..end].copy_from_slice(&data[..end - at]);
                                at = end;
                            }
                        }
                        Ok(out)
                    })
                    .await?
                    .map_err(|err| Error::internal(format!("reading {name} from the blob store: {err}")))?;
                Some(bytes)
            }
            _ => None,
        };
        let blake3 = content.as_ref().map(|c| blake3::hash(c).to_hex().to_string());
        Ok((Some(FileSide { kind: kind.to_owned(), size, mode: e.mode, blake3, target }), content))
    }

    pub async fn diff(&self, id_or_name: &str, a: &str, b: &str) -> Result<cairn_snapshot::Diff, Error> {
        let task = self.find(id_or_name).await?;
        let (sa, sb) = (self.snapshot_of(&task, a).await?, self.snapshot_of(&task, b).await?);
        let (mut ma, mut mb) = (self.load_manifest(&sa.manifest).await?, self.load_manifest(&sb.manifest).await?);
        // Files only: a checkpoint of processes is no file of the sandbox.
        for m in [&mut ma, &mut mb] {
            m.layers.retain(|l| l.name != cairn_core::MEMORY_LAYER);
        }
        let mut d = cairn_snapshot::diff(&ma, &mb);
        let image = self.image(&task.config.image).await?;
        let layers = image.layers();
        // A directory of the image that appears in the writable layer was
        // copied up to hold a change below it: the sandbox saw it all
        // along. A file of the image that appears there was changed.
        let added = std::mem::take(&mut d.added);
        for p in added {
            match in_image(&layers, &p) {
                Some(true) => {}
                Some(false) => d.changed.push(p),
                None => d.added.push(p),
            }
        }
        d.changed.sort();
        Ok(d)
    }

    /// Refuses a snapshot whose chunks are not all indexed in packs that
    /// exist with the right size (reading them all would take as long as the
    /// restore itself; a damaged byte is still caught by the restore).
    pub(crate) async fn precheck(&self, snap: &Snapshot, manifest: &Manifest) -> Result<(), Error> {
        let id = manifest_id(&snap.manifest)?;
        let chunks: Vec<(ObjectId, ObjectId)> = cairn_snapshot::referenced_chunks(manifest).into_iter().map(|c| (c, id)).collect();
        let report = self.snaps.check(vec![id], chunks, false).await?;
        match report.problems.first() {
            None => Ok(()),
            Some(p) => Err(Error::internal(format!(
                "snapshot {} cannot be restored ({} problem(s), first: {p}); nothing was changed",
                snap.id,
                report.problems.len()
            ))),
        }
    }

    /// Kills the sandbox and unmounts everything of it but keeps its disk.
    pub(crate) async fn stop_sandbox_keep_disk(&self, task: &Task) -> Result<(), Error> {
        let init = self.recorded_init(&task.id).await?;
        let res = self.driver.teardown(task.id.as_str(), init, true).await?;
        if let Some(i) = init {
            reaper::reap(i.pid);
        }
        self.set_live(&task.id, None);
        self.release_slot(&task.id).await?;
        res.map_err(|e| Error::internal_from(e).context(&format!("cannot stop the sandbox of {}", task.id)))
    }

    /// Makes the task's disk hold exactly `manifest`'s writable layer, owned
    /// by `ids`.
    pub(crate) async fn restore_disk(
        &self,
        task: &Task,
        manifest: &Manifest,
        baseline: Option<Arc<Manifest>>,
        ids: cairn_sandbox::IdRange,
    ) -> Result<(Manifest, cairn_snapshot::RestoreStats), Error> {
        let repo = self.snaps.repo.clone();
        let (tid, isolation, disk_bytes) = (task.id.to_string(), task.config.isolation, task.config.limits.disk_bytes);
        let manifest = manifest.clone();
        let sink = self.progress_sink(&task.id, "restore");
        self.driver.run(move |driver| {
            let disk = driver.prepare_disk(&tid, isolation, disk_bytes).map_err(Error::from)?;
            let shift = IdShift { base: ids.host_base, len: ids.count };
            cairn_snapshot::restore(&repo, &manifest, disk.root(), baseline.as_deref(), shift, &mut |p| sink.update(p))
                .map_err(|e| snapshot_error("restore failed", e))
        })
        .await?
    }

    /// Stores a refreshed manifest as the task's baseline; returns its id.
    pub(crate) async fn store_baseline(&self, task: &TaskId, m: Manifest) -> Result<String, Error> {
        let (id, m) = self.snaps.store_manifest(m, "baseline manifest").await?;
        self.cache_baseline(task, id.to_hex(), Arc::new(m));
        Ok(id.to_hex())
    }

    /// Forgets a destroyed task's snapshots (their data goes at the next
    /// `gc`).
    pub(crate) async fn drop_snapshots(&self, task: &TaskId) -> Result<(), Error> {
        let snaps = self.store.snapshots(task).await?;
        let ids: Vec<SnapshotId> = snaps.iter().map(|s| s.id.clone()).collect();
        let events: Vec<NewEvent> = snaps
            .iter()
            .map(|s| NewEvent {
                task: task.clone(),
                kind: EventKind::SnapshotExpired,
                actor: "daemon".into(),
                args: json!({ "snapshot": s.id, "reason": "task destroyed" }),
                exit_code: None,
                duration_ms: None,
            })
            .collect();
        self.store.expire_snapshots(&ids, &events).await?;
        self.store.set_baseline(task, None).await?;
        self.forget_baseline(task);
        Ok(())
    }
}
