//! A private PostgreSQL server for this test binary, and a fresh database
//! in it for each test: [`fresh_database`] (public with the `test-util`
//! feature, for other crates' tests) and, for this crate's conformance
//! suite, `TempPostgres`.
//!
//! The first test that asks starts the server: `initdb` into a temporary
//! directory (as the `postgres` user when the tests run as root, which
//! `initdb` refuses to be), then `postgres` itself listening on a unix
//! socket in that directory and on a free loopback port, without fsync
//! (nothing here needs to survive a power cut). The system's cluster and
//! its service are never used.
//!
//! The server is stopped and its directory removed when the test binary
//! exits (an `atexit` handler: libtest returns from `main` or calls
//! `process::exit`, both run it, also after failed tests). Should the
//! binary die without running it (killed), the server still goes: it is
//! started with a parent-death signal from a thread that lives as long as
//! the process, so it shuts down when the process ends.
//!
//! [`restart_server`] stops the server and starts it again on the same
//! data and port, as a restart of a production database does to its
//! clients (every database of this binary's server goes away meanwhile).
//!
//! Without PostgreSQL's programs the tests fail, saying what to install;
//! they are never skipped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const INSTALL: &str = "install PostgreSQL's server (Debian: `apt-get install postgresql`, as scripts/setup-debian.sh does), \
                       or set CAIRN_PG_BIN to the directory holding its initdb, postgres and pg_isready";

/// The running server, as tests reach it.
#[derive(Debug)]
struct Server {
    port: u16,
}

/// What the exit handler stops and removes.
struct Running {
    postgres: Child,
    dir: tempfile::TempDir,
    port: u16,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// A restart asked of the server's thread: down for how long, and where to
/// answer.
type RestartRequest = (Duration, std::sync::mpsc::Sender<Result<(), String>>);

/// The way to the server's thread, which alone may start the server (the
/// server's parent-death signal follows the thread that started it).
static RESTARTS: Mutex<Option<std::sync::mpsc::Sender<RestartRequest>>> = Mutex::new(None);

/// Stops the private server (a fast shutdown: every client is
/// disconnected), keeps it down for `down`, and starts it again on the
/// same data and port; returns once it accepts connections. Every
/// database of this process's server is gone meanwhile: a test binary
/// that restarts it runs that test alone.
pub fn restart_server(down: Duration) {
    server();
    let (answer, answered) = std::sync::mpsc::channel();
    let sent = RESTARTS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|tx| tx.send((down, answer)));
    assert!(matches!(sent, Some(Ok(()))), "the test PostgreSQL server's thread is gone");
    match answered.recv() {
        Ok(Ok(())) => {}
        Ok(Err(why)) => panic!("cannot restart the test PostgreSQL server: {why}"),
        Err(_) => panic!("the test PostgreSQL server's thread died restarting it"),
    }
}

/// An empty database of its own on the private server, for one test:
/// connect to [`TempDatabase::url`]. Dropping it drops the database, ending
/// any connection still open to it (a daemon that was killed, a pool not
/// yet closed).
#[derive(Debug)]
pub struct TempDatabase {
    /// `postgres://postgres@127.0.0.1:PORT/NAME`, with no password (the
    /// server trusts loopback connections).
    pub url: String,
    name: String,
    port: u16,
}

/// A fresh, empty database on this process's private PostgreSQL server,
/// which the first call starts (a few seconds). Blocks; callable from a
/// plain test or from an async runtime's thread alike. Panics, saying
/// what to install, when PostgreSQL is missing.
pub fn fresh_database() -> TempDatabase {
    let port = server().port;
    let name = next_database_name();
    let admin = admin_url(port);
    let sql = format!("CREATE DATABASE {name}");
    if let Err(e) = on_own_runtime(async move { admin_sql(&admin, &sql).await }) {
        panic!("create the test database {name}: {e}");
    }
    TempDatabase { url: database_url(port, &name), name, port }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        // FORCE: a daemon killed by the test may still hold connections the
        // server has not noticed are gone.
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let admin = admin_url(self.port);
        if let Err(e) = on_own_runtime(async move { admin_sql(&admin, &sql).await }) {
            // Not a panic in a drop: the database goes with the server anyway.
            eprintln!("dropping the test database {}: {e}", self.name);
        }
    }
}

/// An empty database of its own on the private server, for one test of
/// this crate. Left in place when dropped: it goes with the server.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct TempPostgres {
    url: String,
}

