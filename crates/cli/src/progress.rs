//! Progress of long transfers on a terminal: bytes, rate and, when the total
//! is known, ETA. Silent when stderr is not a terminal or the transfer ends
//! within a second.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SHOW_AFTER: Duration = Duration::from_secs(1);
const EVERY: Duration = Duration::from_millis(200);

#[derive(Debug)]
pub struct Progress {
    what: &'static str,
    began: Instant,
    last: Mutex<Option<Instant>>,
    enabled: bool,
}

pub fn human(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

impl Progress {
    pub fn new(what: &'static str) -> Progress {
        Progress { what, began: Instant::now(), last: Mutex::new(None), enabled: std::io::stderr().is_terminal() }
    }

    pub fn update(&self, done: u64, total: Option<u64>) {
        let elapsed = self.began.elapsed();
        if !self.enabled || elapsed < SHOW_AFTER {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|l| l.elapsed() < EVERY) {
            return;
        }
        *last = Some(Instant::now());
        let rate = done as f64 / elapsed.as_secs_f64();
        let eta = match total {
            Some(t) if rate > 0.0 && t > done => format!(", ETA {:.0}s", (t - done) as f64 / rate),
            _ => String::new(),
        };
        let of = total.map(|t| format!(" of {}", human(t as f64))).unwrap_or_default();
        eprint!("\r{}: {}{of} at {}/s{eta}   ", self.what, human(done as f64), human(rate));
        let _ = std::io::stderr().flush();
    }

    pub fn finish(&self, done: u64) {
        if self.enabled && self.last.lock().map(|l| l.is_some()).unwrap_or(false) {
            eprintln!("\r{}: {} in {:.1}s          ", self.what, human(done as f64), self.began.elapsed().as_secs_f64());
        }
    }
}

/// A `Write` that feeds an HTTP body stream, reporting progress.
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
    progress: Progress,
    total: Option<u64>,
    done: u64,
}

