//! Task lifecycle: create, start the sandbox, destroy, and reconcile the
//! store with what exists on the host after a restart.
//!
//! Each step is written to the store before the work it names and again
//! when it ends. Blocking sandbox work runs on the blocking pool, and
//! lifecycle changes of one task are serialised by its cell's lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_api::tasks::CreateRequest;
use cairn_core::{EventKind, ImageDefaults, NewEvent, SandboxState, Task, TaskConfig, TaskId, TaskState, Transition};
use cairn_sandbox::{InitProcess, InitState};
use cairn_image::Image;
use cairn_store::now_ms;
use serde_json::json;

use crate::{Error, reaper};
use crate::runtime::{Live, Runtime, TaskView};

/// Copies an image's run configuration (an OCI image config's `Env`,
/// `WorkingDir`, `User`, `Entrypoint` and `Cmd`) into a new task's config,
/// under what the task asked for itself. It is then part of the task's
/// config: kept in the store, in snapshots and in forks, whatever becomes
/// of the image.
pub(crate) fn apply_image_config(config: &mut TaskConfig, image: &Image, workdir_given: bool) -> Result<(), Error> {
    let Some(run) = &image.config else { return Ok(()) };
    let defaults = ImageDefaults {
        env: &run.env,
        working_dir: run.working_dir.as_deref(),
        user: run.user.as_deref(),
        entrypoint: &run.entrypoint,
        cmd: &run.cmd,
    };
    config.apply_image(&defaults, workdir_given).map_err(|e| Error::invalid(format!("image {}: its config has an {e}", image.name)))
}

/// Metadata is for finding tasks by: a few short labels.
pub(crate) fn check_metadata(metadata: &std::collections::BTreeMap<String, String>) -> Result<(), Error> {
    if metadata.len() > 64 {
        return Err(Error::invalid(format!("{} metadata entries; at most 64", metadata.len())));
    }
    for (k, v) in metadata {
        if k.is_empty() || k.len() > 256 || v.len() > 4096 || k.contains('\0') || v.contains('\0') {
            let key: String = k.chars().take(64).collect();
            return Err(Error::invalid(format!("metadata {key:?}: a key is 1 to 256 bytes and a value at most 4096, without NUL")));
        }
    }
    Ok(())
}

impl Runtime {
    /// Validates the request completely before anything is written: the
    /// defaults' answer, and the driver's say on the isolation.
    pub(crate) fn config_from(&self, req: &CreateRequest) -> Result<TaskConfig, Error> {
        let config = self.task_defaults.config_from(req)?;
        self.driver.check_isolation(config.isolation).map_err(|e| Error::invalid(e.to_string()))?;
        Ok(config)
    }

    /// Creates a task and starts its sandbox (with its image's run
    /// configuration, see [`apply_image_config`]) (Cairn starts sandboxes on
    /// create, so the first exec is as fast as any other).
    pub async fn create(&self, req: CreateRequest, actor: &str) -> Result<TaskView, Error> {
        let mut config = self.config_from(&req)?;
        self.check_rule_secrets(&config.egress).await?;
        let image = self.image(&config.image).await?;
        apply_image_config(&mut config, &image, req.workdir.is_some())?;
        self.admit_disks(config.limits.disk_bytes).await?;
        let now = now_ms();
        // A helper started ahead brings its task id (and its cgroups).
        let ahead = self.driver.take_prestarted();
        let id = ahead.as_ref().and_then(|p| p.task.parse().ok()).unwrap_or_else(TaskId::random);
        let mut task = Task::new(id, req.name.clone(), config, now);
        task.webhook_secret = Some(crate::gateway::webhook::new_secret());
        self.store.insert_task(&task).await?;
        // New: nobody else can hold it.
        self.take_lease(&task.id).await?;
        self.store
            .append_event(&NewEvent {
                task: task.id.clone(),
                kind: EventKind::Create,
                actor: actor.to_owned(),
                args: serde_json::to_value(&req).unwrap_or_default(),
                exit_code: None,
                duration_ms: None,
            })
            .await?;
        fail::fail_point!("create.recorded");
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        self.start(&task, &image, actor, ahead, None).await?;
        self.start_services(&task, actor).await?;
        Ok(self.view(self.store.find_task(task.id.as_str()).await?))
    }

