//! `cairn deliver` and `cairn verify`.
//!
//! `deliver` asks the daemon to store the deliverables and sign a record;
//! with `--out` it also writes them and `record.json` to a local directory.
//! `verify` checks a record: the DSSE signature against the node's public
//! keys, every deliverable's SHA-256 (next to the record, or from the
//! daemon's store), and that the task's ledger, as the daemon has it, still
//! verifies and has the head the record names. A ledger that cannot be
//! checked (no daemon, or it answers an error) leaves the record
//! unverified, unless `--offline` skips the ledger on purpose.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use cairn_api::deliver::DeliveryView;
use cairn_api::ledger::{KeyInfo, LedgerView};
use reqwest::Method;
use serde::Serialize;

use crate::client::{error_message, Answer, Client};

pub struct DeliverArgs {
    pub task: String,
    pub files: Vec<String>,
    pub archive: Option<String>,
    pub patch: bool,
    pub report: Option<String>,
    pub out: Option<PathBuf>,
    pub complete: bool,
}

/// Raw bytes of a GET.
async fn get_bytes(client: &Client, path: &str) -> Result<Vec<u8>> {
    let resp = client.request(Method::GET, path).send().await.map_err(|e| client.connect_error(e))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| anyhow!("reading the daemon's answer: {e}"))?;
    if !status.is_success() {
        bail!("{}", error_message(status, &body));
    }
    Ok(body.to_vec())
}

/// Streams a GET into `to`, with progress on a terminal; returns the
/// SHA-256 of what was written.
async fn download(client: &Client, path: &str, to: &Path, total: Option<u64>) -> Result<String> {
    use futures_util::StreamExt;
    use sha2::Digest;
    use std::io::Write;
    let resp = client.request(Method::GET, path).send().await.map_err(|e| client.connect_error(e))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        bail!("{}", error_message(status, &body));
    }
    let mut file = std::fs::File::create(to).with_context(|| format!("write {}", to.display()))?;
    let mut hash = sha2::Sha256::new();
    let mut done = 0u64;
    let progress = crate::progress::Progress::new("deliverable");
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| anyhow!("download of {} broke off: {e}", to.display()))?;
        file.write_all(&chunk).with_context(|| format!("write {}", to.display()))?;
        hash.update(&chunk);
        done += chunk.len() as u64;
        progress.update(done, total);
    }
    file.sync_all().with_context(|| format!("write {}", to.display()))?;
    progress.finish(done);
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

pub async fn deliver(client: &Client, a: DeliverArgs) -> Result<Answer<DeliveryView>> {
    if let Some(out) = &a.out {
        if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
            bail!("--out {}: the directory exists and is not empty", out.display());
        }
    }
    let body = cairn_api::deliver::DeliverRequest {
        files: a.files.clone(),
        archive: a.archive.clone(),
        patch: a.patch,
        report: a.report.clone(),
        complete: a.complete,
    };
    let v: Answer<DeliveryView> = client.post(&format!("/v1/tasks/{}/deliveries", a.task), &body).await?;
    if let Some(out) = &a.out {
        std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
        for d in &v.body.deliverables {
            let name = cairn_ledger::record::plain_name(&d.name).map_err(|e| anyhow!(e))?;
            let got = download(client, &format!("/v1/deliverables/{}", d.sha256), &out.join(name), Some(d.size)).await?;
            if got != d.sha256 {
                bail!("deliverable {name} came back from the store with another digest");
            }
        }
        let record = get_bytes(client, &format!("/v1/records/{}", v.body.record_id)).await?;
        std::fs::write(out.join("record.json"), record).with_context(|| format!("write {}", out.join("record.json").display()))?;
    }
    Ok(v)
}

pub fn delivery_summary(v: &DeliveryView, out: Option<&Path>) -> String {
    let mut lines = vec![format!("delivered from {}: record {}", v.task, v.record_id)];
    for d in &v.deliverables {
        // The size unpadded, as it has always printed.
        lines.push(format!("  {:<8} {:<28} {} bytes  sha256:{}", d.kind, d.name, d.size, d.sha256));
    }
    lines.push(format!("  ledger head at entry {}: {}", v.ledger_seq, v.ledger_head));
    if let Some(out) = out {
        lines.push(format!("  written to {} (with record.json)", out.display()));
    }
    if v.completed {
        lines.push("  task completed: its sandbox and scratch space are gone".into());
    }
    lines.join("\n")
}

/// Which daemon `verify` may ask, beyond the record and the files next to it.
pub enum DaemonAccess<'a> {
    /// This one: the node's keys (without `--key`), deliverables missing
    /// next to the record, and the task's live ledger.
    At(&'a Client),
    /// None could be asked, for this reason: the ledger cannot be checked,
    /// so the record does not verify.
    Unreachable(String),
    /// `--offline`: no daemon is asked, on purpose; the ledger is left
    /// unchecked by the caller's choice.
    Offline,
}

