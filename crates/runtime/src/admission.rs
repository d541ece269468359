//! Bounds on what clients hold open at once: commands (an exec over the
//! WebSocket, a plain or streamed `POST .../exec`, MCP's `run`) and event
//! streams (`GET .../watch`), per task and per daemon (`[limits]` in the
//! config). Past a bound a request is refused at once with
//! [`Error::TooMany`] (HTTP 429), before it opens anything: an overload is
//! refused, never fatal to the other tasks. A flood of 10,000 execs on one
//! task once took every descriptor of the daemon.
//!
//! The bounds live in the engine rather than in the HTTP front end: every
//! way in (the routes, MCP's tools) reaches commands through the same
//! runtime methods, so one count covers them all; the engine knows nothing
//! of HTTP, the server maps the error kind to its status.
//!
//! Each admitted request holds a [`Permit`] for its whole life: one of the
//! daemon's (a semaphore's) and one of its task's (a count in the task's
//! cell). The daemon's totals must fit in its descriptor limit with a
//! reserve to spare ([`resolve`]): `cairn serve` raises its soft limit to
//! the hard one at start ([`raise_nofile`]), derives the totals the config
//! leaves out from it, and refuses totals that do not fit.

use std::sync::Arc;

use cairn_core::TaskId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::cell::{Cells, TaskCell};
use crate::config::LimitsConfig;
use crate::Error;

/// Descriptors one running command may cost the daemon: its connection, the
/// control connection to the sandbox's init, its three pipes (or a pty
/// master and its copy), and some slack.
pub const EXEC_FDS: u64 = 8;
/// Descriptors one event stream may cost: its connection, and slack.
pub const STREAM_FDS: u64 = 2;
/// The most commands or streams a derived total allows, whatever the
/// descriptor limit.
const DERIVED_CAP: u64 = 4096;

/// What a permit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Exec,
    Stream,
}

/// The bounds in force, resolved against the descriptor limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub execs_per_task: usize,
    pub execs_total: usize,
    pub streams_per_task: usize,
    pub streams_total: usize,
    /// The soft `RLIMIT_NOFILE` they were resolved against.
    pub nofile: u64,
    /// Descriptors kept for everything else the daemon does (the store,
    /// sandboxes starting, snapshots, the monitor's reads of `/proc`).
    pub reserve: u64,
}

/// The descriptors kept out of every bound: a quarter of the limit, and at
/// least half of a small one.
pub fn reserve_for(nofile: u64) -> u64 {
    (nofile / 4).max(nofile.min(1024) / 2)
}

/// The bounds of `config` under a soft descriptor limit of `nofile`: the
/// totals it leaves out take half (commands) and a quarter (streams) of what
/// the reserve leaves; totals it gives must fit there together, else the one
/// line saying so.
pub fn resolve(config: &LimitsConfig, nofile: u64) -> Result<Bounds, String> {
    let reserve = reserve_for(nofile);
    let usable = nofile.saturating_sub(reserve);
    let derived = |share: u64, cost: u64| (usable / share / cost).clamp(1, DERIVED_CAP) as usize;
    let execs_total = config.execs_total.unwrap_or_else(|| derived(2, EXEC_FDS));
    let streams_total = config
        .streams_total
        .unwrap_or_else(|| derived(4, STREAM_FDS));
    let need = (execs_total as u64)
        .saturating_mul(EXEC_FDS)
        .saturating_add((streams_total as u64).saturating_mul(STREAM_FDS));
    if need > usable {
        return Err(format!(
            "[limits] execs_total = {execs_total} and streams_total = {streams_total} need about {need} descriptors, more than the {usable} \
             this daemon may use (RLIMIT_NOFILE {nofile} less a reserve of {reserve}): lower them, or raise the limit"
        ));
    }
    Ok(Bounds {
        execs_per_task: config.execs_per_task,
        execs_total,
        streams_per_task: config.streams_per_task,
        streams_total,
        nofile,
        reserve,
    })
}

/// The soft descriptor limit of this process.
pub fn nofile() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}

/// Raises this process's soft descriptor limit to its hard limit; answers
/// the soft limit before and after. Children inherit the raised limit:
/// `cairn serve` hands the one before to the sandbox helper, which puts it
/// back for the sandbox.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, soft.max(hard)))
}

/// Hands the memory the allocator keeps free back to the system: glibc
/// keeps what a burst freed in its arenas, and a daemon's resident size
/// stayed 6 times its start after a flood of refused requests.
pub fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The daemon's counts, shared by every task.
#[derive(Debug)]
pub(crate) struct Admission {
    bounds: Bounds,
    execs: Arc<Semaphore>,
    streams: Arc<Semaphore>,
}

