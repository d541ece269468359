//! Delivery: what a task made, copied out of its sandbox into the blob
//! store (each deliverable whole, keyed by its SHA-256), a signed record of
//! it, and the teardown that completes the task.
//!
//! The record is an in-toto Statement v1 whose subjects are the
//! deliverables and whose predicate names the task, its image, its
//! snapshot chain, the ledger head and its signed checkpoint, the egress
//! policy (with the secrets its requests used, by name, and the hosts they
//! went to) and the times; it is signed by the node key in a DSSE envelope.

pub mod patch;

use std::ffi::OsStr;
use std::path::Path;
use std::time::Instant;

use cairn_blob::Kind;
use cairn_core::{EventKind, NewEvent, Task};
use cairn_sandbox::files::{self, SandboxRoot};
use cairn_sandbox::proto::{self, ExecRequest, Reply};
use cairn_sandbox::SandboxDriver;
use cairn_store::now_ms;
use serde_json::{json, Value};
use cairn_ledger::sha256_hex;

use crate::runtime::{Live, TaskView, Runtime};
use crate::snapshot::blob_error;
use crate::Error;

/// Largest single deliverable: it is held in memory while it is hashed
/// and stored.
pub const MAX_DELIVERABLE: u64 = 1 << 30;
/// What the record's predicate is.
pub const PREDICATE_TYPE: &str = "https://cairn.dev/delivery/v1";
/// The DSSE payload type of an in-toto statement.
use cairn_ledger::{Statement, Subject, PAYLOAD_TYPE as STATEMENT_PAYLOAD_TYPE};

pub use cairn_api::deliver::{DeliverRequest, Deliverable, DeliveryView, RecordVerdict};

fn file_error(what: &str, e: cairn_sandbox::Error) -> Error {
    match &e {
        cairn_sandbox::Error::Io(_, io) if io.kind() == std::io::ErrorKind::NotFound => Error::not_found(format!("{what}: no such file in the sandbox")),
        cairn_sandbox::Error::PathEscape(_) => Error::invalid(format!("{what}: the path leaves the sandbox root")),
        _ => Error::invalid(format!("{what}: {e}")),
    }
}

fn base_name(path: &str) -> Result<String, Error> {
    Path::new(path)
        .file_name()
        .and_then(OsStr::to_str)
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .map(str::to_owned)
        .ok_or_else(|| Error::invalid(format!("{path:?} does not name a file")))
}

/// Reads the deliverables named by paths, in the blocking pool.
fn collect_from_sandbox(driver: &dyn SandboxDriver, task: &str, live: Live, req: &DeliverRequest) -> Result<Vec<(Deliverable, Vec<u8>)>, Error> {
    let root = SandboxRoot::new(driver.open_root(task, live.init)?);
    let mut out = Vec::new();
    let read = |path: &str, kind: &str| -> Result<(Deliverable, Vec<u8>), Error> {
        let what = format!("--{} {path}", if kind == "report" { "report" } else { "file" });
        let l = root.locate(path).map_err(|e| file_error(&what, e))?;
        let data = files::read_file(&l.dir, &l.name, MAX_DELIVERABLE).map_err(|e| file_error(&what, e))?;
        let d = Deliverable { name: base_name(path)?, kind: kind.into(), source: path.into(), sha256: sha256_hex(&data), size: data.len() as u64 };
        Ok((d, data))
    };
    for f in &req.files {
        out.push(read(f, "file")?);
    }
    if let Some(r) = &req.report {
        out.push(read(r, "report")?);
    }
    if let Some(dir) = &req.archive {
        let what = format!("--archive {dir}");
        let l = root.locate(dir).map_err(|e| file_error(&what, e))?;
        match files::kind_at(&l.dir, &l.name).map_err(|e| file_error(&what, e))? {
            files::Kind::Dir => {}
            files::Kind::Missing => return Err(Error::not_found(format!("{what}: no such directory in the sandbox"))),
            _ => return Err(Error::invalid(format!("{what}: not a directory"))),
        }
        let mut enc = zstd::Encoder::new(Vec::new(), 3).map_err(|e| Error::internal_from(e).context("zstd"))?;
        files::write_tar(&root, &l, Path::new(&l.name), files::LinkPolicy::Keep, &mut enc).map_err(|e| file_error(&what, e))?;
        let data = enc.finish().map_err(|e| Error::internal_from(e).context("zstd"))?;
        if data.len() as u64 > MAX_DELIVERABLE {
            return Err(Error::invalid(format!("{what}: the archive is over the {MAX_DELIVERABLE}-byte limit")));
        }
        let name = format!("{}.tar.zst", l.name.to_string_lossy());
        out.push((Deliverable { name, kind: "archive".into(), source: dir.clone(), sha256: sha256_hex(&data), size: data.len() as u64 }, data));
    }
    Ok(out)
}