/// The keys a record may be signed with: `--key` (hex, or a file holding
/// hex or `cairn --json key show` output), else every key the daemon has
/// used.
async fn verifying_keys(daemon: &DaemonAccess<'_>, key: Option<&str>) -> Result<Vec<(String, cairn_ledger::VerifyingKey)>> {
    if let Some(k) = key {
        let text = if Path::new(k).is_file() { std::fs::read_to_string(k).with_context(|| format!("--key {k}"))? } else { k.to_owned() };
        return cairn_ledger::parse_public_key(text.trim()).map_err(|e| anyhow!("--key: {e}"));
    }
    let client = match daemon {
        DaemonAccess::At(c) => c,
        DaemonAccess::Offline => bail!("--offline needs --key PUBKEY"),
        DaemonAccess::Unreachable(why) => {
            bail!("cannot check the signature or the ledger: no --key given and no daemon ({why}); give --key PUBKEY, and --offline to accept an unchecked ledger")
        }
    };
    let keys: Vec<KeyInfo> = client.get("/v1/keys").await.map_err(|e| anyhow!("no --key given and cannot get the node's keys from the daemon to check the signature: {e}"))?;
    // As `--key` would read the output of `cairn --json key show`: each
    // key's id is checked against its public key.
    let text = serde_json::to_string(&keys)?;
    cairn_ledger::parse_public_key(&text).map_err(|e| anyhow!("the daemon's keys: {e}"))
}

/// What `verify` found: `cairn --json verify` prints it. The fields of
/// each struct are in the order it has always printed them in (sorted).
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub deliverables: Vec<CheckedDeliverable>,
    /// The node key that signed the record.
    pub key_id: String,
    pub ledger: LedgerCheck,
    /// The record's path, as given.
    pub record: String,
    pub task: String,
    /// Every check passed, the ledger's included unless `--offline` left it
    /// out on purpose.
    pub verified: bool,
}

/// A deliverable whose SHA-256 matched the record.
#[derive(Debug, Clone, Serialize)]
pub struct CheckedDeliverable {
    /// `next to the record` or `from the store`.
    pub from: String,
    pub name: String,
    pub sha256: String,
}