impl Admission {
    pub(crate) fn new(bounds: Bounds) -> Admission {
        Admission {
            bounds,
            execs: Arc::new(Semaphore::new(bounds.execs_total)),
            streams: Arc::new(Semaphore::new(bounds.streams_total)),
        }
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// A permit for one more command or stream of `task`, or the one line
    /// naming the bound it would pass. Never waits.
    pub(crate) fn admit(
        &self,
        kind: Kind,
        task: &TaskId,
        cell: Arc<TaskCell>,
    ) -> Result<Permit, Error> {
        let (per_task, _, sem) = self.of(kind);
        if !cell.try_hold(kind, per_task) {
            return Err(self.task_full(kind, task));
        }
        let held = Held { cell, kind };
        let total_permit = sem
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.daemon_full(kind))?;
        Ok(Permit {
            _task: held,
            _total: total_permit,
        })
    }

    /// Refuses at once what [`Admission::admit`] is sure to refuse, before
    /// the task is looked up in the store: a flood must not queue the
    /// other tasks' requests behind its own lookups. Only a task named by
    /// its id and already at its bound is known without the store.
    pub(crate) fn precheck(
        &self,
        kind: Kind,
        id_or_name: &str,
        cells: &Cells,
    ) -> Result<(), Error> {
        let (per_task, _, sem) = self.of(kind);
        // The task's bound first, as in `admit`.
        if let Ok(id) = id_or_name.parse::<TaskId>() {
            if cells.get(&id).is_some_and(|c| c.held(kind) >= per_task) {
                return Err(self.task_full(kind, &id));
            }
        }
        if sem.available_permits() == 0 {
            return Err(self.daemon_full(kind));
        }
        Ok(())
    }

    fn of(&self, kind: Kind) -> (usize, usize, &Arc<Semaphore>) {
        let b = &self.bounds;
        match kind {
            Kind::Exec => (b.execs_per_task, b.execs_total, &self.execs),
            Kind::Stream => (b.streams_per_task, b.streams_total, &self.streams),
        }
    }

    fn task_full(&self, kind: Kind, task: &TaskId) -> Error {
        let (n, _, _) = self.of(kind);
        Error::TooMany(match kind {
            Kind::Exec => format!("task {task} already runs {n} commands at once (limit [limits] execs_per_task = {n}); try again later"),
            Kind::Stream => format!("task {task} already has {n} open event streams (limit [limits] streams_per_task = {n}); try again later"),
        })
    }

    fn daemon_full(&self, kind: Kind) -> Error {
        let (_, n, _) = self.of(kind);
        Error::TooMany(match kind {
            Kind::Exec => format!("the daemon already runs {n} commands at once (limit [limits] execs_total = {n}); try again later"),
            Kind::Stream => format!("the daemon already has {n} open event streams (limit [limits] streams_total = {n}); try again later"),
        })
    }
}

/// One admitted command or stream: given back when dropped.
#[derive(Debug)]
pub struct Permit {
    _task: Held,
    _total: OwnedSemaphorePermit,
}