impl Runtime {
    /// Runs a command in the sandbox; returns (exit code, stdout, stderr).
    async fn capture(&self, task: &Task, argv: Vec<String>) -> Result<(i32, Vec<u8>, Vec<u8>), Error> {
        let env = crate::exec::environment(&task.config, &[], task.id.as_str(), false, None)?;
        let req = ExecRequest { argv, env, cwd: "/".into(), tty: None, user: None };
        let tid = task.id.to_string();
        self.driver.run(move |driver| -> Result<(i32, Vec<u8>, Vec<u8>), Error> {
            use std::io::{Read, Seek};
            use std::os::fd::AsRawFd;
            let io = |e: std::io::Error| Error::internal_from(e).context("capture output");
            let (mut out, mut err) = (tempfile::tempfile().map_err(io)?, tempfile::tempfile().map_err(io)?);
            let null = std::fs::File::open("/dev/null").map_err(io)?;
            let code = match driver.exec(&tid, &req, &[null.as_raw_fd(), out.as_raw_fd(), err.as_raw_fd()])? {
                Ok(running) => match proto::recv::<Reply>(&running.conn)? {
                    Some((Reply::Exited { code, signal }, _)) => code.unwrap_or(128 + signal.unwrap_or(0)),
                    other => return Err(Error::internal(format!("unexpected answer from the sandbox: {other:?}"))),
                },
                Err(message) => return Err(Error::internal(message)),
            };
            let (mut o, mut e) = (Vec::new(), Vec::new());
            out.rewind().map_err(io)?;
            out.read_to_end(&mut o).map_err(io)?;
            err.rewind().map_err(io)?;
            err.read_to_end(&mut e).map_err(io)?;
            Ok((code, o, e))
        })
        .await?
    }

    /// The workspace patch: git's view when the working directory is in a
    /// repository, else the writable layer against the base image.
    async fn workspace_patch(&self, task: &Task) -> Result<(Deliverable, Vec<u8>), Error> {
        let argv = vec!["sh".into(), "-c".into(), patch::GIT_DIFF.into(), "cairn-patch".into(), task.config.workdir.clone()];
        let (code, out, err) = self.capture(task, argv).await?;
        let (data, source) = match code {
            0 => (out, format!("git diff in {}", task.config.workdir)),
            3 => {
                let image = self.image(&task.config.image).await?;
                let disk = self.driver.layers(task.id.as_str(), task.config.isolation).await?;
                let layers: Vec<patch::LayerDirs> = image.layers().iter().map(|l| patch::LayerDirs::of(&*disk, l)).collect();
                let diff = tokio::task::spawn_blocking(move || patch::layer_diff(&layers))
                    .await?
                    .map_err(|e| Error::internal_from(e).context("diff of the writable layer"))?;
                (diff.into_bytes(), "writable layer against the base image".to_owned())
            }
            _ => return Err(Error::internal(format!("git diff failed (exit {code}): {}", String::from_utf8_lossy(&err).trim()))),
        };
        let d = Deliverable { name: "workspace.patch".into(), kind: "patch".into(), source, sha256: sha256_hex(&data), size: data.len() as u64 };
        Ok((d, data))
    }

