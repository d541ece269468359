//! Snapshots, rollback in place, forks, retention, `check` and `gc`.
//!
//! A snapshot is written in this order, so a crash at any point leaves no
//! visible half-snapshot: chunks and packs, the index, the manifest (all in
//! the blob store, each durable before the next), then the snapshot row and
//! its event in one transaction. Everything before the row is invisible
//! garbage until `gc` removes it.
//!
//! `gc` and snapshot writers are serialised by a read/write lock: a writer may
//! reuse any chunk it finds in the index, so no sweep may run while it does.
//! The grace period additionally protects objects of other daemons sharing
//! the same store.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blob::{ObjectId, Repository};
use cairn_core::{
    parse_duration, EventKind, NewEvent, RiskPolicy, RollbackNote, Snapshot, SnapshotId, SnapshotKind, Task, TaskId,
    TaskState,
};
use cairn_sandbox::native::NativeDriver;
use cairn_snapshot::{IdShift, LayerSpec, Manifest};
use cairn_store::now_ms;
use serde_json::json;

use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::tasks::{Live, Runtime};
use crate::{reaper, Error};

/// Longest note or rollback reason accepted.
const MAX_NOTE: usize = 4096;
/// Longest memory summary accepted.
const MAX_MEMORY: usize = 1 << 20;
/// Most forks made by one request.
const MAX_FORKS: u32 = 32;

pub use cairn_api::snapshots::{ForkRequest, GcRequest, OpProgress, RollbackRequest, SnapshotRequest};

/// Snapshot state the daemon keeps next to its tasks.
#[derive(Debug)]
pub struct SnapshotState {
    pub repo: Arc<Repository>,
    pub risk: RiskPolicy,
    pub gc_grace: Duration,
}

impl SnapshotState {
    pub fn new(repo: Arc<Repository>, risk: RiskPolicy, gc_grace: Duration) -> SnapshotState {
        SnapshotState { repo, risk, gc_grace }
    }
}

/// Freezes a task's cgroup for a consistent capture.
struct CgroupFreezer(cairn_sandbox::cgroup::TaskCgroup);

impl cairn_snapshot::Freezer for CgroupFreezer {
    fn freeze(&self) -> Result<(), String> {
        self.0.freeze().map_err(|e| e.to_string())
    }
    fn thaw(&self) -> Result<(), String> {
        self.0.thaw().map_err(|e| e.to_string())
    }
}

/// Reports progress into the task's cell until dropped.
struct ProgressSink {
    cell: Arc<crate::cell::TaskCell>,
    op: &'static str,
    began: Instant,
}