/// One count of a task's cell.
#[derive(Debug)]
struct Held {
    cell: Arc<TaskCell>,
    kind: Kind,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.cell.release(self.kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_derived_from_the_descriptor_limit_with_a_reserve() {
        let b = resolve(&LimitsConfig::default(), 20_000).unwrap();
        assert_eq!(
            (
                b.reserve,
                b.execs_total,
                b.streams_total,
                b.execs_per_task,
                b.streams_per_task
            ),
            (5000, 937, 1875, 64, 64)
        );
        let b = resolve(&LimitsConfig::default(), 1024).unwrap();
        assert_eq!((b.reserve, b.execs_total, b.streams_total), (512, 32, 64));
        let b = resolve(&LimitsConfig::default(), 1 << 20).unwrap();
        assert_eq!((b.execs_total, b.streams_total), (4096, 4096));
        let b = resolve(&LimitsConfig::default(), 64).unwrap();
        assert_eq!((b.reserve, b.execs_total, b.streams_total), (32, 2, 4));
        // Too small for even one of each beside its reserve.
        assert!(resolve(&LimitsConfig::default(), 16)
            .unwrap_err()
            .contains("RLIMIT_NOFILE 16 less a reserve of 8"));
        for n in [64, 1024, 4096, 20_000, 65_536, 1 << 20] {
            let b = resolve(&LimitsConfig::default(), n).unwrap();
            assert!(
                b.execs_total as u64 * EXEC_FDS + b.streams_total as u64 * STREAM_FDS + b.reserve
                    <= n,
                "{n}: {b:?}"
            );
        }
    }

    #[test]
    fn totals_that_do_not_fit_are_refused_in_one_line() {
        let config = LimitsConfig {
            execs_total: Some(5000),
            ..LimitsConfig::default()
        };
        let err = resolve(&config, 20_000).unwrap_err();
        assert_eq!(
            err,
            "[limits] execs_total = 5000 and streams_total = 1875 need about 43750 descriptors, more than the 15000 this daemon may use \
             (RLIMIT_NOFILE 20000 less a reserve of 5000): lower them, or raise the limit"
        );
        let fits = LimitsConfig {
            execs_total: Some(1000),
            streams_total: Some(3000),
            ..LimitsConfig::default()
        };
        assert_eq!(
            resolve(&fits, 20_000).map(|b| (b.execs_total, b.streams_total)),
            Ok((1000, 3000))
        );
    }

    #[test]
    fn permits_are_bounded_per_task_and_in_total_and_given_back_on_drop() {
        let config = LimitsConfig {
            execs_per_task: 2,
            execs_total: Some(3),
            streams_per_task: 1,
            streams_total: Some(1),
        };
        let a = Admission::new(resolve(&config, 20_000).unwrap());
        let (t1, t2, t3) = (TaskId::random(), TaskId::random(), TaskId::random());
        let (c1, c2, c3) = (
            Arc::new(TaskCell::default()),
            Arc::new(TaskCell::default()),
            Arc::new(TaskCell::default()),
        );
        let p1 = a.admit(Kind::Exec, &t1, c1.clone()).unwrap();
        let _p2 = a.admit(Kind::Exec, &t1, c1.clone()).unwrap();
        let err = a.admit(Kind::Exec, &t1, c1.clone()).unwrap_err();
        assert_eq!(err.to_string(), format!("task {t1} already runs 2 commands at once (limit [limits] execs_per_task = 2); try again later"));
        assert_eq!(err.code(), cairn_api::ErrorCode::TooManyRequests);
        let _p3 = a.admit(Kind::Exec, &t2, c2.clone()).unwrap();
        let err = a.admit(Kind::Exec, &t3, c3.clone()).unwrap_err();
        assert_eq!(err.to_string(), "the daemon already runs 3 commands at once (limit [limits] execs_total = 3); try again later");
        // A refusal by the total holds nothing of the task's.
        drop(p1);
        let _p4 = a.admit(Kind::Exec, &t3, c3.clone()).unwrap();
        assert!(
            a.admit(Kind::Exec, &t1, c1.clone()).is_err(),
            "the total is full again"
        );
        // Streams are counted apart from commands.
        let s = a.admit(Kind::Stream, &t1, c1.clone()).unwrap();
        assert!(a
            .admit(Kind::Stream, &t1, c1.clone())
            .unwrap_err()
            .to_string()
            .contains("streams_per_task = 1"));
        assert!(a
            .admit(Kind::Stream, &t2, c2.clone())
            .unwrap_err()
            .to_string()
            .contains("streams_total = 1"));
        drop(s);
        assert!(a.admit(Kind::Stream, &t2, c2).is_ok());
    }

    #[test]
    fn a_precheck_refuses_without_the_store_only_what_admit_would() {
        let config = LimitsConfig {
            execs_per_task: 1,
            execs_total: Some(2),
            ..LimitsConfig::default()
        };
        let a = Admission::new(resolve(&config, 20_000).unwrap());
        let cells = Cells::default();
        let (t1, t2) = (TaskId::random(), TaskId::random());
        assert!(
            a.precheck(Kind::Exec, t1.as_str(), &cells).is_ok(),
            "no cell yet"
        );
        let p1 = a.admit(Kind::Exec, &t1, cells.of(&t1)).unwrap();
        let err = a.precheck(Kind::Exec, t1.as_str(), &cells).unwrap_err();
        assert!(err.to_string().contains("execs_per_task = 1"), "{err}");
        // By name the task is not known without the store: admit decides.
        assert!(a.precheck(Kind::Exec, "build-box", &cells).is_ok());
        assert!(
            a.precheck(Kind::Stream, t1.as_str(), &cells).is_ok(),
            "streams are counted apart"
        );
        let _p2 = a.admit(Kind::Exec, &t2, cells.of(&t2)).unwrap();
        let err = a.precheck(Kind::Exec, "any-task", &cells).unwrap_err();
        assert!(err.to_string().contains("execs_total = 2"), "{err}");
        drop(p1);
        assert!(a.precheck(Kind::Exec, t1.as_str(), &cells).is_ok());
    }
}
