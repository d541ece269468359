//! Commands that outlive the request that started them: a background
//! command has a handle (a number unique in the daemon) by which clients
//! follow its output, write to its stdin, resize its terminal and kill it,
//! while it runs through the same [`exec`](crate::exec) path as any
//! command (admitted, logged, snapshotted when high-risk). A client that
//! goes away leaves it running; it ends by itself, by its timeout or by a
//! kill, and leaves the table ten minutes after it has ended (so that a
//! client can still collect its exit and output).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use cairn_api::exec::{ClientFrame, ExecStart, ServerFrame};
use cairn_core::ExecExit;
use tokio::sync::{broadcast, mpsc};

use crate::exec::{ExecChannel, ExecInput, ExecOutput};
use crate::runtime::Runtime;
use crate::Error;

/// Output a handle keeps for clients that attach late: the last this many
/// bytes of each command.
const KEPT_OUTPUT: usize = 1 << 20;
/// Events a slow follower may fall behind by before it is cut off.
const FOLLOWER_BACKLOG: usize = 4096;
/// How long an ended command stays in the table.
const KEEP_ENDED: std::time::Duration = std::time::Duration::from_secs(600);

/// What happens to a background command, in order: `Started` once (or
/// `Failed` instead of everything else), output, then `Ended` once.
#[derive(Clone, Debug)]
pub enum ProcessEvent {
    Started { step: u64 },
    Output { channel: u8, data: Bytes },
    Ended(ExecExit),
    /// The command could not be run at all (an unknown task state, a
    /// refused snapshot): the one-line reason.
    Failed(String),
}

/// One background command.
#[derive(Debug)]
pub struct Process {
    /// The handle: unique among the daemon's commands, never reused.
    pub id: u32,
    pub task: String,
    /// A name the client gave it, to find it by.
    pub tag: Option<String>,
    /// What it runs, as started.
    pub start: ExecStart,
    input: mpsc::UnboundedSender<ExecInput>,
    events: broadcast::Sender<ProcessEvent>,
    seen: Mutex<Seen>,
}

/// What has happened so far, for a client that attaches now.
#[derive(Debug, Default)]
struct Seen {
    started: Option<u64>,
    output: VecDeque<(u8, Bytes)>,
    kept_bytes: usize,
    /// Older output was dropped to keep within [`KEPT_OUTPUT`].
    dropped: bool,
    ended: Option<ProcessEvent>,
}

/// A client following a command: what happened before it attached, then
/// the events as they come.
#[derive(Debug)]
pub struct Follower {
    pub so_far: Vec<ProcessEvent>,
    pub live: broadcast::Receiver<ProcessEvent>,
}

impl Process {
    /// Attaches a client: everything kept so far, then what comes (no event
    /// is in both, none is lost between them).
    pub fn follow(&self) -> Follower {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut so_far = Vec::new();
        if let Some(step) = seen.started {
            so_far.push(ProcessEvent::Started { step });
        }
        so_far.extend(seen.output.iter().map(|(channel, data)| ProcessEvent::Output { channel: *channel, data: data.clone() }));
        so_far.extend(seen.ended.clone());
        Follower { so_far, live: self.events.subscribe() }
    }

    /// Bytes for its stdin (or its terminal); empty closes stdin (^D on a
    /// terminal).
    pub fn write_stdin(&self, data: Vec<u8>) -> Result<(), Error> {
        self.send(ExecInput::Stdin(data))
    }

    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), Error> {
        self.send(ExecInput::Control(ClientFrame::Resize { rows, cols }))
    }

    /// Kills the command and everything it started (its process group).
    pub fn kill(&self) -> Result<(), Error> {
        self.send(ExecInput::Gone)
    }

    /// Sends `signal` (one of [`cairn_api::exec::SIGNALS`]) to the command:
    /// KILL kills it as [`Process::kill`] does; the others reach it, which
    /// may handle them.
    pub fn signal(&self, signal: i32) -> Result<(), Error> {
        if !cairn_api::exec::SIGNALS.contains(&signal) {
            return Err(Error::invalid(format!("signal {signal} is not sent to commands: give one of {:?}", cairn_api::exec::SIGNALS)));
        }
        self.send(ExecInput::Control(ClientFrame::Signal { signal }))
    }

    pub fn has_ended(&self) -> bool {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).ended.is_some()
    }

    /// How it ended (`Ended` or `Failed`), once it has.
    pub fn end(&self) -> Option<ProcessEvent> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).ended.clone()
    }

    /// The output kept so far (the last [`KEPT_OUTPUT`] bytes), by channel:
    /// stdout (or the terminal's), stderr, and whether older output was
    /// dropped.
    pub fn output(&self) -> (Vec<u8>, Vec<u8>, bool) {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for (channel, data) in &seen.output {
            if *channel == cairn_api::exec::STDERR { err.extend_from_slice(data) } else { out.extend_from_slice(data) }
        }
        (out, err, seen.dropped)
    }

    /// Waits at most `limit` for the command to end; true when it has.
    pub async fn wait(&self, limit: std::time::Duration) -> bool {
        let mut follower = self.follow();
        if follower.so_far.iter().any(|e| matches!(e, ProcessEvent::Ended(_) | ProcessEvent::Failed(_))) {
            return true;
        }
        let ended = async {
            loop {
                match follower.live.recv().await {
                    Ok(ProcessEvent::Ended(_) | ProcessEvent::Failed(_)) => return,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        };
        tokio::time::timeout(limit, ended).await.is_ok() || self.has_ended()
    }

    fn send(&self, input: ExecInput) -> Result<(), Error> {
        self.input.send(input).map_err(|_| Error::not_found(format!("command {} has ended", self.id)))
    }

    fn record(&self, event: ProcessEvent) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match &event {
            ProcessEvent::Started { step } => seen.started = Some(*step),
            ProcessEvent::Output { channel, data } => {
                seen.kept_bytes += data.len();
                seen.output.push_back((*channel, data.clone()));
                while seen.kept_bytes > KEPT_OUTPUT && seen.output.len() > 1 {
                    let Some((_, dropped)) = seen.output.pop_front() else { break };
                    seen.kept_bytes -= dropped.len();
                    seen.dropped = true;
                }
            }
            ProcessEvent::Ended(_) | ProcessEvent::Failed(_) => seen.ended = Some(event.clone()),
        }
        // Under the lock: a follower attaching now sees it in `so_far` or
        // live, never both.
        let _ = self.events.send(event);
    }
}

