//! `cairn cp`: files and directories in and out of a sandbox, as tar
//! streams. `ID:PATH` names a path in a task's sandbox; the other side is
//! local. A destination that is an existing directory receives the source
//! inside it, by its own name; otherwise the source is copied as the
//! destination.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use cairn_api::files::CopiedIn;
use cairn_api::tasks::TaskView;
use cairn_core::{Event, EventKind, TaskState};
use reqwest::Method;
use serde::Serialize;

use crate::client::{error_message, query_escape, Answer, Client};

/// `ID:PATH` or a local path.
#[derive(Debug, PartialEq, Eq)]
pub enum Endpoint {
    Sandbox { task: String, path: String },
    Local(PathBuf),
}

pub fn parse_endpoint(s: &str) -> Endpoint {
    // A local path may contain ':' too; only `NAME:/abs` counts as remote.
    if let Some((task, path)) = s.split_once(':') {
        if !task.is_empty() && !task.contains('/') && path.starts_with('/') {
            return Endpoint::Sandbox { task: task.to_owned(), path: path.to_owned() };
        }
    }
    Endpoint::Local(PathBuf::from(s))
}

/// What copying out does with a symlink that is absolute or leads out of
/// the copied tree.
pub use cairn_api::files::Links;

/// What a copy did: for `--json`, what this side counted of a copy out,
/// or the daemon's answer to a copy in.
#[derive(Debug)]
pub enum Copied {
    Out(CopiedOut),
    In(Answer<CopiedIn>),
}

impl Copied {
    /// The JSON `cairn --json cp` prints.
    pub fn json(&self) -> String {
        match self {
            Copied::Out(c) => serde_json::to_string_pretty(c),
            Copied::In(a) => serde_json::to_string_pretty(&a.raw),
        }
        .unwrap_or_default()
    }
}

/// A copy out of a sandbox, as unpacked here. The fields are in the
/// order `--json` has always printed them in.
#[derive(Debug, Serialize)]
pub struct CopiedOut {
    /// Bytes of the tar stream.
    pub bytes: u64,
    /// Entries unpacked.
    pub entries: u64,
    /// The local destination as given.
    pub to: PathBuf,
}

/// A failed copy said from the side it failed on: the daemon's `sandbox
/// path P: why` becomes `cannot copy TASK:P: why`.
fn copy_error(task: &str, e: anyhow::Error) -> anyhow::Error {
    let msg = format!("{e:#}");
    match msg.strip_prefix("sandbox path ") {
        Some(rest) => anyhow!("cannot copy {task}:{rest}"),
        None => e,
    }
}

pub async fn run(client: &Client, src: &str, dst: &str, links: Links) -> Result<Copied> {
    match (parse_endpoint(src), parse_endpoint(dst)) {
        (Endpoint::Sandbox { task, path }, Endpoint::Local(local)) => {
            Ok(Copied::Out(download(client, &task, &path, &local, links).await.map_err(|e| copy_error(&task, e))?))
        }
        (Endpoint::Local(_), Endpoint::Sandbox { .. }) if links != Links::Refuse => {
            bail!("--follow-links and --keep-links apply to copies out of a sandbox")
        }
        (Endpoint::Local(local), Endpoint::Sandbox { task, path }) => {
            Ok(Copied::In(upload(client, &local, &task, &path).await.map_err(|e| copy_error(&task, e))?))
        }
        (Endpoint::Local(_), Endpoint::Local(_)) => {
            bail!("one side of `cairn cp` must be in a sandbox, written ID:/absolute/path")
        }
        (Endpoint::Sandbox { .. }, Endpoint::Sandbox { .. }) => bail!("copying between two sandboxes is not supported; copy through a local directory"),
    }
}

async fn download(client: &Client, task: &str, path: &str, local: &Path, links: Links) -> Result<CopiedOut> {
    // With a second of slack for the daemon's clock, to tell this copy's
    // log entry from earlier ones.
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64) - 1000;
    let req = client.request(Method::GET, &format!("/v1/tasks/{task}/files?path={}&links={}", query_escape(path), links.as_str()));
    let resp = req.send().await.map_err(|e| client.connect_error(e))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        bail!("{}", error_message(status, &body));
    }
    let (into, rename) = match std::fs::metadata(local) {
        Ok(m) if m.is_dir() => (local.to_owned(), None),
        _ => {
            let parent = local.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !parent.is_dir() {
                bail!("local directory {} does not exist", parent.display());
            }
            let name = local.file_name().ok_or_else(|| anyhow!("invalid local destination {}", local.display()))?;
            (parent.to_owned(), Some(name.to_owned()))
        }
    };
    // Collect the stream into a temporary file, then unpack it.
    let mut tmp = tempfile::tempfile().context("temporary file for the download")?;
    let mut stream = resp.bytes_stream();
    let mut bytes = 0u64;
    let progress = crate::progress::Progress::new("copy out");
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => bail!("{}", broken_download_reason(client, task, path, started_ms).await.unwrap_or_else(|| format!("download broke off: {e}"))),
        };
        bytes += chunk.len() as u64;
        progress.update(bytes, None);
        tmp.write_all(&chunk)?;
    }
    progress.finish(bytes);
    use std::io::Seek;
    tmp.rewind()?;
    let entries = unpack_local(tmp, &into, rename.as_deref(), links)?;
    Ok(CopiedOut { bytes, entries, to: local.to_owned() })
}

