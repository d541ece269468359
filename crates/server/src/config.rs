//! The daemon's configuration: `--config FILE` (TOML) and flags; a flag wins
//! over the file.
//!
//! ```toml
//! listen = "127.0.0.1:7878"   # --listen
//! disk_pool = 2               # --disk-pool: formatted task disks kept ready
//!
//! [defaults]                  # limits of tasks created without flags
//! memory = "512M"
//! cpus = "1"
//! pids = 256
//! disk = "2G"
//! idle_suspend = "30m"        # suspend tasks idle this long ("never", the default)
//!
//! [snapshots]
//! gc_grace = "1h"             # `cairn gc` keeps unreferenced objects younger than this
//! risky_patterns = ["..."]    # replaces the default high-risk command patterns
//! extra_risky_patterns = []   # added to the defaults
//!
//! [snapshots.retention]       # default policy of new tasks
//! keep_last = 20
//! keep_milestones = true
//! expire_after = "7d"         # or "never"
//! ```

use std::net::SocketAddr;
use std::path::Path;

use std::time::Duration;

use cairn_core::{parse_duration, Limits, Retention, RiskPolicy, DEFAULT_RISK_PATTERNS};
use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub disk_pool: usize,
    pub defaults: Limits,
    pub retention: Retention,
    /// Commands matching one of these take a `pre-risk` snapshot first.
    pub risky_patterns: Vec<String>,
    pub gc_grace: Duration,
    /// Suspend tasks idle this long, unless they say otherwise.
    pub idle_suspend: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            disk_pool: 2,
            defaults: Limits::default(),
            retention: Retention::default(),
            risky_patterns: DEFAULT_RISK_PATTERNS.iter().map(|p| (*p).to_owned()).collect(),
            gc_grace: Duration::from_secs(3600),
            idle_suspend: None,
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    disk_pool: Option<usize>,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    snapshots: Snapshots,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Snapshots {
    gc_grace: Option<String>,
    risky_patterns: Option<Vec<String>>,
    #[serde(default)]
    extra_risky_patterns: Vec<String>,
    #[serde(default)]
    retention: RetentionFile,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RetentionFile {
    keep_last: Option<u32>,
    keep_milestones: Option<bool>,
    expire_after: Option<String>,
}

/// `never` or a duration such as `7d`.
pub fn parse_expiry(s: &str) -> Result<Option<Duration>, String> {
    if s == "never" {
        return Ok(None);
    }
    parse_duration(s).map(Some).map_err(|e| e.to_string())
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Defaults {
    memory: Option<String>,
    cpus: Option<toml::Value>,
    pids: Option<toml::Value>,
    disk: Option<String>,
    idle_suspend: Option<String>,
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Config {
    /// Reads a config file; every error names the file and the key.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        let file: File = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut c = Config::default();
        if let Some(l) = file.listen {
            c.listen = parse_listen(&l)?;
        }
        if let Some(n) = file.disk_pool {
            c.disk_pool = n;
        }
        let d = file.defaults;
        if let Some(m) = d.memory {
            c.defaults.set_memory(&m).map_err(|e| format!("defaults.memory: {e}"))?;
        }
        if let Some(v) = d.cpus {
            c.defaults.set_cpus(&value_text(&v)).map_err(|e| format!("defaults.cpus: {e}"))?;
        }
        if let Some(v) = d.pids {
            c.defaults.set_pids(&value_text(&v)).map_err(|e| format!("defaults.pids: {e}"))?;
        }
        if let Some(i) = d.idle_suspend {
            c.idle_suspend = parse_expiry(&i).map_err(|e| format!("defaults.idle_suspend: {e}"))?;
        }
        if let Some(s) = d.disk {
            c.defaults.set_disk(&s).map_err(|e| format!("defaults.disk: {e}"))?;
        }
        let snaps = file.snapshots;
        if let Some(g) = snaps.gc_grace {
            c.gc_grace = parse_duration(&g).map_err(|e| format!("snapshots.gc_grace: {e}"))?;
        }
        if let Some(p) = snaps.risky_patterns {
            c.risky_patterns = p;
        }
        c.risky_patterns.extend(snaps.extra_risky_patterns);
        RiskPolicy::new(c.risky_patterns.iter().map(String::as_str)).map_err(|e| format!("snapshots: {e}"))?;
        let r = snaps.retention;
        if let Some(k) = r.keep_last {
            c.retention.keep_last = k;
        }
        if let Some(m) = r.keep_milestones {
            c.retention.keep_milestones = m;
        }
        if let Some(e) = r.expire_after {
            c.retention.expire_after = parse_expiry(&e).map_err(|e| format!("snapshots.retention.expire_after: {e}"))?;
        }
        Ok(c)
    }
}

pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| format!("invalid listen address {s:?}: expected IP:PORT like 127.0.0.1:7878"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_bad_keys() {
        let c = Config::parse("listen = \"127.0.0.1:0\"\ndisk_pool = 1\n[defaults]\nmemory = \"1G\"\ncpus = 0.5\npids = 64\n").unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!((c.defaults.memory_bytes, c.defaults.millicpus, c.defaults.pids), (1 << 30, 500, 64));
        assert!(Config::parse("[defaults]\nmemory = \"lots\"").unwrap_err().contains("defaults.memory"));
        assert!(Config::parse("listen = \"nowhere\"").unwrap_err().contains("listen"));
        assert!(Config::parse("colour = \"blue\"").unwrap_err().contains("colour"));
        let c = Config::parse("[snapshots]\ngc_grace = \"5m\"\nextra_risky_patterns = [\"terraform apply\"]\n[snapshots.retention]\nkeep_last = 3\nexpire_after = \"never\"\n").unwrap();
        assert_eq!((c.gc_grace, c.retention.keep_last, c.retention.expire_after), (Duration::from_secs(300), 3, None));
        assert_eq!(c.risky_patterns.last().map(String::as_str), Some("terraform apply"));
        assert!(Config::parse("[snapshots]\nrisky_patterns = [\"(\"]").unwrap_err().contains("risk pattern"));
        assert!(Config::parse("[snapshots.retention]\nexpire_after = \"soon\"").unwrap_err().contains("expire_after"));
    }
}
