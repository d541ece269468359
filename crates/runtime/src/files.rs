//! `cairn cp`: tar streams in and out of a sandbox, resolved inside its root
//! by [`cairn_sandbox::files`] so no path in the sandbox reaches the host.
//!
//! Copying out answers a tar whose top entry is P's last component; copying
//! in unpacks a tar whose top entry is N: into P/N when P is a directory,
//! else as P.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cairn_api::files::Links;
use cairn_core::{EventKind, NewEvent};
use cairn_sandbox::files::{self, Kind, LinkPolicy, Owner, SandboxRoot};
use futures_util::Stream;
use serde_json::json;
use tokio::sync::mpsc;

use crate::runtime::Runtime;
use crate::Error;

fn file_error(e: cairn_sandbox::Error) -> Error {
    match &e {
        cairn_sandbox::Error::Io(_, io) if io.kind() == std::io::ErrorKind::NotFound => Error::not_found(e.to_string()),
        cairn_sandbox::Error::Io(what, io) if matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
            Error::NoSpace(format!("{what}: no space left on the task's disk (the partly written file was removed)"))
        }
        cairn_sandbox::Error::Io(..) | cairn_sandbox::Error::PathEscape(_) | cairn_sandbox::Error::Protocol(_) => {
            Error::invalid(e.to_string())
        }
        cairn_sandbox::Error::LinkOut(..) => Error::invalid(format!("{e}; copy with --follow-links or --keep-links")),
        _ => Error::from(e),
    }
}

