//! `cairn`: the daemon (`cairn serve`), every client subcommand, the demo,
//! and the hidden sandbox helpers (`cairn __sandbox-start`, and
//! `cairn __gvisor-init`, which runs inside a gvisor sandbox).

/// `println!` for the verbs' output: a closed pipe ends the process
/// quietly instead of panicking (see [`output::write_stdout`]).
macro_rules! outln {
    () => { $crate::output::write_stdout(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!($($arg)*), true) };
}

#[cfg(test)]
mod answer_types;
mod client;
mod cp;
mod deliver;
mod demo;
mod doctor;
mod demo_cluster;
mod demo_hooks;
mod demo_oci;
mod exec;
mod ledger;
mod mcp;
mod output;
mod progress;
mod verbs;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::client::Client;

#[derive(Parser, Debug)]
#[command(name = "cairn", version, about = "Ephemeral sandboxes over durable state for long-running agent tasks")]
struct Cli {
    /// Print JSON instead of human output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the daemon.
    Serve(ServeArgs),
    /// Create, list, show tasks.
    #[command(subcommand)]
    Task(verbs::task::TaskCmd),
    /// Run a command in a task's sandbox: cairn exec ID [OPTIONS] [-- CMD ARGS...]; without
    /// one, the task's default command (its image's Entrypoint and Cmd)
    Exec(exec::ExecCli),
    /// Copy files between a sandbox (ID:/path) and here. Copying out, a
    /// symlink that is absolute or leads out of the copied tree is refused
    /// unless --follow-links or --keep-links says what to do with it.
    Cp {
        src: String,
        dst: String,
        /// Copy what such links point to, resolved inside the sandbox.
        #[arg(long)]
        follow_links: bool,
        /// Copy such links as they are.
        #[arg(long)]
        keep_links: bool,
    },
    /// Show a task's event log (or verify its hash chain, or sign its head).
    Log {
        task: String,
        /// Walk the hash chain and check it against the signed checkpoints;
        /// name the first entry changed, removed or reordered.
        #[arg(long)]
        verify: bool,
        /// Sign the chain's head now (a checkpoint) and print it.
        #[arg(long, conflicts_with = "verify")]
        checkpoint: bool,
    },
    /// The node's ledger signing key.
    #[command(subcommand)]
    Key(ledger::KeyCmd),
    /// Background commands (`cairn exec --detach`): list, show, stdin, kill.
    #[command(subcommand)]
    Process(verbs::process::ProcessCmd),
    /// Keys of the E2B-compatible API (X-API-Key): create, list, revoke.
    #[command(subcommand)]
    ApiKey(verbs::api_key::ApiKeyCmd),
    /// Credentials the egress proxy injects (never inside a sandbox): set (from stdin), list, rm.
    #[command(subcommand)]
    Secret(verbs::secret::SecretCmd),
    /// Notifications out: post a task's events (waiting, woken, rolled back, a command finished, ...) to a URL, signed.
    #[command(subcommand)]
    Hooks(verbs::hooks::HooksCmd),
    /// Destroy a task's sandbox; its records stay.
    Destroy { task: String },
    /// A signed link to a port a process listens on inside a task (HTTP
    /// and WebSocket, relayed by the daemon; the sandbox stays offline).
    Port {
        task: String,
        port: String,
        /// How long the link works (default 1h, at most 7d).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// Take a snapshot of a task (or: snapshot list ID, snapshot diff ID A B).
    Snapshot(verbs::snapshot::SnapshotCli),
    /// Roll a task back in place to one of its snapshots.
    Rollback(verbs::snapshot::RollbackCli),
    /// Create new tasks starting from a snapshot of another.
    Fork(verbs::snapshot::ForkCli),
    /// Expire snapshots by retention policy, then delete unreferenced data.
    Gc(verbs::snapshot::GcCli),
    /// Wait for an approval, a webhook or a timer; the task suspends until then.
    Wait(verbs::waits::WaitCli),
    /// Approve (or --reject) a task's pending approval.
    Approve {
        task: String,
        /// Reject instead: the task wakes with the rejection as its event.
        #[arg(long)]
        reject: bool,
        /// A note handed to the task with the decision.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Send a named event to a task (satisfies a --webhook NAME wait).
    Event {
        task: String,
        /// The event's name: the NAME of a `wait --webhook NAME`.
        #[arg(long)]
        name: String,
        /// JSON payload.
        #[arg(long, default_value = "null")]
        data: String,
    },
    /// Suspend a task now: snapshot, then free its compute.
    Suspend { task: String },
    /// Wake a suspended task now.
    Resume { task: String },
    /// Write a backup of this node (its store, blob store and keys, made while the daemon runs) to FILE, or to standard output with "-".
    Backup {
        /// Where the backup goes; an existing file is never overwritten.
        file: PathBuf,
    },
    /// Restore a backup into a new home (CAIRN_HOME) that no daemon runs on.
    Restore {
        /// A file `cairn backup` wrote.
        file: PathBuf,
    },
    /// Verify the blob store: every referenced object exists (and, with
    /// --read-data, hashes to its id).
    Check {
        /// Also read every object and check it hashes to its id (slow).
        #[arg(long)]
        read_data: bool,
    },
    /// Manage base images.
    #[command(subcommand)]
    Image(verbs::image::ImageCmd),
    /// Store a task's deliverables with a signed record (and --complete it).
    Deliver(deliver::DeliverCli),
    /// Check a delivery record: signature, deliverables, ledger.
    ///
    /// The task's ledger is checked with the daemon: it must verify and
    /// still have the head the record names. If it cannot be checked (no
    /// daemon, or the daemon answers an error, e.g. it does not know the
    /// task), verify prints what it did check and exits non-zero, unless
    /// --offline says that is accepted.
    Verify {
        /// The record.json written by `cairn deliver --out`.
        record: PathBuf,
        /// The node's public key (64 hex digits, or a file holding it or
        /// the output of `cairn --json key show`); default: the daemon's keys.
        /// Without --offline the daemon is still asked for the ledger (and
        /// for deliverables missing next to the record).
        #[arg(long, value_name = "PUBKEY")]
        key: Option<String>,
        /// Ask no daemon: skip the ledger on purpose ("ledger not checked
        /// (--offline)") and exit 0 when the signature and digests verify.
        /// Needs --key; every deliverable must be next to the record.
        #[arg(long)]
        offline: bool,
    },
    /// A task's egress: the decision log of its proxy.
    #[command(subcommand)]
    Egress(verbs::egress::EgressCmd),
    /// The nodes (daemons) sharing the task database.
    #[command(subcommand)]
    Node(verbs::node::NodeCmd),
    /// Serve the Model Context Protocol on stdin and stdout, for MCP
    /// clients that start their servers as programs: a bridge to the
    /// daemon's /mcp (see docs/mcp.md).
    Mcp,
    /// Run everything end to end against an embedded daemon.
    Demo,
    /// Check this host for what Cairn needs (kernel features, cgroups,
    /// gVisor, disk room, the home's permissions, the clock, the daemon);
    /// exits 1 when something it cannot work without is missing.
    Doctor,
    /// Print a completion script for SHELL (bash, zsh, fish, elvish,
    /// powershell), e.g. `cairn completions bash > /etc/bash_completion.d/cairn`.
    Completions { shell: String },
    #[command(name = "__sandbox-start", hide = true)]
    SandboxStart { cgroup_procs: Vec<PathBuf> },
    /// The first process of a gvisor sandbox, run inside it.
    #[command(name = "__gvisor-init", hide = true)]
    GvisorInit,
    /// Starts one command inside a gvisor sandbox.
    #[command(name = "__gvisor-exec", hide = true)]
    GvisorExec {
        #[arg(last = true)]
        argv: Vec<std::ffi::OsString>,
    },
    /// Relays one connection to a port inside a gvisor sandbox.
    #[command(name = "__gvisor-connect", hide = true)]
    GvisorConnect { port: u16 },
    /// Watches a directory inside a gvisor sandbox.
    #[command(name = "__gvisor-watch", hide = true)]
    GvisorWatch {
        path: PathBuf,
        #[arg(long)]
        recursive: bool,
    },
}

/// Tells systemd `states` (`NOTIFY_SOCKET`); a failure is logged, never fatal.
fn sd_notify_state(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot tell systemd: {e}");
    }
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Tell systemd when the daemon is ready and when it stops (sd_notify:
    /// READY=1, STOPPING=1), for a unit of Type=notify (packaging/cairn.service).
    #[arg(long)]
    systemd: bool,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long)]
    listen: Option<String>,
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Formatted task disks kept ready.
    #[arg(long)]
    disk_pool: Option<usize>,
    /// Space kept free for the daemon's own data on the filesystem of the
    /// task disks: no task disk is admitted into it ([disk] reserve;
    /// default: 5 % of the filesystem, at least 1G).
    #[arg(long, value_name = "SIZE")]
    disk_reserve: Option<String>,
    /// Where snapshots are stored: a local path, file:///PATH, or
    /// s3://BUCKET/PREFIX (S3-compatible storage, configured by
    /// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION and AWS_ALLOW_HTTP=true for a plain-HTTP endpoint).
    /// Default: the home's blobs directory.
    #[arg(long, value_name = "URL")]
    blob: Option<String>,
    /// Bound of the local cache of a remote blob store's packs (default
    /// 2G; 0 turns it off).
    #[arg(long, value_name = "SIZE")]
    blob_cache_size: Option<String>,
    /// The task database: sqlite://PATH or postgres://USER@HOST/DATABASE
    /// (default: SQLite, $CAIRN_HOME/cairn.db).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// This daemon's name among the nodes sharing the store (default: the
    /// host name).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The most sandboxes this node runs at once; a full node leaves wakes
    /// and recoveries to the other nodes (default: no limit).
    #[arg(long, value_name = "N")]
    capacity: Option<usize>,
    /// How long a task's lease lasts unrenewed: a lost node's tasks run
    /// elsewhere after it; the node heartbeats every fifth of it (3s to 10m,
    /// default 10s; the same on every node).
    #[arg(long, value_name = "DURATION")]
    lease: Option<String>,
    /// The URL other nodes (and webhook and approval links) reach this
    /// daemon at, e.g. http://10.0.0.5:7878 (default: http:// and the
    /// listen address).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// The isolation driver of tasks created without --isolation: native
    /// or gvisor.
    #[arg(long, value_name = "DRIVER")]
    isolation: Option<String>,
    /// The most commands one task runs at once; more are refused with 429
    /// (default 64).
    #[arg(long, value_name = "N")]
    execs_per_task: Option<String>,
    /// The most commands the daemon runs at once (default: derived from
    /// its descriptor limit).
    #[arg(long, value_name = "N")]
    execs_total: Option<String>,
    /// The most event streams (task watch) one task has open at once
    /// (default 64).
    #[arg(long, value_name = "N")]
    streams_per_task: Option<String>,
    /// The most event streams the daemon has open at once (default:
    /// derived from its descriptor limit).
    #[arg(long, value_name = "N")]
    streams_total: Option<String>,
}

