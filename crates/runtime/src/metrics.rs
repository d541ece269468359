//! Prometheus metrics (`GET /metrics`, OpenMetrics text): what the runtime
//! counts and times as it works, and what is read at each scrape (tasks by
//! state, live sandboxes, bytes in the blob store, the pack cache of a
//! remote blob store).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use cairn_core::TaskState;

use crate::runtime::Runtime;
use crate::Error;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerdictLabel {
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    result: String,
}

/// Every metric the runtime exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tasks: Family<StateLabel, Gauge>,
    live_sandboxes: Gauge,
    blob_bytes: Gauge,
    blob_cache_bytes: Gauge,
    blob_cache_hits: Counter,
    blob_cache_misses: Counter,
    blob_cache_downloaded_bytes: Counter,
    pub(crate) exec_seconds: Histogram,
    pub(crate) snapshot_seconds: Histogram,
    pub(crate) suspend_seconds: Histogram,
    pub(crate) wake_seconds: Histogram,
    pub(crate) snapshot_bytes_added: Counter,
    egress_decisions: Family<VerdictLabel, Counter>,
    webhooks: Family<ResultLabel, Counter>,
    /// Requests to tasks' ports through the daemon.
    pub(crate) port_requests: Counter,
}

/// 1 ms to about a minute, doubling.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cairn");
        let m = Metrics {
            tasks: Family::default(),
            live_sandboxes: Gauge::default(),
            blob_bytes: Gauge::default(),
            blob_cache_bytes: Gauge::default(),
            blob_cache_hits: Counter::default(),
            blob_cache_misses: Counter::default(),
            blob_cache_downloaded_bytes: Counter::default(),
            exec_seconds: seconds(),
            snapshot_seconds: seconds(),
            suspend_seconds: seconds(),
            wake_seconds: seconds(),
            snapshot_bytes_added: Counter::default(),
            egress_decisions: Family::default(),
            webhooks: Family::default(),
            port_requests: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("tasks", "Tasks by state", m.tasks.clone());
        registry.register("live_sandboxes", "Sandboxes running now", m.live_sandboxes.clone());
        registry.register("blob_store_bytes", "Bytes in the blob store (packs, index, manifests, deliverables)", m.blob_bytes.clone());
        registry.register("blob_cache_bytes", "Bytes of a remote blob store's packs cached on this node", m.blob_cache_bytes.clone());
        registry.register("blob_cache_hits", "Chunk reads served from the pack cache", m.blob_cache_hits.clone());
        registry.register("blob_cache_misses", "Chunk reads whose pack was not cached", m.blob_cache_misses.clone());
        registry.register("blob_cache_downloaded_bytes", "Bytes of packs downloaded into the pack cache", m.blob_cache_downloaded_bytes.clone());
        registry.register("exec_duration_seconds", "Commands, from start to exit", m.exec_seconds.clone());
        registry.register("snapshot_duration_seconds", "Snapshots, from freeze to recorded", m.snapshot_seconds.clone());
        registry.register("suspend_duration_seconds", "Suspends, from the request to the sandbox gone", m.suspend_seconds.clone());
        registry.register("wake_duration_seconds", "Wakes, from the start of the wake to running", m.wake_seconds.clone());
        registry.register("snapshot_added_bytes", "Bytes snapshots added to the blob store", m.snapshot_bytes_added.clone());
        registry.register("egress_decisions", "Egress proxy decisions by verdict", m.egress_decisions.clone());
        registry.register("webhooks", "Webhooks received, by result", m.webhooks.clone());
        registry.register("port_requests", "HTTP requests and WebSocket connections to tasks' ports through the daemon", m.port_requests.clone());
        Metrics { registry, ..m }
    }
}

impl Metrics {
    pub(crate) fn egress_decision(&self, allowed: bool) {
        let verdict = if allowed { "allowed" } else { "denied" };
        self.egress_decisions.get_or_create(&VerdictLabel { verdict: verdict.into() }).inc();
    }

    /// `result`: `accepted`, `duplicate` or `refused`.
    pub(crate) fn webhook(&self, result: &str) {
        self.webhooks.get_or_create(&ResultLabel { result: result.into() }).inc();
    }

    fn encode(&self) -> Result<String, Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).map_err(|e| Error::internal_from(e).context("encoding metrics"))?;
        Ok(out)
    }
}

/// The size of every file under `dir` (the local blob store).
fn tree_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

impl Runtime {
    /// The metrics as OpenMetrics text, with the gauges read now.
    pub async fn metrics_text(&self) -> Result<String, Error> {
        let m = &self.metrics;
        let tasks = self.store.list_tasks().await?;
        // Every state gets a line, also at zero.
        for state in TaskState::ALL {
            let n = tasks.iter().filter(|t| t.state == state).count();
            m.tasks.get_or_create(&StateLabel { state: state.to_string() }).set(n as i64);
        }
        m.live_sandboxes.set(self.cells.all().iter().filter(|(_, c)| c.live().is_some()).count() as i64);
        let backend = self.snaps.repo.backend();
        match backend.local_dir() {
            Some(dir) => {
                let bytes = tokio::task::spawn_blocking(move || tree_bytes(&dir)).await?;
                m.blob_bytes.set(bytes as i64);
            }
            // A remote store is not walked: its packs as the index knows them.
            None => {
                m.blob_bytes.set(self.snaps.repo.stats().stored_bytes as i64);
            }
        }
        if let Some(c) = backend.cache_stats() {
            use std::sync::atomic::Ordering::Relaxed;
            m.blob_cache_bytes.set(c.bytes as i64);
            // Totals kept by the cache itself since it was opened.
            m.blob_cache_hits.inner().store(c.hits, Relaxed);
            m.blob_cache_misses.inner().store(c.misses, Relaxed);
            m.blob_cache_downloaded_bytes.inner().store(c.downloaded_bytes, Relaxed);
        }
        m.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_named_and_observations_show() {
        let m = Metrics::default();
        m.exec_seconds.observe(0.004);
        m.egress_decision(false);
        m.webhook("accepted");
        m.snapshot_bytes_added.inc_by(10);
        let text = m.encode().unwrap();
        for line in [
            "cairn_exec_duration_seconds_count 1",
            "cairn_egress_decisions_total{verdict=\"denied\"} 1",
            "cairn_webhooks_total{result=\"accepted\"} 1",
            "cairn_snapshot_added_bytes_total 10",
            "cairn_blob_cache_hits_total 0",
            "# TYPE cairn_wake_duration_seconds histogram",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