/// Sends written bytes to the reader of the tar as they come.
struct ChannelWriter(mpsc::Sender<Result<Vec<u8>, std::io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.blocking_send(Ok(buf.to_vec())).map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn record(tasks: &Runtime, task: &cairn_core::TaskId, actor: &str, args: serde_json::Value, ok: bool, begun: Instant) {
    let ev = NewEvent {
        task: task.clone(),
        kind: EventKind::Cp,
        actor: actor.to_owned(),
        args,
        exit_code: Some(if ok { 0 } else { 1 }),
        duration_ms: Some(begun.elapsed().as_millis() as u64),
    };
    if let Err(e) = tasks.store.append_event(&ev).await {
        tracing::error!("recording cp: {e}");
    }
}

/// A sandbox path as a caller gave it (bytes, not always UTF-8), and as
/// messages and the task's log show it.
fn as_given(path: impl Into<OsString>) -> (OsString, String) {
    let raw = path.into();
    let shown = files::shown(&raw);
    (raw, shown)
}

/// A tar of a sandbox path, as a stream of chunks.
pub type TarStream = tokio_stream::wrappers::ReceiverStream<Result<Vec<u8>, std::io::Error>>;

/// What the sandbox's copy does with the links `links` names.
fn link_policy(links: Links) -> LinkPolicy {
    match links {
        Links::Refuse => LinkPolicy::Refuse,
        Links::Keep => LinkPolicy::Keep,
        Links::Follow => LinkPolicy::Follow,
    }
}

/// Resolves `path` in the sandbox, then streams it out as a tar; a bad path
/// is an error here, before any byte of the stream.
pub async fn download(tasks: Arc<Runtime>, id: &str, path: impl Into<OsString>, links: Links, actor: String) -> Result<TarStream, Error> {
    let begun = Instant::now();
    let (p, path) = as_given(path);
    let links = link_policy(links);
    let (task, live) = tasks.running(id, &actor).await?;
    let tid = task.id.to_string();
    let shown = path.clone();
    // Resolve first, so a bad path is a clean error status, not a broken body.
    let located = tasks.driver.run(move |driver| -> Result<_, cairn_sandbox::Error> {
        let root = SandboxRoot::new(driver.open_root(&tid, live.init)?);
        let l = root.locate(&p)?;
        if files::kind_at(&l.dir, &l.name)? == Kind::Missing {
            return Err(cairn_sandbox::Error::Io(
                format!("sandbox path {shown}"),
                files::in_the_sandbox(std::io::Error::from(std::io::ErrorKind::NotFound)),
            ));
        }
        files::check_links(&root, &l, Path::new(&l.name), links)?;
        Ok((root, l))
    })
    .await?;
    let located = match located {
        Ok(l) => l,
        Err(e) => {
            record(&tasks, &task.id, &actor, json!({"direction": "out", "path": path, "error": e.to_string()}), false, begun).await;
            return Err(file_error(e));
        }
    };
    let (tx, rx) = mpsc::channel(16);
    let (tasks2, tid) = (tasks.clone(), task.id.clone());
    tokio::spawn(async move {
        let (root, located) = located;
        let writer = ChannelWriter(tx.clone());
        let result = tokio::task::spawn_blocking(move || {
            let top = std::path::PathBuf::from(&located.name);
            files::write_tar(&root, &located, &top, links, writer)
        })
        .await;
        let (ok, mut args) = match result {
            Ok(Ok(n)) => (true, json!({ "entries": n })),
            Ok(Err(e)) => {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                (false, json!({ "error": e.to_string() }))
            }
            Err(e) => (false, json!({ "error": e.to_string() })),
        };
        args["direction"] = json!("out");
        args["path"] = json!(path);
        args["links"] = json!(links.as_str());
        record(&tasks2, &tid, &actor, args, ok, begun).await;
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Unpacks the tar read from `body` at `path` in the sandbox, its top entry
/// named `name`.
pub async fn upload<S, B>(tasks: Arc<Runtime>, id: &str, path: impl Into<OsString>, name: String, body: S, actor: String) -> Result<cairn_api::files::CopiedIn, Error>
where
    S: Stream<Item = Result<B, std::io::Error>> + Send + Unpin + 'static,
    B: bytes::Buf + Send + 'static,
{
    let begun = Instant::now();
    let (p, path) = as_given(path);
    let (task, live) = tasks.running(id, &actor).await?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Error::invalid(format!("invalid top-level name {name:?} for the copied tree")));
    }
    let tid = task.id.to_string();
    let owner = Owner { uid: live.ids.host_id(0), gid: live.ids.host_id(0) };
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(body));
    let result = tasks.driver.run(move |driver| -> Result<(u64, String), cairn_sandbox::Error> {
        let root = SandboxRoot::new(driver.open_root(&tid, live.init)?);
        let (n, at) = files::copy_in(&root, &p, OsStr::new(&name), reader, owner)?;
        Ok((n, files::shown(at.as_os_str())))
    })
    .await?;
    match result {
        Ok((n, resolved)) => {
            record(&tasks, &task.id, &actor, json!({"direction": "in", "path": path, "entries": n, "resolved": resolved}), true, begun).await;
            Ok(cairn_api::files::CopiedIn { entries: n, path: resolved })
        }
        Err(e) => {
            record(&tasks, &task.id, &actor, json!({"direction": "in", "path": path, "error": e.to_string()}), false, begun).await;
            Err(file_error(e))
        }
    }
}

/// Most entries [`list_dir`] answers; a larger directory is listed in part,
/// flagged `truncated`.
pub const MAX_LISTING: usize = 10_000;

/// The entries of the sandbox directory `path`, resolved inside the sandbox
/// (symlinks on the way followed there, never out of it).
pub async fn list_dir(tasks: Arc<Runtime>, id: &str, path: impl Into<OsString>, actor: String) -> Result<cairn_api::files::DirListing, Error> {
    use cairn_api::files::{DirEntry, DirListing, EntryKind};
    use cairn_core::name::{bytes_if_not_utf8, escaped};
    let (raw, path) = as_given(path);
    let (task, live) = tasks.running(id, &actor).await?;
    let tid = task.id.to_string();
    let listed = tasks.driver.run(move |driver| -> Result<_, cairn_sandbox::Error> {
        let root = SandboxRoot::new(driver.open_root(&tid, live.init)?);
        let (dir, resolved) = root.resolve(&raw)?;
        let (entries, truncated) = files::list_dir(&dir, MAX_LISTING).map_err(|e| match e {
            cairn_sandbox::Error::Io(_, io) => cairn_sandbox::Error::Io(format!("sandbox path {path}"), files::in_the_sandbox(io)),
            e => e,
        })?;
        Ok((resolved, entries, truncated))
    })
    .await?
    .map_err(file_error)?;
    let (resolved, entries, truncated) = listed;
    let shown = |s: &OsStr| escaped(s.as_bytes()).into_owned();
    let entries = entries
        .into_iter()
        .map(|e| DirEntry {
            name: shown(&e.name),
            name_b64: bytes_if_not_utf8(e.name.as_bytes()),
            kind: match e.kind {
                Kind::File => EntryKind::File,
                Kind::Dir => EntryKind::Dir,
                Kind::Symlink => EntryKind::Symlink,
                Kind::Other | Kind::Missing => EntryKind::Other,
            },
            size: e.size,
            mode: e.mode,
            mtime_ms: e.mtime_ms,
            target: e.link_target.as_deref().map(shown),
        })
        .collect();
    let path_b64 = bytes_if_not_utf8(resolved.as_os_str().as_bytes());
    Ok(DirListing { path: shown(resolved.as_os_str()), path_b64, entries, truncated })
}

/// Most bytes [`read_one`] returns and [`write_one`] takes: larger files
/// go through a tar ([`download`], [`upload`]).
pub const MAX_FILE: u64 = 64 << 20;

/// One regular file of the sandbox, whole (a final symlink is refused, not
/// followed; so is anything but a regular file, or one over [`MAX_FILE`]).
pub async fn read_one(tasks: Arc<Runtime>, id: &str, path: impl Into<OsString>, actor: String) -> Result<Vec<u8>, Error> {
    let begun = Instant::now();
    let (raw, path) = as_given(path);
    let (task, live) = tasks.running(id, &actor).await?;
    let (tid, p) = (task.id.to_string(), path.clone());
    let result = tasks.driver.run(move |driver| -> Result<Vec<u8>, cairn_sandbox::Error> {
        let root = SandboxRoot::new(driver.open_root(&tid, live.init)?);
        let l = root.locate(&raw)?;
        // Named for the message only: a swap after this check is still
        // refused by the read itself (no symlink followed, fstat'd type).
        let refuse = |why: &str| cairn_sandbox::Error::Io(format!("sandbox path {p}"), std::io::Error::other(why.to_owned()));
        match files::kind_at(&l.dir, &l.name)? {
            Kind::Missing => return Err(cairn_sandbox::Error::Io(format!("sandbox path {p}"), files::in_the_sandbox(std::io::Error::from(std::io::ErrorKind::NotFound)))),
            Kind::Symlink => return Err(refuse("is a symlink, which is not followed; read the file it points to")),
            Kind::Dir => return Err(refuse("is a directory; copy it with cairn cp")),
            Kind::Other => return Err(refuse("is not a regular file")),
            Kind::File => {}
        }
        // One byte over the limit tells a file at the limit from a larger one.
        let data = files::read_file(&l.dir, &l.name, MAX_FILE + 1)?;
        if data.len() as u64 > MAX_FILE {
            return Err(cairn_sandbox::Error::Io(format!("sandbox path {p}"), std::io::Error::other(format!("larger than {MAX_FILE} bytes; copy it with cairn cp"))));
        }
        Ok(data)
    })
    .await?;
    let args = match &result {
        Ok(d) => json!({ "direction": "out", "path": path, "bytes": d.len(), "single_file": true }),
        Err(e) => json!({ "direction": "out", "path": path, "error": e.to_string(), "single_file": true }),
    };
    record(&tasks, &task.id, &actor, args, result.is_ok(), begun).await;
    result.map_err(file_error)
}

/// Writes `data` as the regular file at sandbox path `path` (made, or
/// replaced when it is a regular file), owned by the sandbox's root; its
/// missing directories are made, as `mkdir -p` would; answers the path as
/// shown. Written through the same descriptor-relative
/// unpacking as `cp` in.
pub async fn write_one(tasks: Arc<Runtime>, id: &str, path: impl Into<OsString>, data: bytes::Bytes, actor: String) -> Result<String, Error> {
    let begun = Instant::now();
    let (raw, path) = as_given(path);
    if data.len() as u64 > MAX_FILE {
        return Err(Error::TooLarge(format!("the file is {} bytes; the limit is {MAX_FILE} (copy larger ones with cairn cp)", data.len())));
    }
    let (task, live) = tasks.running(id, &actor).await?;
    let name = match raw.as_bytes().rsplit(|b| *b == b'/').next() {
        Some(n) if !n.is_empty() && n != b"." && n != b".." => OsStr::from_bytes(n).to_owned(),
        _ => return Err(Error::invalid(format!("path {path:?} does not name a file"))),
    };
    let (tid, p) = (task.id.to_string(), path.clone());
    let owner = Owner { uid: live.ids.host_id(0), gid: live.ids.host_id(0) };
    let len = data.len();
    let result = tasks.driver.run(move |driver| -> Result<(), cairn_sandbox::Error> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_mtime(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0));
        let mut tar = tar::Builder::new(Vec::with_capacity(data.len() + 1024));
        tar.append_data(&mut header, &name, &data[..]).map_err(|e| cairn_sandbox::Error::Io("tar of one file".into(), e))?;
        let tar = tar.into_inner().map_err(|e| cairn_sandbox::Error::Io("tar of one file".into(), e))?;
        let root = SandboxRoot::new(driver.open_root(&tid, live.init)?);
        root.make_parents(&raw, owner)?;
        // A path that is a directory would receive the file inside it:
        // refused, the caller named a file.
        let l = root.locate(&raw)?;
        let refuse = |why: &str| cairn_sandbox::Error::Io(format!("sandbox path {p}"), std::io::Error::other(why.to_owned()));
        match files::kind_at(&l.dir, &l.name)? {
            Kind::Dir => return Err(refuse("is a directory; name a file")),
            Kind::Symlink => return Err(refuse("is a symlink, which is not followed; write the file it points to")),
            Kind::Other => return Err(refuse("is not a regular file")),
            Kind::File | Kind::Missing => {}
        }
        files::copy_in(&root, &raw, &name, &tar[..], owner).map(drop)
    })
    .await?;
    let args = match &result {
        Ok(()) => json!({ "direction": "in", "path": path, "bytes": len, "single_file": true }),
        Err(e) => json!({ "direction": "in", "path": path, "error": e.to_string(), "single_file": true }),
    };
    record(&tasks, &task.id, &actor, args, result.is_ok(), begun).await;
    result.map(|()| path).map_err(file_error)
}