    /// Starts the sandbox of a task that has none, on `slot` when the caller
    /// claimed one already. Holds the task's lock.
    pub(crate) async fn start(
        &self,
        task: &Task,
        image: &Image,
        actor: &str,
        ahead: Option<cairn_sandbox::Prestarted>,
        slot: Option<u32>,
    ) -> Result<Live, Error> {
        let begun = Instant::now();
        let slot = match slot {
            Some(s) => s,
            None => self.claim_slot(&task.id).await?,
        };
        let ids = self.driver.uid_range(slot, task.config.isolation)?;
        // A task with request rules trusts its CA through a layer over the image.
        // (A fork, a rollback to a config with rules, or a wake of a task
        // given rules while it slept get theirs here.)
        let mut image2 = image.clone();
        if let Some(pem) = self.ensure_task_ca(&task.id, &task.config.egress).await? {
            image2.trust = Some(self.trust_layer(&task.id, image, pem).await?);
        }
        let started = self.driver.start(task.id.as_str(), task.config.clone(), image2, slot, ahead).await?;
        let duration_ms = Some(begun.elapsed().as_millis() as u64);
        let mut event = NewEvent {
            task: task.id.clone(),
            kind: EventKind::SandboxStart,
            actor: actor.to_owned(),
            args: json!({ "image": image.name, "uid_base": ids.host_base }),
            exit_code: Some(0),
            duration_ms,
        };
        match started {
            Ok(init) => {
                if task.state == TaskState::Created {
                    task.state.start()?;
                }
                self.store.record_sandbox_ready(&task.id, &self.cluster.name, init.pid, init.start_time, &event).await?;
                let live = Live { init, ids };
                self.set_live(&task.id, Some(live));
                self.serve_egress(task, live).await;
                self.wake_pool_refill();
                Ok(live)
            }
            Err(failed) => {
                let msg = format!("sandbox failed to start: {failed}");
                self.driver.release_slot(slot, task.id.as_str()).await;
                self.store.release_sandbox(&task.id).await?;
                if let Err(e) = self.store.transition(&task.id, task.state, Transition::Fail).await {
                    tracing::error!(task = %task.id, "marking the task failed after its sandbox failed to start: {e}");
                }
                self.store.set_sandbox_state(&task.id, SandboxState::None, Some(&msg)).await?;
                event.exit_code = Some(1);
                event.args["error"] = json!(msg);
                self.store.append_event(&event).await?;
                Err(Error::internal_with(msg, failed))
            }
        }
    }

    /// The live sandbox of a task that can run commands, starting it if the
    /// task was created but never started (e.g. the daemon stopped midway).
    pub async fn running(&self, id_or_name: &str, actor: &str) -> Result<(Task, Live), Error> {
        let mut task = self.find(id_or_name).await?;
        match self.live(&task.id) {
            Some(live) if task.state == TaskState::Running => match live.init.state() {
                InitState::Running => return Ok((task, live)),
                // A failed look (the daemon short of descriptors) says
                // nothing of the sandbox: this request fails, the sandbox
                // stays.
                InitState::Unknown(e) => {
                    return Err(Error::Unavailable(format!("cannot tell whether the sandbox of task {} runs ({e}); try again", task.id)));
                }
                // Died just now (a gvisor sandbox ends whole on an OOM):
                // lost, and recovered below, without waiting for the
                // background to notice.
                InitState::Exited => {
                    self.lost_if_dead(&task.id, live).await;
                    task = self.find(task.id.as_str()).await?;
                }
            },
            None if task.state == TaskState::Running && task.sandbox == SandboxState::Ready => {
                // The background is marking it lost right now: its lock.
                let lock = self.lock_of(&task.id);
                let _guard = lock.lock().await;
                task = self.find(task.id.as_str()).await?;
                if let Some(live) = self.live(&task.id) {
                    return Ok((task, live));
                }
            }
            _ => {}
        }
        match (task.state, task.sandbox) {
            // Suspended: wake it first, transparently.
            (TaskState::Suspended | TaskState::Waking | TaskState::Suspending, _) => {
                self.resume(task.id.as_str(), actor).await?;
                let task = self.find(task.id.as_str()).await?;
                let live = self.live(&task.id).ok_or_else(|| Error::conflict(format!("task {} did not wake", task.id)))?;
                Ok((task, live))
            }
            // Lost (its init died): rebuild it from the latest snapshot.
            (TaskState::Running, SandboxState::Lost) => {
                self.recover(&task.id).await.map_err(|e| {
                    Error::conflict(format!("task {} has no sandbox ({}) and recovery failed: {}", task.id, task.sandbox_note.as_deref().unwrap_or("it was lost"), e))
                })?;
                let task = self.find(task.id.as_str()).await?;
                let live = self.live(&task.id).ok_or_else(|| Error::conflict(format!("task {} has no running sandbox", task.id)))?;
                Ok((task, live))
            }
            (TaskState::Created, SandboxState::None) => {
                let lock = self.lock_of(&task.id);
                let _guard = lock.lock().await;
                let task = self.find(task.id.as_str()).await?;
                if let Some(live) = self.live(&task.id) {
                    return Ok((task, live));
                }
                let image = self.image(&task.config.image).await?;
                let live = self.start(&task, &image, actor, None, None).await?;
                Ok((self.find(task.id.as_str()).await?, live))
            }
            (state, _) => {
                state.check_exec()?;
                Err(Error::conflict(format!("task {} has no running sandbox", task.id)))
            }
        }
    }

