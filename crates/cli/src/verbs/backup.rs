//! `cairn backup FILE`: the daemon's tar stream of its store, blob store and
//! keys, written to `FILE.partial`, read back and checked against its
//! manifest, then renamed to `FILE` (so `FILE` is whole or absent).
//! `cairn restore FILE`: into a new home, with no daemon running on it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use reqwest::Method;

use cairn_runtime::backup::BackupManifest;

use crate::client::{error_message, Client};
use crate::progress::{human, Progress};
use crate::verbs::Out;

pub async fn backup(client: &Client, file: &Path, out: Out) -> Result<u8> {
    let (manifest, done) = write_backup(client, file).await?;
    let Some(manifest) = manifest else { return Ok(0) };
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&manifest).unwrap_or_default());
    } else {
        outln!("{}", summary(&manifest, done, file));
        if !manifest.images.is_empty() {
            outln!("  images the tasks use, not in a backup: {}", manifest.images.join(", "));
        }
    }
    Ok(0)
}

/// One line on a backup written.
pub fn summary(manifest: &BackupManifest, bytes: u64, file: &Path) -> String {
    let objects = manifest.entries.iter().filter(|e| e.path.starts_with("blobs/")).count();
    format!(
        "backup of node {}: {} tasks, {} snapshots, {objects} blob objects, {} in {}",
        manifest.node,
        manifest.tasks,
        manifest.snapshots,
        human(bytes as f64),
        file.display()
    )
}

/// Writes the daemon's backup stream to `file` (whole, checked against its
/// manifest, or not at all) and returns the manifest and the bytes
/// written; to standard output for `-`, unchecked (no manifest returned).
pub async fn write_backup(client: &Client, file: &Path) -> Result<(Option<BackupManifest>, u64)> {
    let to_stdout = file == Path::new("-");
    if !to_stdout && std::fs::symlink_metadata(file).is_ok() {
        bail!("{} exists: a backup never overwrites a file; name another", file.display());
    }
    let resp = client.request(Method::GET, "/v1/backup").send().await.map_err(|e| client.connect_error(e))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        bail!("{}", error_message(status, &body));
    }
    let partial = PathBuf::from(format!("{}.partial", file.display()));
    let mut sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&partial).with_context(|| format!("write {}", partial.display()))?;
        Box::new(std::io::BufWriter::with_capacity(1 << 20, f))
    };
    let progress = Progress::new("backup");
    let mut done = 0u64;
    let mut stream = resp.bytes_stream();
    let written: Result<()> = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| anyhow!("the daemon's backup stream broke off: {e}"))?;
            sink.write_all(&chunk).with_context(|| format!("write {}", partial.display()))?;
            done += chunk.len() as u64;
            progress.update(done, None);
        }
        sink.flush().with_context(|| format!("write {}", partial.display()))?;
        Ok(())
    }
    .await;
    drop(sink);
    progress.finish(done);
    if to_stdout {
        return written.map(|()| (None, done));
    }
    let checked = written.and_then(|()| {
        let f = std::fs::File::open(&partial).with_context(|| format!("read back {}", partial.display()))?;
        f.sync_all().with_context(|| format!("write {}", partial.display()))?;
        let manifest = cairn_runtime::backup::verify(std::io::BufReader::with_capacity(1 << 20, f), file).map_err(|e| anyhow!("{e}"))?;
        std::fs::rename(&partial, file).with_context(|| format!("rename {} to {}", partial.display(), file.display()))?;
        Ok(manifest)
    });
    match checked {
        Ok(m) => Ok((Some(m), done)),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Counts what is read, for the progress line.
struct Counted<R> {
    inner: R,
    done: u64,
    total: Option<u64>,
    progress: Progress,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.progress.update(self.done, self.total);
        Ok(n)
    }
}

pub async fn restore(file: &Path, out: Out) -> Result<u8> {
    let f = std::fs::File::open(file).with_context(|| format!("cannot read backup {}", file.display()))?;
    let total = f.metadata().ok().map(|m| m.len());
    let reader = Counted { inner: std::io::BufReader::with_capacity(1 << 20, f), done: 0, total, progress: Progress::new("restore") };
    let home = cairn_server::Home::new(crate::client::home());
    let report = cairn_runtime::backup::restore(&home, reader, file).await.map_err(|e| anyhow!("{e}"))?;
    if out.json {
        outln!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        return Ok(0);
    }
    outln!(
        "restored node {}'s backup into {}: {} tasks, {} snapshots, {} blob objects ({})",
        report.node,
        report.home.display(),
        report.tasks,
        report.snapshots,
        report.objects,
        human(report.bytes as f64)
    );
    if !report.missing_images.is_empty() {
        outln!("  images the tasks use that this home lacks (import or pull them first): {}", report.missing_images.join(", "));
    }
    outln!("  start the daemon on it (`cairn serve`): running tasks come back from their latest snapshots, as after a reboot");
    Ok(0)
}