/// Whether the task's live ledger has the head the record names.
#[derive(Debug, Clone, Serialize)]
pub struct LedgerCheck {
    pub checked: bool,
    /// The head the record's signed checkpoint names, at entry `seq`.
    pub head: String,
    /// One line: `ledger checked`, or why not.
    pub result: String,
    pub seq: u64,
    /// Why it was not checked (`--offline`, or what failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What `verify` found. An `Err` names the first check that failed; an
/// `Ok` has `verified` set unless the ledger could not be checked without
/// `--offline` (then [`unverified`] says why). Every other check passed
/// either way.
pub async fn verify(daemon: DaemonAccess<'_>, record: &Path, key: Option<&str>) -> Result<VerifyReport> {
    if matches!(daemon, DaemonAccess::Offline) && key.is_none() {
        bail!("--offline needs --key PUBKEY, the node's public key (`cairn key show` prints it)");
    }
    let text = std::fs::read(record).with_context(|| format!("cannot read record {}", record.display()))?;
    let keys = verifying_keys(&daemon, key).await?;
    let opened = cairn_ledger::record::open_record(&text, &record.display().to_string(), &keys).map_err(|e| anyhow!(e))?;
    let (task, key_id, seq, head) = (opened.task, opened.key_id, opened.seq, opened.head);

    // Each deliverable: next to the record, else from the daemon's store.
    let dir = record.parent().unwrap_or(Path::new("."));
    let mut checked = Vec::new();
    for (name, want) in &opened.deliverables {
        let local = dir.join(name);
        let (data, from) = if local.exists() {
            (std::fs::read(&local).with_context(|| format!("read {}", local.display()))?, "next to the record")
        } else {
            match &daemon {
                DaemonAccess::At(c) => {
                    let data = get_bytes(c, &format!("/v1/deliverables/{want}"))
                        .await
                        .map_err(|e| anyhow!("deliverable {name}: not next to the record, and the store: {e}"))?;
                    (data, "from the store")
                }
                DaemonAccess::Unreachable(why) => bail!("deliverable {name}: not next to the record and no daemon to fetch it from ({why})"),
                DaemonAccess::Offline => bail!("deliverable {name}: not next to the record, and --offline fetches nothing from the daemon"),
            }
        };
        cairn_ledger::record::check_deliverable(name, want, &data, from).map_err(|e| anyhow!(e))?;
        checked.push(CheckedDeliverable { from: from.to_owned(), name: name.clone(), sha256: want.clone() });
    }

    let unchecked = |why: String, result: String| LedgerCheck { checked: false, head: head.clone(), result, seq, why: Some(why) };
    let (ledger, verified) = match &daemon {
        DaemonAccess::At(c) => match c.get::<LedgerView>(&format!("/v1/tasks/{task}/ledger")).await {
            Ok(l) => {
                if !l.ok {
                    bail!("ledger of {task}: {}", l.problem.as_deref().unwrap_or("does not verify"));
                }
                match l.hashes.into_iter().find(|(at, _)| *at == seq).map(|(_, h)| h) {
                    Some(h) if h == head => (LedgerCheck { checked: true, head: head.clone(), result: "ledger checked".into(), seq, why: None }, true),
                    Some(h) => bail!("ledger of {task} at entry {seq} is {h}, the record names {head}"),
                    None => bail!("ledger of {task} has no entry {seq}, which the record names"),
                }
            }
            Err(e) => (unchecked(format!("{e:#}"), format!("ledger could not be checked: {e:#}")), false),
        },
        DaemonAccess::Unreachable(why) => (unchecked(why.clone(), format!("ledger could not be checked: {why}")), false),
        DaemonAccess::Offline => (unchecked("--offline".into(), "ledger not checked (--offline)".into()), true),
    };
    Ok(VerifyReport { deliverables: checked, key_id, ledger, record: record.display().to_string(), task, verified })
}

/// Why a record `verify` returned does not verify: its ledger could not
/// be checked and `--offline` did not accept that. `None` when it verifies.
pub fn unverified(v: &VerifyReport) -> Option<String> {
    if v.verified {
        return None;
    }
    Some(format!(
        "ledger of {} could not be checked: {}; the record does not verify without it (the signature and digests do; --offline --key PUBKEY accepts that)",
        v.task,
        v.ledger.why.as_deref().unwrap_or("?")
    ))
}

pub fn verify_summary(v: &VerifyReport) -> String {
    let (record, key) = (&v.record, &v.key_id);
    let mut lines = vec![if v.verified {
        format!("record {record} verified: signed by node key {key}")
    } else {
        format!("record {record} NOT verified: signed by node key {key}, but its ledger could not be checked")
    }];
    for d in &v.deliverables {
        lines.push(format!("  {} matches sha256:{} ({})", d.name, d.sha256, d.from));
    }
    let (l, task) = (&v.ledger, &v.task);
    let (seq, head) = (l.seq, &l.head);
    if l.checked {
        lines.push(format!("  ledger of {task} checked: it verifies and has head {head} at entry {seq}, as the record names"));
    } else if l.why.as_deref() == Some("--offline") {
        lines.push(format!("  ledger not checked (--offline): the record's signed checkpoint names entry {seq} of {task}, head {head}"));
    } else {
        // Why goes to stderr, as the error `cairn verify` ends with.
        lines.push(format!("  ledger of {task} could not be checked; the record's signed checkpoint names entry {seq}, head {head}"));
    }
    lines.join("\n")
}

#[derive(clap::Args, Debug)]
pub(crate) struct DeliverCli {
    pub(crate) task: String,
    /// A file in the sandbox, delivered as it is (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    pub(crate) files: Vec<String>,
    /// A directory in the sandbox, delivered as NAME.tar.zst.
    #[arg(long, value_name = "DIR")]
    pub(crate) archive: Option<String>,
    /// A unified diff of the workspace: `git diff` of the repository in the
    /// working directory, else the writable layer against the base image.
    #[arg(long)]
    pub(crate) patch: bool,
    /// A report file in the sandbox.
    #[arg(long, value_name = "PATH")]
    pub(crate) report: Option<String>,
    /// Also write the deliverables and record.json to this local directory.
    #[arg(long, value_name = "LOCALDIR")]
    pub(crate) out: Option<PathBuf>,
    /// Then complete the task (as `cairn task complete`).
    #[arg(long)]
    pub(crate) complete: bool,
}

/// `cairn deliver ID ...`.
pub(crate) async fn cli(client: &Client, a: DeliverCli, o: crate::verbs::Out) -> Result<u8> {
    let out = a.out.clone();
    let args = DeliverArgs {
        task: a.task,
        files: a.files,
        archive: a.archive,
        patch: a.patch,
        report: a.report,
        out: a.out,
        complete: a.complete,
    };
    let v = deliver(client, args).await?;
    o.print(&v, |v| delivery_summary(v, out.as_deref()));
    Ok(0)
}