    /// Kills the sandbox and removes everything of it from the host; the
    /// task's records stay, in state `destroyed`.
    pub async fn destroy(&self, id_or_name: &str, actor: &str) -> Result<TaskView, Error> {
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        task.state.destroy()?;
        let begun = Instant::now();
        let result = self.end_sandbox(&task, Transition::Destroy).await?;
        let exit_code = if result.is_ok() { 0 } else { 1 };
        let mut args = json!({});
        if let Err(e) = &result {
            args["error"] = json!(e.to_string());
        } else {
            self.drop_snapshots(&task.id).await?;
        }
        self.store
            .append_event(&NewEvent {
                task: task.id.clone(),
                kind: EventKind::Destroy,
                actor: actor.to_owned(),
                args,
                exit_code: Some(exit_code),
                duration_ms: Some(begun.elapsed().as_millis() as u64),
            })
            .await?;
        result.map_err(|e| Error::internal_from(e).context(&format!("teardown of {} failed", task.id)))?;
        // A destroyed task takes no more lifecycle steps: its cell can go
        // (the guard held here keeps it alive until this returns).
        self.cells.remove(&task.id);
        if cairn_image::is_fork_base(&task.config.image) {
            if let Err(e) = self.remove_unused_fork_bases().await {
                tracing::warn!(task = %task.id, "cannot remove the fork bases no task uses: {e}");
            }
        }
        Ok(self.view(self.find(task.id.as_str()).await?))
    }

    /// Moves a task to a final state `next` and removes its sandbox and
    /// everything of it from the host (the state is written first, so a
    /// daemon killed midway finishes the teardown at its next start). The
    /// teardown's own failure is returned for the caller to log.
    pub(crate) async fn end_sandbox(&self, task: &Task, end: Transition) -> Result<Result<(), cairn_sandbox::Error>, Error> {
        self.store.transition(&task.id, task.state, end).await?;
        match end {
            Transition::Complete => fail::fail_point!("complete.state_recorded"),
            _ => fail::fail_point!("destroy.state_recorded"),
        }
        let init = self.recorded_init(&task.id).await?;
        let result = self.driver.destroy(task.id.as_str(), init).await?;
        if let Some(i) = init {
            reaper::reap(i.pid);
        }
        self.set_live(&task.id, None);
        if result.is_ok() {
            self.release_slot(&task.id).await?;
            self.store.set_sandbox_state(&task.id, SandboxState::None, None).await?;
            // Final: no sandbox of this task will trust its CA again.
            self.remove_trust_layer(&task.id);
            self.remove_task_ca(&task.id).await;
        }
        Ok(result)
    }

    pub(crate) async fn recorded_init(&self, id: &TaskId) -> Result<Option<InitProcess>, Error> {
        if let Some(l) = self.live(id) {
            return Ok(Some(l.init));
        }
        let row = self.store.sandbox(id).await?;
        Ok(row.and_then(|r| Some(InitProcess { pid: r.init_pid?, start_time: r.init_start_time? })))
    }

    /// At start-up: keeps sandboxes that survived, marks the others lost
    /// (their disk stays for recovery), and removes host leftovers of tasks
    /// that no longer need them.
    pub async fn reconcile(&self) {
        if let Err(e) = self.reconcile_inner().await {
            tracing::error!("reconcile: {e}");
        }
    }