/// Why the daemon cut a copy out short: a stream that has started cannot
/// change its status, so the reason is read from the task's log, where the
/// daemon records every copy with its error (just after the stream ends).
async fn broken_download_reason(client: &Client, task: &str, path: &str, since_ms: i64) -> Option<String> {
    for _ in 0..20 {
        let events: Vec<Event> = client.get(&format!("/v1/tasks/{task}/events")).await.ok()?;
        // A copy's arguments are free-form JSON in the log, as each kind of
        // entry records its own.
        let last = events.iter().rev().find(|e| e.kind == EventKind::Cp && e.args["direction"] == "out" && e.args["path"] == path && e.time_ms >= since_ms);
        if let Some(error) = last.and_then(|e| e.args["error"].as_str()) {
            return Some(format!("copy out of {path} stopped: {error}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    None
}

/// Unpacks a tar from the daemon under `into`, renaming its top entry.
/// Every path must be plain relative components, nothing is written
/// through a symlink, and unless links are kept no link that is absolute or
/// leads out of the copied tree is created (the daemon refuses those too;
/// this holds even if one appeared in the sandbox while it was copying).
/// A copy that fails leaves nothing of itself: what it made is removed
/// (a top entry that was there before keeps what it had, less the file
/// that could not be written whole).
fn unpack_local(file: std::fs::File, into: &Path, rename: Option<&std::ffi::OsStr>, links: Links) -> Result<u64> {
    let mut made_top: Option<PathBuf> = None;
    let mut writing: Option<PathBuf> = None;
    let result = unpack_entries(file, into, rename, links, &mut made_top, &mut writing);
    let Err(e) = result else { return result };
    if let Some(top) = made_top {
        let _ = match std::fs::symlink_metadata(&top) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&top),
            Ok(_) => std::fs::remove_file(&top),
            Err(_) => Ok(()),
        };
    } else if let Some(partial) = writing.filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())) {
        let _ = std::fs::remove_file(partial);
    }
    let full = e.chain().any(|c| c.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error).is_some_and(|n| n == libc::ENOSPC || n == libc::EDQUOT));
    if full {
        let to = rename.map_or_else(|| into.to_owned(), |r| into.join(r));
        bail!("cannot copy to {}: no space left on its filesystem (what this copy had written was removed)", to.display());
    }
    Err(e)
}

fn unpack_entries(
    file: std::fs::File,
    into: &Path,
    rename: Option<&std::ffi::OsStr>,
    links: Links,
    made_top: &mut Option<PathBuf>,
    writing: &mut Option<PathBuf>,
) -> Result<u64> {
    let mut archive = tar::Archive::new(file);
    let mut n = 0;
    let mut first = true;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let mut comps = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(x) => comps.push(x.to_owned()),
                Component::CurDir => {}
                _ => bail!("refusing tar entry {}", path.display()),
            }
        }
        if comps.is_empty() {
            continue;
        }
        if links != Links::Keep && entry.header().entry_type() == tar::EntryType::Symlink {
            let target = entry.link_name()?.map(|t| t.into_owned()).unwrap_or_default();
            if leaves_tree(comps.len(), &target) {
                bail!("symlink {} -> {} leads out of the copied tree; copy with --follow-links or --keep-links", path.display(), target.display());
            }
        }
        if let Some(r) = rename {
            comps[0] = r.to_owned();
        }
        let mut dest = into.to_owned();
        for (i, c) in comps.iter().enumerate() {
            dest.push(c);
            if i + 1 < comps.len() && std::fs::symlink_metadata(&dest).map(|m| m.file_type().is_symlink()).unwrap_or(false) {
                bail!("refusing to write through symlink {}", dest.display());
            }
        }
        entry.set_preserve_permissions(true);
        // Modes as the sandbox had them, but never a set-id bit: here it
        // would be a privilege on the host (the copy belongs to whoever runs
        // this, root included).
        entry.set_mask(0o6000);
        if std::mem::take(&mut first) {
            let top = into.join(&comps[0]);
            if std::fs::symlink_metadata(&top).is_err() {
                *made_top = Some(top);
            }
        }
        *writing = Some(dest.clone());
        entry.unpack(&dest).with_context(|| format!("writing {}", dest.display()))?;
        n += 1;
    }
    Ok(n)
}