impl ProgressSink {
    fn update(&self, p: &cairn_snapshot::Progress) {
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

fn snapshot_error(what: &str, e: cairn_snapshot::Error) -> Error {
    match e {
        cairn_snapshot::Error::Blob(cairn_blob::Error::NoSpace(_)) => Error::NoSpace(format!("{what}: {e}")),
        _ => Error::internal_from(e).context(what),
    }
}

fn manifest_id(hex: &str) -> Result<ObjectId, Error> {
    hex.parse().map_err(|e: String| Error::internal(format!("store holds a malformed manifest id: {e}")))
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), Error> {
    if s.len() > max {
        return Err(Error::invalid(format!("{what} is {} bytes; the limit is {max}", s.len())));
    }
    Ok(())
}

impl Runtime {
    fn layer_specs(image: &cairn_sandbox::image::Image) -> Vec<LayerSpec> {
        NativeDriver::layers(image).iter().map(|l| LayerSpec { name: l.disk_name(), at: l.at.clone() }).collect()
    }

    fn progress_sink(&self, task: &TaskId, op: &'static str) -> ProgressSink {
        ProgressSink { cell: self.cells.of(task), op, began: Instant::now() }
    }

    pub fn progress(&self, task: &TaskId) -> Option<OpProgress> {
        self.cells.get(task).and_then(|c| c.progress())
    }

    pub(crate) async fn load_manifest(&self, hex: &str) -> Result<Manifest, Error> {
        let id = manifest_id(hex)?;
        let repo = self.snaps.repo.clone();
        tokio::task::spawn_blocking(move || cairn_snapshot::load(&repo, &id))
            .await?
            .map_err(|e| snapshot_error(&format!("cannot read manifest {hex}"), e))
    }

    /// The manifest describing the task's disk as it is now, if known.
    pub(crate) async fn baseline_manifest(&self, task: &TaskId) -> Option<Arc<Manifest>> {
        let hex = self.store.baseline(task).await.ok()??;
        if let Some(m) = self.cells.get(task).and_then(|c| c.baseline(&hex)) {
            return Some(m);
        }
        match self.load_manifest(&hex).await {
            Ok(m) => {
                let m = Arc::new(m);
                self.cache_baseline(task, hex, m.clone());
                Some(m)
            }
            Err(e) => {
                // Only a speed-up: without it every file is read again.
                tracing::warn!(task = %task, "baseline manifest unusable, capturing in full: {e}");
                None
            }
        }
    }

    fn cache_baseline(&self, task: &TaskId, hex: String, m: Arc<Manifest>) {
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
        self.snapshot_locked(&task, live, kind, note, req.healthy.unwrap_or(true), req.memory, actor).await
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
        actor: &str,
    ) -> Result<Snapshot, Error> {
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        let image = self.image(&task.config.image).await?;
        let layers = Self::layer_specs(&image);
        let baseline = self.baseline_manifest(&task.id).await;
        let disk = self.driver.paths(task.id.as_str()).disk_mount;
        let cgroup = self.driver.cgroup(task.id.as_str())?;
        let ids = IdShift { base: live.ids.host_base, len: live.ids.count };
        let repo = self.snaps.repo.clone();
        let sink = self.progress_sink(&task.id, "snapshot");
        let begun = Instant::now();
        let captured = tokio::task::spawn_blocking(move || {
            let freezer = CgroupFreezer(cgroup);
            cairn_snapshot::capture(&repo, &disk, &layers, baseline.as_deref(), ids, &freezer, &mut |p| sink.update(p))
        })
        .await?;
        let duration_ms = begun.elapsed().as_secs_f64() * 1000.0;
        let (mid, manifest, stats) = match captured {
            Ok(c) => c,
            Err(e) => {
                let err = snapshot_error("snapshot failed", e);
                self.log(&task.id, EventKind::Snapshot, actor, json!({ "kind": kind, "error": err.to_string() }), Some(1), Some(duration_ms as u64))
                    .await;
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
                "freeze_ms": stats.freeze_ms,
            }),
            exit_code: Some(0),
            duration_ms: Some(duration_ms as u64),
        };
        self.store.insert_snapshot(&snap, &snap.manifest, memory.as_deref(), &event).await?;
        fail::fail_point!("snapshot.recorded");
        self.cache_baseline(&task.id, snap.manifest.clone(), Arc::new(manifest));
        tracing::debug!(task = %task.id, snapshot = %snap.id, freeze_ms = stats.freeze_ms, files_read = stats.files_read, "snapshot taken");
        if let Err(e) = self.apply_retention(&task.id, false).await {
            tracing::warn!(task = %task.id, "retention: {e}");
        }
        Ok(snap)
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
    async fn snapshot_of(&self, task: &Task, id: &str) -> Result<Snapshot, Error> {
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

    pub async fn diff(&self, id_or_name: &str, a: &str, b: &str) -> Result<cairn_snapshot::Diff, Error> {
        let task = self.find(id_or_name).await?;
        let (sa, sb) = (self.snapshot_of(&task, a).await?, self.snapshot_of(&task, b).await?);
        let (ma, mb) = (self.load_manifest(&sa.manifest).await?, self.load_manifest(&sb.manifest).await?);
        let mut d = cairn_snapshot::diff(&ma, &mb);
        // A directory of the image that appears in the writable layer was
        // copied up to hold a change below it: the sandbox saw it all along.
        let image = self.image(&task.config.image).await?;
        let layers = NativeDriver::layers(&image);
        d.added.retain(|p| !in_image_as_dir(&layers, p));
        Ok(d)
    }

    /// Rolls a running task back to one of its snapshots, in place: same
    /// task id, a fresh sandbox on the restored writable layer.
    pub async fn rollback(&self, id_or_name: &str, req: RollbackRequest, actor: &str) -> Result<cairn_api::snapshots::RollbackAnswer, Error> {
        let reason = req.reason.trim().to_owned();
        if reason.is_empty() {
            return Err(Error::invalid("a rollback needs --reason: the agent is told why its last attempt failed"));
        }
        check_text("the reason", &reason, MAX_NOTE)?;
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        if task.state != TaskState::Running {
            return Err(Error::conflict(format!("task {} is {}; only a running task can roll back", task.id, task.state)));
        }
        let snaps = self.store.snapshots(&task.id).await?;
        let target = match (req.to.as_deref(), req.last_healthy) {
            (Some(to), false) => self.snapshot_of(&task, to).await?,
            (None, true) => snaps
                .iter()
                .rev()
                .find(|s| s.healthy)
                .cloned()
                .ok_or_else(|| Error::conflict(format!("task {} has no healthy snapshot to roll back to", task.id)))?,
            _ => return Err(Error::invalid("give exactly one of --to SNAPSHOT and --last-healthy")),
        };
        // No gc may sweep the target's data or the new baseline meanwhile.
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        // Read the target and check that all its data is there before
        // touching anything: a damaged snapshot is refused while the sandbox
        // still runs.
        let manifest = self.load_manifest(&target.manifest).await?;
        self.precheck(&target, &manifest).await?;
        let from = snaps.last().map(|s| s.id.clone());
        let begun = Instant::now();
        self.log(&task.id, EventKind::Rollback, actor, json!({ "phase": "begin", "to": target.id, "reason": reason }), Some(0), None)
            .await;

        let image = self.image(&task.config.image).await?;
        let baseline = self.baseline_manifest(&task.id).await;
        self.stop_sandbox_keep_disk(&task).await?;
        fail::fail_point!("rollback.sandbox_stopped");
        let slot = self.claim_slot(&task.id).await?;
        let why = format!("rollback to {} failed", target.id);
        let source = DiskSource::Snapshot { manifest: &manifest, base: baseline };
        let mut recorded = None;
        // The disk is the target's once restored: that is recorded first,
        // then the sandbox starts on it.
        let made = self
            .materialise(&task, &image, slot, source, OnRestoreFailure::MarkLost { why: why.clone() }, None, actor, async |restored| {
                let restored = restored.ok_or_else(|| Error::internal("rollback restored nothing"))?;
                let stats = &restored.stats;
                fail::fail_point!("rollback.disk_restored");
                let note = RollbackNote { from: from.clone(), to: target.id.clone(), from_step: task.step, reason: reason.clone(), time_ms: now_ms() };
                recorded = Some((note.clone(), begun.elapsed().as_secs_f64() * 1000.0));
                let event = NewEvent {
                    task: task.id.clone(),
                    kind: EventKind::Rollback,
                    actor: actor.to_owned(),
                    args: json!({
                        "phase": "end", "from": from, "to": target.id, "reason": reason, "from_step": task.step, "step": target.step,
                        "files_written": stats.files_written, "files_kept": stats.files_kept, "bytes_written": stats.bytes_written,
                    }),
                    exit_code: Some(0),
                    duration_ms: Some(begun.elapsed().as_millis() as u64),
                };
                self.store.record_rollback(&task.id, &target, &note, &restored.baseline, &event).await?;
                fail::fail_point!("rollback.recorded");
                Ok(())
            })
            .await;
        let made = match made {
            Ok(m) => m,
            Err(e) if recorded.is_none() => {
                let why = format!("{why}: {e}");
                self.log(&task.id, EventKind::Rollback, actor, json!({ "phase": "end", "to": target.id, "error": why }), Some(1), None)
                    .await;
                return Err(Error::internal(why));
            }
            Err(e) => return Err(e),
        };
        let (note, duration_ms) = recorded.ok_or_else(|| Error::internal("rollback recorded nothing"))?;
        let stats = made.restore.map(|r| r.stats);
        // Services run from the restored layer, as they did at the snapshot.
        let task = Task { config: target.config.clone(), ..task };
        self.start_services(&task, actor).await?;
        Ok(cairn_api::snapshots::RollbackAnswer {
            task: task.id,
            rollback_note: note,
            step: target.step,
            duration_ms,
            restore: stats.map(|s| cairn_api::snapshots::RestoreStats {
                files_written: s.files_written,
                bytes_written: s.bytes_written,
                files_kept: s.files_kept,
                entries_removed: s.entries_removed,
                duration_ms: s.duration_ms,
            }),
        })
    }

    /// Refuses a snapshot whose chunks are not all indexed in packs that
    /// exist with the right size (reading them all would take as long as the
    /// restore itself; a damaged byte is still caught by the restore).
    async fn precheck(&self, snap: &Snapshot, manifest: &Manifest) -> Result<(), Error> {
        let id = manifest_id(&snap.manifest)?;
        let chunks: Vec<(ObjectId, ObjectId)> = cairn_snapshot::referenced_chunks(manifest).into_iter().map(|c| (c, id)).collect();
        let repo = self.snaps.repo.clone();
        let report = tokio::task::spawn_blocking(move || repo.check(&[id], &chunks, false)).await?.map_err(blob_error)?;
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
        let driver = self.driver.clone();
        let id = task.id.to_string();
        let res = tokio::task::spawn_blocking(move || driver.teardown(&id, init, true)).await?;
        if let Some(i) = init {
            reaper::reap(i.pid);
        }
        self.set_live(&task.id, None);
        self.release_slot(&task.id).await?;
        res.map_err(|e| Error::internal(format!("cannot stop the sandbox of {}: {e}", task.id)))
    }

    /// Makes the task's disk hold exactly `manifest`'s writable layer, owned
    /// by `ids`.
    pub(crate) async fn restore_disk(
        &self,
        task: &Task,
        manifest: &Manifest,
        baseline: Option<Arc<Manifest>>,
        ids: cairn_sandbox::uidmap::IdRange,
    ) -> Result<(Manifest, cairn_snapshot::RestoreStats), Error> {
        let driver = self.driver.clone();
        let repo = self.snaps.repo.clone();
        let (tid, disk_bytes) = (task.id.to_string(), task.config.limits.disk_bytes);
        let manifest = manifest.clone();
        let sink = self.progress_sink(&task.id, "restore");
        tokio::task::spawn_blocking(move || {
            let disk = driver.prepare_disk(&tid, disk_bytes).map_err(Error::from)?;
            let shift = IdShift { base: ids.host_base, len: ids.count };
            cairn_snapshot::restore(&repo, &manifest, &disk, baseline.as_deref(), shift, &mut |p| sink.update(p))
                .map_err(|e| snapshot_error("restore failed", e))
        })
        .await?
    }

    /// Stores a refreshed manifest as the task's baseline; returns its id.
    pub(crate) async fn store_baseline(&self, task: &TaskId, m: Manifest) -> Result<String, Error> {
        let repo = self.snaps.repo.clone();
        let m = Arc::new(m);
        let m2 = m.clone();
        let id = tokio::task::spawn_blocking(move || cairn_snapshot::store(&repo, &m2))
            .await?
            .map_err(|e| snapshot_error("cannot store the baseline manifest", e))?;
        self.cache_baseline(task, id.to_hex(), m);
        Ok(id.to_hex())
    }

    /// Creates `count` tasks starting from a snapshot of another, sharing its
    /// stored data; each gets a `branch` snapshot as its first.
    pub async fn fork(&self, id_or_name: &str, req: ForkRequest, actor: &str) -> Result<Vec<crate::tasks::TaskView>, Error> {
        let count = req.count.unwrap_or(1);
        if count == 0 || count > MAX_FORKS {
            return Err(Error::invalid(format!("--count must be 1 to {MAX_FORKS}, not {count}")));
        }
        let src = self.find(id_or_name).await?;
        if src.state == TaskState::Destroyed {
            return Err(Error::conflict(format!("task {} is destroyed; its snapshots are gone", src.id)));
        }
        let snap = match req.from.as_deref() {
            Some(from) => self.snapshot_of(&src, from).await?,
            None => self.store.snapshots(&src.id).await?.pop().ok_or_else(|| {
                Error::conflict(format!("task {} has no snapshot to fork from; take one with `cairn snapshot {}`", src.id, src.id))
            })?,
        };
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        let manifest = self.load_manifest(&snap.manifest).await?;
        self.precheck(&snap, &manifest).await?;
        let image = self.image(&snap.config.image).await?;
        let mut children = Vec::new();
        for _ in 0..count {
            let child = self.fork_one(&src, &snap, &manifest, &image, actor).await?;
            children.push(child);
        }
        self.log(
            &src.id,
            EventKind::Fork,
            actor,
            json!({ "snapshot": snap.id, "children": children.iter().map(|c| c.task.id.clone()).collect::<Vec<_>>() }),
            Some(0),
            None,
        )
        .await;
        Ok(children)
    }

    async fn fork_one(
        &self,
        src: &Task,
        snap: &Snapshot,
        manifest: &Manifest,
        image: &cairn_sandbox::image::Image,
        actor: &str,
    ) -> Result<crate::tasks::TaskView, Error> {
        let begun = Instant::now();
        let ahead = self.driver.take_prestarted();
        let id = ahead.as_ref().and_then(|p| p.task.parse().ok()).unwrap_or_else(TaskId::random);
        let mut task = Task::new(id, None, snap.config.clone(), now_ms());
        task.step = snap.step;
        task.memory = snap.memory.clone();
        task.webhook_secret = Some(crate::gateway::webhook::new_secret());
        // Running without a sandbox until its disk is restored: nothing starts
        // it on an empty disk, and a daemon that dies meanwhile recovers it
        // from its branch snapshot.
        task.state = TaskState::Running;
        task.sandbox = cairn_core::SandboxState::Lost;
        task.sandbox_note = Some(format!("being restored from snapshot {} (fork)", snap.id));
        let created = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Create,
            actor: actor.to_owned(),
            args: json!({ "fork_of": src.id, "snapshot": snap.id }),
            exit_code: Some(0),
            duration_ms: None,
        };
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let branch = Snapshot {
            id: SnapshotId::random(),
            task: task.id.clone(),
            parent: Some(snap.id.clone()),
            kind: SnapshotKind::Branch,
            note: format!("fork of {} at {}", src.id, snap.id),
            healthy: true,
            step: snap.step,
            memory: snap.memory.clone(),
            config: snap.config.clone(),
            manifest: snap.manifest.clone(),
            files: snap.files,
            bytes: snap.bytes,
            added_bytes: 0,
            freeze_ms: 0.0,
            duration_ms: begun.elapsed().as_secs_f64() * 1000.0,
            created_ms: now_ms(),
        };
        let snapshotted = NewEvent {
            task: task.id.clone(),
            kind: EventKind::Snapshot,
            actor: actor.to_owned(),
            args: json!({ "snapshot": branch.id, "kind": "branch", "parent": snap.id }),
            exit_code: Some(0),
            duration_ms: None,
        };
        // The task with its branch snapshot, in one step; the disk is made
        // from the branch next.
        self.store.insert_fork(&task, &created, &branch, &snapshotted).await?;
        fail::fail_point!("fork.recorded");
        let slot = self.claim_slot(&task.id).await?;
        let source = DiskSource::Snapshot { manifest, base: None };
        self.materialise(&task, image, slot, source, OnRestoreFailure::FailNewTask, ahead, actor, async |_| {
            fail::fail_point!("fork.disk_restored");
            Ok(())
        })
        .await?;
        self.start_services(&task, actor).await?;
        Ok(self.view(self.find(task.id.as_str()).await?))
    }

    /// Distinct manifests that snapshots and baselines reference, each with
    /// who references it.
    async fn live_manifests(&self, skip: &HashSet<SnapshotId>) -> Result<HashMap<String, String>, Error> {
        let mut live = HashMap::new();
        for s in self.store.all_snapshots().await? {
            if !skip.contains(&s.id) {
                live.entry(s.manifest.clone()).or_insert_with(|| format!("snapshot {} of task {}", s.id, s.task));
            }
        }
        for b in self.store.baselines().await? {
            live.entry(b).or_insert_with(|| "a task's baseline".to_owned());
        }
        Ok(live)
    }

    /// Applies every task's retention policy, then removes objects no
    /// snapshot or baseline references.
    pub async fn gc(&self, req: GcRequest, actor: &str) -> Result<cairn_api::snapshots::GcAnswer, Error> {
        let grace = match req.grace.as_deref() {
            Some(g) => parse_duration(g)?,
            None => self.snaps.gc_grace,
        };
        let _exclusive = self.snaps.repo.gc_lock().write().await;
        let mut expired = Vec::new();
        for t in self.store.list_tasks().await? {
            expired.extend(self.apply_retention(&t.id, req.dry_run).await?);
        }
        let skip: HashSet<SnapshotId> = expired.iter().map(|s| s.id.clone()).collect();
        let live = self.live_manifests(&skip).await?;
        let mut live_manifests = HashSet::new();
        let mut live_chunks = HashSet::new();
        for (hex, who) in &live {
            let m = self.load_manifest(hex).await.map_err(|e| {
                Error::internal(format!("gc stopped, nothing deleted: manifest of {who} is unreadable ({e}); run `cairn check`"))
            })?;
            live_manifests.insert(manifest_id(hex)?);
            live_chunks.extend(cairn_snapshot::referenced_chunks(&m));
        }
        let repo = self.snaps.repo.clone();
        let dry = req.dry_run;
        let report = tokio::task::spawn_blocking(move || repo.gc(&live_manifests, &live_chunks, grace, dry)).await?.map_err(blob_error)?;
        let orphans = self.gc_deliverables(grace, dry).await?;
        tracing::info!(actor, dry_run = dry, freed = report.bytes_freed, orphan_deliverables = orphans.len(), "gc");
        Ok(cairn_api::snapshots::GcAnswer {
            dry_run: dry,
            grace_ms: grace.as_millis() as u64,
            expired_snapshots: expired
                .iter()
                .map(|s| cairn_api::snapshots::ExpiredSnapshot { id: s.id.clone(), task: s.task.clone(), kind: s.kind })
                .collect(),
            report: cairn_api::snapshots::GcReport {
                packs_deleted: report.packs_deleted,
                manifests_deleted: report.manifests_deleted,
                index_files_rewritten: report.index_files_rewritten,
                bytes_freed: report.bytes_freed,
                kept_young: report.kept_young,
                packs_partly_live: report.packs_partly_live,
                dry_run: report.dry_run,
            },
            orphan_deliverables: orphans,
        })
    }

    /// Verifies that everything the snapshots reference is stored, and with
    /// `read_data` that every byte hashes to its id.
    pub async fn check(&self, read_data: bool) -> Result<cairn_blob::CheckReport, Error> {
        let _no_gc = self.snaps.repo.gc_lock().read().await;
        let live = self.live_manifests(&HashSet::new()).await?;
        let mut problems = Vec::new();
        let mut manifests = Vec::new();
        let mut chunks = Vec::new();
        for (hex, who) in &live {
            let id = manifest_id(hex)?;
            // A manifest that cannot be read is reported here, once; the
            // store checks the ones that load, and every chunk they name.
            match self.load_manifest(hex).await {
                Ok(m) => {
                    manifests.push(id);
                    chunks.extend(cairn_snapshot::referenced_chunks(&m).into_iter().map(|c| (c, id)));
                }
                Err(e) => problems.push(format!("manifest {hex} ({who}): {}", e)),
            }
        }
        let repo = self.snaps.repo.clone();
        let mut report = tokio::task::spawn_blocking(move || repo.check(&manifests, &chunks, read_data)).await?.map_err(blob_error)?;
        problems.append(&mut report.problems);
        report.problems = problems;
        Ok(report)
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

/// True when `path` (inside the sandbox) is a directory of the image.
fn in_image_as_dir(layers: &[cairn_sandbox::rootfs::Layer], path: &str) -> bool {
    let p = std::path::Path::new(path);
    let Some(layer) = layers.iter().filter(|l| p.starts_with(&l.at)).max_by_key(|l| l.at.as_os_str().len()) else {
        return false;
    };
    let Ok(rel) = p.strip_prefix(&layer.at) else { return false };
    // Beneath the image directory, following no symlink of the image.
    let Ok(root) = cairn_fsat::open_dir(&layer.lower) else { return false };
    rel.as_os_str().is_empty() || cairn_fsat::open_beneath(&root, rel, cairn_fsat::OFlags::PATH | cairn_fsat::OFlags::DIRECTORY, 0).is_ok()
}