impl ChannelWriter {
    pub fn new(tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>, what: &'static str, total: Option<u64>) -> Self {
        ChannelWriter { tx, progress: Progress::new(what), total, done: 0 }
    }
    pub fn finish(self) {
        self.progress.finish(self.done);
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx.blocking_send(Ok(buf.to_vec())).map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        self.done += buf.len() as u64;
        self.progress.update(self.done, self.total);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `request` (a snapshot, rollback or fork of `task`) while showing
/// the daemon's progress of it on a terminal: files, bytes, rate.
pub async fn while_running<T>(client: &crate::client::Client, task: &str, request: impl std::future::Future<Output = T>) -> T {
    let path = format!("/v1/tasks/{task}/progress");
    while_showing(request, |_| async {
        let p = client.get::<Option<cairn_api::snapshots::OpProgress>>(&path).await.ok()??;
        let secs = (p.elapsed_ms as f64 / 1000.0).max(0.001);
        let bytes = p.bytes_done as f64;
        let total = p.bytes_total as f64;
        let counts = if total > 0.0 || p.files_total > 0 {
            format!(": {}/{} files, {} of {} at {}/s", p.files_done, p.files_total, human(bytes), human(total), human(bytes / secs))
        } else {
            String::new()
        };
        Some(format!("{} ({}){counts}, {secs:.1}s", p.op, p.phase))
    })
    .await
}

/// Runs `request`, and on a terminal, once it has run for a second, draws
/// the line `line` gives (from how long it has run) every 200 ms over the
/// last one; `None` leaves the last line as it is.
async fn while_showing<T, F, L>(request: impl std::future::Future<Output = T>, line: L) -> T
where
    L: Fn(Duration) -> F,
    F: std::future::Future<Output = Option<String>>,
{
    if !std::io::stderr().is_terminal() {
        return request.await;
    }
    tokio::pin!(request);
    let began = Instant::now();
    let mut shown = false;
    let mut tick = tokio::time::interval(EVERY);
    let result = loop {
        tokio::select! {
            r = &mut request => break r,
            _ = tick.tick() => {
                if began.elapsed() < SHOW_AFTER {
                    continue;
                }
                let Some(text) = line(began.elapsed()).await else { continue };
                // \x1b[K clears what a longer earlier line left.
                eprint!("\r{text}\x1b[K");
                let _ = std::io::stderr().flush();
                shown = true;
            }
        }
    };
    if shown {
        eprintln!();
    }
    result
}

/// Runs `request` (a pull of image `name`) while showing each layer's
/// download on a terminal: bytes, rate and ETA, one line per layer.
pub async fn while_pulling<T>(client: &crate::client::Client, name: &str, request: impl std::future::Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return request.await;
    }
    tokio::pin!(request);
    let path = format!("/v1/images/pull/progress?name={}", crate::client::query_escape(name));
    let mut first_seen: std::collections::HashMap<String, (Instant, u64)> = std::collections::HashMap::new();
    let mut drawn = 0usize;
    let mut tick = tokio::time::interval(EVERY);
    let result = loop {
        tokio::select! {
            r = &mut request => break r,
            _ = tick.tick() => {
                let Ok(p) = client.get::<cairn_api::images::PullProgress>(&path).await else { continue };
                let mut lines = Vec::new();
                for l in &p.layers {
                    let (since, base) = *first_seen.entry(l.digest.clone()).or_insert((Instant::now(), l.done));
                    let secs = since.elapsed().as_secs_f64().max(0.001);
                    let rate = l.done.saturating_sub(base) as f64 / secs;
                    let short = l.digest.strip_prefix("sha256:").unwrap_or(&l.digest).chars().take(12).collect::<String>();
                    let state = if l.done >= l.total {
                        "done".to_owned()
                    } else if rate > 0.0 {
                        format!("at {}/s, ETA {:.0}s", human(rate), (l.total - l.done) as f64 / rate)
                    } else {
                        "waiting".to_owned()
                    };
                    lines.push(format!("{short}: {} of {} {state}", human(l.done as f64), human(l.total as f64)));
                }
                if p.unpacking {
                    lines.push("unpacking".to_owned());
                }
                if drawn > 0 {
                    eprint!("\x1b[{drawn}A");
                }
                for line in &lines {
                    eprintln!("\r{line}\x1b[K");
                }
                drawn = lines.len();
                let _ = std::io::stderr().flush();
            }
        }
    };
    result
}

/// Runs `request` (an import of image `name`) while showing on a terminal
/// how far it has got: the source archive read (bytes, rate, ETA) when it
/// is one, and the bytes written into the image.
pub async fn while_importing<T>(client: &crate::client::Client, name: &str, request: impl std::future::Future<Output = T>) -> T {
    let path = format!("/v1/images/import/progress?name={}", crate::client::query_escape(name));
    while_showing(request, |elapsed| {
        let path = &path;
        async move {
            let p = client.get::<cairn_api::images::ImportProgress>(path).await.ok()?;
            Some(format!("import {name}: {}", import_line(&p, elapsed)))
        }
    })
    .await
}

/// One progress line of an import `elapsed` into it.
fn import_line(p: &cairn_api::images::ImportProgress, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(0.001);
    match p.source_bytes {
        Some(total) => {
            let rate = p.read as f64 / secs;
            let eta = if rate > 0.0 && total > p.read { format!(", ETA {:.0}s", (total - p.read) as f64 / rate) } else { String::new() };
            format!("{} of {} read at {}/s{eta}; {} written", human(p.read as f64), human(total as f64), human(rate), human(p.written as f64))
        }
        None => format!("{} written at {}/s", human(p.written as f64), human(p.written as f64 / secs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_line_gives_the_rate_and_an_eta_when_the_size_is_known() {
        let p = cairn_api::images::ImportProgress { name: "x".into(), read: 512 << 20, source_bytes: Some(1 << 30), written: 600 << 20 };
        assert_eq!(import_line(&p, Duration::from_secs(4)), "512.0 MiB of 1.0 GiB read at 128.0 MiB/s, ETA 4s; 600.0 MiB written");
        let dir = cairn_api::images::ImportProgress { name: "x".into(), read: 0, source_bytes: None, written: 300 << 20 };
        assert_eq!(import_line(&dir, Duration::from_secs(3)), "300.0 MiB written at 100.0 MiB/s");
    }
}