#[cfg(test)]
impl TempPostgres {
    /// A handle that can also run raw SQL (`pool`).
    pub(crate) async fn open_postgres(&self) -> crate::PostgresStore {
        crate::PostgresStore::connect(&self.url).await.expect("connect to the test database")
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

#[cfg(test)]
impl crate::conformance::TestDatabase for TempPostgres {
    async fn create() -> Self {
        // Started on a thread of its own (it takes a few seconds the first
        // time), not on the test's runtime.
        let port = match tokio::task::spawn_blocking(|| server().port).await {
            Ok(port) => port,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let name = next_database_name();
        admin_sql(&admin_url(port), &format!("CREATE DATABASE {name}")).await.expect("create a test database");
        TempPostgres { url: database_url(port, &name) }
    }

    async fn open(&self) -> crate::SharedStore {
        std::sync::Arc::new(self.open_postgres().await)
    }

    async fn tamper(&self, sql: &str, task: Option<&str>) -> std::result::Result<(), String> {
        let store = self.open_postgres().await;
        let res = store.tamper(sql, task).await;
        crate::Store::close(&store).await;
        res
    }
}

/// A database name no other test of this process has.
fn next_database_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("cairn_test_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn admin_url(port: u16) -> String {
    database_url(port, "postgres")
}

fn database_url(port: u16, name: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{name}")
}

/// Runs one statement (CREATE or DROP DATABASE, which cannot run in a
/// transaction) on a connection of its own.
async fn admin_sql(admin: &str, sql: &str) -> Result<(), sqlx::Error> {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin).await?;
    let done = sqlx::query(sql).execute(&mut conn).await.map(drop);
    <sqlx::PgConnection as sqlx::Connection>::close(conn).await.ok();
    done
}

/// Runs `work` to completion on a runtime of its own, on a thread of its
/// own: a runtime cannot be started (or blocked on) from a thread that
/// already runs one, which is where a drop may happen.
fn on_own_runtime<T: Send + 'static>(work: impl std::future::Future<Output = T> + Send + 'static) -> T {
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for the test database");
        rt.block_on(work)
    });
    match thread.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The server, started on first use.
fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let bin = bin_dir();
        let (tx, rx) = std::sync::mpsc::channel();
        let (restart_tx, restarts) = std::sync::mpsc::channel::<RestartRequest>();
        *RESTARTS.lock().unwrap_or_else(|e| e.into_inner()) = Some(restart_tx);
        // The thread that spawns the server is its "parent" for the death
        // signal: it must live as long as the process, not as one test.
        std::thread::Builder::new()
            .name("test-postgres".into())
            .spawn(move || {
                let started = start(&bin);
                let _ = tx.send(started);
                // Restarts come here; without any, the thread waits for
                // ever (the sender lives in a static).
                while let Ok((down, answer)) = restarts.recv() {
                    let _ = answer.send(restart(&bin, down));
                }
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the thread of the test PostgreSQL server");
        match rx.recv() {
            Ok(Ok(server)) => server,
            Ok(Err(why)) => panic!("cannot start a PostgreSQL server for the tests: {why}"),
            Err(_) => panic!("the thread starting the test PostgreSQL server died"),
        }
    })
}

