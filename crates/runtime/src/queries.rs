//! Reads for the front end: each answers one request from the store and the
//! live state, so a handler calls one method and maps its result.

use std::sync::Arc;

use cairn_api::snapshots::OpProgress;
use cairn_core::{Event, InboxEvent, TaskState, Wait, WaitFor};
use futures_util::Stream;

use crate::ledger::CheckpointView;
pub use cairn_api::exec::LiveOutput;
use crate::runtime::{Runtime, TaskView};
use crate::Error;

/// What `GET /v1/health` reports.
#[derive(Debug, serde::Serialize)]
pub struct Health {
    pub version: &'static str,
    pub home: Option<std::path::PathBuf>,
}

/// An approval link's wait, still pending, with its prompt.
#[derive(Debug)]
pub struct LinkedWait {
    pub wait: Wait,
    pub prompt: String,
}

impl Runtime {
    pub fn health(&self) -> Health {
        Health { version: env!("CARGO_PKG_VERSION"), home: Some(self.home.clone()) }
    }

    pub async fn list(&self) -> Result<Vec<TaskView>, Error> {
        Ok(self.store.list_tasks().await?.into_iter().map(|t| self.view(t)).collect())
    }

    /// A page of the tasks, newest first, that are in `state`, hold
    /// `text` in their id or name, and carry the label `meta` (`key=value`,
    /// or `key` for any value); and how many match in all. State and text
    /// are filtered in the store, a page at a time; a label filter reads
    /// every task the other two leave (labels are inside the task's
    /// config).
    pub async fn list_page(&self, state: Option<TaskState>, text: Option<&str>, meta: Option<&str>, offset: u64, limit: u64) -> Result<(Vec<TaskView>, u64), Error> {
        let filter = cairn_store::TaskFilter { state, text: text.map(str::to_owned) };
        let Some(meta) = meta.filter(|m| !m.is_empty()) else {
            let (tasks, total) = self.store.list_tasks_page(&filter, offset, limit).await?;
            return Ok((tasks.into_iter().map(|t| self.view(t)).collect(), total));
        };
        let (key, value) = meta.split_once('=').map_or((meta.trim(), None), |(k, v)| (k.trim(), Some(v.trim()).filter(|v| !v.is_empty())));
        let (all, _) = self.store.list_tasks_page(&filter, 0, u64::MAX).await?;
        let matching: Vec<_> = all.into_iter().filter(|t| t.config.metadata.get(key).is_some_and(|have| value.is_none_or(|v| v == have))).collect();
        let total = matching.len() as u64;
        let page = matching.into_iter().skip(offset.min(usize::MAX as u64) as usize).take(limit.min(usize::MAX as u64) as usize);
        Ok((page.map(|t| self.view(t)).collect(), total))
    }

    pub async fn show(&self, id_or_name: &str) -> Result<TaskView, Error> {
        let task = self.find(id_or_name).await?;
        self.view_with_wait(task).await
    }

    pub async fn events(&self, id_or_name: &str) -> Result<Vec<Event>, Error> {
        let task = self.find(id_or_name).await?;
        Ok(self.store.events(&task.id).await?)
    }

    /// A page of the task's event log: its last `limit` events before
    /// `before` (the newest when `None`), in order.
    pub async fn events_page(&self, id_or_name: &str, before: Option<u64>, limit: u64) -> Result<Vec<Event>, Error> {
        let task = self.find(id_or_name).await?;
        Ok(self.store.events_before(&task.id, before, limit).await?)
    }

    pub async fn inbox(&self, id_or_name: &str) -> Result<Vec<InboxEvent>, Error> {
        let task = self.find(id_or_name).await?;
        Ok(self.store.inbox(&task.id).await?)
    }

    /// The snapshot or restore of the task in progress, if any.
    pub async fn progress_of(&self, id_or_name: &str) -> Result<Option<OpProgress>, Error> {
        let task = self.find(id_or_name).await?;
        Ok(self.progress(&task.id))
    }

    pub async fn checkpoint_now(&self, id_or_name: &str, actor: &str) -> Result<CheckpointView, Error> {
        let task = self.find(id_or_name).await?;
        self.checkpoint(&task.id, actor).await
    }

    /// Checks an approval link (signature and expiry) and finds its wait,
    /// still pending.
    pub async fn linked_wait(&self, wait: &str, exp: i64, sig: &str) -> Result<LinkedWait, Error> {
        self.link_key.check(wait, exp, sig, cairn_store::now_ms()).map_err(|e| Error::Forbidden(e.to_string()))?;
        let w = self.store.find_wait(wait).await.map_err(|_| Error::not_found("this approval request does not exist"))?;
        let pending = self.store.pending_wait(&w.task).await?;
        if pending.map(|p| p.id) != Some(w.id.clone()) {
            return Err(Error::conflict("this approval request has been answered already"));
        }
        let prompt = match &w.what {
            WaitFor::Approval { prompt } => prompt.clone(),
            _ => String::new(),
        };
        Ok(LinkedWait { wait: w, prompt })
    }

    /// The output of the task's commands from now on, as it comes ([`LiveOutput`];
    /// a watcher that falls more than a backlog behind misses some, and is
    /// told how many chunks), held as an event stream is (admission bounds).
    pub async fn watch_output(self: &Arc<Self>, id_or_name: &str) -> Result<impl Stream<Item = LiveOutputItem> + Send + 'static, Error> {
        self.admission.precheck(crate::admission::Kind::Stream, id_or_name, &self.cells)?;
        let task = self.find(id_or_name).await?;
        let permit = self.admission.admit(crate::admission::Kind::Stream, &task.id, self.cells.of(&task.id))?;
        let rx = self.cells.of(&task.id).output().subscribe();
        Ok(futures_util::stream::unfold((rx, permit), |(mut rx, permit)| async move {
            match rx.recv().await {
                Ok(out) => Some((LiveOutputItem::Output(out), (rx, permit))),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => Some((LiveOutputItem::Missed(n), (rx, permit))),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
            }
        }))
    }

    /// The task's event log after `after`, then each new entry as it is
    /// committed; woken by the store's change signal, not by polling.
    pub async fn watch(self: &Arc<Self>, id_or_name: &str, after: u64) -> Result<impl Stream<Item = Result<Event, Error>> + Send + 'static, Error> {
        self.admission.precheck(crate::admission::Kind::Stream, id_or_name, &self.cells)?;
        let task = self.find(id_or_name).await?;
        let rt = self.clone();
        // Held as long as the stream: dropped with it when the client goes.
        let permit = self.admission.admit(crate::admission::Kind::Stream, &task.id, self.cells.of(&task.id))?;
        // Subscribed before the first read: each committed change wakes it.
        let start = (after, Vec::<Event>::new(), self.cells.of(&task.id).subscribe(), permit);
        Ok(futures_util::stream::unfold(start, move |(mut after, mut queue, mut changes, permit)| {
            let rt = rt.clone();
            let id = task.id.clone();
            async move {
                loop {
                    if let Some(e) = queue.pop() {
                        after = e.seq;
                        return Some((Ok(e), (after, queue, changes, permit)));
                    }
                    match rt.store.events_after(&id, after).await {
                        Ok(new) => {
                            queue = new;
                            queue.reverse();
                        }
                        Err(e) => return Some((Err(Error::from(e)), (after, queue, changes, permit))),
                    }
                    if queue.is_empty() && changes.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }))
    }
}

/// What [`Runtime::watch_output`] streams.
#[derive(Debug)]
pub enum LiveOutputItem {
    Output(LiveOutput),
    /// The watcher fell behind: this many chunks went by unseen.
    Missed(u64),
}