/// Whether a link `depth` components deep in the copied tree (the top is 1)
/// whose target is `target` is absolute or climbs above the tree's top.
fn leaves_tree(depth: usize, target: &Path) -> bool {
    let mut level = depth as isize - 2;
    if target.is_absolute() || level < 0 {
        return true;
    }
    for c in target.components() {
        match c {
            Component::ParentDir => {
                level -= 1;
                if level < 0 {
                    return true;
                }
            }
            Component::Normal(_) => level += 1,
            _ => {}
        }
    }
    false
}

async fn upload(client: &Client, local: &Path, task: &str, path: &str) -> Result<Answer<CopiedIn>> {
    let meta = std::fs::symlink_metadata(local).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("cannot copy {}: no such file or directory here", local.display()),
        _ => anyhow!("cannot copy {}: {e}", local.display()),
    })?;
    // Refusals the daemon would make before reading the archive are asked
    // first: an early refusal cuts the upload, and the pipe breaks before
    // its answer can be read.
    let shown: TaskView = client.get(&format!("/v1/tasks/{task}")).await?;
    if let state @ (TaskState::Destroyed | TaskState::Completed | TaskState::Failed) = shown.task.state {
        bail!("task {} is {state}; nothing can be copied into it", shown.task.id);
    }
    let name = local
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()))
        .ok_or_else(|| anyhow!("cannot copy {}: it has no name", local.display()))?;
    let total = if meta.is_dir() { None } else { Some(meta.len()) };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let local2 = local.to_owned();
    let name2 = name.clone();
    let builder = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut b = tar::Builder::new(crate::progress::ChannelWriter::new(tx, "copy in", total));
        b.follow_symlinks(false);
        if meta.is_dir() {
            b.append_dir_all(&name2, &local2)?;
        } else {
            b.append_path_with_name(&local2, &name2)?;
        }
        b.into_inner()?.finish();
        Ok(())
    });
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let url = format!("/v1/tasks/{task}/files?path={}&name={}", query_escape(path), query_escape(&name.to_string_lossy()));
    let result = client.send::<Answer<CopiedIn>>(client.request(Method::PUT, &url).body(body)).await;
    let built = builder.await;
    // A daemon that refuses early (unknown task, bad path) closes the body
    // stream, so the archive writer sees a broken pipe: its answer says why.
    let value = result?;
    built.map_err(|e| anyhow!("{e}"))??;
    Ok(value)
}


/// `cairn cp SRC DST [--follow-links | --keep-links]`.
pub(crate) async fn cli(client: &Client, src: &str, dst: &str, follow_links: bool, keep_links: bool, out: crate::verbs::Out) -> Result<u8> {
    let links = if follow_links && keep_links {
        anyhow::bail!("--follow-links and --keep-links cannot be used together");
    } else if follow_links {
        Links::Follow
    } else if keep_links {
        Links::Keep
    } else {
        Links::Refuse
    };
    let copied = run(client, src, dst, links).await?;
    if out.json {
        outln!("{}", copied.json());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_errors_name_the_side_and_the_path() {
        let e = copy_error("t1", anyhow!("sandbox path /workspace/x: no such file or directory in the sandbox"));
        assert_eq!(e.to_string(), "cannot copy t1:/workspace/x: no such file or directory in the sandbox");
        assert_eq!(copy_error("t1", anyhow!("unknown task t1")).to_string(), "unknown task t1");
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("t1:/a/b"), Endpoint::Sandbox { task: "t1".into(), path: "/a/b".into() });
        assert_eq!(parse_endpoint("./x:y"), Endpoint::Local("./x:y".into()));
        assert_eq!(parse_endpoint("file"), Endpoint::Local("file".into()));
        assert_eq!(parse_endpoint("t1:rel"), Endpoint::Local("t1:rel".into()));
    }

    #[test]
    fn links_that_leave_the_copied_tree() {
        // tree/l, tree/sub/l: depth 2 and 3.
        assert!(!leaves_tree(2, Path::new("a")));
        assert!(!leaves_tree(3, Path::new("../a")));
        assert!(leaves_tree(2, Path::new("../a")));
        assert!(leaves_tree(3, Path::new("../../elsewhere")));
        assert!(leaves_tree(3, Path::new("/etc/passwd")));
        // The top itself as a link always leads out of the tree.
        assert!(leaves_tree(1, Path::new("a")));
        assert!(!leaves_tree(3, Path::new("x/../../b")));
    }
}
