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
//! ```

use std::net::SocketAddr;
use std::path::Path;

use cairn_core::Limits;
use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub disk_pool: usize,
    pub defaults: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config { listen: SocketAddr::from(([127, 0, 0, 1], 7878)), disk_pool: 2, defaults: Limits::default() }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    disk_pool: Option<usize>,
    #[serde(default)]
    defaults: Defaults,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Defaults {
    memory: Option<String>,
    cpus: Option<toml::Value>,
    pids: Option<toml::Value>,
    disk: Option<String>,
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
        if let Some(s) = d.disk {
            c.defaults.set_disk(&s).map_err(|e| format!("defaults.disk: {e}"))?;
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
    }
}