/// The daemon's background commands, by task.
#[derive(Debug, Default)]
pub struct Processes {
    next: AtomicU32,
    by_task: Mutex<BTreeMap<String, Vec<Arc<Process>>>>,
}

impl Processes {
    fn add(&self, p: Arc<Process>) {
        self.by_task.lock().unwrap_or_else(PoisonError::into_inner).entry(p.task.clone()).or_default().push(p);
    }

    fn remove(&self, task: &str, id: u32) {
        let mut all = self.by_task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = all.get_mut(task) {
            list.retain(|p| p.id != id);
            if list.is_empty() {
                all.remove(task);
            }
        }
    }

    fn of(&self, task: &str) -> Vec<Arc<Process>> {
        self.by_task.lock().unwrap_or_else(PoisonError::into_inner).get(task).cloned().unwrap_or_default()
    }
}

/// Which command: by handle or by tag.
#[derive(Clone, Debug)]
pub enum ProcessSelector {
    Id(u32),
    Tag(String),
}

impl Runtime {
    /// Starts `start` in task `id` in the background and returns its handle
    /// with a follower attached from the first event. Refused like any
    /// exec (unknown task, a bound of `[limits]`) before anything runs.
    pub async fn start_process(self: &Arc<Self>, id: &str, actor: &str, start: ExecStart, tag: Option<String>) -> Result<(Arc<Process>, Follower), Error> {
        let task = self.find(id).await?;
        if let Some(t) = &tag {
            if self.processes.of(task.id.as_str()).iter().any(|p| p.tag.as_deref() == Some(t) && !p.has_ended()) {
                return Err(Error::conflict(format!("task {} has a running command tagged {t:?}", task.id)));
            }
        }
        let admitted = self.admit_exec(task.id.as_str()).await?;
        let (input, inputs) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(FOLLOWER_BACKLOG);
        let process = Arc::new(Process {
            id: self.processes.next.fetch_add(1, Ordering::Relaxed) + 1,
            task: task.id.to_string(),
            tag,
            start: start.clone(),
            input,
            events,
            seen: Mutex::new(Seen::default()),
        });
        let follower = process.follow();
        self.processes.add(process.clone());
        let (rt, p, actor) = (self.clone(), process.clone(), actor.to_owned());
        tokio::spawn(async move {
            let mut channel = Background { process: p.clone(), inputs };
            if let Err(e) = admitted.exec(&actor, start, &mut channel).await {
                p.record(ProcessEvent::Failed(e.to_string()));
            } else if !p.has_ended() {
                p.record(ProcessEvent::Failed("the command ended without an exit status".into()));
            }
            tokio::time::sleep(KEEP_ENDED).await;
            rt.processes.remove(&p.task, p.id);
        });
        Ok((process, follower))
    }

    /// The background commands of task `id`, running or recently ended,
    /// oldest first.
    pub async fn processes(&self, id: &str) -> Result<Vec<Arc<Process>>, Error> {
        let task = self.find(id).await?;
        Ok(self.processes.of(task.id.as_str()))
    }

    /// One background command of task `id` (running, or recently ended).
    pub async fn process(&self, id: &str, which: &ProcessSelector) -> Result<Arc<Process>, Error> {
        let all = self.processes(id).await?;
        let named = |p: &&Arc<Process>| match which {
            ProcessSelector::Id(n) => p.id == *n,
            ProcessSelector::Tag(t) => p.tag.as_deref() == Some(t.as_str()),
        };
        // A tag names the running command, else the last that had it.
        let found = all.iter().filter(named).find(|p| !p.has_ended()).or_else(|| all.iter().rfind(|p| named(p))).cloned();
        found.ok_or_else(|| match which {
            ProcessSelector::Id(n) => Error::not_found(format!("no command {n} in task {id}")),
            ProcessSelector::Tag(t) => Error::not_found(format!("no command tagged {t:?} in task {id}")),
        })
    }
}

/// The exec channel of a background command: its output goes to the
/// handle, its input comes from the handle's clients.
struct Background {
    process: Arc<Process>,
    inputs: mpsc::UnboundedReceiver<ExecInput>,
}

impl ExecChannel for Background {
    async fn send(&mut self, out: ExecOutput<'_>) -> bool {
        match out {
            ExecOutput::Output(channel, data) => self.process.record(ProcessEvent::Output { channel, data: Bytes::copy_from_slice(data) }),
            ExecOutput::Frame(ServerFrame::Started { step }) => self.process.record(ProcessEvent::Started { step: *step }),
            ExecOutput::Frame(ServerFrame::Exit { exit, .. }) => self.process.record(ProcessEvent::Ended(exit.clone())),
            ExecOutput::Frame(_) => {}
        }
        // Nobody has to be listening: the command runs on.
        true
    }

    async fn recv(&mut self) -> ExecInput {
        match self.inputs.recv().await {
            Some(input) => input,
            // The handle holds a sender for as long as the command runs.
            None => std::future::pending().await,
        }
    }
}
