//! Rollback in place: the same task id, a fresh sandbox on its writable
//! layer as a snapshot had it, and a rollback note (from where, to where,
//! why) that the agent reads back.

use std::time::Instant;

use cairn_core::{EventKind, NewEvent, RollbackNote, Task, TaskState};
use cairn_store::now_ms;
use serde_json::json;

use crate::Error;
use crate::materialise::{DiskSource, OnRestoreFailure};
use crate::runtime::Runtime;
use crate::snapshot::{MAX_NOTE, RollbackRequest, check_text};

impl Runtime {
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
        let (target, chosen) = match (req.to.as_deref(), req.last_healthy) {
            (Some(to), false) => (self.snapshot_of(&task, to).await?, "--to: named by the caller".to_owned()),
            (None, true) => {
                let s = snaps
                    .iter()
                    .rev()
                    .find(|s| s.healthy)
                    .cloned()
                    .ok_or_else(|| Error::conflict(format!("task {} has no healthy snapshot to roll back to", task.id)))?;
                let note = if s.note.is_empty() { String::new() } else { format!(", {}", s.note) };
                let why = format!("--last-healthy: the newest healthy snapshot, {} at step {}{note}", s.kind, s.step);
                (s, why)
            }
            _ => return Err(Error::invalid("give exactly one of --to SNAPSHOT and --last-healthy")),
        };
        // No gc may sweep the target's data or the new baseline meanwhile.
        let _no_gc = self.hold_blobs().await?;
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
        let baseline = self.baseline_with_id(&task.id).await;
        // The change watch stays on the disk through the restore (which it
        // sees too), so the next snapshot looks only where things changed.
        let watch = baseline.as_ref().and_then(|(hex, _)| self.cells.of(&task.id).take_watch(hex));
        let baseline = baseline.map(|(_, m)| m);
        let mut new_baseline = None;
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
                let note = RollbackNote { from: from.clone(), to: target.id.clone(), from_step: task.step, reason: reason.clone(), time_ms: now_ms(), chosen: Some(chosen.clone()) };
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
                new_baseline = Some(restored.baseline.clone());
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
        if let (Some(hex), Some(watch)) = (new_baseline, watch) {
            self.cells.of(&task.id).set_watch(hex, watch);
        }
        let stats = made.restore.map(|r| r.stats);
        // Services run from the restored layer, as they did at the snapshot
        // (or go on from its checkpoint, which holds them running).
        let task = Task { config: target.config.clone(), ..task };
        if !made.resumed {
            self.start_services(&task, actor).await?;
        }
        Ok(cairn_api::snapshots::RollbackAnswer {
            task: task.id,
            rollback_note: note,
            step: target.step,
            duration_ms,
            restore: stats,
        })
    }
}