    /// Copies the deliverables out, stores them and a signed record;
    /// completes the task if asked.
    pub async fn deliver_outputs(&self, id_or_name: &str, req: DeliverRequest, actor: &str) -> Result<DeliveryView, Error> {
        let begun = Instant::now();
        if req.files.is_empty() && req.archive.is_none() && !req.patch && req.report.is_none() {
            return Err(Error::invalid("nothing to deliver: give --file, --archive, --patch or --report"));
        }
        for p in req.files.iter().chain(req.archive.iter()).chain(req.report.iter()) {
            if p.trim().is_empty() || p.contains('\0') {
                return Err(Error::invalid(format!("invalid sandbox path {p:?}")));
            }
        }
        let (task, live) = self.running(id_or_name, actor).await?;
        let lock = self.lock_of(&task.id);
        let guard = lock.lock().await;
        let mut items = Vec::new();
        if req.patch {
            items.push(self.workspace_patch(&task).await?);
        }
        let tid = task.id.to_string();
        let req2 = DeliverRequest { files: req.files.clone(), archive: req.archive.clone(), patch: false, report: req.report.clone(), complete: false };
        items.extend(self.driver.run(move |driver| collect_from_sandbox(driver, &tid, live, &req2)).await??);
        let mut names = std::collections::HashSet::new();
        for (d, _) in &items {
            if !names.insert(d.name.clone()) {
                return Err(Error::invalid(format!("two deliverables are named {}; deliver them separately", d.name)));
            }
        }

        // Content first: a record never names what the store lacks.
        let backend = self.snaps.repo.backend().clone();
        let stored: Vec<(Deliverable, Vec<u8>)> = items;
        let deliverables: Vec<Deliverable> = stored.iter().map(|(d, _)| d.clone()).collect();
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            for (d, data) in stored {
                if !backend.exists(Kind::Deliverable, &d.sha256).map_err(blob_error)? {
                    backend.write(Kind::Deliverable, &d.sha256, data.into()).map_err(blob_error)?;
                }
            }
            Ok(())
        })
        .await??;

        fail::fail_point!("deliver.content_stored");
        let checkpoint = self.checkpoint(&task.id, actor).await?;
        let snapshots = self.store.snapshots(&task.id).await?;
        let chain: Vec<Value> = snapshots
            .iter()
            .rev()
            .map(|s| json!({ "id": s.id, "parent": s.parent, "kind": s.kind, "healthy": s.healthy, "step": s.step, "created_ms": s.created_ms, "manifest": s.manifest }))
            .collect();
        let now = now_ms();
        let subjects = deliverables.iter().map(|d| Subject::sha256(&d.name, &d.sha256)).collect();
        let predicate = json!({
            "task": { "id": task.id, "name": task.name, "step": task.step, "memory": task.memory },
            "image": task.config.image,
            "snapshots": chain,
            "ledger": { "seq": checkpoint.seq, "head": checkpoint.head, "checkpoint": checkpoint.envelope },
            "egress": {
                "allow": task.config.egress.allow,
                "deny": task.config.egress.deny,
                "rules": task.config.egress.rules,
                "inject": task.config.egress.inject,
                "secrets_used": self.secrets_used(&task.id).await?,
            },
            "deliverables": deliverables,
            "times": { "created_ms": task.created_ms, "delivered_ms": now },
            "node": { "key_id": checkpoint.key_id, "daemon": env!("CARGO_PKG_VERSION") },
        });
        let payload = Statement::new(subjects, PREDICATE_TYPE, predicate).to_payload();
        let envelope = self.sign_envelope(STATEMENT_PAYLOAD_TYPE, &payload);
        let record = serde_json::to_value(&envelope).map_err(Error::internal_from)?;
        let mut record_bytes = serde_json::to_vec_pretty(&record).map_err(Error::internal_from)?;
        record_bytes.push(b'\n');
        let record_id = sha256_hex(&record_bytes);
        let backend = self.snaps.repo.backend().clone();
        let rid = record_id.clone();
        tokio::task::spawn_blocking(move || backend.write(Kind::Record, &rid, record_bytes.into())).await?.map_err(blob_error)?;
        fail::fail_point!("deliver.record_stored");
        self.store
            .append_event(&NewEvent {
                task: task.id.clone(),
                kind: EventKind::Delivery,
                actor: actor.to_owned(),
                args: json!({ "request": req, "record_id": record_id, "deliverables": deliverables, "ledger_seq": checkpoint.seq, "ledger_head": checkpoint.head }),
                exit_code: Some(0),
                duration_ms: Some(begun.elapsed().as_millis() as u64),
            })
            .await?;
        fail::fail_point!("deliver.recorded");
        drop(guard);
        let completed = if req.complete {
            self.complete(task.id.as_str(), actor).await?;
            true
        } else {
            false
        };
        Ok(DeliveryView { task: task.id, record_id, record, deliverables, ledger_seq: checkpoint.seq, ledger_head: checkpoint.head, completed })
    }

    /// The secrets the proxy put into this task's requests, by name, each
    /// with the hosts they went to and how many requests carried it (from
    /// the decision log; never a value).
    async fn secrets_used(&self, task: &cairn_core::TaskId) -> Result<Vec<Value>, Error> {
        let mut used: std::collections::BTreeMap<String, (std::collections::BTreeSet<String>, u64)> = Default::default();
        for e in self.store.events(task).await?.into_iter().filter(|e| e.kind == EventKind::Egress) {
            let Ok(a) = serde_json::from_value::<cairn_egress::Attempt>(e.args) else { continue };
            if !a.allowed {
                continue;
            }
            for name in a.secrets {
                let entry = used.entry(name).or_default();
                entry.0.insert(a.host.clone());
                entry.1 += 1;
            }
        }
        Ok(used.into_iter().map(|(name, (hosts, requests))| json!({ "name": name, "hosts": hosts, "requests": requests })).collect())
    }

    /// Deliverables no record names and older than `grace`: left by a
    /// delivery cut short between storing its content and its record.
    /// Removed unless `dry_run`; records, and what they name, always stay.
    pub(crate) async fn gc_deliverables(&self, grace: std::time::Duration, dry_run: bool) -> Result<Vec<String>, Error> {
        let backend = self.snaps.repo.backend().clone();
        tokio::task::spawn_blocking(move || -> Result<Vec<String>, Error> {
            let mut named = std::collections::HashSet::new();
            for info in backend.list(Kind::Record).map_err(blob_error)? {
                let bytes = backend.read(Kind::Record, &info.id).map_err(blob_error)?;
                let statement = serde_json::from_slice::<cairn_ledger::Envelope>(&bytes)
                    .ok()
                    .and_then(|e| e.payload().ok())
                    .and_then(|p| Statement::from_payload(&p).ok())
                    .ok_or_else(|| Error::internal(format!("gc stopped, no deliverable deleted: record {} is unreadable", info.id)))?;
                named.extend(statement.subject.into_iter().filter_map(|s| s.digest.get("sha256").cloned()));
            }
            let now = std::time::SystemTime::now();
            let mut orphans = Vec::new();
            for info in backend.list(Kind::Deliverable).map_err(blob_error)? {
                let young = now.duration_since(info.modified).map(|age| age < grace).unwrap_or(true);
                if named.contains(&info.id) || young {
                    continue;
                }
                if !dry_run {
                    backend.delete(Kind::Deliverable, &info.id).map_err(blob_error)?;
                }
                orphans.push(info.id);
            }
            Ok(orphans)
        })
        .await?
    }

    /// A deliverable's bytes, by SHA-256.
    pub async fn deliverable(&self, sha256: &str) -> Result<bytes::Bytes, Error> {
        self.stored_object(Kind::Deliverable, sha256).await
    }

    /// A delivery record's bytes, by the SHA-256 of those bytes.
    pub async fn record(&self, id: &str) -> Result<bytes::Bytes, Error> {
        self.stored_object(Kind::Record, id).await
    }

    /// Checks a stored record as `cairn verify` does, from the store
    /// alone: its signature (with every key of the cluster), each
    /// deliverable against its digest, its signed checkpoint, and the
    /// task's ledger at that entry. A record that does not verify is an
    /// answer, with the first check that failed; only a record that is
    /// not there is an error.
    pub async fn verify_record(&self, id: &str) -> Result<RecordVerdict, Error> {
        let text = self.record(id).await?;
        let keys = self.verifying_keys().await?;
        let mut verdict = RecordVerdict {
            record: id.to_owned(),
            verified: false,
            problem: None,
            task: None,
            key_id: None,
            deliverables: Vec::new(),
            ledger_seq: None,
            ledger_head: None,
            predicate: None,
        };
        let opened = match cairn_ledger::record::open_record(&text, &format!("record {id}"), &keys) {
            Ok(o) => o,
            Err(problem) => return Ok(RecordVerdict { problem: Some(problem), ..verdict }),
        };
        verdict.task = Some(opened.task.clone());
        verdict.key_id = Some(opened.key_id.clone());
        verdict.deliverables = opened.deliverables.clone();
        verdict.ledger_seq = Some(opened.seq);
        verdict.ledger_head = Some(opened.head.clone());
        verdict.predicate = Some(opened.predicate.clone());
        verdict.problem = self.check_opened(&opened).await.err();
        verdict.verified = verdict.problem.is_none();
        Ok(verdict)
    }

    /// What an opened record names, against the store: its deliverables
    /// and the task's ledger.
    async fn check_opened(&self, opened: &cairn_ledger::record::OpenedRecord) -> Result<(), String> {
        for (name, want) in &opened.deliverables {
            let data = self.deliverable(want).await.map_err(|e| format!("deliverable {name}: {e}"))?;
            cairn_ledger::record::check_deliverable(name, want, &data, "from the store")?;
        }
        let task = &opened.task;
        let ledger = self.ledger_report(task).await.map_err(|e| format!("ledger of {task}: {e}"))?;
        if !ledger.ok {
            return Err(format!("ledger of {task}: {}", ledger.problem.as_deref().unwrap_or("does not verify")));
        }
        match ledger.hashes.into_iter().find(|(at, _)| *at == opened.seq).map(|(_, h)| h) {
            Some(h) if h == opened.head => Ok(()),
            Some(h) => Err(format!("ledger of {task} at entry {} is {h}, the record names {}", opened.seq, opened.head)),
            None => Err(format!("ledger of {task} has no entry {}, which the record names", opened.seq)),
        }
    }

    async fn stored_object(&self, kind: Kind, id: &str) -> Result<bytes::Bytes, Error> {
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!("{id:?} is not a SHA-256 digest (64 hex digits)")));
        }
        let backend = self.snaps.repo.backend().clone();
        let id2 = id.to_ascii_lowercase();
        match tokio::task::spawn_blocking(move || backend.read(kind, &id2)).await? {
            Ok(b) => Ok(b),
            Err(cairn_blob::Error::Missing(..)) => Err(Error::not_found(format!("no {} {id} in the store", kind.dir().trim_end_matches('s')))),
            Err(e) => Err(blob_error(e)),
        }
    }

    /// `running | suspended | created -> completed`: the sandbox and its
    /// scratch space go, retention applies to the snapshots; the records,
    /// the ledger and the deliverables stay.
    pub async fn complete(&self, id_or_name: &str, actor: &str) -> Result<TaskView, Error> {
        let task = self.find(id_or_name).await?;
        let lock = self.lock_of(&task.id);
        let _guard = lock.lock().await;
        let task = self.find(task.id.as_str()).await?;
        task.state.complete()?;
        let begun = Instant::now();
        let result = self.end_sandbox(&task, cairn_core::Transition::Complete).await?;
        let mut args = json!({});
        let mut code = 0;
        match &result {
            Ok(()) => {
                let expired = self.apply_retention(&task.id, false).await?;
                args["expired_snapshots"] = json!(expired.iter().map(|s| s.id.clone()).collect::<Vec<_>>());
            }
            Err(e) => {
                code = 1;
                args["error"] = json!(e.to_string());
            }
        }
        self.store
            .append_event(&NewEvent {
                task: task.id.clone(),
                kind: EventKind::Complete,
                actor: actor.to_owned(),
                args,
                exit_code: Some(code),
                duration_ms: Some(begun.elapsed().as_millis() as u64),
            })
            .await?;
        result.map_err(|e| Error::internal_from(e).context(&format!("teardown of {} failed", task.id)))?;
        Ok(self.view(self.find(task.id.as_str()).await?))
    }
}