/// A command line clap refuses, in one line: what is wrong, the usage, and
/// for a command given to `exec` without `--`, where it goes.
fn usage_error(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let what = text.lines().next().unwrap_or_default().trim_start_matches("error: ").trim();
    let usage = text.lines().find_map(|l| l.trim().strip_prefix("Usage: ")).map(|u| format!(" (usage: {})", u.trim())).unwrap_or_default();
    let exec_without_dashes = e.kind() == clap::error::ErrorKind::UnknownArgument && std::env::args().nth(1).as_deref() == Some("exec");
    let hint = if exec_without_dashes { "; the command goes after --, as in `cairn exec TASK -- echo hi`" } else { "" };
    format!("cairn: {what}{hint}{usage}")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) => e.exit(),
        Err(e) => {
            eprintln!("{}", usage_error(&e));
            return ExitCode::from(2);
        }
    };
    if let Cmd::SandboxStart { cgroup_procs } = &cli.cmd {
        // Single-threaded on purpose: no runtime, no threads before fork.
        return ExitCode::from(cairn_sandbox::helper_main(cgroup_procs) as u8);
    }
    if let Cmd::GvisorInit = &cli.cmd {
        return ExitCode::from(cairn_sandbox::gvisor_init_main() as u8);
    }
    if let Cmd::GvisorExec { argv } = &cli.cmd {
        return ExitCode::from(cairn_sandbox::gvisor_exec_main(argv) as u8);
    }
    if let Cmd::GvisorConnect { port } = &cli.cmd {
        return ExitCode::from(cairn_sandbox::gvisor_connect_main(*port) as u8);
    }
    if let Cmd::GvisorWatch { path, recursive } = &cli.cmd {
        return ExitCode::from(cairn_sandbox::watch::run(path, *recursive, &mut std::io::stdout().lock()) as u8);
    }
    let json_out = cli.json;
    let result = match cli.cmd {
        Cmd::Serve(args) => serve(args),
        Cmd::Completions { shell } => completions(&shell),
        other => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match rt {
                Ok(rt) => {
                    let result = rt.block_on(client_command(other, json_out));
                    // A read of stdin (exec -i/-t) blocks a thread that cannot be
                    // cancelled; waiting for it would hang until the next keypress.
                    rt.shutdown_background();
                    result
                }
                Err(e) => Err(anyhow!("cannot start runtime: {e}")),
            }
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("cairn: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Writes the completion script of `shell` to stdout.
fn completions(shell: &str) -> Result<u8> {
    use clap::{CommandFactory, ValueEnum};
    let Some(sh) = clap_complete::Shell::from_str(shell, true).ok() else {
        let known: Vec<String> = clap_complete::Shell::value_variants().iter().map(|s| s.to_string()).collect();
        return Err(anyhow!("completions for {shell:?}: the shells are {}", known.join(", ")));
    };
    clap_complete::generate(sh, &mut Cli::command(), "cairn", &mut std::io::stdout());
    Ok(0)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colour only for a person at a terminal, not into a redirected log.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

fn serve(args: ServeArgs) -> Result<u8> {
    init_logging();
    let mut config = match &args.config {
        Some(p) => cairn_server::Config::load(p).map_err(|e| anyhow!(e))?,
        None => cairn_server::Config::default(),
    };
    if let Some(l) = &args.listen {
        config.listen = cairn_runtime::config::parse_listen(l).map_err(|e| anyhow!(e))?;
    }
    if let Some(n) = args.disk_pool {
        config.disk_pool = n;
    }
    if let Some(r) = &args.disk_reserve {
        config.disk_space.reserve = Some(cairn_core::parse_bytes(r).map_err(|e| anyhow!("--disk-reserve: {e}"))?);
    }
    if let Some(url) = &args.blob {
        config.blob.set_url(url).map_err(|e| anyhow!(e))?;
    }
    if let Some(size) = &args.blob_cache_size {
        config.blob.set_cache_size(size).map_err(|e| anyhow!(e))?;
    }
    if let Some(url) = &args.store {
        config.store = Some(cairn_runtime::config::parse_store(url).map_err(|e| anyhow!("--store: {e}"))?);
    }
    if let Some(n) = &args.node {
        config.node = Some(cairn_runtime::config::parse_node_name(n).map_err(|e| anyhow!("--node: {e}"))?);
    }
    if let Some(n) = args.capacity {
        config.capacity = Some(n);
    }
    if let Some(l) = &args.lease {
        config.lease = cairn_runtime::config::parse_lease(l).map_err(|e| anyhow!("--lease: {e}"))?;
    }
    if let Some(i) = &args.isolation {
        config.isolation = i.parse().map_err(|e| anyhow!("--isolation: {e}"))?;
    }
    if let Some(u) = &args.advertise {
        config.node_url = Some(cairn_runtime::config::parse_node_url(u).map_err(|e| anyhow!("--advertise: {e}"))?);
    }
    let bound = |flag: &str, v: &str| cairn_runtime::config::parse_bound(v).map_err(|e| anyhow!("--{flag}: {e}"));
    if let Some(n) = &args.execs_per_task {
        config.limits.execs_per_task = bound("execs-per-task", n)?;
    }
    if let Some(n) = &args.execs_total {
        config.limits.execs_total = Some(bound("execs-total", n)?);
    }
    if let Some(n) = &args.streams_per_task {
        config.limits.streams_per_task = bound("streams-per-task", n)?;
    }
    if let Some(n) = &args.streams_total {
        config.limits.streams_total = Some(bound("streams-total", n)?);
    }
    // The soft descriptor limit up to the hard one, before any thread
    // starts (so the variable below is set safely): the bounds of
    // [limits] are derived from it and must fit in it. Sandboxes keep the
    // limit the daemon was started with: the sandbox helper puts it back.
    match cairn_runtime::admission::raise_nofile() {
        Ok((was, now)) => {
            std::env::set_var(cairn_sandbox::SANDBOX_NOFILE_ENV, was.to_string());
            if now > was {
                tracing::info!("descriptor limit raised from {was} to {now}");
            }
        }
        Err(e) => tracing::warn!("cannot raise the descriptor limit: {e}"),
    }
    let helper_exe = std::env::current_exe().context("cannot find the cairn executable")?;
    let home = client::home();
    let systemd = args.systemd;
    if systemd && std::env::var_os("NOTIFY_SOCKET").is_none() {
        tracing::warn!("--systemd: no NOTIFY_SOCKET in the environment (not started by systemd with Type=notify); nothing to tell");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let daemon = cairn_server::Daemon::start(cairn_server::DaemonOptions { home, config, helper_exe }).await?;
        if systemd {
            // Ready once it answers; a unit of Type=notify waits for this.
            let status = format!("listening on {}", daemon.url);
            sd_notify_state(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(&status)]);
        }
        daemon.run_until_signal_then(|| {
            if systemd {
                sd_notify_state(&[sd_notify::NotifyState::Stopping]);
            }
        })
        .await;
        Ok::<_, anyhow::Error>(0)
    })
}

async fn client_command(cmd: Cmd, json_out: bool) -> Result<u8> {
    if matches!(cmd, Cmd::Demo) {
        return demo::run().await;
    }
    if matches!(cmd, Cmd::Doctor) {
        return doctor::run(&client::home(), json_out).await;
    }
    if let Cmd::Verify { record, key, offline } = &cmd {
        // With --offline no daemon is asked; otherwise one that cannot be
        // found leaves the ledger unchecked, which fails below.
        let client = if *offline { None } else { Some(Client::from_env()) };
        let daemon = match &client {
            None => deliver::DaemonAccess::Offline,
            Some(Ok(c)) => deliver::DaemonAccess::At(c),
            Some(Err(e)) => deliver::DaemonAccess::Unreachable(format!("{e:#}")),
        };
        let v = deliver::verify(daemon, record, key.as_deref()).await?;
        if json_out {
            outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        } else {
            outln!("{}", deliver::verify_summary(&v));
        }
        if let Some(why) = deliver::unverified(&v) {
            return Err(anyhow!(why));
        }
        return Ok(0);
    }
    if let Cmd::Restore { file } = &cmd {
        return verbs::backup::restore(file, verbs::Out { json: json_out }).await;
    }
    let client = Client::from_env()?;
    let out = verbs::Out { json: json_out };
    match cmd {
        Cmd::Task(c) => verbs::task::run(&client, c, out).await,
        Cmd::Deliver(a) => deliver::cli(&client, a, out).await,
        Cmd::Egress(c) => verbs::egress::run(&client, c, out).await,
        Cmd::Node(c) => verbs::node::run(&client, c, out).await,
        Cmd::Exec(a) => exec::cli(&client, a, json_out).await,
        Cmd::Cp { src, dst, follow_links, keep_links } => cp::cli(&client, &src, &dst, follow_links, keep_links, out).await,
        Cmd::Log { task, verify, checkpoint } => ledger::log(&client, &task, verify, checkpoint, out).await,
        Cmd::Key(c) => ledger::key(&client, c, json_out).await,
        Cmd::ApiKey(c) => verbs::api_key::run(&client, c, out).await,
        Cmd::Secret(c) => verbs::secret::run(&client, c, out).await,
        Cmd::Hooks(c) => verbs::hooks::run(&client, c, out).await,
        Cmd::Process(c) => verbs::process::run(&client, c, out).await,
        Cmd::Destroy { task } => verbs::task::destroy(&client, task, out).await,
        Cmd::Port { task, port, ttl } => verbs::task::port_link(&client, task, port, ttl, out).await,
        Cmd::Snapshot(a) => verbs::snapshot::snapshot(&client, a, out).await,
        Cmd::Rollback(a) => verbs::snapshot::rollback(&client, a, out).await,
        Cmd::Fork(a) => verbs::snapshot::fork(&client, a, out).await,
        Cmd::Wait(a) => verbs::waits::wait(&client, a, out).await,
        Cmd::Approve { task, reject, comment } => verbs::waits::approve(&client, task, reject, comment, out).await,
        Cmd::Event { task, name, data } => verbs::waits::event(&client, task, name, data, out).await,
        Cmd::Suspend { task } => verbs::waits::suspend(&client, task, out).await,
        Cmd::Resume { task } => verbs::waits::resume(&client, task, out).await,
        Cmd::Gc(a) => verbs::snapshot::gc(&client, a, out).await,
        Cmd::Check { read_data } => verbs::snapshot::check(&client, read_data, out).await,
        Cmd::Backup { file } => verbs::backup::backup(&client, &file, out).await,
        Cmd::Image(c) => verbs::image::run(&client, c, out).await,
        Cmd::Mcp => mcp::bridge(&client).await,
        Cmd::Serve(_) | Cmd::Completions { .. } | Cmd::Doctor | Cmd::Demo | Cmd::Verify { .. } | Cmd::Restore { .. } | Cmd::SandboxStart { .. } | Cmd::GvisorInit | Cmd::GvisorExec { .. } | Cmd::GvisorConnect { .. } | Cmd::GvisorWatch { .. } => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    /// `--help` says what each command and each option is: none without a
    /// description.
    #[test]
    fn every_command_and_option_says_what_it_is() {
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, path: &str, gaps: &mut Vec<String>) {
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
                let here = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    gaps.push(format!("{here}: no description"));
                }
                for a in sub.get_arguments().filter(|a| !a.is_hide_set() && !a.is_positional()) {
                    if !["help", "version"].contains(&a.get_id().as_str()) && a.get_help().is_none() && a.get_long_help().is_none() {
                        gaps.push(format!("{here} --{}: no help", a.get_id()));
                    }
                }
                walk(sub, &here, gaps);
            }
        }
        let mut gaps = Vec::new();
        walk(&super::Cli::command(), "cairn", &mut gaps);
        assert!(gaps.is_empty(), "commands and options without a description:\n{}", gaps.join("\n"));
    }

    /// The release binary ships without debug info (it was 119 MB with it);
    /// the dev profile keeps its line tables.
    #[test]
    fn the_release_profile_strips_debug_info() {
        let manifest = include_str!("../../../Cargo.toml");
        let section = |name: &str| -> String {
            let start = manifest.find(&format!("\n[{name}]\n")).unwrap_or_else(|| panic!("no [{name}]"));
            let body = &manifest[start + name.len() + 4..];
            body[..body.find("\n[").unwrap_or(body.len())].to_owned()
        };
        let release = section("profile.release");
        assert!(release.contains("strip = \"debuginfo\"") || release.contains("strip = true"), "{release}");
        assert!(!release.contains("debug ="), "debug info built only to be stripped: {release}");
        assert!(section("profile.dev").contains("debug = \"line-tables-only\""));
    }
}