    pub(crate) async fn reconcile_inner(&self) -> Result<(), Error> {
        let tasks = self.store.list_tasks().await?;
        // Leases this node held before it stopped are its own again: the
        // new process has no token of them in memory, and would otherwise
        // refuse its own tasks until they ran out (a create cut short
        // before its sandbox started has no sandbox row to bring it back).
        // Not a lease taken to recover a task another node ran, cut short
        // before the loss was recorded: held again, it would be renewed
        // with nothing run under it; left to run out, the task is unheld
        // and the heartbeat of a node with room recovers it.
        for t in tasks.iter().filter(|t| !t.state.is_terminal()) {
            if self.store.lease(&t.id).await?.live_holder(now_ms()) == Some(self.cluster.name.as_str()) && self.ran_here(t).await? {
                self.take_lease(&t.id).await?;
            }
        }
        let mut keep = std::collections::HashSet::new();
        let mut lost = std::collections::HashSet::new();
        for row in self.store.sandboxes().await? {
            let Some(task) = tasks.iter().find(|t| t.id == row.task) else { continue };
            // Another node's sandbox (several daemons share the store).
            if !self.ran_here(task).await? {
                continue;
            }
            if !task.state.is_terminal() && !self.take_lease(&task.id).await? {
                continue;
            }
            let init = row.init_pid.zip(row.init_start_time).map(|(pid, start_time)| InitProcess { pid, start_time });
            let id = task.id.to_string();
            let state = match init {
                Some(i) if !task.state.is_terminal() => Some(settled_state(i).await),
                _ => None,
            };
            if let Some(InitState::Unknown(e)) = &state {
                // Kept as it is: the background looks again, and only an
                // init known to have exited makes the sandbox lost.
                tracing::warn!(task = %task.id, "cannot tell whether the sandbox survived the restart ({e}); kept for now");
            }
            let unknown = matches!(state, Some(InitState::Unknown(_)));
            let healthy = match state {
                Some(InitState::Running | InitState::Unknown(_)) => self
                    .driver
                    .run(move |driver| {
                        // A daemon killed during a snapshot leaves the sandbox
                        // frozen; thaw it so it can answer and run again.
                        if let Err(e) = driver.thaw(&id) {
                            tracing::warn!(task = %id, "thaw after restart: {e}");
                        }
                        unknown || driver.ping(&id).is_ok()
                    })
                    .await
                    .unwrap_or(false),
                _ => false,
            };
            if healthy {
                let ids = self.driver.uid_range(row.uid_slot, task.config.isolation)?;
                if let Some(i) = init {
                    let _ = self.driver.adopt_slot(row.uid_slot, task.id.as_str(), i).await;
                }
                let live = init.map(|init| Live { init, ids });
                self.set_live(&task.id, live);
                if let Some(live) = live {
                    self.serve_egress(task, live).await;
                }
                self.store.set_sandbox_state(&task.id, SandboxState::Ready, None).await?;
                keep.insert(task.id.clone());
                tracing::info!(task = %task.id, "sandbox survived the restart");
            } else {
                self.mark_lost(task, init, "the sandbox was gone when the daemon started (host reboot or killed processes)").await?;
                lost.insert(task.id.clone());
            }
        }
        // Tasks that believe they have a sandbox but have no row for it.
        for t in &tasks {
            if t.sandbox == SandboxState::Ready
                && !keep.contains(&t.id)
                && !lost.contains(&t.id)
                && self.ran_here(t).await?
                && self.store.sandbox(&t.id).await?.is_none()
                && self.take_lease(&t.id).await?
            {
                self.mark_lost(t, None, "the daemon stopped while the sandbox was being built").await?;
            }
        }
        // Host leftovers of tasks that are gone or destroyed.
        let leftovers = self.driver.leftovers().await?;
        for name in leftovers {
            let Ok(id) = name.parse::<TaskId>() else { continue };
            let t = tasks.iter().find(|t| t.id == id);
            let wanted = t.is_some_and(|t| !t.state.is_terminal());
            if keep.contains(&id) || wanted {
                continue;
            }
            // Cgroups are host-wide: one this store never heard of and with
            // nothing in this home belongs to another daemon's home.
            if t.is_none() && !self.driver.has_local_state(&name).await? {
                continue;
            }
            if let Err(e) = self.driver.destroy(&name, None).await? {
                tracing::warn!(task = %name, "cannot remove leftovers: {e}");
            }
        }
        Ok(())
    }