fn start(bin: &Path) -> Result<Server, String> {
    let owner = owner()?;
    let dir = tempfile::Builder::new().prefix("cairn-pg-").tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
    }
    let data = dir.path().join("data");
    let out = as_owner(Command::new(bin.join("initdb")), owner)
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"])
        .output()
        .map_err(|e| format!("run {}: {e}", bin.join("initdb").display()))?;
    if !out.status.success() {
        return Err(format!("initdb failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    }
    let port = free_port()?;
    let postgres = launch(bin, owner, dir.path(), port)?;
    let (pid, log_path) = (postgres.id(), dir.path().join("postgres.log"));
    {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        *running = Some(Running { postgres, dir, port });
    }
    // SAFETY: registers a plain `extern "C"` function without arguments,
    // as atexit expects.
    if unsafe { libc::atexit(stop_at_exit) } != 0 {
        stop();
        return Err("cannot register the server's stop at exit".into());
    }
    wait_ready(bin, port, pid, &log_path)?;
    Ok(Server { port })
}

/// Stops the server (fast shutdown), waits `down`, starts it again on its
/// data directory and port. Runs on the server's thread.
fn restart(bin: &Path, down: Duration) -> Result<(), String> {
    let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let r = running.as_mut().ok_or("the server is not running")?;
    shut_down(&mut r.postgres);
    std::thread::sleep(down);
    r.postgres = launch(bin, owner()?, r.dir.path(), r.port)?;
    let (pid, port, log) = (r.postgres.id(), r.port, r.dir.path().join("postgres.log"));
    drop(running);
    wait_ready(bin, port, pid, &log)
}

/// Starts `postgres` on `<dir>/data`, its socket in `dir`, on `port`,
/// appending to `<dir>/postgres.log`.
fn launch(bin: &Path, owner: Option<(u32, u32)>, dir: &Path, port: u16) -> Result<Child, String> {
    let data = dir.join("data");
    let log_path = dir.join("postgres.log");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut cmd = as_owner(Command::new(bin.join("postgres")), owner);
    cmd.arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(dir)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=400"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: runs in the child between fork and exec, and only makes one
    // async-signal-safe system call (prctl).
    unsafe {
        cmd.pre_exec(|| {
            // After the switch to the owner (which clears the setting), so
            // that it holds for the server: it stops when this process ends.
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGINT).map_err(std::io::Error::from)
        });
    }
    cmd.spawn().map_err(|e| format!("run {}: {e}", bin.join("postgres").display()))
}

/// Waits until the server accepts connections.
fn wait_ready(bin: &Path, port: u16, pid: u32, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .status()
            .map_err(|e| format!("run pg_isready: {e}"))?;
        if ready.success() {
            return Ok(());
        }
        let exited = RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|r| r.postgres.try_wait().ok().flatten().is_some());
        if exited || Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            stop();
            let what = if exited { "exited" } else { "was not ready within a minute" };
            return Err(format!("postgres (pid {pid}) {what}; its log:\n{text}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

extern "C" fn stop_at_exit() {
    stop();
}

/// Stops the server (a fast shutdown: clients are disconnected) and
/// removes its directory. Runs at most once; never panics (it runs at exit).
fn stop() {
    let running = match RUNNING.lock() {
        Ok(mut r) => r.take(),
        Err(e) => e.into_inner().take(),
    };
    let Some(Running { mut postgres, dir, .. }) = running else {
        return;
    };
    shut_down(&mut postgres);
    drop(dir);
}

/// A fast shutdown of `postgres` (SIGINT: clients are disconnected), a
/// kill after 20 s; reaped either way.
fn shut_down(postgres: &mut Child) {
    if let Ok(pid) = i32::try_from(postgres.id()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGINT);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match postgres.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = postgres.kill();
                let _ = postgres.wait();
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The user that owns and runs the server: `postgres` (uid, gid) when the
/// tests run as root, else the tests' own user (`None`).
fn owner() -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match nix::unistd::User::from_name("postgres") {
        Ok(Some(u)) => Ok(Some((u.uid.as_raw(), u.gid.as_raw()))),
        Ok(None) => Err(format!("the tests run as root and there is no `postgres` user to run the server as: {INSTALL}")),
        Err(e) => Err(format!("look up the postgres user: {e}")),
    }
}

fn as_owner(mut cmd: Command, owner: Option<(u32, u32)>) -> Command {
    if let Some((uid, gid)) = owner {
        // std drops root's supplementary groups when it switches users.
        cmd.uid(uid).gid(gid);
    }
    cmd.env_remove("PGDATA").env("LC_ALL", "C");
    cmd
}

/// A loopback port no one listens on right now.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// The directory of PostgreSQL's server programs: `CAIRN_PG_BIN`, else
/// Debian's newest `/usr/lib/postgresql/<major>/bin`, else `PATH`.
fn bin_dir() -> PathBuf {
    let complete = |d: &Path| ["initdb", "postgres", "pg_isready"].iter().all(|p| d.join(p).is_file());
    if let Some(d) = std::env::var_os("CAIRN_PG_BIN") {
        let d = PathBuf::from(d);
        assert!(complete(&d), "CAIRN_PG_BIN={} holds no initdb, postgres and pg_isready: {INSTALL}", d.display());
        return d;
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| complete(bin))
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return bin;
    }
    if let Some(d) = std::env::var_os("PATH").iter().flat_map(std::env::split_paths).find(|d| complete(d)) {
        return d;
    }
    panic!("the PostgreSQL store tests need a PostgreSQL server to run against, and none is installed: {INSTALL}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the server has a database of that name.
    fn exists(port: u16, name: &str) -> bool {
        let (admin, name) = (admin_url(port), name.to_owned());
        on_own_runtime(async move {
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await.expect("connect to the test server");
            let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1").bind(name).fetch_optional(&mut conn).await.expect("look up a database");
            found.is_some()
        })
    }

    #[test]
    fn a_fresh_database_opens_as_a_store_and_goes_when_dropped_even_with_connections_open() {
        let db = fresh_database();
        let (port, name) = (db.port, db.name.clone());
        assert!(exists(port, &name));
        let url = db.url.clone();
        // A store left connected, as a killed daemon's would be.
        let (opened, keep) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(async {
                let store = crate::PostgresStore::connect(&url).await.expect("the URL opens as a store");
                opened.send(()).expect("the test waits");
                tokio::time::sleep(Duration::from_secs(3)).await;
                drop(store);
            });
        });
        keep.recv().expect("the store opened");
        drop(db);
        assert!(!exists(port, &name), "the database is dropped with its handle");
        holder.join().expect("the holding thread");
    }
}