    /// True when this node's daemon ran the task's latest sandbox: it is
    /// the task's node, or the task has none and this node leased it last
    /// (or no node ever did: a store from before nodes).
    pub(crate) async fn ran_here(&self, task: &Task) -> Result<bool, Error> {
        Ok(match &task.node {
            Some(n) => *n == self.cluster.name,
            None => self.store.lease(&task.id).await?.last_node.is_none_or(|n| n == self.cluster.name),
        })
    }

    pub(crate) async fn mark_lost(&self, task: &Task, init: Option<InitProcess>, why: &str) -> Result<(), Error> {
        tracing::warn!(task = %task.id, "{why}");
        let teardown = self.driver.teardown(task.id.as_str(), init, true).await?;
        if let Some(i) = init {
            reaper::reap(i.pid);
        }
        self.set_live(&task.id, None);
        self.release_slot(&task.id).await?;
        let terminal = task.state.is_terminal();
        let (state, note) = if terminal { (SandboxState::None, None) } else { (SandboxState::Lost, Some(why)) };
        self.store.set_sandbox_state(&task.id, state, note).await?;
        if !terminal {
            let mut args = json!({ "reason": why, "step": task.step });
            if let Err(e) = teardown {
                args["cleanup_error"] = json!(e.to_string());
            }
            self.store
                .append_event(&NewEvent {
                    task: task.id.clone(),
                    kind: EventKind::SandboxLost,
                    actor: "daemon".into(),
                    args,
                    exit_code: None,
                    duration_ms: None,
                })
                .await?;
        }
        Ok(())
    }

    pub(crate) fn wake_pool_refill(&self) {
        self.driver.refill();
    }

    /// Background work: keep the disk pool full, notice sandboxes whose
    /// init died (reaping it and marking the task), and hand freed memory
    /// back. Only an init known to have exited is marked: a look that fails
    /// (the daemon out of descriptors) is logged and tried again at the
    /// next round.
    pub fn spawn_background(self: Arc<Self>) {
        self.wake_pool_refill();
        tokio::spawn(async move {
            let mut unknown_logged: Option<Instant> = None;
            let mut rounds = 0u64;
            while self.pause(Duration::from_millis(500)).await {
                rounds += 1;
                // Every 10 s: a burst of requests (a flood refused with
                // 429) leaves the allocator holding memory it freed.
                if rounds.is_multiple_of(20) {
                    tokio::task::spawn_blocking(crate::admission::give_back_memory);
                }
                let mut dead = Vec::new();
                let mut unknown = Vec::new();
                for (id, live) in self.cells.all().into_iter().filter_map(|(id, c)| Some((id, c.live()?))) {
                    match live.init.state() {
                        InitState::Running => {}
                        InitState::Exited => dead.push((id, live)),
                        InitState::Unknown(e) => unknown.push(format!("{id} ({e})")),
                    }
                }
                // Once every 10 s at most: an overloaded daemon would
                // otherwise log a line per sandbox twice a second.
                if !unknown.is_empty() && unknown_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    tracing::warn!("cannot tell whether {} sandbox(es) run, looking again: {}", unknown.len(), unknown.join(", "));
                    unknown_logged = Some(Instant::now());
                }
                for (id, live) in dead {
                    self.lost_if_dead(&id, live).await;
                }
            }
        });
    }

    /// Marks the task's sandbox lost if `live` (found with its init known
    /// to have exited) is still the task's sandbox, under the task's lock.
    async fn lost_if_dead(&self, id: &TaskId, live: Live) {
        reaper::reap(live.init.pid);
        let lock = self.lock_of(id);
        let _guard = lock.lock().await;
        // Destroy, or a rollback's fresh sandbox, may have come meanwhile:
        // only the init found dead is lost.
        if self.live(id).map(|l| (l.init.pid, l.init.start_time)) != Some((live.init.pid, live.init.start_time)) {
            return;
        }
        if let Ok(task) = self.store.find_task(id.as_str()).await {
            let _ = self.mark_lost(&task, Some(live.init), "the sandbox's init exited").await;
        }
    }
}

/// The state of an init found in the store at start-up, asked again for up
/// to 2 s while it cannot be told (a daemon restarted under load).
async fn settled_state(init: InitProcess) -> InitState {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match init.state() {
            InitState::Unknown(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            state => return state,
        }
    }
}
